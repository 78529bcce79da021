#!/bin/sh
# The probe's memory on 16-bit checkpoints, and the Llama-shaped models tests/support/hf_gen writes for
# bench/probe_speed.sh --model:
#  - a BF16 GPT-2-124M-shaped file: the probe reads BF16 where it is mapped (the library converts
#    a few rows at a time), so its peak RSS is near the largest tensor's mapped bytes, not an
#    f32 copy of it beside them (wte: 77 MB mapped, 154 MB as f32 per measuring thread);
#  - the same with --prev against the same file as F32 and as F16, and the metrics equal to those
#    of the F32 file (the values are the same numbers);
#  - hf_gen's toy preset: config.json, the index (total size, every tensor in the shard it names,
#    no block across shards), Llama's names, each shard probed; bad usage exit 2.
# Peak RSS is the kernel's own high-water mark (ru_maxrss of the probe, via python3), not a
# sample; the bound is skipped in the sanitizer build, whose shadow memory it would count.
set -u
top=$(pwd)
src=${srcdir:-.}
probe=$top/harness/probe
st_gen=$top/tests/support/st_gen
hf_gen=$top/tests/support/hf_gen
dir=$(mktemp -d "${TMPDIR:-/tmp}/probe_memory.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
. "$src/tests/support/limit.sh"
command -v python3 >/dev/null 2>&1 || { echo "probe_memory.sh: python3 needed"; exit 77; }

# peak_kb CMD...: runs CMD (output in $dir/peak.out, $dir/peak.err) and prints its exit status
# and peak RSS in kB
peak_kb() {
  timeout "$LIMIT_SECONDS" python3 -c '
import resource, subprocess, sys
out, err = sys.argv[1], sys.argv[2]
with open(out, "wb") as o, open(err, "wb") as e:
    rc = subprocess.run(sys.argv[3:], stdout=o, stderr=e, stdin=subprocess.DEVNULL).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$dir/peak.out" "$dir/peak.err" "$@"
}

# The GPT-2-124M part: four probes of a 124M-parameter model, for peak-RSS bounds that only the
# plain build can check (the sanitizer's shadow memory would count) and metrics the smaller
# files of tests/programs/probe.sh and tests/programs/crossfmt.sh also compare across dtypes. The sanitizer build
# (STAB_SANITIZED, where it took 2.4 minutes) and the tarball's distcheck run (STAB_DISTCHECK,
# quickstart.sh test) leave it out.
if [ -n "${STAB_SANITIZED:-}${STAB_DISTCHECK:-}" ]; then
  echo "probe_memory.sh: the GPT-2-124M part runs in the plain build only"
else
  for dt in BF16 F16 F32; do
    "$st_gen" "$dir/g_$dt" gpt2-124m $dt >/dev/null || fail "st_gen gpt2-124m $dt"
  done
  big=$dir/g_BF16.safetensors
  # wte, 50257 x 768 BF16: the largest tensor's mapped bytes
  wte_kb=$((50257 * 768 * 2 / 1024))
  set -- $(peak_kb "$probe" "$big" --quiet --json)
  if [ "$1" -ne 0 ]; then
    fail "probe of the BF16 file: exit $1: $(head -c 300 "$dir/peak.err")"
  elif [ -n "${STAB_SANITIZED:-}" ]; then
    echo "probe_memory.sh: peak RSS $2 kB (no bound in the sanitizer build)"
    pass
  elif [ "$2" -gt $((wte_kb + 65536)) ]; then
    fail "probe of the BF16 file: peak RSS $2 kB, more than wte's mapped $wte_kb kB + 64 MB (an f32 copy of it is $((2 * wte_kb)) kB)"
  else
    echo "probe_memory.sh: BF16 GPT-2-124M: peak RSS $2 kB (wte mapped: $wte_kb kB)"
    pass
  fi
  cp "$dir/peak.out" "$dir/bf16.json"

  # against the same model stored as F32 and as F16: each read in place in its own dtype (the
  # memory bound is both files' largest tensor mapped), the update defined for every layer, the
  # forward values unchanged by --prev; and BF16's metrics near the F32 file's (the same seeded
  # values, each file rounding them to its dtype)
  for prev in F32 F16; do
    set -- $(peak_kb "$probe" "$big" --prev "$dir/g_$prev.safetensors" --quiet --json)
    if [ "$1" -ne 0 ]; then
      fail "--prev $prev: exit $1: $(head -c 300 "$dir/peak.err")"
      continue
    fi
    mapped_kb=$((wte_kb + wte_kb * (${prev#F} / 16))) # wte mapped in both files
    if [ -z "${STAB_SANITIZED:-}" ] && [ "$2" -gt $((mapped_kb + 65536)) ]; then
      fail "--prev $prev: peak RSS $2 kB, more than both files' wte mapped, $mapped_kb kB, + 64 MB"
    else pass; fi
    cp "$dir/peak.out" "$dir/prev_$prev.json"
  done
  "$probe" "$dir/g_F32.safetensors" --quiet --json >"$dir/f32.json" 2>"$dir/f32.err" || fail "probe of the F32 file: $(cat "$dir/f32.err")"
  if python3 - "$dir/bf16.json" "$dir/f32.json" "$dir/prev_F32.json" "$dir/prev_F16.json" <<'PY'
import json, sys
bf16, f32, p32, p16 = (json.load(open(p)) for p in sys.argv[1:5])
def rows(r):
    return {l["name"]: l for l in r["layers"]}
a, b = rows(bf16), rows(f32)
# st_gen writes the same seeded N(0, 0.02^2) values in each dtype, each rounded to it, so the
# files differ by rounding: the metrics agree to bf16's precision, not bit for bit
assert a.keys() == b.keys() and len(a) > 100, "the same layers"
for n in a:
    for k in ("forward", "dependency"):
        x, y = a[n].get(k), b[n].get(k)
        if isinstance(x, float) and isinstance(y, float):
            assert abs(x - y) <= 2e-2 * abs(y) + 1e-9, (n, k, x, y)
for p in (p32, p16):
    r = rows(p)
    assert r.keys() == a.keys(), "--prev: the same layers"
    for n, l in r.items():
        if l["kind"] == "attention":
            continue
        assert isinstance(l.get("update"), float) and l["update"] >= 0, (n, l.get("update"))
        assert l["forward"] == a[n]["forward"], (n, "forward changed with --prev", l["forward"], a[n]["forward"])
PY
  then pass; else fail "BF16 metrics against the F32 file's, and --prev across dtypes"; fi
fi

# hf_gen: the toy preset, checked by hand
expect "hf_gen without arguments" 2 'usage' "$hf_gen"
expect "hf_gen unknown preset" 2 'usage' "$hf_gen" "$dir/x" llama70b
expect "hf_gen bad --shards" 2 'usage' "$hf_gen" "$dir/x" tiny --shards 0
expect "hf_gen tiny" 0 '' "$hf_gen" "$dir/tiny" tiny
if python3 - "$dir/tiny" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
cfg = json.load(open(os.path.join(d, "config.json")))
for k, v in dict(model_type="llama", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                 tie_word_embeddings=False).items():
    assert cfg[k] == v, (k, cfg.get(k))
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
wm = idx["weight_map"]
shards = sorted(set(wm.values()))
assert shards == ["model-%05d-of-00003.safetensors" % k for k in (1, 2, 3)], shards
seen, total = {}, 0
for s in shards:
    raw = open(os.path.join(d, s), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0, "header padded to 8"
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    end = 0
    for name, t in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        assert t["dtype"] == "BF16" and b == end, (name, b, end)
        count = 1
        for x in t["shape"]:
            count *= x
        assert e - b == 2 * count, name
        end = e
        assert wm[name] == s, (name, wm[name], s)
        seen[name] = s
        total += e - b
    assert 8 + n + end == len(raw), "no bytes after the last tensor"
assert total == idx["metadata"]["total_size"], (total, idx["metadata"])
assert set(seen) == set(wm), "every tensor of the index in a shard"
names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
for l in range(2):
    names += ["model.layers.%d.%s.weight" % (l, m) for m in (
        "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
        "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
assert sorted(names) == sorted(wm), sorted(set(names) ^ set(wm))
for l in range(2):
    assert len({s for n, s in wm.items() if n.startswith("model.layers.%d." % l)}) == 1, "block %d split" % l
PY
then pass; else fail "hf_gen tiny: the directory's layout"; fi
# each shard probed: a Llama's kinds, its KV heads from the k projection (4 query heads)
for s in "$dir"/tiny/model-*.safetensors; do
  expect "probe $(basename "$s")" 0 '' "$probe" "$s" --quiet --json
done
"$probe" "$dir/tiny/model-00003-of-00003.safetensors" --quiet --json >"$dir/t3.json" 2>/dev/null
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); k={l["name"]:l["kind"] for l in r["layers"]}; assert k.get("lm_head")=="lm_head" and k.get("model.norm")=="gain", k' "$dir/t3.json" &&
  pass || fail "hf_gen tiny: the last shard's lm_head and final norm"

summary probe_memory.sh
