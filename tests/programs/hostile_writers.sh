#!/bin/sh
# hostile_writers.sh — the trace writers against each other and against a full disk, as
# programs: two `train --out D` started together, two `probe --hdf5 F` on one step (exactly one
# exits 0, the other exits 2 naming the trace, which holds the winner's rows); then, as root
# where a small tmpfs can be mounted, a disk full at the start (train and probe --hdf5) and
# during a run (--trace-errors stop and continue): a clear message, no crash, no HDF5 noise,
# the rows written before readable.
set -u
top=$(pwd)
src=${srcdir:-.}
. "$src/tests/support/limit.sh"
train=$top/harness/train
probe=$top/harness/probe
gen=$top/tests/support/st_gen
dir=$(mktemp -d "${TMPDIR:-/tmp}/hostile_writers.XXXXXX") || exit 1
mnt=$dir/small
mounted=0
cleanup() {
  [ "$mounted" -eq 1 ] && umount "$mnt" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
small="--width 32 --depth 1 --heads 2 --context 16 --batch 8 --corpus-bytes 65536"

# rows FILE: the length of /step (h5dump reads a closed trace with a plain open)
rows() { h5dump -A 0 -H -d /step "$1" 2>/dev/null | sed -n 's/.*SIMPLE { ( \([0-9]*\) ).*/\1/p'; }
# quiet WHAT FILE: no HDF5 diagnostics, exit-time noise, temporary names or addresses in FILE
quiet() {
  if grep -Eq 'HDF5|infinite loop|FL,FL|\.tmp|0x[0-9a-f]{6}' "$2"; then
    fail "$1: noise on stderr:"
    grep -E 'HDF5|infinite loop|FL,FL|\.tmp|0x[0-9a-f]{6}' "$2" | cut -c1-200 | head -n 3 | sed 's/^/    /'
  else
    pass
  fi
}
# one_winner WHAT TRACE RC1 ERR1 RC2 ERR2: exactly one exit 0, the other exit 2 naming TRACE;
# prints the winner's number (1 or 2)
one_winner() {
  if [ "$3" -eq 0 ] && [ "$5" -eq 2 ]; then w=1 l=$6
  elif [ "$3" -eq 2 ] && [ "$5" -eq 0 ]; then w=2 l=$4
  else
    fail "$1: exits $3 and $5, want one 0 and one 2"
    sed 's/^/    1: /' "$4" | tail -n 2
    sed 's/^/    2: /' "$6" | tail -n 2
    return 1
  fi
  if grep -Fq "$2" "$l"; then pass; else fail "$1: the loser's message does not name $2: $(cat "$l")"; fi
  return 0
}

# ---- two writers started together -----------------------------------------------------
# Long enough (200 steps) that the two runs overlap whatever the machine's speed: the winner
# holds the trace for its whole run. Different seeds tell whose rows the trace holds.
run=$dir/together
for k in 1 2; do
  timeout --kill-after=10 "$LIMIT_SECONDS" "$train" $small --steps 200 --seed $k --out "$run" \
    >"$dir/t$k.out" 2>"$dir/t$k.err" </dev/null &
  eval "pid$k=\$!"
done
wait "$pid1"; rc1=$?
wait "$pid2"; rc2=$?
if one_winner "two trains" "$run" $rc1 "$dir/t1.err" $rc2 "$dir/t2.err"; then
  [ "$(rows "$run/trace.h5")" = 200 ] && pass || fail "two trains: the trace has $(rows "$run/trace.h5") rows, not 200"
  h5dump -a /run_config "$run/trace.h5" 2>/dev/null | grep -q "\"seed\": $w," && pass ||
    fail "two trains: the trace is not the winner's (seed $w): $(h5dump -a /run_config "$run/trace.h5" 2>&1 | grep seed)"
  # the loser found the trace locked, or (never replacing a run unasked) already there
  grep -Eq "another process is writing this trace|a trace is already there: kept as it is|holds an earlier run" \
    "$dir/t$((3 - w)).err" && pass || fail "two trains: the loser's message: $(cat "$dir/t$((3 - w)).err")"
fi
ls "$run" | grep -q tmp && fail "two trains: a temporary file is left: $(ls "$run")"

# Two probes of one step on a new trace, 10 rounds: whether they overlap (the loser finds the
# trace locked), follow each other (it finds step 100 there already) or half overlap (the loser
# built a new trace while the winner published and closed its own: it must append to the
# winner's, not replace it), exactly one writes it. One round in three ended with both
# exiting 0 before that last case was handled, so ten rounds catch it.
if "$gen" "$dir/ck" gpt2 F32 >/dev/null 2>&1; then
  tr=$dir/probe.h5
  round=1
  while [ $round -le 10 ]; do
    rm -f "$tr"
    for k in 1 2; do
      timeout --kill-after=10 "$LIMIT_SECONDS" "$probe" "$dir/ck.safetensors" --hdf5 "$tr" --step 100 --quiet \
        >/dev/null 2>"$dir/p$k.err" </dev/null &
      eval "pid$k=\$!"
    done
    wait "$pid1"; rc1=$?
    wait "$pid2"; rc2=$?
    if one_winner "two probes, round $round" "$tr" $rc1 "$dir/p1.err" $rc2 "$dir/p2.err"; then
      [ "$(rows "$tr")" = 1 ] && pass || fail "two probes, round $round: the trace has $(rows "$tr") rows, not 1"
    fi
    round=$((round + 1))
  done
  # a step before the trace's last is refused, the trace kept
  expect "probe of an earlier step" 2 "probe.h5: .*step 50 is not after the last step 100" \
    "$probe" "$dir/ck.safetensors" --hdf5 "$tr" --step 50 --quiet
  [ "$(rows "$tr")" = 1 ] && pass || fail "probe of an earlier step: the trace has $(rows "$tr") rows"
else
  fail "st_gen could not write a checkpoint"
fi

# ---- a full disk ------------------------------------------------------------------------
# mnt_small SIZE: a fresh tmpfs of SIZE at $mnt (root only)
mnt_small() {
  [ "$mounted" -eq 1 ] && { umount "$mnt" || return 1; mounted=0; }
  mkdir -p "$mnt" && mount -t tmpfs -o "size=$1" none "$mnt" 2>/dev/null && mounted=1
}
if [ "$(id -u)" -ne 0 ] || ! mnt_small 64k; then
  echo "SKIP (full-disk cases): needs root and a tmpfs mount"
  [ "$checks" -eq 0 ] && exit 77
  summary hostile_writers
  exit $?
fi
dd if=/dev/zero of="$mnt/fill" bs=4k 2>/dev/null # the disk is full
expect "train, disk full at the start" 1 "trace: .*small/run/trace.h5: .*No space left on device" \
  "$train" $small --steps 5 --out "$mnt/run"
quiet "train, disk full at the start" "$err_file"
[ -z "$(ls "$mnt/run" 2>/dev/null)" ] && pass || fail "train, disk full at the start: left $(ls "$mnt/run")"
if [ -e "$dir/ck.safetensors" ]; then
  expect "probe --hdf5, disk full at the start" 1 "small/p.h5: .*No space left on device" \
    "$probe" "$dir/ck.safetensors" --hdf5 "$mnt/p.h5" --step 1 --quiet
  quiet "probe --hdf5, disk full at the start" "$err_file"
  [ ! -e "$mnt/p.h5" ] && pass || fail "probe --hdf5, disk full at the start: a trace was left"
fi

# Full during the run: 1200 KiB hold the first rows of this model's trace (a few chunks per
# dataset, 550 KiB for 256 rows; the library stops where its reserve for the next chunk does
# not fit, HDF5 alone would reach row 513), and still the final checkpoint.
steps=600
for mode in stop continue; do
  mnt_small 1200k || { fail "cannot mount a tmpfs again"; break; }
  code=1
  [ $mode = continue ] && code=0
  expect "train, disk full mid-run, $mode" $code "no room on the disk for the next rows" \
    "$train" $small --steps $steps --optimizer steepest --untied --trace-errors $mode --out "$mnt/run"
  quiet "train, disk full mid-run, $mode" "$err_file"
  n=$(rows "$mnt/run/trace.h5")
  [ -n "$n" ] && [ "$n" -gt 0 ] && [ "$n" -lt $steps ] && pass ||
    fail "train, disk full mid-run, $mode: the trace has '$n' rows (want some, fewer than $steps)"
  if [ $mode = continue ]; then
    grep -q "step $steps/$steps" "$err_file" && pass || fail "continue: the run did not complete"
    [ "$(grep -c 'going on without the trace' "$err_file")" -eq 1 ] && pass ||
      fail "continue: the failure is not said exactly once"
    grep -q "^trace: .*, $n measured steps before a write failed" "$out_file" && pass ||
      fail "continue: the closing line: $(grep '^trace:' "$out_file")"
  else
    grep -q "step $steps/$steps" "$err_file" && fail "stop: the run went on"
    grep -q "train: stopping; the rows written before are in" "$err_file" && pass || fail "stop: no message"
  fi
  # every row before the failure, read by others' tools
  h5dump -d /scalars/loss "$mnt/run/trace.h5" >/dev/null 2>&1 && pass || fail "$mode: h5dump cannot read the trace"
  for py in /usr/bin/python3 python3; do
    if command -v $py >/dev/null 2>&1 && $py -c 'import h5py' 2>/dev/null; then
      $py -c 'import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
s = f["step"][:]
assert len(s) == int(sys.argv[2]) and (s == np.arange(1, len(s) + 1)).all(), s
assert np.isfinite(f["scalars/loss"][:]).all()' "$mnt/run/trace.h5" "$n" && pass || fail "$mode: h5py reads the trace wrong"
      break
    fi
  done
done
summary hostile_writers
