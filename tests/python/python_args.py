"""Every argument the binding hands to C is checked first, and the error names the Python
argument: arrays against every dimension C reads them by (an attention key shorter than its
heads), integers against the C type they become (no wrap-around), enum-like strings against
their values (a typo is refused, not ignored), alignment. numpy only (no torch): this module
runs in the sanitizer build too, where a read past an array is a report."""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import numpy as np

import stabmeter
from python_util import write_safetensors


def gauss(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class AttentionShapes(unittest.TestCase):
    """A query of 4 heads of 8 (32 x 16): the key C reads is kv_heads * 8 rows of 16."""

    def setUp(self):
        self.q = gauss((32, 16))

    def test_short_key_refused(self):
        k = gauss((16, 16), 1)  # 2 heads' rows
        with self.assertRaisesRegex(ValueError, r"^layer_metrics: weight_k: shape \(16, 16\).*kv_heads=4.*\(32, 16\)"):
            stabmeter.layer_metrics("attention", self.q, weight_k=k, heads=4, kv_heads=4)
        with self.assertRaisesRegex(ValueError, r"^layer_metrics: weight_k: shape \(8, 16\).*kv_heads=2.*\(16, 16\)"):
            stabmeter.layer_metrics("attention", self.q, weight_k=k[:8], heads=4, kv_heads=2)
        # a key as long as the query but told to have more heads than it holds
        with self.assertRaisesRegex(ValueError, "kv_heads"):
            stabmeter.layer_metrics("attention", self.q, weight_k=k, heads=4, kv_heads=8)

    def test_kv_heads_zero_refused(self):
        k = gauss((16, 16), 1)
        with self.assertRaisesRegex(ValueError, r"kv_heads=0"):
            stabmeter.layer_metrics("attention", self.q, weight_k=k, heads=4, kv_heads=0)

    def test_key_rows_not_whole_heads(self):
        with self.assertRaisesRegex(ValueError, r"weight_k.*12 rows.*head_dim 8"):
            stabmeter.layer_metrics("attention", self.q, weight_k=gauss((12, 16), 1), heads=4)

    def test_in_major_key(self):
        qi = np.ascontiguousarray(self.q.T)  # [d_in][d_out]
        with self.assertRaisesRegex(ValueError, "weight_k"):
            stabmeter.layer_metrics("attention", qi, weight_k=qi[:, :16], heads=4, kv_heads=4,
                                    layout="in_major")

    def test_consistent_key_measures(self):
        # grouped-query: 2 key heads, given or inferred from the key's rows, bound each query
        # head as the same key with each key head repeated for its group of 2 query heads
        k = gauss((16, 16), 1)
        a = stabmeter.layer_metrics("attention", self.q, weight_k=k, heads=4, kv_heads=2)
        b = stabmeter.layer_metrics("attention", self.q, weight_k=k, heads=4)
        full = np.concatenate([k[0:8], k[0:8], k[8:16], k[8:16]])
        c = stabmeter.layer_metrics("attention", self.q, weight_k=full, heads=4, kv_heads=4)
        self.assertEqual(len(a["head_bounds"]), 4)
        self.assertTrue(all(np.isfinite(a["head_bounds"])))
        np.testing.assert_allclose(a["head_bounds"], b["head_bounds"], rtol=1e-6)
        np.testing.assert_allclose(a["head_bounds"], c["head_bounds"], rtol=1e-2)


class Integers(unittest.TestCase):
    def setUp(self):
        self.a = gauss((40, 30))

    def test_negative_and_huge_heads(self):
        k = gauss((40, 30), 1)
        for bad in (-1, 2 ** 64 + 4, 2 ** 70):
            with self.assertRaisesRegex(ValueError, r"^layer_metrics: heads=%d" % bad):
                stabmeter.layer_metrics("attention", self.a, weight_k=k, heads=bad)
            with self.assertRaisesRegex(ValueError, r"^layer_metrics: kv_heads=%d" % bad):
                stabmeter.layer_metrics("attention", self.a, weight_k=k, heads=4, kv_heads=bad)

    def test_not_integers(self):
        k = gauss((40, 30), 1)
        for bad in (4.0, "4", True):
            with self.assertRaisesRegex(TypeError, "heads"):
                stabmeter.layer_metrics("attention", self.a, weight_k=k, heads=bad)
        self.assertEqual(len(stabmeter.layer_metrics("attention", self.a, weight_k=k,
                                                     heads=np.int64(4))["head_bounds"]), 4)

    def test_max_passes_and_threads(self):
        for bad in (2 ** 70, 2 ** 31, -2 ** 31 - 1):
            with self.assertRaisesRegex(ValueError, r"^sigma: max_passes=%d" % bad):
                stabmeter.sigma(self.a, max_passes=bad)
            with self.assertRaisesRegex(ValueError, r"^sigma: threads=%d" % bad):
                stabmeter.sigma(self.a, threads=bad)
        # within C's int, the library's own bounds, its message naming the field
        with self.assertRaisesRegex(stabmeter.InvalidArgument, "max_passes"):
            stabmeter.sigma(self.a, max_passes=0)
        want = np.linalg.norm(self.a.astype(np.float64), 2)
        self.assertAlmostEqual(stabmeter.sigma(self.a, max_passes=300, tol=1e-6) / want, 1.0, places=5)


class Alignment(unittest.TestCase):
    def test_unaligned_refused(self):
        raw = bytearray(4 * 40 * 30 + 4)
        a = np.frombuffer(raw, dtype=np.float32, count=40 * 30, offset=1).reshape(40, 30)
        self.assertFalse(a.flags.aligned)
        with self.assertRaisesRegex(TypeError, r"^sigma: array.*aligned"):
            stabmeter.sigma(a)
        with self.assertRaisesRegex(TypeError, r"^layer_metrics: weight.*aligned"):
            stabmeter.layer_metrics("linear", a)
        with self.assertRaisesRegex(TypeError, r"^layer_metrics: before.*aligned"):
            stabmeter.layer_metrics("linear", gauss((40, 30)), before=a)
        b = np.frombuffer(raw, dtype=np.float32, count=30, offset=1)
        with self.assertRaisesRegex(TypeError, r"^layer_metrics: weight.*aligned"):
            stabmeter.layer_metrics("gain", b)


class ProbeArguments(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.path = os.path.join(cls.dir.name, "m.safetensors")
        write_safetensors(cls.path, {"wte.weight": gauss((50, 16)), "h.0.mlp.c_fc.weight": gauss((16, 24), 1)})

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_kind_typo_refused(self):
        with self.assertRaisesRegex(ValueError, r"kinds\['wte\.weight'\]='embeding'.*embedding"):
            stabmeter.probe(self.path, kinds={"wte.weight": "embeding"}, frame=False)
        with self.assertRaisesRegex(ValueError, r"layouts\['h\.\*'\]='inmajor'.*in_major"):
            stabmeter.probe(self.path, layouts={"h.*": "inmajor"}, frame=False)
        with self.assertRaisesRegex(ValueError, r"kinds.*GLOB"):
            stabmeter.probe(self.path, kinds=["embedding"], frame=False)
        # the values the program takes are taken
        rows = stabmeter.probe(self.path, kinds={"wte.weight": "lm_head"}, layouts={"h.*": "in_major"},
                               frame=False)
        by = {r["tensor"]: r for r in rows}
        self.assertEqual(by["wte.weight"]["kind"], "lm_head")
        self.assertEqual(by["h.0.mlp.c_fc.weight"]["layout"], "in_major")

    def test_enums_refused(self):
        with self.assertRaisesRegex(ValueError, r"sort='size'.*file"):
            stabmeter.probe(self.path, sort="size", frame=False)
        with self.assertRaisesRegex(ValueError, r"tight='centered'.*centred"):
            stabmeter.probe(self.path, tight="centered", frame=False)

    def test_integers_refused(self):
        for kw, bad in (("heads", -1), ("heads", 2 ** 64), ("top", -1), ("top", 2 ** 70), ("threads", 2 ** 40),
                        ("step", 2 ** 63), ("step", -2)):
            with self.assertRaisesRegex(ValueError, r"^probe_report: %s=%d" % (kw, bad)):
                stabmeter.probe(self.path, frame=False, **{kw: bad})


class ShrunkFile(unittest.TestCase):
    """A checkpoint truncated after stabmeter mapped it and before it is measured: an exception
    naming the file, not a SIGBUS ending the interpreter. In a child interpreter, so that the
    old behaviour (death by signal 7) is a failure here, not the end of the test run."""

    def test_truncated_between_open_and_measure(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "shrinks.safetensors")
            write_safetensors(path, {"h.0.mlp.c_fc.weight": gauss((512, 256))})  # 512 KiB of data
            code = textwrap.dedent("""
                import os, sys
                import stabmeter, stabmeter._probe as P
                path = sys.argv[1]
                real = P.lib
                class Hook:  # the library, with a truncation just before the measurement
                    def __getattr__(self, name):
                        return getattr(real, name)
                    def stab_probe_measure(self, *a):
                        os.truncate(path, 8192)
                        return real.stab_probe_measure(*a)
                P.lib = Hook()
                try:
                    stabmeter.probe(path, frame=False)
                except stabmeter.Error as e:
                    print(type(e).__name__, isinstance(e, OSError), e)
                    sys.exit(0)
                print("no error")
                sys.exit(1)
                """)
            r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, "exit %d (signal %d): %s%s" % (r.returncode, -r.returncode if
                                                                            r.returncode < 0 else 0, r.stdout, r.stderr))
            self.assertIn("IOError_ True", r.stdout)
            self.assertIn(path, r.stdout)
            self.assertIn("shrank while being read", r.stdout)


class ModelArguments(unittest.TestCase):
    """The library refuses an override value it does not know, whoever calls it."""

    def test_library_refuses_unknown_override(self):
        from stabmeter import _lib
        import ctypes
        cfg = _lib.lib.stab_model_default_config()
        arr = (_lib.ModelOverride * 1)()
        arr[0].glob, arr[0].value = b"*", b"embeding"
        cfg.kinds, cfg.nkinds = arr, 1
        out = ctypes.c_void_p()
        with self.assertRaisesRegex(stabmeter.InvalidArgument, "embeding"):
            _lib.check(_lib.lib.stab_model_describe(None, 0, ctypes.byref(cfg), ctypes.byref(out)))
        arr[0].value = b"in-major"
        cfg.kinds, cfg.nkinds, cfg.layouts, cfg.nlayouts = None, 0, arr, 1
        with self.assertRaisesRegex(stabmeter.InvalidArgument, "in-major"):
            _lib.check(_lib.lib.stab_model_describe(None, 0, ctypes.byref(cfg), ctypes.byref(out)))


if __name__ == "__main__":
    unittest.main()
