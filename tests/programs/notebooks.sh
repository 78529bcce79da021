#!/bin/sh
# notebooks.sh — the notebooks of notebooks-export/ executed headless the way `make notebooks`
# runs them (notebooks-export/run.sh) on a short training run with two checkpoints, a
# two-optimizer width sweep, a learning-rate x width sweep with one diverged run and a trace
# still being written; their .ipynb, HTML and PNG outputs checked, and their printed values
# against the files (worst layers per kind, coordinate-check slopes, best rates, early
# metrics); then, as plain scripts, on traces made here whose answers are known: a sweep whose
# metrics are c * width^p (every printed slope must be p), a sweep with steps missing at one
# width, a trace with NaN steps, flags and alarm crossings put in at known steps, and one with
# its own ratio datasets. Skipped (exit 77) when no python3 has the packages.
set -u
src=${srcdir:-.}
# the Python checks below read traces of every format through tests/support/trace_layers.py
STAB_TESTS_DIR=$(cd "$src/tests/support" && pwd); export STAB_TESTS_DIR
run="$src/notebooks-export/run.sh"
# The notebooks are Python; the C they read (the trainer, the trace writer) is the plain build's,
# and its sanitized run is tests/programs/train.sh's and check_trace's. The sanitizer build and the
# tarball's distcheck run (quickstart.sh test) leave this minute out.
if [ -n "${STAB_SANITIZED:-}${STAB_DISTCHECK:-}" ]; then
  echo "SKIP: the notebooks run in the plain build only (STAB_SANITIZED or STAB_DISTCHECK is set)"
  exit 77
fi
# The notebooks read traces through the stabmeter package over the library built here (run.sh
# sets this up for the notebooks it runs; the plain-script runs below need it too).
soname=$(sed -n "s/^dlname='\(.*\)'$/\1/p" lib/libstabmeter.la)
STABMETER_LIBRARY=$(cd lib/.libs && pwd)/$soname; export STABMETER_LIBRARY
PYTHONPATH=$(cd "$src/python" && pwd)${PYTHONPATH:+:$PYTHONPATH}; export PYTHONPATH
if ! py=$(sh "$run" --which-python) || ! "$py" -c 'import h5py' 2>/dev/null; then
  echo "SKIP: the notebooks need python3-numpy, -matplotlib, -nbformat, -nbconvert, -ipykernel (and these checks python3-h5py)"
  exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/check_notebooks.XXXXXX") || exit 1
writer=
trap '[ -n "$writer" ] && kill $writer 2>/dev/null; rm -rf "$tmp"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }
t0=$(date +%s)

# ---- inputs: a short run with a checkpoint half-way, and a sweep per optimizer -------------
small="--depth 1 --heads 2 --context 16 --batch 8 --corpus-bytes 32768"
./harness/train $small --width 32 --steps 24 --checkpoint-every 12 --out "$tmp/run" >"$tmp/train.log" 2>&1 ||
  fail "training the short run: $(tail -n 3 "$tmp/train.log")"
for opt in steepest adamw; do
  for w in 16 32 64; do
    ./harness/train $small --width $w --steps 12 --optimizer $opt --out "$tmp/sweep-$opt/width-$w" \
      >"$tmp/train.log" 2>&1 || fail "training $opt at width $w: $(tail -n 3 "$tmp/train.log")"
  done
done

# A learning-rate x width sweep (train --sweep-lrs: DIR/lr-X/width-W/ and DIR/lr-sweep.csv).
# Rate 9.9 on this deep, narrow model diverges at width 32 (measured: the loss is NaN at step
# 18) and ends at a held-out loss near 100 at width 16; 0.3 is the best rate at both widths.
lrsmall="--optimizer steepest --depth 6 --heads 2 --warmup 0 --steps 20 --context 8 --batch 2 --corpus-bytes 20000"
./harness/train $lrsmall --sweep-lrs 0.03,0.3,9.9 --sweep-widths 16,32 --out "$tmp/lrs" >"$tmp/train.log" 2>&1 ||
  fail "the learning-rate sweep: $(tail -n 3 "$tmp/train.log")"
grep -q "^steepest,32,9.9,diverged," "$tmp/lrs/lr-sweep.csv" ||
  fail "the lr sweep fixture: lr 9.9 at width 32 did not diverge: $(cat "$tmp/lrs/lr-sweep.csv")"

# ---- headless, as make notebooks runs them -------------------------------------------------
STAB_TRACE="$tmp/run/trace.h5" STAB_SWEEP="$tmp/sweep-steepest $tmp/sweep-adamw" STAB_LR_SWEEP="$tmp/lrs" \
STAB_CHECKPOINTS="$tmp/run" STAB_PROBE="$PWD/harness/probe" \
  sh "$run" --out "$tmp/out" trace width_sweep coord_check lr_transfer checkpoints ||
  fail "run.sh trace width_sweep coord_check lr_transfer checkpoints"
# live: a writer appends a step every 50 ms for as long as the notebook follows the file, which
# it does for STAB_LIVE_LIMIT seconds from when its kernel is up: it must see the trace grow.
./tests/support/trace_writer --steps 100000 --delay-ms 50 "$tmp/live.h5" &
writer=$!
STAB_TRACE="$tmp/live.h5" STAB_LIVE_IDLE=5 STAB_LIVE_EVERY=1 STAB_LIVE_LIMIT=5 \
  sh "$run" --out "$tmp/out" live || fail "run.sh live"
kill $writer 2>/dev/null
wait $writer 2>/dev/null
writer=

"$py" - "$tmp" <<'PY' || status=1
import json, re, subprocess, sys
import h5py, nbformat, numpy as np
import os as _os, sys as _sys
_sys.path.insert(0, _os.environ["STAB_TESTS_DIR"])
from trace_layers import layer_groups
from matplotlib import image

tmp = sys.argv[1]
out = tmp + "/out"
bad = []
def check(cond, what):
    if not cond:
        bad.append(what)

def stdout_of(name):
    nb = nbformat.read("%s/%s.ipynb" % (out, name), 4)
    text = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            check(o.output_type != "error", "%s: an error output: %s" % (name, o.get("ename")))
            if o.output_type == "stream":
                check(o.name == "stdout", "%s: stderr output: %r" % (name, o.text[:300]))
                text.append(o.text)
    return "".join(text)

figures = {"trace": ["trace"], "width_sweep": ["width_sweep"],
           "coord_check": ["coord_check_steepest", "coord_check_adamw"],
           "lr_transfer": ["lr_transfer", "lr_transfer_metrics"],
           "checkpoints": ["checkpoints", "checkpoints_layers"], "live": ["live"]}
printed = {}
for name, pngs in figures.items():
    text = printed[name] = stdout_of(name)
    html = open("%s/%s.html" % (out, name), encoding="utf-8").read()
    check('data-mime-type="application/vnd.jupyter.stderr"' not in html,
          "%s.html shows an error or stderr output" % name)
    check(html.count("data:image/png;base64") >= len(pngs), "%s.html: fewer images than figures" % name)
    for png in pngs:
        m = re.search(r"figure: \S*/%s\.png \((\d+) x (\d+) px\)" % png, text)
        check(m is not None, "%s: no 'figure: .../%s.png' line" % (name, png))
        if not m:
            continue
        img = image.imread("%s/%s.png" % (out, png))
        w, h = int(m.group(1)), int(m.group(2))
        check(img.shape[1] == w == 1400 and img.shape[0] == h and h >= 400,
              "%s.png is %dx%d, printed %dx%d, expected 1400 wide" % (png, img.shape[1], img.shape[0], w, h))
        rgb = img[..., :3]
        inked = (rgb.min(axis=2) < 0.9).mean()
        colours = len(np.unique((rgb * 255).astype(np.uint8).reshape(-1, 3), axis=0))
        check(0.02 < inked < 0.6 and colours > 50, "%s.png looks empty or flat: %.3f inked, %d colours"
              % (png, inked, colours))

# trace: the rows and the worst layers, against the file read here.
f = h5py.File(tmp + "/run/trace.h5", "r", swmr=True)
n = f["step"].shape[0]
check("%d measured steps" % n in printed["trace"], "trace: row count %d not printed" % n)
# The worst layer of each kind, by value and by ratio to init (over the first finite positive row).
by_value, by_ratio = printed["trace"].split("by ratio to init")
def first_ratio(v):
    ok = np.flatnonzero(np.isfinite(v) & (v > 0))
    return v[ok[0]:] / v[ok[0]]
ranked = 0
for metric in ("forward", "dependency", "update"):
    for kind in sorted({g.attrs["kind"] for g in layer_groups(f).values()}):
        groups = [(name, g[metric][:]) for name, g in layer_groups(f).items()
                  if g.attrs["kind"] == kind and np.isfinite(g[metric][:]).any()]
        if not groups:
            check(not re.search(r"^%s\s+%s\s" % (metric, kind), printed["trace"], re.M),
                  "trace: a worst %s %s layer, but none has it" % (kind, metric))
            continue
        # the update's ratio is per unit of learning rate
        per_lr = (lambda v: first_ratio(v / f["scalars/lr"][:])) if metric == "update" else first_ratio
        for text, of in ((by_value, lambda v: v), (by_ratio, per_lr)):
            best = max((np.nanmax(of(v)), name) for name, v in groups)
            tied = {name for name, v in groups if np.nanmax(of(v)) >= best[0] * (1 - 1e-12)}
            m = re.search(r"^%s\s+%s\s+1\s+(\S+)\s+(\S+)" % (metric, kind), text, re.M)
            check(m and m.group(1) in tied and abs(float(m.group(2)) - best[0]) <= 1e-3 * best[0],
                  "trace: worst %s %s layer %s, expected %s %.4g" % (kind, metric, m and m.groups(), best[1], best[0]))
            ranked += 1
check(ranked >= 20, "trace: only %d kinds and metrics ranked" % ranked)
check("NaN steps: none" in printed["trace"] and "flags: none" in printed["trace"], "trace: NaN/flags in a clean run")

# width sweep: both optimizers at the three widths, a slope for every kind and metric measured.
for opt in ("steepest", "adamw"):
    check("%s: widths 16, 32, 64" % opt in printed["width_sweep"], "width_sweep: %s widths" % opt)
    for kind, metric in (("linear", "forward"), ("linear", "update"), ("gain", "dependency"),
                         ("embedding", "forward"), ("lm_head", "update")):
        check(re.search(r"^slope %s\s+%s\s+%s\s+[+-]\d\.\d{4}" % (opt, kind, metric), printed["width_sweep"], re.M),
              "width_sweep: no %s %s %s slope" % (opt, kind, metric))

# coord_check: every kind and metric at steps 1-4 and the last, the kind's geometric mean over
# its layers and the log-log slope, computed here from the traces.
text = printed["coord_check"]
lines = 0
for opt in ("steepest", "adamw"):
    traces = {w: h5py.File("%s/sweep-%s/width-%d/trace.h5" % (tmp, opt, w), "r") for w in (16, 32, 64)}
    kinds = sorted({g.attrs["kind"] for g in layer_groups(traces[16]).values()})
    for kind in kinds:
        for metric in ("forward", "dependency", "update"):
            for label in ("1", "2", "3", "4", "last"):
                pts = {}
                for w, t in traces.items():
                    row = len(t["step"]) - 1 if label == "last" else list(t["step"][:]).index(int(label))
                    v = np.array([g[metric][row] for g in layer_groups(t).values() if g.attrs["kind"] == kind])
                    v = v[np.isfinite(v) & (v > 0)]
                    if len(v):
                        pts[w] = float(np.exp(np.log(v).mean()))
                m = re.search(r"^coord %s\s+%s\s+%s\s+%s\s+slope ([+-]\d\.\d{4})  \((.*)\)$" % (opt, kind, metric, label),
                              text, re.M)
                if not pts:
                    check(m is None, "coord_check: a %s %s line for %s, which has none" % (kind, metric, opt))
                    continue
                ws = sorted(pts)
                slope = np.polyfit(np.log(ws), np.log([pts[w] for w in ws]), 1)[0]
                got = dict((int(a), float(b)) for a, b in re.findall(r"(\d+): (\S+?)(?:,|$)", m.group(2))) if m else {}
                check(m and abs(float(m.group(1)) - slope) < 1e-4 and sorted(got) == ws and
                      all(abs(got[w] - pts[w]) <= 1e-3 * pts[w] for w in ws),
                      "coord_check: %s %s %s step %s: %s, computed slope %+.4f at %s" % (
                          opt, kind, metric, label, m and m.group(0), slope, pts))
                lines += 1
check(lines >= 2 * 4 * 5, "coord_check: only %d lines checked" % lines)

# lr_transfer: the best rate per width (lowest finite held-out loss in the CSV), the transfer
# ratio, the diverged run compared at the largest width, early metrics at step 2 (10% of 20).
import csv
text = printed["lr_transfer"]
rows = list(csv.DictReader(open(tmp + "/lrs/lr-sweep.csv")))
best = {}
for r in rows:
    if r["status"] == "ok" and (r["width"] not in best or float(r["heldout_loss"]) < float(best[r["width"]]["heldout_loss"])):
        best[r["width"]] = r
for w, r in best.items():
    check(re.search(r"^best steepest width %s lr %s held-out %.4f$" % (w, re.escape(r["lr"]), float(r["heldout_loss"])),
                    text, re.M), "lr_transfer: best at width %s not lr %s" % (w, r["lr"]))
ratio = float(best["32"]["lr"]) / float(best["16"]["lr"])
check(re.search(r"^transfer steepest: best lr at width 32 / at width 16 = %g " % ratio, text, re.M),
      "lr_transfer: transfer ratio not %g" % ratio)
check("steepest width 32: best lr %s against diverged lr 9.9" % best["32"]["lr"] in text,
      "lr_transfer: the best run not compared with the diverged one")
early = 0
for r in rows:
    t = h5py.File("%s/lrs/lr-%s/width-%s/trace.h5" % (tmp, r["lr"], r["width"]), "r")
    row = list(t["step"][:]).index(2)
    want = []
    for kind, metric in (("linear", "forward"), ("linear", "update"), ("attention", "forward"), ("lm_head", "forward")):
        want.append(max(g[metric][row] for g in layer_groups(t).values() if g.attrs["kind"] == kind))
    # the largest ratio to init there, from the trainer's own ratio datasets (the update's per
    # unit of learning rate, against the lr at its reference row: its first finite value > 0)
    lr = t["scalars/lr"][:]
    most = (-1.0, None)
    for g in layer_groups(t).values():
        for metric in ("forward", "dependency", "update"):
            if metric + "_ratio" not in g:
                continue
            v = g[metric + "_ratio"][row]
            if metric == "update":
                ref = np.flatnonzero(np.isfinite(g["update"][:]) & (g["update"][:] > 0))
                v = v * lr[ref[0]] / lr[row] if len(ref) else np.nan
            if np.isfinite(v) and v > most[0]:
                most = (float(v), g.attrs["kind"])
    want.append(most[0])
    m = re.search(r"^early steepest\s+%s\s+%s\s+%s\s+%s\s+%s\s+\S+\s+2\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\w+)$" % (
        r["width"], re.escape(r["lr"]), r["seed"], r["status"], r["steps_done"]), text, re.M)
    check(m and all(abs(float(g) - v) <= 1e-3 * v for g, v in zip(m.groups()[:5], want)) and m.group(6) == most[1],
          "lr_transfer: early metrics of lr %s width %s: %s, from the trace %s in %s" % (
              r["lr"], r["width"], m and m.groups(), want, most[1]))
    early += 1
check(early == 6, "lr_transfer: %d runs in the CSV, not 6" % early)
# the rank correlation of each early metric with the final loss (diverged: worst), by pandas
import pandas as pd
for w in ("16", "32"):
    m = re.search(r"^spearman steepest width %s \(early metric against final loss, 3 runs\): (.*)$" % w, text, re.M)
    got = dict(re.findall(r"(\w+ \w+) ([+-]\d\.\d\d)", m.group(1))) if m else {}
    table = pd.read_csv(tmp + "/lrs/lr-sweep.csv").query("width == %s" % w).sort_values("lr")
    outcome = table.heldout_loss.where(table.status == "ok", np.inf).to_numpy()
    for j, name in enumerate(("linear fwd", "linear upd", "attn bound", "lm_head fwd")):
        vals = []
        for lr in table.lr:
            t = h5py.File("%s/lrs/lr-%g/width-%s/trace.h5" % (tmp, lr, w), "r")
            row = list(t["step"][:]).index(2)
            kind, metric = (("linear", "forward"), ("linear", "update"), ("attention", "forward"), ("lm_head", "forward"))[j]
            vals.append(max(g[metric][row] for g in layer_groups(t).values() if g.attrs["kind"] == kind))
        rho = pd.Series(vals).corr(pd.Series(outcome), method="spearman")
        check(name in got and abs(float(got[name]) - rho) < 0.006,
              "lr_transfer: width %s %s rank correlation %s, pandas %+.2f" % (w, name, got.get(name), rho))

# checkpoints: two, in step order; update only at the second (probe --prev the first).
text = printed["checkpoints"]
check(re.search(r"^step 12 .*step-000012\.safetensors", text, re.M) and
      re.search(r"^step 24 .*model\.safetensors: \d+ layers \(update against .*step-000012", text, re.M),
      "checkpoints: steps 12 and 24 not listed in order:\n" + text[:400])
report = json.loads(subprocess.run(["./harness/probe", "--json", "--quiet", tmp + "/run/model.safetensors",
                                    "--prev", tmp + "/run/step-000012.safetensors"],
                                   capture_output=True, text=True, check=True).stdout)
fc = [l for l in report["layers"] if l["name"].endswith("mlp.c_fc")][0]
upd = text[text.index("update stability"):]
m = re.search(r"^%s\s+linear\s+-\s+(\S+)" % re.escape(fc["name"]), upd, re.M)
check(m and abs(float(m.group(1)) - fc["update"]) <= 1e-3 * fc["update"],
      "checkpoints: %s update %s, probe says %.4g" % (fc["name"], m and m.group(1), fc["update"]))

# live: it followed the file as it grew, and stopped at its time limit (the writer ran on).
m = re.search(r"row counts seen ([\d ]+);.*stopped: (.*)", printed["live"])
seen = [int(x) for x in m.group(1).split()] if m else []
check(len(set(seen)) >= 2 and seen == sorted(seen), "live: did not see the trace grow (row counts %s)" % seen)
check(m and m.group(2).startswith("time limit"), "live: stopped for another reason: %s" % (m and m.group(2)))
m = re.search(r"final rows: (\d+) \(steps (\d+)\.\.(\d+)\)", printed["live"])
check(m and seen and int(m.group(1)) >= seen[-1] and int(m.group(3)) - int(m.group(2)) + 1 == int(m.group(1)),
      "live: final rows inconsistent: %s" % printed["live"][-300:])

if bad:
    sys.exit("FAIL:\n  " + "\n  ".join(bad))
print("6 notebooks executed headless: outputs, figures and printed values as expected")
PY

# ---- plain scripts on traces with known answers ------------------------------------------
# A sweep with metric = c * width^p over the last 25% of steps (noise before), and a copy of
# the short run with NaN steps, flags and alarm crossings put in.
"$py" - "$tmp" <<'PY' || status=1
import json, os, shutil, sys
import h5py, numpy as np
import os as _os, sys as _sys
_sys.path.insert(0, _os.environ["STAB_TESTS_DIR"])
from trace_layers import layer_groups

tmp = sys.argv[1]
rng = np.random.default_rng(7)
N = 40  # rows; the last 10 are the 25% the notebook takes the median of
layers = {"emb": ("embedding", 0.5), "fc1": ("linear", 1.0), "fc2": ("linear", 1.7), "ln": ("gain", 1.2)}
kind_index = {"embedding": 0, "linear": 1, "gain": 2}  # the exponent depends on kind, optimizer, metric
expect = {}
for o, opt in enumerate(("steepest", "adamw")):
    for w in (16, 32, 64, 128):
        path = "%s/synth-%s/width-%d/trace.h5" % (tmp, opt, w)
        os.makedirs(os.path.dirname(path))
        with h5py.File(path, "w", libver="latest") as f:
            f.attrs["format"] = "stabmeter-trace"
            f.attrs["format_version"] = 1
            f.attrs["run_config"] = json.dumps({"optimizer": opt, "model": {"width": w, "depth": 1}, "steps": N})
            f["step"] = np.arange(1, N + 1, dtype=np.int64)
            f["wall_time"] = np.arange(N, dtype=np.float64)  # the schema's: the library's reader requires it
            f["scalars/loss"] = np.linspace(5, 1, N)
            for name, (kind, c) in sorted(layers.items()):
                k = kind_index[kind]
                g = f.create_group("layers/" + name)
                g.attrs["kind"] = kind
                for m, metric in enumerate(("forward", "dependency", "update")):
                    p = round(0.25 * (k - 1) + 0.1 * m - 0.3 * o, 2)
                    v = c * w ** p * (1 + 9 * rng.random(N))
                    v[-10:] = c * w ** p
                    if kind == "embedding" and metric == "dependency":
                        v[:] = np.nan
                    else:
                        expect[opt, kind, metric] = p
                    g[metric] = v
with open(tmp + "/synth-expect.json", "w") as f:
    json.dump([[k[0], k[1], k[2], p] for k, p in expect.items()], f)

shutil.copy(tmp + "/run/trace.h5", tmp + "/nan.h5")
with h5py.File(tmp + "/nan.h5", "r+") as f:
    f["scalars/loss"][4] = np.nan
    layers = layer_groups(f)
    names = sorted(layers)
    fc = [n for n in names if n.endswith("mlp.c_fc")][0]
    proj = [n for n in names if n.endswith("attn.c_proj")][0]
    layers[fc].set("forward", 9, np.nan)
    layers[fc].set("flags", 9, 1)
    layers[proj].set("flags", 15, 4)
PY
STAB_OUT="$tmp/plain" "$py" "$src/notebooks-export/width_sweep.py" "$tmp/synth-steepest" "$tmp/synth-adamw" \
  >"$tmp/sweep.txt" 2>&1 || { fail "width_sweep.py on the synthetic sweep"; cat "$tmp/sweep.txt"; }
"$py" - "$tmp" <<'PY' || status=1
import json, re, sys
tmp = sys.argv[1]
text = open(tmp + "/sweep.txt").read()
expect = json.load(open(tmp + "/synth-expect.json"))
bad = []
for opt, kind, metric, p in expect:
    m = re.search(r"^slope %s\s+%s\s+%s\s+([+-]\d+\.\d+)" % (opt, kind, metric), text, re.M)
    if not m or abs(float(m.group(1)) - p) > 1e-4:
        bad.append("%s %s %s: slope %s, closed form %+.4f" % (opt, kind, metric, m and m.group(1), p))
if re.search(r"^slope \S+\s+embedding\s+dependency", text, re.M):
    bad.append("a slope for the embedding's undefined dependency stability")
if bad:
    sys.exit("FAIL: width_sweep.py slopes:\n  " + "\n  ".join(bad) + "\n" + text)
print("width_sweep.py: %d fitted slopes equal the exponents the sweep was made with" % len(expect))
PY

# coord_check on a sweep one of whose widths was measured every other step: steps 1 and 3 are
# left out (and said to be), 2 and 4 and the last drawn. STAB_COORD_STAT=max: the worst layer.
mkdir -p "$tmp/gap"
ln -s "$tmp/sweep-steepest/width-32" "$tmp/sweep-steepest/width-64" "$tmp/gap/"
./harness/train $small --width 16 --steps 12 --optimizer steepest --metrics-every 2 --out "$tmp/gap/width-16" \
  >"$tmp/train.log" 2>&1 || fail "training the every-other-step run: $(tail -n 3 "$tmp/train.log")"
STAB_OUT="$tmp/plain" STAB_COORD_STAT=max "$py" "$src/notebooks-export/coord_check.py" "$tmp/gap" >"$tmp/gap.txt" 2>&1 ||
  { fail "coord_check.py on the sweep with a gap"; cat "$tmp/gap.txt"; }
"$py" - "$tmp" <<'PY' || status=1
import re, sys
import h5py, numpy as np
import os as _os, sys as _sys
_sys.path.insert(0, _os.environ["STAB_TESTS_DIR"])
from trace_layers import layer_groups
tmp = sys.argv[1]
text = open(tmp + "/gap.txt").read()
bad = []
for s in (1, 3):
    if "steepest: step %d left out: not measured in %s/gap/width-16/trace.h5\n" % (s, tmp) not in text:
        bad.append("step %d not said to be left out" % s)
    if re.search(r"^coord steepest\s+\S+\s+\S+\s+%d\s" % s, text, re.M):
        bad.append("a step %d line, which width 16 lacks" % s)
# the worst linear layer's forward at step 4, against the traces
pts = {}
for w in (16, 32, 64):
    t = h5py.File("%s/gap/width-%d/trace.h5" % (tmp, w), "r")
    row = list(t["step"][:]).index(4)
    pts[w] = max(g["forward"][row] for g in layer_groups(t).values() if g.attrs["kind"] == "linear")
slope = np.polyfit(np.log(list(pts)), np.log(list(pts.values())), 1)[0]
m = re.search(r"^coord steepest\s+linear\s+forward\s+4\s+slope ([+-]\d\.\d{4})", text, re.M)
if not m or abs(float(m.group(1)) - slope) > 1e-4:
    bad.append("linear forward step 4 worst-layer slope %s, computed %+.4f" % (m and m.group(1), slope))
if not re.search(r"^coord steepest\s+linear\s+forward\s+last\s", text, re.M):
    bad.append("no last-step line")
if bad:
    sys.exit("FAIL: coord_check.py with a gap:\n  " + "\n  ".join(bad) + "\n" + text)
print("coord_check.py: steps a width lacks left out and named; the worst layer's slope as computed")
PY

# lr_transfer on a directory without lr-sweep.csv: one line naming it, exit 2.
"$py" "$src/notebooks-export/lr_transfer.py" "$tmp/gap" >"$tmp/bad.txt" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "^lr_transfer.py: lr sweep $tmp/gap: no lr-sweep.csv in it" "$tmp/bad.txt" ||
  fail "lr_transfer.py on a directory without a CSV: exit $rc, $(cat "$tmp/bad.txt")"

# lr_transfer over two seeds: the same sweep again with --seed 2, into another directory. Each
# rate's loss is the mean over the seeds, a rate at which either seed diverged counts as
# diverged, and each seed's own best is printed: checked against the two CSVs. The second CSV
# without its seed column (stabmeter 0.8.0's) gives the same answer, the seed read from the
# traces; the same directory twice is two runs of one seed, refused.
./harness/train $lrsmall --seed 2 --sweep-lrs 0.03,0.3,9.9 --sweep-widths 16,32 --out "$tmp/lrs2" >"$tmp/train.log" 2>&1 ||
  fail "the learning-rate sweep, seed 2: $(tail -n 3 "$tmp/train.log")"
STAB_OUT="$tmp/plain" "$py" "$src/notebooks-export/lr_transfer.py" "$tmp/lrs" "$tmp/lrs2" >"$tmp/seeds.txt" 2>&1 ||
  { fail "lr_transfer.py over two seeds"; cat "$tmp/seeds.txt"; }
mkdir -p "$tmp/lrs-old" && for d in "$tmp"/lrs2/lr-*/; do ln -s "${d%/}" "$tmp/lrs-old/"; done
cut -d, -f1-8 "$tmp/lrs2/lr-sweep.csv" >"$tmp/lrs-old/lr-sweep.csv"
STAB_OUT="$tmp/plain" "$py" "$src/notebooks-export/lr_transfer.py" "$tmp/lrs" "$tmp/lrs-old" >"$tmp/seeds-old.txt" 2>&1 ||
  { fail "lr_transfer.py over two seeds, one CSV without the seed column"; cat "$tmp/seeds-old.txt"; }
"$py" - "$tmp" <<'PY' || status=1
import csv, re, sys
tmp = sys.argv[1]
rows = [r for d in ("lrs", "lrs2") for r in csv.DictReader(open("%s/%s/lr-sweep.csv" % (tmp, d)))]
bad = []
if sorted({r["seed"] for r in rows}) != ["1", "2"]:
    bad.append("the CSVs' seeds are %s, not 1 and 2" % sorted({r["seed"] for r in rows}))
for name in ("seeds.txt", "seeds-old.txt"):
    text = open("%s/%s" % (tmp, name)).read()
    if not re.search(r"^steepest: widths 16, 32; learning rates 0.03, 0.3, 9.9; seeds 1, 2; 12 runs, \d+ diverged$", text, re.M):
        bad.append("%s: the summary line" % name)
    for w in ("16", "32"):
        cells = {}
        for r in rows:
            if r["width"] == w:
                cells.setdefault(r["lr"], []).append(r)
        ok = {lr: sum(float(r["heldout_loss"]) for r in rs) / len(rs) for lr, rs in cells.items()
              if len(rs) == 2 and all(r["status"] == "ok" for r in rs)}
        lr = min(ok, key=ok.get)
        own = " ".join("%.4f" % float(r["heldout_loss"]) for r in sorted(cells[lr], key=lambda r: r["seed"]))
        want = "best steepest width %s lr %s held-out %.4f (mean of 2 seeds: %s)" % (w, lr, ok[lr], own)
        if want not in text.splitlines():
            bad.append("%s: no line %r" % (name, want))
        for seed in ("1", "2"):
            done = [r for r in rows if r["width"] == w and r["seed"] == seed and r["status"] == "ok"]
            b = min(done, key=lambda r: float(r["heldout_loss"]))
            want = "best steepest width %s seed %s lr %s held-out %.4f" % (w, seed, b["lr"], float(b["heldout_loss"]))
            if want not in text.splitlines():
                bad.append("%s: no line %r" % (name, want))
    for r in rows:
        if not re.search(r"^early steepest\s+%s\s+%s\s+%s\s+%s\s" % (r["width"], re.escape(r["lr"]), r["seed"], r["status"]),
                         text, re.M):
            bad.append("%s: no early line for width %s lr %s seed %s" % (name, r["width"], r["lr"], r["seed"]))
    if not re.search(r"^spearman steepest width 32 \(early metric against final loss, 6 runs\)", text, re.M):
        bad.append("%s: the rank correlation not over the 6 runs of width 32" % name)
if bad:
    sys.exit("FAIL: lr_transfer.py over two seeds:\n  " + "\n  ".join(bad) + "\n" + open(tmp + "/seeds.txt").read())
print("lr_transfer.py: two seeds averaged per rate, each seed's best, a CSV without the seed column")
PY
# a third seed trained for other steps is another schedule: refused, naming the field and both runs
./harness/train $(echo "$lrsmall" | sed 's/--steps 20/--steps 12/') --seed 3 --sweep-lrs 0.03,0.3 --width 16 \
  --out "$tmp/lrs3" >"$tmp/train.log" 2>&1 || fail "the learning-rate sweep, seed 3: $(tail -n 3 "$tmp/train.log")"
"$py" "$src/notebooks-export/lr_transfer.py" "$tmp/lrs" "$tmp/lrs3" >"$tmp/bad.txt" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "^lr_transfer.py: lr sweep: steepest runs differ in steps: 20 in $tmp/lrs/lr-0.03/width-16/trace.h5, 12 in $tmp/lrs3/lr-0.03/trace.h5 " "$tmp/bad.txt" ||
  fail "lr_transfer.py given sweeps of 20 and 12 steps: exit $rc, $(cat "$tmp/bad.txt")"
"$py" "$src/notebooks-export/lr_transfer.py" "$tmp/lrs" "$tmp/lrs" >"$tmp/bad.txt" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "^lr_transfer.py: two runs of steepest at width 16, lr 0.03 and seed 1: in $tmp/lrs/lr-0.03/width-16 and" "$tmp/bad.txt" ||
  fail "lr_transfer.py given one sweep twice: exit $rc, $(cat "$tmp/bad.txt")"

# live as a plain script on a finished trace: it stops once the trace has been idle, with every row.
STAB_OUT="$tmp/plain" STAB_LIVE_IDLE=1 STAB_LIVE_EVERY=0.2 "$py" "$src/notebooks-export/live.py" "$tmp/run/trace.h5" \
  >"$tmp/live.txt" 2>&1 || { fail "live.py on a finished trace"; cat "$tmp/live.txt"; }
grep -q "stopped: no new step for 1 s" "$tmp/live.txt" && grep -q "^final rows: 24 (steps 1..24)" "$tmp/live.txt" ||
  fail "live.py on a finished 24-step trace: $(cat "$tmp/live.txt")"

# Bad input, as a plain script: one line naming it, exit 2.
"$py" "$src/notebooks-export/trace.py" "$tmp/none.h5" >"$tmp/bad.txt" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "^trace.py: trace $tmp/none.h5: no such file" "$tmp/bad.txt" ||
  fail "trace.py on a missing file: exit $rc, $(cat "$tmp/bad.txt")"

alarm=1.2
STAB_OUT="$tmp/plain" STAB_ALARM=$alarm "$py" "$src/notebooks-export/trace.py" "$tmp/nan.h5" >"$tmp/nan.txt" 2>&1 ||
  { fail "trace.py on the trace with NaN steps"; cat "$tmp/nan.txt"; }
"$py" - "$tmp" $alarm <<'PY' || status=1
import re, sys
import h5py, numpy as np
import os as _os, sys as _sys
_sys.path.insert(0, _os.environ["STAB_TESTS_DIR"])
from trace_layers import layer_groups
tmp, alarm = sys.argv[1], float(sys.argv[2])
text = open(tmp + "/nan.txt").read()
f = h5py.File(tmp + "/nan.h5", "r")
steps = f["step"][:]
bad = []
if "NaN steps (2): %d, %d\n" % (steps[4], steps[9]) not in text:
    bad.append("NaN steps at %d and %d not reported" % (steps[4], steps[9]))
names = sorted(layer_groups(f))
fc = [n for n in names if n.endswith("mlp.c_fc")][0]
proj = [n for n in names if n.endswith("attn.c_proj")][0]
for name, what, row in ((fc, "non-finite weight", 9), (proj, "sigma not converged", 15)):
    if "flag: %s: %s at 1 step(s), first %d" % (name, what, steps[row]) not in text:
        bad.append("flag %s of %s at step %d not reported" % (what, name, steps[row]))
# Alarms: each layer's first step where a metric is above the threshold times its first finite
# positive value (the ratio to init; this trace has no ratio datasets; the update per unit of
# learning rate, as train --alarm), computed here.
lr = f["scalars/lr"][:]
want = set()
for name in names:
    g = layer_groups(f)[name]
    rows = []
    for m in ("forward", "dependency", "update"):
        v = g[m][:] / (lr if m == "update" else 1)
        ok = np.flatnonzero(np.isfinite(v) & (v > 0))
        over = np.flatnonzero(np.nan_to_num(v[ok[0]:] / v[ok[0]], nan=-np.inf) > alarm) if len(ok) else []
        if len(over):
            rows.append(ok[0] + over[0])
    if rows:
        want.add((name, int(steps[min(rows)])))
got = set((m.group(1), int(m.group(2))) for m in re.finditer(r"^alarm: (\S+) .* first at step (\d+)$", text, re.M))
if not want:
    bad.append("the threshold %g crosses nothing: the check would be empty" % alarm)
if got != want:
    bad.append("alarms %s, expected %s" % (sorted(got), sorted(want)))
if not re.search(r"figure: \S+/trace\.png \(1400 x \d+ px\)", text):
    bad.append("no trace.png")
if bad:
    sys.exit("FAIL: trace.py on the trace with NaN steps:\n  " + "\n  ".join(bad) + "\n" + text)
print("trace.py: NaN steps, flags and %d alarm crossings as put in" % len(want))
PY

# A trace's own ratio datasets (format 3) are what the notebook ranks, not ratios it computes:
# here they are made 7 times the computed ones.
"$py" - "$tmp" <<'PY' || status=1
import shutil, sys
import h5py, numpy as np
import os as _os, sys as _sys
_sys.path.insert(0, _os.environ["STAB_TESTS_DIR"])
from trace_layers import layer_groups
tmp = sys.argv[1]
shutil.copy(tmp + "/run/trace.h5", tmp + "/ratio.h5")
with h5py.File(tmp + "/ratio.h5", "r+") as f:
    for g in layer_groups(f).values():
        for m in ("forward", "dependency", "update"):
            v = g[m][:]
            r = np.full(len(v), np.nan)
            ok = np.flatnonzero(np.isfinite(v) & (v > 0))
            if len(ok):
                r[ok[0]:] = 7 * v[ok[0]:] / v[ok[0]]
            if m + "_ratio" in g:  # the trainer's own (format 3): replaced by these
                g[m + "_ratio"][:len(r)] = r
            else:
                g[m + "_ratio"] = r
PY
STAB_OUT="$tmp/plain" "$py" "$src/notebooks-export/trace.py" "$tmp/ratio.h5" >"$tmp/ratio.txt" 2>&1 ||
  { fail "trace.py on a trace with ratio datasets"; cat "$tmp/ratio.txt"; }
"$py" - "$tmp" <<'PY' || status=1
import re, sys
import h5py, numpy as np
import os as _os, sys as _sys
_sys.path.insert(0, _os.environ["STAB_TESTS_DIR"])
from trace_layers import layer_groups
tmp = sys.argv[1]
text = open(tmp + "/ratio.txt").read()
f = h5py.File(tmp + "/ratio.h5", "r")
lr = f["scalars/lr"][:]
bad = []
if "ratio to init: the trace's forward_ratio, dependency_ratio, update_ratio" not in text:
    bad.append("does not say it read the trace's ratio datasets")
ratios = text.split("by ratio to init")[1]
n = 0
for kind in ("linear", "attention", "gain", "lm_head"):
    for m in ("forward", "update"):
        def shown(g):  # the update's per unit of learning rate, over lr at its reference row
            r, v = g[m + "_ratio"][:], g[m][:]
            return r * lr[np.flatnonzero(np.isfinite(v) & (v > 0))[0]] / lr if m == "update" else r
        groups = [(np.nanmax(shown(g)), name) for name, g in layer_groups(f).items()
                  if g.attrs["kind"] == kind and np.isfinite(g[m + "_ratio"][:]).any()]
        if not groups:
            continue
        best = max(groups)
        tied = {name for value, name in groups if value >= best[0] * (1 - 1e-12)}
        got = re.search(r"^%s\s+%s\s+1\s+(\S+)\s+(\S+)" % (m, kind), ratios, re.M)
        n += 1
        if not got or got.group(1) not in tied or abs(float(got.group(2)) - best[0]) > 1e-3 * best[0]:
            bad.append("worst %s %s by ratio: %s, the dataset's %s %.4g" % (kind, m, got and got.groups(), best[1], best[0]))
if n < 6:
    bad.append("only %d kinds and metrics checked" % n)
if bad:
    sys.exit("FAIL: trace.py with ratio datasets:\n  " + "\n  ".join(bad) + "\n" + text)
print("trace.py: the trace's own ratio datasets ranked (%d kinds and metrics)" % n)
PY

echo "notebooks.sh: $(($(date +%s) - t0)) s"
exit $status
