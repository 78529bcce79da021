#!/bin/sh
# python_api.sh — the Python package (python/stabmeter) over the library just built: sigma
# against LAPACK's SVD, layer_metrics and the kind rules against stabmeter-probe's report of the
# same tensors, the torch Monitor's trace against stabmeter-train's (its background mode's against
# its synchronous one's, bit for bit), read_trace against h5py
# and xarray reading the same traces, and bad inputs raising
# (tests/python/python_*.py, run by unittest in one interpreter). Skipped (exit 77) naming the Debian
# package when no python3 has numpy, torch and h5py. Under the sanitizers (STAB_SANITIZED) only
# the binding's argument checks run (python_args: numpy alone, where a read past an array is a
# report), in an interpreter with the sanitizer's runtime preloaded (Python itself is not
# instrumented; its own leaks are not ours, so leak detection is off there).
set -u
src=${srcdir:-.}
build=${builddir:-.}
. "$src/tests/python/python_pick.sh"
if [ -n "${STAB_SANITIZED:-}" ]; then
  py=$(pick_python numpy)
  [ -n "$py" ] || { echo "SKIP: numpy is not importable (Debian: apt-get install python3-numpy)"; exit 77; }
  asan=$(${CC:-gcc} -print-file-name=libasan.so)
  case $asan in /*) ;; *) echo "SKIP: no libasan.so from ${CC:-gcc} -print-file-name"; exit 77 ;; esac
  lib=$(built_library "$build") || exit 1
  src_abs=$(cd "$src" && pwd)
  build_abs=$(cd "$build" && pwd)
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/python_api.XXXXXX") || exit 1
  trap 'rm -rf "$tmp"' EXIT
  cd "$tmp" && LD_PRELOAD=$asan ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 \
    STABMETER_LIBRARY=$lib STAB_BUILD=$build_abs PYTHONPATH="$src_abs/python:$src_abs/tests/python:$src_abs/tests/support" \
    PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$py" -m unittest python_args
  exit
fi
py=$(pick_python numpy torch h5py)
if [ -z "$py" ]; then
  echo "SKIP: numpy, torch and h5py are not importable (Debian: apt-get install python3-numpy python3-torch python3-h5py)"
  exit 77
fi
lib=$(built_library "$build") || { echo "FAIL: no library to load"; exit 1; }
src_abs=$(cd "$src" && pwd)
build_abs=$(cd "$build" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/python_api.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
# One interpreter for every module (torch takes a second to import); no byte code in the
# source tree; one BLAS thread, as the C tests run.
cd "$tmp" && STABMETER_LIBRARY=$lib STAB_BUILD=$build_abs PYTHONPATH="$src_abs/python:$src_abs/tests/python:$src_abs/tests/support" \
  PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
  "$py" -m unittest python_sigma python_layer python_kinds python_errors python_args python_probe python_monitor python_read_trace python_models python_device python_background
