#!/bin/sh
# sniff.sh — the probe given a file that is not a checkpoint it reads: one sample of each kind
# stab_ckpt_sniff knows, written here (bytes by printf, zips by python3's zipfile, a trace by
# the probe's own --hdf5, compressed files by the compressors), each refused with exit 2 and a
# message naming the file and what it is; the readable formats still read; and prefixes of 1..16
# bytes of each sample (nine lengths, below) refused with exit 2, never a crash (under
# check-sanitize the sniff's buffer is exactly the file's size, so a look past its end is caught).
set -u
top=$(pwd)
src=${srcdir:-.}
probe=$top/harness/probe
gen=$top/tests/support/st_gen
dir=$(mktemp -d "${TMPDIR:-/tmp}/sniff_sh.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
fails=0
checks=0
. "$src/tests/support/limit.sh"
have_py=0
command -v python3 >/dev/null 2>&1 && have_py=1
s=$dir/s
mkdir "$s"

# refused NAME PATTERN: probe $s/NAME exits 2, one line on stderr naming the file and matching PATTERN
refused() {
  expect "probe $1" 2 "^stabmeter-probe: $s/$1: $2" "$probe" "$s/$1"
  [ "$(wc -l <"$err_file")" -eq 1 ] && pass || fail "probe $1: not one line: $(cat "$err_file")"
}

# ---- the formats the probe reads still go to their readers -------------------------
"$gen" "$dir/m" gpt2 F32 >/dev/null && "$gen" "$dir/g" gguf F32 >/dev/null || fail "st_gen"
expect "a safetensors checkpoint reads" 0 '' "$probe" "$dir/m.safetensors" --quiet
expect "a GGUF checkpoint reads" 0 '' "$probe" "$dir/g.gguf" --quiet
# truncated: still safetensors, the reader says where (not "a binary file")
head -c 100 "$dir/m.safetensors" >"$s/cut.safetensors"
refused cut.safetensors 'header length [0-9]+ \(bytes 0-7\) is larger than'
cp "$dir/m.safetensors" "$s/m.safetensors"
# an llm.c checkpoint's magic and a bad version: the llm.c reader's message
printf '\306\327\064\001\007\000\000\000' >"$s/model_00000001.bin"
refused model_00000001.bin 'truncated: 8 bytes, fewer than the 1024-byte llm.c header'

# ---- each kind the probe does not read ---------------------------------------------
: >"$s/empty.safetensors"
refused empty.safetensors 'an empty file \(0 bytes\)'
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$s/passwd"
refused passwd 'a text file, not a checkpoint'
printf 'version https://git-lfs.github.com/spec/v1\noid sha256:%064d\nsize 123\n' 0 >"$s/lfs.safetensors"
refused lfs.safetensors 'a Git LFS pointer.*git lfs pull'
printf '{"metadata": {"total_size": 8}, "weight_map": {"a": "model-00001-of-00002.safetensors"}}\n' \
  >"$s/model.safetensors.index.json"
# a sharded model's index goes to the sharded reader, by its name or (named otherwise) by its
# content: here it names a shard that is not there
refused model.safetensors.index.json "shard 'model-00001-of-00002.safetensors' \\(holding tensor 'a'\\) is missing"
cp "$s/model.safetensors.index.json" "$s/weights.json"
refused weights.json "shard 'model-00001-of-00002.safetensors' \\(holding tensor 'a'\\) is missing"
# torch.save's legacy format: protocol 2, LONG1 of 10 bytes = the magic 0x1950a86a20f9469cfc6c
printf '\200\002\212\012\154\374\234\106\371\040\152\250\120\031.' >"$s/legacy.pt"
refused legacy.pt 'a PyTorch checkpoint \(legacy pickle.*convert it to safetensors'
printf '\200\004\225\005\000\000\000\000\000\000\000}\224.' >"$s/dict.pkl"
refused dict.pkl 'a Python pickle.*never unpickles'
printf '\223NUMPY\001\000\166\000{"descr": "<f4", "fortran_order": False, "shape": (2,), }' >"$s/w.npy"
refused w.npy 'a numpy array \(.npy\)'
printf 'lmgg\001\000\000\000' >"$s/ggml.bin"
refused ggml.bin 'a legacy llama.cpp file \(GGML'
printf 'fmgg\001\000\000\000' >"$s/ggmf.bin"
refused ggmf.bin 'a legacy llama.cpp file'
printf 'tjgg\003\000\000\000' >"$s/ggjt.bin"
refused ggjt.bin 'a legacy llama.cpp file.*convert it to GGUF'
# ONNX: ir_version 7, then a producer_name; by the name only, and "looks like"
printf '\010\007\022\007pytorch' >"$s/model.onnx"
refused model.onnx 'what looks like an ONNX model'
cp "$s/model.onnx" "$s/model.bin"
refused model.bin 'a binary file of no format stabmeter knows \(first bytes: 08 07 12 07 70 79 74 6f 72 63 68; 11 bytes\)'
printf '\310\327\064\001\003\000\000\000' >"$s/tokenizer.bin" # 20240328
refused tokenizer.bin 'an llm.c file that is not a checkpoint'
printf '\210\330\064\001\001\000\000\000' >"$s/shard.bin" # 20240520
refused shard.bin 'an llm.c file that is not a checkpoint'
head -c 40 /dev/zero >"$s/zeros.safetensors.part"
refused zeros.safetensors.part 'a binary file of no format stabmeter knows \(first bytes: 00 00 00'

# a trace (the probe's own --hdf5 writes one) and an HDF5 file that is not one
"$probe" "$dir/m.safetensors" --hdf5 "$s/trace.h5" --step 1 --quiet >/dev/null 2>&1 || fail "probe --hdf5"
refused trace.h5 'a stabmeter trace \(HDF5\), not a checkpoint: read it with stabmeter-export'
if command -v h5mkgrp >/dev/null 2>&1; then
  h5mkgrp "$s/plain.h5" /g >/dev/null 2>&1
  [ -s "$s/plain.h5" ] && refused plain.h5 'an HDF5 file, not a checkpoint'
fi

# compressed checkpoints: named as compressed, never decompressed
for c in gzip:gz zstd:zst xz:xz bzip2:bz2; do
  tool=${c%%:*} ext=${c#*:}
  command -v "$tool" >/dev/null 2>&1 || continue
  "$tool" -c "$dir/m.safetensors" >"$s/m.safetensors.$ext" 2>/dev/null
  refused "m.safetensors.$ext" "an? $tool-compressed file: decompress it first"
done

if [ $have_py -eq 1 ]; then
  python3 - "$s" <<'PY' || fail "python3 zip samples"
import sys, zipfile, pickle
d = sys.argv[1]
pkl = pickle.dumps({"w": 1}, protocol=2)
npy = b'\x93NUMPY\x01\x00\x76\x00' + b'{"descr": "<f4", "fortran_order": False, "shape": (1,), }'.ljust(118, b' ') + b'\n' + b'\0' * 4
# torch.save: entries under the file's stem (archive/ by default), data.pkl first
with zipfile.ZipFile(d + "/pytorch_model.bin", "w") as z:
    z.writestr("archive/data.pkl", pkl); z.writestr("archive/byteorder", "little"); z.writestr("archive/data/0", b"\0" * 4)
with zipfile.ZipFile(d + "/stored.pt", "w", zipfile.ZIP_STORED) as z:
    z.writestr("stored/data.pkl", pkl)
with zipfile.ZipFile(d + "/arrays.npz", "w") as z:
    z.writestr("w.npy", npy); z.writestr("b.npy", npy)
with zipfile.ZipFile(d + "/other.zip", "w") as z:
    z.writestr("README", "hello")
PY
  refused pytorch_model.bin 'a PyTorch checkpoint \(zip, torch.save\).*convert it to safetensors, e\.g\. python3 -c'
  refused stored.pt 'a PyTorch checkpoint \(zip'
  refused arrays.npz 'a numpy archive \(.npz\)'
  refused other.zip 'a zip archive that is not a PyTorch checkpoint'
  # --prev goes through the same sniff
  expect "--prev a PyTorch checkpoint" 2 "^stabmeter-probe: $s/pytorch_model.bin: a PyTorch checkpoint \(zip" \
    "$probe" "$s/m.safetensors" --prev "$s/pytorch_model.bin"
fi

# ---- prefixes of each sample: never a crash, never past the end ----------------------
# Whatever a prefix is taken for, exit 2 (a reader's message or the sniff's) naming the file;
# 124 would be a hang, 128 and up a crash. tests/unit/check_sniff.c takes every prefix of every
# sample through the sniff itself; here the program's path (sniff, then a reader, then the
# message) gets the lengths either side of where the formats decide: a 4-byte magic, an 8-byte
# length or version, and 15-16 bytes (a GGUF's tensor count). Every length 1..16 took a minute
# (480 launches), in each of the three builds quickstart.sh test runs.
n=0
for f in "$s"/*; do
  for k in 1 3 4 5 7 8 9 15 16; do
    head -c $k "$f" >"$dir/p.$k"
    limited "$probe" "$dir/p.$k"
    n=$((n + 1))
    if [ $rc -ne 2 ] || ! grep -q "p\.$k" "$err_file"; then
      fail "$(basename "$f") cut to $k bytes: exit $rc, want 2 naming the file: $(head -c 300 "$err_file")"
    else
      pass
    fi
  done
done
echo "sniff.sh: $n prefixes of $(ls "$s" | wc -l) samples"
summary sniff.sh
