"""The Monitor's layers of a PyTorch model are what stabmeter-probe says of the same tensors
saved as safetensors: a Hugging Face GPT-2 (Conv1D weights stored [d_in][d_out], LayerNorm
gains and shifts, biases, the head tied to wte) and a Llama (separate q/k/v with grouped-query
keys, RMSNorm gains, an untied head): names, kinds, layouts, sizes, head counts, biases folded."""

import os
import tempfile
import unittest

import torch
import torch.nn as nn

import stabmeter.torch as st
from python_util import probe_json, write_safetensors

D, HEADS, KV_HEADS, V = 32, 4, 2, 64


class Conv1D(nn.Module):
    """Hugging Face's GPT-2 Conv1D: y = x W + b with W stored [d_in][d_out]."""

    def __init__(self, d_out, d_in):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_in, d_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(d_out))


def gpt2(depth=2):
    blocks = nn.ModuleList()
    for _ in range(depth):
        b = nn.Module()
        b.ln_1, b.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        b.attn, b.mlp = nn.Module(), nn.Module()
        b.attn.c_attn, b.attn.c_proj = Conv1D(3 * D, D), Conv1D(D, D)
        b.mlp.c_fc, b.mlp.c_proj = Conv1D(4 * D, D), Conv1D(D, 4 * D)
        blocks.append(b)
    m = nn.Module()
    m.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, D), wpe=nn.Embedding(16, D), h=blocks, ln_f=nn.LayerNorm(D)))
    return m


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d) + 0.01 * torch.randn(d))


def llama(depth=2):
    dh = D // HEADS
    layers = nn.ModuleList()
    for _ in range(depth):
        l = nn.Module()
        l.self_attn, l.mlp = nn.Module(), nn.Module()
        a = l.self_attn
        a.q_proj, a.k_proj = nn.Linear(D, D, bias=False), nn.Linear(D, KV_HEADS * dh, bias=False)
        a.v_proj, a.o_proj = nn.Linear(D, KV_HEADS * dh, bias=False), nn.Linear(D, D, bias=False)
        l.mlp.gate_proj, l.mlp.up_proj = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, 3 * D, bias=False)
        l.mlp.down_proj = nn.Linear(3 * D, D, bias=False)
        l.input_layernorm, l.post_attention_layernorm = RMSNorm(D), RMSNorm(D)
        layers.append(l)
    m = nn.Module()
    m.model = nn.Module()
    m.model.embed_tokens, m.model.layers, m.model.norm = nn.Embedding(V, D), layers, RMSNorm(D)
    m.lm_head = nn.Linear(D, V, bias=False)
    return m


def described(rows):
    return {r["name"]: (r["kind"], r["layout"], r["d_in"], r["d_out"]) for r in rows}


class Kinds(unittest.TestCase):
    def same_as_probe(self, model, expect):
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "model.safetensors")
            write_safetensors(path, {n: p.detach().numpy() for n, p in model.named_parameters()})
            report = probe_json(path, "--heads", str(HEADS))
        want = described(report["layers"])
        with st.Monitor(model, heads=HEADS) as mon:
            mon.measure()
            got = {name: (m["kind"], m["layout"] if m["kind"] in ("linear", "attention") else "rows",
                          m["d_in"], m["d_out"]) for name, m in mon.metrics().items()}
            self.assertEqual(mon.skipped, {})
        self.assertEqual(got, want)
        for name, kind in expect.items():
            self.assertEqual(got[name][:2], kind, name)

    def test_gpt2(self):
        self.same_as_probe(gpt2(), {
            # the fused Conv1D c_attn is three layers, q, k and v
            "transformer.h.0.attn.c_attn.q": ("linear", "in_major"),
            "transformer.h.0.attn.c_attn.v": ("linear", "in_major"),
            "transformer.h.0.attn.c_proj": ("linear", "in_major"),
            "transformer.h.1.attn.logits": ("attention", "in_major"),
            "transformer.h.0.ln_1": ("gain", "rows"), "transformer.h.0.ln_1.bias": ("bias", "rows"),
            "transformer.wpe": ("embedding", "rows"), "lm_head": ("lm_head", "rows")})

    def test_llama(self):
        self.same_as_probe(llama(), {
            "model.layers.1.self_attn.k_proj": ("linear", "out_major"),
            "model.layers.0.self_attn.logits": ("attention", "out_major"),
            "model.layers.0.input_layernorm": ("gain", "rows"),
            "model.embed_tokens": ("embedding", "rows"), "lm_head": ("lm_head", "rows")})


if __name__ == "__main__":
    unittest.main()
