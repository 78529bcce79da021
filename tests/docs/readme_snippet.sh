#!/bin/sh
# readme_snippet.sh NAME — runs the manual's snippet NAME (h5py, xarray, pandas or gnuplot), taken from
# README.md or the manual (docs/manual/*.md) itself between <!-- snippet: NAME --> and <!-- /snippet -->, against a short trace
# written by harness/train, after the README's export commands (snippet "export"), and checks
# what it prints or draws against the trace's values, so that the README cannot rot.
# Exit 77 (skipped) with the Debian package to install when the tool is missing.
set -u
name=$1
srcdir=${srcdir:-.}
manual="$srcdir/README.md $srcdir/docs/manual/*.md"
builddir=$(pwd)
fail() { echo "FAIL ($name snippet): $*"; exit 1; }

. "$srcdir/tests/python/python_pick.sh"
py=$(pick_python h5py)
case $name in
  h5py) [ -n "$py" ] || { echo "SKIP: h5py is not importable (Debian: apt-get install python3-h5py)"; exit 77; } ;;
  pandas)
    py=$(pick_python pandas)
    [ -n "$py" ] || { echo "SKIP: pandas is not importable (Debian: apt-get install python3-pandas)"; exit 77; } ;;
  xarray)
    py=$(pick_python xarray h5netcdf)
    [ -n "$py" ] || { echo "SKIP: xarray or h5netcdf is not importable (Debian: apt-get install python3-xarray python3-h5netcdf)"; exit 77; } ;;
  gnuplot) command -v gnuplot >/dev/null 2>&1 || { echo "SKIP: gnuplot not found (Debian: apt-get install gnuplot-nox)"; exit 77; } ;;
  *) fail "unknown snippet" ;;
esac

# The snippet's lines, the code fence and the markers left out.
snippet() {
  awk -v want="<!-- snippet: $1 -->" '
    $0 == want { on = 1; found = 1; next }
    on && $0 == "<!-- /snippet -->" { on = 0; next }
    on && !/^```/ { print }
    END { if (!found) exit 1 }' $manual
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/readme_$name.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
snippet "$name" >"$tmp/snippet" && [ -s "$tmp/snippet" ] || fail "neither README.md nor docs/manual/*.md has snippet '$name'"
snippet export >"$tmp/export.sh" && [ -s "$tmp/export.sh" ] || fail "neither README.md nor docs/manual/*.md has snippet 'export'"

# The README's commands run from a build directory: harness/train and harness/export there.
mkdir -p "$tmp/harness" "$tmp/runs/demo"
for p in train export; do
  printf '#!/bin/sh\nexec "%s/harness/%s" "$@"\n' "$builddir" "$p" >"$tmp/harness/$p"
  chmod +x "$tmp/harness/$p"
done
cd "$tmp" || exit 1
./harness/train --steps 20 --width 32 --depth 1 --heads 2 --context 16 --batch 4 --corpus-bytes 20000 \
  --out runs/demo >train.log 2>&1 || { cat train.log; fail "harness/train failed"; }
sh -e export.sh >export.out 2>export.err || { cat export.err; fail "the export commands failed"; }
[ "$(head -n 1 runs/demo/trace.csv)" = "step,layer,kind,metric,value" ] || fail "runs/demo/trace.csv has no CSV header"
grep -q '^{"step": 1, "scalars": {"loss": [0-9]' export.out || fail "the JSON-lines command printed: $(cat export.out)"

case $name in
h5py)
  "$py" snippet >out.txt 2>err.txt || { cat err.txt; fail "python failed"; }
  cat out.txt
  # What it prints: the last step and the last five update values of transformer.h.0.mlp.c_fc.
  "$py" - <<'PY' || exit 1
import csv, re, sys
rows = [r for r in csv.DictReader(open("runs/demo/trace.csv")) if r["layer"] == "transformer.h.0.mlp.c_fc" and r["metric"] == "update"]
want = [int(rows[-1]["step"])] + [float(r["value"]) for r in rows[-5:]]
got = [float(x) for x in re.findall(r"[-+]?\d+\.?\d*(?:e[-+]?\d+)?", open("out.txt").read())]
ok = len(got) == 6 and got[0] == want[0] and all(abs(g - w) <= 1e-8 + 1e-7 * abs(w) for g, w in zip(got[1:], want[1:]))
if not ok:
    sys.exit("FAIL (h5py snippet): printed %s, the trace holds %s" % (got, want))
PY
  ;;
pandas)
  "$py" snippet >out.txt 2>err.txt || { cat err.txt; fail "python failed"; }
  cat out.txt
  # What it prints: the three layers with the largest update at the last step, and the values.
  "$py" - <<'PY' || exit 1
import csv, math, sys
rows = list(csv.DictReader(open("runs/demo/trace.csv")))
last = max(int(r["step"]) for r in rows)
upd = {r["layer"]: float(r["value"]) for r in rows if int(r["step"]) == last and r["metric"] == "update"}
want = sorted(((v, k) for k, v in upd.items() if not math.isnan(v)), reverse=True)[:3]
got = []
for line in open("out.txt"):
    parts = line.split()
    if len(parts) == 2 and parts[0] in upd:
        got.append((float(parts[1]), parts[0]))
ok = len(got) == 3 and all(g[1] == w[1] and abs(g[0] - w[0]) <= 1e-6 + 1e-5 * abs(w[0]) for g, w in zip(got, want))
if not ok:
    sys.exit("FAIL (pandas snippet): printed %s, the trace's largest are %s" % (got, want))
PY
  ;;
xarray)
  "$py" snippet >out.txt 2>err.txt || { cat err.txt; fail "python failed"; }
  cat out.txt
  # What it prints: the last step, that step's forward stability of transformer.h.0.mlp.c_fc, its unit.
  "$py" - <<'PY' || exit 1
import csv, sys
rows = [r for r in csv.DictReader(open("runs/demo/trace.csv")) if r["layer"] == "transformer.h.0.mlp.c_fc" and r["metric"] == "forward"]
want = (int(rows[-1]["step"]), float(rows[-1]["value"]), "1")
got = open("out.txt").read().split()
ok = len(got) == 3 and int(got[0]) == want[0] and abs(float(got[1]) - want[1]) <= 1e-12 * abs(want[1]) and got[2] == want[2]
if not ok:
    sys.exit("FAIL (xarray snippet): printed %s, the trace holds %s" % (got, want))
PY
  ;;
gnuplot)
  gnuplot snippet 2>err.txt || { cat err.txt; fail "gnuplot failed"; }
  png=$(sed -n 's/.*set output "\([^"]*\)".*/\1/p' snippet | head -n 1)
  [ -n "$png" ] && [ -f "$png" ] || fail "no picture written (set output \"$png\")"
  [ "$(head -c 4 "$png" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "$png is not a PNG"
  [ "$(wc -c <"$png")" -gt 5000 ] || fail "$png is nearly empty"
  # The same plot into a table: every point drawn, per curve, is the trace's value at its step.
  { echo 'set table "table.txt"'; cat snippet; } | gnuplot 2>err.txt || { cat err.txt; fail "gnuplot (table) failed"; }
  awk -F, 'FNR == NR { if (FNR > 1 && $4 == "update") { v[$2 "@" $1] = $5; n[$2]++ } next }
    /^# Curve title: / { t = $0; sub(/^# Curve title: "/, "", t); sub(/"$/, "", t); curves++; next }
    /^#/ || split($0, f, " ") < 3 { next }
    f[3] == "i" {
      key = t "@" f[1]; drawn[t]++
      if (!(key in v)) { if (nbad++ < 5) bad = bad " " key "(not in the trace)"; next }
      w = v[key] + 0; d = f[2] - w; if (d < 0) d = -d
      if (d > 1e-5 * (w < 0 ? -w : w) && nbad++ < 5) bad = bad " " key "=" f[2] "(trace " v[key] ")"
    }
    END {
      if (curves < 1) bad = bad " no curves"
      for (c in drawn) if (drawn[c] != n[c]) bad = bad " " c ":" drawn[c] "/" n[c] "points"
      if (bad != "") { print "FAIL (gnuplot snippet):" bad; exit 1 }
      print "gnuplot drew " curves " curves, every point the trace value at its step"
    }' runs/demo/trace.csv table.txt || exit 1
  ;;
esac
echo "README snippet '$name' runs and prints what the trace holds"
