#!/bin/sh
# export_wide.sh — stabmeter-export --wide as the tools people plot with read it: a trace
# written by harness/train, exported wide, read by pandas.read_csv (every column against the
# same dataset read from the trace by h5py: exactly with float_precision='round_trip', to 1e-12
# relative with pandas' default parser; NaN where the trace has NaN) and by
# pandas.read_json(lines=True, precise_float=True) (the same frame), and one column plotted by name with gnuplot.
# Exit 77 (skipped) with the Debian package to install when pandas or h5py is missing.
set -u
build=${builddir:-.}
dir=$(mktemp -d "${TMPDIR:-/tmp}/stab-wide.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }

# The first python3 that has both (Debian's, when another comes first on PATH).
py=
for c in "${PYTHON:-python3}" /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import pandas, h5py' 2>/dev/null; then py=$c; break; fi
done
[ -n "$py" ] || { echo "SKIP: pandas and h5py are not importable (Debian: apt-get install python3-pandas python3-h5py)"; exit 77; }

"$build/harness/train" --steps 6 --width 16 --depth 2 --heads 2 --context 16 --batch 2 --corpus-bytes 20000 \
  --out "$dir/run" >"$dir/train.out" 2>"$dir/train.err" || { cat "$dir/train.err"; echo "FAIL: train"; exit 1; }
tr=$dir/run/trace.h5
"$build/harness/export" --wide -o "$dir/wide.csv" "$tr" || fail "export --wide"
"$build/harness/export" --wide --format jsonl -o "$dir/wide.jsonl" "$tr" || fail "export --wide --format jsonl"
"$build/harness/export" --wide --steps 3:4 --layers 'transformer.h.1.*' --metrics forward,loss "$tr" \
  >"$dir/some.csv" || fail "export --wide with filters"

"$py" - "$tr" "$dir/wide.csv" "$dir/wide.jsonl" "$dir/some.csv" <<'PY' || status=1
import sys
import h5py
import numpy as np
import pandas as pd

trace, wide, jsonl, some = sys.argv[1:]
d = pd.read_csv(wide, float_precision="round_trip")
fast = pd.read_csv(wide)  # pandas' default parser: not always the nearest double
with h5py.File(trace, "r") as f:
    steps = f["step"][:]
    assert list(d.columns[:2]) == ["step", "wall_time"], list(d.columns[:4])
    assert (d["step"].to_numpy() == steps).all(), "step column"
    want = {"wall_time": f["wall_time"][:]}
    for name in f["scalars"]:
        if name != "step":  # each group's copy of /step (format_version 2), not a column
            want[name] = f["scalars"][name][:]
    L = f["layers"]  # format 4: a (step, layer) dataset per metric, heads (step, head)
    names = list(L["layer"].asstr()[:])
    for metric, ds in L.items():
        if ds.ndim == 2 and metric != "head_bound":
            for i, layer in enumerate(names):
                want[layer + "." + metric] = ds[:, i]
    for c, (layer, h) in enumerate(zip(L["head_layer"].asstr()[:], L["head"][:])):
        want["%s.head%d_bound" % (layer, h)] = L["head_bound"][:, c]
assert set(d.columns) == set(want) | {"step"}, set(d.columns) ^ (set(want) | {"step"})
assert len(d) == len(steps) == 6, len(d)
nans = 0
for name, values in want.items():
    got = d[name].to_numpy(dtype=float)
    assert np.array_equal(np.isnan(got), np.isnan(values)), name
    nans += int(np.isnan(values).sum())
    assert np.array_equal(got[~np.isnan(got)], values[~np.isnan(values)]), name  # exact: shortest round trip
    near = fast[name].to_numpy(dtype=float)
    assert np.allclose(near, values, rtol=1e-12, atol=0, equal_nan=True), name
assert nans > 0, "the trace has no NaN to read back"
j = pd.read_json(jsonl, lines=True, precise_float=True)  # exact, as round_trip for CSV
assert list(j.columns) == list(d.columns), "JSON lines keys differ from the CSV header"
assert np.array_equal(j.to_numpy(dtype=float), d.to_numpy(dtype=float), equal_nan=True), "JSON lines values"
s = pd.read_csv(some, float_precision="round_trip")
cols = ["step", "loss"] + ["transformer.h.1.%s.forward" % l for l in
                           ("attn.c_attn.k", "attn.c_attn.q", "attn.c_attn.v", "attn.c_proj", "attn.logits", "ln_1", "ln_2",
                            "mlp.c_fc", "mlp.c_proj")]
assert list(s.columns) == cols, list(s.columns)
assert list(s["step"]) == [3, 4] and np.array_equal(s[cols[1:]].to_numpy(), d[d["step"].isin([3, 4])][cols[1:]].to_numpy())
print("pandas: %d columns x %d rows match h5py (%d NaN); JSON lines the same frame" % (d.shape[1], len(d), nans))
PY

# gnuplot: a column by its name; NaN ('nan') is skipped as missing data.
if command -v gnuplot >/dev/null 2>&1; then
  col=transformer.h.0.mlp.c_fc.forward
  got=$(gnuplot -e "set datafile separator comma; set print '-'; stats '$dir/wide.csv' using 'step':'$col' nooutput; print STATS_records, STATS_max_y" 2>&1)
  want=$("$py" -c "import pandas as pd; d = pd.read_csv('$dir/wide.csv'); print(len(d), repr(d['$col'].max()))")
  # gnuplot prints with %g: compare the count and the maximum to 6 digits
  echo "$got" | awk -v w="$want" '{ split(w, a, " "); exit !($1 == a[1] && ($2 - a[2]) ^ 2 <= (1e-6 * a[2]) ^ 2) }' ||
    fail "gnuplot read '$got', pandas '$want'"
else
  echo "gnuplot not found (Debian: apt-get install gnuplot-nox): its check skipped"
fi
[ $status -eq 0 ] && echo "export_wide: pass"
exit $status
