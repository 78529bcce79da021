#!/bin/sh
# entry_points.sh — one model at one step, from three entry points: (a) the C monitor registering
# the parameters by name (tests/support/name_monitor: stab_model_describe, stab_model_entry_layer,
# a trace), (b) stabmeter-probe --json --prev, (c) stabmeter.torch.Monitor.from_state_dict with
# before_step / after_step (a trace, read back with stabmeter.read_trace). The model: st_gen's
# HF GPT-2 (fused in-major c_attn, Conv1D weights, a tied head, a mask buffer and an integer
# tensor that no rule measures) and the same model one step earlier. All three must give the
# same layer names and kinds and the same values within the errors they report, whatever the
# kind rules make of the fused c_attn (the entry points are compared with each other, not with
# a list of names kept here); and every linear layer, embedding and the LM head agree with
# numpy in float64 (sigma by SVD of the tensors read from the file here). Skipped (77) without
# numpy and torch; under the sanitizers only (a) and (b) run (the interpreter is not
# instrumented). Last, the fourth
# entry point: stabmeter-train's trace at its last step against the probe of its two last checkpoints.
set -u
src=${srcdir:-.}
build=${builddir:-.}
fail() { echo "FAIL: $*"; exit 1; }
# The sanitizer build (STAB_SANITIZED) runs the C entry points, (a) and (b), and stops there:
# the comparisons need the interpreter, which is not instrumented.
sanitized=${STAB_SANITIZED:-}
. "$src/tests/python/python_pick.sh"
py=$(pick_python numpy torch)
[ -n "$py" ] || [ -n "$sanitized" ] ||
  { echo "SKIP: numpy and torch are not importable (Debian: apt-get install python3-numpy python3-torch)"; exit 77; }
src_abs=$(cd "$src" && pwd)
build_abs=$(cd "$build" && pwd)
lib=$(built_library "$build") || fail "no library to load"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/entry_points.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
run_py() {
  STABMETER_LIBRARY=$lib PYTHONPATH="$src_abs/python:$src_abs/tests/support" PYTHONDONTWRITEBYTECODE=1 \
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$py" "$@"
}
heads=2
step=7

"$build/tests/support/st_gen" "$tmp/g" gpt2 F32 || fail "st_gen gpt2 F32"
# (a) the C monitor, by name
"$build/tests/support/name_monitor" "$tmp/g.prev.safetensors" "$tmp/g.safetensors" $heads $step "$tmp/c.h5" \
  2>"$tmp/c.err" || { cat "$tmp/c.err"; fail "name_monitor (the C monitor by name)"; }
# (b) the probe
"$build/harness/probe" --json --heads $heads --prev "$tmp/g.prev.safetensors" "$tmp/g.safetensors" \
  >"$tmp/probe.json" 2>"$tmp/probe.err" || { cat "$tmp/probe.err"; fail "stabmeter-probe --json --prev"; }
if [ -n "$sanitized" ]; then
  echo "sanitizer build: name_monitor and the probe ran clean; the comparisons run in the plain build"
  exit 0
fi

run_py - "$tmp" $heads $step <<'PY' || exit 1
import json, struct, sys, warnings
import numpy as np
import torch
import stabmeter.torch
from same_rows import from_probe, from_trace, compare, check_linear, check_table
d, heads, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def read_safetensors(path):  # read here, not through the library
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    out = {}
    for name, t in json.loads(raw[8:8 + n]).items():
        if name == "__metadata__":
            continue
        s, e = t["data_offsets"]
        dt = {"F32": "<f4", "I64": "<i8"}[t["dtype"]]
        out[name] = np.frombuffer(raw[8 + n + s:8 + n + e], dtype=dt).reshape(t["shape"]).copy()
    return out

after, before = read_safetensors(d + "/g.safetensors"), read_safetensors(d + "/g.prev.safetensors")
# (c) stabmeter.torch: the state dict's own tensors, updated in place between the two calls
sd = {k: torch.from_numpy(v.copy()) for k, v in before.items()}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # what the Monitor says it skips is not this test's concern
    mon = stabmeter.torch.Monitor.from_state_dict(sd, heads=heads, trace=d + "/py.h5")
mon.before_step(step)
with torch.no_grad():
    for k, t in sd.items():
        t.copy_(torch.from_numpy(after[k]))
mon.after_step(step)
mon.close()

c, probe, pyt = from_trace(d + "/c.h5", step), from_probe(d + "/probe.json"), from_trace(d + "/py.h5", step)
bad = compare(c, probe, "the C monitor's trace", "the probe's report")
bad += compare(c, pyt, "the C monitor's trace", "the Python trace")
bad += compare(probe, pyt, "the probe's report", "the Python trace")

# numpy: every linear layer whatever it is named after (a tensor X.weight, or the q, k or v
# block X.q/.k/.v of a fused X.weight); GPT-2's Conv1D weights are stored in-major [d_in][d_out].
def f64(x):
    return np.asarray(x, dtype=np.float64)
checked = 0
for name, (kind, m) in c.items():
    if kind != "linear":
        continue
    if name + ".weight" in after:
        w, w0 = f64(after[name + ".weight"]), f64(before[name + ".weight"])
        b, b0 = after.get(name + ".bias"), before.get(name + ".bias")
    else:
        fused, part = name.rsplit(".", 1)
        i, D = "qkv".index(part), after[fused + ".weight"].shape[1] // 3
        w, w0 = (f64(x[fused + ".weight"][:, i * D:(i + 1) * D]) for x in (after, before))
        b, b0 = (f64(x[fused + ".bias"][i * D:(i + 1) * D]) for x in (after, before))
    bad += check_linear(c, name, w.T, None if b is None else f64(b), w0.T, None if b0 is None else f64(b0),
                        w.shape[0], w.shape[1])
    checked += 1
bad += check_table(c, "wte", f64(after["wte.weight"]), f64(before["wte.weight"]), "embedding")
bad += check_table(c, "wpe", f64(after["wpe.weight"]), f64(before["wpe.weight"]), "embedding")
bad += check_table(c, "lm_head", f64(after["wte.weight"]), f64(before["wte.weight"]), "lm_head")
if checked < 4:
    bad.append("only %d linear layers in the C monitor's trace" % checked)
if bad:
    sys.exit("FAIL:\n  " + "\n  ".join(bad[:40]))
print("one GPT-2 at step %d: %d layers (%s), the same names, kinds and values from the C monitor by name, "
      "the probe and stabmeter.torch; %d linear layers, the embeddings and the LM head as numpy's"
      % (step, len(c), ", ".join(sorted(c)), checked))
PY

# The fourth entry point, stabmeter-train: its trace at its last step against the probe of the
# checkpoints it wrote at that step and the one before (the same names, kinds and values).
"$build/harness/train" --width 32 --depth 1 --heads $heads --context 8 --batch 2 --steps 2 --corpus-bytes 4096 \
  --checkpoint-every 1 --out "$tmp/run" >"$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; fail "harness/train"; }
"$build/harness/probe" --json --prev "$tmp/run/step-000001.safetensors" "$tmp/run/model.safetensors" \
  >"$tmp/train_probe.json" 2>"$tmp/probe.err" || { cat "$tmp/probe.err"; fail "stabmeter-probe on the trainer's checkpoints"; }
run_py - "$tmp" <<'PY' || exit 1
import sys
from same_rows import from_probe, from_trace, compare
d = sys.argv[1]
train, probe = from_trace(d + "/run/trace.h5", 2), from_probe(d + "/train_probe.json")
bad = compare(train, probe, "stabmeter-train's trace", "the probe's report")
if bad:
    sys.exit("FAIL:\n  " + "\n  ".join(bad[:40]))
print("stabmeter-train at step 2: %d layers, named, kinded and valued as the probe's report of its checkpoint"
      % len(train))
PY
