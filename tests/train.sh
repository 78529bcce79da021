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
# rows FILE DATASET: the length of a trace dataset (h5dump, from hdf5-tools)
rows() { h5dump -H -d "$2" "$1" 2>/dev/null | sed -n 's/.*SIMPLE { ( \([0-9]*\) ).*/\1/p'; }
# first FILE DATASET: its first value
first() { h5dump -d "$2" "$1" 2>/dev/null | sed -n 's/^ *(0): \([0-9.e+-]*\).*/\1/p'; }
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
expect 1 "missing data file" $train --data "$tmp/none.txt"
grep -q "none.txt" "$tmp/err" || fail "missing file not named: $(cat "$tmp/err")"
printf 'not a token file' >"$tmp/bad.bin"
expect 2 "short .bin" $train --data "$tmp/bad.bin"
printf 'abc' >"$tmp/tiny.txt"
expect 2 "file shorter than the context" $train --data "$tmp/tiny.txt"

small="--width 32 --depth 1 --heads 2 --context 16 --batch 8 --corpus-bytes 65536"
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
expect 0 "alarms" $train $small --steps 20 --alarm 0.5
grep -q "alarm at step 1: transformer.h.0.ln_1 (gain) exceeds" "$tmp/err" ||
  fail "no alarm for the gain of forward 1 > 0.5: $(grep alarm "$tmp/err" | head -3)"
[ "$(grep -c "alarm at step .*: transformer.h.0.ln_1 " "$tmp/err")" -eq 1 ] ||
  fail "a layer's alarm is not reported exactly once"
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
[ "$(rows "$tmp/resumed/trace.h5" /step)" = 4 ] && [ "$(first "$tmp/resumed/trace.h5" /step)" = 5 ] ||
  fail "the resumed run's trace: $(rows "$tmp/resumed/trace.h5" /step) rows from step $(first "$tmp/resumed/trace.h5" /step); expected 4 from step 5"
mkdir -p "$tmp/ro" && chmod 555 "$tmp/ro"
if [ ! -w "$tmp/ro" ]; then # root writes anywhere: the check needs another user
  expect 1 "a trace that cannot be created" $train $small --steps 2 --out "$tmp/ro"
  grep -q "trace.h5" "$tmp/err" || fail "the trace failure does not name the file: $(cat "$tmp/err")"
fi
expect 2 "resume at the end" $train $small --steps 8 --untied --resume "$tmp/full/model.safetensors"
expect 2 "resume a tied model from an untied one" $train $small --steps 9 \
  --resume "$tmp/full/model.safetensors"
expect 2 "resume another width" $train $small --width 64 --steps 9 --untied \
  --resume "$tmp/full/model.safetensors"
grep -q "model.safetensors: tensor transformer.wte.weight is missing or not F32 of shape \[256,64\]" \
  "$tmp/err" || fail "width mismatch message: $(cat "$tmp/err")"
expect 1 "resume a missing file" $train $small --resume "$tmp/none.safetensors"
unset OPENBLAS_NUM_THREADS
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
exit $status
