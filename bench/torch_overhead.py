"""The cost of stabmeter.torch.Monitor measuring every step of a PyTorch training loop: a small
GPT on the CPU (width 256, 4 blocks, 4 heads, context 64, batch 8, AdamW), its step time with
and without the monitor (snapshot before optimizer.step(), measure and trace row after), in
short alternating rounds of one run, and their ratio; the same for Monitor(background=True)
(the measurement on the monitor's thread while the next step runs).

    STABMETER_LIBRARY=lib/.libs/libstabmeter.so.3 PYTHONPATH=python:tests/python \\
        /usr/bin/python3 bench/torch_overhead.py [--rounds 24] [--steps 5]

Prints one JSON line: the median step times in ms; the ratio (issue 31's target: <= 1.05), the
median over pairs of adjacent rounds of the monitored round's mean step time over the plain
one's, so that a machine whose load changes during the run (a shared one) changes both sides of
each ratio alike; the monitor's own time per step (before_step plus after_step); the same three
for the background monitor under "background"; the load average at the start and the end. Each
round starts with one step not counted, so that every counted step of a background round runs
alongside the measurement of the step before it, as in a loop that never stops (the last one's
is waited for outside the count). The first rounds (warm-up: torch's allocator, the monitors'
cold Lanczos starts) are not counted.

Where this process may measure at idle priority (stabmeter.torch.idle_priority()), a fourth
kind, "background_idle", is Monitor(background=True, priority="idle"), so that one run shows
what the idle priority gives (its background_priority is printed). It gives only what the
trainer leaves idle: a BLAS whose threads spin between products leaves nothing. The
environment variables that decide that (OPENBLAS_THREAD_TIMEOUT, OMP_WAIT_POLICY, ...) are
printed under "env"; for example

    OPENBLAS_THREAD_TIMEOUT=4 STABMETER_LIBRARY=... /usr/bin/python3 bench/torch_overhead.py"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

import stabmeter
import stabmeter.torch as st

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from python_gpt import GPT, batches  # noqa: E402


# what decides whether a trainer's threads leave a core idle between products
ENV_THREADS = ("OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY",
               "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "MKL_NUM_THREADS")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=24, help="rounds of each kind (default 24)")
    ap.add_argument("--steps", type=int, default=5, help="steps counted per round (default 5)")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None,
                    help="the monitors' threads= (default: the Monitor's own default)")
    a = ap.parse_args()
    load0 = os.getloadavg()
    torch.manual_seed(0)
    heads, context = 4, 64
    model = GPT(vocab=256, width=a.width, depth=a.depth, heads=heads, context=context)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(256, context, 8)
    with tempfile.TemporaryDirectory() as d:
        mons = {"monitor": st.Monitor(model, trace=os.path.join(d, "trace.h5"), heads=heads,
                                      threads=a.threads),
                "background": st.Monitor(model, trace=os.path.join(d, "background.h5"), heads=heads,
                                         threads=a.threads, background=True)}
        if st.idle_priority()[0]:
            mons["background_idle"] = st.Monitor(model, trace=os.path.join(d, "background_idle.h5"),
                                                 heads=heads, threads=a.threads, background=True,
                                                 priority="idle")
        kinds = ("plain",) + tuple(mons)
        step = 0
        times = {k: [] for k in kinds}
        own = {k: [] for k in mons}    # seconds inside before_step and after_step
        pairs = {k: [] for k in mons}  # (plain round's mean, monitored round's mean)

        def run(kind, n, record):
            nonlocal step
            mon = mons.get(kind)
            for i in range(n + 1):
                x, y = next(data)
                t0 = time.perf_counter()
                loss = model(x, y)
                opt.zero_grad()
                loss.backward()
                step += 1
                if mon:
                    t1 = time.perf_counter()
                    mon.before_step(step)
                    t_own = time.perf_counter() - t1
                opt.step()
                if mon:
                    t1 = time.perf_counter()
                    mon.after_step(step, loss=loss.item())
                    t_own += time.perf_counter() - t1
                    if record and i:
                        own[kind].append(t_own)
                if record and i:
                    times[kind].append(time.perf_counter() - t0)
            if mon:
                mon.wait()  # the last step's measurement, before another kind's round

        for k in kinds:
            run(k, a.steps, False)
        for _ in range(a.rounds):
            for k in kinds:
                run(k, a.steps, True)
            plain = statistics.mean(times["plain"][-a.steps:])
            for k in mons:
                pairs[k].append((plain, statistics.mean(times[k][-a.steps:])))
        layers = len(mons["monitor"].layers)
        priority = mons.get("background_idle", mons["background"]).background_priority
        for m in mons.values():
            m.close()
    plain = statistics.median(times["plain"])

    def figures(k):
        monitored = statistics.median(times[k])
        return {"monitor_ms": round(monitored * 1e3, 2),
                "ratio": round(statistics.median(m / p for p, m in pairs[k]), 3),
                "ratio_of_medians": round(monitored / plain, 3),
                "monitor_own_ms": round(statistics.median(own[k]) * 1e3, 2)}

    out = {"width": a.width, "depth": a.depth, "layers": layers,
           "parameters": sum(p.numel() for p in model.parameters()),
           "steps_each": a.rounds * a.steps, "plain_ms": round(plain * 1e3, 2)}
    out.update(figures("monitor"))
    out.update({k: figures(k) for k in mons if k != "monitor"})
    out.update({"background_priority": priority,
                "env": {k: os.environ[k] for k in ENV_THREADS if k in os.environ},
                "torch_threads": torch.get_num_threads(),
                "monitor_threads": a.threads or "default", "stabmeter": stabmeter.__version__,
                "load_start": [round(x, 2) for x in load0],
                "load_end": [round(x, 2) for x in os.getloadavg()]})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
