#!/bin/sh
# The monitor's cost in training time, as ratios measured in one run of this script: the same
# training (same seed, same batches) with every layer measured every step, every 10 steps, and
# never, each written to a trace as the main job does. Usage: bench/overhead.sh [STEPS] [WIDTH]
# [more harness/train options]; run from the top of a built tree.
set -eu
steps=${1:-100}
width=${2:-256}
[ $# -ge 2 ] && shift 2 || shift $#
train=./harness/train
[ -x "$train" ] || { echo "overhead.sh: build first (./quickstart.sh test, or make)" >&2; exit 2; }
tmp=$(mktemp -d /tmp/stab_overhead.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
seconds() { # METRICS_EVERY [TRAIN OPTIONS] -> training seconds (from train's "time:" line)
  every=$1
  shift
  "$train" --width "$width" --steps "$steps" --metrics-every "$every" --out "$tmp/m$every" "$@" \
    2>/dev/null | awk '/^time:/ { print $2 }'
}
shift_opts="$*"
t0=$(seconds 0 $shift_opts)
t10=$(seconds 10 $shift_opts)
t1=$(seconds 1 $shift_opts)
mem=$("$train" --width "$width" --steps 1 --metrics-every 1 $shift_opts 2>&1 >/dev/null |
  sed -n 's/.*monitor: .* steps, \([0-9.]*\) MB.*/\1/p')
awk -v s="$steps" -v w="$width" -v a="$t0" -v b="$t10" -v c="$t1" -v m="$mem" 'BEGIN {
  printf "width %d, %d steps: no metrics %.1f s; every 10 steps %.1f s; every step %.1f s\n", w, s, a, b, c
  printf "overhead ratio, every step: %.3f (target <= 1.10)\n", c / a
  printf "overhead ratio, every 10 steps: %.3f (target <= 1.02)\n", b / a
  printf "monitor memory: %s MB\n", m
}'
