#!/bin/sh
# The monitor's cost in training time, as ratios measured in one run of this script: the same
# training (same seed, same batches) with every layer measured every step, every 10 steps, and
# never, each written to a trace as the main job does. The three are run in turn REPEAT times
# (interleaved, so a burst of load elsewhere hits all three alike) and each keeps its fastest
# time. Also the every-step runs' own share of time spent measuring (train's "% of it measuring",
# timed inside one run, so load that differs between runs does not move it), and the load
# average at the start and the end. Usage: bench/overhead.sh [STEPS] [WIDTH] [REPEAT] [more
# harness/train options]; run from the top of a built tree.
set -eu
steps=${1:-100}
width=${2:-256}
repeat=${3:-3}
[ $# -ge 3 ] && shift 3 || shift $#
train=./harness/train
[ -x "$train" ] || { echo "overhead.sh: build first (./quickstart.sh test, or make)" >&2; exit 2; }
tmp=$(mktemp -d /tmp/stab_overhead.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
seconds() { # METRICS_EVERY [TRAIN OPTIONS] -> training seconds (from train's "time:" line)
  every=$1
  shift
  rm -rf "$tmp/m$every" # the round before left its run there, and train refuses an existing --out
  "$train" --width "$width" --steps "$steps" --metrics-every "$every" --out "$tmp/m$every" "$@" \
    2>"$tmp/err$every" >"$tmp/out$every" ||
    { echo "overhead.sh: harness/train --metrics-every $every failed:" >&2; cat "$tmp/err$every" >&2; exit 1; }
  awk '/^time:/ { print $2 }' "$tmp/out$every"
}
# the smallest "N% of it measuring" of train's every-step runs (it prints no share when it measures nothing)
share() { sed -n 's/^time:.*, \([0-9.]*\)% of it measuring.*/\1/p' "$tmp/out1"; }
load_start=$(cut -d' ' -f1 /proc/loadavg)
min() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == "" || b + 0 < a + 0) ? b : a }'; }
t0= t10= t1= s1=
i=0
while [ $i -lt "$repeat" ]; do
  # each run's seconds by itself first: under set -e a failed run then ends the script
  r=$(seconds 0 "$@"); t0=$(min "$t0" "$r")
  r=$(seconds 10 "$@"); t10=$(min "$t10" "$r")
  r=$(seconds 1 "$@"); t1=$(min "$t1" "$r")
  s1=$(min "$s1" "$(share)")
  i=$((i + 1))
  echo "overhead.sh: round $i of $repeat: fastest so far $t0 s, $t10 s, $t1 s" >&2
done
mem=$("$train" --width "$width" --steps 1 --metrics-every 1 "$@" 2>&1 >/dev/null |
  sed -n 's/.*monitor: .* steps, \([0-9.]*\) MB.*/\1/p')
load_end=$(cut -d' ' -f1 /proc/loadavg)
awk -v s="$steps" -v w="$width" -v r="$repeat" -v a="$t0" -v b="$t10" -v c="$t1" -v m="$mem" -v f="$s1" \
    -v l0="$load_start" -v l1="$load_end" 'BEGIN {
  printf "width %d, %d steps, fastest of %d: no metrics %.2f s; every 10 steps %.2f s; every step %.2f s\n", w, s, r, a, b, c
  printf "overhead ratio, every step: %.3f (target <= 1.03: %s)\n", c / a, c / a <= 1.03 ? "PASS" : "FAIL"
  printf "overhead ratio, every 10 steps: %.3f (target <= 1.02: %s)\n", b / a, b / a <= 1.02 ? "PASS" : "FAIL"
  printf "measuring inside the every-step runs: %s%% of their time at the least, an overhead of %.3f by itself\n", f, 1 / (1 - f / 100)
  printf "monitor memory: %s MB\n", m
  printf "load average: %s at the start, %s at the end (2 cores)\n", l0, l1
}'
