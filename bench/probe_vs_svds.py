#!/usr/bin/python3
"""The whole probe of a safetensors checkpoint against what a Python user would write instead:
a loop of scipy's svds(k=1) per linear layer at a ladder of tolerances, and a loop of full SVDs
(numpy.linalg.svd, values only), in f32, timed in one run, each value's actual error against an
f64 SVD of the same matrix. bench/probe_vs_svds.sh is the usual way in; run with --help.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np
from scipy.sparse.linalg import svds

LADDER = (1e-1, 3e-2, 1e-2, 3e-3, 1e-3)
CACHE_NAME = "probe_vs_svds.f64.json"


class BadInput(Exception):
    """A checkpoint this script cannot read (exit 2)."""


# ---- reading safetensors: a u64 header length, a JSON header, then the raw tensors ---------

def read_header(path):
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise BadInput(f"{path}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > 100 << 20:
            raise BadInput(f"{path}: header length {n} is not plausible")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise BadInput(f"{path}: header is not JSON ({e})") from None
    header.pop("__metadata__", None)
    return 8 + n, header


def shard_files(ckpt):
    """The checkpoint's files: a sharded directory's shards (from its index), a directory's
    model.safetensors, or the file itself."""
    if os.path.isdir(ckpt):
        index = os.path.join(ckpt, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
            return [os.path.join(ckpt, n) for n in names]
        single = os.path.join(ckpt, "model.safetensors")
        if os.path.exists(single):
            return [single]
        raise BadInput(f"{ckpt}: neither model.safetensors.index.json nor model.safetensors")
    if os.path.isfile(ckpt):
        return [ckpt]
    raise BadInput(f"{ckpt}: no such file or directory")


class Checkpoint:
    """Every tensor's file, offset, dtype and shape; matrices read one at a time as f32."""

    def __init__(self, ckpt):
        self.files = shard_files(ckpt)
        self.where = {}
        for path in self.files:
            start, header = read_header(path)
            for name, t in header.items():
                self.where[name] = (path, start + t["data_offsets"][0], t["dtype"], t["shape"])

    def key(self):
        """What the f64 cache is valid for: each file's name, size and modification time."""
        return [[os.path.basename(p), os.stat(p).st_size, os.stat(p).st_mtime_ns] for p in self.files]

    def matrix(self, name):
        path, offset, dtype, shape = self.where[name]
        count = int(np.prod(shape))
        width = {"BF16": 2, "F16": 2, "F32": 4}.get(dtype)
        if width is None:
            raise BadInput(f"{name}: dtype {dtype} is not read here (BF16, F16, F32)")
        with open(path, "rb") as f:
            f.seek(offset)
            raw = f.read(count * width)
        if len(raw) != count * width:
            raise BadInput(f"{path}: {name} runs past the end of the file")
        if dtype == "BF16":  # the top half of an f32: exact
            w = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dtype == "F16":
            w = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:
            w = np.frombuffer(raw, dtype="<f4").copy()
        return w.reshape(shape)


# ---- the f64 reference, cached beside the checkpoint ---------------------------------------

def cache_path(ckpt):
    return os.path.join(ckpt, CACHE_NAME) if os.path.isdir(ckpt) else ckpt + "." + CACHE_NAME


def load_cache(ckpt, key):
    try:
        with open(cache_path(ckpt)) as f:
            c = json.load(f)
    except (OSError, ValueError):
        return {}
    return c.get("sigma", {}) if c.get("key") == key else {}


def compute_reference(ckpt, tensors, fresh):
    """LAPACK dgesdd (numpy, values only) on an f64 copy of each matrix, the ones not cached
    yet; the cache is rewritten every few matrices, so an interrupted run keeps its work."""
    model = Checkpoint(ckpt)
    key = model.key()
    have = {} if fresh else load_cache(ckpt, key)
    todo = [t for t in tensors if t not in have]
    t0 = time.perf_counter()
    for i, name in enumerate(todo):
        have[name] = float(np.linalg.svd(model.matrix(name).astype(np.float64), compute_uv=False)[0])
        if (i + 1) % 8 == 0 or i + 1 == len(todo):
            write_json(cache_path(ckpt), {"key": key, "sigma": have})
            print(f"probe_vs_svds: f64 reference {i + 1}/{len(todo)}, {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr)
    return len(todo), time.perf_counter() - t0


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def reference(args, tensors):
    """The f64 values of the tensors, computed (at a lower priority: they take minutes on a
    large model, and the machine is shared) by a child process unless cached."""
    model = Checkpoint(args.checkpoint)
    have = {} if args.fresh else load_cache(args.checkpoint, model.key())
    missing = [t for t in tensors if t not in have]
    if missing:
        print(f"probe_vs_svds: computing {len(missing)} f64 SVDs (nice 10), cached in "
              f"{cache_path(args.checkpoint)}", file=sys.stderr)
        cmd = ["nice", "-n", "10", sys.executable, os.path.abspath(__file__), "--reference-only",
               args.checkpoint, "--tensors", ",".join(tensors)] + (["--fresh"] if args.fresh else [])
        if subprocess.run(cmd).returncode != 0:
            raise RuntimeError("the f64 reference failed")
        have = load_cache(args.checkpoint, model.key())
    else:
        print(f"probe_vs_svds: f64 reference from {cache_path(args.checkpoint)}", file=sys.stderr)
    lost = [t for t in tensors if t not in have]
    if lost:
        raise RuntimeError(f"the f64 reference lacks {lost[0]} (and {len(lost) - 1} more)")
    return {t: have[t] for t in tensors}, len(missing)


# ---- the runs ------------------------------------------------------------------------------

def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def run_probe(args):
    """One timed run of the probe over the whole checkpoint (every layer, not only the linear
    ones: what a user runs); its JSON report."""
    cmd = [args.probe, args.checkpoint, "--json", "--quiet", "--tol", repr(args.tol)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    secs = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.decode(errors='replace').strip()}")
    return secs, json.loads(p.stdout)


def linear_layers(report):
    """(layer name, tensor, sigma, reported relative error) of each linear layer the probe
    measured: the matrices whose sigma it gives."""
    rows = []
    for l in report["layers"]:
        if l.get("kind") == "linear" and "expert" not in l and l.get("experts") is None:
            rows.append((l["name"], l["tensor"], l.get("sigma"), l.get("sigma_rel_err")))
    return rows


def rel(a, b):
    return abs(a - b) / b if b > 0 else abs(a - b)


def main():
    ap = argparse.ArgumentParser(
        description="Time stabmeter-probe on a whole safetensors checkpoint against Python loops of "
        "scipy svds(k=1) (at each tolerance of a ladder) and of numpy.linalg.svd, in f32, over the same "
        "linear layers, with each one's actual error against an f64 SVD (cached beside the checkpoint). "
        "Exit 0 when it ran, whatever the figures; 1 on a failure; 2 on bad usage or input.")
    ap.add_argument("checkpoint", help="a sharded directory (model.safetensors.index.json), or a .safetensors file")
    ap.add_argument("--probe", default="./harness/probe", help="the probe program (default %(default)s)")
    ap.add_argument("--tol", type=float, default=1e-3,
                    help="the probe's requested tolerance, also the svds error to match (default %(default)g, the probe's own)")
    ap.add_argument("--ladder", default=",".join(f"{t:g}" for t in LADDER),
                    help="svds tolerances, loosest first (default %(default)s)")
    ap.add_argument("--no-full-svd", action="store_true", help="skip the full-SVD loop")
    ap.add_argument("--fresh", action="store_true", help="recompute the cached f64 reference")
    ap.add_argument("--probe-json", metavar="FILE",
                    help="take the probe's report from FILE instead of running it (no probe time)")
    ap.add_argument("--json", metavar="FILE", help="also write every figure to FILE as JSON")
    ap.add_argument("--reference-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tensors", help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        ladder = sorted((float(t) for t in args.ladder.split(",")), reverse=True)
    except ValueError:
        ap.error(f"--ladder {args.ladder}: not a list of numbers")
    if not ladder or not all(0 < t < 1 for t in ladder):
        ap.error(f"--ladder {args.ladder}: tolerances must lie in (0, 1)")
    if not 0 < args.tol < 1:
        ap.error(f"--tol {args.tol}: must lie in (0, 1)")

    try:
        if args.reference_only:
            compute_reference(args.checkpoint, args.tensors.split(","), args.fresh)
            return 0
        return compare(args, ladder)
    except BadInput as e:
        print(f"probe_vs_svds: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError, KeyError, ValueError) as e:
        print(f"probe_vs_svds: {e}", file=sys.stderr)
        return 1


def compare(args, ladder):
    model = Checkpoint(args.checkpoint)
    # The layers come from a first probe run: it decides what is a linear layer, as it would for
    # the user. That run also warms the page cache, so every timed run below reads from memory.
    if args.probe_json:
        with open(args.probe_json) as f:
            report = json.load(f)
    else:
        _, report = run_probe(args)
    layers = linear_layers(report)
    if not layers:
        raise BadInput(f"{args.checkpoint}: the probe found no linear layer")
    for name, tensor, sigma, err in layers:
        if tensor not in model.where or len(model.where[tensor][3]) != 2:
            raise BadInput(f"{name}: tensor {tensor} is not a matrix of {args.checkpoint}")
        if not isinstance(sigma, (int, float)) or not isinstance(err, (int, float)):
            raise RuntimeError(f"{name}: the probe's report has no sigma or sigma_rel_err")
    tensors = [t for _, t, _, _ in layers]
    others = [n for n, (_, _, _, s) in model.where.items() if len(s) == 2 and n not in set(tensors)]
    ref, computed = reference(args, tensors)

    load_start = loadavg()
    probe_runs = []
    if not args.probe_json:
        secs, report = run_probe(args)
        probe_runs.append(secs)
    svds_s = {t: 0.0 for t in ladder}
    svds_err = {t: [] for t in ladder}
    full_s, full_err, read_s = 0.0, [], 0.0
    rng = np.random.default_rng(1)
    # Matrix by matrix, every method in turn, so a burst of load elsewhere hits them alike.
    for i, tensor in enumerate(tensors):
        t0 = time.perf_counter()
        w = model.matrix(tensor)
        read_s += time.perf_counter() - t0
        for t in ladder:
            t0 = time.perf_counter()
            s = svds(w, k=1, tol=t, return_singular_vectors=False, random_state=rng)[0]
            svds_s[t] += time.perf_counter() - t0
            svds_err[t].append(rel(float(s), ref[tensor]))
        if not args.no_full_svd:
            t0 = time.perf_counter()
            s = np.linalg.svd(w, compute_uv=False)[0]
            full_s += time.perf_counter() - t0
            full_err.append(rel(float(s), ref[tensor]))
        if (i + 1) % 22 == 0:
            print(f"probe_vs_svds: {i + 1}/{len(tensors)} matrices", file=sys.stderr)
    if not args.probe_json:
        secs, report = run_probe(args)
        probe_runs.append(secs)
    load_end = loadavg()

    # the probe's actual errors from its second report (both runs give the same values)
    by_tensor = {l[1]: l for l in linear_layers(report)}
    probe_err, over = [], []
    for tensor in tensors:
        name, _, sigma, reported = by_tensor[tensor]
        e = rel(sigma, ref[tensor])
        probe_err.append((e, name))
        # An exact sigma (small matrices) reports ~1e-20; below the f64 SVD's own rounding,
        # max(m, n) eps relative, the reference cannot tell, so that much is not counted.
        if e > reported + max(model.where[tensor][3]) * np.finfo(np.float64).eps:
            over.append((name, e, reported))
    probe_worst = max(probe_err)
    worst = {t: max(svds_err[t]) for t in ladder}
    met = [t for t in ladder if worst[t] <= args.tol]
    chosen = met[0] if met else ladder[-1]  # loosest that meets the tolerance, else the tightest
    probe_s = sum(probe_runs) / len(probe_runs) if probe_runs else None

    out = print
    out(f"checkpoint {args.checkpoint}: {len(tensors)} linear matrices compared; not compared: "
        f"{len(others)} other 2-D tensors ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}: "
        f"the probe gives no sigma for embeddings and the LM head, whose metrics are row norms)")
    out(f"f64 reference (numpy.linalg.svd f64, values only): {computed} computed now, "
        f"{len(tensors) - computed} from the cache")
    if probe_s is not None:
        out(f"probe (whole checkpoint, tol {args.tol:g}): {probe_s:.2f} s "
            f"(mean of {' and '.join(f'{s:.2f}' for s in probe_runs)} s, before and after the loops)")
    else:
        out(f"probe: report from {args.probe_json}, not timed")
    out(f"  worst actual error {probe_worst[0]:.3g} ({probe_worst[1]}); honesty: {len(over)} of "
        f"{len(tensors)} matrices with an actual error above the reported sigma_rel_err "
        f"(+ max(m, n) x 2.2e-16, the f64 reference's own rounding)")
    for name, e, r in sorted(over, key=lambda x: -x[1])[:5]:
        out(f"    {name}: actual {e:.3g}, reported {r:.3g}")
    out(f"reading the matrices as f32 (not in the loops' times): {read_s:.2f} s")
    for t in ladder:
        mark = " <- compared" if t == chosen else ""
        out(f"svds k=1 tol {t:g} (f32): {svds_s[t]:.2f} s, worst actual error {worst[t]:.3g}{mark}")
    if not met:
        out(f"  no svds tolerance of the ladder reached a worst error <= {args.tol:g}: compared at {chosen:g}")
    if not args.no_full_svd:
        out(f"full SVD per tensor (numpy.linalg.svd f32, values only): {full_s:.2f} s, "
            f"worst actual error {max(full_err):.3g}")
    ratio_svds = svds_s[chosen] / probe_s if probe_s else None
    ratio_full = full_s / probe_s if probe_s and not args.no_full_svd else None
    if ratio_svds is not None:
        out(f"ratio svds(tol {chosen:g}) / probe: {ratio_svds:.2f} (target >= 3: "
            f"{'PASS' if ratio_svds >= 3 and met else 'FAIL'})")
    if ratio_full is not None:
        out(f"ratio full SVD / probe: {ratio_full:.1f} (target >= 30: {'PASS' if ratio_full >= 30 else 'FAIL'})")
    flag = probe_worst[0] > worst[chosen]
    out(f"worst actual error: probe {probe_worst[0]:.3g}, svds(tol {chosen:g}) {worst[chosen]:.3g}"
        + (": THE PROBE'S IS WORSE" if flag else ""))
    out(f"load average: {load_start} at the start, {load_end} at the end (2 cores)")

    if args.json:
        write_json(args.json, {
            "checkpoint": args.checkpoint, "matrices": len(tensors), "not_compared": others,
            "tol": args.tol, "reference_computed": computed,
            "probe": {"seconds": probe_s, "runs": probe_runs, "worst_rel_err": probe_worst[0],
                      "worst_layer": probe_worst[1], "over_reported": len(over),
                      "over_reported_layers": [o[0] for o in over]},
            "svds": [{"tol": t, "seconds": svds_s[t], "worst_rel_err": worst[t]} for t in ladder],
            "svds_tol_compared": chosen, "svds_meets_tol": bool(met),
            "full_svd": None if args.no_full_svd else {"seconds": full_s, "worst_rel_err": max(full_err)},
            "read_seconds": read_s, "ratio_svds_over_probe": ratio_svds,
            "ratio_full_svd_over_probe": ratio_full, "probe_error_worse": flag,
            "load_start": load_start, "load_end": load_end})
    return 0


if __name__ == "__main__":
    sys.exit(main())
