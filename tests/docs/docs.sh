#!/bin/sh
# docs.sh — docs/manual/metrics.md, the definitions users read, against what the programs record: every
# dataset and attribute name of real traces (one from harness/train, one from probe --hdf5) and
# every key of real probe reports appears in it as a `name`, every kind and layout value too, its
# links to its own headings resolve, every link of the README and of docs/ (manual and lab notes)
# names a file and heading that exist, and no distributed source file sends users to SPEC.md (a
# file the repository has never shipped). The names come from the files, read by h5dump, not
# from a list kept here, so a new dataset or key fails this test until it is documented.
# Skipped (exit 77) when h5dump (Debian hdf5-tools) or python3 is missing.
set -u
top=$(pwd)
src=${srcdir:-.}
doc=$src/docs/manual/metrics.md
for tool in h5dump python3; do
  if ! command -v $tool >/dev/null 2>&1; then
    echo "SKIP: $tool is not installed"
    exit 77
  fi
done
dir=$(mktemp -d "${TMPDIR:-/tmp}/docs_sh.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
. "$src/tests/support/limit.sh"

if [ ! -f "$doc" ]; then
  fail "$doc does not exist (not written, or not in the tarball: dist_doc_DATA)"
  summary docs.sh
  exit 1
fi

# ---- real outputs -------------------------------------------------------------------------
# A tiny run: tied head, attention, gains, embeddings, the trainer's scalars and layer extras;
# two checkpoints so the probe reports updates.
expect "train writes a trace and checkpoints" 0 '' "$top/harness/train" --width 32 --depth 1 \
  --heads 2 --context 8 --batch 2 --steps 2 --corpus-bytes 4096 --checkpoint-every 1 --out "$dir/run"
expect "probe --json --prev on the trainer's checkpoint" 0 '' "$top/harness/probe" --quiet --json \
  --prev "$dir/run/step-000001.safetensors" "$dir/run/model.safetensors"
cp "$out_file" "$dir/train_probe.json"
# HF GPT-2 names: in-major Conv1D weights, LayerNorm biases (kind bias), tensors not measured
# (the errors list); --hdf5 writes the probe's own trace.
expect "st_gen writes a GPT-2 checkpoint" 0 '' "$top/tests/support/st_gen" "$dir/g" gpt2 F32
expect "probe --json --prev --hdf5 on it" 0 '' "$top/harness/probe" --quiet --json --heads 2 \
  --prev "$dir/g.prev.safetensors" --hdf5 "$dir/probe.h5" --step 7 "$dir/g.safetensors"
cp "$out_file" "$dir/gpt2_probe.json"
for t in run/trace.h5 probe.h5; do
  expect "h5dump -A $t" 0 '' h5dump -A "$dir/$t"
  cp "$out_file" "$dir/$(basename "$t" .h5).dump"
done

# ---- every name, documented ---------------------------------------------------------------
python3 - "$doc" "$dir"/trace.dump "$dir"/probe.dump -- "$dir"/train_probe.json "$dir"/gpt2_probe.json \
  >"$dir/names.out" 2>&1 <<'PY'
import json, re, sys
args = sys.argv[1:]
doc_path, dumps, reports = args[0], args[1:args.index("--")], args[args.index("--") + 1:]
doc = open(doc_path, encoding="utf-8").read()
wanted = {}  # name -> where it was seen

def want(name, where):
    wanted.setdefault(re.sub(r"^head\d+_bound$", "head<h>_bound", name), where)

for path in dumps:
    text = open(path, encoding="utf-8").read()
    # dataset and attribute names (group names are layer names, not ours to document)
    for what, name in re.findall(r'^\s*(DATASET|ATTRIBUTE) "([^"]+)"', text, re.M):
        want(name, "%s %s of %s" % (what.lower(), name, path))
    # the values of the attributes that name categories
    for attr, value in re.findall(r'ATTRIBUTE "(kind|layout|format)" \{.*?\(0\): "([^"]*)"', text, re.S):
        want(value, "%s value in %s" % (attr, path))

for path in reports:
    rep = json.load(open(path, encoding="utf-8"))
    layer_names = {l["name"] for l in rep.get("layers", [])}
    for key in rep:
        want(key, "top-level key of " + path)
    want(rep["format"], "format of " + path)
    for l in rep.get("layers", []):
        for key in l:
            want(key, "layer key of " + path)
        for key in ("kind", "layout", "tight_method"):
            if isinstance(l.get(key), str):
                want(l[key], "%s value in %s" % (key, path))
        for flag in l.get("flags", []):
            want(flag, "flag in " + path)
    for e in rep.get("errors", []):
        for key in e:
            want(key, "error key of " + path)

    def walk(x, where):  # a summary's structure: its keys, not the layer names it holds
        if isinstance(x, dict):
            for k, v in x.items():
                if k not in layer_names:
                    want(k, where)
                walk(v, where)
        elif isinstance(x, list):
            for v in x:
                walk(v, where)
    walk(rep.get("summary"), "summary key of " + path)

missing = sorted(n for n in wanted if "`%s`" % n not in doc and "`/%s`" % n not in doc)
for n in missing:
    print("not in docs/manual/metrics.md as `%s`: %s" % (n, wanted[n]))
print("%d names checked" % len(wanted))
sys.exit(1 if missing or len(wanted) < 40 else 0)
PY
if [ $? -eq 0 ]; then pass; else fail "names recorded but not documented:"; fi
sed 's/^/    /' "$dir/names.out"

# ---- links to its own headings ------------------------------------------------------------
python3 - "$doc" >"$dir/links.out" 2>&1 <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
# the anchors GitHub and most Markdown renderers give headings: lower case, punctuation other
# than '-' and '_' dropped, spaces to '-'
anchors = set()
for h in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
    anchors.add(re.sub(r"[^\w\- ]", "", h.lower().replace("`", "")).replace(" ", "-"))
bad = [a for a in re.findall(r"\]\(#([^)]+)\)", text) if a not in anchors]
for a in bad:
    print("link to #%s: no such heading" % a)
sys.exit(1 if bad else 0)
PY
if [ $? -eq 0 ]; then pass; else fail "broken links inside docs/manual/metrics.md:"; sed 's/^/    /' "$dir/links.out"; fi

# ---- links between the documents --------------------------------------------------------
# The README and every page of docs/ (the manual and the lab notes) link to each other by
# relative paths: each link names a file of the source tree, and each #anchor a heading there.
python3 - "$src" >"$dir/doclinks.out" 2>&1 <<'PY'
import glob, os, re, sys
root = sys.argv[1]
pages = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
def prose(path):  # the text outside code fences
    return re.sub(r"^```.*?^```", "", open(path, encoding="utf-8").read(), flags=re.M | re.S)
def anchors(path):
    return {re.sub(r"[^\w\- ]", "", h.lower().replace("`", "")).replace(" ", "-")
            for h in re.findall(r"^#{1,6} +(.+?) *$", prose(path), re.M)}
bad = links = 0
for page in pages:
    for link in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
        if re.match(r"[a-z]+:", link):
            continue
        links += 1
        path, _, anchor = link.partition("#")
        target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(target):
            print("%s: %s: no such file" % (os.path.relpath(page, root), link)); bad += 1
        elif anchor and target.endswith(".md") and anchor not in anchors(target):
            print("%s: %s: no such heading" % (os.path.relpath(page, root), link)); bad += 1
print("%d pages, %d links" % (len(pages), links))
sys.exit(1 if bad or len(pages) < 10 or links < 50 else 0)
PY
if [ $? -eq 0 ]; then pass; else fail "broken links between the documents:"; sed 's/^/    /' "$dir/doclinks.out"; fi

# ---- nothing points at SPEC.md ------------------------------------------------------------
# The sources a tarball ships and users read (--help texts, headers, comments, notebooks, the
# docs, the README). Two tests name SPEC.md on purpose (this one and cli.sh, which rejects it in --help).
find "$src/docs" "$src/include" "$src/lib" "$src/harness" "$src/notebooks-export" "$src/tests" \
  \( -path "$src/tests/fuzz-build" -o -path "$src/tests/corpus" \) -prune -o -type f \
  \( -name '*.c' -o -name '*.h' -o -name '*.py' -o -name '*.sh' -o -name '*.md' \) -print |
  grep -v -e '/tests/docs/docs\.sh$' -e '/tests/programs/cli\.sh$' >"$dir/files"
echo "$src/README.md" >>"$dir/files"
echo "$src/quickstart.sh" >>"$dir/files"
echo "$src/configure.ac" >>"$dir/files"
echo "$src/Makefile.am" >>"$dir/files"
if [ "$(wc -l <"$dir/files")" -lt 20 ]; then
  fail "found only $(wc -l <"$dir/files") source files under $src"
elif xargs grep -nw 'SPEC' <"$dir/files" >"$dir/spec.out"; then
  fail "files that still point at SPEC.md (say docs/manual/metrics.md):"
  sed 's/^/    /' "$dir/spec.out"
else
  pass
fi

summary docs.sh
