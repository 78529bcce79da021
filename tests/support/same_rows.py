"""same_rows.py — for tests/programs/llmc_recipe.sh and entry_points.sh: one model's layers as an
entry point reports them (a trace read back with stabmeter.read_trace, or a stabmeter-probe --json
report) as {name: (kind, {metric: value})}, two such compared name by name and value by value
within the errors both report, and numpy's float64 SVD and row norms as the reference of each
linear layer, embedding and LM head."""
import json
import math

import numpy as np

# The metrics every entry point reports for a layer (NaN in a trace, null in a report, where
# the kind has none).
METRICS = ("forward", "dependency", "update", "sigma", "sigma_update", "rel_update",
           "forward_tight", "dependency_tight", "update_tight", "spread")
ERRORS = ("sigma_rel_err", "sigma_update_rel_err")


def from_probe(path):
    rows = {}
    for l in json.load(open(path))["layers"]:
        rows[l["name"]] = (l["kind"], {m: math.nan if l.get(m) is None else float(l[m]) for m in METRICS + ERRORS})
    return rows


def from_trace(path, step):
    import stabmeter
    t = stabmeter.read_trace(path)
    i = list(t.steps).index(step)
    return {l.name: (l.kind, {m: float(l.metrics[m][i]) for m in METRICS + ERRORS if m in l.metrics})
            for l in t.layers}


def tolerance(*metric_dicts):
    """Relative: float rounding (1e-6) plus every error the two report for the layer."""
    err = 1e-6
    for d in metric_dicts:
        err += sum(d[e] for e in ERRORS if e in d and math.isfinite(d[e]))
    return err


def compare(a, b, what_a, what_b):
    """The disagreements of a and b, as lines (none: the same names, kinds and values)."""
    bad = []
    for name in sorted(set(a) - set(b)):
        bad.append("%s: %s has it, %s does not" % (name, what_a, what_b))
    for name in sorted(set(b) - set(a)):
        bad.append("%s: %s has it, %s does not" % (name, what_b, what_a))
    for name in sorted(set(a) & set(b)):
        (ka, ma), (kb, mb) = a[name], b[name]
        if ka != kb:
            bad.append("%s: kind %s in %s, %s in %s" % (name, ka, what_a, kb, what_b))
            continue
        tol = tolerance(ma, mb)
        for m in METRICS:
            x, y = ma.get(m, math.nan), mb.get(m, math.nan)
            if math.isnan(x) and math.isnan(y):
                continue
            if math.isnan(x) != math.isnan(y) or abs(x - y) > tol * max(abs(x), abs(y)) + 1e-12:
                bad.append("%s.%s: %r in %s, %r in %s (tolerance %.2g)" % (name, m, x, what_a, y, what_b, tol))
    return bad


def sigma(w):
    return float(np.linalg.svd(np.asarray(w, dtype=np.float64), compute_uv=False)[0])


def rms(v):
    v = np.asarray(v, dtype=np.float64)
    return float(np.sqrt(np.mean(v * v))) if v.size else 0.0


def check_linear(rows, name, w, b, w0, b0, d_in, d_out):
    """w, b after and w0, b0 before the step, as numpy arrays (b None: no bias); the layer's sigma,
    forward, dependency and update against numpy. Returns the disagreements."""
    bad = []
    kind, m = rows[name]
    s, ds = sigma(w), sigma(w - w0)
    c = math.sqrt(d_in / d_out)
    want = {"sigma": s, "sigma_update": ds, "dependency": c * s,
            "forward": c * s + (rms(b) if b is not None else 0.0),
            "update": c * ds + (rms(b - b0) if b is not None else 0.0)}
    tol = tolerance(m)
    if kind != "linear":
        return ["%s: kind %s, not linear" % (name, kind)]
    for k, v in want.items():
        if abs(m[k] - v) > tol * v + 1e-12:
            bad.append("%s.%s = %r, numpy %r (tolerance %.2g)" % (name, k, m[k], v, tol))
    return bad


def check_table(rows, name, e, e0, kind):
    """An embedding or LM head of table e ([V][d], V the real vocabulary), e0 before the step."""
    k, m = rows[name]
    if k != kind:
        return ["%s: kind %s, not %s" % (name, k, kind)]
    V, d = e.shape
    r = max(rms(row) for row in e)
    dr = max(rms(row) for row in e - e0)
    want = ({"forward": r, "update": dr} if kind == "embedding" else
            {"forward": math.log(V) + 2 * d * r, "dependency": 2 * d * r, "update": 2 * d * dr})
    return ["%s.%s = %r, numpy %r" % (name, key, m[key], v) for key, v in want.items()
            if abs(m[key] - v) > 1e-5 * v + 1e-12]
