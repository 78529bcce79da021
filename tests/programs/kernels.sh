#!/bin/sh
# Runs the pass, spectral and layer-metric tests (f32, and 16-bit: tests/unit/check_layer_dtype) once with
# each pass kernel this processor has besides the default (the plain run of those tests covers
# the default), so that every
# build of the kernel is checked against LAPACK, not only the fastest; and that the kernel
# benchmark bench/pass_ceiling.sh still builds and runs.
set -u
# The tarball's distcheck run (STAB_DISTCHECK, quickstart.sh test) builds the same kernels from
# the same sources as the plain build, which runs this: it leaves this out.
if [ -n "${STAB_DISTCHECK:-}" ]; then
  echo "SKIP: the other kernels run in the plain build (STAB_DISTCHECK is set)"
  exit 77
fi
# The sanitizer build (STAB_SANITIZED, make check-sanitize) runs the kernels' own test alone with
# each kernel: what ASan and UBSan can catch in a kernel (a read past a row, a misaligned load)
# check_gram_pass reaches on every edge shape; the spectral and layer-metric tests on top of
# each kernel check numbers, which the plain build does, and made this the sanitizer run's
# longest test by far (325 s of the 1150 s its tests took one at a time, on a busy machine).
tests="tests/unit/check_gram_pass tests/unit/check_spectral tests/unit/check_layer_metrics tests/unit/check_layer_dtype"
[ -n "${STAB_SANITIZED:-}" ] && tests=tests/unit/check_gram_pass
status=0
for k in avx2 generic; do
  if [ "$k" = avx2 ] && ! grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
    echo "kernel $k: not supported by this processor, skipped"
    continue
  fi
  for t in $tests; do
    echo "== STAB_KERNEL=$k $t"
    STAB_KERNEL=$k ./$t || status=1
  done
done

# bench/pass_ceiling.sh times the library's own kernels (linked from its internal build): it must still build
# against them and print its twelve rows (1 and 2 threads, 1, 2 and 4 vectors, f32 and f64).
# Tiny sizes: a check that it runs, not a timing.
echo "== bench/pass_ceiling.sh 64 64 1"
if out=$(sh "${srcdir:-.}/bench/pass_ceiling.sh" 64 64 1 2>&1); then
  rows=$(printf '%s\n' "$out" | grep -cE '^[12] +[124] +f(32|64) +[0-9.]+ GB/s')
  if [ "$rows" -ne 12 ]; then
    echo "pass_ceiling.sh printed $rows result rows, expected 12:"; printf '%s\n' "$out"; status=1
  fi
else
  echo "pass_ceiling.sh failed:"; printf '%s\n' "$out"; status=1
fi
exit $status
