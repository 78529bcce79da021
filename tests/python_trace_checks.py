"""The checks a stabmeter trace must pass, applied alike to stabmeter-train's trace and to the
Monitor's: the ones tests/trace_h5py.sh makes of tests/trace_writer's (root attributes, every
dataset one-dimensional, chunked, unlimited, float64 but the step copies, as many rows as /step),
and the schema of each layer group (attributes, datasets) for comparing two traces."""

import json

import h5py
import numpy as np

ROOT_ATTRS = {"format", "format_version", "library_version", "created_utc", "run_config"}


def check_trace(path):
    """The list of what is wrong with the trace at path (empty when it passes); its rows."""
    bad = []
    with h5py.File(path, "r") as f:
        def check(cond, what):
            if not cond:
                bad.append(what)
        check(set(f.attrs.keys()) == ROOT_ATTRS, "root attributes %s" % sorted(f.attrs.keys()))
        check(f.attrs["format"] == "stabmeter-trace", "format attr")
        check(f.attrs["format_version"] == 3, "format_version attr")
        json.loads(f.attrs["run_config"])  # JSON text
        steps = f["step"]
        check(steps.dtype == np.int64 and steps.ndim == 1, "step dtype/shape")
        n = steps.shape[0]
        check(bool(np.all(np.diff(steps[:]) > 0)), "steps increase")

        def walk(name, obj):
            if isinstance(obj, h5py.Dataset):
                check(obj.ndim == 1 and obj.shape[0] == n, "%s shape %s, %d steps" % (name, obj.shape, n))
                check(obj.maxshape == (None,) and obj.chunks is not None, "%s not chunked/unlimited" % name)
                if name == "step" or name.endswith("/step"):
                    check(obj.dtype == np.int64 and list(obj[:]) == list(steps[:]), "%s: not /step" % name)
                else:
                    check(obj.dtype == np.float64, "%s dtype %s" % (name, obj.dtype))
                    check("units" in obj.attrs or name.startswith("scalars/") and "long_name" in obj.attrs,
                          "%s has no units" % name)
        f.visititems(walk)
        for g in f["layers"].values():
            check(g.attrs["kind"] in ("linear", "embedding", "lm_head", "gain", "bias", "attention"),
                  "%s kind" % g.name)
            # format 3: each metric over its first finite value > 0
            for m in ("forward", "dependency", "update"):
                v, r = g[m][:], g[m + "_ratio"][:]
                first = v[np.isfinite(v) & (v > 0)]
                want = v / first[0] if len(first) else np.full(n, np.nan)
                check(np.array_equal(np.isnan(want), np.isnan(r)) and np.allclose(r[~np.isnan(r)], want[~np.isnan(want)],
                                                                                 rtol=1e-15, atol=0),
                      "%s/%s_ratio is not %s over its first finite value > 0" % (g.name, m, m))
    return bad, n


def schema(path, drop=()):
    """{group: (its attributes but description, created values and sharing; its datasets)} of
    every layer group, and the scalars: what two traces of one model must have alike."""
    out = {}
    with h5py.File(path, "r") as f:
        for name, g in f["layers"].items():
            attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in g.attrs.items()
                     if k in ("name", "kind", "d_in", "d_out", "param_count", "param_count_unique", "layout")}
            out[name] = (attrs, sorted(k for k in g.keys() if k not in drop))
        out["/scalars"] = sorted(f["scalars"].keys())
    return out
