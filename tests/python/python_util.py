"""Helpers of the tests/python/python_*.py tests: the build tree's programs (STAB_BUILD, set by
tests/python/python_api.sh), a safetensors writer of their own, and the probe's JSON as reference."""

import gc
import json
import os
import signal
import struct
import subprocess
import time

import numpy as np

BUILD = os.environ.get("STAB_BUILD", ".")


def program(name):
    return os.path.join(BUILD, "harness", name)


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: array}, written as F32 in the order given."""
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(np.shape(a)), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def probe_json(path, *args):
    """stabmeter-probe --json's report of path (exit 0 expected), parsed."""
    r = subprocess.run([program("probe"), "--json", *args, path], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError("stabmeter-probe %s exited %d: %s" % (path, r.returncode, r.stderr))
    return json.loads(r.stdout)


def close(got, want, rtol):
    """got and want equal within rtol, or both missing (NaN in Python, null in the probe's JSON)."""
    if want is None:
        return got is None or got != got
    return abs(got - want) <= rtol * abs(want)


def in_forked_child(child, what, seconds=60):
    """Runs child() in a forked process, then gc.collect() there (so that objects child dropped
    are finalized in the child), and returns (the child's exit status, the string child
    returned). A child still running after `seconds` is killed and the calling test fails with
    an AssertionError naming `what`: a hang is a failure, not the end of the run."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            msg = child()
            gc.collect()
            os.write(w, msg.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    for _ in range(int(seconds * 10)):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        raise AssertionError("the forked child hung " + what)
    with os.fdopen(r, "rb") as f:
        return status, f.read().decode()
