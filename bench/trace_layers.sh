#!/bin/sh
# What a trace costs per layer as layers grow: tests/support/trace_writer --bench opens a trace of L
# linear layers (32 x 32), appends STEPS rows (flushed every append) and closes it, for L = 1k,
# 5k and 20k in one run, and prints the open, append and close cost per layer, then each one's
# ratio to its value at 1k layers: about 1 when the cost is linear in layers, about 20 at 20k
# when it grows with the square. Usage: bench/trace_layers.sh [STEPS] [LAYERS...]; run from the
# top of a built tree.
set -eu
steps=${1:-4}
[ $# -ge 1 ] && shift
sizes=${*:-1000 5000 20000}
[ -f lib/libstabmeter.la ] || { echo "trace_layers.sh: build first (./quickstart.sh, or make)" >&2; exit 2; }
make -s tests/support/trace_writer >&2 || exit 1
tmp=$(mktemp -d /tmp/stab_trace_layers.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for n in $sizes; do
  ./tests/support/trace_writer --bench --layers "$n" --steps "$steps" --flush-every 1 "$tmp/t$n.h5" | tee -a "$tmp/lines"
  printf '  file: %s bytes\n' "$(stat -c %s "$tmp/t$n.h5")"
  rm -f "$tmp/t$n.h5"
done
# per layer: open, append, close, as ratios to the first size's
awk '{ for (i = 1; i <= NF; i++) { if ($i == "open" && $(i+2) == "us,") o = $(i+1);
                                   if ($i == "append" && $(i+2) == "us,") a = $(i+1);
                                   if ($i == "close" && $(i+2) == "us") c = $(i+1) }
       if (NR == 1) { o1 = o; a1 = a; c1 = c; n1 = $1 }
       printf "%6d layers: cost per layer over its cost at %d layers: open x%.2f, append x%.2f, close x%.2f\n",
              $1, n1, o / o1, a / a1, c / c1 }' "$tmp/lines"
