#!/bin/sh
# Runs the spectral and layer-metric tests once with each pass kernel this processor has
# besides the default (the plain run of those tests covers the default), so that every
# build of the kernel is checked against LAPACK, not only the fastest.
set -u
status=0
for k in avx2 generic; do
  if [ "$k" = avx2 ] && ! grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
    echo "kernel $k: not supported by this processor, skipped"
    continue
  fi
  for t in tests/check_spectral tests/check_layer_metrics; do
    echo "== STAB_KERNEL=$k $t"
    STAB_KERNEL=$k ./$t || status=1
  done
done
exit $status
