"""The library's own time for one monitor step of the small GPT of bench/torch_overhead.py
(width 256, 4 blocks, 4 heads of 64, 40 layers): stab_monitor_measure with the update metrics,
after a few real AdamW steps so that the warm starts and the update are those of training, and
each layer alone (stab_monitor_measure_some, without the update), largest first. No torch runs
while it is timed: this is the engine's and the monitor's cost, not a training loop's (that is
bench/torch_overhead.py).

    STABMETER_LIBRARY=lib/.libs/libstabmeter.so.N PYTHONPATH=python:tests/python \\
        /usr/bin/python3 bench/monitor_step.py [--threads 1] [--repeats 200] [--layers 8]

To compare two libraries, run it with each STABMETER_LIBRARY in turn, alternating, more than
once: a shared machine's speed drifts over minutes. Prints one JSON line: the median step in ms
(snapshot not counted), the sum over the layers measured alone, and the slowest layers."""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import torch

import stabmeter
import stabmeter.torch as st
from stabmeter._lib import lib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from python_gpt import GPT, batches  # noqa: E402


def median_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="the monitor's threads= (default: its own)")
    ap.add_argument("--repeats", type=int, default=200, help="timed steps (default 200)")
    ap.add_argument("--layers", type=int, default=8, help="slowest layers printed (default 8)")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = GPT(vocab=256, width=256, depth=4, heads=4, context=64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(256, 64, 8)
    mon = st.Monitor(model, heads=4, threads=a.threads)
    for step in range(1, 4):  # real updates and warm vectors
        x, y = next(data)
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        mon.before_step(step)
        opt.step()
        mon.after_step(step)
    m = mon._m
    times = []
    for _ in range(a.repeats):  # the snapshot (a copy) before each, not timed
        if lib.stab_monitor_snapshot(m) != 0:
            raise RuntimeError(lib.stab_last_error().decode())
        t0 = time.perf_counter()
        status = lib.stab_monitor_measure(m, 1)
        times.append(time.perf_counter() - t0)
        if status != 0:
            raise RuntimeError(lib.stab_last_error().decode())
    names = list(mon.metrics())  # the C monitor's layers, in its order
    lib.stab_monitor_layer_count.restype = ctypes.c_size_t
    if lib.stab_monitor_layer_count(m) != len(names):
        raise RuntimeError("the monitor has %d layers, metrics() %d" % (lib.stab_monitor_layer_count(m), len(names)))
    some = lib.stab_monitor_measure_some
    some.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
    some.restype = ctypes.c_int
    alone = []
    for i, name in enumerate(names):
        which = bytes(1 if j == i else 0 for j in range(len(names)))
        alone.append((median_ms(lambda: some(m, 0, which), max(a.repeats // 10, 5)), name))
    alone.sort(reverse=True)
    mon.close()
    print(json.dumps({"stabmeter": stabmeter.__version__, "threads": a.threads or "default",
                      "layers": len(names), "step_ms": round(statistics.median(times) * 1e3, 2),
                      "layers_alone_ms": round(sum(t for t, _ in alone), 2),
                      "slowest": [[n, round(t, 3)] for t, n in alone[:a.layers]],
                      "load": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
