"""run_notebooks — what `make notebooks` runs: each plain-text notebook of notebooks-export/ is
turned into a .ipynb (py2nb), executed headless in a python3 Jupyter kernel, and exported as HTML
next to the PNG figures it saves, all in one output directory.

Usage: run_notebooks.py [--out DIR] [--timeout S] [NAME ...]   (NAME: trace, width_sweep,
coord_check, lr_transfer, checkpoints, live; default all). Inputs reach the notebooks through the
environment (STAB_TRACE, STAB_SWEEP, STAB_LR_SWEEP, STAB_CHECKPOINTS, STAB_PROBE, STAB_ALARM,
STAB_COORD_*, STAB_EARLY_STEP, STAB_LIVE_*). A notebook whose input is
the default and absent (no sweep was run, say) is skipped with a message; any other failure
names the notebook and the cell, keeps the partly executed notebook and HTML for a look, and
makes the exit status 1. Exit 2 for bad usage."""

import argparse
import os
import sys
import time

import nbformat
from nbconvert import HTMLExporter
from nbconvert.preprocessors import CellExecutionError, ExecutePreprocessor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import py2nb  # noqa: E402

NOTEBOOKS = ("trace", "width_sweep", "coord_check", "lr_transfer", "checkpoints", "live")


def missing_default_input(name):
    """Why notebook `name` cannot run on its default input, or None. Only defaults are
    checked: an input the user named and that is missing is the notebook's error to report."""
    trace = os.environ.get("STAB_TRACE", "").strip() or "runs/demo/trace.h5"
    if name in ("trace", "live") and not os.environ.get("STAB_TRACE", "").strip() and not os.path.exists(trace):
        return "no trace at %s (run ./quickstart.sh, or give TRACE=path)" % trace
    if name in ("width_sweep", "coord_check") and not os.environ.get("STAB_SWEEP", "").strip():
        dirs = ["runs/sweep-steepest", "runs/sweep-adamw"]
        if not any(os.path.isdir(d) for d in dirs):
            return "no sweep at %s (give SWEEP=\"DIR ...\", see README)" % " ".join(dirs)
    if name == "lr_transfer" and not os.environ.get("STAB_LR_SWEEP", "").strip():
        dirs = ["runs/lr-steepest", "runs/lr-adamw"]
        if not any(os.path.isdir(d) for d in dirs):
            return "no learning-rate sweep at %s (give LR_SWEEP=\"DIR ...\", see docs/manual/notebooks.md)" % " ".join(dirs)
    if name == "checkpoints" and not os.environ.get("STAB_CHECKPOINTS", "").strip():
        d = os.path.dirname(trace) or "."
        if not os.path.exists(os.path.join(d, "model.safetensors")):
            return "no checkpoint in %s (give CHECKPOINTS=\"FILE|DIR ...\")" % d
    return None


def run(name, out, timeout):
    """Converts, executes and exports notebook `name`; returns True when every cell ran."""
    src = os.path.join(HERE, name + ".py")
    ipynb = os.path.join(out, name + ".ipynb")
    with open(src, encoding="utf-8") as f:
        nb = py2nb.convert(f.read())
    ok = True
    t0 = time.time()
    try:
        ExecutePreprocessor(kernel_name="python3", timeout=timeout).preprocess(
            nb, {"metadata": {"path": os.getcwd()}})
    except CellExecutionError as e:
        ok = False
        # The exception's text ends with the error line; the traceback is in the HTML too.
        lines = [l for l in str(e).strip().splitlines() if l.strip()]
        sys.stderr.write("notebooks: %s failed: %s\n" % (name, lines[-1] if lines else e))
    nbformat.write(nb, ipynb)
    html, _ = HTMLExporter().from_notebook_node(nb)
    with open(os.path.join(out, name + ".html"), "w", encoding="utf-8") as f:
        f.write(html)
    sys.stderr.write("notebooks: %s %s in %.1f s: %s, %s\n" % (
        name, "ran" if ok else "FAILED", time.time() - t0, ipynb, os.path.join(out, name + ".html")))
    return ok


def main():
    ap = argparse.ArgumentParser(description="Execute the stabmeter notebooks headless.")
    ap.add_argument("--out", default="notebooks-out", help="output directory (default notebooks-out)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per cell (default 900)")
    ap.add_argument("names", nargs="*", metavar="NAME", help="notebooks to run: %s" % ", ".join(NOTEBOOKS))
    a = ap.parse_args()
    bad = [n for n in a.names if n not in NOTEBOOKS]
    if bad:
        ap.error("unknown notebook %s (known: %s)" % (", ".join(bad), ", ".join(NOTEBOOKS)))
    os.makedirs(a.out, exist_ok=True)
    # The notebooks import stabtrace from here and save their figures into --out.
    os.environ["PYTHONPATH"] = HERE + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    os.environ["STAB_OUT"] = os.path.abspath(a.out)
    # ipykernel's debugger otherwise warns on stderr about frozen modules at every start.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    failed, ran = [], 0
    for name in a.names or NOTEBOOKS:
        why = missing_default_input(name)
        if why:
            sys.stderr.write("notebooks: %s skipped: %s\n" % (name, why))
            continue
        ran += 1
        if not run(name, a.out, a.timeout):
            failed.append(name)
    if not ran:
        sys.stderr.write("notebooks: nothing to run: no input found (see above)\n")
        return 1
    if failed:
        sys.stderr.write("notebooks: failed: %s (see %s/NAME.html)\n" % (", ".join(failed), a.out))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
