#!/bin/sh
# safetensors_write.sh — the library's safetensors writer read by a reader that shares no code
# with it: Python's json and struct parse the sample file check_safetensors_write --write makes
# (the format's rules: header length, padding, offsets in order and covering the data) and
# compare every metadata entry, dtype, shape and value with the ones the test wrote.
set -u
fail() { echo "FAIL: $*"; exit 1; }
python=${PYTHON:-python3}
command -v "$python" >/dev/null 2>&1 || { echo "SKIP: $python not found"; exit 77; }
writer=tests/unit/check_safetensors_write
[ -x "$writer" ] || { echo "SKIP: $writer not built (Check missing)"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/safetensors_write.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
"$writer" --write "$tmp/s.safetensors" || fail "the writer failed"
"$python" - "$tmp/s.safetensors" <<'PY' || fail "the file does not read back in Python"
import json, math, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert n % 8 == 0, "header length %d not a multiple of 8" % n
text = raw[8:8 + n].decode("utf-8")
assert text == text.rstrip(" ") + " " * (len(text) - len(text.rstrip(" "))), "padding is not spaces"
pairs = json.loads(text, object_pairs_hook=lambda kv: kv)  # keeps the keys' order
data = raw[8 + n:]
order = [k for k, _ in pairs]
assert order == ["__metadata__", "w", 'b"x', "scalar", "empty", "\u03bb.u8"], order
h = dict(pairs)
assert dict(h["__metadata__"]) == {"format": "pt", "note": 'a "quoted" \\ line\nand \u00e9t\u00e9'}, h["__metadata__"]
sizes = {"F32": 4, "BF16": 2, "I64": 8, "U8": 1}
want = {
    "w": ("F32", [2, 3], struct.pack("<6f", 1.0, -2.5, 3.25, 0.0, -0.0, 1e-30)),
    'b"x': ("BF16", [4], struct.pack("<4H", 0x3F80, 0xC020, 0x7F80, 0x0001)),
    "scalar": ("I64", [], struct.pack("<q", -1234567890123)),
    "empty": ("F32", [0, 5], b""),
    "\u03bb.u8": ("U8", [3], bytes([0, 127, 255])),
}
end = 0
for name in order[1:]:
    e = dict(h[name])
    dtype, shape, blob = want[name]
    assert e["dtype"] == dtype and e["shape"] == shape, (name, e)
    a, b = e["data_offsets"]
    assert a == end and b - a == math.prod(shape) * sizes[dtype], (name, a, b, end)
    assert data[a:b] == blob, (name, data[a:b], blob)
    end = b
assert end == len(data), "data section %d bytes, the tensors end at %d" % (len(data), end)
(x,) = struct.unpack("<f", want["w"][2][4:8])
assert x == -2.5
print("safetensors_write: %d tensors and the metadata read back in Python: ok" % (len(order) - 1))
PY
