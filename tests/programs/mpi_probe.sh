#!/bin/sh
# mpi_probe.sh — stabmeter-probe under mpirun: its standard output on 2 and 3 ranks
# (oversubscribed: CI has 2 cores) byte for byte the single process's (run without mpirun, the
# reference), and every rank's exit status the single process's: GPT-2 and Llama safetensors, a
# Hugging Face directory of 3 shards, GGUF, llm.c (a tied head, a fused qkv), a GGUF file
# against the safetensors it was converted from; text and --json, with and without --prev, and
# the --hdf5 trace rank 0 writes; a NaN weight (flagged, exit 0), a truncated shard (exit 2, no
# report), a trace rank 0 cannot write (exit 1 everywhere), one rank alone unable to open its
# file. Then STAB_PROBE_SHOW_READS: the ranks read disjoint byte ranges whose union is the single
# process's, with every page of the other ranks' tensors made unreadable, so that a rank reading
# beyond its own would die. Every mpirun is bounded by timeout: a rank left waiting fails the
# test instead of hanging it. Skipped (77) without configure --with-mpi.
set -u
if [ -z "${MPIRUN:-}" ]; then
  echo "not configured --with-mpi: skipped"
  exit 77
fi
top=$(pwd)
src=${srcdir:-.}
probe=$top/harness/probe
gen=$top/tests/support/st_gen
hf=$top/tests/support/hf_gen
conv=$top/tests/support/gguf_convert
dir=$(mktemp -d "${TMPDIR:-/tmp}/mpi_probe.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
fails=0
checks=0
. "$src/tests/support/limit.sh" # pass, fail
# mpirun as root needs both; Open MPI's own files go to the scratch directory
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# one machine: shared memory alone (looking for UCX and network transports doubled each launch)
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
export TMPDIR="$dir"
if [ "${STAB_SANITIZED:-0}" = 1 ]; then # Open MPI's leaks at exit matched by library (tests/support/lsan.supp)
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
fi
# a hang ends in minutes even under the sanitizers (a run takes under a second plain)
limit=${STAB_MPI_TIMEOUT:-300}

# single NAME ARGS...: the reference, one process without mpirun: NAME.out, NAME.err, NAME.rc
single() {
  name=$1
  shift
  "$probe" "$@" >"$dir/$name.out" 2>"$dir/$name.err"
  echo $? >"$dir/$name.rc"
}

# ranks NP NAME ARGS...: mpirun -np NP, each rank's stdout, stderr and exit status in files of
# its own (a shell around each rank keeps its status), then the stderr of mpirun and of every
# rank, in rank order, in NAME.NP.err (through mpirun's forwarding, lines of ranks writing at
# once could be cut into each other on a busy machine). Then rank 0's stdout is the
# reference's byte for byte, every other rank's is empty, and every rank exits as the
# reference did.
ranks() {
  np=$1 name=$2
  shift 2
  out=$dir/$name.$np
  timeout -k 10 "$limit" "$MPIRUN" -np "$np" --oversubscribe sh -c \
    'r=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-x}}; "$@" >"$0.out.$r" 2>"$0.err.$r"; echo $? >"$0.rc.$r"' "$out" \
    "$probe" "$@" </dev/null 2>"$out.mpirun.err"
  rc=$?
  cat "$out.mpirun.err" "$out".err.[0-9]* >"$out.err" 2>/dev/null
  if [ $rc -ne 0 ]; then
    fail "$name on $np ranks: mpirun exited $rc$( [ $rc -ge 124 ] && echo ' (timed out: a rank waited forever?)')"
    sed 's/^/    /' "$out.err" | head -n 10
    return
  fi
  want=$(cat "$dir/$name.rc")
  r=0
  while [ $r -lt "$np" ]; do
    got=$(cat "$out.rc.$r" 2>/dev/null || echo none)
    if [ "$got" = "$want" ]; then pass; else fail "$name on $np ranks: rank $r exited $got, one process $want"; fi
    if [ $r -eq 0 ]; then
      if cmp -s "$dir/$name.out" "$out.out.0"; then pass; else
        fail "$name on $np ranks: rank 0's report differs from one process's"
        diff "$dir/$name.out" "$out.out.0" | head -n 10
      fi
    elif [ -s "$out.out.$r" ]; then
      fail "$name on $np ranks: rank $r printed on stdout"
    else
      pass
    fi
    r=$((r + 1))
  done
}

# ---- the checkpoints: the test suite's own generators, small ----------------------------
"$gen" "$dir/g" gpt2 F32 >/dev/null || exit 1        # g.safetensors, g.prev.safetensors
"$gen" "$dir/l" llama BF16 >/dev/null || exit 1      # untied head, grouped-query attention
"$gen" "$dir/c" llmc F32 >/dev/null || exit 1        # c.bin, c.prev.bin
"$gen" "$dir/u" gguf F16 >/dev/null || exit 1        # u.gguf, u.prev.gguf
"$gen" "$dir/nan" gpt2 F32 nan >/dev/null || exit 1
"$hf" "$dir/sh" tiny --shards 3 >/dev/null || exit 1
"$hf" "$dir/shprev" tiny --shards 3 --seed 7 >/dev/null || exit 1
"$conv" --make llama "$dir/x.safetensors" >/dev/null || exit 1
"$conv" "$dir/x.safetensors" "$dir/x.gguf" Q8_0 >/dev/null || exit 1
mkdir "$dir/cut" && cp "$dir"/sh/* "$dir/cut/" || exit 1
truncate -s -1000 "$dir/cut/model-00002-of-00003.safetensors" || exit 1

# ---- the same report, byte for byte, on every rank count ----------------------------------
single gpt2-prev --json "$dir/g.safetensors" --prev "$dir/g.prev.safetensors"
ranks 2 gpt2-prev --json "$dir/g.safetensors" --prev "$dir/g.prev.safetensors"
ranks 3 gpt2-prev --json "$dir/g.safetensors" --prev "$dir/g.prev.safetensors"
# with a trace, which rank 0 writes: the same trace as one process's, value for value
single llama --per-head --hdf5 "$dir/llama.1.h5" --step 5 "$dir/l.safetensors"
ranks 3 llama --per-head --hdf5 "$dir/llama.3.h5" --step 5 "$dir/l.safetensors"
"$top/harness/export" "$dir/llama.1.h5" >"$dir/llama.1.csv" 2>&1
"$top/harness/export" "$dir/llama.3.h5" >"$dir/llama.3.csv" 2>&1
if [ -s "$dir/llama.1.csv" ] && cmp -s "$dir/llama.1.csv" "$dir/llama.3.csv"; then pass; else
  fail "the trace written on 3 ranks differs from one process's (stabmeter-export of each)"
  diff "$dir/llama.1.csv" "$dir/llama.3.csv" | head -n 6
fi
single llmc "$dir/c.bin" --prev "$dir/c.prev.bin"
ranks 2 llmc "$dir/c.bin" --prev "$dir/c.prev.bin"
single gguf --json "$dir/u.gguf" --prev "$dir/u.prev.gguf"
ranks 3 gguf --json "$dir/u.gguf" --prev "$dir/u.prev.gguf"
single cross "$dir/x.gguf" --prev "$dir/x.safetensors" --sort sigma
ranks 2 cross "$dir/x.gguf" --prev "$dir/x.safetensors" --sort sigma
single sharded "$dir/sh"
ranks 2 sharded "$dir/sh"
# a NaN weight: the layer flagged, its metrics null, the report printed, exit 0
single nan --json "$dir/nan.safetensors"
if grep -q nonfinite_weight "$dir/nan.out" && [ "$(cat "$dir/nan.rc")" = 0 ]; then pass; else
  fail "the NaN checkpoint: one process does not flag it (exit $(cat "$dir/nan.rc"))"; fi
ranks 2 nan --json "$dir/nan.safetensors"
# a truncated shard: refused when its header is read, which every rank does: exit 2, no report
single cut "$dir/cut" --prev "$dir/shprev"
if [ "$(cat "$dir/cut.rc")" = 2 ] && [ ! -s "$dir/cut.out" ]; then pass; else
  fail "the truncated shard: one process exits $(cat "$dir/cut.rc") (want 2, no report)"; fi
ranks 3 cut "$dir/cut" --prev "$dir/shprev"
# rank 0 alone says why, once
if [ "$(grep -c 'is not a valid safetensors file' "$dir/cut.3.err")" = 1 ]; then pass; else
  fail "the truncated shard on 3 ranks: its message $(grep -c 'is not a valid safetensors file' "$dir/cut.3.err") times, want once"
  sed 's/^/    /' "$dir/cut.3.err" | head -n 10
fi

# a trace that cannot be written: rank 0 alone finds out, after the others are done, and its
# status is theirs
single trace --hdf5 "$dir/no/such/dir/t.h5" --step 3 "$dir/g.safetensors"
ranks 2 trace --hdf5 "$dir/no/such/dir/t.h5" --step 3 "$dir/g.safetensors"
# one rank alone cannot open the checkpoint (a path missing on one node of a cluster): every
# rank stops with that rank's status, rank 0 saying why, and nobody waits
single missing "$dir/none.safetensors"
timeout -k 10 "$limit" "$MPIRUN" -np 3 --oversubscribe sh -c \
  'r=$OMPI_COMM_WORLD_RANK; if [ "$r" = 1 ]; then c=$0/none.safetensors; else c=$0/g.safetensors; fi
   "$1" "$c" >"$0/missing.3.out.$r"; echo $? >"$0/missing.3.rc.$r"' "$dir" "$probe" </dev/null 2>"$dir/missing.3.err"
rc=$?
if [ $rc -ne 0 ]; then fail "one rank missing its checkpoint: mpirun exited $rc"; fi
for r in 0 1 2; do
  if [ "$(cat "$dir/missing.3.rc.$r" 2>/dev/null)" = "$(cat "$dir/missing.rc")" ]; then pass; else
    fail "one rank missing its checkpoint: rank $r exited $(cat "$dir/missing.3.rc.$r" 2>/dev/null), want $(cat "$dir/missing.rc")"; fi
done
if [ ! -s "$dir/missing.3.out.0" ] && grep -q 'none.safetensors: cannot open' "$dir/missing.3.err"; then pass; else
  fail "one rank missing its checkpoint: a report, or rank 0 did not say why"; sed 's/^/    /' "$dir/missing.3.err" | head; fi

# node-local copies of one model (the same path on every node), one of them stale: the ranks
# compare what they read before measuring, so every rank stops with exit 2 and rank 0 names the
# rank and its file; copies that are the same bytes give the single process's report
mkdir -p "$dir/node0" "$dir/node1" "$dir/node2"
cp "$dir/g.safetensors" "$dir/node0/g.safetensors" && cp "$dir/g.prev.safetensors" "$dir/node1/g.safetensors" &&
  cp "$dir/g.safetensors" "$dir/node2/g.safetensors" || exit 1
# copies NAME NODE_OF_RANK1: ranks 0 and 2 read node0's copy, rank 1 NODE_OF_RANK1's
copies() {
  timeout -k 10 "$limit" "$MPIRUN" -np 3 --oversubscribe sh -c \
    'r=$OMPI_COMM_WORLD_RANK; if [ "$r" = 1 ]; then c=$0/$2/g.safetensors; else c=$0/node0/g.safetensors; fi
     "$1" --quiet "$c" >"$0/$3.out.$r"; echo $? >"$0/$3.rc.$r"' "$dir" "$probe" "$2" "$1" </dev/null 2>"$dir/$1.err"
  [ $? -eq 0 ] || fail "$1: mpirun exited $?"
}
copies stale node1
for r in 0 1 2; do
  if [ "$(cat "$dir/stale.rc.$r" 2>/dev/null)" = 2 ]; then pass; else
    fail "a stale copy on rank 1: rank $r exited $(cat "$dir/stale.rc.$r" 2>/dev/null), want 2"; fi
done
if [ ! -s "$dir/stale.out.0" ] &&
  grep -q "^stabmeter-probe: $dir/node0/g.safetensors: rank 1 read other bytes than rank 0 (64-bit hash [0-9a-f]*, rank 0's [0-9a-f]*).*nothing measured" "$dir/stale.err"
then pass; else fail "a stale copy on rank 1: a report, or rank 0 did not name rank 1's file"; sed 's/^/    /' "$dir/stale.err" | head; fi
single same --quiet "$dir/node0/g.safetensors"
copies same node2
if [ "$(cat "$dir/same.rc.0" "$dir/same.rc.1" "$dir/same.rc.2" | tr -d '\n')" = 000 ] && cmp -s "$dir/same.out" "$dir/same.out.0"; then
  pass; else fail "copies of the same bytes: not the single process's report"; sed 's/^/    /' "$dir/same.err" | head; fi

# ---- which bytes each rank reads ------------------------------------------------------------
export STAB_PROBE_SHOW_READS=1
single reads "$dir/sh" --prev "$dir/shprev"
ranks 3 reads "$dir/sh" --prev "$dir/shprev"
unset STAB_PROBE_SHOW_READS
# The lines of one process are the reads of the whole model; on 3 ranks each line names its
# rank: the ranks' lines together are exactly the one process's, no two ranks read overlapping
# bytes of a file, every rank reads something, and every rank fenced off some of the others'
# bytes (so that its run above, with the same report, read none of them).
if command -v python3 >/dev/null 2>&1; then
  if python3 - "$dir/reads.err" "$dir/reads.3.err" <<'PY'; then pass; else fail "the ranks' reads (above)"; fi
import re, sys
line = re.compile(r"^stabmeter-probe: rank (\d+) of (\d+) reads (.*) bytes (\d+)-(\d+) \((.*)\)$")
fence = re.compile(r"^stabmeter-probe: rank (\d+) of 3 fenced (\d+) bytes")
def reads(path, np):
    got, fenced = [], {}
    for l in open(path):
        m = line.match(l.rstrip("\n"))
        if m:
            assert int(m.group(2)) == np, l
            got.append((int(m.group(1)), m.group(3), int(m.group(4)), int(m.group(5)), m.group(6)))
        m = fence.match(l)
        if m:
            fenced[int(m.group(1))] = int(m.group(2))
    return got, fenced
one, _ = reads(sys.argv[1], 1)
three, fenced = reads(sys.argv[2], 3)
whole = sorted(r[1:] for r in one)
bad = 0
if not whole:
    print("  one process printed no reads"); bad = 1
if sorted(r[1:] for r in three) != whole:
    print("  the 3 ranks together read other bytes than one process"); bad = 1
if sorted({r[0] for r in three}) != [0, 1, 2]:
    print("  not every rank reads:", sorted({r[0] for r in three})); bad = 1
if sorted(fenced) != [0, 1, 2] or not all(fenced.values()):
    print("  fenced bytes per rank:", fenced); bad = 1
for i, (r, f, a, b, n) in enumerate(three):
    for s, g, c, d, m in three[i + 1:]:
        if f == g and r != s and a < d and c < b:
            print("  ranks %d and %d both read %s bytes %d-%d (%s, %s)" % (r, s, f, max(a, c), min(b, d), n, m)); bad = 1
sys.exit(bad)
PY
fi

echo "mpi_probe.sh: $checks checks, $fails failed"
[ "$fails" -eq 0 ]
