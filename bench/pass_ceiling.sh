#!/bin/sh
# The ceiling of one spectral pass on this machine: bench/pass_ceiling.c (the library's own
# kernels, lib/engine/gram_pass.c and its SIMD builds, f32 runs and f64, 1, 2 and 4 vectors)
# timed on a block that stays in cache (its arithmetic alone), on a ROWS x COLS matrix from
# memory, and a wide-vector read of that matrix, with 1 and 2 threads, interleaved, best of
# REPEAT each. It tells whether harness/bench's "one pass >= 85% of the reference read" target
# is within reach of the arithmetic at all.
# Usage: bench/pass_ceiling.sh [ROWS [COLS [REPEAT]]] (default 4096 4096 20); run from the top
# of the build tree after make (it builds bench/pass_ceiling, which links the library's
# internal build: make bench/pass_ceiling).
set -eu
[ -f lib/libstabmeter_impl.la ] || { echo "pass_ceiling.sh: build first (./quickstart.sh test, or make)" >&2; exit 2; }
make -s bench/pass_ceiling >&2 || exit 1
echo "pass_ceiling.sh: load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
./bench/pass_ceiling "$@"
