#!/bin/sh
# The trainer as a program: exit codes (0 success, 1 failure, 2 bad usage or input), a short
# run whose loss falls, its trace (rows per dataset, read with h5dump), and its safetensors
# checkpoint read back (header JSON, offsets that tile the data, file size; with python3 when
# present).
set -u
train=./harness/train
tmp=$(mktemp -d /tmp/check_train.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }
# layer_values FILE /layers/LAYER/METRIC: one value a line of a layer's metric (format 4 keeps
# it in the column LAYER of /layers/METRIC), read by stabmeter-export, which reads every format
# and writes exact decimals; nothing when the trace has no such layer or metric.
layer_values() {
  l=${2#/layers/} && m=${l##*/} && l=${l%/*}
  v=$(./harness/export --layers "$l" --metrics "$m" "$1" 2>/dev/null) || return 0
  printf '%s\n' "$v" | awk -F, 'NR > 1 { print $5 }'
}
# rows FILE DATASET: the length of a trace dataset (h5dump, from hdf5-tools; -A 0: not its attributes)
rows() {
  case $2 in
  /layers/*) layer_values "$1" "$2" | awk 'END { if (NR) print NR }' ;;
  *) h5dump -A 0 -H -d "$2" "$1" 2>/dev/null | sed -n 's/.*SIMPLE { ( \([0-9]*\) ).*/\1/p' ;;
  esac
}
# first FILE DATASET: its first value
first() { h5dump -A 0 -d "$2" "$1" 2>/dev/null | sed -n 's/^ *(0): \([0-9.e+-]*\).*/\1/p'; }
expect() { # expected-status description command...
  want=$1; what=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"; got=$?
  [ "$got" -eq "$want" ] || { fail "$what: exit $got, expected $want"; cat "$tmp/err"; }
}
expect 0 "--help" $train --help
expect 0 "--version" $train --version
grep -q stabmeter "$tmp/out" || fail "--version does not name stabmeter"
expect 2 "unknown option" $train --bogus
expect 2 "width not divisible by heads" $train --width 10 --heads 4
expect 2 "unknown optimizer" $train --optimizer sgd
expect 2 "bad number" $train --steps 12x
# --data-parallel needs the MPI build (tests/programs/mpi_train.sh runs it there)
if [ -z "${MPIRUN:-}" ]; then
  expect 2 "--data-parallel without MPI" $train --data-parallel --steps 1
  grep -q "^stabmeter-train: --data-parallel: built without MPI: ./configure --with-mpi$" "$tmp/err" ||
    fail "--data-parallel without MPI: the message: $(cat "$tmp/err")"
  expect 2 "--tensor-parallel without MPI" $train --tensor-parallel 2 --steps 1
  grep -q "^stabmeter-train: --tensor-parallel: built without MPI: ./configure --with-mpi$" "$tmp/err" ||
    fail "--tensor-parallel without MPI: the message: $(cat "$tmp/err")"
fi
expect 2 "missing data file" $train --data "$tmp/none.txt"
grep -q "none.txt" "$tmp/err" || fail "missing file not named: $(cat "$tmp/err")"
printf 'not a token file' >"$tmp/bad.bin"
expect 2 "short .bin" $train --data "$tmp/bad.bin"
printf 'abc' >"$tmp/tiny.txt"
expect 2 "file shorter than the context" $train --data "$tmp/tiny.txt"

small="--width 32 --depth 1 --heads 2 --context 16 --batch 8 --corpus-bytes 65536"
# An --out that cannot hold the run's files is bad input (2), refused before any step is
# taken: a file or a FIFO as DIR, a file as a component of DIR, a directory or a FIFO where
# DIR/trace.h5 goes (all were exit 1, after building the model).
printf x >"$tmp/afile"
mkfifo "$tmp/afifo"
mkdir -p "$tmp/holds-dir/trace.h5" "$tmp/holds-fifo"
mkfifo "$tmp/holds-fifo/trace.h5"
for out in afile afifo afile/sub holds-dir holds-fifo; do
  expect 2 "--out $out" $train $small --steps 1 --out "$tmp/$out"
  grep -q "^stabmeter-train: .*$out" "$tmp/err" || fail "--out $out: the message does not name it: $(cat "$tmp/err")"
  ! grep -q '^step ' "$tmp/err" || fail "--out $out: trained before refusing it"
done
for opt in adamw steepest; do
  expect 0 "training with $opt" $train $small --steps 60 --optimizer $opt --biases --untied \
    --out "$tmp/run-$opt"
  cat "$tmp/out"
  awk '/^loss:/ { gsub(",", ""); i = $3; f = $5; if (!(f < i - 0.5)) exit 1 }' "$tmp/out" ||
    fail "$opt: the loss did not fall by 0.5 nats: $(grep '^loss:' "$tmp/out")"
  grep -q "step 60/60" "$tmp/err" || fail "$opt: no progress line for the last step"
  [ -s "$tmp/run-$opt/model.safetensors" ] || fail "$opt: no checkpoint"
  tr="$tmp/run-$opt/trace.h5"
  [ "$(rows "$tr" /step)" = 60 ] || fail "$opt: trace /step has $(rows "$tr" /step) rows, not 60"
  for d in /layers/transformer.h.0.mlp.c_fc/forward /layers/transformer.h.0.mlp.c_fc/act_rms \
           /layers/transformer.h.0.attn.logits/head1_bound /scalars/loss /wall_time; do
    [ "$(rows "$tr" $d)" = 60 ] || fail "$opt: trace $d has $(rows "$tr" $d) rows, not 60"
  done
  grep -q "^trace: $tr, 60 measured steps" "$tmp/out" || fail "$opt: the trace is not announced"
done
expect 2 "--checkpoint-every without --out" $train $small --steps 5 --checkpoint-every 2
expect 0 "periodic checkpoints" $train $small --steps 5 --checkpoint-every 2 --metrics-every 2 \
  --out "$tmp/ckpt"
for f in step-000002 step-000004 model; do
  [ -s "$tmp/ckpt/$f.safetensors" ] || fail "no $f.safetensors"
done
[ ! -e "$tmp/ckpt/step-000005.safetensors" ] || fail "the last step is saved twice"
[ "$(rows "$tmp/ckpt/trace.h5" /step)" = 2 ] && [ "$(first "$tmp/ckpt/trace.h5" /step)" = 2 ] ||
  fail "--metrics-every 2 over 5 steps: trace rows $(rows "$tmp/ckpt/trace.h5" /step), first step $(first "$tmp/ckpt/trace.h5" /step); expected 2 rows from step 2"
ls "$tmp/ckpt" | grep -q tmp && fail "a temporary file is left over"
expect 2 "bad alarm threshold" $train $small --alarm -1
# --alarm X is relative: a layer's forward, dependency or update over its value at the first
# measured step. Attention's logit bound, 20 at init in larger models, is no alarm at step 1;
# a healthy run grows its weights (up to 5.3x in 60 adamw steps at this size, the update per
# unit of learning rate about 1x), a run at --lr 0.5 its attention logits 13x by step 3.
expect 0 "alarms, healthy first steps" $train $small --steps 5 --alarm 2
! grep -q "alarm at step" "$tmp/err" || fail "--alarm 2 fired on a healthy run: $(grep alarm "$tmp/err" | head -3)"
expect 0 "alarms, a run blowing up" $train $small --steps 20 --lr 0.5 --alarm 10 --out "$tmp/blow"
grep -q "alarm at step [0-9]*: transformer.h.0.attn.logits (attention) forward [0-9.e+]* is [0-9.e+]* times its reference [0-9.e+]* (--alarm 10)$" "$tmp/err" ||
  fail "--lr 0.5: no relative alarm on the attention logits: $(grep alarm "$tmp/err" | head -3)"
[ "$(grep -c "alarm at step .*: transformer.h.0.attn.logits " "$tmp/err")" -eq 1 ] ||
  fail "a layer's alarm is not reported exactly once"
grep "alarm at step" "$tmp/err" >"$tmp/blow-alarms"
if /usr/bin/python3 -c "import h5py, numpy" 2>/dev/null; then
  # each alarm's value, reference and ratio against the trace: the row of its step, the first
  # finite value > 0 of its column, and forward_ratio (the trace's) = value / reference
  /usr/bin/python3 - "$tmp/blow/trace.h5" "$tmp/blow-alarms" <<'PY' || fail "alarms against the trace"
import re, sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
steps = list(f["step"][:])
n = 0
for line in open(sys.argv[2]):
    m = re.search(r"alarm at step (\d+): (\S+) \((\w+)\) (forward|dependency) (\S+) is (\S+) times its reference (\S+) ", line)
    assert m, line
    step, layer, kind, metric = int(m[1]), m[2], m[3], m[4]
    value, ratio, ref = float(m[5]), float(m[6]), float(m[7])
    L = f["layers"]  # format 4: one (step, layer) dataset per metric
    i = [n.decode() for n in L["layer"][:]].index(layer)
    col, ratios = L[metric][:, i], L[metric + "_ratio"][:, i]
    first = col[np.isfinite(col) & (col > 0)][0]
    row = steps.index(step)
    assert abs(ref / first - 1) < 1e-5, (line, first)
    assert abs(value / col[row] - 1) < 1e-5, (line, col[row])
    assert abs(ratio / ratios[row] - 1) < 1e-5, (line, ratios[row])
    assert ratio > 10 and ratios[row - 1] <= 10, (line, "not the first row over 10")
    n += 1
assert n >= 1
PY
fi
expect 2 "--alarm-limit of no kind" $train $small --alarm-limit mlp=3
grep -q "KIND one of linear, embedding, lm_head, gain, bias, attention" "$tmp/err" ||
  fail "--alarm-limit: an unknown kind's message does not list the kinds: $(cat "$tmp/err")"
expect 2 "--alarm-limit without a value" $train $small --alarm-limit attention
expect 2 "--alarm-limit 0" $train $small --alarm-limit attention=0
expect 0 "--alarm-limit" $train $small --steps 3 --alarm-limit gain=0.5 --alarm-limit lm_head=1
grep -q "alarm at step 1: transformer.h.0.ln_1 (gain) forward 1\.[0-9]* exceeds --alarm-limit gain=0.5$" "$tmp/err" ||
  fail "no limit alarm for the gain's forward 1.00x > 0.5: $(grep alarm "$tmp/err" | head -3)"
grep -q "alarm at step 1: lm_head (lm_head) forward [0-9.]* exceeds --alarm-limit lm_head=1$" "$tmp/err" ||
  fail "no limit alarm for the LM head: $(grep alarm "$tmp/err" | head -3)"
! grep -q "(linear)" "$tmp/err" || fail "a limit alarm on a kind without a limit: $(grep alarm "$tmp/err" | head -3)"
expect 0 "metrics table" $train $small --steps 3 --print-metrics
grep -Eq "^transformer.h.0.mlp.c_fc +linear +[0-9.]+ +[0-9.]+ +[0-9.]+" "$tmp/out" ||
  fail "no metrics row for mlp.c_fc: $(cat "$tmp/out")"
# Steepest descent keeps no state: a resumed run is the same run, bit for bit (one BLAS
# thread, so that every sgemm sums in the same order).
export OPENBLAS_NUM_THREADS=1
expect 0 "steepest to step 8" $train $small --steps 8 --optimizer steepest --untied \
  --checkpoint-every 4 --out "$tmp/full"
expect 0 "resume at step 4" $train $small --steps 8 --optimizer steepest --untied \
  --resume "$tmp/full/step-000004.safetensors" --out "$tmp/resumed"
cmp -s "$tmp/full/model.safetensors" "$tmp/resumed/model.safetensors" ||
  fail "the resumed run differs from the straight one"
grep -q "resumed/trace.h5 has no rows up to step 4, where the run resumes: steps 1..4 will be missing" "$tmp/err" ||
  fail "a resumed run's new trace: its gap is not said: $(cat "$tmp/err")"
[ "$(rows "$tmp/resumed/trace.h5" /step)" = 4 ] && [ "$(first "$tmp/resumed/trace.h5" /step)" = 5 ] ||
  fail "the resumed run's trace: $(rows "$tmp/resumed/trace.h5" /step) rows from step $(first "$tmp/resumed/trace.h5" /step); expected 4 from step 5"
# AdamW keeps its moments beside each checkpoint (.adamw): resumed, it is the same run too.
expect 0 "adamw to step 8" $train $small --steps 8 --untied --checkpoint-every 4 --out "$tmp/afull"
[ -s "$tmp/afull/step-000004.adamw" ] && [ -s "$tmp/afull/model.adamw" ] || fail "no .adamw moments"
cp "$tmp/afull/trace.h5" "$tmp/afull-trace.h5"
# resumed into the same directory: the trace's steps 5..8 are replaced, not repeated
expect 0 "adamw resume at step 4" $train $small --steps 8 --untied --alarm 1.5 \
  --resume "$tmp/afull/step-000004.safetensors" --out "$tmp/afull"
grep "alarm at step" "$tmp/err" >"$tmp/resumed-alarms"
grep -q "at step 4 with its AdamW moments" "$tmp/err" || fail "moments not announced: $(cat "$tmp/err")"
cmp -s "$tmp/afull/model.safetensors" "$tmp/full/model.safetensors" &&
  fail "adamw and steepest gave the same weights"
[ "$(h5dump -A 0 -d /step "$tmp/afull/trace.h5" | grep '(0):')" = "   (0): 1, 2, 3, 4, 5, 6, 7, 8" ] ||
  fail "resumed trace steps: $(h5dump -A 0 -d /step "$tmp/afull/trace.h5" | grep '(0):')"
# the ratios too: the resumed process divides by the trace's first rows, not by its own first
for d in /layers/transformer.h.0.mlp.c_fc/update /layers/lm_head/forward /scalars/loss \
         /layers/transformer.h.0.mlp.c_fc/update_ratio /layers/transformer.h.0.attn.c_proj/forward_ratio \
         /layers/transformer.h.0.attn.logits/forward_ratio /layers/lm_head/dependency_ratio; do
  [ "$(layer_values "$tmp/afull/trace.h5" $d; h5dump -A 0 -d $d "$tmp/afull/trace.h5" 2>/dev/null | grep -A3 DATA)" = \
    "$(layer_values "$tmp/afull-trace.h5" $d; h5dump -A 0 -d $d "$tmp/afull-trace.h5" 2>/dev/null | grep -A3 DATA)" ] ||
    fail "resumed trace $d differs from the straight run's"
done
expect 0 "adamw straight to step 8, elsewhere" $train $small --steps 8 --untied --alarm 1.5 --out "$tmp/astraight"
# and so do its alarms: the straight run's after step 4 are the resumed run's, word for word
grep "alarm at step [5-8]:" "$tmp/err" >"$tmp/straight-alarms"
[ -s "$tmp/straight-alarms" ] || fail "no alarm after step 4 at --alarm 1.5 to compare: $(grep alarm "$tmp/err")"
grep -Fxvf "$tmp/resumed-alarms" "$tmp/straight-alarms" >"$tmp/missing" &&
  fail "alarms of the straight run the resumed one lacks (another reference?): $(cat "$tmp/missing")"
cmp -s "$tmp/afull/model.safetensors" "$tmp/astraight/model.safetensors" ||
  fail "the adamw run resumed with its moments differs from the straight one"
cmp -s "$tmp/afull/model.adamw" "$tmp/astraight/model.adamw" || fail "the moments differ"
mv "$tmp/afull/step-000004.adamw" "$tmp/moments"
expect 0 "adamw resume without moments" $train $small --steps 8 --untied \
  --resume "$tmp/afull/step-000004.safetensors" --out "$tmp/anomom"
grep -q "no AdamW moments beside it" "$tmp/err" || fail "missing moments not said: $(cat "$tmp/err")"
cp "$tmp/afull/model.adamw" "$tmp/afull/step-000004.adamw"
expect 2 "moments of another step" $train $small --steps 8 --untied \
  --resume "$tmp/afull/step-000004.safetensors" --out "$tmp/anomom"
grep -q "step-000004.adamw is at step 8, its checkpoint at 4" "$tmp/err" ||
  fail "moments step mismatch message: $(cat "$tmp/err")"
mkdir -p "$tmp/ro" && chmod 555 "$tmp/ro"
if [ ! -w "$tmp/ro" ]; then # root writes anywhere: the check needs another user
  expect 1 "a trace that cannot be created" $train $small --steps 2 --out "$tmp/ro"
  grep -q "trace.h5" "$tmp/err" || fail "the trace failure does not name the file: $(cat "$tmp/err")"
fi
expect 2 "resume at the end" $train $small --steps 8 --untied --resume "$tmp/full/model.safetensors"
expect 2 "resume a tied model from an untied one" $train $small --steps 9 \
  --resume "$tmp/full/model.safetensors"
expect 2 "resume with other heads" $train $small --heads 4 --steps 9 --untied \
  --resume "$tmp/full/model.safetensors"
grep -q "model.safetensors: __metadata__ heads is 2, the model has --heads 4" "$tmp/err" ||
  fail "heads mismatch message: $(cat "$tmp/err")"
expect 2 "resume another width" $train $small --width 64 --steps 9 --untied \
  --resume "$tmp/full/model.safetensors"
grep -q "model.safetensors: tensor transformer.wte.weight is missing or not F32 of shape \[256,64\]" \
  "$tmp/err" || fail "width mismatch message: $(cat "$tmp/err")"
expect 2 "resume a missing file" $train $small --resume "$tmp/none.safetensors"
# The attention scale. At a learning rate of 1e-30 the weights of step 1 are the init, the
# same for both scales (same seed): the logit bound s d_h F_q F_k of 1/d_h is then that of
# 1/sqrt(d_h) times 1/sqrt(d_h) = 1/4 (d_h = 32 / 2), and the loss differs (the model uses it).
exact() {
  case $2 in
  /layers/*) layer_values "$1" "$2" | head -n 1 ;;
  *) h5dump -A 0 -m %.17g -d "$2" "$1" 2>/dev/null | sed -n 's/^ *(0): \([0-9.e+-]*\).*/\1/p' ;;
  esac
}
for sc in sqrt inverse; do
  expect 0 "--attn-scale $sc" $train $small --steps 1 --lr 1e-30 --optimizer steepest --attn-scale $sc \
    --out "$tmp/scale-$sc"
  h5dump -a /run_config "$tmp/scale-$sc/trace.h5" | grep -q "\"attn_scale\": \\\\\?\"$sc" ||
    fail "--attn-scale $sc: run_config does not say it: $(h5dump -a /run_config "$tmp/scale-$sc/trace.h5")"
done
for d in attn.logits/forward attn.logits/head0_bound attn.logits/head1_bound; do
  a=$(exact "$tmp/scale-sqrt/trace.h5" /layers/transformer.h.0.$d)
  b=$(exact "$tmp/scale-inverse/trace.h5" /layers/transformer.h.0.$d)
  awk -v a="$a" -v b="$b" 'BEGIN { exit !(a > 0 && (b / a - 0.25 < 1e-6 && 0.25 - b / a < 1e-6) ) }' ||
    fail "--attn-scale inverse: $d at step 1 is $b, not 1/4 of sqrt's $a"
done
[ "$(exact "$tmp/scale-sqrt/trace.h5" /scalars/loss)" != "$(exact "$tmp/scale-inverse/trace.h5" /scalars/loss)" ] ||
  fail "--attn-scale inverse: the same loss as sqrt at step 1: the model ignores the scale"
expect 2 "resume a 1/sqrt(d_h) checkpoint with --attn-scale inverse" $train $small --steps 2 --optimizer steepest \
  --attn-scale inverse --resume "$tmp/scale-sqrt/model.safetensors"
grep -q "model.safetensors: __metadata__ attn_scale is sqrt, the model has --attn-scale inverse" "$tmp/err" ||
  fail "attention scale mismatch message: $(cat "$tmp/err")"
expect 2 "resume a 1/d_h checkpoint with the default scale" $train $small --steps 2 --optimizer steepest \
  --resume "$tmp/scale-inverse/model.safetensors"
grep -q "model.safetensors: __metadata__ attn_scale is inverse, the model has --attn-scale sqrt" "$tmp/err" ||
  fail "attention scale mismatch message: $(cat "$tmp/err")"
expect 0 "resume a 1/d_h checkpoint with --attn-scale inverse" $train $small --steps 2 --optimizer steepest \
  --lr 1e-30 --attn-scale inverse --resume "$tmp/scale-inverse/model.safetensors"
expect 2 "unknown --attn-scale" $train $small --attn-scale cube
# --head-dim: heads = width / head dim, refused when it does not divide or with --heads.
nohead="--width 32 --depth 1 --context 16 --batch 8 --corpus-bytes 65536"
expect 2 "--head-dim not dividing the width" $train $nohead --head-dim 12
grep -q "^stabmeter-train: --head-dim 12 does not divide --width 32$" "$tmp/err" ||
  fail "--head-dim 12: the message: $(cat "$tmp/err")"
expect 2 "--head-dim with --heads" $train $small --head-dim 8
grep -q "^stabmeter-train: --heads 2 and --head-dim 8: one or the other" "$tmp/err" ||
  fail "--head-dim with --heads: the message: $(cat "$tmp/err")"
expect 2 "--head-dim not dividing a swept width" $train $nohead --head-dim 8 --sweep-widths 16,36 --out "$tmp/hsw"
grep -q "^stabmeter-train: --sweep-widths: width 36 is not divisible by --head-dim 8$" "$tmp/err" ||
  fail "--head-dim in a sweep: the message: $(cat "$tmp/err")"
expect 0 "--head-dim 8" $train $nohead --head-dim 8 --steps 1 --metrics-every 1 --out "$tmp/hd"
[ -n "$(rows "$tmp/hd/trace.h5" /layers/transformer.h.0.attn.logits/head3_bound)" ] &&
  [ -z "$(rows "$tmp/hd/trace.h5" /layers/transformer.h.0.attn.logits/head4_bound)" ] ||
  fail "--head-dim 8 at width 32: not 4 heads in the trace"
# in a sweep the heads grow with the width: 2 at width 16, 4 at 32
expect 0 "--head-dim 8 sweep" $train $nohead --head-dim 8 --steps 2 --sweep-widths 16,32 --out "$tmp/hsw"
for wh in 16:1 32:3; do
  w=${wh%:*} h=${wh#*:}
  tr=$tmp/hsw/width-$w/trace.h5 l=/layers/transformer.h.0.attn.logits
  [ -n "$(rows "$tr" "$l/head${h}_bound")" ] && [ -z "$(rows "$tr" "$l/head$((h + 1))_bound")" ] ||
    fail "--head-dim 8 sweep: width $w does not have $((h + 1)) heads"
done
unset OPENBLAS_NUM_THREADS
# The width sweep: one run per width into DIR/width-W, then per kind the last quarter's
# geometric mean against width and its log-log slope (recomputed below from the traces).
expect 2 "sweep without --out" $train $small --sweep-widths 16,32
expect 2 "sweep with one width" $train $small --sweep-widths 16 --out "$tmp/sw"
expect 2 "sweep not increasing" $train $small --sweep-widths 32,16 --out "$tmp/sw"
expect 2 "sweep width not divisible by heads" $train $small --sweep-widths 16,33 --out "$tmp/sw"
expect 0 "width sweep" $train $small --steps 12 --sweep-widths 16,32,64 --optimizer steepest \
  --untied --out "$tmp/sw"
cp "$tmp/out" "$tmp/sweep.txt"
for w in 16 32 64; do
  [ "$(rows "$tmp/sw/width-$w/trace.h5" /step)" = 12 ] || fail "sweep: no 12-row trace at width $w"
  [ -s "$tmp/sw/width-$w/model.safetensors" ] || fail "sweep: no checkpoint at width $w"
done
grep -Eq "^linear +update +[0-9.e+-]+ +[0-9.e+-]+ +[0-9.e+-]+ +[-+][0-9.]+$" "$tmp/sweep.txt" ||
  fail "sweep: no linear update row: $(cat "$tmp/sweep.txt")"
# The learning-rate sweep: one run per rate and width into DIR/lr-X/width-W, a CSV row per run
# as it ends, and the table of held-out losses with the best rate per width. Rate 9.9 on this
# deep, narrow model turns the loss non-finite within a few steps (measured: step 4 at width 8):
# a diverged run is an outcome recorded, and the sweep goes on.
expect 2 "lr sweep without --out" $train $small --sweep-lrs 0.1,1
expect 2 "lr sweep with --lr" $train $small --sweep-lrs 0.1,1 --lr 0.1 --out "$tmp/lrs"
grep -q "^stabmeter-train: --sweep-lrs and --lr: one or the other" "$tmp/err" ||
  fail "--sweep-lrs with --lr: the message: $(cat "$tmp/err")"
expect 2 "lr sweep with one rate" $train $small --sweep-lrs 0.1 --out "$tmp/lrs"
expect 2 "lr sweep not increasing" $train $small --sweep-lrs 1,0.1 --out "$tmp/lrs"
expect 2 "lr sweep rate out of range" $train $small --sweep-lrs 0.1,10 --out "$tmp/lrs"
grep -q "^stabmeter-train: --sweep-lrs: bad value '0.1,10' (want 2 to 16 increasing" "$tmp/err" ||
  fail "--sweep-lrs out of range: the message: $(cat "$tmp/err")"
lrsmall="--optimizer steepest --depth 6 --heads 2 --warmup 0 --steps 40 --context 8 --batch 2 --corpus-bytes 20000"
expect 0 "lr sweep" $train $lrsmall --sweep-lrs 0.1,9.9 --sweep-widths 8,16 --out "$tmp/lrs"
cp "$tmp/out" "$tmp/lrs.txt"; cp "$tmp/err" "$tmp/lrs.err"
csv="$tmp/lrs/lr-sweep.csv"
[ "$(head -n 1 "$csv")" = "optimizer,width,lr,status,steps_done,final_train_loss,heldout_loss,initial_train_loss,seed" ] ||
  fail "lr sweep: the CSV header: $(head -n 1 "$csv")"
[ "$(wc -l <"$csv")" -eq 5 ] || fail "lr sweep: not 4 rows: $(cat "$csv")"
# the seed column: the run's --seed (default 1), so sweeps of two seeds can be told apart
[ "$(awk -F, 'NR > 1 { print $9 }' "$csv" | sort -u)" = 1 ] || fail "lr sweep: the seed column is not 1: $(cat "$csv")"
# each run's row against what the run printed: its held-out loss, or the step its loss went bad
awk -F, 'NR > 1 { print $2, $3, $4, $5, $7 }' "$csv" >"$tmp/rows"
printed=$(grep -c '^loss: initial' "$tmp/lrs.txt")
diverged=0
while read -r w lr st steps held; do
  dir="$tmp/lrs/lr-$lr/width-$w"
  [ -s "$dir/trace.h5" ] || fail "lr sweep: no trace in $dir"
  if [ "$st" = diverged ]; then
    diverged=$((diverged + 1))
    grep -q "the loss is -*nan at step $steps: stopping\|the loss is -*inf at step $steps: stopping" "$tmp/lrs.err" ||
      fail "lr sweep: lr $lr width $w: diverged at $steps, not what the run said: $(grep 'loss is' "$tmp/lrs.err")"
    [ "$(rows "$dir/trace.h5" /step)" = "$steps" ] || fail "lr sweep: $dir: not $steps measured rows"
    [ ! -e "$dir/model.safetensors" ] || fail "lr sweep: a checkpoint of the diverged run $dir"
  else
    [ "$st" = ok ] && [ "$steps" = 40 ] || fail "lr sweep: lr $lr width $w: status $st after $steps steps"
    said=$(sed -n "/^== lr $lr, width $w:/,/^== /s/.*held-out \([0-9.]*\) .*/\1/p" "$tmp/lrs.txt")
    awk -v a="$held" -v b="$said" 'BEGIN { d = a - b; exit !(b != "" && d < 5e-5 && d > -5e-5) }' ||
      fail "lr sweep: lr $lr width $w: the CSV's held-out loss $held is not the run's ($said)"
    [ -s "$dir/model.safetensors" ] || fail "lr sweep: no checkpoint in $dir"
  fi
done <"$tmp/rows"
[ "$diverged" -ge 1 ] || fail "lr sweep: no run at lr 9.9 diverged: $(cat "$csv")"
[ "$printed" -eq $((4 - diverged)) ] || fail "lr sweep: $printed runs printed a final loss"
# the table: a row per width, the best rate the one of the lowest finite held-out loss in the CSV
for w in 8 16; do
  best=$(awk -F, -v w=$w 'NR > 1 && $2 == w && $4 == "ok" && (b == "" || $7 < l) { b = $3; l = $7 } END { print b }' "$csv")
  grep -Eq "^$w +[^ ]+ +[^ ]+ +$best\$" "$tmp/lrs.txt" || fail "lr sweep: width $w: best lr not $best: $(cat "$tmp/lrs.txt")"
done
expect 0 "no monitor" $train $small --steps 5 --metrics-every 0
if grep -q "max fwd" "$tmp/err"; then fail "--metrics-every 0 still measured"; fi

if command -v python3 >/dev/null 2>&1; then
  python3 - "$tmp/run-steepest/model.safetensors" <<'PY' || fail "safetensors check"
import json, struct, sys
path = sys.argv[1]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
assert n % 8 == 0, "header length not a multiple of 8"
h = json.loads(raw[8:8 + n])
meta = h.pop("__metadata__")
assert meta["optimizer"] == "steepest", meta
end = 0
for name, t in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    a, b = t["data_offsets"]
    assert t["dtype"] == "F32", name
    count = 1
    for s in t["shape"]:
        count *= s
    assert a == end and b - a == 4 * count, (name, a, b, end, count)
    end = b
assert 8 + n + end == len(raw), "data does not fill the file"
D = 32
assert h["transformer.wte.weight"]["shape"] == [256, D]
assert h["transformer.h.0.attn.c_attn.weight"]["shape"] == [3 * D, D]
assert h["transformer.h.0.mlp.c_fc.bias"]["shape"] == [4 * D]
assert h["lm_head.weight"]["shape"] == [256, D]
g = struct.unpack_from("<%df" % D, raw, 8 + n + h["transformer.ln_f.weight"]["data_offsets"][0])
assert all(0.0 < x < 10.0 for x in g) and any(x != 1.0 for x in g), g  # trained gains
print("safetensors: %d tensors, %d bytes of data: ok" % (len(h), end))
PY
else
  echo "python3 not found: the safetensors header is not parsed"
fi
if /usr/bin/python3 -c "import h5py, numpy" 2>/dev/null; then
  /usr/bin/python3 - "$tmp/sw" "$tmp/sweep.txt" <<'PY' || fail "sweep slopes against the traces"
import sys, h5py, numpy as np
root, table = sys.argv[1], open(sys.argv[2]).read().splitlines()
widths = [16, 32, 64]
printed = {}
for line in table:
    f = line.split()
    if len(f) == 6 and f[0] in ("linear", "embedding", "lm_head", "gain", "attention"):
        printed[(f[0], f[1])] = [float(x) for x in f[2:5]] + [float(f[5])]
assert printed, table
for (kind, metric), want in printed.items():
    means = []
    for w in widths:
        with h5py.File("%s/width-%d/trace.h5" % (root, w), "r") as h:
            step = h["step"][:]
            tail = step > step.max() - step.max() // 4
            vals = []
            kinds = [k.decode() for k in h["layers/kind"][:]]  # format 4: (step, layer) per metric
            for i, k in enumerate(kinds):
                if k == kind:
                    v = h["layers"][metric][:, i][tail]
                    vals += list(v[np.isfinite(v) & (v > 0)])
            means.append(np.exp(np.mean(np.log(vals))))
    slope = np.polyfit(np.log(widths), np.log(means), 1)[0]
    assert np.allclose(means, want[:3], rtol=2e-3), (kind, metric, means, want)
    assert abs(slope - want[3]) < 2e-3, (kind, metric, slope, want[3])
print("sweep: %d kind/metric slopes match the traces" % len(printed))
PY
fi
exit $status
