#!/bin/sh
# trace_h5py.sh — the trace as other people's tools read it: h5py follows a trace in SWMR mode
# while tests/support/trace_writer writes it, then checks shapes, attributes and values against the
# writer's own record of its last row. Skipped (exit 77) when no python3 has h5py.
set -u
py=
for c in "${PYTHON:-python3}" /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import h5py' 2>/dev/null; then py=$c; break; fi
done
if [ -z "$py" ]; then
  echo "SKIP: h5py is not importable (Debian: apt-get install python3-h5py)"
  exit 77
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/trace_h5py.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
steps=60
./tests/support/trace_writer --steps $steps --delay-ms 20 --expect "$dir/expect.txt" "$dir/trace.h5" &
writer=$!
# Rows must appear while the writer runs: the reader polls with refresh() until the writer ends.
"$py" - "$dir/trace.h5" "$writer" <<'PY'
import os, sys, time
import h5py
path, writer = sys.argv[1], int(sys.argv[2])
deadline = time.time() + 600  # a hang guard, never a speed expectation
while not os.path.exists(path) and time.time() < deadline:
    time.sleep(0.01)
f = None
while f is None and time.time() < deadline:
    try:
        f = h5py.File(path, "r", swmr=True)
    except OSError:
        time.sleep(0.02)  # the writer is still creating the file
seen = []
while time.time() < deadline:
    f["step"].refresh()
    seen.append(f["step"].shape[0])
    try:
        os.kill(writer, 0)
    except OSError:
        break
    time.sleep(0.03)
growing = sorted(set(n for n in seen if n > 0))
print("rows seen while writing:", growing[:5], "...", growing[-3:] if growing else [])
if len(growing) < 2:
    sys.exit("FAIL: a SWMR reader did not see the trace grow")
PY
live=$?
wait $writer || { echo "FAIL: trace_writer failed"; exit 1; }
[ $live -eq 0 ] || exit 1
"$py" - "$dir/trace.h5" "$dir/expect.txt" $steps <<'PY'
import math, sys
import h5py, numpy as np
path, expect, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
f = h5py.File(path, "r", swmr=True)
bad = []
def check(cond, what):
    if not cond:
        bad.append(what)
check(f.attrs["format"] == "stabmeter-trace", "format attr")
check(f.attrs["format_version"] == 4, "format_version attr")
check(f["step"].dtype == np.int64 and f["step"].shape == (steps,), "step dtype/shape")
check(list(f["step"][:]) == list(range(steps)), "step values")
L = f["layers"]
names = [n.decode() if isinstance(n, bytes) else n for n in L["layer"][:]]
check(names == ["blocks.0.fc", "wte", "ln_f", "attn"], "layers %s (the monitor's order)" % names)
kinds = [k.decode() if isinstance(k, bytes) else k for k in L["kind"][:]]
check(kinds == ["linear", "embedding", "gain", "attention"], "kinds %s" % kinds)
heads = [h.decode() if isinstance(h, bytes) else h for h in L["head_layer"][:]]
check(heads == ["attn", "attn"] and list(L["head"][:]) == [0, 1], "heads %s" % heads)
count = [0]
def walk(name, obj):
    if not isinstance(obj, h5py.Dataset):
        return
    count[0] += 1
    if obj.maxshape[0] is not None:  # the layers' attributes along the layer dimension are fixed
        return
    check(obj.shape[0] == steps and obj.chunks is not None, "%s shape %s" % (name, obj.shape))
    if obj.ndim == 2:
        check(obj.shape[1] == (2 if name.endswith("head_bound") else 4), "%s shape %s" % (name, obj.shape))
    if not (name == "step" or name.endswith("/step")):  # /step, copied into every group
        check(obj.dtype == np.float64, "%s dtype %s" % (name, obj.dtype))
f.visititems(walk)
def value(key):
    """The last row of a key as format 3 named it: layers/<layer>/<metric>, scalars/<name>."""
    parts = key.split("/")
    if parts[0] != "layers":
        return f[key][-1]
    layer, metric = parts[1], parts[2]
    if metric.startswith("head") and metric.endswith("_bound"):
        h = int(metric[4:-6])
        col = [c for c in range(len(heads)) if heads[c] == layer and L["head"][c] == h][0]
        return L["head_bound"][-1, col]
    return L[metric][-1, names.index(layer)]
with open(expect) as e:
    for line in e:
        key, want = line.split()
        if key == "rows":
            check(int(want) == steps, "rows")
            continue
        got, want = value(key), float(want)
        check((math.isnan(got) and math.isnan(want)) or got == want, "%s[-1] = %r, expected %r" % (key, got, want))
check(math.isnan(L["update"][0, 3]) and not math.isnan(L["update"][-1, 1]), "NaN where no update")
if bad:
    sys.exit("FAIL:\n  " + "\n  ".join(bad))
print("h5py read %d rows of %d datasets: shapes, attributes and values as written" % (steps, count[0]))
PY
[ $? -eq 0 ] || exit 1

# The layout's size does not grow with the layers: a trace of 4 layers and one of 64 hold the
# same HDF5 objects (groups and datasets), one dataset per metric, the layers along a dimension.
# (Format 3 had a group of 22 datasets per layer: opening and closing it cost the square of the
# layers in HDF5's metadata cache.)
./tests/support/trace_writer --steps 3 --layers 4 "$dir/l4.h5" && ./tests/support/trace_writer --steps 3 --layers 64 "$dir/l64.h5" ||
  { echo "FAIL: trace_writer --layers failed"; exit 1; }
"$py" - "$dir/l4.h5" "$dir/l64.h5" <<'PY'
import sys
import h5py, numpy as np
objects = []
for path, n in zip(sys.argv[1:], (4, 64)):
    f = h5py.File(path, "r", swmr=True)
    names = []
    f.visit(names.append)
    objects.append(sorted(names))
    fwd = f["layers/forward"]
    if fwd.shape != (3, n) or len(f["layers/layer"]) != n:
        sys.exit("FAIL: %s: /layers/forward is %s, expected (3, %d)" % (path, fwd.shape, n))
if objects[0] != objects[1]:
    sys.exit("FAIL: the objects of a trace grow with its layers: %d for 4 layers, %d for 64"
             % (len(objects[0]), len(objects[1])))
print("4 and 64 layers: the same %d objects" % len(objects[0]))
PY
