"""stabmeter.read_trace (the library's trace reader, through ctypes) against h5py reading the same
files on its own: a format 4 trace written by stabmeter-train, and the format 1 and 3 traces of
older stabmeters in tests/corpus/; to_xarray against xarray.open_dataset on format 4, to_pandas
against stabmeter-export's wide CSV, and bad inputs raising with the file named."""

import gzip
import io
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import h5py
import numpy as np

import stabmeter
from python_util import program

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")


def text(v):
    return v.decode() if isinstance(v, bytes) else v


def natural_key(name):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def h5py_trace(path):
    """The trace as h5py reads it, independently of the library: (format_version, run_config,
    steps, wall_time, {scalar: values}, {layer: (kind, {attr: value}, {metric: values})})."""
    with h5py.File(path, "r") as f:
        version = int(f.attrs["format_version"])
        steps = f["step"][:]
        n = len(steps)
        scalars = {k: d[:n] for k, d in f["scalars"].items() if not (version >= 2 and k == "step")}
        layers = {}
        g = f["layers"]
        if version >= 4:
            names = [text(x) for x in g["layer"][:]]
            attrs = [dict() for _ in names]
            metrics = [dict() for _ in names]
            for k, d in g.items():
                if k in ("step", "layer"):
                    continue
                if d.ndim == 1 and len(d) == len(names) and d.dtype.kind in "iO":
                    for a, v in zip(attrs, d[:]):
                        a[k] = text(v) if d.dtype.kind == "O" else int(v)
                elif d.ndim == 2 and k != "head_bound":
                    for i, m in enumerate(metrics):
                        m[k] = d[:n, i]
            if "head_bound" in g:
                index = {name: i for i, name in enumerate(names)}
                for c, (layer, h) in enumerate(zip(g["head_layer"][:], g["head"][:])):
                    metrics[index[text(layer)]]["head%d_bound" % h] = g["head_bound"][:n, c]
            for name, a, m in zip(names, attrs, metrics):
                layers[name] = (a["kind"], a, m)
        else:
            for name, lg in g.items():
                a = {k: text(v) if isinstance(v, (bytes, str)) else int(v) for k, v in lg.attrs.items()}
                m = {k: d[:n] for k, d in lg.items() if not (version >= 2 and k == "step")}
                layers[name] = (a["kind"], a, m)
        config = text(f.attrs.get("run_config", "{}"))
        return version, config, steps, f["wall_time"][:n], scalars, layers


class ReadTrace(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="python_read_trace.")
        run = os.path.join(cls.dir, "run")
        r = subprocess.run([program("train"), "--steps", "5", "--width", "32", "--depth", "2", "--heads", "2",
                            "--context", "16", "--batch", "2", "--corpus-bytes", "20000", "--out", run],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        cls.v4 = os.path.join(run, "trace.h5")
        cls.old = {}
        for version in (1, 3):
            folder = os.path.join(CORPUS, "trace-v%d" % version)
            (gz,) = [x for x in os.listdir(folder) if x.endswith(".h5.gz")]
            path = os.path.join(cls.dir, "v%d.h5" % version)
            with gzip.open(os.path.join(folder, gz)) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            cls.old[version] = path

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def paths(self):
        return [(4, self.v4), (1, self.old[1]), (3, self.old[3])]

    def test_values_as_h5py_reads_them(self):
        for version, path in self.paths():
            with self.subTest(format_version=version):
                want_version, config, steps, wall, scalars, layers = h5py_trace(path)
                t = stabmeter.read_trace(path)
                self.assertEqual(t.format_version, version)
                self.assertEqual(want_version, version)
                self.assertEqual(t.run_config, config)
                self.assertGreater(len(t), 0)
                self.assertEqual(t.steps.dtype, np.int64)
                np.testing.assert_array_equal(t.steps, steps)
                np.testing.assert_array_equal(t.wall_time, wall)
                self.assertEqual(list(t.scalars), sorted(scalars, key=natural_key))
                for k, v in scalars.items():
                    np.testing.assert_array_equal(t.scalars[k], v, err_msg=k)
                self.assertEqual([l.name for l in t.layers], sorted(layers, key=natural_key))
                for l in t.layers:
                    kind, attrs, metrics = layers[l.name]
                    self.assertEqual(l.kind, kind)
                    self.assertEqual(l.attrs, attrs, l.name)
                    self.assertEqual(sorted(l.metrics), sorted(metrics), l.name)
                    self.assertEqual(list(l.metrics)[:3], ["forward", "dependency", "update"])
                    for m, v in metrics.items():
                        self.assertEqual(l.metrics[m].dtype, np.float64)
                        np.testing.assert_array_equal(l.metrics[m], v, err_msg="%s %s" % (l.name, m))
                self.assertTrue(any(re.match(r"head\d+_bound$", m) for l in t.layers for m in l.metrics),
                                "an attention layer's head bounds")

    def test_selection(self):
        t = stabmeter.read_trace(self.v4, layers=["*attn*"], metrics=["forward", "loss"])
        self.assertIsNone(t.wall_time)
        self.assertEqual(list(t.scalars), ["loss"])
        self.assertTrue(t.layers and all("attn" in l.name for l in t.layers))
        self.assertTrue(all(list(l.metrics) == ["forward"] for l in t.layers))
        full = stabmeter.read_trace(self.v4)
        for l in t.layers:
            np.testing.assert_array_equal(l.metrics["forward"], full.layer(l.name).metrics["forward"])

    def test_bad_inputs(self):
        with self.assertRaises(stabmeter.FormatError) as e:
            stabmeter.read_trace(self.v4, layers="no.such.layer*")
        self.assertIn(self.v4, str(e.exception))
        self.assertIn("no.such.layer*", str(e.exception))
        with self.assertRaises(stabmeter.FormatError) as e:
            stabmeter.read_trace(self.v4, metrics="no_such_metric")
        self.assertIn("no_such_metric", str(e.exception))
        missing = os.path.join(self.dir, "missing.h5")
        with self.assertRaises(stabmeter.IOError_) as e:
            stabmeter.read_trace(missing)
        self.assertIn(missing, str(e.exception))
        not_hdf5 = os.path.join(self.dir, "not_a_trace.h5")
        with open(not_hdf5, "w") as f:
            f.write("step,loss\n1,2.5\n")
        with self.assertRaises(stabmeter.FormatError) as e:
            stabmeter.read_trace(not_hdf5)
        self.assertIn(not_hdf5, str(e.exception))
        other = os.path.join(self.dir, "other.h5")
        with h5py.File(other, "w") as f:
            f["step"] = np.arange(3)
        with self.assertRaises(stabmeter.FormatError) as e:
            stabmeter.read_trace(other)
        self.assertIn("format", str(e.exception))

    def test_to_xarray_as_xarray_reads_format_4(self):
        try:
            import xarray
        except ImportError:
            self.skipTest("xarray is not importable (Debian: python3-xarray)")
        engine = None
        for name, module in (("h5netcdf", "h5netcdf"), ("netcdf4", "netCDF4")):
            try:
                __import__(module)
                engine = name
                break
            except ImportError:
                pass
        if engine is None:
            self.skipTest("neither h5netcdf nor netCDF4 is importable")
        mine = stabmeter.read_trace(self.v4).to_xarray()
        with xarray.open_dataset(self.v4, group="layers", engine=engine) as direct:
            self.assertEqual(dict(mine.sizes), dict(direct.sizes))
            # direct: the monitor's order along layer; mine: name order
            direct = direct.load()
            order = [list(direct["layer"].values).index(n) for n in mine["layer"].values]
            for k, v in direct.data_vars.items():
                if v.dims == ("step", "layer"):
                    self.assertEqual(mine[k].dims, ("step", "layer"), k)
                    np.testing.assert_array_equal(mine[k].values, v.values[:, order], err_msg=k)
                elif v.dims == ("layer",):  # kind, d_in, ...: mine has them as coordinates
                    self.assertEqual(list(mine[k].values), list(v.values[order]), k)
            np.testing.assert_array_equal(mine["step"].values, direct["step"].values)
            # the heads, ordered by layer name then head number in mine
            key = [(natural_key(str(l)), int(h)) for l, h in zip(direct["head_layer"].values, direct["head"].values)]
            heads = sorted(range(len(key)), key=lambda i: key[i])
            self.assertEqual(list(mine["head"].values), list(direct["head"].values[heads]))
            self.assertEqual(list(mine["head_layer"].values), list(direct["head_layer"].values[heads]))
            np.testing.assert_array_equal(mine["head_bound"].values, direct["head_bound"].values[:, heads])
        for version in (1, 3):  # older formats take the same shape
            x = stabmeter.read_trace(self.old[version]).to_xarray()
            self.assertEqual(x["forward"].dims, ("step", "layer"))
            self.assertIn("head_bound", x)
            self.assertEqual(x.attrs["format_version"], version)

    def test_to_pandas_as_export_writes_it(self):
        try:
            import pandas
        except ImportError:
            self.skipTest("pandas is not importable (Debian: python3-pandas)")
        for version, path in self.paths():
            with self.subTest(format_version=version):
                t = stabmeter.read_trace(path)
                r = subprocess.run([program("export"), "--wide", path], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                exported = pandas.read_csv(io.StringIO(r.stdout), index_col="step", float_precision="round_trip")
                wide = t.to_pandas("wide")
                self.assertEqual(list(wide.columns), list(exported.columns))
                np.testing.assert_array_equal(wide.index.values, exported.index.values)
                np.testing.assert_array_equal(wide.values, exported.values)
                long = t.to_pandas()
                self.assertEqual(list(long.columns), ["step", "layer", "kind", "metric", "value"])
                self.assertEqual(len(long), len(t) * wide.shape[1])
                first = long[(long.step == t.steps[0]) & (long.layer == t.layers[0].name)]
                self.assertEqual(list(first.metric), list(t.layers[0].metrics))
                np.testing.assert_array_equal(first.value.values, [v[0] for v in t.layers[0].metrics.values()])


if __name__ == "__main__":
    unittest.main()
