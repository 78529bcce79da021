"""stabmeter._device, the C engine's Lanczos in torch operations (what a model on a GPU runs),
run here on CPU tensors: float32, float16 and bfloat16 matrices (Gaussian, tall, wide, with few
rows, narrow, spiked with s1/s2 = 1.001) against numpy's float64 SVD of the stored values (the
estimate a lower bound, its actual error never above the error it reports: counted), against
the C library (stabmeter.sigma, stabmeter.layer_metrics) within the two reported errors with
comparable passes, sigma(A - B) of an update, a linear layer's metrics assembled from device-side
quantities, the warm start after a small update, restarts, the chunked float64 copy, the zero
and non-finite matrices, and stabmeter.torch.Monitor's path for a model off the CPU."""

import math
import unittest

import numpy as np
import torch

import stabmeter
from stabmeter import _device

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ROUND = 1e-12  # float64 rounding of the reference and the estimate, relative


def svd_top(t):
    return float(np.linalg.svd(t.double().numpy(), compute_uv=False)[0])


def spiked(rng, rows, cols, ratio):
    """U diag(s) V^T with s1 / s2 = ratio, the rest spread below."""
    u, _ = np.linalg.qr(rng.standard_normal((rows, cols)))
    v, _ = np.linalg.qr(rng.standard_normal((cols, cols)))
    s = np.concatenate(([ratio, 1.0], np.linspace(0.95, 0.05, cols - 2)))
    return (u * s) @ v.T


def families(rng):
    yield "gaussian 300x200", rng.standard_normal((300, 200))
    yield "tall 900x150", rng.standard_normal((900, 150))
    yield "wide 150x700", rng.standard_normal((150, 700))
    yield "few rows 64x400", rng.standard_normal((64, 400))
    yield "narrow 500x24", rng.standard_normal((500, 24))
    yield "narrow 40x32", rng.standard_normal((40, 32))
    yield "spiked 256x128", spiked(rng, 256, 128, 1.001)


class Device(unittest.TestCase):
    def check_estimate(self, r, ref, what):
        """r within its reported error of ref, a lower bound: returns 1 when the actual error is
        above the reported one (counted by the caller), 0 otherwise."""
        self.assertFalse(r["nonfinite"], what)
        self.assertLessEqual(r["sigma"], ref * (1 + ROUND), what)
        return int((ref - r["sigma"]) / ref > r["rel_err"] + ROUND)

    def test_families_against_svd_and_c(self):
        rng = np.random.default_rng(31)
        over, rows = 0, []
        for name, m in families(rng):
            for dt in DTYPES:
                t = torch.from_numpy(m.astype(np.float32)).to(dt)
                ref = svd_top(t)
                for tol in (1e-3, 1e-6):
                    what = "%s %s tol %g" % (name, dt, tol)
                    d = _device.sigma(t, tol=tol)
                    self.assertTrue(d["converged"], what)
                    over += self.check_estimate(d, ref, what)
                    # the C library on the same values (float16/bfloat16 widen exactly to float32)
                    c = stabmeter.sigma(t.float().numpy(), tol=tol, full=True)
                    self.assertLessEqual(abs(d["sigma"] - c["sigma"]),
                                         (d["rel_err"] + c["rel_err"] + ROUND) * ref, what)
                    self.assertLessEqual(abs(d["passes"] - c["passes"]), max(2, c["passes"] // 4), what)
                    rows.append((what, d["passes"], c["passes"], (ref - d["sigma"]) / ref, d["rel_err"]))
        print("\n%-36s %6s %6s %10s %10s" % ("matrix", "dev", "C", "actual", "reported"))
        for r in rows:
            print("%-36s %6d %6d %10.2e %10.2e" % r)
        self.assertEqual(over, 0, "estimates whose actual error is above the reported one")

    def test_spiked_seeds(self):
        # s1/s2 = 1.001: the case where a tighter bound (Kato-Temple, r^2 / gap of Ritz values)
        # reports less than the actual error; the residual bound must never
        over, passes = 0, []
        for seed in range(24):
            rng = np.random.default_rng(1000 + seed)
            t = torch.from_numpy(spiked(rng, 512, 128, 1.001).astype(np.float32))
            ref = svd_top(t)
            d = _device.sigma(t, tol=1e-3, seed=seed)
            over += self.check_estimate(d, ref, "spiked seed %d" % seed)
            passes.append(d["passes"])
        print("\nspiked 512x128 s1/s2 = 1.001, 24 seeds, tol 1e-3: passes %s" % passes)
        self.assertEqual(over, 0, "spiked estimates whose actual error is above the reported one")

    def test_update_against_layer_metrics(self):
        rng = np.random.default_rng(5)
        for dt in DTYPES:
            w = torch.from_numpy(rng.standard_normal((256, 192)).astype(np.float32)).to(dt)
            before = (w.float() - 1e-2 * torch.from_numpy(rng.standard_normal((256, 192)).astype(np.float32))).to(dt)
            ref = float(np.linalg.svd(w.double().numpy() - before.double().numpy(), compute_uv=False)[0])
            d = _device.sigma(w, before, tol=1e-3)
            self.assertEqual(self.check_estimate(d, ref, "update %s" % dt), 0, "update %s" % dt)
            m = stabmeter.layer_metrics("linear", w.float().numpy(), before=before.float().numpy())
            self.assertLessEqual(abs(d["sigma"] - m["sigma_update"]),
                                 (d["rel_err"] + m["sigma_update_rel_err"] + ROUND) * ref, str(dt))
            print("\nupdate %s: dev %d passes, C %d" % (dt, d["passes"], m["update_passes"]))

    def test_warm_start_after_small_update(self):
        rng = np.random.default_rng(11)
        for dt in DTYPES:
            w = torch.from_numpy(rng.standard_normal((512, 256)).astype(np.float32))
            cold = _device.sigma(w.to(dt), tol=1e-3)
            step = torch.from_numpy(rng.standard_normal((512, 256)).astype(np.float32))
            w2 = (w + 1e-3 * step).to(dt)  # a relative update of about 1e-3
            warm = _device.sigma(w2, v=cold["v"], tol=1e-3)
            self.assertEqual(self.check_estimate(warm, svd_top(w2), "warm %s" % dt), 0, "warm %s: %r" % (dt, warm))
            # fewer passes than cold, though not 1-3: the block's random part must agree (spectral.c, "Warm starts")
            self.assertLess(warm["passes"], cold["passes"], str(dt))
            print("\nwarm %s: %d passes after a 1e-3 update (cold %d)" % (dt, warm["passes"], cold["passes"]))
            # a warm matrix with few rows is exact, as a cold one (the rows side's Gram matrix)
            h = torch.from_numpy(rng.standard_normal((64, 400)).astype(np.float32)).to(dt)
            r0 = _device.sigma(h)
            r1 = _device.sigma(h, v=r0["v"])
            self.assertEqual(self.check_estimate(r1, svd_top(h), "warm few rows"), 0, "warm few rows %s" % dt)
            self.assertEqual((r1["passes"], r1["rel_err"]), (1, 0.0))

    def test_restarts_and_chunks(self):
        rng = np.random.default_rng(3)
        t = torch.from_numpy(spiked(rng, 400, 300, 1.01).astype(np.float32))
        ref = svd_top(t)
        small = _device.sigma(t, tol=1e-6, krylov_dim=8)  # restarts every 2 passes
        self.assertTrue(small["converged"])
        self.assertGreater(small["passes"], 2)
        self.assertEqual(self.check_estimate(small, ref, "krylov_dim 8"), 0, "krylov_dim 8: %r" % small)
        whole = _device.sigma(t, tol=1e-6)
        saved = _device.CHUNK_ELEMS
        try:
            _device.CHUNK_ELEMS = 1000  # the float64 copy made 3 rows at a time, every pass
            chunked = _device.sigma(t, tol=1e-6)
        finally:
            _device.CHUNK_ELEMS = saved
        self.assertEqual(chunked["passes"], whole["passes"])
        self.assertAlmostEqual(chunked["sigma"] / whole["sigma"], 1.0, delta=1e-13)

    def test_linear_metrics_against_numpy_and_c(self):
        # a linear layer measured on the device (sigma by _device, sums of squares by torch,
        # assembled by the C library) against numpy in float64 and stab_layer_metrics of the same
        # stored values (float16/bfloat16 read by the C library as stored)
        rng = np.random.default_rng(17)
        for shape in ((192, 320), (96, 160), (300, 200), (64, 24)):
            for dt in DTYPES:
                what = "%s %s" % (shape, dt)
                f = lambda *s: torch.from_numpy(rng.standard_normal(s).astype(np.float32))
                w, b = f(*shape).to(dt), f(shape[0]).to(dt)
                wb, bb = (w.float() - 1e-2 * f(*shape)).to(dt), (b.float() - 1e-2 * f(shape[0])).to(dt)
                m, v, vu = _device.linear_metrics(w, b, wb, bb)
                d = stabmeter._lib.metrics_dict(m)
                W, B, Wb, Bb = (t.double().numpy() for t in (w, b, wb, bb))
                dW, dB = W - Wb, B - Bb
                s1 = np.linalg.svd(W, compute_uv=False)[0]
                su = np.linalg.svd(dW, compute_uv=False)[0]
                k = math.sqrt(shape[1] / shape[0])
                rms = lambda x: math.sqrt(float(np.mean(x * x)))
                self.assertEqual(self.check_estimate({"sigma": d["sigma"], "rel_err": d["sigma_rel_err"],
                                                      "nonfinite": False}, s1, what), 0, what)
                self.assertEqual(self.check_estimate({"sigma": d["sigma_update"], "rel_err": d["sigma_update_rel_err"],
                                                      "nonfinite": False}, su, what), 0, what)
                e, eu = d["sigma_rel_err"] + ROUND, d["sigma_update_rel_err"] + ROUND
                self.assertLessEqual(abs(d["forward"] - (k * s1 + rms(B))), e * k * s1 + 1e-12, what)
                self.assertLessEqual(abs(d["update"] - (k * su + rms(dB))), eu * k * su + 1e-12, what)
                ru = math.sqrt((np.sum(dW * dW) + np.sum(dB * dB)) / (np.sum(W * W) + np.sum(B * B)))
                self.assertAlmostEqual(d["rel_update"] / ru, 1.0, delta=1e-12, msg=what)
                self.assertEqual(d["flags"], 0, what)
                c = stabmeter.layer_metrics("linear", w, bias=b, before=wb, before_bias=bb)
                for key, err in (("sigma", "sigma_rel_err"), ("sigma_update", "sigma_update_rel_err")):
                    self.assertLessEqual(abs(d[key] - c[key]), (d[err] + c[err] + ROUND) * c[key], what + key)
                self.assertAlmostEqual(d["rel_update"] / c["rel_update"], 1.0, delta=1e-12, msg=what)
                self.assertEqual(v.shape, (shape[1],))
                self.assertEqual(vu.shape, (shape[1],))
        with self.assertRaisesRegex(ValueError, "before_bias is needed"):
            _device.linear_metrics(w, b, wb)

    def same_metrics(self, h, d, what):
        """A layer's metrics from the device path (d) and the C monitor (h): within the two
        reported errors of sigma (or of sigma_update), exact elsewhere but for rounding."""
        for key in ("forward", "dependency", "update", "sigma", "sigma_update", "rel_update",
                    "forward_tight", "dependency_tight", "update_tight", "spread"):
            x, y = h[key], d[key]
            if math.isnan(x):
                self.assertTrue(math.isnan(y), what + " " + key)
                continue
            errs = {"forward": "sigma_rel_err", "dependency": "sigma_rel_err", "sigma": "sigma_rel_err",
                    "update": "sigma_update_rel_err", "sigma_update": "sigma_update_rel_err"}
            e = sum(0.0 if math.isnan(m[errs[key]]) else m[errs[key]] for m in (h, d)) if key in errs else 0.0
            self.assertLessEqual(abs(x - y), (e + 1e-9) * abs(x), what + " " + key)
        self.assertEqual(h["flags"], d["flags"], what)

    def test_monitor_device_path_gpt2_conv1d(self):
        # Hugging Face GPT-2's Conv1D, in-major: the fused c_attn's q, k, v parts are column
        # blocks of one [d][3d] tensor (a row stride of 3d), measured on the device from there
        import warnings
        import stabmeter.torch as st
        nn = torch.nn

        class Conv1D(nn.Module):
            def __init__(self, nf, nx):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
                self.bias = nn.Parameter(torch.randn(nf) * 0.1)

        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.c_attn, self.c_proj = Conv1D(3 * 64, 64), Conv1D(64, 64)

        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.c_fc = Conv1D(4 * 64, 64)  # [64][256]: d_in 64, d_out 256

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.attn, self.ln_1, self.mlp = Attn(), nn.LayerNorm(64), MLP()

        class GPT(nn.Module):
            def __init__(self):
                super().__init__()
                self.h, self.wte = nn.ModuleList([Block()]), nn.Embedding(40, 64)

        torch.manual_seed(2)
        m = GPT()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            host, dev = st.Monitor(m, heads=4), st.Monitor(m, heads=4, _on_device=True)
        self.assertEqual({host.layers[L[0]][0] for L in dev._mirrors.linear},
                         {"h.0.attn.c_attn.q", "h.0.attn.c_attn.k", "h.0.attn.c_attn.v", "h.0.attn.c_proj",
                          "h.0.mlp.c_fc"})
        for step in (1, 2):
            for mon in (host, dev):
                mon.before_step(step)
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(1e-3 * torch.randn_like(p))
            for mon in (host, dev):
                mon.after_step(step)
            mh, md = host.metrics(), dev.metrics()
            for name in mh:
                self.assertEqual(mh[name]["layout"], md[name]["layout"], name)
                self.same_metrics(mh[name], md[name], "gpt2 %s step %d" % (name, step))
        # q's sigma against numpy: the first d columns of c_attn.weight, as stored [d_in][d_out]
        q = m.h[0].attn.c_attn.weight.detach().double()[:, :64].numpy()
        ref = np.linalg.svd(q, compute_uv=False)[0]
        d = md["h.0.attn.c_attn.q"]
        self.assertLessEqual(abs(ref - d["sigma"]), (d["sigma_rel_err"] + ROUND) * ref)
        host.close()
        dev.close()

    def test_monitor_device_path(self):
        # the Monitor's path for parameters off the CPU (_on_device: taken by CPU tensors here,
        # the code a GPU runs): linear layers measured by _device where they are, the other
        # layers by the C monitor from host copies, one trace; against the plain Monitor of the
        # same model (same names, every metric within the two reported errors), the linear
        # layers' sigma and sigma_update against numpy, and the trace's rows
        import os
        import tempfile
        import warnings
        import stabmeter.torch as st

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(50, 64)
                self.fc = torch.nn.Linear(64, 160)
                self.ln = torch.nn.LayerNorm(160)
                self.attn = torch.nn.MultiheadAttention(64, 4)
                self.conv = torch.nn.Conv1d(8, 16, 3)
                self.head = torch.nn.Linear(160, 50)

        for dt in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            net = Net().to(dt)
            with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the unmeasured tensors: said by both alike
                host = st.Monitor(net, trace=os.path.join(tmp, "host.h5"))
                dev = st.Monitor(net, trace=os.path.join(tmp, "dev.h5"), _on_device=True)
                self.assertEqual(host.layers, dev.layers)
                ondev = {host.layers[L[0]][0] for L in dev._mirrors.linear}
                self.assertEqual(ondev, {"fc", "attn.in_proj.q", "attn.in_proj.k", "attn.in_proj.v",
                                         "attn.out_proj", "conv"}, str(dt))
                last = {}
                for step in (1, 2, 3):
                    for mon in (host, dev):
                        mon.before_step(step)
                    before = {n: p.detach().double().clone() for n, p in net.named_parameters()}
                    with torch.no_grad():
                        for p in net.parameters():
                            p.add_((1e-3 * torch.randn(p.shape)).to(dt))
                    for mon in (host, dev):
                        mon.after_step(step, loss=1.0 / step)
                    mh, md = host.metrics(), dev.metrics()
                    for name, h in mh.items():
                        d = md[name]
                        what = "%s %s step %d" % (dt, name, step)
                        self.same_metrics(h, d, what)
                        if name in ondev:  # against numpy in float64
                            # the same warm starts as the C monitor's: comparable passes
                            self.assertLessEqual(abs(d["passes"] - h["passes"]), 2, what)
                            self.assertLessEqual(abs(d["update_passes"] - h["update_passes"]), 2, what)
                            pname = {"attn.in_proj.q": "attn.in_proj_weight", "attn.in_proj.k": "attn.in_proj_weight",
                                     "attn.in_proj.v": "attn.in_proj_weight"}.get(name, name + ".weight")
                            w = dict(net.named_parameters())[pname].detach().double()
                            wb = before[pname]
                            part = "qkv".find(name[-1]) if pname == "attn.in_proj_weight" else -1
                            if part >= 0:
                                w, wb = w[64 * part:64 * (part + 1)], wb[64 * part:64 * (part + 1)]
                            w, wb = w.reshape(w.shape[0], -1).numpy(), wb.reshape(wb.shape[0], -1).numpy()
                            for got, err, m in ((d["sigma"], d["sigma_rel_err"], w), (d["sigma_update"],
                                                 d["sigma_update_rel_err"], w - wb)):
                                ref = np.linalg.svd(m, compute_uv=False)[0]
                                self.assertLessEqual(got, ref * (1 + ROUND), what)
                                self.assertLessEqual(ref - got, (err + ROUND) * ref, what)
                            last[name] = (d["passes"], h["passes"])
                print("\nMonitor %s, step 3, passes (device, C): %s" % (dt, last))
                host.close()
                dev.close()
                th, td = stabmeter.read_trace(os.path.join(tmp, "host.h5")), stabmeter.read_trace(os.path.join(tmp, "dev.h5"))
                self.assertEqual([l.name for l in th.layers], [l.name for l in td.layers])
                self.assertEqual(list(td.steps), [1, 2, 3])
                for lh in th.layers:
                    ld = td.layer(lh.name)
                    for key in ("forward", "sigma", "update"):
                        if key in lh.metrics:
                            np.testing.assert_allclose(ld.metrics[key], lh.metrics[key], rtol=2e-3, equal_nan=True,
                                                       err_msg="%s %s %s" % (dt, lh.name, key))

    def test_not_converged(self):
        # max_passes running out: converged False, the bound reported as it stands (still true
        # of the estimate), as the C engine does; the layer flagged STAB_FLAG_NOT_CONVERGED
        rng = np.random.default_rng(23)
        t = torch.from_numpy(rng.standard_normal((300, 200)).astype(np.float32))
        d = _device.sigma(t, tol=1e-6, max_passes=3)
        c = stabmeter.sigma(t.numpy(), tol=1e-6, max_passes=3, full=True)
        self.assertFalse(d["converged"])
        self.assertFalse(c["converged"])
        self.assertEqual(d["passes"], 3)
        self.assertGreater(d["rel_err"], 1e-6)
        self.assertEqual(self.check_estimate(d, svd_top(t), "3 passes"), 0)
        self.assertLessEqual(abs(d["sigma"] - c["sigma"]), (d["rel_err"] + c["rel_err"]) * c["sigma"])
        m, _, _ = _device.linear_metrics(t, tol=1e-6, max_passes=3)
        self.assertEqual(m.flags, stabmeter._lib.FLAG_NOT_CONVERGED)

    def test_zero_and_nonfinite(self):
        z = _device.sigma(torch.zeros(100, 50))
        self.assertEqual(z["sigma"], 0.0)
        self.assertEqual(z["rel_err"], 0.0)
        for shape in ((100, 50), (100, 20), (40, 300)):
            a = torch.randn(*shape)
            a[3, 7] = float("nan")
            r = _device.sigma(a)
            self.assertTrue(r["nonfinite"], str(shape))
            self.assertTrue(math.isnan(r["sigma"]), str(shape))

    def test_bad_arguments(self):
        with self.assertRaisesRegex(TypeError, "float32, float16 or bfloat16"):
            _device.sigma(torch.zeros(4, 4, dtype=torch.float64))
        with self.assertRaisesRegex(ValueError, "b must have a's shape"):
            _device.sigma(torch.zeros(4, 4), torch.zeros(4, 5))
        with self.assertRaisesRegex(ValueError, "tol"):
            _device.sigma(torch.zeros(4, 4), tol=0.5)


if __name__ == "__main__":
    unittest.main()
