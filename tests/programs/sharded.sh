#!/bin/sh
# sharded.sh — the probe on a Hugging Face model directory: a Llama-shaped model (grouped-query
# attention, untied lm_head; tests/support/st_gen) saved as one model.safetensors and cut into 3 shards
# with an index by tests/support/shard_split.py (an independent writer). The directory, the index file and
# the single file must report the same layers with the same numbers, field by field; --prev across
# directories likewise; one shard alone must not invent a tied head. Then every way an index or a
# config.json can be wrong, each refused with its message and exit 2, under tests/support/limit.sh (a FIFO
# as a shard must not block); a Hugging Face cache tree of symbolic links; a total_size mismatch
# (a warning); config.json's tie_word_embeddings, text_config, key heads.
set -u
top=$(pwd)
src=${srcdir:-.}
probe=$top/harness/probe
st_gen=$top/tests/support/st_gen
split=$src/tests/support/shard_split.py
command -v python3 >/dev/null 2>&1 || { echo "sharded.sh: no python3: skipped"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/sharded.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
. "$src/tests/support/limit.sh"

# Two probe reports agree: the same layers (names, kinds, shapes, every number) and the same
# errors in the same order; only the paths they were given differ.
same() {
  python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for r in (a, b):
    r.pop("checkpoint"); r.pop("reference"); r.pop("ratio_reference", None)
if a != b:
    for key in a:
        if a[key] != b.get(key):
            if isinstance(a[key], list):
                for x, y in zip(a[key], b[key]):
                    if x != y:
                        print("  first difference in %s:\n   %s\n   %s" % (key, x, y)); break
                else:
                    print("  %s: %d against %d entries" % (key, len(a[key]), len(b[key])))
            else:
                print("  %s: %r against %r" % (key, a[key], b.get(key)))
    sys.exit(1)
PY
}

# ---- the model, whole and in shards -------------------------------------------------------
mkdir "$dir/one" || exit 1
"$st_gen" "$dir/one/m" llama F32 || exit 1
mv "$dir/one/m.safetensors" "$dir/one/model.safetensors"
model=$dir/model
python3 "$split" "$dir/one/model.safetensors" "$model" 3 || exit 1
python3 "$split" "$dir/one/m.prev.safetensors" "$dir/prev" 3 || exit 1
cp "$dir/one/config.json" "$model/" && cp "$dir/one/config.json" "$dir/prev/"
# the cut this test is about: the embedding in the first shard, the head in the last
python3 - "$model/model.safetensors.index.json" <<'PY' || exit 1
import json, sys
m = json.load(open(sys.argv[1]))["weight_map"]
assert m["model.embed_tokens.weight"].startswith("model-00001") and m["lm_head.weight"].startswith("model-00003"), m
PY

expect "the single file" 0 '' "$probe" --json "$dir/one/model.safetensors"
cp "$out_file" "$dir/one.json"
expect "the directory" 0 '' "$probe" --json "$model"
cp "$out_file" "$dir/dir.json"
expect "the index file" 0 '' "$probe" --json "$model/model.safetensors.index.json"
cp "$out_file" "$dir/index.json"
if same "$dir/dir.json" "$dir/one.json"; then pass; else fail "the directory's report differs from the single file's"; fi
if same "$dir/index.json" "$dir/one.json"; then pass; else fail "the index's report differs from the single file's"; fi
# a directory holding the single file is that file
expect "a directory with model.safetensors" 0 '' "$probe" --json "$dir/one"
if same "$out_file" "$dir/one.json"; then pass; else fail "a directory with model.safetensors differs from the file"; fi
python3 - "$dir/dir.json" <<'PY' && pass || fail "the directory: the real lm_head, 4 heads, no tied row"
import json, sys
rows = {r["name"]: r for r in json.load(open(sys.argv[1]))["layers"]}
assert rows["lm_head"]["tensor"] == "lm_head.weight", rows["lm_head"]
assert not any(r["tied"] for r in rows.values()), "a tied row"
att = rows["model.layers.0.self_attn.logits"]
assert att["heads"] == 4 and len(att["head_bounds"]) == 4, att
PY
# the table says the same as the single file's, line by line but for the checkpoint line
"$probe" "$model" | sed 1d >"$dir/dir.txt" 2>&1
"$probe" "$dir/one/model.safetensors" | sed 1d >"$dir/one.txt" 2>&1
if cmp -s "$dir/dir.txt" "$dir/one.txt"; then pass; else fail "the directory's table differs from the file's"; fi
grep -Eq '^model\.layers\.0\.self_attn\.logits .* 4 heads, 2 key heads' "$dir/dir.txt" && pass ||
  fail "the directory: not 4 heads and 2 key heads from config.json"

# --prev: a directory against a directory is the single file against the single file
expect "--prev a directory" 0 '' "$probe" --json "$model" --prev "$dir/prev"
cp "$out_file" "$dir/dirprev.json"
expect "--prev the single file" 0 '' "$probe" --json "$dir/one/model.safetensors" --prev "$dir/one/m.prev.safetensors"
if same "$dir/dirprev.json" "$out_file"; then pass; else fail "--prev DIR differs from --prev FILE"; fi
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert all(l["update"] is not None for l in r["layers"] if l["kind"] != "attention"), r' \
  "$dir/dirprev.json" && pass || fail "--prev DIR: an update missing"

# --hdf5: the trace's record of shared storage sees the shards one after another (their offsets
# restart in every file: taken as they are, tensors of different shards looked like one storage)
if command -v h5dump >/dev/null 2>&1; then
  attrs() { h5dump -A "$1" | grep -Ev '"[0-9]{4}-[0-9]{2}-[0-9]{2}T|^HDF5 "'; }
  expect "--hdf5 of the directory" 0 '' "$probe" "$model" --hdf5 "$dir/dir.h5" --step 1 --quiet
  expect "--hdf5 of the single file" 0 '' "$probe" "$dir/one/model.safetensors" --hdf5 "$dir/one.h5" --step 1 --quiet
  attrs "$dir/dir.h5" >"$dir/dir.attrs" && attrs "$dir/one.h5" >"$dir/one.attrs"
  if cmp -s "$dir/dir.attrs" "$dir/one.attrs"; then pass; else
    fail "--hdf5: the directory's trace attributes (param_count_unique, shares_storage_with) differ from the file's"
    diff "$dir/dir.attrs" "$dir/one.attrs" | head -n 10
  fi
fi

# --hdf5 of a Hugging Face Trainer's checkpoint-500/ (a trailing '/' as the shell completes it):
# the step from the directory's name
cp -r "$model" "$dir/checkpoint-500"
expect "--hdf5 checkpoint-500/" 0 "step 500, from the directory's name" "$probe" "$dir/checkpoint-500/" --hdf5 "$dir/t500.h5"

# one shard alone: its embedding is not the model's head (that is in shard 3); said so
expect "one shard" 0 'shard 1 of 3 .*probe the directory' "$probe" --json "$model/model-00001-of-00003.safetensors"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert not any(l["kind"] == "lm_head" for l in r["layers"]), r["layers"]' \
  "$out_file" && pass || fail "one shard: a tied head invented from the embedding"
expect "the last shard" 0 'shard 3 of 3' "$probe" "$model/model-00003-of-00003.safetensors"
grep -Eq '^lm_head +lm_head ' "$out_file" && pass || fail "the last shard: its lm_head not measured"

# ---- a Hugging Face cache: snapshots/<sha>/ of symbolic links into ../../blobs/ ------------
cache=$dir/hub/models--test--llama
mkdir -p "$cache/blobs" "$cache/snapshots/0123abc" "$cache/refs"
for f in "$model"/*; do
  b=$(sha256sum "$f" | cut -c1-40)
  cp "$f" "$cache/blobs/$b"
  ln -s "../../blobs/$b" "$cache/snapshots/0123abc/$(basename "$f")"
done
expect "a Hugging Face cache snapshot" 0 '' "$probe" --json "$cache/snapshots/0123abc"
if same "$out_file" "$dir/one.json"; then pass; else fail "the cache snapshot's report differs"; fi

# ---- indexes that are wrong ------------------------------------------------------------------
# bad NAME CODE PATTERN: a copy of the model whose index is edited by the python on stdin (ix is
# the parsed index, d the directory; it may write files), then probed; the message must match.
bad() {
  what=$1 code=$2 pattern=$3
  rm -rf "$dir/bad" && cp -r "$model" "$dir/bad"
  { echo 'import json, os, sys'; echo 'd = sys.argv[1]; p = os.path.join(d, "model.safetensors.index.json"); ix = json.load(open(p))'
    cat; echo 'json.dump(ix, open(p, "w")) if ix is not None else None'; } >"$dir/edit.py"
  python3 "$dir/edit.py" "$dir/bad" || { fail "$what: the edit failed"; return; }
  expect "$what" "$code" "$pattern" "$probe" "$dir/bad"
}
s1=model-00001-of-00003.safetensors s2=model-00002-of-00003.safetensors s3=model-00003-of-00003.safetensors
ixre='bad/model\.safetensors\.index\.json'
bad "not JSON" 2 "$ixre: byte [0-9]+: " <<'PY'
open(p, "w").write('{"weight_map": {"a": "b",}}'); ix = None
PY
bad "no weight_map" 2 "$ixre: not a sharded checkpoint's index: no \"weight_map\" object" <<'PY'
ix = {"metadata": {}, "weights": ix["weight_map"]}
PY
bad "weight_map an array" 2 "$ixre: .*\"weight_map\" is not an object" <<'PY'
ix["weight_map"] = list(ix["weight_map"])
PY
bad "a value not a string" 2 "$ixre: byte [0-9]+: tensor 'model.norm.weight': the shard is a number" <<'PY'
ix["weight_map"]["model.norm.weight"] = 3
PY
bad "a shard outside the model" 2 "$ixre: tensor 'lm_head.weight': shard name '\.\./model/$s3' holds a '/'" <<PY
ix["weight_map"]["lm_head.weight"] = "../model/$s3"
PY
bad "an absolute shard path" 2 "shard name '/etc/passwd' holds a '/'" <<'PY'
ix["weight_map"]["lm_head.weight"] = "/etc/passwd"
PY
bad "a shard named .." 2 "shard name '\.\.' is a directory's name" <<'PY'
ix["weight_map"]["lm_head.weight"] = ".."
PY
bad "a tensor twice in the index" 2 "$ixre: byte [0-9]+: key \"lm_head.weight\" appears twice" <<PY
t = open(p).read().replace('"lm_head.weight"', '"lm_head.weight": "$s3", "lm_head.weight"', 1)
open(p, "w").write(t); ix = None
PY
bad "a shard missing" 2 "$ixre: shard '$s2' \(holding tensor '.*' and others\) is missing or unreadable: .*No such file" <<PY
os.remove(os.path.join(d, "$s2"))
PY
bad "a shard not safetensors" 2 "$ixre: shard '$s2' .* is not a valid safetensors file: " <<PY
open(os.path.join(d, "$s2"), "w").write("not a safetensors file\n")
PY
bad "a shard truncated" 2 "$ixre: shard '$s3' .* is not a valid safetensors file: .*" <<PY
q = os.path.join(d, "$s3"); b = open(q, "rb").read(); open(q, "wb").write(b[:len(b) - 4])
PY
bad "a shard a directory" 2 "$ixre: shard '$s2' .* is not a regular file: .*directory" <<PY
os.remove(os.path.join(d, "$s2")); os.mkdir(os.path.join(d, "$s2"))
PY
bad "a shard a FIFO" 2 "$ixre: shard '$s2' .* is not a regular file: .*FIFO" <<PY
os.remove(os.path.join(d, "$s2")); os.mkfifo(os.path.join(d, "$s2"))
PY
bad "a tensor in another shard than the index says" 2 \
  "$ixre: tensor 'model.norm.weight' is in shard '$s3', but the index says shard '$s1'" <<PY
ix["weight_map"]["model.norm.weight"] = "$s1"
PY
bad "a tensor the index lists in no shard" 2 \
  "$ixre: tensor 'model.ghost.weight': the index names shard '$s2', which does not hold it" <<PY
ix["weight_map"]["model.ghost.weight"] = "$s2"
PY
bad "a tensor of a shard the index does not list" 2 \
  "$ixre: shard '$s3' holds tensor 'model.norm.weight', which the index does not list" <<'PY'
del ix["weight_map"]["model.norm.weight"]
PY
bad "an empty weight_map" 2 "$ixre: \"weight_map\" is empty" <<'PY'
ix["weight_map"] = {}
PY
# the index a FIFO: refused at once (never waiting for a writer)
mkfifo "$dir/fifo.index.json"
expect "the index a FIFO" 2 "fifo\.index\.json: not a regular file: it is a FIFO" "$probe" "$dir/fifo.index.json"
# the directory with a trailing '/' (as the shell completes it): the same model, paths without '//'
expect "the directory as DIR/" 0 '' "$probe" --json "$model/"
if same "$out_file" "$dir/one.json"; then pass; else fail "DIR/ differs from the single file"; fi
rm -rf "$dir/slash" && cp -r "$model" "$dir/slash" && rm "$dir/slash/$s2"
expect "DIR/ with a shard missing" 2 "[^/]/slash/model\.safetensors\.index\.json: shard '$s2' .* unreadable: [^ ]*[^/]/slash/$s2: cannot open" \
  "$probe" "$dir/slash/"
# a tensor in two shards (shard_split.py --dup writes the copy)
python3 "$split" "$dir/one/model.safetensors" "$dir/dup" 3 --dup model.norm.weight || exit 1
expect "a tensor in two shards" 2 "dup/model\.safetensors\.index\.json: tensor 'model.norm.weight' is in two shards, '$s3' and 'model-dup\.safetensors'" \
  "$probe" "$dir/dup"
# total_size: a mismatch is a warning (every tensor was checked), never a refusal
bad "total_size off by one" 0 "warning: .*$ixre: \"metadata.total_size\" is [0-9]+ bytes, but the shards' tensors hold 11584" <<'PY'
ix["metadata"]["total_size"] += 1
PY
bad "total_size a string" 0 'warning: .*"metadata.total_size" is a string' <<'PY'
ix["metadata"]["total_size"] = "11584"
PY
bad "no metadata" 0 '' <<'PY'
del ix["metadata"]
PY
grep -q warning "$err_file" && fail "no metadata: a warning: $(cat "$err_file")" || pass
# PyTorch weights: the directory says so; an index of .bin shards names what the shard is
mkdir "$dir/torch" && printf 'PK\003\004' >"$dir/torch/pytorch_model.bin"
expect "a directory of PyTorch weights" 2 "torch: a directory with neither .*; it has PyTorch weights .*convert them to safetensors" \
  "$probe" "$dir/torch"
printf '\200\002\212\012\154\374\234\106\371\040\152\250\120\031.' >"$dir/torch/pytorch_model-00001-of-00001.bin"
printf '{"weight_map": {"a": "pytorch_model-00001-of-00001.bin"}}\n' >"$dir/torch/pytorch_model.bin.index.json"
expect "an index of PyTorch shards" 2 \
  "shard 'pytorch_model-00001-of-00001\.bin' .* is not a valid safetensors file: .*a PyTorch checkpoint \(legacy pickle" \
  "$probe" "$dir/torch/pytorch_model.bin.index.json"
# a directory with no weights; with two indexes and no model.safetensors.index.json
mkdir "$dir/empty"
expect "a directory without weights" 2 "empty: a directory with neither model.safetensors nor model.safetensors.index.json" \
  "$probe" "$dir/empty"
touch "$dir/empty/a.safetensors.index.json" "$dir/empty/b.safetensors.index.json"
expect "a directory with two indexes" 2 "empty: 2 files named \*\.safetensors\.index\.json" "$probe" "$dir/empty"
# an index under another name (Mistral's consolidated.safetensors.index.json) is found alone
rm -rf "$dir/other" && cp -r "$model" "$dir/other" && mv "$dir/other/model.safetensors.index.json" "$dir/other/consolidated.safetensors.index.json"
expect "an index of another name" 0 '' "$probe" --json "$dir/other"
if same "$out_file" "$dir/one.json"; then pass; else fail "the consolidated index's report differs"; fi
# the index as --prev, wrong: the message names it, exit 2
cp "$dir/one/config.json" "$dir/config.index.json"
expect "--prev a bad index" 2 "config\.index\.json: not a sharded checkpoint's index: no \"weight_map\"" \
  "$probe" "$model" --prev "$dir/config.index.json"

# ---- config.json ---------------------------------------------------------------------------
# cfg NAME CODE PATTERN JSON: the model with this config.json, probed as a directory
cfg() {
  what=$1 code=$2 pattern=$3
  rm -rf "$dir/c" && cp -r "$model" "$dir/c" && printf '%s\n' "$4" >"$dir/c/config.json"
  expect "$what" "$code" "$pattern" "$probe" --json "$dir/c"
}
cfg "config.json malformed" 2 'c/config\.json: byte [0-9]+: ' '{"num_attention_heads": 4,'
cfg "config.json heads \"abc\"" 2 'c/config\.json: "num_attention_heads" is a string "abc", not a whole number' \
  '{"num_attention_heads": "abc"}'
cfg "config.json heads 4.5" 2 'c/config\.json: "num_attention_heads" is 4.5, not a whole number' '{"num_attention_heads": 4.5}'
# a whole number written as JSON writes floats: 4.0 and 4e0 are 4 heads
cfg "config.json heads 4.0" 0 '' '{"num_attention_heads": 4.0, "num_key_value_heads": 2e0}'
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); a=[l for l in r["layers"] if l["kind"] == "attention"]; assert a and a[0]["heads"] == 4, a' \
  "$out_file" && pass || fail "config.json heads 4.0: not 4 heads"
# a config.json that is a symbolic link looping or leading nowhere: ignored with a word, as a FIFO is
rm -rf "$dir/c" && cp -r "$model" "$dir/c" && rm -f "$dir/c/config.json" && ln -s config.json "$dir/c/config.json"
expect "config.json a symlink loop" 0 'c/config\.json: cannot be read \(.*symbolic links.*\); ignored' "$probe" --json "$dir/c"
rm -f "$dir/c/config.json" && ln -s nowhere.json "$dir/c/config.json"
expect "config.json a dangling symlink" 0 'c/config\.json: cannot be read \(a symbolic link to nothing\); ignored' "$probe" --json "$dir/c"
cfg "config.json heads 0" 2 'c/config\.json: "num_attention_heads" is 0, not a whole number from 1' '{"num_attention_heads": 0}'
cfg "config.json kv heads not dividing" 2 \
  'c/config\.json: "num_key_value_heads" 3 does not divide "num_attention_heads" 4' \
  '{"num_attention_heads": 4, "num_key_value_heads": 3}'
cfg "config.json n_head against num_attention_heads" 2 '"n_head" is 2 but "num_attention_heads" is 4' \
  '{"num_attention_heads": 4, "n_head": 2}'
cfg "config.json tie a string" 2 '"tie_word_embeddings" is a string, not true or false' '{"tie_word_embeddings": "yes"}'
cfg "config.json a key twice" 2 'key "num_attention_heads" appears twice' '{"num_attention_heads": 4, "num_attention_heads": 2}'
cfg "config.json an array" 2 'c/config\.json: the top level is an array, not an object' '[4]'
# key heads that do not match the key's width: that attention row's reason, the rest measured
cfg "config.json kv heads against the key width" 0 '' '{"num_attention_heads": 4, "num_key_value_heads": 4}'
python3 - "$out_file" <<'PY' && pass || fail "kv heads 4 against a key of 2 heads: not the attention row's reason"
import json, sys
r = json.load(open(sys.argv[1]))
e = [x for x in r["errors"] if x["name"] == "model.layers.0.self_attn.logits"]
assert e and "num_key_value_heads 4 (of width 6) does not match the key width 12" in e[0]["message"], r["errors"]
assert any(l["name"] == "lm_head" for l in r["layers"])
PY
cfg "config.json head_dim against the query width" 0 '' '{"num_attention_heads": 4, "head_dim": 8}'
grep -q "head_dim 8 times 4 heads is not the query width 24" "$out_file" && pass || fail "head_dim: not the attention row's reason"
# a multimodal config: the text model's values under text_config
cfg "config.json text_config" 0 '' '{"architectures": ["X"], "text_config": {"num_attention_heads": 4, "num_key_value_heads": 2}}'
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); a=[l for l in r["layers"] if l["kind"] == "attention"]; assert a and a[0]["heads"] == 4, r' \
  "$out_file" && pass || fail "text_config: heads not read there"
# tie_word_embeddings, on a model without its lm_head
rm -rf "$dir/nohead" && python3 "$split" "$dir/one/model.safetensors" "$dir/nohead" 3 --drop lm_head.weight || exit 1
printf '{"num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": false}\n' >"$dir/nohead/config.json"
expect "tie_word_embeddings false, no lm_head" 0 'tie_word_embeddings false.*the head is missing' "$probe" --json "$dir/nohead"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert not any(l["kind"] == "lm_head" for l in r["layers"]), r' \
  "$out_file" && pass || fail "tie false: a tied head invented"
printf '{"num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": true}\n' >"$dir/nohead/config.json"
expect "tie_word_embeddings true, no lm_head" 0 '' "$probe" --json "$dir/nohead"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); h=[l for l in r["layers"] if l["kind"] == "lm_head"]; assert len(h) == 1 and h[0]["tied"] and h[0]["tensor"] == "model.embed_tokens.weight", h' \
  "$out_file" && pass || fail "tie true: the embedding is not the head"
# config.json beside a single file counts the same: malformed there is exit 2 too
printf '{"num_attention_heads": "abc"}\n' >"$dir/one/config.json"
expect "config.json beside a file, heads \"abc\"" 2 'one/config\.json: "num_attention_heads" is a string' \
  "$probe" "$dir/one/model.safetensors"

summary sharded.sh
