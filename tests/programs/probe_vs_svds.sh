#!/bin/sh
# bench/probe_vs_svds.py on a toy Llama (tests/support/hf_gen tiny: 14 linear matrices) — what it
# computes, not how fast: its f64 reference (read by its own safetensors/BF16 reader) against the
# probe's --exact sigmas (the library's reader and LAPACK), the report's figures present and
# finite, the honesty count (0 on the probe's real report, exactly the doctored layer on a report
# whose sigma was moved past its reported error), and the cache (reused, recomputed once a shard
# changes). Skipped (77) when no python3 imports numpy and scipy.
set -u
top=$(pwd)
src=${srcdir:-.}
dir=$(mktemp -d "${TMPDIR:-/tmp}/probe_vs_svds.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
py=
for c in "${PYTHON:-python3}" /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import numpy, scipy.sparse.linalg' 2>/dev/null; then py=$c; break; fi
done
[ -n "$py" ] || { echo "SKIP: no python3 imports numpy and scipy (Debian: apt-get install python3-scipy)"; exit 77; }
status=0
fail() { echo "FAIL: $*"; status=1; }
helper() { "$py" "$src/bench/probe_vs_svds.py" "$dir/m" --probe "$top/harness/probe" "$@"; }

"$top/tests/support/hf_gen" "$dir/m" tiny >/dev/null || { echo "FAIL: hf_gen"; exit 1; }
"$top/harness/probe" "$dir/m" --json --quiet >"$dir/probe.json" || { echo "FAIL: probe"; exit 1; }
"$top/harness/probe" "$dir/m" --json --quiet --exact >"$dir/exact.json" || { echo "FAIL: probe --exact"; exit 1; }
helper --json "$dir/a.json" >"$dir/a.out" 2>"$dir/a.err" || { cat "$dir/a.err"; fail "first run"; }
helper --json "$dir/b.json" >"$dir/b.out" 2>"$dir/b.err" || { cat "$dir/b.err"; fail "second run"; }
# the same report with one layer's sigma moved 10x its reported error away
"$py" - "$dir/probe.json" "$dir/doctored.json" <<'PY' || fail "doctoring the report"
import json, sys
r = json.load(open(sys.argv[1]))
l = next(l for l in r["layers"] if l["name"] == "model.layers.1.mlp.up_proj")
l["sigma"] *= 1 + 10 * max(l["sigma_rel_err"], 1e-6)
json.dump(r, open(sys.argv[2], "w"))
PY
helper --probe-json "$dir/doctored.json" --json "$dir/c.json" --no-full-svd >"$dir/c.out" 2>&1 ||
  { cat "$dir/c.out"; fail "run on the doctored report"; }
touch -d '2001-01-01' "$dir/m/model-00002-of-00003.safetensors"
helper --probe-json "$dir/probe.json" --json "$dir/d.json" --no-full-svd >"$dir/d.out" 2>&1 ||
  { cat "$dir/d.out"; fail "run after a shard changed"; }

"$py" - "$dir" <<'PY' || status=1
import json, math, os, sys
d = sys.argv[1]
a, b, c, e = (json.load(open(os.path.join(d, f + ".json"))) for f in "abcd")
exact = {l["tensor"]: l["sigma"] for l in json.load(open(os.path.join(d, "exact.json")))["layers"]
         if l["kind"] == "linear"}
ref = json.load(open(os.path.join(d, "m", "probe_vs_svds.f64.json")))["sigma"]
bad = []
def check(cond, what):
    if not cond:
        bad.append(what)
check(a["matrices"] == 14 and len(ref) == 14 and set(ref) == set(exact), "14 linear matrices, the probe's")
for t, s in exact.items():
    check(abs(ref[t] - s) <= 1e-12 * s, f"f64 reference of {t}: {ref[t]!r} against LAPACK's {s!r}")
check(sorted(a["not_compared"]) == ["lm_head.weight", "model.embed_tokens.weight"], "not compared: embedding, head")
check(a["reference_computed"] == 14 and b["reference_computed"] == 0, "computed once, then cached")
check(e["reference_computed"] == 14, "recomputed after a shard changed")
check(a["probe"]["over_reported"] == 0, f"honest probe: {a['probe']['over_reported_layers']}")
check(c["probe"]["over_reported_layers"] == ["model.layers.1.mlp.up_proj"], f"doctored: {c['probe']}")
check(c["probe"]["seconds"] is None and c["ratio_svds_over_probe"] is None, "no probe time from a given report")
check(0 <= a["probe"]["worst_rel_err"] <= a["tol"], "the probe's worst error within its tol")
check([s["tol"] for s in a["svds"]] == [0.1, 0.03, 0.01, 0.003, 0.001], "the svds ladder")
for s in a["svds"]:
    check(math.isfinite(s["seconds"]) and 0 <= s["worst_rel_err"] < 0.1, f"svds at {s['tol']}: {s}")
met = [s["tol"] for s in a["svds"] if s["worst_rel_err"] <= a["tol"]]
check(a["svds_tol_compared"] == (met[0] if met else 0.001), "the loosest svds tol that meets the probe's")
check(a["full_svd"]["worst_rel_err"] < 1e-5, f"full SVD in f32: {a['full_svd']}")
check(a["ratio_svds_over_probe"] > 0 and a["ratio_full_svd_over_probe"] > 0, "ratios")
check(a["probe_error_worse"] == (a["probe"]["worst_rel_err"] > next(
    s["worst_rel_err"] for s in a["svds"] if s["tol"] == a["svds_tol_compared"])), "the worse-error flag")
for x in bad:
    print("FAIL:", x)
sys.exit(1 if bad else 0)
PY
grep -q '^ratio svds(tol [0-9.e-]*) / probe: [0-9.]* (target >= 3: \(PASS\|FAIL\))$' "$dir/a.out" || { cat "$dir/a.out"; fail "the ratio line"; }
grep -q '^load average: [0-9.]* at the start, [0-9.]* at the end' "$dir/a.out" || fail "the load average line"
grep -q 'honesty: 1 of 14 matrices' "$dir/c.out" || { cat "$dir/c.out"; fail "the honesty line"; }
# bad usage: exit 2
helper --ladder x >/dev/null 2>&1; [ $? -eq 2 ] || fail "--ladder x: exit 2"
"$py" "$src/bench/probe_vs_svds.py" "$dir/none" >/dev/null 2>&1; [ $? -eq 2 ] || fail "a missing checkpoint: exit 2"
[ $status -eq 0 ] && echo "PASS: probe_vs_svds.py on the tiny model"
exit $status
