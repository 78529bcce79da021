#!/bin/sh
# The probe's speed against the exact reference, as a ratio measured in one run of this script:
# harness/probe CHECKPOINT at its default tolerance (Lanczos) against --exact (LAPACK dgesvd of
# every layer, f64), run in turn REPEAT times (interleaved, so a burst of load elsewhere hits
# both alike), each keeping its fastest time, and the peak RSS of each. Also the largest
# difference between the two runs' sigmas, relative. Usage: bench/probe_speed.sh CHECKPOINT
# [REPEAT] [more probe options]; run from the top of a built tree. A GPT-2-124M-shaped file:
#   ./tests/support/st_gen /tmp/big gpt2-124m F32 && bench/probe_speed.sh /tmp/big.safetensors
#
# bench/probe_speed.sh --model tinyllama|llama7b [DIR]: a generated Llama-shaped model of random
# BF16 weights (tests/support/hf_gen: TinyLlama-1.1B's shapes, 2.2 GB, or Llama-2-7B's, 13.5 GB, in
# DIR, default /tmp/stabmeter-MODEL, written unless a complete one of that preset is there):
# probed once, as a directory when the probe takes one, else shard by shard (times summed,
# memory the largest), with its peak anonymous memory (RssAnon of /proc/PID/status, sampled
# every 50 ms: the mapped file's pages are not the probe's own) and how well its ETA line
# predicted the end; then LAPACK sgesdd (values only, f32: what scipy.linalg.svdvals runs) timed
# once per layer shape (bench/svd_baseline) and extrapolated to the model's layers, for the
# ratio. OPENBLAS_CORETYPE=SkylakeX for the baseline (this VM's OpenBLAS misdetects the CPU).
set -eu
if [ "${1:-}" = --model ]; then
  model=${2:-}
  case $model in
    tinyllama) d=2048 ff=5632 layers=22 heads=32 kv=4 ;;
    llama7b) d=4096 ff=11008 layers=32 heads=32 kv=32 ;;
    *) echo "usage: bench/probe_speed.sh --model tinyllama|llama7b [DIR]" >&2; exit 2 ;;
  esac
  dir=${3:-/tmp/stabmeter-$model}
  probe=./harness/probe
  [ -x "$probe" ] || { echo "probe_speed.sh: build first (./quickstart.sh test, or make)" >&2; exit 2; }
  make -s tests/support/hf_gen bench/svd_baseline >&2 || exit 1
  # a complete model (the index is written last) of this preset, else (re)generate it
  if [ -f "$dir/model.safetensors.index.json" ] && grep -q "\"hf_gen $model seed 1 shards 3\"" "$dir/config.json" 2>/dev/null; then
    echo "probe_speed.sh: reusing $dir" >&2
  else
    echo "probe_speed.sh: writing $model into $dir" >&2
    t0=$(date +%s.%N)
    ./tests/support/hf_gen "$dir" "$model" >&2 || exit 1
    echo "probe_speed.sh: written in $(echo "$(date +%s.%N) - $t0" | bc) s" >&2
  fi
  tmp=$(mktemp -d /tmp/stab_probe_speed.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  # run_sampled ERR CMD...: runs CMD (stdout to /dev/null, stderr to ERR) and prints
  # "seconds peak_rss_anon_kB exit_status"
  run_sampled() {
    err=$1
    shift
    t0=$(date +%s.%N)
    "$@" >/dev/null 2>"$err" &
    pid=$!
    peak=0
    while kill -0 "$pid" 2>/dev/null; do
      a=$(awk '/^RssAnon:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
      [ -n "$a" ] && [ "$a" -gt "$peak" ] && peak=$a
      sleep 0.05
    done
    rc=0
    wait "$pid" || rc=$?
    echo "$(echo "$(date +%s.%N) - $t0" | bc) $peak $rc"
  }
  load_start=$(cut -d' ' -f1 /proc/loadavg)
  # the directory itself when the probe reads one (issue 12, item 1), else its shards in turn
  if "$probe" "$dir" --quiet --filter 'model.norm*' >/dev/null 2>&1; then
    how="as a directory"
    set -- $(run_sampled "$tmp/err.0" "$probe" "$dir")
    secs=$1 peak=$2 rc=$3
    parts=1
  else
    how="shard by shard (the probe reads no directory yet)"
    secs=0 peak=0 rc=0 parts=0
    for shard in "$dir"/model-*-of-*.safetensors; do
      set -- $(run_sampled "$tmp/err.$parts" "$probe" "$shard" --heads "$heads")
      secs=$(echo "$secs + $1" | bc)
      [ "$2" -gt "$peak" ] && peak=$2
      [ "$3" -ne 0 ] && rc=$3
      parts=$((parts + 1))
    done
  fi
  [ "$rc" -eq 0 ] || { echo "probe_speed.sh: the probe failed (exit $rc):" >&2; cat "$tmp"/err.* >&2; exit 1; }
  load_probe=$(cut -d' ' -f1 /proc/loadavg)
  # ETA: each progress line's elapsed + ETA against the part's end ("N tensors in T s"), the
  # worst of the lines after the first 10% of the part (before that it has seen too little)
  eta_err=$(for f in "$tmp"/err.*; do
      awk '/, ETA [0-9]+ s$/ { n++; t[n] = $(NF - 4) + 0; e[n] = $(NF - 1) + 0 }
           / tensors in [0-9.]+ s$/ { T = $(NF - 1) + 0 }
           END { for (i = 1; i <= n; i++) if (T > 0 && t[i] >= 0.1 * T) { x = (t[i] + e[i] - T) / T; if (x < 0) x = -x; if (x > w) w = x; k++ }
                 if (k) printf "%d %.3f\n", k, w }' "$f"
    done | awk '{ n += $1; if ($2 > w) w = $2 } END { if (n) printf "%d lines, the worst %.0f%% off the end", n, 100 * w; else print "no progress line" }')
  # the baseline: one sgesdd per distinct shape, times the number of such layers (attention:
  # one head's q block and k block per query head and key head, as the probe measures them)
  dh=$((d / heads))
  set -- $(OPENBLAS_CORETYPE=SkylakeX ./bench/svd_baseline "${d}x${d}" "$((kv * dh))x${d}" "${ff}x${d}" "${d}x${ff}" "${dh}x${d}" | awk '{ print $3 }')
  t_dd=$1 t_kv=$2 t_up=$3 t_down=$4 t_head=$5
  load_end=$(cut -d' ' -f1 /proc/loadavg)
  size=$(cat "$dir"/model-*-of-*.safetensors | wc -c)
  awk -v m="$model" -v dir="$dir" -v sz="$size" -v how="$how" -v s="$secs" -v pk="$peak" -v eta="$eta_err" \
      -v L="$layers" -v h="$heads" -v kv="$kv" -v d="$d" -v ff="$ff" -v dh="$dh" \
      -v tdd="$t_dd" -v tkv="$t_kv" -v tup="$t_up" -v tdown="$t_down" -v thead="$t_head" \
      -v l0="$load_start" -v l1="$load_probe" -v l2="$load_end" 'BEGIN {
    base = L * (2 * tdd + 2 * tkv + 2 * tup + tdown + (h + kv) * thead)
    printf "%s (%s, %.2f GB of BF16 in 3 shards), probed %s\n", m, dir, sz / 1e9, how
    printf "probe: %.1f s (goal < 300 s); peak RssAnon %.0f MB (limit 400 MB); ETA lines: %s\n", s, pk / 1024, eta
    printf "baseline, LAPACK sgesdd values only (f32, OpenBLAS): %dx%d %.2f s, %dx%d %.2f s, %dx%d %.2f s, %dx%d %.2f s, %dx%d %.3f s\n",
      d, d, tdd, kv * dh, d, tkv, ff, d, tup, d, ff, tdown, dh, d, thead
    printf "  extrapolated: %d blocks x (2 + 2 + 2 + 1 linears, %d + %d head blocks) = %.0f s (embedding, head and gains: no SVD, counted 0)\n", L, h, kv, base
    printf "ratio baseline / probe: %.1f (goal >= 30)\n", base / s
    printf "load average: %s at the start, %s after the probe, %s after the baseline (2 cores)\n", l0, l1, l2
  }'
  exit 0
fi
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
