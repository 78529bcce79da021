#!/bin/sh
# cli.sh — every installed program against the command-line conventions (harness/cli.h), one
# table row per case: -h and --help print the usage on stdout with exit 0; --version prints
# "stabmeter-X (stabmeter) VERSION"; an unknown option, a missing value or a bad value is one
# line naming the option (and the value) then "Try 'stabmeter-X --help' ...", exit 2, and no
# usage dump; every message names the program by its installed name.
src=${srcdir:-.}
build=${builddir:-.}
dir=$(mktemp -d "${TMPDIR:-/tmp}/stab-cli.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
. "$src/tests/support/limit.sh"

# prog ARGS... must exit CODE, print PATTERN (ERE) on stderr; stderr at most LINES lines.
row() {
  what=$1 code=$2 pattern=$3 lines=$4
  shift 4
  expect "$what" "$code" "$pattern" "$@"
  n=$(wc -l <"$err_file")
  if [ "$n" -gt "$lines" ]; then
    fail "$what: $n lines on stderr, want at most $lines: $*"
    sed 's/^/    /' "$err_file" | head -n 3
  else
    pass
  fi
}

# A checkpoint and a trace for the programs that need an input to get as far as an option.
"$build/tests/support/st_gen" "$dir/ck" gpt2 F32 >/dev/null 2>&1 || { echo "st_gen failed"; exit 1; }
ck=$dir/ck.safetensors

for p in demo bench train probe export; do
  exe=$build/harness/$p
  name=stabmeter-$p
  try="^Try '$name --help' for more information\.\$"
  for h in -h --help; do
    limited "$exe" "$h"
    if [ "$rc" -ne 0 ]; then fail "$name $h: exit $rc, want 0"
    elif ! grep -q '^Usage: ' "$out_file"; then fail "$name $h: no 'Usage:' line on stdout"
    elif [ -s "$err_file" ]; then fail "$name $h: wrote to stderr"
    elif ! grep -q "$name" "$out_file"; then fail "$name $h: usage does not name $name"
    elif ! grep -Eq 'docs/manual/metrics.md|metrics\.md' "$out_file" && [ "$p" != demo ] && [ "$p" != bench ] &&
         [ "$p" != export ]; then fail "$name $h: usage does not point at docs/manual/metrics.md"
    elif grep -q 'SPEC\.md' "$out_file"; then fail "$name $h: usage points at SPEC.md (not shipped)"
    elif ! grep -Eq 'Exit status|exit status|exits? 0' "$out_file"; then fail "$name $h: usage does not give the exit codes"
    else pass; fi
  done
  limited "$exe" --version
  if [ "$rc" -ne 0 ] || ! grep -Eq "^$name \(stabmeter\) [0-9]+\.[0-9]+\.[0-9]+\$" "$out_file"; then
    fail "$name --version: exit $rc, stdout '$(head -c 200 "$out_file")'"
  else pass; fi
  limited "$exe" -V
  if [ "$rc" -ne 0 ] || ! grep -q "^$name (stabmeter)" "$out_file"; then fail "$name -V: exit $rc"; else pass; fi
  row "$name unknown long option" 2 "^$name: unknown option '--no-such-option'\$" 2 "$exe" --no-such-option
  grep -Eq "$try" "$err_file" && pass || fail "$name unknown long option: no Try line"
  row "$name unknown short option" 2 "^$name: unknown option '-Z'\$" 2 "$exe" -Z
  grep -Eq "$try" "$err_file" && pass || fail "$name unknown short option: no Try line"
  # no message may name the program any other way
  for f in "$dir"/limited.err; do
    if grep -Ev "^($name: |Try '$name --help')" "$f" | grep -q .; then
      fail "$name: a stderr line not starting with '$name: '"; sed 's/^/    /' "$f" | head -n 3
    else pass; fi
  done
done

# An empty path names its option (or says the checkpoint is empty), never "': cannot open"
for o in --prev --init --hdf5; do
  row "probe $o ''" 2 "^stabmeter-probe: $o: bad value '' \\(want a path\\)" 2 "$build/harness/probe" "$ck" "$o" ''
done
row "probe ''" 2 "^stabmeter-probe: the checkpoint's path is empty" 2 "$build/harness/probe" ''

# Bad values: the option and the value named, one message line plus the Try line.
# program | args | option named
while IFS='|' read -r p args opt; do
  [ -n "$p" ] || continue
  name=stabmeter-$p
  # shellcheck disable=SC2086
  row "$name $args" 2 "^$name: .*$opt.*" 2 "$build/harness/$p" $args
  val=${args##* }
  grep -Fq "'$val'" "$err_file" && pass || fail "$name $args: message does not quote the value '$val'"
  grep -q "^Try '$name --help'" "$err_file" && pass || fail "$name $args: no Try line"
done <<TABLE
train|--steps abc|--steps
train|--steps 0|--steps
train|--width 12x|--width
train|--lr -1|--lr
train|--optimizer sgd|--optimizer
train|--batch 99999999999999999999999|--batch
train|--metrics-every x|--metrics-every
train|--alarm nan|--alarm
train|--trace-errors maybe|--trace-errors
probe|$ck --tol abc|--tol
probe|$ck --heads 0|--heads
probe|$ck --tight loose|--tight
probe|$ck --step -3|--step
probe|$ck --sort fastest|--sort
probe|$ck --top 0|--top
probe|$ck --top x|--top
probe|$ck --kind x=banana|--kind
probe|$ck --layout x=diagonal|--layout
bench|--sizes abc|--sizes
bench|--threads x|--threads
export|--format xml|--format
export|--steps 9:a|--steps
demo|--width 0|--width
demo|--width abc|--width
demo|--method fast|--method
demo|--step x|--step
TABLE

# A missing value: named, one line plus Try.
for pv in "train --steps" "probe --tol" "export --format" "bench --sizes" "demo --width"; do
  set -- $pv
  name=stabmeter-$1
  row "$name $2 (no value)" 2 "^$name: option '$2' needs a value\$" 2 "$build/harness/$1" "$2"
done

# The exit codes the usage promises for bad input.
mkdir -p "$dir/adir"
row "train --data DIR" 2 "^stabmeter-train: .*adir" 3 "$build/harness/train" --data "$dir/adir" --steps 1
row "probe DIR without a model" 2 "^stabmeter-probe: .*adir" 3 "$build/harness/probe" "$dir/adir"
row "export of a missing file" 2 "^stabmeter-export: .*missing" 3 "$build/harness/export" "$dir/missing.h5"
row "probe of a missing file" 2 "^stabmeter-probe: .*missing" 3 "$build/harness/probe" "$dir/missing.safetensors"

summary cli
