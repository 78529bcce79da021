#!/bin/sh
# crossfmt.sh — probe --prev across formats: a GGUF file against the safetensors it was converted
# from by tests/support/gguf_convert (llama.cpp's names, q/k row permutation, Conv1D transpose), both
# ways. F32: every layer's update exactly 0, and large q/k updates when the file skipped the
# permutation (so the zeros are not vacuous); Qwen2 (no permutation) and Gemma (norms plus one)
# also 0. Q8_0, Q4_K, F16:
# every layer's update and rel_update equal gguf_convert --reference (the file's blocks decoded
# by the tests' own decoder, minus the original, LAPACK f64 sigma) within 1e-5 relative, on a
# Llama model, an HF GPT-2 (in-major Conv1D, biases) and stabmeter-train checkpoints (Q4_0 too). An
# architecture with no name map and a pair of different models are refused (exit 2) with
# their message. Skipped (77) without python3, which reads the JSON reports.
set -u
top=$(pwd)
src=${srcdir:-.}
probe=$top/harness/probe
conv=$top/tests/support/gguf_convert
if ! command -v python3 >/dev/null 2>&1; then
  echo "SKIP: python3 is not installed"
  exit 77
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/crossfmt_sh.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
. "$src/tests/support/limit.sh" # expect, pass, fail, summary

# check JSON MODE [REF]: the probe report JSON against what MODE wants (python below); REF is
# gguf_convert --reference's output. A failure prints what differs.
check() {
  if python3 - "$@" >"$dir/check.out" 2>&1 <<'PY'
import json, math, sys
rep = json.load(open(sys.argv[1]))
mode = sys.argv[2]
bad = []
layers = [l for l in rep["layers"] if l["kind"] != "attention"]
if not layers:
    bad.append("no layers")
for l in layers:
    if l.get("reference_tensor") is None:
        bad.append("%s: no reference tensor" % l["name"])
    elif l["reference_tensor"] == l["tensor"]:
        bad.append("%s: reference tensor of the same name %s" % (l["name"], l["tensor"]))
if mode == "zero":                      # every update exactly 0
    for l in layers:
        if l["update"] != 0 or l["rel_update"] != 0:
            bad.append("%s: update %r rel_update %r, want 0" % (l["name"], l["update"], l["rel_update"]))
elif mode == "f32-rounding":            # 0, but a norm's w + 1 - 1 is w only to f32 rounding
    for l in layers:
        lim = 2.0 ** -22 if l["kind"] == "gain" else 0
        if not (0 <= l["update"] <= lim):
            bad.append("%s: update %r, want at most %g" % (l["name"], l["update"], lim))
elif mode == "unpermuted":              # q and k far off, everything else 0
    for l in layers:
        qk = any(s in l["tensor"] for s in ("attn_q.", "attn_k.", "q_proj.", "k_proj."))
        if qk and not (l["update"] > 0.1):
            bad.append("%s: update %r, want a large one (rows in the wrong order)" % (l["name"], l["update"]))
        if not qk and l["update"] != 0:
            bad.append("%s: update %r, want 0" % (l["name"], l["update"]))
else:                                   # against the reference, either direction
    ref = {}
    for line in open(sys.argv[3]):
        g, hf, kind, upd, dw, wg, wh = line.split()
        for key, cur_norm in ((g, wg), (hf, wh)):
            ref[(key, kind)] = (float(upd), float(dw), float(cur_norm))
    seen = 0
    for l in layers:
        # a fused q/k/v's parts by their names (the reference splits it as the probe does)
        r = ref.get((l["name"], l["kind"])) or ref.get((l["tensor"], l["kind"]))
        if r is None:
            bad.append("%s (%s %s): not in the reference" % (l["name"], l["tensor"], l["kind"])); continue
        seen += 1
        upd, dw, wn = r
        if abs(l["update"] - upd) > 1e-5 * abs(upd) + 1e-300 * (upd == 0):
            bad.append("%s: update %.17g, reference %.17g" % (l["name"], l["update"], upd))
        if l["bias"] is None:  # the reference's norms are of the weight alone
            want = dw / wn
            if abs(l["rel_update"] - want) > 1e-5 * abs(want) + 1e-300 * (want == 0):
                bad.append("%s: rel_update %.17g, reference %.17g" % (l["name"], l["rel_update"], want))
    want_layers = int(mode.split(":")[1]) if ":" in mode else None
    if want_layers is not None and seen != want_layers:
        bad.append("%d layers compared, want %d" % (seen, want_layers))
for b in bad[:20]:
    print(b)
sys.exit(1 if bad else 0)
PY
  then
    pass
  else
    fail "${4:-$1} ($2)"
    sed 's/^/    /' "$dir/check.out" | head -n 20
  fi
}

# ratios JSON ERR [OWN]: a cross-format --prev of the same weights, its reference the ratios' too:
# no "no counterpart" warning on ERR (the probe's stderr), every layer's forward_ratio and
# dependency_ratio present and 1 (to 1e-5: the same weights, rows reordered), each ratio its
# value over its *_init, and (OWN: the reference file probed alone, --json) each weight's
# forward_init the forward of the reference's own row of its reference_tensor.
ratios() {
  if python3 - "$@" >"$dir/ratios.out" 2>&1 <<'PY'
import json, math, sys
rep = json.load(open(sys.argv[1]))
err = open(sys.argv[2]).read()
bad = []
if "no counterpart" in err:
    bad.append("warning: " + err.strip().splitlines()[0])
own = {}
if len(sys.argv) > 3 and sys.argv[3]:
    for l in json.load(open(sys.argv[3]))["layers"]:
        own[(l["tensor"], l["kind"])] = l
if not rep["layers"]:
    bad.append("no layers")
for l in rep["layers"]:
    for m in ("forward", "dependency"):
        v, r, i = l[m], l.get(m + "_ratio"), l.get(m + "_init")
        if v is None:
            continue
        if r is None or i is None:
            bad.append("%s: %s_ratio %r, %s_init %r" % (l["name"], m, r, m, i)); continue
        if abs(r - 1) > 1e-5:
            bad.append("%s: %s_ratio %.17g, want 1 (the same weights)" % (l["name"], m, r))
        if abs(r - v / i) > 1e-12 * abs(r):
            bad.append("%s: %s_ratio %.17g, %s / %s_init %.17g" % (l["name"], m, r, m, m, v / i))
    if own and l.get("reference_tensor") is not None and l.get("forward_init") is not None:
        o = own.get((l["reference_tensor"], l["kind"]))
        if o is None:
            bad.append("%s: %s is no row of the reference alone" % (l["name"], l["reference_tensor"]))
        elif l["forward_init"] != o["forward"]:
            bad.append("%s: forward_init %.17g, the reference's own row %.17g" % (l["name"], l["forward_init"], o["forward"]))
for b in bad[:20]:
    print(b)
sys.exit(1 if bad else 0)
PY
  then
    pass
  else
    fail "ratios of $1"
    sed 's/^/    /' "$dir/ratios.out" | head -n 20
  fi
}

# missing JSON ERR N: the "no ratio" warning on ERR counts N layers, and N layers of the report
# have no forward_ratio: the warning counts what the table shows
missing() {
  if python3 - "$@" >"$dir/missing.out" 2>&1 <<'PY'
import json, re, sys
rep = json.load(open(sys.argv[1]))
err = open(sys.argv[2]).read()
want = int(sys.argv[3])
m = re.search(r"(\d+) of (\d+) layers have no counterpart there, so no ratio", err)
bad = []
rows = [l for l in rep["layers"] if l["forward"] is not None]
none = [l["name"] for l in rows if l.get("forward_ratio") is None]
if not m:
    bad.append("no 'no ratio' warning: %r" % err)
else:
    if int(m.group(1)) != len(none) or int(m.group(1)) != want:
        bad.append("warning counts %s, the report has %d layers without a ratio (%s), want %d" % (m.group(1), len(none), ", ".join(none[:5]), want))
    if int(m.group(2)) != len(rows):
        bad.append("warning says %s layers, the report has %d" % (m.group(2), len(rows)))
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
PY
  then
    pass
  else
    fail "the 'no ratio' count of $1"
    sed 's/^/    /' "$dir/missing.out" | head -n 10
  fi
}

# ---- a Llama model: F32 both ways, exactly 0 ----------------------------------------------
expect "gguf_convert --make llama" 0 '' "$conv" --make llama "$dir/l.safetensors"
expect "convert to F32" 0 '' "$conv" "$dir/l.safetensors" "$dir/l.f32.gguf" F32
expect "probe F32 GGUF --prev safetensors" 0 '' "$probe" --quiet --json --exact "$dir/l.f32.gguf" --prev "$dir/l.safetensors"
cp "$out_file" "$dir/a.json"
check "$dir/a.json" zero "" "llama F32, GGUF against safetensors"
cp "$err_file" "$dir/a.err"
expect "probe the safetensors alone" 0 '' "$probe" --quiet --json --exact "$dir/l.safetensors"
cp "$out_file" "$dir/l.own.json"
expect "probe the F32 GGUF alone" 0 '' "$probe" --quiet --json --exact "$dir/l.f32.gguf"
cp "$out_file" "$dir/l.f32.own.json"
ratios "$dir/a.json" "$dir/a.err" "$dir/l.own.json"
expect "probe safetensors --prev F32 GGUF" 0 '' "$probe" --quiet --json --exact "$dir/l.safetensors" --prev "$dir/l.f32.gguf"
cp "$out_file" "$dir/b.json"
check "$dir/b.json" zero "" "llama F32, safetensors against GGUF"
ratios "$dir/b.json" "$err_file" "$dir/l.f32.own.json"
# the same model as a Hugging Face directory of 3 shards: one checkpoint, either way round
expect "shard the llama model" 0 '' python3 "$src/tests/support/shard_split.py" "$dir/l.safetensors" "$dir/lsh" 3
expect "probe F32 GGUF --prev the sharded directory" 0 '' "$probe" --quiet --json --exact "$dir/l.f32.gguf" --prev "$dir/lsh"
cp "$out_file" "$dir/c.json"
check "$dir/c.json" zero "" "llama F32, GGUF against its sharded directory"
ratios "$dir/c.json" "$err_file" "$dir/l.own.json"
expect "probe the sharded directory --prev F32 GGUF" 0 '' "$probe" --quiet --json --exact "$dir/lsh" --prev "$dir/l.f32.gguf"
cp "$out_file" "$dir/d.json"
check "$dir/d.json" zero "" "llama F32, sharded directory against GGUF"
ratios "$dir/d.json" "$err_file" "$dir/l.f32.own.json"
# the table says what each update is against, with its type
expect "probe table" 0 '' "$probe" --quiet "$dir/l.f32.gguf" --prev "$dir/l.safetensors"
if grep -q '^blk.0.attn_q .* vs model.layers.0.self_attn.q_proj.weight F32' "$out_file"; then pass; else
  fail "the table row of blk.0.attn_q does not name its reference"; grep attn_q "$out_file" | head -n 2; fi

# the file without the permutation: q and k far off, the rest 0 (the probe does undo it)
expect "convert without the permutation" 0 '' "$conv" --no-permute "$dir/l.safetensors" "$dir/l.np.gguf" F32
expect "probe it" 0 '' "$probe" --quiet --json "$dir/l.np.gguf" --prev "$dir/l.safetensors"
cp "$out_file" "$dir/np.json"
check "$dir/np.json" unpermuted "" "llama F32 written without the q/k permutation"

# Qwen2 keeps HF's row order: the same file unpermuted, named qwen2, is exact
expect "convert as qwen2" 0 '' "$conv" --arch qwen2 "$dir/l.safetensors" "$dir/q.f32.gguf" F32
expect "probe qwen2 GGUF" 0 '' "$probe" --quiet --json --exact "$dir/q.f32.gguf" --prev "$dir/l.safetensors"
cp "$out_file" "$dir/q.json"
check "$dir/q.json" zero "" "qwen2 F32"

# Gemma: HF's order too, and llama.cpp stores its norm weights plus one
expect "convert as gemma" 0 '' "$conv" --arch gemma "$dir/l.safetensors" "$dir/gm.f32.gguf" F32
expect "probe gemma GGUF" 0 '' "$probe" --quiet --json --exact "$dir/gm.f32.gguf" --prev "$dir/l.safetensors"
cp "$out_file" "$dir/gm.json"
check "$dir/gm.json" zero "" "gemma F32 (norms stored plus one)"
ratios "$dir/gm.json" "$err_file" # the reference's norms read plus one: ratio 1
expect "probe safetensors --prev gemma GGUF" 0 '' "$probe" --quiet --json --exact "$dir/l.safetensors" --prev "$dir/gm.f32.gguf"
cp "$out_file" "$dir/gm2.json"
check "$dir/gm2.json" f32-rounding "" "gemma F32, the other way"
ratios "$dir/gm2.json" "$err_file"

# ---- quantized: each layer's error against the reference -----------------------------------
# Llama: 21 layers (embedding, 2 x 9, output_norm, lm_head) and each row of 256 or 512 is whole
# Q4_K blocks, so every weight is Q4_K
for t in Q8_0 Q4_K F16; do
  expect "convert llama to $t" 0 '' "$conv" "$dir/l.safetensors" "$dir/l.$t.gguf" $t
  expect "reference of llama $t" 0 '' "$conv" --reference "$dir/l.safetensors" "$dir/l.$t.gguf"
  cp "$out_file" "$dir/l.$t.ref"
  expect "probe llama $t GGUF --prev safetensors" 0 '' "$probe" --quiet --json --exact "$dir/l.$t.gguf" --prev "$dir/l.safetensors"
  cp "$out_file" "$dir/c.json"
  check "$dir/c.json" ref:21 "$dir/l.$t.ref"
  expect "probe llama safetensors --prev $t GGUF" 0 '' "$probe" --quiet --json --exact "$dir/l.safetensors" --prev "$dir/l.$t.gguf"
  cp "$out_file" "$dir/d.json"
  check "$dir/d.json" ref:21 "$dir/l.$t.ref"
done
expect "probe llama safetensors --prev Q4_K" 0 '' "$probe" --quiet --json "$dir/l.safetensors" --prev "$dir/l.Q4_K.gguf"
if python3 -c '
import json, sys
rep = json.load(open(sys.argv[1]))
w = [l for l in rep["layers"] if l["kind"] in ("linear", "embedding", "lm_head")]
sys.exit(0 if len(w) == 16 and all(l["reference_dtype"] == "Q4_K" and l["dtype"] == "F32" for l in w) else 1)' "$out_file"
then pass; else fail "the report does not give each weight's reference type (Q4_K)"; fi

# HF GPT-2: Conv1D weights in-major in the safetensors, transposed in the GGUF; biases folded;
# tied (no output.weight): 14 layers (c_attn as q, k and v) plus the tied head
expect "gguf_convert --make gpt2" 0 '' "$conv" --make gpt2 "$dir/g.safetensors"
for t in Q8_0 Q4_K; do
  expect "convert gpt2 to $t" 0 '' "$conv" "$dir/g.safetensors" "$dir/g.$t.gguf" $t
  expect "reference of gpt2 $t" 0 '' "$conv" --reference "$dir/g.safetensors" "$dir/g.$t.gguf"
  cp "$out_file" "$dir/g.$t.ref"
  expect "probe gpt2 $t GGUF --prev safetensors" 0 '' "$probe" --quiet --json --exact "$dir/g.$t.gguf" --prev "$dir/g.safetensors"
  cp "$out_file" "$dir/e.json"
  check "$dir/e.json" ref:15 "$dir/g.$t.ref"
  expect "probe gpt2 safetensors --prev $t GGUF" 0 '' "$probe" --quiet --json --exact "$dir/g.safetensors" --prev "$dir/g.$t.gguf"
  cp "$out_file" "$dir/f.json"
  check "$dir/f.json" ref:15 "$dir/g.$t.ref"
done

# stabmeter-train's checkpoint: GPT-2 names stored out-major (not transposed by the converter)
expect "train a tiny model" 0 '' "$top/harness/train" --width 32 --depth 1 --heads 2 --context 8 --batch 2 \
  --steps 2 --corpus-bytes 4096 --out "$dir/run"
expect "convert it to Q8_0" 0 '' "$conv" "$dir/run/model.safetensors" "$dir/t.gguf" Q8_0
expect "reference of it" 0 '' "$conv" --reference "$dir/run/model.safetensors" "$dir/t.gguf"
cp "$out_file" "$dir/t.ref"
expect "probe it --prev the checkpoint" 0 '' "$probe" --quiet --json --exact "$dir/t.gguf" --prev "$dir/run/model.safetensors"
cp "$out_file" "$dir/t.json"
check "$dir/t.json" ref:12 "$dir/t.ref"

# with biases and a head of its own (output.weight), in Q4_0
expect "train with biases, untied" 0 '' "$top/harness/train" --width 32 --depth 1 --heads 2 --context 8 --batch 2 \
  --steps 2 --corpus-bytes 4096 --biases --untied --out "$dir/run2"
expect "convert it to Q4_0" 0 '' "$conv" "$dir/run2/model.safetensors" "$dir/t2.gguf" Q4_0
expect "reference of it" 0 '' "$conv" --reference "$dir/run2/model.safetensors" "$dir/t2.gguf"
cp "$out_file" "$dir/t2.ref"
expect "probe the checkpoint --prev it" 0 '' "$probe" --quiet --json --exact "$dir/run2/model.safetensors" --prev "$dir/t2.gguf"
cp "$out_file" "$dir/t2.json"
check "$dir/t2.json" ref:12 "$dir/t2.ref"

# ---- refused: no name map, different models ---------------------------------------------
# the Llama GGUF renamed to an architecture with no map (same length, so the file stays valid)
python3 -c '
import sys
b = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write(b.replace(b"llama", b"bertx"))' "$dir/l.f32.gguf" "$dir/bert.gguf"
expect "an architecture with no name map" 2 "architecture 'bertx' has no name map" \
  "$probe" --quiet "$dir/bert.gguf" --prev "$dir/l.safetensors"
expect "the same, the other way" 2 "architecture 'bertx' has no name map" \
  "$probe" --quiet "$dir/l.safetensors" --prev "$dir/bert.gguf"
# a Llama GGUF against a GPT-2 safetensors: no converted name is there
expect "a GPT-2 safetensors against a Llama GGUF" 2 "none of the .* layers .* has a counterpart there \(no tensor of the converted name\)" \
  "$probe" --quiet "$dir/l.f32.gguf" --prev "$dir/g.safetensors"
# two widths of one model: the names are there, the shapes are not
expect "train a wider model" 0 '' "$top/harness/train" --width 64 --depth 1 --heads 2 --context 8 --batch 2 \
  --steps 1 --corpus-bytes 4096 --out "$dir/wide"
expect "a GGUF of width 32 against a checkpoint of width 64" 2 "no tensor of the converted name and shape" \
  "$probe" --quiet "$dir/t.gguf" --prev "$dir/wide/model.safetensors"
# some layers missing: a warning naming the name looked for, the rest measured
python3 -c '
import sys
b = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write(b.replace(b"blk.1.ffn_up.weight", b"blk.1.ffn_zz.weight"))' "$dir/l.f32.gguf" "$dir/renamed.gguf"
expect "a tensor renamed" 0 "warning: .* 1 of 21 layers have no counterpart" \
  "$probe" --quiet "$dir/l.safetensors" --prev "$dir/renamed.gguf"
if grep -q "model.layers.1.mlp.up_proj: no update: not found (looked for 'blk.1.ffn_up.weight')" "$out_file"; then pass; else
  fail "the layer without a counterpart does not say which name was looked for"; grep -A3 "not measured" "$out_file"; fi
# the renamed file as the ratios' reference (--init) across formats: one layer without a ratio,
# counted as the report counts it
expect "--init the renamed GGUF" 0 "warning: .*renamed.gguf: 1 of 23 layers have no counterpart there, so no ratio: model.layers.1.mlp.up_proj\$" \
  "$probe" --quiet --json "$dir/l.safetensors" --prev "$dir/l.f32.gguf" --init "$dir/renamed.gguf"
cp "$out_file" "$dir/ri.json"
missing "$dir/ri.json" "$err_file" 1

# no head counts in the GGUF metadata: q and k cannot be put back in order, so no update for
# them (said), the other layers measured
python3 -c '
import sys
b = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write(b.replace(b"llama.attention.head_count", b"llama.attention.head_cxxxx"))' "$dir/l.f32.gguf" "$dir/noheads.gguf"
expect "no head counts" 0 "warning: .* 4 of 21 layers have no counterpart" \
  "$probe" --quiet "$dir/noheads.gguf" --prev "$dir/l.safetensors"
if grep -q "blk.0.attn_k: no update: no row order (the GGUF metadata has no valid llama.attention.head_count" "$out_file" &&
  grep -q "^blk.0.attn_v .* 0 " "$out_file"; then pass; else
  fail "without head counts, q and k do not say why they have no update"; grep -A8 "not measured" "$out_file"; fi

summary crossfmt.sh
