#!/bin/sh
# The probe's speed against the exact reference, as a ratio measured in one run of this script:
# harness/probe CHECKPOINT at its default tolerance (Lanczos) against --exact (LAPACK dgesvd of
# every layer, f64), run in turn REPEAT times (interleaved, so a burst of load elsewhere hits
# both alike), each keeping its fastest time, and the peak RSS of each. Also the largest
# difference between the two runs' sigmas, relative. Usage: bench/probe_speed.sh CHECKPOINT
# [REPEAT] [more probe options]; run from the top of a built tree. A GPT-2-124M-shaped file:
#   ./tests/st_gen /tmp/big gpt2-124m F32 && bench/probe_speed.sh /tmp/big.safetensors
set -eu
[ $# -ge 1 ] || { echo "usage: bench/probe_speed.sh CHECKPOINT [REPEAT] [PROBE OPTIONS]" >&2; exit 2; }
ckpt=$1
repeat=${2:-3}
[ $# -ge 2 ] && shift 2 || shift 1
probe=./harness/probe
[ -x "$probe" ] || { echo "probe_speed.sh: build first (./quickstart.sh test, or make)" >&2; exit 2; }
[ -r "$ckpt" ] || { echo "probe_speed.sh: cannot read $ckpt" >&2; exit 2; }
tmp=$(mktemp -d /tmp/stab_probe_speed.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
run() { # OUT [PROBE OPTIONS] -> "seconds max_rss_kb" (GNU time), the JSON report in OUT
  out=$1
  shift
  /usr/bin/time -f "%e %M" -o "$tmp/time" "$probe" "$ckpt" --json "$@" >"$out" 2>/dev/null
  cat "$tmp/time"
}
min() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == "" || b + 0 < a + 0) ? b : a }'; }
fast= exact= rss_fast= rss_exact=
# --exact's time depends on the load most (dgesvd on OpenBLAS's threads): 7.3 s idle, 10 s at
# a load of 1.4 on GPT-2-124M. The ratio means little without it, so it is printed.
load_start=$(cut -d' ' -f1 /proc/loadavg)
i=0
while [ $i -lt "$repeat" ]; do
  set -- $(run "$tmp/fast.json" "$@") "$@"
  fast=$(min "$fast" "$1") rss_fast=$2
  shift 2
  set -- $(run "$tmp/exact.json" --exact "$@") "$@"
  exact=$(min "$exact" "$1") rss_exact=$2
  shift 2
  i=$((i + 1))
  echo "probe_speed.sh: round $i of $repeat: fastest so far $fast s, $exact s" >&2
done
size=$(stat -c %s "$ckpt")
err=$(python3 - "$tmp/fast.json" "$tmp/exact.json" <<'PY'
import json, sys, math
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ref = {l["name"]: l.get("sigma") for l in b["layers"]}
worst = 0.0
for l in a["layers"]:
    s, r = l.get("sigma"), ref.get(l["name"])
    if isinstance(s, (int, float)) and isinstance(r, (int, float)) and r > 0:
        worst = max(worst, abs(s - r) / r)
print("%.2g" % worst)
PY
)
load_end=$(cut -d' ' -f1 /proc/loadavg)
awk -v c="$ckpt" -v sz="$size" -v r="$repeat" -v a="$fast" -v b="$exact" -v ra="$rss_fast" -v rb="$rss_exact" -v e="$err" \
    -v l0="$load_start" -v l1="$load_end" 'BEGIN {
  printf "%s (%.0f MB), fastest of %d: default %.2f s, --exact %.2f s (load average %s at the start, %s at the end)\n", c, sz / 1e6, r, a, b, l0, l1
  printf "speed ratio, exact / default: %.1f (target >= 10 for GPT-2-124M-shaped random weights)\n", b / a
  printf "peak RSS: default %.0f MB, --exact %.0f MB (file %.0f MB; limit file + 300 MB)\n", ra / 1e3, rb / 1e3, sz / 1e6
  printf "largest relative difference of a sigma from the exact one: %s\n", e
}'
