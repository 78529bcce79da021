"""stabmeter.torch.Monitor on a small GPT (width 64, 2 blocks) trained 50 steps with AdamW: its
trace passes the checks stabmeter-train's trace passes and has the same layer groups (names,
kinds, layouts, sizes, datasets) as stabmeter-train's trace of a model of that shape;
stabmeter-export reads it; its rows are the monitor's metrics; the numbers agree with
layer_metrics on copies of the weights and with LAPACK's SVD."""

import json
import os
import subprocess
import tempfile
import unittest

import h5py
import numpy as np
import torch

import stabmeter
import stabmeter.torch as st
from python_gpt import GPT, batches
from python_trace_checks import check_trace, layer_columns, schema
from python_util import program

WIDTH, DEPTH, HEADS, CONTEXT, STEPS = 64, 2, 4, 32, 50


class Training(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        torch.manual_seed(0)
        model = GPT(vocab=256, width=WIDTH, depth=DEPTH, heads=HEADS, context=CONTEXT)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        data = batches(256, CONTEXT, 8)
        cls.trace = os.path.join(cls.dir.name, "run", "trace.h5")
        cls.losses = []
        with st.Monitor(model, trace=cls.trace, heads=HEADS, run_config={"optimizer": "adamw"}) as mon:
            for step in range(1, STEPS + 1):
                x, y = next(data)
                loss = model(x, y)
                opt.zero_grad()
                loss.backward()
                if step == STEPS:
                    cls.w_before = {n: p.detach().clone() for n, p in model.named_parameters()}
                mon.before_step(step)
                opt.step()
                mon.after_step(step, loss=loss.item(), lr=3e-3)
                cls.losses.append(loss.item())
            cls.metrics = mon.metrics()
            cls.reference = mon.reference()
            cls.layers = mon.layers
        cls.w_after = {n: p.detach().clone() for n, p in model.named_parameters()}
        # stabmeter-train's trace of a model of the same shape, the reference schema
        cls.c_run = os.path.join(cls.dir.name, "c")
        r = subprocess.run([program("train"), "--steps", "2", "--width", str(WIDTH), "--depth", str(DEPTH),
                            "--heads", str(HEADS), "--context", str(CONTEXT), "--batch", "2",
                            "--corpus-bytes", "20000", "--out", cls.c_run], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_loss_falls(self):
        self.assertLess(np.mean(self.losses[-5:]), 0.7 * np.mean(self.losses[:5]))

    def test_trace_checks(self):
        bad, rows = check_trace(os.path.join(self.c_run, "trace.h5"))
        self.assertEqual(bad, [], "stabmeter-train's own trace")
        bad, rows = check_trace(self.trace)
        self.assertEqual(bad, [])
        self.assertEqual(rows, STEPS)
        with h5py.File(self.trace, "r") as f:
            self.assertEqual(list(f["step"][:]), list(range(1, STEPS + 1)))
            config = json.loads(f.attrs["run_config"])
            self.assertEqual(config["producer"], "stabmeter.torch")
            self.assertEqual(config["optimizer"], "adamw")
            self.assertEqual(f.attrs["library_version"], stabmeter.__version__)
            self.assertTrue(np.allclose(f["scalars/loss"][:], self.losses, rtol=0, atol=0))

    def test_schema_as_stabmeter_train(self):
        # the C trainer also writes its activation extras, which the Monitor does not measure
        want = schema(os.path.join(self.c_run, "trace.h5"), drop=("act_rms", "act_cos1"))
        got = schema(self.trace)
        self.assertEqual(sorted(got), sorted(want))
        for g in want:
            self.assertEqual(got[g], want[g], g)

    def test_rows_are_the_metrics(self):
        with h5py.File(self.trace, "r") as f:
            layers = layer_columns(f)
            for name, m in self.metrics.items():
                g = layers[name.replace("/", ".")][1]
                for k in ("forward", "dependency", "update", "sigma", "rel_update", "flags", "passes"):
                    a, b = g[k][-1], m[k]
                    self.assertTrue(a == b or (a != a and b != b), "%s.%s: trace %r, monitor %r" % (name, k, a, b))
                if m["kind"] == "attention":
                    self.assertEqual([g["head%d_bound" % h][-1] for h in range(HEADS)], m["head_bounds"])

    def test_ratios(self):
        # the trace's ratios: each metric over the Monitor's reference, its first finite value > 0
        with h5py.File(self.trace, "r") as f:
            layers = layer_columns(f)
            for name, ref in self.reference.items():
                g = layers[name.replace("/", ".")][1]
                for k in ("forward", "dependency", "update"):
                    v = g[k][:]
                    first = v[np.isfinite(v) & (v > 0)]
                    if not len(first):
                        self.assertTrue(np.isnan(ref[k]) and np.isnan(g[k + "_ratio"][:]).all(), "%s.%s" % (name, k))
                        continue
                    self.assertEqual(ref[k], first[0], "%s.%s" % (name, k))
                    self.assertTrue(np.array_equal(g[k + "_ratio"][:], v / ref[k], equal_nan=True), "%s.%s" % (name, k))
            self.assertEqual(f["layers/forward_ratio"].attrs["units"], "1")

    def test_against_layer_metrics_and_svd(self):
        for name in ("transformer.h.1.mlp.c_fc", "transformer.h.0.attn.c_proj"):
            w, w0 = self.w_after[name + ".weight"], self.w_before[name + ".weight"]
            want = stabmeter.layer_metrics("linear", w, before=w0)
            got = self.metrics[name]
            for k in ("forward", "dependency", "update", "sigma", "sigma_update"):
                self.assertAlmostEqual(got[k] / want[k], 1, delta=3e-3, msg="%s.%s" % (name, k))
            self.assertAlmostEqual(got["rel_update"], want["rel_update"], delta=1e-12)
            top = np.linalg.svd(w.double().numpy(), compute_uv=False)[0]
            self.assertAlmostEqual(got["sigma"] / top, 1, delta=1.5e-3)
        wte = self.w_after["transformer.wte.weight"]
        head = stabmeter.layer_metrics("lm_head", wte, before=self.w_before["transformer.wte.weight"])
        self.assertAlmostEqual(self.metrics["lm_head"]["forward"], head["forward"], delta=1e-9 * head["forward"])
        self.assertAlmostEqual(self.metrics["lm_head"]["update"], head["update"], delta=1e-9 * head["update"])

    def test_export_reads_it(self):
        r = subprocess.run([program("export"), "--wide", self.trace], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 1 + STEPS)
        self.assertIn("transformer.h.0.attn.logits.head3_bound", lines[0].split(","))


class EveryAndStateDict(unittest.TestCase):
    def test_every(self):
        torch.manual_seed(1)
        model = GPT(width=32, depth=1, heads=2, context=16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = batches(256, 16, 4)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.h5")
            with st.Monitor(model, trace=path, every=3) as mon:  # heads from nowhere: no attention layer
                self.assertNotIn("transformer.h.0.attn.logits", dict(mon.layers))
                self.assertIn("transformer.h.0.attn.logits", mon.skipped)
                measured = []
                for step in range(1, 8):
                    x, y = next(data)
                    loss = model(x, y)
                    opt.zero_grad()
                    loss.backward()
                    mon.before_step(step)
                    opt.step()
                    measured.append(mon.after_step(step, loss=loss.item()))
            self.assertEqual(measured, [s % 3 == 0 for s in range(1, 8)])
            with h5py.File(path, "r") as f:
                self.assertEqual(list(f["step"][:]), [3, 6])
                self.assertTrue(np.isnan(f["scalars/lr"][:]).all())
                self.assertTrue(np.isfinite(layer_columns(f)["transformer.h.0.mlp.c_fc"][1]["update"]).all())

    def test_from_state_dict(self):
        torch.manual_seed(2)
        model = GPT(width=32, depth=1, heads=2, context=16)
        sd = {k: v.bfloat16() if k.endswith("c_fc.weight") else v for k, v in model.state_dict().items()}
        mon = st.Monitor.from_state_dict(sd, heads=2)
        got = mon.measure()
        mon.close()
        # a state dict lists the tied head's tensor under its own name: an lm_head layer of its own
        self.assertEqual(got["lm_head"]["kind"], "lm_head")
        self.assertEqual(got["transformer.h.0.attn.logits"]["kind"], "attention")
        w = sd["transformer.h.0.mlp.c_fc.weight"]
        self.assertEqual(got["transformer.h.0.mlp.c_fc"]["forward"], stabmeter.layer_metrics("linear", w)["forward"])
        self.assertTrue(np.isnan(got["transformer.h.0.mlp.c_fc"]["update"]))


if __name__ == "__main__":
    unittest.main()


class TraceAlreadyThere(unittest.TestCase):
    """A trace already at trace= is kept, byte for byte, unless the Monitor is asked to append
    to it (if_exists='append': its steps after the trace's last) or to replace it."""

    @staticmethod
    def read(path):
        with open(path, "rb") as f:
            return f.read()

    def run_steps(self, model, mon, steps):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = batches(256, 16, 4)
        for step in steps:
            x, y = next(data)
            loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            mon.before_step(step)
            opt.step()
            mon.after_step(step, loss=loss.item())

    def test_if_exists(self):
        torch.manual_seed(3)
        model = GPT(width=32, depth=1, heads=2, context=16)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.h5")
            with st.Monitor(model, trace=path, heads=2) as mon:
                self.run_steps(model, mon, range(1, 4))
            before = self.read(path)
            # the default: refused, naming the path and the two ways on, the file as it was
            with self.assertRaises(stabmeter.AlreadyExists) as c:
                st.Monitor(model, trace=path, heads=2)
            self.assertIn(path, c.exception.message)
            self.assertIn("a trace is already there", c.exception.message)
            self.assertIn("if_exists='append'", c.exception.message)
            self.assertEqual(self.read(path), before)
            self.assertEqual(sorted(os.listdir(d)), ["trace.h5"])
            with self.assertRaisesRegex(ValueError, "Monitor: if_exists='overwrite': expected one of fail"):
                st.Monitor(model, trace=path, heads=2, if_exists="overwrite")
            self.assertEqual(self.read(path), before)
            # asked to append: this run's later steps after the trace's
            with st.Monitor(model, trace=path, heads=2, if_exists="append") as mon:
                self.run_steps(model, mon, range(4, 6))
            with h5py.File(path, "r") as f:
                self.assertEqual(list(f["step"][:]), [1, 2, 3, 4, 5])
            # asked to replace: a new trace
            with st.Monitor(model, trace=path, heads=2, if_exists="replace") as mon:
                self.run_steps(model, mon, range(1, 3))
            with h5py.File(path, "r") as f:
                self.assertEqual(list(f["step"][:]), [1, 2])
            # a new path: created, whatever the default
            other = os.path.join(d, "new", "trace.h5")
            with st.Monitor(model, trace=other, heads=2) as mon:
                self.run_steps(model, mon, [1])
            with h5py.File(other, "r") as f:
                self.assertEqual(list(f["step"][:]), [1])
