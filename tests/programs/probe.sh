#!/bin/sh
# Runs harness/probe on checkpoints written by tests/support/st_gen (GPT-2 and Llama names; F32,
# F16, BF16) and checks the table, the JSON report (valid JSON, values equal to
# stab_layer_metrics in exact mode, --prev updates, the tied head, tensors not measured
# listed with a reason), the exit codes, and replays the malformed-file corpus (exit 2); that
# layer names equal the group names of stabmeter-train's trace of the same model; --sort and
# --top against python sorting the JSON, the summary against the largest values; --filter and
# --prev that match nothing (exit 2, one line); the --hdf5 step from the checkpoint's metadata.
set -u
top=$(pwd)
src=${srcdir:-.}
# the Python checks below read traces of every format through tests/support/trace_layers.py
STAB_TESTS_DIR=$(cd "$src/tests/support" && pwd); export STAB_TESTS_DIR
probe=$top/harness/probe
gen=$top/tests/support/st_gen
dir=$(mktemp -d "${TMPDIR:-/tmp}/probe_sh.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
fails=0
checks=0
. "$src/tests/support/limit.sh" # expect, pass, fail (a failure counts as a check too)
ok() { checks=$((checks + 1)); }
have_py=0
command -v python3 >/dev/null 2>&1 && have_py=1

# compare JSON REF TOL [NEED_UPDATE]: every ref line's layer (name, kind) is in the report
# with forward, dependency and update within relative tolerance TOL (null where ref is nan).
compare() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, math, sys
rep = json.load(open(sys.argv[1]))
tol = float(sys.argv[3])
assert rep["format"] == "stabmeter-probe" and rep["format_version"] == 2, "header keys"
# st_gen names a layer by its tensor (the attention rows, and the q, k, v of a fused tensor,
# by the layer's name)
layers = {(l["tensor"], l["kind"]): l for l in rep["layers"]}
layers.update({(l["name"], l["kind"]): l for l in rep["layers"] if l["kind"] == "attention" or l["name"] != l["tensor"]})
bad = 0
for line in open(sys.argv[2]):
    name, kind, *vals = line.split()
    l = layers.get((name, kind))
    if l is None:
        print("missing layer", name, kind); bad += 1; continue
    for key, want in zip(("forward", "dependency", "update"), map(float, vals)):
        got = l[key]
        if math.isnan(want):
            if got is not None: print(name, kind, key, "want null, got", got); bad += 1
        elif got is None or abs(got - want) > tol * abs(want):
            print(name, kind, key, "got", got, "want", want); bad += 1
sys.exit(1 if bad else 0)
PY
}

# heads JSON HEADS TOL: each attention layer's head_bounds against st_gen's brute force
# (per-head Gram matrices diagonalised by Jacobi rotations), and its forward is their max
heads() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
tol = float(sys.argv[3])
att = {l["name"]: l for l in rep["layers"] if l["kind"] == "attention"}
want = {}
for line in open(sys.argv[2]):
    name, h, b = line.split()
    want.setdefault(name, {})[int(h)] = float(b)
bad = 0
for name, hb in want.items():
    l = att.get(name)
    if l is None:
        print("missing attention layer", name); bad += 1; continue
    if len(l["head_bounds"]) != len(hb) or l["heads"] != len(hb):
        print(name, "heads", l["heads"], len(l["head_bounds"]), "want", len(hb)); bad += 1; continue
    for h, b in hb.items():
        if abs(l["head_bounds"][h] - b) > tol * b:
            print(name, "head", h, "got", l["head_bounds"][h], "want", b); bad += 1
    if l["forward"] != max(l["head_bounds"]):
        print(name, "forward is not the max over heads"); bad += 1
sys.exit(1 if bad else 0)
PY
}

# table P EXT LABEL: the table of P.EXT against P.prev.EXT in P.txt (stderr in P.err), with a
# row for every layer (name and kind) that st_gen listed in P.ref by its tensor's name: the
# layer is named as a trace names it, without .weight, and a tied head (an lm_head line of a
# tensor listed as embedding too) is lm_head
table() {
  "$probe" "$1.$2" --prev "$1.prev.$2" >"$1.txt" 2>"$1.err" || fail "$3: table exit $?: $(cat "$1.err")"
  while read -r name kind rest; do
    layer=${name%.weight}
    [ "$kind" = lm_head ] && grep -q "^$name embedding " "$1.ref" && layer=lm_head
    grep -Eq "^$layer +$kind +" "$1.txt" || fail "$3: table lacks '$layer $kind' (tensor $name)"
  done <"$1.ref"
}

for model in gpt2 llama; do
  for dt in F32 F16 BF16; do
    p=$dir/${model}_$dt
    "$gen" "$p" $model $dt || { fail "st_gen $model $dt"; continue; }
    # the table: one line per layer, kinds and layouts by the rule table
    table "$p" safetensors "$model $dt"
    ok
    if [ $model = gpt2 ]; then
      # the fused Conv1D c_attn [16][48]: q, k, v, each its 16 columns of the stored rows
      grep -Eq '^h\.0\.attn\.c_attn\.q +linear +16x48 .*in-major \+bias q: columns 0-15 ' "$p.txt" &&
        grep -Eq '^h\.0\.attn\.c_attn\.v +linear +16x48 .*in-major \+bias v: columns 32-47 ' "$p.txt" &&
        ! grep -Eq '^h\.0\.attn\.c_attn +' "$p.txt" || fail "gpt2 $dt: Conv1D rows"
      grep -Eq '^lm_head +lm_head .*tied to wte\.weight' "$p.txt" || fail "gpt2 $dt: tied head row"
      grep -q 'h.0.attn.bias: a 3-D or higher tensor (4 dimensions)' "$p.txt" || fail "gpt2 $dt: 4-D buffer not listed"
      grep -q 'position_ids: dtype I64' "$p.txt" || fail "gpt2 $dt: I64 tensor not listed"
      grep -q 'metadata source = st_gen' "$p.txt" || fail "gpt2 $dt: metadata not shown"
      grep -q "^h.0.attn.c_attn.bias " "$p.txt" && fail "gpt2 $dt: folded bias has a row of its own"
      grep -Eq '^h\.0\.ln_1 +gain ' "$p.txt" && grep -Eq '^h\.0\.ln_1\.bias +bias ' "$p.txt" ||
        fail "gpt2 $dt: a LayerNorm's gain and bias not named apart"
    else
      grep -Eq '^lm_head +lm_head ' "$p.txt" || fail "llama $dt: lm_head row"
      grep -q 'tied to' "$p.txt" && fail "llama $dt: untied model reports a tied head"
      grep -q 'model.layers.0.experts: a 3-D' "$p.txt" || fail "llama $dt: 3-D tensor not listed"
    fi
    ok
    # the JSON: exact mode against the library's exact values
    "$probe" "$p.safetensors" --prev "$p.prev.safetensors" --json --exact >"$p.json" 2>"$p.err" ||
      fail "$model $dt: --json --exact exit $?: $(cat "$p.err")"
    grep -q '"errors": \[' "$p.json" || fail "$model $dt: no errors array"
    if [ $have_py = 1 ]; then
      compare "$p.json" "$p.ref" 1e-9 || fail "$model $dt: exact values differ from stab_layer_metrics"
      python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["metadata"]; assert m == {"format": "pt", "source": "st_gen"}, m' "$p.json" ||
        fail "$model $dt: JSON metadata"
      # per-head attention bounds (GPT-2: fused c_attn, heads from --heads; Llama: q_proj and
      # k_proj, grouped-query, heads from config.json) against the brute force
      hopt=; [ $model = gpt2 ] && hopt="--heads 2"
      "$probe" "$p.safetensors" $hopt --json --exact >"$p.h.json" 2>"$p.err" || fail "$model $dt: heads exit $?"
      heads "$p.h.json" "$p.heads" 1e-9 || fail "$model $dt: exact per-head bounds differ from the brute force"
      "$probe" "$p.safetensors" $hopt --json >"$p.h.json" 2>"$p.err" || fail "$model $dt: heads exit $?"
      heads "$p.h.json" "$p.heads" 2e-3 || fail "$model $dt: default-mode per-head bounds off"
      # default mode (Lanczos, tol 1e-3): the same values within the tolerance
      "$probe" "$p.safetensors" --prev "$p.prev.safetensors" --json >"$p.lz.json" 2>/dev/null ||
        fail "$model $dt: --json exit $?"
      compare "$p.lz.json" "$p.ref" 2e-3 || fail "$model $dt: default-mode values off"
      # without --prev every update is null
      "$probe" "$p.safetensors" --json >"$p.noprev.json" || fail "$model $dt: no-prev exit"
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["reference"] is None; assert all(l["update"] is None for l in r["layers"]); assert any(e["name"] in ("position_ids","model.layers.0.experts") for e in r["errors"])' "$p.noprev.json" ||
        fail "$model $dt: no-prev report"
    fi
    ok
  done
done

# llm.c checkpoints: split qkv, attention logits, tied wte, padding rows (1e6) left out
for dt in F32 BF16; do
  p=$dir/llmc_$dt
  "$gen" "$p" llmc $dt || { fail "st_gen llmc $dt"; continue; }
  table "$p" bin "llmc $dt"
  grep -q "llm.c checkpoint version $([ $dt = F32 ] && echo 3 || echo 5)" "$p.txt" || fail "llmc $dt: header line"
  grep -Eq '^lm_head +lm_head .*tied to wte ' "$p.txt" || fail "llmc $dt: tied head"
  "$probe" "$p.bin" --prev "$p.prev.bin" --json --exact >"$p.json" 2>"$p.err" || fail "llmc $dt: json exit $?"
  if [ $have_py = 1 ]; then
    compare "$p.json" "$p.ref" 1e-9 || fail "llmc $dt: exact values differ from stab_layer_metrics"
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); a=[l for l in r["layers"] if l["kind"]=="attention"]; assert len(a)==2 and all(len(l["head_bounds"])==2 and max(l["head_bounds"])==l["forward"] for l in a); assert not r["errors"]' "$p.json" ||
      fail "llmc $dt: attention entries"
  fi
  ok
done

# A thin llm.c file declaring many one-channel blocks (16 tensors each, 100 bytes of weights):
# every bias is folded into its weight by a lookup, not a scan of every row. At 20000 blocks
# (320004 tensors, 2 MB) the scan took 9.5 minutes here and the lookup 2.4 s, so a generous
# limit tells the two apart. The sanitizer build (STAB_SANITIZED, set by make check-sanitize)
# runs every line some 20 times slower: it walks the same code at 2000 blocks, for memory
# errors only; the plain build is the one that guards the complexity.
le32() { printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)))"; }
blocks=20000
if [ -n "${STAB_SANITIZED:-}" ]; then blocks=2000; fi
thin=$dir/llmc_thin.bin
# header: magic, version 3 (f32), max_t 1, vocab 1, layers, 1 head, 1 channel, padded vocab 1;
# then 2 embeddings of 1, per block 13 tensors of 1 float and 3 of 4, and the final norm's 2
{ for v in 20240326 3 1 1 $blocks 1 1 1; do le32 $v; done
  head -c $((4 * 248)) /dev/zero; head -c $((4 * (25 * blocks + 4))) /dev/zero; } >"$thin"
if [ "$(stat -c %s "$thin")" -ne $((1024 + 4 * (25 * blocks + 4))) ]; then
  fail "thin llm.c file: $(stat -c %s "$thin") bytes"
elif timeout 120 "$probe" "$thin" --quiet >"$dir/thin.txt" 2>"$dir/thin.err"; then
  # six linear layers a block, each with its bias folded in
  folded=$(grep -c ' +bias *$' "$dir/thin.txt")
  if [ "$folded" -eq $((6 * blocks)) ]; then ok
  else fail "thin llm.c file: $folded layers with a folded bias, expected $((6 * blocks))"; fi
else
  fail "thin llm.c file ($blocks blocks): exit $? (124: over 120 s): $(tail -n 2 "$dir/thin.err")"
fi

# Names and metadata from the file reach the terminal escaped: a tensor name and a metadata
# value holding ESC sequences (JSON \u001b) print as \x1b, never as the raw byte.
ctl=$dir/ctl.safetensors
hdr='{"__metadata__":{"note":"a\u001b[31mred"},"bad\u001b[2Jname.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
{ le32 ${#hdr}; le32 0; printf '%s' "$hdr"; head -c 4 /dev/zero; } >"$ctl"
if "$probe" "$ctl" >"$dir/ctl.txt" 2>"$dir/ctl.err"; then
  if grep -q "$(printf '\033')" "$dir/ctl.txt"; then fail "a raw ESC byte reached the table"
  elif ! grep -q 'metadata note = a\\x1b\[31mred' "$dir/ctl.txt" || ! grep -q '^  bad\\x1b\[2Jname.weight: ' "$dir/ctl.txt"; then
    fail "escaped name or metadata not shown: $(cat "$dir/ctl.txt")"
  else ok; fi
else
  fail "control characters in names: exit $?: $(cat "$dir/ctl.err")"
fi

# GGUF with llama.cpp names: ne[] order (attn_k ne = {16, 8} is 8x16, d_in 16), tied
# token_embd, the Q8_0 tensor measured and shown with its type, metadata shown; values as for safetensors
for dt in F32 F16 BF16; do
  p=$dir/gguf_$dt
  "$gen" "$p" gguf $dt || { fail "st_gen gguf $dt"; continue; }
  table "$p" gguf "gguf $dt"
  grep -Eq "^blk\.0\.attn_k +linear +8x16 +$dt " "$p.txt" || fail "gguf $dt: attn_k shape"
  grep -Eq '^lm_head +lm_head .*tied to token_embd\.weight' "$p.txt" || fail "gguf $dt: tied head"
  grep -Eq '^blk\.0\.ffn_up +linear +40x32 +Q8_0 ' "$p.txt" || fail "gguf $dt: Q8_0 tensor not measured as Q8_0"
  grep -q 'rope_freqs.weight: a 1-D tensor' "$p.txt" || fail "gguf $dt: rope_freqs not listed"
  grep -Eq '^blk\.0\.attn_logits +attention .* 4 heads, 2 key heads' "$p.txt" || fail "gguf $dt: attention row"
  "$probe" "$p.gguf" --per-head >"$p.ph.txt" || fail "gguf $dt: --per-head exit $?"
  [ "$(grep -Ec '^blk\.0\.attn_logits\.head[0-3] +attention +4x16 ' "$p.ph.txt")" = 4 ] || fail "gguf $dt: per-head rows"
  grep -q 'metadata llama.attention.head_count = 4' "$p.txt" || fail "gguf $dt: metadata not shown"
  grep -q 'metadata tokenizer.ggml.tokens = \[4 x string\]' "$p.txt" || fail "gguf $dt: array metadata"
  "$probe" "$p.gguf" --prev "$p.prev.gguf" --json --exact >"$p.json" 2>"$p.err" || fail "gguf $dt: json exit $?"
  if [ $have_py = 1 ]; then
    compare "$p.json" "$p.ref" 1e-9 || fail "gguf $dt: exact values differ from stab_layer_metrics"
    heads "$p.json" "$p.heads" 1e-9 || fail "gguf $dt: exact per-head bounds differ from the brute force"
    python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["metadata"]; assert m["general.architecture"] == "llama" and m["llama.attention.head_count"] == 4 and m["llama.rope.freq_base"] == 10000.0 and m["tokenizer.ggml.add_bos_token"] is True and m["tokenizer.ggml.tokens"] == {"array": "string", "length": 4}, m' "$p.json" ||
      fail "gguf $dt: JSON metadata"
    "$probe" "$p.gguf" --prev "$p.prev.gguf" --json >"$p.lz.json" 2>/dev/null || fail "gguf $dt: --json exit $?"
    compare "$p.lz.json" "$p.ref" 2e-3 || fail "gguf $dt: default-mode values off"
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); l=[x for x in r["layers"] if x["name"]=="blk.0.attn_k"][0]; assert (l["d_in"], l["d_out"], l["shape"], l["layout"]) == (16, 8, [8, 16], "out_major"), l' "$p.json" ||
      fail "gguf $dt: attn_k d_in/d_out"
  fi
  ok
done

# --hdf5: checkpoints probed one by one build a trace (steps from the names or --step),
# read back with h5py against each run's --json; a trace of other layers is refused
p=$dir/gguf_F32
cp "$p.prev.gguf" "$dir/step-000100.gguf" && cp "$p.gguf" "$dir/model_00000200.gguf" && cp "$p.gguf" "$dir/plain.gguf"
tr=$dir/trace.h5
"$probe" "$dir/step-000100.gguf" --hdf5 "$tr" --json >"$dir/t100.json" 2>"$dir/t.err" || fail "hdf5 step 100: exit $?: $(cat "$dir/t.err")"
"$probe" "$dir/model_00000200.gguf" --prev "$dir/step-000100.gguf" --hdf5 "$tr" --json >"$dir/t200.json" 2>"$dir/t.err" ||
  fail "hdf5 step 200: exit $?: $(cat "$dir/t.err")"
"$probe" "$dir/plain.gguf" --hdf5 "$tr" --step 300 --json >"$dir/t300.json" 2>"$dir/t.err" || fail "hdf5 --step 300: exit $?"
"$probe" "$dir/plain.gguf" --hdf5 "$dir/other.h5" >/dev/null 2>"$dir/t.err"
rc=$?
[ $rc -eq 2 ] || fail "hdf5 without a step: exit $rc, want 2"
grep -q "plain.gguf: no step in its metadata or its file name" "$dir/t.err" || fail "hdf5 without a step: message: $(cat "$dir/t.err")"
[ -e "$dir/other.h5" ] && fail "hdf5 without a step: a trace was written"
# no step from a number that is no step: a model's version or size, a shard's index
for n in tinyllama-1.1b-chat-v1.0.Q8_0.gguf model-00001-of-00003.gguf llama-2-7b.gguf; do
  cp "$p.gguf" "$dir/$n"
  "$probe" "$dir/$n" --hdf5 "$dir/other.h5" >/dev/null 2>"$dir/t.err"
  rc=$?
  [ $rc -eq 2 ] || fail "hdf5 of $n: exit $rc, want 2 (no step in the name): $(cat "$dir/t.err")"
  grep -q "$n: no step in its metadata or its file name" "$dir/t.err" || fail "hdf5 of $n: message: $(cat "$dir/t.err")"
  [ -e "$dir/other.h5" ] && fail "hdf5 of $n: a trace was written" && rm -f "$dir/other.h5"
  rm -f "$dir/$n"
done
cp "$p.gguf" "$dir/run.checkpoint-700.gguf"
"$probe" "$dir/run.checkpoint-700.gguf" --hdf5 "$dir/other.h5" >/dev/null 2>"$dir/t.err" ||
  fail "hdf5 of checkpoint-700: exit $?: $(cat "$dir/t.err")"
grep -q "other.h5: step 700, from the file name" "$dir/t.err" || fail "hdf5 of checkpoint-700: $(cat "$dir/t.err")"
rm -f "$dir/other.h5" "$dir/run.checkpoint-700.gguf"
"$probe" "$dir/plain.gguf" --step 5 >/dev/null 2>&1; [ $? -eq 2 ] || fail "--step without --hdf5: not exit 2"
"$probe" "$dir/plain.gguf" --step -5 --hdf5 "$tr" >/dev/null 2>&1; [ $? -eq 2 ] || fail "--step -5: not exit 2"
"$probe" "$dir/gpt2_F32.safetensors" --hdf5 "$tr" --step 400 >"$dir/t.out" 2>"$dir/t.err"
rc=$?
[ $rc -eq 2 ] || fail "hdf5 other layers: exit $rc, want 2"
grep -q "trace.h5: .*does not match" "$dir/t.err" || fail "hdf5 other layers: message: $(cat "$dir/t.err")"
py5=
for c in "${PYTHON:-python3}" /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import h5py' 2>/dev/null; then py5=$c; break; fi
done
[ -n "$py5" ] || fail "hdf5: no python3 with h5py to read the trace back (apt-get install python3-h5py)"
if [ -n "$py5" ]; then
  "$py5" - "$tr" "$dir/t100.json" "$dir/t200.json" "$dir/t300.json" <<'PY' || fail "hdf5: the trace differs from --json"
import h5py, json, math, sys
import os as _os, sys as _sys
_sys.path.insert(0, _os.environ["STAB_TESTS_DIR"])
from trace_layers import layer_groups
f = h5py.File(sys.argv[1], "r", swmr=True)
assert list(f["step"][:]) == [100, 200, 300], f["step"][:]
assert f.attrs["format"] in (b"stabmeter-trace", "stabmeter-trace")
assert all(math.isnan(x) for x in f["wall_time"][:])
for row, path in enumerate(sys.argv[2:]):
    rep = json.load(open(path))
    assert rep["layers"], path
    assert len(layer_groups(f)) == len(rep["layers"]), (len(layer_groups(f)), len(rep["layers"]))
    for l in rep["layers"]:
        g = layer_groups(f)[l["name"]]  # the trace's names are the report's
        kind = g.attrs["kind"].decode() if isinstance(g.attrs["kind"], bytes) else g.attrs["kind"]
        assert (kind, int(g.attrs["d_in"]), int(g.attrs["d_out"])) == (l["kind"], l["d_in"], l["d_out"]), l["name"]
        for key in ("forward", "dependency", "update", "sigma", "sigma_update", "rel_update", "forward_tight"):
            got, want = g[key][row], l[key]
            assert (math.isnan(got) and want is None) or got == want, (path, l["name"], key, got, want)
    # the update exists only in the run with --prev
    assert any(l["update"] is not None for l in rep["layers"]) == (row == 1), path
PY
fi
ok

# a NaN in a weight: that layer's metrics are NaN (null) and flagged, the others stand
p=$dir/nan
"$gen" "$p" gpt2 F32 nan
"$probe" "$p.safetensors" --json >"$p.json" || fail "nan: exit $?"
if [ $have_py = 1 ]; then
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
l = {x["name"]: x for x in r["layers"] if x["kind"] != "lm_head"}
assert l["h.0.attn.c_proj"]["forward"] is None and "nonfinite_weight" in l["h.0.attn.c_proj"]["flags"]
assert l["h.0.mlp.c_fc"]["forward"] is not None and not l["h.0.mlp.c_fc"]["flags"]
# the summary names the broken layer as the worst linear one, its value null
assert r["summary"]["linear"]["forward"] == {"layer": "h.0.attn.c_proj", "value": None, "unit": "1"}, r["summary"]' "$p.json" ||
    fail "nan: report"
fi
ok

# names that need escaping in the JSON report: quote, backslash, control character, UTF-8
if [ $have_py = 1 ]; then
  python3 - "$dir/esc.safetensors" <<'PY'
import json, struct, sys
names = ['we"ird\\name.weight', 'tab\tname.weight', 'caf\u00e9.weight']
hdr = '{' + ', '.join('%s: {"dtype": "F32", "shape": [2, 2], "data_offsets": [%d, %d]}' % (json.dumps(n, ensure_ascii=False), 16 * i, 16 * i + 16)
                      for i, n in enumerate(names)) + '}'
data = struct.pack('<12f', *[1, 0, 0, 2, 3, 0, 0, 1, 1, 1, 1, 1])
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(hdr.encode())) + hdr.encode() + data)
PY
  "$probe" "$dir/esc.safetensors" --json --exact >"$dir/esc.json" || fail "escapes: exit $?"
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1], encoding="utf-8"))
got = {l["tensor"]: l for l in r["layers"]}
assert set(got) == {"we\"ird\\name.weight", "tab\tname.weight", "caf\u00e9.weight"}, got.keys()
assert {l["name"] for l in r["layers"]} == {"we\"ird\\name", "tab\tname", "caf\u00e9"}, [l["name"] for l in r["layers"]]
assert abs(got["we\"ird\\name.weight"]["dependency"] - 2.0) < 1e-12   # sigma(diag(1, 2)), square
assert abs(got["caf\u00e9.weight"]["dependency"] - 2.0) < 1e-12          # sigma(all ones 2x2) = 2
' "$dir/esc.json" || fail "escapes: names or values wrong in the JSON"
  ok
fi

# layer names stay unique: of "foo" and "foo.weight" the second keeps its tensor name; a tied
# head beside a linear layer named lm_head (--kind) is wte.lm_head; the trace takes them all
if [ -n "$py5" ]; then
  python3 - "$dir/clash.safetensors" <<'PY'
import struct, sys
names = ["wte.weight", "foo", "foo.weight", "lm_head.weight"]
hdr = ("{" + ", ".join('"%s": {"dtype": "F32", "shape": [4, 4], "data_offsets": [%d, %d]}' % (n, 64 * i, 64 * i + 64)
                       for i, n in enumerate(names)) + "}").encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(hdr)) + hdr + struct.pack("<64f", *[(i % 5) - 2.0 for i in range(64)]))
PY
  "$probe" "$dir/clash.safetensors" --kind 'lm_head.weight=linear' --json --hdf5 "$dir/clash.h5" --step 1 --quiet \
    >"$dir/clash.json" 2>"$dir/clash.err" || fail "name clash: exit $?: $(cat "$dir/clash.err")"
  "$py5" - "$dir/clash.json" "$dir/clash.h5" <<'PY' || fail "name clash: names"
import h5py, json, sys
got = [(l["name"], l["tensor"], l["kind"]) for l in json.load(open(sys.argv[1]))["layers"]]
want = [("wte", "wte.weight", "embedding"), ("foo", "foo", "linear"), ("foo.weight", "foo.weight", "linear"),
        ("lm_head", "lm_head.weight", "linear"), ("wte.lm_head", "wte.weight", "lm_head")]
assert got == want, got
assert set(h5py.File(sys.argv[2], "r")["layers/layer"].asstr()[:]) == {n for n, _, _ in want}
PY
fi
ok

# a checkpoint of harness/train (GPT-2 names stored out-major, tied, heads in __metadata__):
# the names the probe gives its layers are the trace's group names, with no renaming (a tied
# head is lm_head), and every layer's forward and dependency equal the trainer's own trace at
# the checkpoint's step, whose layers train.c registers by hand, independently of the probe's
# rule table. The step comes from the checkpoint's metadata (model.safetensors has none in
# its name), and a trace the probe writes has the trainer's groups. Untied too.
if [ -n "$py5" ]; then
  for tie in tied untied; do
    t=$dir/trn-$tie
    topt=; [ $tie = untied ] && topt=--untied
    ./harness/train --width 32 --depth 2 --heads 4 --steps 4 --checkpoint-every 2 $topt --out "$t" >/dev/null 2>"$t.err" ||
      fail "train $tie: exit $?: $(tail -3 "$t.err")"
    "$probe" "$t/step-000002.safetensors" --json >"$t.2.json" 2>"$t.p.err" || fail "train $tie checkpoint: exit $?"
    "$probe" "$t/model.safetensors" --prev "$t/step-000002.safetensors" --json --quiet >"$t.4.json" 2>"$t.p.err" ||
      fail "train $tie checkpoint --prev: exit $?"
    [ -s "$t.p.err" ] && fail "train $tie --prev its own earlier checkpoint: a warning: $(cat "$t.p.err")"
    "$probe" "$t/model.safetensors" --hdf5 "$t/probe.h5" >/dev/null 2>"$t.h.err" || fail "train $tie --hdf5: exit $?"
    grep -q "probe.h5: step 4, from the checkpoint's __metadata__ steps" "$t.h.err" ||
      fail "train $tie --hdf5: the step's source not said: $(cat "$t.h.err")"
    "$py5" - "$t/trace.h5" "$t.2.json" "$t.4.json" "$t/probe.h5" <<'PY' || fail "train $tie checkpoint: probe differs from the trainer's trace"
import h5py, json, math, sys
import os as _os, sys as _sys
_sys.path.insert(0, _os.environ["STAB_TESTS_DIR"])
from trace_layers import layer_groups
f = h5py.File(sys.argv[1], "r", swmr=True)
bad = 0
for path in sys.argv[2:4]:
    rep = json.load(open(path))
    got = {l["name"]: l for l in rep["layers"]}
    if set(got) != set(layer_groups(f)) or len(got) != len(rep["layers"]):
        print(path, "names:", sorted(got), "trace:", sorted(layer_groups(f))); bad += 1; continue
    row = list(f["step"][:]).index(rep["step"])  # the step the checkpoint's metadata gives
    for name, l in got.items():
        g = layer_groups(f)[name]
        kind = g.attrs["kind"].decode() if isinstance(g.attrs["kind"], bytes) else g.attrs["kind"]
        if kind != l["kind"]:
            print(name, "kind", l["kind"], "trace", kind); bad += 1
        for key in ("forward", "dependency"):
            want = g[key][row]
            if (l[key] is None) != math.isnan(want) or (l[key] is not None and abs(l[key] - want) > 2e-3 * abs(want)):
                print(path, name, key, "probe", l[key], "trainer", want); bad += 1
        if l["kind"] == "linear" and l["layout"] != "out_major":
            print(name, "layout", l["layout"]); bad += 1
    assert rep["step_source"].startswith("the checkpoint's __metadata__ steps"), rep["step_source"]
assert json.load(open(sys.argv[2]))["step"] == 2 and json.load(open(sys.argv[3]))["step"] == 4
p = h5py.File(sys.argv[4], "r")
if set(layer_groups(p)) != set(layer_groups(f)) or list(p["step"][:]) != [4]:
    print("probe's trace", sorted(layer_groups(p)), list(p["step"][:])); bad += 1
# the storage the groups share (a tied head, the logits inside c_attn), as the trainer records it
# from its own buffers: the probe registers the checkpoint's tensors by their place in the file
def sharing(g):
    s = g.attrs.get("shares_storage_with")
    return (int(g.attrs["param_count"]), int(g.attrs["param_count_unique"]),
            sorted(x.decode() if isinstance(x, bytes) else x for x in (s if s is not None else [])))
for name in set(layer_groups(p)) & set(layer_groups(f)):
    if sharing(layer_groups(p)[name]) != sharing(layer_groups(f)[name]):
        print(name, "probe's trace (param_count, unique, shares):", sharing(layer_groups(p)[name]),
              "trainer's:", sharing(layer_groups(f)[name])); bad += 1
sys.exit(1 if bad else 0)
PY
  done
  # --prev partial and unrelated: the untied model against the tied one lacks only lm_head
  # (exit 0, a warning naming it); against another width nothing has the same shape, against
  # st_gen's GPT-2 nothing has the same name: exit 2, one line naming both files, no report
  expect "--prev partial" 0 "^stabmeter-probe: warning: --prev .*trn-tied/model.safetensors: 1 of 2[0-9] layers have no counterpart there, so no update: lm_head\$" \
    "$probe" "$dir/trn-untied/model.safetensors" --prev "$dir/trn-tied/model.safetensors" --json --quiet
  [ "$(wc -l <"$err_file")" -eq 1 ] && pass || fail "--prev partial: $(wc -l <"$err_file") lines on stderr"
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
l = {x["name"]: x for x in r["layers"]}
assert l["lm_head"]["update"] is None and l["transformer.wte"]["update"] is not None, l["lm_head"]
assert {"name": "lm_head", "message": "no update: not found in the reference checkpoint"} in r["errors"], r["errors"]' "$out_file" ||
    fail "--prev partial: the report"
  ./harness/train --width 16 --depth 2 --heads 4 --steps 1 --out "$dir/trn16" >/dev/null 2>&1 || fail "train width 16"
  expect "--prev another width" 2 "^stabmeter-probe: --prev .*trn16/model.safetensors: none of the 2[0-9] layers of .*trn-tied/model.safetensors has a counterpart there \(no tensor of the same name and shape\)" \
    "$probe" "$dir/trn-tied/model.safetensors" --prev "$dir/trn16/model.safetensors"
  [ -s "$out_file" ] && fail "--prev another width: a report on stdout" || pass
  expect "--prev unrelated" 2 "^stabmeter-probe: --prev .*gpt2_F32.safetensors: none of the [0-9]+ layers .* \(no tensor of the same name\): not an earlier checkpoint of the same model\$" \
    "$probe" "$dir/trn-tied/model.safetensors" --prev "$dir/gpt2_F32.safetensors" --json --quiet
  [ "$(wc -l <"$err_file")" -eq 1 ] && [ ! -s "$out_file" ] && pass || fail "--prev unrelated: not one line and no report"
fi
ok

# --init: the ratio to init against two plain runs' JSON (an independent division); the init
# values are a plain run's numbers; --prev alone makes the ratios the earlier checkpoint's,
# with --init and --prev the update is --prev's and the ratios --init's; a file against itself
# is ratio 1 exactly; --sort by a ratio and --top against python sorting the JSON
# ratios PAIR_JSON CUR_JSON INIT_JSON: every row's ratios and init values against the plain runs
ratios() {
  python3 - "$@" <<'PY'
import json, sys
rep, cur, ini = (json.load(open(f)) for f in sys.argv[1:4])
cur = {l["name"]: l for l in cur["layers"]}
ini = {l["name"]: l for l in ini["layers"]}
bad = 0
assert rep["ratio_reference"], "no ratio_reference"
for l in rep["layers"]:
    c, i = cur[l["name"]], ini.get(l["name"])
    for k in ("forward", "dependency"):
        want_init = i[k] if i else None
        want = c[k] / want_init if c[k] is not None and want_init else None
        if l[k + "_init"] != want_init:
            print(l["name"], k + "_init", l[k + "_init"], "want", want_init); bad += 1
        if (want is None) != (l[k + "_ratio"] is None) or (want is not None and abs(l[k + "_ratio"] - want) > 1e-14 * want):
            print(l["name"], k + "_ratio", l[k + "_ratio"], "want", want); bad += 1
        if l[k] != c[k]:
            print(l["name"], k, l[k], "plain run", c[k]); bad += 1
sys.exit(1 if bad else 0)
PY
}
if [ $have_py = 1 ]; then
  g=$dir/gpt2_F32
  "$probe" "$g.safetensors" --heads 2 --json >"$g.cur.json" 2>/dev/null || fail "--init: plain run exit $?"
  "$probe" "$g.prev.safetensors" --heads 2 --json >"$g.old.json" 2>/dev/null || fail "--init: plain run of init exit $?"
  "$probe" "$g.safetensors" --heads 2 --init "$g.prev.safetensors" --json >"$g.ri.json" 2>"$g.ri.err" ||
    fail "--init: exit $?: $(cat "$g.ri.err")"
  [ -s "$g.ri.err" ] && fail "--init of the same model: stderr: $(cat "$g.ri.err")"
  ratios "$g.ri.json" "$g.cur.json" "$g.old.json" || fail "--init: ratios differ from the two plain runs'"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); a=[l for l in r["layers"] if l["kind"]=="attention"]; assert r["ratio_reference"]==sys.argv[2] and r["reference"] is None and a and all(l["forward_ratio"] is not None for l in a) and all(l["update"] is None for l in r["layers"])' "$g.ri.json" "$g.prev.safetensors" ||
    fail "--init: reference keys, attention ratios"
  # --prev alone: the ratios to OLDER, the update as before
  "$probe" "$g.safetensors" --heads 2 --prev "$g.prev.safetensors" --json >"$g.rp.json" 2>/dev/null || fail "--prev ratios: exit $?"
  ratios "$g.rp.json" "$g.cur.json" "$g.old.json" || fail "--prev: ratios differ from the two plain runs'"
  # --prev OLDER --init the file itself: update against OLDER, every ratio exactly 1
  "$probe" "$g.safetensors" --heads 2 --prev "$g.prev.safetensors" --init "$g.safetensors" --json >"$g.rb.json" 2>/dev/null ||
    fail "--prev and --init: exit $?"
  python3 - "$g.rb.json" "$g.rp.json" "$g.safetensors" <<'PY' || fail "--prev and --init: update not --prev's or a ratio to itself not 1"
import json, sys
b, p = (json.load(open(f)) for f in sys.argv[1:3])
assert b["ratio_reference"] == sys.argv[3] and b["reference"] == p["reference"]
for x, y in zip(b["layers"], p["layers"]):
    assert x["name"] == y["name"] and x["update"] == y["update"], (x["name"], x["update"], y["update"])
    for k in ("forward", "dependency"):
        assert x[k + "_ratio"] == (1.0 if x[k] else None) and x[k + "_init"] == (x[k] if x[k] else x[k + "_init"]), (x["name"], k)
PY
  # --sort forward_ratio --top 3: python's order of the full report
  "$probe" "$g.safetensors" --heads 2 --init "$g.prev.safetensors" --sort dependency_ratio --top 3 --json >"$g.rs.json" 2>/dev/null ||
    fail "--sort dependency_ratio: exit $?"
  python3 - "$g.rs.json" "$g.ri.json" <<'PY' || fail "--sort dependency_ratio --top 3: not the three largest"
import json, sys
s, a = (json.load(open(f)) for f in sys.argv[1:3])
want = sorted((l for l in a["layers"] if l["dependency_ratio"] is not None), key=lambda l: -l["dependency_ratio"])[:3]
assert [l["name"] for l in s["layers"]] == [l["name"] for l in want], ([l["name"] for l in s["layers"]], [l["name"] for l in want])
PY
  "$probe" "$g.safetensors" --init "$g.prev.safetensors" >"$g.rt.txt" 2>/dev/null || fail "--init table: exit $?"
  grep -Eq '^layer .* fwd_ratio dep_ratio  notes$' "$g.rt.txt" && grep -q "^ratios (fwd_ratio, dep_ratio) to $g.prev.safetensors\$" "$g.rt.txt" ||
    fail "--init table: no ratio columns"
  expect "--sort forward_ratio alone" 2 "^stabmeter-probe: --sort forward_ratio: the ratio is to --init INIT" \
    "$probe" "$g.safetensors" --sort forward_ratio
  # GGUF against GGUF, and a sharded model against another of its shape (hf_gen's toy, two seeds)
  q=$dir/gguf_F32
  "$probe" "$q.gguf" --json >"$q.cur.json" 2>/dev/null && "$probe" "$q.prev.gguf" --json >"$q.old.json" 2>/dev/null &&
    "$probe" "$q.gguf" --init "$q.prev.gguf" --json >"$q.ri.json" 2>/dev/null || fail "gguf --init: exit $?"
  ratios "$q.ri.json" "$q.cur.json" "$q.old.json" || fail "gguf --init: ratios differ from the two plain runs'"
  if "$top/tests/support/hf_gen" "$dir/shA" tiny --shards 2 --seed 1 >/dev/null 2>&1 && "$top/tests/support/hf_gen" "$dir/shB" tiny --shards 2 --seed 2 >/dev/null 2>&1; then
    "$probe" "$dir/shA" --json >"$dir/shA.json" 2>/dev/null && "$probe" "$dir/shB" --json >"$dir/shB.json" 2>/dev/null &&
      "$probe" "$dir/shA" --init "$dir/shB" --json >"$dir/shAB.json" 2>/dev/null || fail "sharded --init: exit $?"
    ratios "$dir/shAB.json" "$dir/shA.json" "$dir/shB.json" || fail "sharded --init: ratios differ from the two plain runs'"
  else
    fail "hf_gen tiny"
  fi
fi
ok
# --init that does not fit: a model of other names (exit 2, one line, no report), one lacking a
# layer (a warning with the count, that row's ratio null), a missing file, a FIFO (no hang)
if [ -n "$py5" ]; then
  expect "--init unrelated" 2 "^stabmeter-probe: --init .*gpt2_F32.safetensors: none of the [0-9]+ layers of .*trn-tied/model.safetensors has a counterpart there" \
    "$probe" "$dir/trn-tied/model.safetensors" --init "$dir/gpt2_F32.safetensors"
  [ "$(wc -l <"$err_file")" -eq 1 ] && [ ! -s "$out_file" ] && pass || fail "--init unrelated: not one line and no report"
  expect "--init partial" 0 "^stabmeter-probe: warning: .*trn-tied/model.safetensors: 1 of 2[0-9] layers have no counterpart there, so no ratio: lm_head\$" \
    "$probe" "$dir/trn-untied/model.safetensors" --init "$dir/trn-tied/model.safetensors" --json --quiet
  [ "$(wc -l <"$err_file")" -eq 1 ] && pass || fail "--init partial: $(wc -l <"$err_file") lines on stderr"
  python3 -c '
import json, sys
l = {x["name"]: x for x in json.load(open(sys.argv[1]))["layers"]}
assert l["lm_head"]["forward_ratio"] is None and l["lm_head"]["forward_init"] is None and l["transformer.wte"]["forward_ratio"] is not None' "$out_file" ||
    fail "--init partial: the report"
  # --prev partial names its layers once: no second warning for the ratios to the same file
  expect "--prev partial, ratios" 0 "^stabmeter-probe: warning: --prev " \
    "$probe" "$dir/trn-untied/model.safetensors" --prev "$dir/trn-tied/model.safetensors" --quiet
  [ "$(wc -l <"$err_file")" -eq 1 ] && pass || fail "--prev partial: $(wc -l <"$err_file") lines on stderr"
  expect "--init missing" 2 "^stabmeter-probe: --init .*nope.safetensors: " \
    "$probe" "$dir/trn-tied/model.safetensors" --init "$dir/nope.safetensors"
  mkfifo "$dir/init.fifo"
  expect "--init FIFO" 2 "init.fifo" "$probe" "$dir/trn-tied/model.safetensors" --init "$dir/init.fifo"
  [ "$(wc -l <"$err_file")" -eq 1 ] && pass || fail "--init FIFO: $(cat "$err_file")"
fi
ok

# The attention scale of harness/train's checkpoints (__metadata__ attn_scale): an --attn-scale
# inverse run's logit bound equals the trainer's own trace (1/d_h q.k); the same weights with
# the metadata saying sqrt (padded to the same length, offsets unchanged) give sqrt(d_h) times
# it; a value neither is refused with the file and the value
if [ -n "$py5" ]; then
  t=$dir/trn-inv
  ./harness/train --width 32 --depth 1 --heads 4 --steps 2 --attn-scale inverse --out "$t" >/dev/null 2>"$t.err" ||
    fail "train --attn-scale inverse: exit $?: $(tail -3 "$t.err")"
  "$py5" - "$t/model.safetensors" <<'PY' || fail "attn_scale: rewriting the metadata"
import sys
b = open(sys.argv[1], "rb").read()
old = b'"attn_scale":"inverse"'
assert b.count(old) == 1
for name, new in (("sqrt", b'"attn_scale":"sqrt"   '), ("bogus", b'"attn_scale":"bogus12"')):
    open(sys.argv[1].replace("model", name), "wb").write(b.replace(old, new))
PY
  "$probe" "$t/model.safetensors" --json --quiet >"$t.inv.json" 2>"$t.p.err" || fail "attn_scale inverse: exit $?"
  "$probe" "$t/sqrt.safetensors" --json --quiet >"$t.sqrt.json" 2>"$t.p.err" || fail "attn_scale sqrt copy: exit $?"
  "$py5" - "$t/trace.h5" "$t.inv.json" "$t.sqrt.json" <<'PY' || fail "attn_scale: the logit bound is not the trainer's, or not sqrt(d_h) apart"
import h5py, json, math, sys
f = h5py.File(sys.argv[1], "r", swmr=True)
inv, sq = ({l["name"]: l for l in json.load(open(p))["layers"] if l["kind"] == "attention"} for p in sys.argv[2:4])
assert inv and set(inv) == set(sq), (inv, sq)
for name, l in inv.items():
    L = f["layers"]  # format 4: the layer's column of /layers/forward
    want = L["forward"][-1, list(L["layer"].asstr()[:]).index(name)]
    assert abs(l["forward"] - want) <= 2e-3 * want, (name, l["forward"], want)
    dh = l["d_out"] // l["heads"]
    assert dh == 8 and abs(sq[name]["forward"] / l["forward"] - math.sqrt(dh)) < 1e-9, (name, sq[name]["forward"], l["forward"])
PY
  expect "attn_scale bogus" 2 "^stabmeter-probe: .*trn-inv/bogus.safetensors: __metadata__ attn_scale is 'bogus12', not sqrt or inverse\$" \
    "$probe" "$t/bogus.safetensors"
fi
ok

# attention without a head count is listed with the reason, not dropped; --heads that do not
# divide the width are refused per layer, and bad --heads values are usage errors
mkdir "$dir/nocfg" && cp "$dir/gpt2_F32.safetensors" "$dir/nocfg/m.safetensors"
"$probe" "$dir/nocfg/m.safetensors" >"$dir/nh.txt" || fail "no heads: exit $?"
grep -q '^  h.0.attn.logits: no head count (give --heads H' "$dir/nh.txt" || fail "no heads: not listed"
"$probe" "$dir/nocfg/m.safetensors" --heads 3 >"$dir/nh.txt" || fail "--heads 3: exit $?"
grep -q '^  h.0.attn.logits: 3 heads (from --heads) do not divide the query width 16' "$dir/nh.txt" || fail "--heads 3: not listed"
"$probe" "$dir/nocfg/m.safetensors" --heads 0 >/dev/null 2>&1; [ $? -eq 2 ] || fail "--heads 0: not exit 2"
"$probe" "$dir/nocfg/m.safetensors" --heads x >/dev/null 2>&1; [ $? -eq 2 ] || fail "--heads x: not exit 2"
ok

# filters and overrides
p=$dir/gpt2_F32
"$probe" "$p.safetensors" --filter 'h.0.mlp.*' >"$dir/f.txt" || fail "filter exit"
grep -q '^wte.weight' "$dir/f.txt" && fail "--filter kept wte"
grep -Eq '^h\.0\.mlp\.c_fc +linear' "$dir/f.txt" || fail "--filter dropped c_fc"
grep -Eq '^lm_head ' "$dir/f.txt" && fail "--filter kept the tied head"
"$probe" "$p.safetensors" --layout 'h.0.mlp.c_fc.weight=out_major' --kind 'wpe.weight=skip' >"$dir/o.txt" ||
  fail "override exit"
grep -Eq '^h\.0\.mlp\.c_fc +linear +16x64 .* \+bias' "$dir/o.txt" && grep -Eq '^h\.0\.mlp\.c_fc .*in-major' "$dir/o.txt" &&
  fail "--layout ignored"
grep -q 'wpe.weight: skipped by --kind' "$dir/o.txt" || fail "--kind skip not listed"
"$probe" "$p.safetensors" --kind 'ln_f.weight=linear' --kind 'h.0.attn.bias=linear' --kind 'wpe.weight=lm_head' \
  --kind 'h.0.ln_1.bias=gain' >"$dir/k.txt" || fail "--kind exit"
grep -q 'ln_f.weight: --kind linear does not fit a 1-D tensor' "$dir/k.txt" || fail "--kind linear on 1-D accepted"
grep -q 'h.0.attn.bias: a 3-D or higher tensor (4 dimensions)' "$dir/k.txt" || fail "--kind on 4-D accepted"
grep -Eq '^wpe +lm_head +8x16' "$dir/k.txt" || fail "--kind lm_head ignored"
grep -Eq '^h\.0\.ln_1\.bias +gain' "$dir/k.txt" || fail "--kind gain ignored"
grep -q 'tied to' "$dir/k.txt" && fail "tied head added although wpe was made the lm_head"
# an untied model whose head is not a row (filtered out here; a quantized GGUF output alike)
"$probe" "$dir/llama_F32.safetensors" --filter 'model.embed_tokens.weight' >"$dir/u.txt" || fail "untied filter exit"
grep -Eq '^model\.embed_tokens +embedding' "$dir/u.txt" || fail "untied filter: no embedding row"
grep -q 'tied to' "$dir/u.txt" && fail "untied model with its head filtered out reported as tied"
ok

# strings from the file: a GGUF string value that is not UTF-8 reaches the JSON as U+FFFD (the
# report stays valid JSON), bidi and C1 controls in names are shown escaped in the table, and
# a head_count of 0 is reported as invalid, not as missing; a safetensors __metadata__ heads of
# "-1" is not taken for 18446744073709551615
if [ $have_py -eq 1 ]; then
  python3 - "$dir/hostile.gguf" "$dir/heads.safetensors" <<'PY'
import struct, sys
def s(b): return struct.pack('<Q', len(b)) + b
kv = [(b'general.architecture', 8, s(b'llama')), (b'llama.attention.head_count', 4, struct.pack('<I', 0)),
      (b'general.name', 8, s(b'caf\xe9 \xe2\x80\xae evil'))]
names = [b'blk.0.attn_q.weight', b'blk.0.attn_k.weight', b'x\xe2\x80\xaey.weight', b'c1\xc2\x85z.weight']
out = b'GGUF' + struct.pack('<IQQ', 3, len(names), len(kv))
for k, t, v in kv: out += s(k) + struct.pack('<I', t) + v
for i, n in enumerate(names): out += s(n) + struct.pack('<IQQIQ', 2, 4, 4, 0, 64 * i)
out += b'\0' * (-len(out) % 32)
out += struct.pack('<%df' % (16 * len(names)), *[(i % 7) - 3.0 for i in range(16 * len(names))])
open(sys.argv[1], 'wb').write(out)
hdr = ('{"__metadata__": {"heads": "-1"}, '
       '"m.q_proj.weight": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}, '
       '"m.k_proj.weight": {"dtype": "F32", "shape": [4, 4], "data_offsets": [64, 128]}}').encode()
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(hdr)) + hdr + struct.pack('<32f', *range(32)))
PY
  "$probe" "$dir/hostile.gguf" --json >"$dir/hostile.json" 2>"$dir/hostile.err" || fail "hostile GGUF: exit $?"
  python3 - "$dir/hostile.json" <<'PY' || fail "hostile GGUF: the JSON report is not valid or not as expected"
import json, sys
r = json.loads(open(sys.argv[1], 'rb').read().decode('utf-8'))  # strict: invalid UTF-8 raises
assert r["metadata"]["general.name"] == "caf\ufffd \u202e evil", r["metadata"]
assert {l["name"] for l in r["layers"]} >= {"x\u202ey", "c1\x85z"}, [l["name"] for l in r["layers"]]
err = {e["name"]: e["message"] for e in r["errors"]}
assert "head_count is 0, which is invalid" in err.get("blk.0.attn_logits", ""), err
PY
  "$probe" "$dir/hostile.gguf" >"$dir/hostile.txt" 2>"$dir/hostile.err" || fail "hostile GGUF table: exit $?"
  grep -q '^x\\u202Ey ' "$dir/hostile.txt" || fail "table: U+202E in a name not shown as \\u202E"
  grep -q '^c1\\u0085z ' "$dir/hostile.txt" || fail "table: a C1 control in a name not shown as \\u0085"
  grep -q '^metadata general.name = caf\\xe9 \\u202E evil$' "$dir/hostile.txt" ||
    fail "table: a metadata value's invalid byte and U+202E not escaped: $(grep general.name "$dir/hostile.txt")"
  LC_ALL=C grep -q "$(printf '\342\200\256')" "$dir/hostile.txt" && fail "table: a raw U+202E reached the terminal"
  grep -q "blk.0.attn_logits: the GGUF metadata's llama.attention.head_count is 0, which is invalid" "$dir/hostile.txt" ||
    fail "table: head_count 0 not reported as invalid: $(grep attn_logits "$dir/hostile.txt")"
  "$probe" "$dir/heads.safetensors" >"$dir/heads.txt" 2>&1 || fail "__metadata__ heads -1: exit $?"
  grep -q "m.logits: __metadata__ heads is '-1', not a whole number from 1 to 1048576" "$dir/heads.txt" ||
    fail "__metadata__ heads -1: $(grep logits "$dir/heads.txt")"
  ok
fi
# an F32 tensor the mapping cannot serve directly (the header's length not a multiple of 4, so
# the data is unaligned) is converted into a copy: its peak memory must stay near an aligned
# file's of the same shape, not the copy beside the whole tensor mapped (twice the size). The
# plain build measures it: under ASan the peak is its allocator's (freed blocks held in its
# quarantine, redzones), not the probe's.
if [ $have_py -eq 1 ] && [ -z "${STAB_SANITIZED:-}" ]; then
  python3 - "$probe" "$dir/align" <<'PY' || fail "unaligned F32: peak memory above the aligned file's"
import os, resource, struct, subprocess, sys
probe, base = sys.argv[1], sys.argv[2]
n = 4096  # a 64 MiB tensor of zeros, sparse on disk
def make(path, start_mod_4):
    nb = n * n * 4
    hdr = '{"w.weight": {"dtype": "F32", "shape": [%d, %d], "data_offsets": [0, %d]}}' % (n, n, nb)
    hdr += ' ' * ((start_mod_4 - 8 - len(hdr)) % 4)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(hdr)) + hdr.encode())
        f.truncate(8 + len(hdr) + nb)
def peak_kb(path):
    # one child at a time: RUSAGE_CHILDREN's max is that of the largest child so far
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.execv(probe, [probe, '--quiet', path])
    _, status, ru = os.wait4(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, (path, status)
    return ru.ru_maxrss
make(base + '.aligned.safetensors', 0)
make(base + '.unaligned.safetensors', 2)
a, u = peak_kb(base + '.aligned.safetensors'), peak_kb(base + '.unaligned.safetensors')
tensor_kb = n * n * 4 // 1024
print('peak RSS: aligned %d kB, unaligned %d kB (tensor %d kB)' % (a, u, tensor_kb))
sys.exit(0 if u <= a + tensor_kb // 4 else 1)
PY
  ok
fi
# numeric options are parsed strictly, each message naming the option; a tolerance below what
# f64 accumulation can certify is refused instead of flagging every layer not converged
for bad in "--tol 1e-300" "--tol 1e-13" "--tol nan" "--tol 0x" "--tol ' 0.1'" "--heads -1" "--heads ' 4'" "--heads +4" \
    "--heads 0x4" "--heads 18446744073709551617" "--step -1" "--step 1e3"; do
  opt=${bad%% *}
  eval "\"\$probe\" \"\$p.safetensors\" $bad --hdf5 \"\$dir/never.h5\"" >/dev/null 2>"$dir/num.err"
  rc=$?
  [ $rc -eq 2 ] || fail "$bad: exit $rc, want 2"
  grep -q "^stabmeter-probe: $opt: bad value" "$dir/num.err" || fail "$bad: message does not name $opt: $(cat "$dir/num.err")"
done
[ -e "$dir/never.h5" ] && fail "a refused option still wrote the trace"
"$probe" "$p.safetensors" --tol 1e-12 >/dev/null 2>"$dir/num.err" || fail "--tol 1e-12 (the bound): exit $?"
ok

# --sort and --top against python sorting the --json output (largest first, null last, ties
# in the checkpoint's order), in the JSON and in the table; --top alone sorts by forward; the
# summary is the largest value per kind and metric over every layer (--top aside), the same
# in the table, which also gives the units
if [ $have_py -eq 1 ]; then
  p=$dir/gpt2_F32
  "$probe" "$p.safetensors" --prev "$p.prev.safetensors" --heads 2 --json >"$dir/s.file.json" || fail "sort: exit $?"
  for key in forward dependency update sigma rel_update forward_tight; do
    "$probe" "$p.safetensors" --prev "$p.prev.safetensors" --heads 2 --json --sort $key >"$dir/s.$key.json" ||
      fail "--sort $key: exit $?"
    "$probe" "$p.safetensors" --prev "$p.prev.safetensors" --heads 2 --sort $key >"$dir/s.$key.txt" ||
      fail "--sort $key table: exit $?"
    "$probe" "$p.safetensors" --prev "$p.prev.safetensors" --heads 2 --json --sort $key --top 3 >"$dir/s.$key.top.json" ||
      fail "--sort $key --top 3: exit $?"
    python3 - "$key" "$dir/s.file.json" "$dir/s.$key.json" "$dir/s.$key.txt" "$dir/s.$key.top.json" <<'PY' || fail "--sort $key: not python's order"
import json, sys
key = sys.argv[1]
base = json.load(open(sys.argv[2]))["layers"]
want = [l["name"] for l in sorted(base, key=lambda l: (l[key] is None, -(l[key] or 0)))]  # sorted() is stable
got = [l["name"] for l in json.load(open(sys.argv[3]))["layers"]]
assert got == want, (key, got, want)
lines = open(sys.argv[4]).read().split("\n\n")
table = [line.split()[0] for line in next(b for b in lines if b.startswith("layer ")).splitlines()[1:]]
assert table == want, (key, "table", table, want)
top = json.load(open(sys.argv[5]))
assert [l["name"] for l in top["layers"]] == want[:3] and top["top"] == 3 and top["sort"] == key, top["layers"]
PY
  done
  "$probe" "$p.safetensors" --heads 2 --json --top 2 >"$dir/s.top.json" || fail "--top alone: exit $?"
  "$probe" "$p.safetensors" --heads 2 --sort name >"$dir/s.name.txt" || fail "--sort name: exit $?"
  python3 - "$dir/s.file.json" "$dir/s.top.json" "$dir/s.name.txt" "$dir/s.forward.txt" <<'PY' || fail "--top alone, --sort name or the summary"
import json, math, sys
rep = json.load(open(sys.argv[1]))
base = rep["layers"]
fw = [l["name"] for l in sorted(base, key=lambda l: (l["forward"] is None, -(l["forward"] or 0)))]
top = json.load(open(sys.argv[2]))
assert [l["name"] for l in top["layers"]] == fw[:2] and top["sort"] == "forward", top["layers"]
blocks = open(sys.argv[3]).read().split("\n\n")
names = [line.split()[0] for line in next(b for b in blocks if b.startswith("layer ")).splitlines()[1:]]
assert names == sorted(l["name"] for l in base), names
# the summary: per kind and metric the largest value among the layers of that kind
want = {}
for l in base:
    for m in ("forward", "dependency", "update"):
        k = (l["kind"], m)
        if l[m] is not None and (k not in want or l[m] > want[k][1]):  # a tie: the first
            want[k] = (l["name"], l[m])
got = {(k, m): (e["layer"], e["value"]) for k, ms in rep["summary"].items() for m, e in ms.items()}
assert got == want, (got, want)
assert all(e["unit"] == ("nats" if k == "lm_head" else "1") for k, ms in rep["summary"].items() for e in ms.values())
assert all(l["unit"] == ("nats" if l["kind"] == "lm_head" else "1") for l in base)
table = open(sys.argv[4]).read()
block = table.split("largest per kind and metric:\n")[1].split("\n\n")[0]
shown = {}
for line in block.splitlines():
    kind, metric, value, unit, layer = line.split()
    shown[kind, metric] = (layer, float(value))
assert shown.keys() == want.keys(), (shown.keys(), want.keys())
for k, (layer, v) in want.items():
    assert shown[k][0] == layer and abs(shown[k][1] - v) <= 1e-4 * abs(v), (k, shown[k], layer, v)
assert "\nunits: forward, dependency, update: RMS ratio (1), nats for lm_head rows; sigma: " in table, table
assert "Definitions: docs/manual/metrics.md" in table
PY
  ok
fi

# --filter that matches nothing is a typo: exit 2, one line naming it, no table (as export's
# --layers); one of two that matches nothing, the same; a filter may name a layer (lm_head,
# the tied head) or a tensor
p=$dir/gpt2_F32
expect "--filter nomatch" 2 "^stabmeter-probe: --filter 'nomatch\*' matches no layer or tensor name of .*gpt2_F32.safetensors" \
  "$probe" "$p.safetensors" --filter 'nomatch*' --quiet
[ "$(wc -l <"$err_file")" -eq 1 ] && [ ! -s "$out_file" ] && pass || fail "--filter nomatch: not one line and no table"
expect "--filter, one of two matches nothing" 2 "^stabmeter-probe: --filter 'h\.9\.\*' matches no" \
  "$probe" "$p.safetensors" --filter 'h.0.*' --filter 'h.9.*' --json
[ ! -s "$out_file" ] && pass || fail "--filter, one of two: a report on stdout"
expect "--filter lm_head" 0 '' "$probe" "$p.safetensors" --filter lm_head
grep -Eq '^lm_head +lm_head .*tied to wte\.weight' "$out_file" && ! grep -Eq '^wte ' "$out_file" && pass ||
  fail "--filter lm_head: not the tied head alone: $(cat "$out_file")"
expect "--filter a folded bias" 0 '' "$probe" "$p.safetensors" --filter 'h.0.mlp.c_fc.bias'
grep -Eq '^h\.0\.mlp\.c_fc +linear .*\+bias' "$out_file" && pass || fail "--filter by a folded bias's name"

# --hdf5 takes the step from the checkpoint's own metadata (safetensors __metadata__ step,
# GGUF training.iteration_count) before the file name, and says which it used; a metadata
# step that is not a number is a warning, the name then used; --step overrides both
if [ -n "$py5" ]; then
  python3 - "$dir/meta" <<'PY'
import struct, sys
def st(path, meta):
    hdr = ('{%s"w.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}' %
           ('"__metadata__": %s, ' % meta if meta else "")).encode()
    open(path, "wb").write(struct.pack("<Q", len(hdr)) + hdr + struct.pack("<4f", 1, 0, 0, 2))
st(sys.argv[1] + "-plain.safetensors", '{"step": "100"}')
st(sys.argv[1] + "-step-000200.safetensors", '{"step": "100"}')
st(sys.argv[1] + "-bad-step-000300.safetensors", '{"step": "-5"}')
st(sys.argv[1] + "-global.safetensors", '{"global_step": "42", "steps": "9"}')
st(sys.argv[1] + "-other-steps.safetensors", '{"steps": "9"}')  # not stabmeter-train's: not a step
def s(b): return struct.pack("<Q", len(b)) + b
kv = [(b"general.architecture", 8, s(b"llama")), (b"training.iteration_count", 4, struct.pack("<I", 7))]
out = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kv))
for k, t, v in kv: out += s(k) + struct.pack("<I", t) + v
out += s(b"w.weight") + struct.pack("<IQQIQ", 2, 2, 2, 0, 0)
out += b"\0" * (-len(out) % 32) + struct.pack("<4f", 1, 0, 0, 2)
open(sys.argv[1] + "-train.gguf", "wb").write(out)
PY
  m=$dir/meta
  expect "step from __metadata__" 0 "mt1.h5: step 100, from the checkpoint's __metadata__ step\$" \
    "$probe" "$m-plain.safetensors" --hdf5 "$dir/mt1.h5"
  expect "__metadata__ before the name" 0 "warning: .*step 100 from the checkpoint's __metadata__ step, but the file name says 200" \
    "$probe" "$m-step-000200.safetensors" --hdf5 "$dir/mt2.h5"
  expect "a bad __metadata__ step" 0 "warning: .*__metadata__ step is '-5', not a whole number; not used as the step" \
    "$probe" "$m-bad-step-000300.safetensors" --hdf5 "$dir/mt3.h5"
  grep -q "mt3.h5: step 300, from the file name" "$err_file" && pass || fail "a bad __metadata__ step: $(cat "$err_file")"
  expect "global_step" 0 "mt4.h5: step 42, from the checkpoint's __metadata__ global_step\$" \
    "$probe" "$m-global.safetensors" --hdf5 "$dir/mt4.h5"
  expect "another producer's steps" 2 "other-steps.safetensors: no step in its metadata or its file name" \
    "$probe" "$m-other-steps.safetensors" --hdf5 "$dir/mt5.h5"
  expect "GGUF training.iteration_count" 0 "mt6.h5: step 7, from the checkpoint's GGUF training.iteration_count\$" \
    "$probe" "$m-train.gguf" --hdf5 "$dir/mt6.h5"
  expect "--step over the metadata" 0 "warning: .*step 5 from --step, but the checkpoint's __metadata__ step says 100" \
    "$probe" "$m-plain.safetensors" --hdf5 "$dir/mt7.h5" --step 5
  expect "--quiet" 0 '' "$probe" "$m-plain.safetensors" --hdf5 "$dir/mt8.h5" --quiet
  [ -s "$err_file" ] && fail "--quiet: $(cat "$err_file")" || pass
  "$py5" -c '
import h5py, sys
d = sys.argv[1]
for name, step in (("mt1", 100), ("mt2", 100), ("mt3", 300), ("mt4", 42), ("mt6", 7), ("mt7", 5)):
    assert list(h5py.File("%s/%s.h5" % (d, name), "r")["step"][:]) == [step], name
' "$dir" || fail "--hdf5: the steps in the traces"
  [ -e "$dir/mt5.h5" ] && fail "no step: a trace was written"
  "$probe" "$m-plain.safetensors" --json | python3 -c 'import json,sys; r=json.load(sys.stdin); assert (r["step"], r["step_source"]) == (100, "the checkpoint'"'"'s __metadata__ step"), r' ||
    fail "the JSON report's step"
fi
ok

# exit codes: 2 for bad usage and for malformed or missing files, with the message
"$probe" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no argument: not exit 2"
"$probe" "$p.safetensors" --tol 7 >/dev/null 2>&1; [ $? -eq 2 ] || fail "--tol 7: not exit 2"
"$probe" "$p.safetensors" --kind 'x=banana' >/dev/null 2>&1; [ $? -eq 2 ] || fail "--kind banana: not exit 2"
"$probe" "$dir/absent.safetensors" >/dev/null 2>&1; [ $? -eq 2 ] || fail "missing file: not exit 2"
size=$(wc -c <"$p.safetensors")
head -c $((size / 2)) "$p.safetensors" >"$dir/cut.safetensors"
"$probe" "$dir/cut.safetensors" >"$dir/cut.out" 2>"$dir/cut.err"
rc=$?
[ $rc -eq 2 ] || fail "truncated file: exit $rc, want 2"
grep -q "cut.safetensors" "$dir/cut.err" || fail "truncated file: message does not name the file"
[ -s "$dir/cut.out" ] && fail "truncated file: output on stdout"
"$probe" "$p.safetensors" --prev "$dir/cut.safetensors" >/dev/null 2>&1; [ $? -eq 2 ] || fail "truncated --prev: not exit 2"
"$probe" --help | grep -q '^Usage: stabmeter-probe' || fail "--help"
"$probe" --version | grep -q '^stabmeter-probe (stabmeter)' || fail "--version"
ok
# refused DIR FILE: the probe refuses corpus file DIR/FILE with exit 2 and a message (left in
# $dir/c.err) naming the file; counted in n
refused() {
  "$probe" "$1/$2" >/dev/null 2>"$dir/c.err"
  rc=$?
  [ $rc -eq 2 ] || fail "corpus $2: exit $rc, want 2"
  grep -qF "$2" "$dir/c.err" || fail "corpus $2: message lacks the file name"
  n=$((n + 1))
}
n=0
for f in "$src"/tests/corpus/safetensors/*.safetensors; do refused "$src/tests/corpus/safetensors" "$(basename "$f")"; done
[ $n -ge 40 ] || fail "corpus: only $n files"
for f in "$src"/tests/corpus/llmc/*.bin; do refused "$src/tests/corpus/llmc" "$(basename "$f")"; done
# the GGUF corpus: each file's message also holds what EXPECTED says
while IFS="$(printf '\t')" read -r file want; do
  refused "$src/tests/corpus/gguf" "$file"
  grep -qF -- "$want" "$dir/c.err" || fail "corpus $file: message lacks '$want': $(cat "$dir/c.err")"
done <"$src/tests/corpus/gguf/EXPECTED"
[ $n -ge 80 ] || fail "corpus: only $n files"
ok

echo "probe.sh: python3: $have_py, corpus files: $n"
summary probe.sh # the closing line in Check's format, which quickstart.sh counts
