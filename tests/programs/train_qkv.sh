#!/bin/sh
# The trainer's fused attn.c_attn (one (3D, D) tensor on disk) measured as three linear layers,
# attn.c_attn.q, .k and .v (the probe's names of the same checkpoint, docs/manual/metrics.md's
# fused q/k/v policy): each layer's sigma in the trace against numpy's float64 SVD of its D rows
# of the checkpoint written at that step, within the reported error; forward with its third of
# the bias; the update's sigma against the SVD of the difference of two steps' rows; and no
# layer left reading the fused matrix whole.
set -u
train=./harness/train
py=/usr/bin/python3
if ! $py -c "import h5py, numpy" 2>/dev/null; then
  echo "SKIP: $py has no h5py or numpy"
  exit 77
fi
tmp=$(mktemp -d /tmp/check_train_qkv.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
$train --width 32 --depth 2 --heads 4 --context 16 --batch 4 --corpus-bytes 65536 --steps 4 --biases \
  --checkpoint-every 1 --out "$tmp/run" >"$tmp/out" 2>"$tmp/err" || {
  echo "FAIL: train: exit $?"
  cat "$tmp/err"
  exit 1
}
$py - "$tmp/run" <<'PY'
import json, struct, sys
import h5py
import numpy as np

root = sys.argv[1]
D, depth = 32, 2


def tensors(path):
    """{name: float64 array} of a safetensors file of F32 tensors."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for name, t in h.items():
        a, b = t["data_offsets"]
        assert t["dtype"] == "F32", name
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").astype(np.float64).reshape(t["shape"])
    return out


f = h5py.File("%s/trace.h5" % root, "r")
names = list(f["layers/layer"].asstr()[:])
steps = list(f["step"][:])
bad = 0
for l in range(depth):
    fused = "transformer.h.%d.attn.c_attn" % l
    if fused in names:
        print(fused, "is still a layer of its own"); bad += 1
    for step in (2, 3):
        row = steps.index(step)
        now = tensors("%s/step-%06d.safetensors" % (root, step))
        was = tensors("%s/step-%06d.safetensors" % (root, step - 1))
        w, b = now[fused + ".weight"], now[fused + ".bias"]
        assert w.shape == (3 * D, D) and b.shape == (3 * D,), (w.shape, b.shape)
        dw = w - was[fused + ".weight"]
        db = b - was[fused + ".bias"]
        for j, part in enumerate("qkv"):
            name = "%s.%s" % (fused, part)
            if name not in names:
                print(name, "is not in the trace:", names); bad += 1
                continue
            i = names.index(name)
            got = {m: float(f["layers/" + m][row, i]) for m in
                   ("sigma", "sigma_rel_err", "forward", "sigma_update", "sigma_update_rel_err", "update")}
            rows = slice(j * D, (j + 1) * D)
            s = np.linalg.svd(w[rows], compute_uv=False)[0]
            su = np.linalg.svd(dw[rows], compute_uv=False)[0]
            brms, dbrms = np.sqrt(np.mean(b[rows] ** 2)), np.sqrt(np.mean(db[rows] ** 2))
            # the passes' rounding besides the reported error: 1e-6
            checks = [("sigma", got["sigma"], s, got["sigma_rel_err"] + 1e-6),
                      ("forward", got["forward"], s + brms, got["sigma_rel_err"] + 1e-6),
                      ("sigma_update", got["sigma_update"], su, got["sigma_update_rel_err"] + 1e-6),
                      ("update", got["update"], su + dbrms, got["sigma_update_rel_err"] + 1e-6)]
            for what, g, want, tol in checks:
                if not (abs(g - want) <= tol * want):
                    print("step %d %s %s: %.9g, numpy %.9g (rel %.3g > %.3g)" % (step, name, what, g, want,
                                                                              abs(g - want) / want, tol)); bad += 1
print("train_qkv: %d blocks x q, k, v at steps 2 and 3 against numpy's SVD: %s" % (depth, "FAIL" if bad else "ok"))
sys.exit(1 if bad else 0)
PY
