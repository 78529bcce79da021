#!/bin/sh
# trace_h5py.sh — the trace as other people's tools read it: h5py follows a trace in SWMR mode
# while tests/trace_writer writes it, then checks shapes, attributes and values against the
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
./tests/trace_writer --steps $steps --delay-ms 20 --expect "$dir/expect.txt" "$dir/trace.h5" &
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
check(f.attrs["format_version"] == 3, "format_version attr")
check(f["step"].dtype == np.int64 and f["step"].shape == (steps,), "step dtype/shape")
check(list(f["step"][:]) == list(range(steps)), "step values")
check(sorted(f["layers"].keys()) == ["attn", "blocks.0.fc", "ln_f", "wte"], "layer groups %s" % list(f["layers"].keys()))
check(f["layers/attn"].attrs["kind"] == "attention", "attn kind")
check(f["layers/blocks.0.fc"].attrs["name"] == "blocks/0/fc", "original name attr")
count = [0]
def walk(name, obj):
    if isinstance(obj, h5py.Dataset):
        count[0] += 1
        check(obj.ndim == 1 and obj.shape[0] == steps, "%s shape %s" % (name, obj.shape))
        check(obj.maxshape == (None,) and obj.chunks is not None, "%s not chunked/unlimited" % name)
        if not (name == "step" or name.endswith("/step")):  # /step, linked into every group
            check(obj.dtype == np.float64, "%s dtype %s" % (name, obj.dtype))
f.visititems(walk)
with open(expect) as e:
    for line in e:
        key, value = line.split()
        if key == "rows":
            check(int(value) == steps, "rows")
            continue
        got, want = f[key][-1], float(value)
        check((math.isnan(got) and math.isnan(want)) or got == want, "%s[-1] = %r, expected %r" % (key, got, want))
check(math.isnan(f["layers/attn/update"][0]) and not math.isnan(f["layers/wte/update"][-1]), "NaN where no update")
if bad:
    sys.exit("FAIL:\n  " + "\n  ".join(bad))
print("h5py read %d rows of %d datasets: shapes, attributes and values as written" % (steps, count[0]))
PY
