#!/bin/sh
# stabmeter-train --data-parallel under mpirun (configure --with-mpi) against the same run in one
# process: the loss and every metric of the trace on 2 ranks (AdamW) and on 3 (steepest, untied,
# biases; the batch of 8 split 3, 3, 2: the uneven split's weights), the same weights on every
# rank, rank 0 alone writing --out and printing progress, run_config's layout,
# stabmeter-export reading the trace, and failures (a bad option on one rank, an --out rank 0
# cannot create, several ranks without --data-parallel) ending every rank without a hang: each
# mpirun is bounded by timeout. Skipped (77) without MPI.
set -u
if [ -z "${MPIRUN:-}" ] || [ ! -x harness/train ]; then
  echo "not configured --with-mpi: skipped"
  exit 77
fi
train=./harness/train
export=./harness/export
status=0
fail() { echo "FAIL: $*"; status=1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# when a rank exits non-zero mpirun ends the others, waiting a second for each to go; ours
# have gone already (they finalise and exit together), so the wait is skipped
export OMPI_MCA_odls_base_sigkill_timeout=0
# one BLAS thread: each rank's sgemm sums in one fixed order (the ranks share 2 cores anyway)
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d /tmp/check_mpi_train.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
export TMPDIR="$tmp"
if [ "${STAB_SANITIZED:-0}" = 1 ]; then # as tests/programs/mpi.sh: Open MPI's leaks matched in lsan.supp
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
fi
limit=${STAB_MPI_TIMEOUT:-300} # a run takes about a second plain; a hang ends in minutes
# mpirun_ NP OUT ERR ARGS...: the trainer on NP ranks; its exit status in $got
mpirun_() {
  np=$1 out=$2 err=$3; shift 3
  timeout -k 10 "$limit" "$MPIRUN" -np "$np" --oversubscribe "$@" >"$out" 2>"$err"
  got=$?
  [ $got -lt 124 ] || fail "mpirun -np $np $*: timed out (exit $got): a rank waited forever?"
}

small="--width 32 --depth 1 --heads 2 --context 16 --batch 8 --corpus-bytes 65536 --steps 6"
# on 2 ranks AdamW with a tied head; on 3 steepest (Muon by Newton-Schulz: sgemm on every rank)
# with an untied head and biases
opts2="$small"
opts3="$small --optimizer steepest --untied --biases"
for np in 2 3; do
  eval "opts=\$opts$np"
  one="$tmp/one$np"
  $train $opts --out "$one" >"$one.out" 2>"$one.err" || { fail "one process ($opts): exit $?"; cat "$one.err"; }
  $export "$one/trace.h5" >"$one.csv" || fail "export of the one-process trace: exit $?"
done

# The tolerances. Every rank's gradient is its rows' sum; their sum in rank order differs from
# one process's sgemm over all rows in the order of the additions only, about 1e-7 of the
# weights after these 6 steps (measured: at most 1.5e-7 relative in any weight metric, 5.7e-8
# in the loss, 9e-7 in an update's; the same with steepest). 1e-5 relative is that with a margin of 60, and far below what a lost or misweighted
# rank does (1e-3 and more). Update metrics are differences of f32 weights, W' - W, whose
# rounding (6e-8 of W) is 6e-8 / rel_update of the update: they get 1e-6 / rel_update more.
# sigma's estimates may differ by their reported errors besides.
compare() { # compare NAME ONE.csv MANY.csv: MANY read twice, its errors first
  awk -F, -v name="$1" '
    FNR == 1 { pass++; next }
    pass == 1 { v[$1 "," $2 "," $4] = $5; if ($4 == "rel_update") ru[$1 "," $2] = $5; n1++; next }
    pass == 2 { err[$1 "," $2 "," $4] = $5; next }
    { n2++; k = $1 "," $2 "," $4; a = v[k]; b = $5; m = $4 }
    m == "wall_time" || m == "passes" || m == "update_passes" || m ~ /_rel_err$/ { next }
    !(k in v) { print name ": " k " is not in the one-process trace"; bad++; next }
    a == "nan" || b == "nan" || m == "flags" {
      if (a != b) { print name ": " k " is " b ", one process " a; bad++ }
      next
    }
    {
      tol = 1e-5
      if (m ~ /update/ && ru[$1 "," $2] > 0) tol += 1e-6 / ru[$1 "," $2]
      # a ratio to the first measured step: the errors of the value and of the reference
      if (m ~ /_ratio$/) tol *= 2
      if (m == "sigma" || m == "sigma_update") {
        e = m "_rel_err"; tol += v[$1 "," $2 "," e] + err[$1 "," $2 "," e]
      }
      d = a - b; if (d < 0) d = -d; s = a < 0 ? -a : a
      if (d > tol * s + 1e-30) { printf "%s: %s is %s, one process %s (relative %.3g > %.3g)\n", name, k, b, a, d / s, tol; bad++ }
    }
    END {
      if (n2 != n1) { print name ": " n2 " values, one process " n1; bad++ }
      exit bad > 0
    }' "$2" "$3" "$3" || fail "$1: the trace differs from the one-process trace (above)"
}
loss_of() { sed -n 's/^loss: initial \([0-9.]*\), final \([0-9.]*\).*held-out \([0-9.]*\) .*/\1 \2 \3/p' "$1"; }
# same_losses A B: initial, final and held-out, printed to 4 decimals, within one unit of the
# last (the values differ by some 1e-7: their printed digits may still round apart)
same_losses() {
  echo "$(loss_of "$1") $(loss_of "$2")" |
    awk 'NF != 6 { exit 1 } { for (i = 1; i <= 3; i++) { d = $i - $(i + 3); if (d > 1.5e-4 || d < -1.5e-4) exit 1 } }'
}
for np in 2 3; do
  eval "opts=\$opts$np"
  run="$tmp/p$np" one="$tmp/one$np"
  mpirun_ $np "$run.out" "$run.err" $train $opts --data-parallel --out "$run"
  [ $got -eq 0 ] || { fail "-np $np: exit $got"; cat "$run.err"; continue; }
  same_losses "$run.out" "$one.out" ||
    fail "-np $np: losses (initial, final, held-out) $(loss_of "$run.out"), one process $(loss_of "$one.out")"
  grep -q "^data parallel: $np ranks, the same weights on every rank" "$run.out" ||
    fail "-np $np: the weights are not the same on every rank: $(cat "$run.out" "$run.err" | grep -i 'data parallel\|weights')"
  $export "$run/trace.h5" >"$run.csv" || fail "-np $np: stabmeter-export cannot read the trace (exit $?)"
  compare "-np $np" "$one.csv" "$run.csv"
  h5dump -a /run_config "$run/trace.h5" 2>/dev/null | grep -q "\"ranks\": $np, \"data_parallel\": $np, \"tensor_parallel\": 1" ||
    fail "-np $np: run_config has not the layout: $(h5dump -a /run_config "$run/trace.h5" 2>&1 | grep -o '"ranks.*')"
  # rank 0 alone writes --out: the files of one process, nothing else
  [ "$(ls "$run")" = "$(ls "$one")" ] || fail "-np $np: --out holds $(ls "$run" | tr '\n' ' '), one process $(ls "$one" | tr '\n' ' ')"
  # rank 0 speaks for all: one progress line per step, not one per rank
  [ "$(grep -c '^step 6/6 ' "$run.err")" = 1 ] || fail "-np $np: $(grep -c '^step 6/6 ' "$run.err") last progress lines, want 1"
done
h5dump -a /run_config "$tmp/one2/trace.h5" 2>/dev/null | grep -q '"ranks": 1, "data_parallel": 1, "tensor_parallel": 1' ||
  fail "one process: run_config has not the layout 1, 1, 1"

# A bad option on rank 1 only (an MPMD launch): every rank stops with 2, rank 0 saying why.
mpirun_ 1 "$tmp/bad.out" "$tmp/bad.err" $train $small --data-parallel : -np 1 $train $small --data-parallel --bogus
[ $got -eq 2 ] || fail "a bad option on rank 1: exit $got, want 2"
grep -q "^\[rank 1\] stabmeter-train: unknown option '--bogus'" "$tmp/bad.err" ||
  fail "a bad option on rank 1: rank 0 does not say it: $(cat "$tmp/bad.err")"
# Another option on rank 1 only: it would train another model.
mpirun_ 1 "$tmp/other.out" "$tmp/other.err" $train $small --data-parallel : -np 1 $train $small --data-parallel --seed 2
[ $got -eq 2 ] || fail "other options on rank 1: exit $got, want 2"
grep -q "rank 1 was given other options than rank 0" "$tmp/other.err" || fail "other options on rank 1: $(cat "$tmp/other.err")"
# --resume from each node's own copy of the checkpoint (the same path, other bytes on rank 1):
# the ranks compare what they loaded before the first step, every rank stops with 2, rank 0
# names the file and rank 1, and nothing is trained; the same bytes everywhere resume.
# (the stale copy: the same run's model four steps in, so its settings agree and only its bytes differ)
$train ${small% --steps 6} --steps 4 --metrics-every 0 --out "$tmp/stale4" >/dev/null 2>&1 || fail "a run of 4 steps: exit $?"
mkdir -p "$tmp/node0" "$tmp/node1"
resume_opts="--width 32 --depth 1 --heads 2 --context 16 --batch 8 --corpus-bytes 65536 --steps 8 --data-parallel"
resume_on() { # NAME RANK1_CHECKPOINT: rank 0 resumes node0's copy of one2's model, rank 1 node1's
  cp "$tmp/one2/model.safetensors" "$tmp/node0/ck.safetensors" && cp "$2" "$tmp/node1/ck.safetensors" || exit 1
  rm -rf "$tmp/node0/out" "$tmp/node1/out"
  mpirun_ 2 "$tmp/$1.out" "$tmp/$1.err" sh -c 'cd "$0/node$OMPI_COMM_WORLD_RANK" && exec "$@"' "$tmp" \
    "$(cd "$(dirname "$train")" && pwd)/$(basename "$train")" $resume_opts --resume ck.safetensors --out out
}
resume_on stale "$tmp/stale4/model.safetensors"
[ $got -eq 2 ] || fail "--resume from a stale copy on rank 1: exit $got, want 2"
grep -q "cannot resume: ck.safetensors ([a-z ]*): rank 1 read other bytes than rank 0 .*nothing trained" "$tmp/stale.err" ||
  fail "--resume from a stale copy on rank 1: $(cat "$tmp/stale.err")"
grep -q "^step " "$tmp/stale.err" && fail "--resume from a stale copy on rank 1: steps were trained"
resume_on same "$tmp/one2/model.safetensors"
[ $got -eq 0 ] || fail "--resume from copies of the same bytes: exit $got: $(cat "$tmp/same.err")"
grep -q "^data parallel: 2 ranks, the same weights on every rank" "$tmp/same.out" ||
  fail "--resume from copies of the same bytes: $(cat "$tmp/same.out" "$tmp/same.err")"
# An --out that rank 0 alone finds it cannot create (a name too long: the check before the
# run lets it through, mkdir fails): every rank stops with 1, nobody waits for rank 0.
long=$(printf '%0300d' 0)
mpirun_ 2 "$tmp/long.out" "$tmp/long.err" $train $small --data-parallel --out "$tmp/$long/run"
[ $got -eq 1 ] || fail "an --out that cannot be created: exit $got, want 1"
grep -q "cannot create the directory .*$long/run: File name too long" "$tmp/long.err" ||
  fail "an --out that cannot be created: the message: $(cat "$tmp/long.err")"
# Several ranks without --data-parallel would each train the same model into the same files.
mpirun_ 2 "$tmp/nodp.out" "$tmp/nodp.err" $train $small
[ $got -eq 2 ] || fail "-np 2 without --data-parallel: exit $got, want 2"
grep -q "started on 2 ranks: --data-parallel" "$tmp/nodp.err" || fail "-np 2 without --data-parallel: $(cat "$tmp/nodp.err")"
# --tensor-parallel 2 against one process: 2 blocks of 4 heads (2 on each rank), biases (the
# column-parallel layers' bias entries split, the row-parallel ones' replicated), an untied head,
# and a checkpoint at step 3, which a second split run resumes from. The tolerances are those of
# --data-parallel above: the split sums each row-parallel product in two halves and the input
# gradients of the column-parallel ones in two, which moves the activations by their f32 rounding
# (measured: at most 1e-5 of any metric after the updates' allowance, 2e-6 of a weight). (With
# a tied head and 2 blocks it is up to 2.6e-5 in a trace and the same in one data-parallel run:
# AdamW's first steps divide each gradient element by its own size, so elements that are mostly
# rounding carry it into the weights at lr's scale.)
# --alarm 1.2: rank 0 alone checks the alarms, from the layers the ranks measured together, as
# one process does (each layer's reference is its first measurement wherever it was measured).
tpopts="--width 32 --depth 2 --heads 4 --context 16 --batch 8 --corpus-bytes 65536 --steps 6 --biases --untied --checkpoint-every 3 --alarm 1.2"
one="$tmp/onetp" run="$tmp/tp"
$train $tpopts --out "$one" >"$one.out" 2>"$one.err" || { fail "one process ($tpopts): exit $?"; cat "$one.err"; }
$export "$one/trace.h5" >"$one.csv" || fail "export of the one-process trace ($tpopts): exit $?"
# f32s_differ A B: 0 when files A and B have the same safetensors header and every float after it
# within 1e-4 of the largest |float| of A. Measured: 4e-5 in the weights (the k biases: their
# gradient is 0 but for rounding, and AdamW scales that rounding up to lr's size), 8e-6 in the
# moments; a slice in the wrong place moves floats by the weights' size, 2e-2 of the largest.
f32s_differ() {
  na=$(od -An -tu8 -N8 "$1" | tr -d ' ') nb=$(od -An -tu8 -N8 "$2" | tr -d ' ')
  [ -n "$na" ] && [ "$na" = "$nb" ] || { echo "header lengths $na and $nb"; return 1; }
  head -c $((8 + na)) "$1" >"$tmp/ha"
  head -c $((8 + nb)) "$2" >"$tmp/hb"
  cmp -s "$tmp/ha" "$tmp/hb" || { echo "the headers differ"; return 1; }
  od -An -v -tf4 -w4 -j $((8 + na)) "$1" >"$tmp/fa"
  od -An -v -tf4 -w4 -j $((8 + nb)) "$2" >"$tmp/fb"
  paste "$tmp/fa" "$tmp/fb" | awk '
    { a[NR] = $1; b[NR] = $2; s = $1 < 0 ? -$1 : $1; if (s > mx) mx = s }
    END {
      for (i = 1; i <= NR; i++) {
        d = a[i] - b[i]; if (d < 0) d = -d
        if (d > 1e-4 * mx) { if (bad++ < 3) printf "float %d: %s, one process %s\n", i - 1, b[i], a[i] }
      }
      if (!NR) print "no data"
      exit !NR || bad > 0
    }'
}
mpirun_ 2 "$run.out" "$run.err" $train $tpopts --tensor-parallel 2 --out "$run"
if [ $got -ne 0 ]; then
  fail "--tensor-parallel 2: exit $got"; cat "$run.err"
else
  same_losses "$run.out" "$one.out" ||
    fail "--tensor-parallel 2: losses (initial, final, held-out) $(loss_of "$run.out"), one process $(loss_of "$one.out")"
  grep -q "^tensor parallel: 2 ranks, the replicated weights the same on every rank" "$run.out" ||
    fail "--tensor-parallel 2: the replicated weights are not the same on every rank: $(grep -i 'parallel\|weights' "$run.out" "$run.err")"
  $export "$run/trace.h5" >"$run.csv" || fail "--tensor-parallel 2: stabmeter-export cannot read the trace (exit $?)"
  compare "--tensor-parallel 2" "$one.csv" "$run.csv"
  h5dump -a /run_config "$run/trace.h5" 2>/dev/null | grep -q '"ranks": 2, "data_parallel": 1, "tensor_parallel": 2' ||
    fail "--tensor-parallel 2: run_config has not the layout: $(h5dump -a /run_config "$run/trace.h5" 2>&1 | grep -o '"ranks.*')"
  # every attribute of the file (the layers' names, kinds, shapes, parameter counts, which
  # share storage) as one process writes it, but the creation time and run_config
  attrs() { h5dump -A "$1" 2>&1 | sed -e 1d -e '/"[0-9]\{4\}-[0-9][0-9]-[0-9][0-9]T[0-9:]*Z"/d' -e '/"program": "stabmeter train"/d'; }
  attrs "$run/trace.h5" >"$tmp/attrs_tp"
  attrs "$one/trace.h5" >"$tmp/attrs_one"
  cmp -s "$tmp/attrs_tp" "$tmp/attrs_one" && [ -s "$tmp/attrs_one" ] ||
    fail "--tensor-parallel 2: the trace's attributes differ from one process's: $(diff "$tmp/attrs_one" "$tmp/attrs_tp" | head -5)"
  [ "$(ls "$run")" = "$(ls "$one")" ] || fail "--tensor-parallel 2: --out holds $(ls "$run" | tr '\n' ' '), one process $(ls "$one" | tr '\n' ' ')"
  [ "$(grep -c '^step 6/6 ' "$run.err")" = 1 ] || fail "--tensor-parallel 2: $(grep -c '^step 6/6 ' "$run.err") last progress lines, want 1"
  alarms() { sed -n 's/^.*\(alarm at step [0-9]*: [^ ]*\).*/\1/p' "$1"; }
  [ -n "$(alarms "$one.err")" ] && [ "$(alarms "$run.err")" = "$(alarms "$one.err")" ] ||
    fail "--tensor-parallel 2: alarms $(alarms "$run.err" | tr '\n' ';'), one process $(alarms "$one.err" | tr '\n' ';')"
  # the checkpoints rank 0 gathers: the whole model, as one process writes it
  for f in step-000003.safetensors step-000003.adamw model.safetensors model.adamw; do
    why=$(f32s_differ "$one/$f" "$run/$f") || fail "--tensor-parallel 2: $f differs from one process's: $why"
  done
  # a split run resumed from its step-3 checkpoint ends where the whole run does
  res="$tmp/tpres"
  mpirun_ 2 "$res.out" "$res.err" $train $tpopts --tensor-parallel 2 --metrics-every 0 --resume "$run/step-000003.safetensors" --out "$res"
  [ $got -eq 0 ] || { fail "--tensor-parallel 2 --resume: exit $got"; cat "$res.err"; }
  grep -q "resuming from .*step-000003.safetensors at step 3 with its AdamW moments" "$res.err" ||
    fail "--tensor-parallel 2 --resume: $(grep resum "$res.err")"
  for f in model.safetensors model.adamw; do
    why=$(f32s_differ "$one/$f" "$res/$f") || fail "--tensor-parallel 2 --resume: $f differs from one process's: $why"
  done
fi
# the split model with the attention scale 1/d_h: the same losses and weights as one process
sc="$tmp/onesc" tsc="$tmp/tpsc" scopts="$tpopts --steps 3 --checkpoint-every 0 --metrics-every 0 --attn-scale inverse"
$train $scopts --out "$sc" >"$sc.out" 2>"$sc.err" || { fail "one process ($scopts): exit $?"; cat "$sc.err"; }
mpirun_ 2 "$tsc.out" "$tsc.err" $train $scopts --tensor-parallel 2 --out "$tsc"
if [ $got -ne 0 ]; then
  fail "--tensor-parallel 2 --attn-scale inverse: exit $got"; cat "$tsc.err"
else
  same_losses "$tsc.out" "$sc.out" ||
    fail "--tensor-parallel 2 --attn-scale inverse: losses $(loss_of "$tsc.out"), one process $(loss_of "$sc.out")"
  why=$(f32s_differ "$sc/model.safetensors" "$tsc/model.safetensors") ||
    fail "--tensor-parallel 2 --attn-scale inverse: model.safetensors differs from one process's: $why"
fi
# refusals, on every rank with 2 and without a hang: heads not divisible, another world size,
# with --data-parallel; steepest (Muon needs the whole gradient) in one process, before MPI
mpirun_ 2 "$tmp/tph.out" "$tmp/tph.err" $train $small --heads 1 --tensor-parallel 2
[ $got -eq 2 ] || fail "--tensor-parallel 2 --heads 1: exit $got, want 2"
grep -q "tensor-parallel 2 does not divide --heads 1" "$tmp/tph.err" || fail "--tensor-parallel 2 --heads 1: $(cat "$tmp/tph.err")"
mpirun_ 2 "$tmp/tp3.out" "$tmp/tp3.err" $train $small --width 48 --heads 6 --tensor-parallel 3
[ $got -eq 2 ] || fail "--tensor-parallel 3 on 2 ranks: exit $got, want 2"
grep -q "tensor-parallel 3 needs 3 ranks (mpirun -np 3): started on 2" "$tmp/tp3.err" || fail "--tensor-parallel 3 on 2 ranks: $(cat "$tmp/tp3.err")"
mpirun_ 2 "$tmp/tpdp.out" "$tmp/tpdp.err" $train $small --tensor-parallel 2 --data-parallel
[ $got -eq 2 ] || fail "--tensor-parallel with --data-parallel: exit $got, want 2"
grep -q "tensor-parallel and --data-parallel: one or the other" "$tmp/tpdp.err" || fail "--tensor-parallel with --data-parallel: $(cat "$tmp/tpdp.err")"
$train $small --tensor-parallel 2 --optimizer steepest >"$tmp/tps.out" 2>"$tmp/tps.err"
got=$?
[ $got -eq 2 ] || fail "--tensor-parallel with steepest: exit $got, want 2"
grep -q "tensor-parallel with --optimizer steepest" "$tmp/tps.err" || fail "--tensor-parallel with steepest: $(cat "$tmp/tps.err")"
exit $status
