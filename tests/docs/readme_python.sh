#!/bin/sh
# readme_python.sh — the README's Python snippets run as written, with the package and library
# of this build: "torch" (a PyTorch loop with stabmeter.torch.Monitor) after a prelude that
# makes the model, optimizer, data and step count it names, its trace then checked as
# stabmeter-train's are (tests/python/python_trace_checks.py) and exported; "python-probe" on a
# checkpoint harness/train writes, what it prints checked against stabmeter-probe --json.
# Skipped (77) naming the Debian packages when no python3 has torch, numpy, h5py and pandas,
# and under the sanitizers (the interpreter is not instrumented; tests/python/python_api.sh says more).
set -u
src=${srcdir:-.}
build=${builddir:-.}
fail() { echo "FAIL (README's Python): $*"; exit 1; }
if [ -n "${STAB_SANITIZED:-}" ]; then
  echo "SKIP: the Python snippets run in the plain build only (STAB_SANITIZED is set)"
  exit 77
fi
. "$src/tests/python/python_pick.sh"
py=$(pick_python numpy torch h5py pandas)
if [ -z "$py" ]; then
  echo "SKIP: numpy, torch, h5py and pandas are not importable (Debian: apt-get install python3-numpy python3-torch python3-h5py python3-pandas)"
  exit 77
fi
src_abs=$(cd "$src" && pwd)
build_abs=$(cd "$build" && pwd)
lib=$(built_library "$build") || fail "no library to load"

# The snippet's lines, the code fence and the markers left out (as tests/docs/readme_snippet.sh).
snippet() {
  awk -v want="<!-- snippet: $1 -->" '
    $0 == want { on = 1; found = 1; next }
    on && $0 == "<!-- /snippet -->" { on = 0; next }
    on && !/^```/ { print }
    END { if (!found) exit 1 }' "$src_abs/README.md"
}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/readme_python.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
run_py() {
  STABMETER_LIBRARY=$lib PYTHONPATH="$src_abs/python:$src_abs/tests/python:$src_abs/tests/support" PYTHONDONTWRITEBYTECODE=1 \
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$py" "$@"
}

# ---- the PyTorch loop ------------------------------------------------------------------
{
  cat <<'PY'
import torch
from python_gpt import GPT, batches
torch.manual_seed(0)
model = GPT(vocab=256, width=32, depth=1, heads=4, context=16)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = batches(256, 16, 4)
steps = 6
PY
  snippet torch || fail "README.md has no snippet 'torch'"
} >loop.py
run_py loop.py >loop.out 2>loop.err || { cat loop.err; fail "the torch snippet failed"; }
run_py - runs/torch/trace.h5 <<'PY' || exit 1
import sys, h5py
from python_trace_checks import check_trace, layer_columns
path = sys.argv[1]
check_trace(path)
with h5py.File(path, "r") as f:
    steps = list(f["step"][:])
    if steps != [1, 2, 3, 4, 5, 6]:
        sys.exit("FAIL (README's Python): the torch snippet's trace has steps %s, not 1..6" % steps)
    # before_step's snapshot gives every step its update metrics
    upd = layer_columns(f)["transformer.h.0.mlp.c_fc"][1]["update"]
    if not all(u == u and u > 0 for u in upd):
        sys.exit("FAIL (README's Python): mlp.c_fc's update in the torch snippet's trace: %s" % list(upd))
PY
"$build_abs/harness/export" runs/torch/trace.h5 -o torch.csv 2>export.err || { cat export.err; fail "export of the torch snippet's trace"; }
[ "$(grep -c ',loss,' torch.csv)" -eq 6 ] || fail "the exported torch trace has $(grep -c ',loss,' torch.csv) loss rows, not 6"

# ---- the probe -------------------------------------------------------------------------
"$build_abs/harness/train" --steps 5 --width 32 --depth 1 --heads 2 --context 16 --batch 4 --corpus-bytes 20000 \
  --out runs/demo >train.log 2>&1 || { cat train.log; fail "harness/train failed"; }
snippet python-probe >probe.py || fail "README.md has no snippet 'python-probe'"
run_py probe.py >probe.out 2>probe.err || { cat probe.err; fail "the python-probe snippet failed"; }
"$build_abs/harness/probe" runs/demo/model.safetensors --json >probe.json 2>/dev/null || fail "stabmeter-probe --json"
"$py" - probe.out probe.json <<'PY' || exit 1
import json, sys
printed = {}
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) == 2 and parts[0] in ("forward", "dependency", "sigma"):
        printed[parts[0]] = float(parts[1])
row = [l for l in json.load(open(sys.argv[2]))["layers"] if l["name"] == "transformer.h.0.mlp.c_fc"][0]
for k in ("forward", "dependency", "sigma"):
    # pandas prints six significant digits
    if k not in printed or abs(printed[k] - row[k]) > 1e-5 * abs(row[k]):
        sys.exit("FAIL (README's Python): the probe snippet printed %s, stabmeter-probe --json says %s=%r"
                 % (printed, k, row[k]))
PY
echo "README's Python snippets run; the trace checks pass; the probe prints stabmeter-probe's values"
