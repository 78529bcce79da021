#!/bin/sh
# The trace append's cost beside measuring the layers it records, as ratios taken in one run:
# bench/trace_append (built here if needed) measures a GPT-2-124M-shaped monitor (49 layers,
# ~790 datasets a trace) every step and appends each step to two traces, one flushed at every
# append (the old default) and one with the default parameters (flush at most once a second).
# Usage: bench/trace_append.sh [STEPS] [more bench/trace_append options: --sleep-ms M, --gains,
# --extras]; run from the top of a built tree. Prints the load average with the figures.
set -eu
steps=${1:-200}
[ $# -ge 1 ] && shift
[ -f lib/libstabmeter.la ] || { echo "trace_append.sh: build first (./quickstart.sh test, or make)" >&2; exit 2; }
make -s bench/trace_append >&2 || exit 1
tmp=$(mktemp -d /tmp/stab_trace_append.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
./bench/trace_append --steps "$steps" "$@" "$tmp"
