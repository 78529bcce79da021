"""stabmeter.probe against stabmeter-probe --json on the same files: the same report, key for
key and number for number (the program prints the library's text), with --prev, --heads and
--kind, --init; the ratios to init against two plain reports' quotient; the rows as a list and as a DataFrame; a missing file and one of another format raise
with the library's message."""

import os
import tempfile
import unittest
import warnings

import numpy as np

import stabmeter
from python_util import probe_json, write_safetensors


class Probe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = np.random.default_rng(11)
        d = 32
        t = {"transformer.wte.weight": 0.02 * r.standard_normal((80, d)),
             "transformer.h.0.ln_1.weight": 1 + 0.1 * r.standard_normal(d),
             "transformer.h.0.attn.c_attn.weight": r.standard_normal((d, 3 * d)) / 8,
             "transformer.h.0.attn.c_attn.bias": r.standard_normal(3 * d),
             "transformer.h.0.mlp.c_fc.weight": r.standard_normal((d, 4 * d)) / 8,
             "transformer.h.0.mlp.c_proj.weight": r.standard_normal((4 * d, d)) / 8}
        cls.dir = tempfile.TemporaryDirectory()
        cls.new, cls.old = os.path.join(cls.dir.name, "new.safetensors"), os.path.join(cls.dir.name, "old.safetensors")
        write_safetensors(cls.new, t)
        write_safetensors(cls.old, {k: v + 0.01 * r.standard_normal(v.shape) for k, v in t.items()})

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_report_is_the_programs(self):
        for args, kw in ((["--heads", "4"], {"heads": 4}),
                         (["--prev", self.old, "--heads", "4"], {"prev": self.old, "heads": 4}),
                         (["--kind", "*.ln_1.weight=skip"], {"kinds": {"*.ln_1.weight": "skip"}}),
                         (["--sort", "forward", "--top", "3"], {"sort": "forward", "top": 3})):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = stabmeter.probe_report(self.new, **kw)
            self.assertEqual(got, probe_json(self.new, *args), args)

    def test_init(self):
        # init= is --init; prev alone makes the ratios the earlier checkpoint's, as the program's
        for args, kw in ((["--init", self.old, "--heads", "4"], {"init": self.old, "heads": 4}),
                         (["--prev", self.old, "--init", self.new], {"prev": self.old, "init": self.new}),
                         (["--init", self.old, "--sort", "forward_ratio"], {"init": self.old, "sort": "forward_ratio"})):
            self.assertEqual(stabmeter.probe_report(self.new, **kw), probe_json(self.new, *args), args)
        # the ratio is the two plain reports' quotient (an independent division)
        new = {r["name"]: r for r in probe_json(self.new, "--heads", "4")["layers"]}
        old = {r["name"]: r for r in probe_json(self.old, "--heads", "4")["layers"]}
        rows = stabmeter.probe(self.new, init=self.old, heads=4, frame=False)
        self.assertEqual(len(rows), len(new))
        for r in rows:
            for key in ("forward", "dependency"):
                if new[r["name"]][key] is None:
                    self.assertIsNone(r[key + "_ratio"], r["name"])
                    continue
                self.assertEqual(r[key + "_init"], old[r["name"]][key], r["name"])
                self.assertAlmostEqual(r[key + "_ratio"], new[r["name"]][key] / old[r["name"]][key], delta=1e-12)

    def test_rows(self):
        rows = stabmeter.probe(self.new, prev=self.old, heads=4, frame=False)
        want = probe_json(self.new, "--prev", self.old, "--heads", "4")["layers"]
        self.assertEqual(rows, want)
        names = [r["name"] for r in rows]
        self.assertIn("transformer.h.0.attn.logits", names)
        self.assertIn("lm_head", names)  # the tied head
        try:
            import pandas  # noqa: F401
        except ImportError:
            self.skipTest("pandas is not installed (Debian: python3-pandas)")
        df = stabmeter.probe(self.new, prev=self.old, heads=4)
        self.assertEqual(list(df.index), names)
        self.assertEqual(df.loc["transformer.h.0.mlp.c_fc", "forward"],
                         rows[names.index("transformer.h.0.mlp.c_fc")]["forward"])

    def test_errors(self):
        missing = os.path.join(self.dir.name, "missing.safetensors")
        with self.assertRaises(stabmeter.IOError_) as c:
            stabmeter.probe(missing)
        self.assertIn(missing, c.exception.message)
        text = os.path.join(self.dir.name, "notes.txt")
        with open(text, "w") as f:
            f.write("not a checkpoint\n")
        with self.assertRaises(stabmeter.FormatError) as c:
            stabmeter.probe(text)
        self.assertIn(text, c.exception.message)
        with self.assertRaises(stabmeter.NotFound):
            stabmeter.probe(self.new, filters=["nothing.*"])
        with self.assertRaises(stabmeter.IOError_) as c:
            stabmeter.probe(self.new, init=missing)
        self.assertIn(missing, c.exception.message)
        with self.assertRaisesRegex(ValueError, "sort"):
            stabmeter.probe(self.new, sort="size")


if __name__ == "__main__":
    unittest.main()
