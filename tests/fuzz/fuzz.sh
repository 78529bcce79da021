#!/bin/sh
# fuzz.sh — the checkpoint readers and the library's trace reader under libFuzzer, as a make check
# test. Builds one target per reader (tests/fuzz/fuzz_NAME.c with lib/checkpoint/NAME.c compiled in,
# or for NAME = trace the library's trace reader lib/trace/read.c linked with HDF5, by clang with ASan and UBSan),
# replays its seeds and regression inputs, then fuzzes it for FUZZ_SECONDS. Exit 0 / 1, or 77
# (skipped) when clang or its libFuzzer runtime is missing.
#
# make check runs it for the readers listed in Makefile.am (fuzz_readers, passed as
# FUZZ_READERS). By hand, from the build directory, once make check has built the helpers:
#   tests/fuzz/fuzz.sh NAME...              (in a VPATH build: srcdir=SRC SRC/tests/fuzz/fuzz.sh NAME...)
# Environment:
#   FUZZ_SECONDS  fuzzing time per target after the replay (default 10; 0: replay only)
#   FUZZ_TRACE_SECONDS  the same for the trace reader's target (default 0: see below)
#   FUZZ_CORPUS   keep each target's grown corpus in FUZZ_CORPUS/NAME across runs (default: a
#                 temporary directory, so every run starts from the seeds)
#   FUZZ_RSS_MB   libFuzzer's -rss_limit_mb and -malloc_limit_mb (default 1024)
#   FUZZ_CC       the compiler (default clang)
# Crash inputs land in tests/fuzz-build/crashes/NAME/ (and are printed in base64, for CI logs);
# once the bug is fixed, the input goes into tests/fuzz/regressions/NAME/, replayed every run.
set -u

# The targets are built with ASan and UBSan whatever the build: the sanitizer build (make
# check-sanitize, STAB_SANITIZED) would only build and replay the same instrumented targets
# a second time, so it leaves them to the plain build's make check.
if [ -n "${STAB_SANITIZED:-}" ]; then
  echo "SKIP: the fuzz targets are sanitized in every build; the plain build's make check replays them"
  exit 77
fi

# The readers, one word each: NAME needs tests/fuzz/fuzz_NAME.c and lib/checkpoint/NAME.c (trace:
# lib/trace/read.c; FUZZ_HDF5_CFLAGS and FUZZ_HDF5_LIBS, from configure, say where HDF5 is).
readers=${*:-${FUZZ_READERS:-}}
[ -n "$readers" ] || { echo "usage: tests/fuzz/fuzz.sh NAME... (or FUZZ_READERS='NAME...'), e.g. safetensors llmc" >&2; exit 2; }
top=$(pwd)
src=${srcdir:-.}
seconds=${FUZZ_SECONDS:-10}
rss=${FUZZ_RSS_MB:-1024}
cc=${FUZZ_CC:-clang}
out=$top/tests/fuzz-build
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fuzz_sh.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out" || exit 1

# Instrumented for coverage (fuzzer), memory errors (address) and undefined behaviour that
# stops at the first report (undefined, no recovery).
flags="-g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' >"$tmp/probe.c"
if ! "$cc" $flags "$tmp/probe.c" -o "$tmp/probe" >"$tmp/probe.log" 2>&1; then
  echo "SKIP: '$cc -fsanitize=fuzzer' cannot build a fuzz target (on Debian: apt-get install clang libclang-rt-14-dev):"
  cat "$tmp/probe.log"
  exit 77
fi

# Valid seeds of every dtype: the smallest files (seed_gen) and the probe tests' models (st_gen).
seeds=$tmp/seeds
mkdir -p "$seeds" && "$top/tests/support/seed_gen" "$seeds" || { echo "FAIL: tests/support/seed_gen"; exit 1; }
for dt in F32 F16 BF16; do "$top/tests/support/st_gen" "$seeds/safetensors/gpt2_$dt" gpt2 $dt || exit 1; done
"$top/tests/support/st_gen" "$seeds/safetensors/llama_BF16" llama BF16 || exit 1
for dt in F32 BF16; do "$top/tests/support/st_gen" "$seeds/llmc/llmc_$dt" llmc $dt || exit 1; done
mkdir -p "$seeds/gguf" && for dt in F32 F16 BF16; do "$top/tests/support/st_gen" "$seeds/gguf/gguf_$dt" gguf $dt || exit 1; done
mkdir -p "$seeds/trace" && "$top/tests/support/trace_writer" --layers 1 --steps 1 "$seeds/trace/linear_1step.h5" >/dev/null &&
  "$top/tests/support/trace_writer" --steps 3 "$seeds/trace/every_kind_3steps.h5" >/dev/null || exit 1
rm -f "$seeds"/*/*.ref "$seeds"/*/*.prev.*

fails=0
for r in $readers; do
  exe=$out/fuzz_$r
  # the reader and what it needs from the library, compiled in with the target
  csrc="$src/tests/fuzz/fuzz_$r.c $src/tests/fuzz/fuzz_common.c $src/lib/core/status.c $src/lib/core/input_file.c
        $src/lib/checkpoint/convert.c $src/lib/engine/stored_rows.c $src/lib/checkpoint/gguf_dequant.c $src/lib/core/utf8.c $src/lib/core/mapped_file.c"
  hdrs="$src/tests/fuzz/fuzz.h $src/lib/core/core.h $src/include/stabmeter.h $src/include/stabmeter/*.h"
  extra=""
  if [ "$r" = trace ]; then
    # the library's trace reader, on the system's HDF5 (not instrumented: the reader's branches steer)
    csrc="$csrc $src/lib/trace/read.c $src/lib/trace/hdf5_util.c"
    hdrs="$hdrs $src/lib/trace/hdf5_lock.h $src/lib/trace/trace_internal.h"
    extra="-pthread ${FUZZ_HDF5_CFLAGS:-} ${FUZZ_HDF5_LIBS:--lhdf5}"
  elif [ "$r" = shard_index ]; then
    # the JSON files beside a Hugging Face checkpoint: a sharded model's index and config.json
    csrc="$csrc $src/lib/checkpoint/safetensors.c $src/lib/checkpoint/sniff.c $src/lib/core/json.c $src/lib/checkpoint/sharded.c
          $src/lib/checkpoint/hf_config.c"
  elif [ "$r" = safetensors ]; then
    # the header's strings are decoded by the JSON parser's string decoder
    csrc="$csrc $src/lib/checkpoint/safetensors.c $src/lib/core/json.c"
  elif [ "$r" = gguf_split ]; then
    # a split GGUF model's shards (llama.cpp's gguf-split), over the GGUF reader
    csrc="$csrc $src/lib/checkpoint/gguf.c $src/lib/checkpoint/gguf_split.c"
  else
    csrc="$csrc $src/lib/checkpoint/$r.c"
  fi
  # shellcheck disable=SC2086
  if [ ! -x "$exe" ] || [ -n "$(find $csrc $hdrs -newer "$exe")" ]; then
    "$cc" $flags -Wall -Wextra -I"$src/include" -I"$src/lib" $csrc $extra -lm -o "$exe" ||
      { echo "FAIL: $r: cannot build $exe"; fails=$((fails + 1)); continue; }
  fi
  # Every input that must keep passing: the seeds, the malformed-file corpus, past crashes.
  dirs=""
  for d in "$seeds/$r" "$src/tests/corpus/$r" "$src/tests/fuzz/regressions/$r"; do
    [ -d "$d" ] && dirs="$dirs $d"
  done
  files=$(find $dirs -type f | sort)
  nfiles=$(echo "$files" | grep -c .)
  [ "$nfiles" -gt 0 ] || { echo "FAIL: $r: no seeds (tests/support/seed_gen, tests/corpus/$r, tests/fuzz/regressions/$r)"; fails=$((fails + 1)); continue; }
  # -timeout: a hang guard per input, far above what any input takes under the sanitizers on a
  # busy machine (replay never depends on speed; fuzzing below keeps libFuzzer's 10 s, where a
  # slow input is a finding).
  # shellcheck disable=SC2086
  if ! "$exe" -rss_limit_mb="$rss" -malloc_limit_mb="$rss" -timeout=300 $files >"$tmp/replay_$r.log" 2>&1; then
    echo "FAIL: $r: replay of the seed and regression inputs:"
    tail -n 60 "$tmp/replay_$r.log"
    fails=$((fails + 1))
    continue
  fi
  msg="fuzz_$r: replayed $nfiles inputs"
  secs=$seconds
  # HDF5 1.10.8 itself crashes on mutated files within seconds (41 of 42 crashes in 40 s were
  # inside libhdf5, most freeing garbage while listing a group's links): a failure of HDF5's,
  # not of the reader, so the trace target only replays unless FUZZ_TRACE_SECONDS asks.
  [ "$r" = trace ] && secs=${FUZZ_TRACE_SECONDS:-0}
  if [ "$secs" -gt 0 ]; then
    # The first directory collects what the fuzzer finds; the others only seed it.
    work=${FUZZ_CORPUS:+$FUZZ_CORPUS/$r}
    work=${work:-$tmp/work_$r}
    crashes=$out/crashes/$r
    mkdir -p "$work" "$crashes" || exit 1
    # shellcheck disable=SC2086
    nice "$exe" -max_total_time="$secs" -rss_limit_mb="$rss" -malloc_limit_mb="$rss" -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$crashes/" "$work" $dirs >"$tmp/fuzz_$r.log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/fuzz_$r.log")
    cov=$(grep -o 'cov: [0-9]*' "$tmp/fuzz_$r.log" | tail -n 1 | sed 's/cov: //')
    if [ $rc -ne 0 ]; then
      echo "FAIL: $r: the fuzzer found an input that breaks the reader (exit $rc):"
      tail -n 60 "$tmp/fuzz_$r.log"
      for c in $(grep -o "$crashes/[^ ]*" "$tmp/fuzz_$r.log" | sort -u); do
        [ -f "$c" ] || continue
        echo "---- $c ($(wc -c <"$c") bytes), base64:"
        head -c 65536 "$c" | base64
      done
      fails=$((fails + 1))
      continue
    fi
    msg="$msg, fuzzed ${secs} s: ${runs:-?} runs, ${cov:-?} coverage points, $(find "$work" -type f | wc -l) inputs in the work corpus"
  fi
  echo "$msg"
done
echo "fuzz.sh: readers: $readers; $fails failed"
[ $fails -eq 0 ]
