#!/usr/bin/env python3
"""shard_split.py -- test helper for tests/programs/sharded.sh: cuts a safetensors file into N shards the way
Hugging Face saves a large model (consecutive runs of tensors in the file's data order, each shard a
safetensors file with the same __metadata__, named model-0000K-of-0000N.safetensors) and writes
model.safetensors.index.json beside them ({"metadata": {"total_size": bytes}, "weight_map": {...}},
keys sorted, as transformers writes it). Written from the format's definition with the standard
library only: it shares no code with stabmeter's readers.

Usage: shard_split.py SRC OUTDIR N [--drop NAME]... [--dup NAME]
  --drop NAME  leave tensor NAME out of the model (shards and index)
  --dup NAME   also write model-dup.safetensors holding a copy of NAME and a tensor extra.weight,
               the index listing extra.weight there and NAME where it was (NAME in two shards)
"""
import json
import os
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen])
    data = blob[8 + hlen:]
    meta = header.pop("__metadata__", None)
    tensors = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return meta, [(name, info, data[info["data_offsets"][0]:info["data_offsets"][1]]) for name, info in tensors]


def write(path, meta, tensors):
    header, pos, body = {}, 0, []
    if meta is not None:
        header["__metadata__"] = meta
    for name, info, raw in tensors:
        header[name] = {"dtype": info["dtype"], "shape": info["shape"], "data_offsets": [pos, pos + len(raw)]}
        pos += len(raw)
        body.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the reference writer pads the header to 8 bytes with spaces
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(body))


def main(argv):
    src, out, n = argv[1], argv[2], int(argv[3])
    drop, dup, i = set(), None, 4
    while i < len(argv):
        if argv[i] == "--drop":
            drop.add(argv[i + 1])
        elif argv[i] == "--dup":
            dup = argv[i + 1]
        else:
            sys.exit("shard_split.py: unknown option " + argv[i])
        i += 2
    meta, tensors = read(src)
    tensors = [t for t in tensors if t[0] not in drop]
    os.makedirs(out, exist_ok=True)
    weight_map, total = {}, 0
    for k in range(n):
        part = tensors[k * len(tensors) // n:(k + 1) * len(tensors) // n]
        name = "model-%05d-of-%05d.safetensors" % (k + 1, n)
        write(os.path.join(out, name), meta, part)
        for t in part:
            weight_map[t[0]] = name
            total += len(t[2])
    if dup is not None:
        copy = [t for t in tensors if t[0] == dup][0]
        extra = ("extra.weight", {"dtype": "F32", "shape": [2]}, b"\0" * 8)
        write(os.path.join(out, "model-dup.safetensors"), meta, [copy, extra])
        weight_map["extra.weight"] = "model-dup.safetensors"
        total += 8
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv)
