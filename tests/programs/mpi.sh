#!/bin/sh
# The MPI layer (configure --with-mpi): libstabmeter itself free of MPI (ldd, nm), the MPI
# library exporting only stab_mpi_*, then tests/unit/mpi_sharded under mpirun on 2 ranks and on 3
# (oversubscribed: CI has 2 cores), and its batch cases once more under MPI_THREAD_SINGLE, each run bounded by timeout so that a rank left waiting
# fails the test instead of hanging it. Skipped (77) without MPI.
set -u
if [ -z "${MPIRUN:-}" ] || [ ! -x tests/unit/mpi_sharded ]; then
  echo "not configured --with-mpi: skipped"
  exit 77
fi
status=0
lib=lib/.libs/libstabmeter.so
mpilib=lib/.libs/libstabmeter_mpi.so
if ldd "$lib" | grep -E 'lib(mpi|open-pal|open-rte|pmix)'; then
  echo "FAIL: libstabmeter links MPI (above)"; status=1
fi
if nm -D --undefined-only "$lib" | grep -E ' (P?MPI_|ompi_)'; then
  echo "FAIL: libstabmeter needs MPI symbols (above)"; status=1
fi
extra=$(nm -D --defined-only "$mpilib" | awk '$2 == "T" && $3 !~ /^stab_mpi_/ { print $3 }')
if [ -n "$extra" ]; then
  echo "FAIL: libstabmeter_mpi exports more than stab_mpi_*: $extra"; status=1
fi
# mpirun as root needs both; Open MPI's own files go to a private directory
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
export TMPDIR="$tmp"
# Under the sanitizers (make check-sanitize): full stacks for every malloc, so that Open MPI's
# leaks at exit are matched by library name in tests/support/lsan.supp (see there)
if [ "${STAB_SANITIZED:-0}" = 1 ]; then
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
fi
# a hang ends in minutes even under the sanitizers (a run takes about a second plain)
limit=${STAB_MPI_TIMEOUT:-300}
for np in 2 3; do
  echo "== mpirun -np $np tests/unit/mpi_sharded"
  timeout -k 10 "$limit" "$MPIRUN" -np "$np" --oversubscribe ./tests/unit/mpi_sharded
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL: mpirun -np $np exited $rc$( [ $rc -ge 124 ] && echo ' (timed out: a rank waited forever?)')"
    status=1
  fi
done
# stab_mpi_linear_measure_batch under MPI_THREAD_SINGLE: its estimates in turn in the calling
# thread, the same bits as the single calls (its cases alone)
echo "== mpirun -np 2 tests/unit/mpi_sharded, MPI_THREAD_SINGLE, the batch's cases"
STAB_MPI_THREAD_SINGLE=1 timeout -k 10 "$limit" "$MPIRUN" -np 2 --oversubscribe -x STAB_MPI_THREAD_SINGLE ./tests/unit/mpi_sharded
rc=$?
if [ $rc -ne 0 ]; then
  echo "FAIL: mpirun -np 2 (MPI_THREAD_SINGLE) exited $rc$( [ $rc -ge 124 ] && echo ' (timed out: a rank waited forever?)')"
  status=1
fi
exit $status
