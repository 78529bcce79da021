#!/bin/sh
# The ceiling of one spectral pass on this machine: bench/pass_ceiling.c (the library's own
# kernels, lib/engine/gram_pass.c, f32 runs and f64, 1, 2 and 4 vectors) timed on a block that stays
# in cache (its arithmetic alone), on a ROWS x COLS matrix from memory, and a wide-vector read
# of that matrix, with 1 and 2 threads, interleaved, best of REPEAT each. It tells whether
# harness/bench's "one pass >= 85% of the reference read" target is within reach of the
# arithmetic at all.
# Usage: bench/pass_ceiling.sh [ROWS [COLS [REPEAT]]] (default 4096 4096 20); run from the top
# of the source tree (a C compiler with OpenMP, pkg-config's openblas, which the read's file
# links for sgemv; CC and CFLAGS are honoured).
set -eu
here=$(dirname "$0")
tmp=$(mktemp -d /tmp/stab_pass_ceiling.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
${CC:-cc} ${CFLAGS:--O2} -fopenmp -I"$here/../lib" -I"$here/../harness" -I"$here/../include" \
  "$here/pass_ceiling.c" "$here/../lib/engine/stored_rows.c" "$here/../lib/engine/pass_pool.c" "$here/../harness/clock.c" "$here/../bench/stream_read.c" -o "$tmp/pass_ceiling" \
  $(pkg-config --cflags --libs openblas) -lm -lpthread
echo "pass_ceiling.sh: load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$tmp/pass_ceiling" "$@"
