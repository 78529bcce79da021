#!/bin/sh
# run.sh — runs run_notebooks.py (see it for the arguments) with a python3 that has what the
# notebooks need; `make notebooks` and tests/programs/notebooks.sh both come through here. With
# --which-python it only prints that python3. Exit 77, naming the Debian packages to install,
# when no python3 has them (pyenv's or a venv's python3 may come first on PATH; Debian's
# /usr/bin/python3 is tried last).
here=$(dirname "$0")
# The notebooks read traces through the stabmeter package (python/stabmeter, over the library).
# Run from a build directory (make notebooks, make check), that is the source tree's package
# over the library built here (lib/.libs, the file lib/libstabmeter.la names), as
# tests/python/python_api.sh imports it; elsewhere, the installed package (or STABMETER_LIBRARY
# and PYTHONPATH as given).
if [ -z "${STABMETER_LIBRARY:-}" ] && [ -f lib/libstabmeter.la ]; then
  soname=$(sed -n "s/^dlname='\(.*\)'$/\1/p" lib/libstabmeter.la)
  if [ -n "$soname" ] && [ -f "lib/.libs/$soname" ]; then
    STABMETER_LIBRARY=$(pwd)/lib/.libs/$soname
    export STABMETER_LIBRARY
  fi
fi
if [ -n "${STABMETER_LIBRARY:-}" ]; then
  PYTHONPATH=$(cd "$here/../python" && pwd)${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONPATH
fi
need='import numpy, matplotlib, nbformat, nbconvert, ipykernel, stabmeter'
for c in "${PYTHON:-python3}" python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c "$need" 2>/dev/null; then
    if [ "${1:-}" = --which-python ]; then
      command -v "$c"
      exit 0
    fi
    exec "$c" "$here/run_notebooks.py" "$@"
  fi
done
echo "notebooks: no python3 can import numpy, matplotlib, nbformat, nbconvert, ipykernel and stabmeter" >&2
echo "  (Debian: apt-get install python3-numpy python3-matplotlib python3-nbformat python3-nbconvert python3-ipykernel;" >&2
echo "  stabmeter: make install, or run from the build directory)" >&2
exit 77
