#!/bin/sh
# llmc_recipe.sh — harness/llmc_recipe.c (llm.c's parameters registered by their checkpoint names)
# run on an llm.c checkpoint that st_gen writes (V = 50 padded to 64 with rows of 1e6), its trace
# against stabmeter-probe --json of the same two files: the same layer names and kinds, the same
# values within the errors both report; and every linear layer's sigma, the embeddings and the LM
# head against numpy in float64 (the real V: a padding row would make them 1e6). Also: the code
# docs/manual/instrumenting.md shows between <!-- recipe --> and <!-- /recipe --> is the
# program's, line for line, and the README's C example names its layers as the probe names
# llm.c's. Skipped (77) without numpy; under the sanitizers only the C programs run (the
# interpreter is not instrumented).
set -u
src=${srcdir:-.}
build=${builddir:-.}
fail() { echo "FAIL: $*"; exit 1; }
# The sanitizer build (STAB_SANITIZED) runs the C programs (st_gen, the probe, the recipe) and
# stops there: the comparisons need the interpreter, which is not instrumented.
if [ -n "${STAB_SANITIZED:-}" ]; then
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/llmc_recipe.XXXXXX") || exit 1
  trap 'rm -rf "$tmp"' EXIT
  "$build/tests/support/st_gen" "$tmp/m" llmc F32 || fail "st_gen llmc F32"
  "$build/harness/probe" --json --prev "$tmp/m.prev.bin" "$tmp/m.bin" >"$tmp/probe.json" 2>"$tmp/probe.err" ||
    { cat "$tmp/probe.err"; fail "stabmeter-probe --json --prev"; }
  "$build/harness/llmc_recipe" "$tmp/m.prev.bin" "$tmp/m.bin" "$tmp/trace.h5" 2>"$tmp/recipe.err" ||
    { cat "$tmp/recipe.err"; fail "harness/llmc_recipe"; }
  echo "sanitizer build: st_gen, the probe and the recipe ran clean; the comparisons run in the plain build"
  exit 0
fi
. "$src/tests/python/python_pick.sh"
py=$(pick_python numpy)
[ -n "$py" ] || { echo "SKIP: numpy is not importable (Debian: apt-get install python3-numpy)"; exit 77; }
src_abs=$(cd "$src" && pwd)
build_abs=$(cd "$build" && pwd)
lib=$(built_library "$build") || fail "no library to load"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/llmc_recipe.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
run_py() {
  STABMETER_LIBRARY=$lib PYTHONPATH="$src_abs/python:$src_abs/tests/support" PYTHONDONTWRITEBYTECODE=1 \
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$py" "$@"
}

# The manual shows the program itself: its block is a run of the program's lines.
doc=$src/docs/manual/instrumenting.md
awk '$0 == "<!-- recipe: harness/llmc_recipe.c -->" { on = 1; found = 1; next }
     on && $0 == "<!-- /recipe -->" { on = 0; next }
     on && !/^```/ { print }
     END { if (!found) exit 1 }' "$doc" >"$tmp/shown.c" && [ -s "$tmp/shown.c" ] ||
  fail "docs/manual/instrumenting.md has no block between <!-- recipe: harness/llmc_recipe.c --> and <!-- /recipe -->"
[ -f "$src/harness/llmc_recipe.c" ] || fail "no harness/llmc_recipe.c"
run_py - "$tmp/shown.c" "$src/harness/llmc_recipe.c" <<'PY' || exit 1
import sys
shown, prog = open(sys.argv[1]).read(), open(sys.argv[2]).read()
if shown not in prog:
    lines = prog.splitlines()
    for l in shown.splitlines():
        if l not in lines:
            sys.exit("FAIL: docs/manual/instrumenting.md shows a line harness/llmc_recipe.c does not have: %r" % l)
    sys.exit("FAIL: docs/manual/instrumenting.md shows harness/llmc_recipe.c's lines, but not as one run of them")
print("instrumenting.md shows %d lines of harness/llmc_recipe.c as they are" % len(shown.splitlines()))
PY

"$build/tests/support/st_gen" "$tmp/m" llmc F32 || fail "st_gen llmc F32"
"$build/harness/probe" --json --prev "$tmp/m.prev.bin" "$tmp/m.bin" >"$tmp/probe.json" 2>"$tmp/probe.err" ||
  { cat "$tmp/probe.err"; fail "stabmeter-probe --json --prev"; }

# The README's C example names the layers of an llm.c model as the probe does.
awk '/^```c$/ { on = 1; next } on && /^```$/ { exit } on' "$src/README.md" >"$tmp/readme.c"
[ -s "$tmp/readme.c" ] || fail "README.md has no C example"
run_py - "$tmp/readme.c" "$tmp/probe.json" <<'PY' || exit 1
import json, re, sys
names = re.findall(r'\.name = "([^"]*)"', open(sys.argv[1]).read())
probe = [l["name"] for l in json.load(open(sys.argv[2]))["layers"]]
if not names:
    sys.exit("FAIL: README.md's C example registers no named layer")
odd = [n for n in names if n not in probe]
if odd:
    sys.exit("FAIL: README.md's C example names layers %s; stabmeter-probe names an llm.c model's %s" % (odd, probe))
print("README.md's C example names %s as the probe does" % names)
PY

"$build/harness/llmc_recipe" "$tmp/m.prev.bin" "$tmp/m.bin" "$tmp/trace.h5" 2>"$tmp/recipe.err" ||
  { cat "$tmp/recipe.err"; fail "harness/llmc_recipe"; }
run_py - "$tmp" <<'PY' || exit 1
import math, sys
import numpy as np
from same_rows import from_probe, from_trace, compare, check_linear, check_table
d = sys.argv[1]
trace, probe = from_trace(d + "/trace.h5", 1), from_probe(d + "/probe.json")
bad = compare(trace, probe, "the recipe's trace", "the probe's report")

# llm.c's file, read here: 256 int32 of header, then the parameters in llm.c's order.
def params(path):
    raw = np.fromfile(path, dtype="<i4", count=256)
    T, V, L, NH, C, Vp = (int(x) for x in raw[2:8])
    p = np.fromfile(path, dtype="<f4", offset=1024).astype(np.float64)
    shapes = [("wte", (Vp, C)), ("wpe", (T, C)), ("ln1w", (L, C)), ("ln1b", (L, C)), ("qkvw", (L, 3 * C, C)),
              ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)), ("ln2w", (L, C)),
              ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)),
              ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
    out, at = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        out[name] = p[at:at + n].reshape(shape)
        at += n
    assert at == p.size, "the file holds %d floats, llm.c's shapes %d" % (p.size, at)
    return out, V, L, C

a, V, L, C = params(d + "/m.bin")
b, _, _, _ = params(d + "/m.prev.bin")
assert a["wte"][V:].min() == 1e6, "st_gen's padding rows are not 1e6: the test would not see them"
bad += check_table(trace, "wte", a["wte"][:V], b["wte"][:V], "embedding")
bad += check_table(trace, "wpe", a["wpe"], b["wpe"], "embedding")
bad += check_table(trace, "lm_head", a["wte"][:V], b["wte"][:V], "lm_head")
for l in range(L):
    for i, x in enumerate("qkv"):
        s = slice(i * C, (i + 1) * C)
        bad += check_linear(trace, "h.%d.attn.%s" % (l, x), a["qkvw"][l][s], a["qkvb"][l][s],
                            b["qkvw"][l][s], b["qkvb"][l][s], C, C)
    for name, w, bias, din, dout in (("attn.proj", "attprojw", "attprojb", C, C), ("mlp.fc", "fcw", "fcb", C, 4 * C),
                                     ("mlp.proj", "fcprojw", "fcprojb", 4 * C, C)):
        bad += check_linear(trace, "h.%d.%s" % (l, name), a[w][l], a[bias][l], b[w][l], b[bias][l], din, dout)
if bad:
    sys.exit("FAIL:\n  " + "\n  ".join(bad[:40]))
print("the recipe's trace: %d layers, named, kinded and valued as the probe's report; sigma, "
      "the embeddings and the LM head (V = %d) as numpy's" % (len(trace), V))
PY
