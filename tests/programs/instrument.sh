#!/bin/sh
# instrument.sh — harness/instrument_example.c built as an outside user builds it: the library
# installed with `make install DESTDIR=` into a temporary stage, the example compiled with its own
# command plus `pkg-config --cflags --libs stabmeter` pointed at the stage and nothing else, run,
# and its trace read back by the staged stabmeter-export. Also: fewer than 30 lines are marked
# stabmeter, and with them deleted the file is the plain trainer, printing the same losses.
set -u
srcdir=${srcdir:-.}
src=$srcdir/harness/instrument_example.c
cc=${CC:-cc}
# The flags the library was built with (make check passes them): in the sanitizer build, the
# example must be instrumented too, or ASan refuses to start (its runtime must come first).
extra=${STAB_BUILD_CFLAGS:-}
fail() { echo "FAIL: $*"; exit 1; }
for tool in pkg-config "$cc" make; do
  command -v "$tool" >/dev/null 2>&1 || { echo "SKIP: $tool not found"; exit 77; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/instrument.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

# The user's own code: every line it adds carries the mark, so the count is honest only if
# nothing of stabmeter is left once the marked lines are gone.
added=$(grep -c '/\* stabmeter \*/$' "$src")
[ "$added" -gt 0 ] && [ "$added" -lt 30 ] || fail "$added lines marked stabmeter; the promise is under 30"
grep -v '/\* stabmeter \*/$' "$src" >"$tmp/plain.c"
if grep -n 'stab_\|STAB_\|stabmeter\.h' "$tmp/plain.c"; then fail "stabmeter code outside the marked lines"; fi
echo "lines added for stabmeter: $added"

# Every line the manual (docs/manual/instrumenting.md) shows as added is one of them.
readme=$srcdir/docs/manual/instrumenting.md
[ -f "$readme" ] || fail "no $readme (moved? this test reads its added lines)"
sed -n '/<!-- instrument: added lines -->/,/<!-- \/instrument -->/p' "$readme" |
  sed -e '/^```/d' -e '/^<!--/d' -e '/^ *$/d' -e '/^ *\/\//d' -e 's/^ *//' -e 's/ *$//' >"$tmp/readme_lines"
[ -s "$tmp/readme_lines" ] || fail "docs/manual/instrumenting.md has no block between <!-- instrument: added lines --> and <!-- /instrument -->"
grep '/\* stabmeter \*/$' "$src" | sed -e 's| */\* stabmeter \*/$||' -e 's/^ *//' >"$tmp/marked_lines"
while IFS= read -r line; do
  grep -qxF -- "$line" "$tmp/marked_lines" || fail "docs/manual/instrumenting.md shows a line the example does not add: $line"
done <"$tmp/readme_lines"

# The library as `make install` lays it out, under a stage instead of the prefix. MAKEFLAGS
# would tie this make to the jobserver of the make running the tests.
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make install DESTDIR="$tmp/stage" >"$tmp/install.log" 2>&1 ||
  { tail -n 30 "$tmp/install.log"; fail "make install DESTDIR=... failed"; }
pc=$(find "$tmp/stage" -name stabmeter.pc | head -n 1)
[ -n "$pc" ] || fail "make install put no stabmeter.pc in the stage"
# A caller built for an older interface learns how to port from NEWS, installed with the docs;
# its version is the header's.
news=$(find "$tmp/stage" -path '*/doc/stabmeter/NEWS' -type f | head -n 1)
[ -n "$news" ] || fail "make install put no NEWS under \$(docdir) (doc/stabmeter/NEWS) in the stage"
hdr=$(find "$tmp/stage" -name stabmeter.h -type f | head -n 1)
version=$(sed -n 's/^#define STAB_VERSION_STRING "\(.*\)"$/\1/p' "$hdr")
grep -q "^$version " "$news" || fail "the installed NEWS has no entry for the installed header's version $version"
libdir=$(dirname "$(dirname "$pc")")
export_prog=$(find "$tmp/stage" -name stabmeter-export -type f | head -n 1)
[ -n "$export_prog" ] || fail "make install put no stabmeter-export in the stage"
# --help sends users to the installed definitions (docs/manual/metrics.md under $(docdir)): that
# file is where it says.
probe_prog=$(find "$tmp/stage" -name stabmeter-probe -type f | head -n 1)
[ -n "$probe_prog" ] || fail "make install put no stabmeter-probe in the stage"
named=$(LD_LIBRARY_PATH=$libdir "$probe_prog" --help | sed -n 's/.*(installed as \([^)]*metrics\.md\)).*/\1/p' | head -n 1)
[ -n "$named" ] && [ -f "$tmp/stage$named" ] ||
  fail "stabmeter-probe --help names the definitions as '$named', which make install did not put there"
PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$tmp/stage
export PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
flags=$(pkg-config --cflags --libs stabmeter) || fail "pkg-config does not find stabmeter in the stage"
case "$flags" in
  *"-I$tmp/stage/"*"-L$tmp/stage/"*) ;;
  *) fail "pkg-config's flags do not point into the stage: $flags" ;;
esac
echo "pkg-config --cflags --libs stabmeter: $flags"

# The trainer's own build command, then the same plus pkg-config.
# shellcheck disable=SC2086
"$cc" -O2 $extra -o "$tmp/train" "$src" -lm $flags 2>"$tmp/cc.log" || { cat "$tmp/cc.log"; fail "the example does not build against the installed library"; }
"$cc" -O2 $extra -o "$tmp/plain" "$tmp/plain.c" -lm 2>"$tmp/cc_plain.log" || { cat "$tmp/cc_plain.log"; fail "the example without its marked lines does not build"; }

LD_LIBRARY_PATH=$libdir "$tmp/train" "$tmp/trace.h5" >"$tmp/train.out" 2>"$tmp/train.err" ||
  { cat "$tmp/train.err"; fail "the instrumented example failed"; }
"$tmp/plain" >"$tmp/plain.out" 2>/dev/null || fail "the plain trainer failed"
cat "$tmp/train.out"
cmp -s "$tmp/train.out" "$tmp/plain.out" || { diff "$tmp/plain.out" "$tmp/train.out"; fail "the monitor changed the training"; }

# It learns: held-out accuracy well above chance (0.25), the loss down to a fifth.
awk '/^step 1:/ { first = $5 } /^step 400:/ { last = $5 } /^held-out/ { acc = $NF }
     END { if (!(acc >= 0.85 && last < first / 5)) { print "FAIL: no learning: loss " first " -> " last ", accuracy " acc; exit 1 } }' \
  "$tmp/train.out" || exit 1

# The trace, read by the installed export: its schema checks pass (exit 0), and it holds every
# step once, with the three layers as registered and finite metrics.
LD_LIBRARY_PATH=$libdir "$export_prog" "$tmp/trace.h5" >"$tmp/trace.csv" 2>"$tmp/export.err" ||
  { cat "$tmp/export.err"; fail "stabmeter-export refuses the example's trace"; }
awk -F, -v out="$tmp/train.out" '
  NR == 1 { if ($0 != "step,layer,kind,metric,value") bad = bad " header"; next }
  { rows++; steps[$1] = 1 }
  $2 == "" && $3 == "scalar" { scalar[$4]++; if ($4 == "loss") loss[$1] = $5; next }
  { kind[$2] = kind[$2] == "" || kind[$2] == $3 ? $3 : "mixed" }
  $4 == "forward" || $4 == "dependency" || $4 == "update" {
    n[$2 "/" $4]++
    if (!($5 + 0 > 0) || $5 == "inf" || $5 == "nan") bad = bad " " $2 "/" $4 "@" $1 "=" $5
  }
  END {
    while ((getline line < out) > 0)
      if (split(line, f, " ") >= 5 && f[1] == "step") {
        s = f[2]; sub(":", "", s)
        if (sprintf("%.6f", loss[s]) != f[5]) bad = bad " loss@" s "=" loss[s] "(printed " f[5] ")"
      }
    nsteps = 0; for (s in steps) nsteps++
    if (nsteps != 400) bad = bad " steps=" nsteps
    if (scalar["wall_time"] != 400 || scalar["loss"] != 400 || scalar["lr"] != 400) bad = bad " scalars"
    if (kind["fc1"] != "linear" || kind["fc2"] != "linear" || kind["head"] != "lm_head") bad = bad " kinds"
    for (k in kind) nl++
    if (nl != 3) bad = bad " layers=" nl
    for (l in kind) for (m = 1; m <= 3; m++) {
      key = l "/" (m == 1 ? "forward" : m == 2 ? "dependency" : "update")
      if (n[key] != 400) bad = bad " " key "x" n[key]
    }
    if (rows != 400 * (3 + 3 * (15 + 3))) bad = bad " rows=" rows  # 15 metrics and 3 ratios a layer
    if (bad != "") { print "FAIL: the trace:" bad; exit 1 }
    print "trace: 400 steps, 3 layers (linear, linear, lm_head), finite metrics, losses as printed"
  }' "$tmp/trace.csv" || exit 1
