"""stabmeter.torch.Monitor on models as people write them, every metric against numpy in float64
computed here from the tensors (σ by numpy.linalg.svd, the RMS norms by docs/manual/metrics.md):
an nn.TransformerEncoder with a plain nn.Embedding named emb and an nn.Linear head (kinds from the
modules; nn.MultiheadAttention's q, k, v with their bias slices and the attention bound with its
num_heads), a nanoGPT-style GPT (fused c_attn, tied head), a CNN (Conv1d, strided Conv2d, a
grouped convolution refused by name, BatchNorm), bfloat16 and float16 models, wrapped models (DataParallel,
torch.compile's OptimizedModule), and what is not measured said (warning, strict=True, kinds=)."""

import math
import unittest
import warnings

import numpy as np
import torch
import torch.nn as nn

import stabmeter.torch as st
from python_gpt import GPT

V, D, HEADS = 50, 32, 4
RTOL = 1e-4  # the monitor's σ is a Lanczos estimate at tol 1e-6, of float32 weights


def f64(t):
    return t.detach().to(torch.float64).numpy()


def rms(v):
    return float(np.sqrt(np.mean(np.square(v))))


def sigma(w):
    return float(np.linalg.svd(w, compute_uv=False)[0])


def linear_ref(w, b=None):
    """forward and dependency of y = W x + b, W out-major [d_out][d_in] (metrics.md, linear)."""
    d_out, d_in = w.shape
    dep = math.sqrt(d_in / d_out) * sigma(w)
    return {"forward": dep + (rms(b) if b is not None else 0.0), "dependency": dep, "sigma": sigma(w)}


def embedding_ref(e):
    return {"forward": max(rms(row) for row in e)}


def lm_head_ref(w):
    """The articles' bounds with R = max row RMS, and the centred tight value (metrics.md, lm_head)."""
    v, d = w.shape
    r = max(rms(row) for row in w)
    c = w.mean(axis=0)
    dm = 2 * min(max(rms(row - c) for row in w), r)
    return {"forward": math.log(v) + 2 * d * r, "dependency": 2 * d * r,
            "forward_tight": math.log(v) + d * dm, "dependency_tight": d * dm}


def gain_ref(g):
    m = float(np.max(np.abs(g)))
    return {"forward": m, "dependency": m}


def bias_ref(b):
    return {"forward": rms(b)}


def attention_ref(wq, wk, heads):
    """head<h>_bound = s d_h F_q,h F_k,h, F = sqrt(d/d_h) σ(head block), s = 1/sqrt(d_h)."""
    d = wq.shape[1]
    dh = wq.shape[0] // heads
    F = lambda w, h: math.sqrt(d / dh) * sigma(w[h * dh:(h + 1) * dh])
    bounds = [dh ** -0.5 * dh * F(wq, h) * F(wk, h) for h in range(heads)]
    return {"forward": max(bounds), "head_bounds": bounds}


def unmeasured_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, st.UnmeasuredWarning)]


def monitor(model, **kw):
    """A Monitor of model, and the warnings its creation gave."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        mon = st.Monitor(model, tol=1e-6, **kw)
    return mon, record


class Checks(unittest.TestCase):
    def same(self, got, want, name, rtol=RTOL):
        for key, value in want.items():
            if key == "head_bounds":
                for h, (g, w) in enumerate(zip(got[key], value)):
                    self.assertLess(abs(g - w), rtol * abs(w), "%s head %d: %r against numpy's %r" % (name, h, g, w))
                self.assertEqual(len(got[key]), len(value), name)
                continue
            self.assertLessEqual(abs(got[key] - value), rtol * abs(value) + 1e-12,
                                 "%s %s: %r against numpy's %r" % (name, key, got[key], value))


class Encoder(nn.Module):
    """A plain nn.Embedding named emb, an nn.TransformerEncoder, an nn.Linear head."""

    def __init__(self, tied=False):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, HEADS, 2 * D, batch_first=True), 2)
        self.head = nn.Linear(D, V, bias=False)
        if tied:
            self.head.weight = self.emb.weight
        with torch.no_grad():  # not the zeros and ones of the init, so that every slice counts
            for name, p in self.named_parameters():
                if p.dim() == 1:
                    p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "norm" in name and name.endswith("weight") else 0.0))


class TransformerEncoderModel(Checks):
    def test_kinds_and_values_from_the_modules(self):
        torch.manual_seed(1)
        model = Encoder()
        mon, record = monitor(model)
        with mon:
            self.assertEqual(unmeasured_warnings(record), [])
            self.assertEqual(mon.skipped, {})
            got = mon.measure()
        kinds = dict(mon.layers)
        self.assertEqual(kinds["emb"], "embedding")  # forward the max row RMS, not a linear σ
        self.same(got["emb"], embedding_ref(f64(model.emb.weight)), "emb")
        self.assertEqual(kinds["head"], "lm_head")  # maps to the vocabulary at the output
        self.same(got["head"], lm_head_ref(f64(model.head.weight)), "head")
        for i, layer in enumerate(model.enc.layers):
            p = "enc.layers.%d." % i
            a = layer.self_attn
            w, b = f64(a.in_proj_weight), f64(a.in_proj_bias)
            for j, part in enumerate("qkv"):  # thirds of in_proj, each with its bias slice
                name = p + "self_attn.in_proj." + part
                self.assertEqual(kinds[name], "linear", name)
                self.same(got[name], linear_ref(w[j * D:(j + 1) * D], b[j * D:(j + 1) * D]), name)
            name = p + "self_attn.logits"
            self.assertEqual(kinds[name], "attention", name)
            self.same(got[name], attention_ref(w[:D], w[D:2 * D], a.num_heads), name)
            self.same(got[p + "self_attn.out_proj"], linear_ref(f64(a.out_proj.weight), f64(a.out_proj.bias)),
                      p + "self_attn.out_proj")
            for lin in ("linear1", "linear2"):
                m = getattr(layer, lin)
                self.same(got[p + lin], linear_ref(f64(m.weight), f64(m.bias)), p + lin)
            for norm in ("norm1", "norm2"):
                m = getattr(layer, norm)
                self.assertEqual((kinds[p + norm], kinds[p + norm + ".bias"]), ("gain", "bias"))
                self.same(got[p + norm], gain_ref(f64(m.weight)), p + norm)
                self.same(got[p + norm + ".bias"], bias_ref(f64(m.bias)), p + norm + ".bias")

    def test_tied_head_by_the_shared_parameter(self):
        torch.manual_seed(2)
        model = Encoder(tied=True)
        with monitor(model)[0] as mon:
            got = mon.measure()
        kinds = dict(mon.layers)
        self.assertEqual((kinds["emb"], kinds["head"]), ("embedding", "lm_head"))
        self.same(got["emb"], embedding_ref(f64(model.emb.weight)), "emb")
        self.same(got["head"], lm_head_ref(f64(model.emb.weight)), "head")

    def test_kinds_match_module_names(self):
        torch.manual_seed(3)
        model = Encoder()
        with monitor(model, kinds={"head": "linear", "enc.layers.1.norm?": "skip"})[0] as mon:
            got = mon.measure()
            kinds = dict(mon.layers)
            self.assertEqual(kinds["head"], "linear")
            self.same(got["head"], linear_ref(f64(model.head.weight)), "head")
            self.assertNotIn("enc.layers.1.norm1", kinds)
            self.assertIn("enc.layers.1.norm1.bias", mon.skipped)
            self.assertIn("kinds=", mon.skipped["enc.layers.1.norm1.bias"])

    def test_kinds_that_match_nothing_raise(self):
        with self.assertRaisesRegex(ValueError, r"'embedding_table'.*matches no parameter name and no module"):
            st.Monitor(Encoder(), kinds={"embedding_table": "embedding"})

    def test_heads_disagreeing_with_num_heads_raise(self):
        with self.assertRaisesRegex(ValueError, r"Monitor\(heads=2\).*'enc.layers.0.self_attn' has num_heads=4"):
            st.Monitor(Encoder(), heads=2)
        model = Encoder()
        model.enc.layers[1].self_attn = nn.MultiheadAttention(D, 2, batch_first=True)
        with self.assertRaisesRegex(ValueError, r"'enc.layers.0.self_attn' has num_heads=4 but "
                                                r"'enc.layers.1.self_attn' num_heads=2"):
            st.Monitor(model)


class NanoGPT(Checks):
    def test_fused_c_attn_and_tied_head(self):
        torch.manual_seed(4)
        model = GPT(vocab=64, width=D, depth=2, heads=HEADS, context=16)
        mon, record = monitor(model, heads=HEADS)
        with mon:
            self.assertEqual(unmeasured_warnings(record), [])
            got = mon.measure()
        kinds = dict(mon.layers)
        t = model.transformer
        self.assertEqual((kinds["transformer.wte"], kinds["lm_head"]), ("embedding", "lm_head"))
        self.same(got["transformer.wte"], embedding_ref(f64(t.wte.weight)), "transformer.wte")
        self.same(got["transformer.wpe"], embedding_ref(f64(t.wpe.weight)), "transformer.wpe")
        self.same(got["lm_head"], lm_head_ref(f64(t.wte.weight)), "lm_head")
        for i, block in enumerate(t.h):
            p = "transformer.h.%d." % i
            w = f64(block.attn.c_attn.weight)
            for j, part in enumerate("qkv"):
                self.same(got[p + "attn.c_attn." + part], linear_ref(w[j * D:(j + 1) * D]), p + "attn.c_attn." + part)
            self.same(got[p + "attn.logits"], attention_ref(w[:D], w[D:2 * D], HEADS), p + "attn.logits")
            for lin in ("attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                m = block.get_submodule(lin)
                self.same(got[p + lin], linear_ref(f64(m.weight)), p + lin)
            for norm in ("ln_1", "ln_2"):
                self.same(got[p + norm], gain_ref(f64(getattr(block, norm).weight)), p + norm)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(3, 8, 5)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.g = nn.Conv2d(16, 16, 3, groups=4)
        self.bn = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)
        with torch.no_grad():
            self.bn.weight.copy_(1 + 0.3 * torch.randn(16))
            self.bn.bias.copy_(0.3 * torch.randn(16))


def conv_ref(m):
    """A convolution as its flattened patch map: [C_out][C_in * prod(k)] (metrics.md)."""
    w = f64(m.weight)
    return linear_ref(w.reshape(w.shape[0], -1), f64(m.bias) if m.bias is not None else None)


class Convolutions(Checks):
    def test_conv_batchnorm_and_update(self):
        torch.manual_seed(5)
        model = CNN()
        mon, record = monitor(model)
        self.addCleanup(mon.close)
        kinds = dict(mon.layers)
        self.assertEqual({n: kinds.get(n) for n in ("c1", "c2", "bn", "bn.bias", "fc")},
                         {"c1": "linear", "c2": "linear", "bn": "gain", "bn.bias": "bias", "fc": "linear"})
        got = mon.measure()
        self.assertEqual((got["c1"]["d_in"], got["c1"]["d_out"], got["c2"]["d_in"]), (15, 8, 72))
        for name in ("c1", "c2"):
            self.same(got[name], conv_ref(getattr(model, name)), name)
        self.same(got["bn"], gain_ref(f64(model.bn.weight)), "bn")
        self.same(got["bn.bias"], bias_ref(f64(model.bn.bias)), "bn.bias")
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(2, 16)
        model.fc(x).square().sum().backward()
        for p in model.parameters():  # an update in every parameter, not only fc's
            p.grad = torch.randn_like(p) if p.grad is None else p.grad
        mon.before_step(1)
        opt.step()
        mon.after_step(1)
        got = mon.metrics()
        for name in ("c1", "c2"):
            m = getattr(model, name)
            dw = f64(m.weight) - f64(before[name + ".weight"])
            db = f64(m.bias) - f64(before[name + ".bias"])
            want = math.sqrt(dw[0].size / dw.shape[0]) * sigma(dw.reshape(dw.shape[0], -1)) + rms(db)
            self.same(got[name], {"update": want}, name + " update")
        dg = f64(model.bn.weight) - f64(before["bn.weight"])
        self.same(got["bn"], {"update": float(np.max(np.abs(dg)))}, "bn update")

    def test_grouped_convolution_said(self):
        model = CNN()
        mon, record = monitor(model)
        with mon:
            said = unmeasured_warnings(record)
        self.assertEqual(len(said), 1, said)
        total = sum(p.numel() for p in model.parameters())
        skipped = model.g.weight.numel() + model.g.bias.numel()
        self.assertIn("%d of %d parameters (%.1f%%) measured" % (total - skipped, total,
                                                                 100.0 * (total - skipped) / total), said[0])
        self.assertRegex(said[0], r"g\.weight \(a grouped convolution \(groups=4\)")
        self.assertIn("g.bias", said[0])
        self.assertEqual(set(mon.skipped), {"g.weight", "g.bias"})

    def test_strict_raises(self):
        with self.assertRaisesRegex(ValueError, r"g\.weight \(a grouped convolution"):
            st.Monitor(CNN(), strict=True)

    def test_heads_without_a_pair_warn(self):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            st.Monitor(CNN(), heads=4).close()
        self.assertTrue(any("Monitor(heads=4): no query/key pair" in str(w.message) for w in record),
                        [str(w.message) for w in record])

    def test_many_skipped_are_counted(self):
        model = nn.Sequential(*[nn.Conv2d(4, 4, 3, groups=2) for _ in range(6)], nn.Linear(4, 4))
        with self.assertRaisesRegex(ValueError, r"and 7 more"):  # 12 tensors, 5 named
            st.Monitor(model, strict=True)


class SixteenBit(Checks):
    def test_same_as_the_float32_model(self):
        for dtype in (torch.bfloat16, torch.float16):
            torch.manual_seed(6)
            model = Encoder(tied=True).to(dtype)
            with monitor(model)[0] as mon:
                got = mon.measure()
            f32 = Encoder(tied=True)
            f32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
            with monitor(f32)[0] as ref:
                want = ref.measure()
            self.assertEqual(mon.layers, ref.layers)
            for name, m in want.items():
                self.same(got[name], {k: m[k] for k in ("forward", "dependency", "sigma") if not math.isnan(m[k])},
                          "%s %s" % (dtype, name))
            self.same(got["emb"], embedding_ref(f64(model.emb.weight)), "emb")
            lin = model.enc.layers[0].linear1
            self.same(got["enc.layers.0.linear1"], linear_ref(f64(lin.weight), f64(lin.bias)), "enc.layers.0.linear1")
            with st.Monitor.from_state_dict(model.state_dict(), tol=1e-6) as sd:  # read as stored, too
                self.same(sd.measure()["enc.layers.0.linear1"], linear_ref(f64(lin.weight), f64(lin.bias)),
                          "from_state_dict enc.layers.0.linear1")


class OptimizedModule(nn.Module):
    """torch.compile's wrapper as torch 2 names it: the model in _orig_mod."""

    def __init__(self, mod):
        super().__init__()
        self._orig_mod = mod


class Wrapped(Checks):
    def names(self, model):
        with monitor(model, heads=HEADS)[0] as mon:
            return [n for n, _ in mon.layers], mon.measure()

    def test_prefixes_removed(self):
        torch.manual_seed(7)
        model = GPT(vocab=64, width=D, depth=1, heads=HEADS, context=16)
        want, values = self.names(model)
        self.assertIn("lm_head", want)
        for wrapped in (OptimizedModule(model), nn.DataParallel(model), OptimizedModule(nn.DataParallel(model))):
            names, got = self.names(wrapped)
            self.assertEqual(names, want, type(wrapped).__name__)
            self.assertEqual(got["lm_head"]["forward"], values["lm_head"]["forward"])
        state = OptimizedModule(model).state_dict()
        self.assertTrue(all(k.startswith("_orig_mod.") for k in state))
        with st.Monitor.from_state_dict(state, heads=HEADS) as mon:
            self.assertEqual([n for n, _ in mon.layers], want)
        state = nn.DataParallel(model).state_dict()
        with st.Monitor.from_state_dict(state, heads=HEADS) as mon:
            self.assertEqual([n for n, _ in mon.layers], want)

    @unittest.skipUnless(torch.distributed.is_available() and torch.distributed.is_gloo_available(), "no gloo")
    def test_distributed_data_parallel(self):
        """DistributedDataParallel itself, one process on the CPU (gloo)."""
        import tempfile
        import torch.distributed as dist
        torch.manual_seed(8)
        model = GPT(vocab=64, width=D, depth=1, heads=HEADS, context=16)
        want, _ = self.names(model)
        with tempfile.TemporaryDirectory() as d:
            dist.init_process_group("gloo", init_method="file://" + d + "/rendezvous", rank=0, world_size=1)
            try:
                ddp = nn.parallel.DistributedDataParallel(model)
                self.assertTrue(all(n.startswith("module.") for n, _ in ddp.named_parameters()))
                self.assertEqual(self.names(ddp)[0], want)
            finally:
                dist.destroy_process_group()


if __name__ == "__main__":
    unittest.main()
