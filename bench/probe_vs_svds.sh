#!/bin/sh
# The whole probe of a TinyLlama-1.1B-shaped BF16 checkpoint against what a Python user would
# run instead, in one run: a loop of scipy.sparse.linalg.svds(W, k=1) over the same linear
# layers at each tolerance of a ladder, and a loop of numpy.linalg.svd(W, compute_uv=False), both
# on f32 copies; every sigma's actual error against an f64 SVD (cached beside the checkpoint).
# bench/probe_vs_svds.py does the work; this script finds Debian's python3 with scipy, builds
# what it needs and writes the checkpoint (tests/support/hf_gen, 2.2 GB) unless a complete one is there.
# Run from the top of a built tree; --help for the options.
set -eu
usage() {
  cat <<EOF
usage: bench/probe_vs_svds.sh [--dir DIR] [--fresh] [--no-full-svd] [--json FILE] [--ladder T1,T2,...]
  --dir DIR      the checkpoint directory (default /tmp/stabmeter-tinyllama, shared with
                 bench/probe_speed.sh --model tinyllama): any complete safetensors model there
                 is probed as it is, else tests/support/hf_gen writes the TinyLlama-shaped one (2.2 GB)
  --fresh        recompute the f64 reference SVDs (several minutes, run at nice 10)
  --no-full-svd  skip the full-SVD loop (the longest part, a few minutes)
  --json FILE    also write every figure to FILE
  --ladder LIST  svds tolerances (default 1e-1,3e-2,1e-2,3e-3,1e-3)
Prints the times, the ratios svds / probe and full SVD / probe, each method's worst actual
error, the probe's count of matrices whose actual error exceeds its reported one, and the load
average. Exit 0 when it ran (whatever the figures), 1 on a failure, 2 on bad usage.
EOF
}
dir=/tmp/stabmeter-tinyllama
set --  "$@" --end
opts= json= ladder=1e-1,3e-2,1e-2,3e-3,1e-3
while [ "$1" != --end ]; do
  case $1 in
    --help) usage; exit 0 ;;
    --dir) [ "$2" != --end ] || { usage >&2; exit 2; }; dir=$2; shift 2 ;;
    --fresh|--no-full-svd) opts="$opts $1"; shift ;;
    --json) [ "$2" != --end ] || { usage >&2; exit 2; }; json=$2; shift 2 ;;
    --ladder) [ "$2" != --end ] || { usage >&2; exit 2; }; ladder=$2; shift 2 ;;
    *) echo "probe_vs_svds.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
probe=./harness/probe
[ -x "$probe" ] || { echo "probe_vs_svds.sh: build first (./quickstart.sh test, or make)" >&2; exit 2; }
# Debian's python3 (python3-scipy), even when another python3 comes first on PATH
py=
for c in "${PYTHON:-python3}" /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import numpy, scipy.sparse.linalg' 2>/dev/null; then py=$c; break; fi
done
[ -n "$py" ] || { echo "probe_vs_svds.sh: no python3 imports numpy and scipy (Debian: apt-get install python3-scipy)" >&2; exit 1; }
# A complete checkpoint in DIR (a sharded one's index is written last, by hf_gen too) is probed
# as it is: the generated one, or any other (a real TinyLlama's download). Else DIR gets one.
if [ -f "$dir/model.safetensors.index.json" ] || [ -f "$dir/model.safetensors" ]; then
  echo "probe_vs_svds.sh: reusing $dir" >&2
else
  echo "probe_vs_svds.sh: writing a TinyLlama-shaped checkpoint, 2.2 GB, into $dir (--dir puts it elsewhere; remove it after)" >&2
  make -s tests/support/hf_gen >&2 || exit 1
  ./tests/support/hf_gen "$dir" tinyllama >&2 || exit 1
fi
# This VM's OpenBLAS misdetects the CPU (Prescott kernels): numpy's and scipy's products and
# LAPACK would run far below their speed, which would flatter the probe.
OPENBLAS_CORETYPE=SkylakeX
export OPENBLAS_CORETYPE
# shellcheck disable=SC2086 # opts holds flags meant to split
exec "$py" "$(dirname "$0")/probe_vs_svds.py" "$dir" --probe "$probe" --ladder "$ladder" ${json:+--json "$json"} $opts
