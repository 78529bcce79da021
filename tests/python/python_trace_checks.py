"""The checks a stabmeter trace must pass, applied alike to stabmeter-train's trace and to the
Monitor's: the ones tests/programs/trace_h5py.sh makes of tests/support/trace_writer's (root attributes, every
dataset along the steps chunked and unlimited, float64 but the step copies, as many rows as /step,
the metrics (step, layer)), and the schema of each layer (attributes, datasets) for comparing
two traces."""

import json

import h5py
import numpy as np

ROOT_ATTRS = {"format", "format_version", "library_version", "created_utc", "run_config"}


def layer_columns(f):
    """{layer: (kind, {dataset: its column}, {attribute: value})} of a format 4 trace: each
    (step, layer) dataset's column, head<h>_bound from head_bound's, the datasets along the layer
    dimension as attributes (as format 3 had them in each layer's group)."""
    g = f["layers"]
    names = list(g["layer"].asstr()[:])
    out = {}
    wide = {k: d[:] for k, d in g.items() if d.ndim == 2 and k != "head_bound"}
    statics = {k: d[:] for k, d in g.items() if d.ndim == 1 and d.maxshape[0] is not None and k not in ("head", "head_layer")}
    for i, name in enumerate(names):
        attrs = {k: (v[i].decode() if isinstance(v[i], bytes) else v[i].item()) for k, v in statics.items()}
        out[name] = (attrs["kind"], {k: v[:, i] for k, v in wide.items()}, attrs)
    if "head_bound" in g:
        hb = g["head_bound"][:]
        for c, (name, h) in enumerate(zip(g["head_layer"].asstr()[:], g["head"][:])):
            out[name][1]["head%d_bound" % h] = hb[:, c]
    return out


def check_trace(path):
    """The list of what is wrong with the trace at path (empty when it passes); its rows."""
    bad = []
    with h5py.File(path, "r") as f:
        def check(cond, what):
            if not cond:
                bad.append(what)
        check(set(f.attrs.keys()) == ROOT_ATTRS, "root attributes %s" % sorted(f.attrs.keys()))
        check(f.attrs["format"] == "stabmeter-trace", "format attr")
        check(f.attrs["format_version"] == 4, "format_version attr")
        json.loads(f.attrs["run_config"])  # JSON text
        steps = f["step"]
        check(steps.dtype == np.int64 and steps.ndim == 1, "step dtype/shape")
        n = steps.shape[0]
        check(bool(np.all(np.diff(steps[:]) > 0)), "steps increase")
        width = len(f["layers/layer"])

        def walk(name, obj):
            if not isinstance(obj, h5py.Dataset) or obj.maxshape[0] is not None:
                return  # the layers' attributes along the layer dimension
            check(obj.ndim in (1, 2) and obj.shape[0] == n, "%s shape %s, %d steps" % (name, obj.shape, n))
            check(obj.chunks is not None, "%s not chunked" % name)
            if obj.ndim == 2:
                check(name.startswith("layers/") and (name == "layers/head_bound" or obj.shape[1] == width),
                      "%s shape %s, %d layers" % (name, obj.shape, width))
            if name == "step" or name.endswith("/step"):
                check(obj.dtype == np.int64 and list(obj[:]) == list(steps[:]), "%s: not /step" % name)
            else:
                check(obj.dtype == np.float64, "%s dtype %s" % (name, obj.dtype))
                check(any(a == "units" or a.startswith("units_") for a in obj.attrs) or
                      name.startswith("scalars/") and "long_name" in obj.attrs, "%s has no units" % name)
        f.visititems(walk)
        for name, (kind, cols, _) in layer_columns(f).items():
            check(kind in ("linear", "embedding", "lm_head", "gain", "bias", "attention"), "%s kind" % name)
            # format 3 on: each metric over its first finite value > 0
            for m in ("forward", "dependency", "update"):
                v, r = cols[m], cols[m + "_ratio"]
                first = v[np.isfinite(v) & (v > 0)]
                want = v / first[0] if len(first) else np.full(n, np.nan)
                check(np.array_equal(np.isnan(want), np.isnan(r)) and np.allclose(r[~np.isnan(r)], want[~np.isnan(want)],
                                                                                 rtol=1e-15, atol=0),
                      "%s/%s_ratio is not %s over its first finite value > 0" % (name, m, m))
    return bad, n


def schema(path, drop=()):
    """{layer: (its attributes but description, created values and sharing; its datasets)} of
    every layer, and the scalars: what two traces of one model must have alike."""
    out = {}
    with h5py.File(path, "r") as f:
        for name, (kind, cols, attrs) in layer_columns(f).items():
            attrs = {k: v for k, v in attrs.items() if k in ("kind", "d_in", "d_out", "param_count", "param_count_unique", "layout")}
            out[name] = (attrs, sorted(k for k in cols if k not in drop))
        out["/scalars"] = sorted(f["scalars"].keys())
    return out
