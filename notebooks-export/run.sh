#!/bin/sh
# run.sh — runs run_notebooks.py (see it for the arguments) with a python3 that has what the
# notebooks need; `make notebooks` and tests/programs/notebooks.sh both come through here. With
# --which-python it only prints that python3. Exit 77, naming the Debian packages to install,
# when no python3 has them (pyenv's or a venv's python3 may come first on PATH; Debian's
# /usr/bin/python3 is tried last).
here=$(dirname "$0")
need='import h5py, numpy, matplotlib, nbformat, nbconvert, ipykernel'
for c in "${PYTHON:-python3}" python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c "$need" 2>/dev/null; then
    if [ "${1:-}" = --which-python ]; then
      command -v "$c"
      exit 0
    fi
    exec "$c" "$here/run_notebooks.py" "$@"
  fi
done
echo "notebooks: no python3 can import h5py, numpy, matplotlib, nbformat, nbconvert and ipykernel" >&2
echo "  (Debian: apt-get install python3-h5py python3-numpy python3-matplotlib python3-nbformat python3-nbconvert python3-ipykernel)" >&2
exit 77
