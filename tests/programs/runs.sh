#!/bin/sh
# runs.sh — no run's results are lost without a word (the one rule of stab_output_check, as the
# trainer keeps it): an earlier run in --out is refused and kept byte for byte unless --resume
# continues it or --replace replaces it (then none of its checkpoints is left beside the new
# run's); a learning-rate sweep's CSV is appended to, never replaced unasked; every checkpoint's
# steps are in the trace before the checkpoint exists (the trainer killed with SIGKILL the moment
# its first checkpoint appears, then resumed from it: no gap); a resumed run keeps its
# checkpoint's optimizer, learning rate and seed.
set -u
train=./harness/train
tmp=$(mktemp -d "${TMPDIR:-/tmp}/check_runs.XXXXXX") || exit 1
pid=
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
status=0
fail() { echo "FAIL: $*"; status=1; }
pass() { :; }
expect() { # expected-status description command...
  want=$1; what=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"; got=$?
  [ "$got" -eq "$want" ] || { fail "$what: exit $got, expected $want"; cat "$tmp/err"; }
}
# steps FILE: the trace's /step values, one a line (h5dump; a killed trace's SWMR mark cleared first)
steps() { h5dump -A 0 -d /step -w 1 -y "$1" 2>/dev/null | sed -n '/DATA {/,/}/p' | tr -d ' ,' | grep -E '^[0-9]+$'; }
# sums DIR: the checksums of every file in DIR, by name
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
small="--width 32 --depth 1 --heads 2 --context 16 --batch 8 --corpus-bytes 65536 --optimizer steepest --untied"

# ---- an earlier run in --out ----------------------------------------------------------------
run=$tmp/run
expect 0 "the first run" $train $small --steps 6 --checkpoint-every 3 --out "$run"
sums "$run" >"$tmp/run.sums"
[ -f "$run/step-000003.safetensors" ] && [ -f "$run/model.safetensors" ] && [ -f "$run/trace.h5" ] ||
  fail "the first run's files: $(ls "$run")"
# the same run again, another seed, no trace: each refused before a step, naming DIR, every file kept
for extra in "" "--seed 2" "--metrics-every 0" "--steps 2"; do
  expect 2 "a new run over an earlier one ($extra)" $train $small --steps 6 --checkpoint-every 3 $extra --out "$run"
  grep -q "^stabmeter-train: --out $run holds an earlier run (3 files: .*): kept as it is; --resume CHECKPOINT continues it, --replace replaces it, or give another --out$" "$tmp/err" ||
    fail "a new run over an earlier one ($extra): the message: $(cat "$tmp/err")"
  ! grep -q '^step ' "$tmp/err" || fail "a new run over an earlier one ($extra): trained before refusing"
  sums "$run" | cmp -s - "$tmp/run.sums" || fail "a new run over an earlier one ($extra): the earlier run changed"
done
# only a file of the run's own names counts: a notes file alone is no run
mkdir -p "$tmp/notes" && echo hello >"$tmp/notes/notes.txt"
expect 0 "--out holding other files" $train $small --steps 2 --out "$tmp/notes"
[ "$(cat "$tmp/notes/notes.txt")" = hello ] || fail "--out holding other files: notes.txt changed"
# a lone checkpoint is an earlier run too
mkdir -p "$tmp/lone" && cp "$run/step-000003.safetensors" "$tmp/lone/"
expect 2 "--out holding a step-N checkpoint alone" $train $small --steps 2 --out "$tmp/lone"
grep -q "holds an earlier run (1 file: step-000003.safetensors)" "$tmp/err" || fail "a lone checkpoint: $(cat "$tmp/err")"
# --replace: the new run's files only, none of the earlier run's checkpoints beside them
expect 0 "--replace" $train $small --steps 4 --checkpoint-every 2 --seed 3 --replace --out "$run"
[ "$(cd "$run" && ls | tr '\n' ' ')" = "model.safetensors step-000002.safetensors trace.h5 " ] ||
  fail "--replace left: $(ls "$run" | tr '\n' ' ')"
[ "$(steps "$run/trace.h5" | tr '\n' ' ')" = "1 2 3 4 " ] || fail "--replace: the trace's steps $(steps "$run/trace.h5" | tr '\n' ' ')"
h5dump -a /run_config "$run/trace.h5" | grep -q '"seed": 3' || fail "--replace: the trace is not the new run's"
expect 2 "--replace without --out" $train $small --steps 2 --replace
grep -q "^stabmeter-train: --replace needs --out DIR" "$tmp/err" || fail "--replace without --out: $(cat "$tmp/err")"
expect 2 "--replace with --resume" $train $small --steps 6 --replace --resume "$run/step-000002.safetensors" --out "$run"
grep -q "^stabmeter-train: --replace and --resume: one or the other" "$tmp/err" || fail "--replace --resume: $(cat "$tmp/err")"

# ---- a learning-rate sweep into a folder that holds one ------------------------------------
lrs=$tmp/lrs
sweep="--width 16 --depth 1 --heads 2 --context 16 --batch 4 --corpus-bytes 16384 --steps 3 --optimizer steepest --untied"
expect 0 "a sweep, seed 1" $train $sweep --sweep-lrs 0.1,0.3 --out "$lrs"
sums "$lrs" >"$tmp/lrs.sums"
# the same rates with another seed would replace every run: refused before any, all kept
expect 2 "the same sweep, seed 2" $train $sweep --seed 2 --sweep-lrs 0.1,0.3 --out "$lrs"
grep -q "^stabmeter-train: --out $lrs/lr-0.1 holds an earlier run" "$tmp/err" || fail "the same sweep, seed 2: $(cat "$tmp/err")"
! grep -q "sweep: lr" "$tmp/err" || fail "the same sweep, seed 2: a run started before refusing"
sums "$lrs" | cmp -s - "$tmp/lrs.sums" || fail "the same sweep, seed 2: the earlier sweep changed"
# other rates into it: their rows after the earlier ones, under one header
expect 0 "more rates, seed 2" $train $sweep --seed 2 --sweep-lrs 0.5,0.7 --out "$lrs"
cut -d, -f1-4,9 "$lrs/lr-sweep.csv" | tr '\n' ' ' >"$tmp/csv"
[ "$(cat "$tmp/csv")" = "optimizer,width,lr,status,seed steepest,16,0.1,ok,1 steepest,16,0.3,ok,1 steepest,16,0.5,ok,2 steepest,16,0.7,ok,2 " ] ||
  fail "more rates into a sweep: the CSV: $(cat "$tmp/csv")"
# a CSV of other columns: refused, kept
mkdir -p "$tmp/other" && printf 'a,b\n1,2\n' >"$tmp/other/lr-sweep.csv"
expect 2 "a CSV of other columns" $train $sweep --sweep-lrs 0.1,0.3 --out "$tmp/other"
grep -q "^stabmeter-train: $tmp/other/lr-sweep.csv: its columns are not this sweep's (header 'a,b'): kept as it is" "$tmp/err" ||
  fail "a CSV of other columns: $(cat "$tmp/err")"
[ "$(cat "$tmp/other/lr-sweep.csv")" = "$(printf 'a,b\n1,2')" ] || fail "a CSV of other columns: changed"
[ ! -e "$tmp/other/lr-0.1" ] || fail "a CSV of other columns: a run was made before refusing"
# --replace: the sweep's runs and its CSV replaced
expect 0 "the same sweep, seed 2, --replace" $train $sweep --seed 2 --sweep-lrs 0.1,0.3 --replace --out "$lrs"
[ "$(cut -d, -f3,9 "$lrs/lr-sweep.csv" | tr '\n' ' ')" = "lr,seed 0.1,2 0.3,2 " ] ||
  fail "a sweep with --replace: the CSV: $(cat "$lrs/lr-sweep.csv")"
h5dump -a /run_config "$lrs/lr-0.1/trace.h5" | grep -q '"seed": 2' || fail "a sweep with --replace: lr-0.1's trace is not seed 2's"

# ---- the trace holds every checkpoint's steps before the checkpoint exists ------------------
# Killed the moment step-000020 appears (well inside the trace writer's first second, when no
# row had been flushed before: the old trainer left 0 rows), then resumed from it.
kill_dir=$tmp/killed
$train $small --steps 100000 --checkpoint-every 20 --out "$kill_dir" >/dev/null 2>"$tmp/killed.err" &
pid=$!
while [ ! -e "$kill_dir/step-000020.safetensors" ] && kill -0 "$pid" 2>/dev/null; do :; done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
pid=
if [ ! -e "$kill_dir/step-000020.safetensors" ]; then
  fail "the killed run: no checkpoint at step 20: $(cat "$tmp/killed.err")"
else
  h5clear -s "$kill_dir/trace.h5" 2>/dev/null
  steps "$kill_dir/trace.h5" >"$tmp/killed.steps"
  grep -qx 20 "$tmp/killed.steps" ||
    fail "killed as step-000020 appeared: the trace ends at step $(tail -n 1 "$tmp/killed.steps") ($(wc -l <"$tmp/killed.steps") rows)"
  expect 0 "resumed after the kill" $train $small --steps 30 --resume "$kill_dir/step-000020.safetensors" --out "$kill_dir"
  ! grep -q "will be missing" "$tmp/err" || fail "resumed after the kill: $(grep 'missing' "$tmp/err")"
  [ "$(steps "$kill_dir/trace.h5" | tr '\n' ' ')" = "$(seq 1 30 | tr '\n' ' ')" ] ||
    fail "resumed after the kill: the trace's steps $(steps "$kill_dir/trace.h5" | tr '\n' ' ')"
fi

# ---- a resumed run keeps its checkpoint's settings ------------------------------------------
res=$tmp/res
expect 0 "a run with --lr 0.05 --seed 4" $train $small --steps 4 --checkpoint-every 2 --lr 0.05 --seed 4 --out "$res"
ck=$res/step-000002.safetensors
sums "$res" >"$tmp/res.sums"
expect 2 "resume with another --optimizer" $train $small --optimizer adamw --steps 4 --lr 0.05 --seed 4 --resume "$ck" --out "$res"
grep -q "^stabmeter-train: cannot resume: $ck: __metadata__ optimizer is steepest, the run has --optimizer adamw: a resumed run goes on with its checkpoint's optimizer, learning rate and seed (give --optimizer steepest, or start a new run)$" "$tmp/err" ||
  fail "resume with another --optimizer: $(cat "$tmp/err")"
expect 2 "resume with another --lr" $train $small --steps 4 --lr 0.07 --seed 4 --resume "$ck" --out "$res"
grep -q "__metadata__ lr is 0.05, the run has --lr 0.07: .* (give --lr 0.05, or start a new run)$" "$tmp/err" ||
  fail "resume with another --lr: $(cat "$tmp/err")"
expect 2 "resume with the default --lr" $train $small --steps 4 --seed 4 --resume "$ck" --out "$res"
grep -q "__metadata__ lr is 0.05, the run has --lr 0.1 (the default): " "$tmp/err" || fail "resume with the default --lr: $(cat "$tmp/err")"
expect 2 "resume with another --seed" $train $small --steps 4 --lr 0.05 --resume "$ck" --out "$res"
grep -q "__metadata__ seed is 4, the run has --seed 1: " "$tmp/err" || fail "resume with another --seed: $(cat "$tmp/err")"
sums "$res" | cmp -s - "$tmp/res.sums" || fail "a refused resume changed the run"
expect 0 "resume with the same settings" $train $small --steps 4 --lr 0.05 --seed 4 --resume "$ck" --out "$res"
cmp -s "$res/step-000002.safetensors" "$ck" || fail "resume: the checkpoint it resumed from changed"
exit $status
