"""stabmeter.layer_metrics against stabmeter-probe's report (the C program, --json) of the same
tensors written to safetensors: a linear layer with its bias, a gain, an embedding, an LM head
and an attention pair, each with the update against an earlier checkpoint (--prev)."""

import os
import tempfile
import unittest

import numpy as np
import torch

import stabmeter
from python_util import close, probe_json, write_safetensors

FIELDS = ("forward", "dependency", "update", "sigma", "sigma_update", "rel_update", "forward_tight",
          "dependency_tight", "update_tight", "spread")


class LayerMetrics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = np.random.default_rng(3)
        d, heads = 32, 4
        cls.after = {
            "blk.fc.weight": r.standard_normal((48, d)), "blk.fc.bias": r.standard_normal(48),
            "blk.ln.weight": 1 + 0.1 * r.standard_normal(d),
            "wte.weight": 0.02 * r.standard_normal((100, d)),
            "lm_head.weight": 0.02 * r.standard_normal((100, d)),
            "att.q_proj.weight": r.standard_normal((d, d)) / 6, "att.k_proj.weight": r.standard_normal((d, d)) / 6,
        }
        cls.after = {k: v.astype(np.float32) for k, v in cls.after.items()}
        cls.before = {k: (v + 0.01 * r.standard_normal(v.shape)).astype(np.float32) for k, v in cls.after.items()}
        cls.dir = tempfile.TemporaryDirectory()
        a, b = os.path.join(cls.dir.name, "after.st"), os.path.join(cls.dir.name, "before.st")
        write_safetensors(a, cls.after)
        write_safetensors(b, cls.before)
        # the probe measures to its default tol 1e-3, as layer_metrics does
        rows = probe_json(a, "--prev", b, "--heads", str(heads))["layers"]
        cls.probe = {row["name"]: row for row in rows}
        cls.heads = heads

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def same(self, got, name, rtol=3e-3):
        want = self.probe[name]
        self.assertEqual(got["kind"], want["kind"], name)
        for f in FIELDS:
            self.assertTrue(close(got[f], want[f], rtol), "%s.%s: %r, the probe %r" % (name, f, got[f], want[f]))

    def test_linear_with_bias(self):
        A, B = self.after, self.before
        got = stabmeter.layer_metrics("linear", A["blk.fc.weight"], before=B["blk.fc.weight"],
                                      bias=A["blk.fc.bias"], before_bias=B["blk.fc.bias"])
        self.same(got, "blk.fc")

    def test_linear_torch_in_major(self):
        # the transpose stored in-major is the same layer
        A, B = self.after, self.before
        w = torch.from_numpy(np.ascontiguousarray(A["blk.fc.weight"].T))
        w0 = torch.from_numpy(np.ascontiguousarray(B["blk.fc.weight"].T))
        got = stabmeter.layer_metrics("linear", w, before=w0, layout="in_major", bias=torch.from_numpy(A["blk.fc.bias"]),
                                      before_bias=torch.from_numpy(B["blk.fc.bias"]))
        self.same(got, "blk.fc")

    def test_gain(self):
        self.same(stabmeter.layer_metrics("gain", self.after["blk.ln.weight"], before=self.before["blk.ln.weight"]), "blk.ln")

    def test_tables(self):
        self.same(stabmeter.layer_metrics("embedding", self.after["wte.weight"], before=self.before["wte.weight"]), "wte")
        self.same(stabmeter.layer_metrics("lm_head", self.after["lm_head.weight"], before=self.before["lm_head.weight"]),
                  "lm_head")

    def test_attention(self):
        got = stabmeter.layer_metrics("attention", self.after["att.q_proj.weight"],
                                      weight_k=self.after["att.k_proj.weight"], heads=self.heads)
        self.same(got, "att.logits")
        self.assertEqual(len(got["head_bounds"]), self.heads)
        self.assertAlmostEqual(max(got["head_bounds"]), got["forward"], delta=1e-12 * got["forward"])

    def test_float16_and_bfloat16_as_stored(self):
        w = self.after["blk.fc.weight"]
        # the library reads 16-bit weights natively: the same as their exact f32 conversion
        for t in (torch.from_numpy(w).half(), torch.from_numpy(w).bfloat16()):
            got = stabmeter.layer_metrics("linear", t)
            want = stabmeter.layer_metrics("linear", t.float())
            self.assertEqual(got["forward"], want["forward"])
        h = w.astype(np.float16)
        self.assertEqual(stabmeter.layer_metrics("linear", h)["sigma"],
                         stabmeter.layer_metrics("linear", h.astype(np.float32))["sigma"])

    def test_nan_is_a_flag(self):
        w = self.after["blk.fc.weight"].copy()
        w[0, 0] = np.inf
        got = stabmeter.layer_metrics("linear", w)
        self.assertTrue(got["flags"] & 1)  # STAB_FLAG_NONFINITE_WEIGHT
        self.assertNotEqual(got["forward"], got["forward"])


if __name__ == "__main__":
    unittest.main()
