#!/usr/bin/env bash
# quickstart.sh — from a fresh Debian 12 machine to results, in one command.
#   ./quickstart.sh [TRAIN OPTIONS]  install what is missing, build, train a small model for a
#                                    minute or two, writing runs/demo/trace.h5 and a checkpoint
#                                    (replacing the demo run an earlier quickstart left there)
#   ./quickstart.sh test             install what is missing, build, run every test
# Installing packages needs root (or sudo); everything else runs as any user.
set -euo pipefail
cd "$(dirname "$0")"

packages=(build-essential autoconf automake libtool autoconf-archive pkg-config
          liblapacke-dev libopenblas-dev libhdf5-dev hdf5-tools check python3-h5py
          clang libclang-rt-14-dev)
# harness/bench times ARPACK (dsaupd) as the anchor of the cold estimate.
packages+=(libarpack2-dev)
# The README's pandas and gnuplot snippets are run by the tests (tests/docs/readme_snippet.sh).
packages+=(python3-pandas gnuplot-nox)
# tests/programs/trace_readers.sh opens traces with xarray (both engines) and ncdump.
packages+=(python3-xarray python3-h5netcdf python3-netcdf4 netcdf-bin)
# the man pages, made from each program's --help (Makefile.am)
packages+=(help2man)
# notebooks-export/ (make notebooks, tests/programs/notebooks.sh)
packages+=(python3-numpy python3-matplotlib python3-nbformat python3-nbconvert python3-ipykernel)
# bench/probe_vs_svds.sh (the whole checkpoint against scipy's svds) and its test
packages+=(python3-scipy)
# the MPI layer (configure --with-mpi: libstabmeter_mpi) and its tests under mpirun (tests/programs/mpi.sh)
packages+=(libopenmpi-dev openmpi-bin)
# the Python package's tests (tests/python/python_api.sh: stabmeter.torch) and bench/torch_overhead.py
packages+=(python3-torch)

install_missing() {
  local missing=() p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "quickstart: installing ${missing[*]}" >&2
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "quickstart: need root to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

build() {
  [ -x configure ] || autoreconf -fi
  # the MPI layer too when MPI is here (Open MPI's mpicc, or its pkg-config file)
  local mpi=()
  if command -v mpicc >/dev/null || pkg-config --exists ompi-c 2>/dev/null; then mpi=(--with-mpi); fi
  # the Python package for Debian's python3, where another python3 (pyenv) may come first on PATH
  local python=()
  if [ -x /usr/bin/python3 ]; then python=(PYTHON=/usr/bin/python3); fi
  [ -f Makefile ] || ./configure "${mpi[@]}" "${python[@]}"
  make -j"$(nproc)"
}

# Sums Check's own summary lines ("100%: Checks: 12, Failures: 0, Errors: 0") over the test
# logs in $1/tests into $passed and $failed, and shows the log of anything that failed.
count_logs() {
  local log n f e
  passed=0 failed=0
  for log in "$1"/tests/*/*.log; do
    [ -f "$log" ] || continue
    while read -r n f e; do
      passed=$((passed + n - f - e)); failed=$((failed + f + e))
    done < <(sed -n 's/.*Checks: \([0-9]*\), Failures: \([0-9]*\), Errors: \([0-9]*\).*/\1 \2 \3/p' "$log")
    show_if_failed "$log"
  done
}

# A test's log, when its result file (automake's .trs: ":test-result: FAIL") says it failed;
# the log is remembered for the digest at the end.
failed_logs=()
show_if_failed() {
  if grep -q '^:test-result: \(FAIL\|ERROR\)' "${1%.log}.trs" 2>/dev/null; then
    echo "---- $1 ----"; cat "$1"
    failed_logs+=("$1")
  fi
}

# The failed checks of every failed test again, a few lines each, just above the closing
# lines: where only the end of the output is kept (a CI log's tail), what failed is still there.
digest() {
  [ ${#failed_logs[@]} -gt 0 ] || return 0
  local log
  echo "---- what failed ----"
  for log in "${failed_logs[@]}"; do
    echo "$log:"
    { grep -A4 -E '^(FAIL|not ok|[^ ]+:[0-9]+:[EF]:)' "$log" || tail -n 8 "$log"; } | head -n 16 | cut -c1-300
  done
}

# One closing line over both builds: the plain one, and the same tests built with
# AddressSanitizer and UndefinedBehaviorSanitizer (make check-sanitize, in sanitize/).
run_tests() {
  local rc=0 passed failed
  make -j"$(nproc)" check || rc=$?
  count_logs .
  [ $rc -eq 0 ] || { echo "make check failed (exit $rc)"; failed=$((failed > 0 ? failed : 1)); }
  if [ $rc -eq 0 ]; then
    # The tarball must build, install, uninstall and clean on its own, out of tree, and pass
    # the tests of what it installs and of the library's units (Makefile.am, distcheck_tests:
    # every test runs again on the distributed sources in the sanitizer build below).
    # A failed distcheck leaves its build in stabmeter-VERSION/_build/sub: show what failed
    # there before the sanitizer build's make distdir replaces that folder.
    if ! STAB_DISTCHECK=1 make -j"$(nproc)" distcheck TESTS="$(make -s distcheck-tests | tail -n 1)" >distcheck.log 2>&1; then
      tail -n 40 distcheck.log
      local log
      for log in stabmeter-*/_build/sub/tests/*/*.log; do [ -f "$log" ] && show_if_failed "$log"; done
      echo "make distcheck failed"; failed=$((failed + 1))
    fi
  fi
  local plain_passed=$passed plain_failed=$failed
  rc=0
  make -j"$(nproc)" check-sanitize >sanitize.log 2>&1 || rc=$?
  count_logs sanitize/build
  [ $rc -eq 0 ] || { tail -n 40 sanitize.log; echo "make check-sanitize failed (exit $rc)"; failed=$((failed > 0 ? failed : 1)); }
  digest
  echo "check: plain build $plain_passed passed, $plain_failed failed; ASan+UBSan build $passed passed, $failed failed"
  passed=$((plain_passed + passed)) failed=$((plain_failed + failed))
  echo "check: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

install_missing
case "${1:-}" in
  test) build; run_tests ;;
  *)
    build
    # The main job: a short training on the built-in corpus, every layer measured every step;
    # runs/demo is this script's own demo, so it replaces the last one (--replace, said above),
    # unless the options ask to resume it.
    replace=(--replace)
    for a in "$@"; do case "$a" in --resume|--resume=*|--replace) replace=() ;; esac; done
    ./harness/train --out runs/demo "${replace[@]}" "$@"
    echo "Look at it: h5ls -r runs/demo/trace.h5 | head, or in Python:"
    echo "  import h5py; f = h5py.File('runs/demo/trace.h5', 'r', swmr=True); print(f['layers/layer'].asstr()[:])"
    ;;
esac
