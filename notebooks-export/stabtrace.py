"""stabtrace — what the notebooks in notebooks-export/ share: stabmeter traces (docs/manual/metrics.md,
"The trace file"), read by the stabmeter package's read_trace (the library's one trace reader),
as the notebooks use them; probe reports ("The probe's JSON report"), their inputs,
and the plotting conventions (kind colours, axis labels with units, titles naming the run)."""

import glob
import json
import math
import os
import re
import struct
import subprocess
import sys
import time

import numpy as np


def _import_stabmeter():
    """The stabmeter package: the installed one, or the one run.sh puts on the path; a notebook run
    as a plain script from a build directory (python3 notebooks-export/trace.py ...) takes the
    source tree's package over the library built there, as run.sh does."""
    try:
        import stabmeter
        return stabmeter
    except ImportError as e:
        python = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
        la = os.path.join("lib", "libstabmeter.la")
        if os.environ.get("STABMETER_LIBRARY") or not os.path.isfile(la) or not os.path.isdir(python):
            raise ImportError("stabtrace: the stabmeter package does not import (%s): make install, or run "
                              "from the build directory (see notebooks-export/run.sh)" % e) from None
        with open(la) as f:
            soname = re.search(r"^dlname='(.*)'$", f.read(), re.M)
        os.environ["STABMETER_LIBRARY"] = os.path.abspath(os.path.join("lib", ".libs", soname.group(1) if soname else ""))
        sys.path.insert(0, os.path.abspath(python))
        import stabmeter
        return stabmeter


stabmeter = _import_stabmeter()

METRICS = ("forward", "dependency", "update")
# Each metric over its value at the layer's first measured step where it was finite and > 0: the
# trace's <metric>_ratio datasets (written since ratios exist), else computed from its rows (ratio()).
RATIOS = tuple(m + "_ratio" for m in METRICS)
# The order kinds appear in a model, so rows of a figure read from input to output.
KINDS = ("embedding", "linear", "attention", "gain", "bias", "lm_head")
KIND_COLORS = {"embedding": "tab:blue", "linear": "tab:orange", "attention": "tab:red",
               "gain": "tab:green", "bias": "tab:purple", "lm_head": "tab:brown"}
# Markers tell kinds apart where their lines coincide.
KIND_MARKERS = {"embedding": "s", "linear": "o", "attention": "^", "gain": "D", "bias": "v",
                "lm_head": "P"}
# Every metric is a ratio of RMS norms (dimensionless); the LM head's are bounds on a loss, in nats.
METRIC_UNIT = "RMS ratio; LM head: nats"

# STAB_FLAG_* of include/stabmeter.h, as recorded in /layers/flags (format 4; /layers/<layer>/flags before).
FLAG_NAMES = {1: "non-finite weight", 2: "non-finite update", 4: "sigma not converged"}
FLAG_NONFINITE = 1 | 2

FIG_WIDTH_IN = 14.0  # every figure is this wide; at DPI dots per inch: 1400 px
DPI = 100


class InputError(Exception):
    """An input the notebook cannot use; the message names it and what was wrong."""


def _input_error_hook(kind, value, tb, _default=sys.excepthook):
    """Run as a script, an InputError is a one-line message and exit status 2 (bad input), not
    a traceback; anything else is reported as usual."""
    if not issubclass(kind, InputError):
        return _default(kind, value, tb)
    sys.stdout.flush()
    sys.stderr.write("%s: %s\n" % (os.path.basename(sys.argv[0]) or "stabtrace", value))
    sys.stderr.flush()
    os._exit(2)


# ---- inputs -----------------------------------------------------------------------------------

def in_kernel():
    """True when running inside a Jupyter kernel (sys.argv is then the kernel's, not ours)."""
    return "ipykernel" in sys.modules and "ipykernel_launcher" in (sys.argv[0] if sys.argv else "")


if not in_kernel():
    sys.excepthook = _input_error_hook


def setting(env, default, position=None):
    """An input: the script's positional argument `position` (1-based; plain-script runs only),
    else the environment variable `env` when set and non-empty, else `default`."""
    if position is not None and not in_kernel() and len(sys.argv) > position:
        return sys.argv[position]
    value = os.environ.get(env, "")
    return value if value.strip() else default


def number_setting(env, default):
    """A float input from the environment variable `env`, `default` when unset or empty."""
    text = os.environ.get(env, "").strip()
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        raise InputError("%s=%r is not a number" % (env, text)) from None


def pyplot():
    """matplotlib.pyplot, drawing to files only (Agg) unless a Jupyter kernel shows figures inline."""
    import matplotlib
    if not matplotlib.get_backend().lower().startswith("module://matplotlib_inline"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def unit(kind, metric):
    """The unit of a metric of a layer kind: RMS ratios, except the LM head's bounds on a loss."""
    if kind != "lm_head":
        return "RMS ratio"
    return "nats per unit RMS" if metric == "dependency" else "nats"


def output_dir():
    """Where figures go: $STAB_OUT, default notebooks-out/ (created)."""
    out = setting("STAB_OUT", "notebooks-out")
    os.makedirs(out, exist_ok=True)
    return out


def save_figure(fig, name, show=True):
    """Writes FIG as OUT/NAME.png at DPI dots per inch and prints its path and size in pixels.
    In a notebook (show=True) the cell then shows that very PNG and the figure is closed, so it
    is drawn once, not again by the inline backend. Returns nothing (no Out[] line)."""
    path = os.path.join(output_dir(), name + ".png")
    fig.savefig(path, dpi=DPI, facecolor="white")
    with open(path, "rb") as f:
        w, h = struct.unpack(">II", f.read(24)[16:24])  # the PNG header's IHDR width and height
    print("figure: %s (%d x %d px)" % (path, w, h))
    if in_kernel() and show:
        import matplotlib.pyplot as plt
        from IPython.display import Image, display
        display(Image(filename=path))
        plt.close(fig)


def png_bytes(fig):
    """FIG rendered as PNG, as save_figure writes it."""
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return buf.getvalue()


def natural_key(name):
    """Sort key that puts h.2 before h.10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


# ---- traces ---------------------------------------------------------------------------------

class Layer:
    """One layer (a /layers/<name> group before format 4, a column of /layers since): kind,
    attributes, and every per-step series (float64 [N])."""

    def __init__(self, name, kind, attrs, series):
        self.name, self.kind, self.attrs, self.series = name, kind, attrs, series

    def get(self, metric, n):
        """The series `metric`, or NaN x n when this layer does not record it."""
        s = self.series.get(metric)
        return s if s is not None else np.full(n, np.nan)


class Trace:
    """A trace read into memory: steps, wall_time, scalars, layers (in kind order, then name)."""

    def __init__(self, path, config, steps, wall_time, scalars, layers):
        self.path, self.config = path, config
        self.steps, self.wall_time, self.scalars, self.layers = steps, wall_time, scalars, layers

    def __len__(self):
        return len(self.steps)

    def kinds(self):
        """The kinds present, in KINDS order (unknown kinds last)."""
        present = {l.kind for l in self.layers}
        return [k for k in KINDS if k in present] + sorted(present - set(KINDS))

    def of_kind(self, kind):
        return [l for l in self.layers if l.kind == kind]


def _library_trace(path):
    """The whole trace at `path` through the stabmeter package's read_trace (the library's one
    trace reader, which stabmeter-export uses too): every format_version, a trace still being
    written included. A missing file, or one that is not a readable trace, is an InputError."""
    if not os.path.exists(path):
        raise InputError("trace %s: no such file" % path)
    try:
        return stabmeter.read_trace(path)
    except stabmeter.Error as e:
        raise InputError("trace %s" % e) from None  # the library's message starts with the path


def trace_from_library(t, metrics=None):
    """A stabmeter.Trace as the notebooks use it: a Trace of Layers in kind order, then name.
    `metrics` limits which per-layer series are kept (None: all)."""
    try:
        config = json.loads(t.run_config or "{}")
    except ValueError as e:
        raise InputError("trace %s: run_config is not JSON (%s)" % (t.path, e)) from None
    n = len(t.steps)
    wall = t.wall_time if t.wall_time is not None else np.full(n, np.nan)
    layers = []
    for l in t.layers:
        attrs = dict(l.attrs)
        attrs.setdefault("name", l.name)
        if isinstance(attrs.get("shares_storage_with"), str):
            attrs["shares_storage_with"] = attrs["shares_storage_with"].split()
        series = {k: v for k, v in l.metrics.items() if metrics is None or k in metrics}
        layers.append(Layer(l.name, l.kind, attrs, series))
    order = {k: i for i, k in enumerate(KINDS)}
    layers.sort(key=lambda l: (order.get(l.kind, len(KINDS)), natural_key(l.name)))
    return Trace(t.path, config, t.steps, wall, dict(t.scalars), layers)


def read_trace(path, metrics=None):
    """The whole trace at `path`: a Trace (see trace_from_library)."""
    return trace_from_library(_library_trace(path), metrics)


# How run_config fields read in a title: (section, key, format); section None is the top level.
_TITLE_FIELDS = ((None, "optimizer", "%s"), ("model", "width", "width %s"), ("model", "depth", "depth %s"),
                 ("model", "heads", "%s heads"), (None, "lr", "lr %g"), (None, "steps", "%s steps"),
                 (None, "seed", "seed %s"))


def run_title(config, path=None):
    """One line naming the run from its run_config: optimizer, model shape, steps, seed, file.
    Fields the config lacks are left out."""
    model = config.get("model", {})
    parts = []
    if not isinstance(model, dict):  # a writer that names its model instead of describing it
        parts, model = ["model %s" % model], {}
    for section, key, fmt in _TITLE_FIELDS:
        where = model if section == "model" else config
        if key in where:
            parts.append(fmt % where[key])
        if key == "heads" and "tied" in model:
            parts.append("tied head" if model["tied"] else "untied head")
        if key == "heads" and model.get("biases"):
            parts.append("biases")
    if path:
        parts.append(path)
    return " · ".join(parts)


# ---- what a trace says --------------------------------------------------------------------

def defined(values):
    """True when a series has any finite value (NaN-only series are metrics a kind lacks)."""
    return bool(np.isfinite(values).any())


def nan_steps(trace):
    """Indices of rows where training or measuring went non-finite: the loss, any layer's
    forward stability (defined for every kind), or a non-finite-weight/update flag."""
    n = len(trace)
    bad = np.zeros(n, dtype=bool)
    if "loss" in trace.scalars:
        bad |= ~np.isfinite(trace.scalars["loss"])
    for l in trace.layers:
        fwd = l.get("forward", n)
        if defined(fwd):
            bad |= ~np.isfinite(fwd)
        flags = np.nan_to_num(l.get("flags", n)).astype(np.int64)
        bad |= (flags & FLAG_NONFINITE) != 0
    return np.flatnonzero(bad)


def flag_events(trace):
    """Every (layer, row, flag bits) with non-zero flags."""
    out = []
    for l in trace.layers:
        flags = np.nan_to_num(l.get("flags", len(trace))).astype(np.int64)
        for i in np.flatnonzero(flags):
            out.append((l, int(i), int(flags[i])))
    return out


def flag_text(bits):
    return ", ".join(v for k, v in FLAG_NAMES.items() if bits & k) or "flags %d" % bits


def ratio_from_rows(values):
    """A series over its first finite value > 0 (the reference); NaN before that row, and all
    NaN when there is none. What the trace's <metric>_ratio datasets hold."""
    v = np.asarray(values, dtype=np.float64)
    out = np.full(len(v), np.nan)
    ok = np.flatnonzero(np.isfinite(v) & (v > 0))
    if len(ok):
        out[ok[0]:] = v[ok[0]:] / v[ok[0]]
    return out


def ratio(layer, metric, n, lr=None):
    """The ratio to init of a layer's `metric` (forward, dependency or update): its trace
    dataset <metric>_ratio when the trace has one, else computed from the metric's rows
    (older traces) by ratio_from_rows. NaN x n when the layer lacks the metric. With `lr` (the
    trace's lr scalar) the update's ratio is per unit of learning rate, (update / lr) over its
    value at the reference row, as harness/train's --alarm takes it: a schedule's warmup and
    decay then leave it at 1."""
    r = layer.series.get(metric + "_ratio")
    r = r if r is not None else ratio_from_rows(layer.get(metric, n))
    if metric == "update" and lr is not None:
        v = layer.get(metric, n)
        ref = np.flatnonzero(np.isfinite(v) & (v > 0))
        r = r * (lr[ref[0]] / lr) if len(ref) else r
    return r


def alarm_threshold(trace):
    """The alarm threshold, a ratio to init: $STAB_ALARM, else run_config's "alarm" when the
    run recorded one (harness/train --alarm X: ratio to the first measured value > X), else
    None (no alarms)."""
    x = number_setting("STAB_ALARM", None)
    if x is None:
        x = trace.config.get("alarm")
    return float(x) if x else None


def alarm_events(trace, threshold):
    """Per layer, the first row where its forward, dependency or update stability is more
    than `threshold` times its value at init (ratio() > threshold; the update's per unit of
    learning rate when the trace has lr), as (layer, row, metric, ratio). Every kind: a ratio
    does not depend on a kind's natural scale. Non-finite values are nan_steps' to report."""
    out = []
    if threshold is None:
        return out
    for l in trace.layers:
        first = None
        for metric in METRICS:
            r = ratio(l, metric, len(trace), trace.scalars.get("lr"))
            over = np.flatnonzero(np.nan_to_num(r, nan=-np.inf) > threshold)
            if len(over) and (first is None or over[0] < first[1]):
                first = (l, int(over[0]), metric, float(r[over[0]]))
        if first:
            out.append(first)
    return out


def worst_layers(layers, metric, n, count=3, of_ratio=False, lr=None):
    """The `count` layers with the largest value of `metric` over all steps (of its ratio to
    init with of_ratio; lr as ratio() takes it), with that value and its row: [(layer, value,
    row)], largest first; layers without the metric left out. Give it one kind's layers:
    kinds' scales differ."""
    ranked = []
    for l in layers:
        v = ratio(l, metric, n, lr) if of_ratio else l.get(metric, n)
        if defined(v):
            i = int(np.nanargmax(v))
            ranked.append((l, float(v[i]), i))
    ranked.sort(key=lambda t: -t[1])
    return ranked[:count]


def kind_value(layers, metric, n, stat="gmean"):
    """Per row, one number for a kind's layers: the geometric mean of their `metric` over the
    layers where it is finite and > 0 (stat "gmean"), or the largest (stat "max", the worst
    layer). NaN in a row where no layer has a value."""
    rows = np.array([positive(l.get(metric, n)) for l in layers]).reshape(len(layers), n)
    ok = np.isfinite(rows)
    count = ok.sum(axis=0)
    out = np.full(n, np.nan)
    if stat == "max":
        out[count > 0] = np.where(ok, rows, -np.inf).max(axis=0)[count > 0]
    elif stat == "gmean":
        logs = np.where(ok, np.log(np.where(ok, rows, 1.0)), 0.0).sum(axis=0)
        out[count > 0] = np.exp(logs[count > 0] / count[count > 0])
    else:
        raise InputError("unknown statistic %r (gmean or max)" % stat)
    return out


def positive(values):
    """Values fit for a log axis: non-positive and non-finite ones become NaN (gaps)."""
    v = np.array(values, dtype=np.float64)
    v[~(v > 0)] = np.nan
    return v


def tail_median(values, fraction=0.25):
    """The median of the last `fraction` of a series' rows (at least one row), ignoring NaN;
    NaN when none is finite. The coordinate check compares widths by this one number."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return math.nan
    k = max(1, int(math.ceil(len(v) * fraction)))
    tail = v[-k:]
    tail = tail[np.isfinite(tail)]
    return float(np.median(tail)) if len(tail) else math.nan


def loglog_slope(x, y):
    """Least-squares slope of log y against log x over the points where both are positive
    and finite; NaN with fewer than two such points."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if ok.sum() < 2 or len(set(x[ok])) < 2:
        return math.nan
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


# ---- width sweeps ---------------------------------------------------------------------------

def sweep_traces(dirs):
    """The traces of one or more sweep directories (each holding width-W/trace.h5; a directory
    holding such sweep directories counts as all of them), as a list of paths."""
    found = []
    for d in dirs:
        if not os.path.isdir(d):
            raise InputError("sweep %s: no such directory" % d)
        here = glob.glob(os.path.join(d, "width-*", "trace.h5"))
        here += glob.glob(os.path.join(d, "*", "width-*", "trace.h5"))
        if not here:
            raise InputError("sweep %s: no width-W/trace.h5 in it (make one with harness/train "
                             "--width W --out %s/width-W for each W)" % (d, d))
        found += here
    return sorted(set(found), key=natural_key)


def run_key(trace):
    """(optimizer, width) of a trace, from its run_config; InputError when it lacks either."""
    model = trace.config.get("model")
    opt, width = trace.config.get("optimizer"), model.get("width") if isinstance(model, dict) else None
    if opt is None or width is None:
        raise InputError("trace %s: run_config has no optimizer or model.width" % trace.path)
    return opt, width


def read_sweep(dirs, metrics=None):
    """The traces of sweep directories (sweep_traces), as {(optimizer, width): Trace}; two
    traces of one optimizer and width, or a trace without rows, are bad input."""
    runs = {}
    for path in sweep_traces(dirs):
        tr = read_trace(path, metrics=metrics)
        key = run_key(tr)
        if key in runs:
            raise InputError("two traces for %s at width %s: %s and %s" % (key + (runs[key].path, path)))
        if len(tr) == 0:
            raise InputError("trace %s has no measured steps" % path)
        runs[key] = tr
    return runs


def optimizer_order(names):
    """Optimizer names in the order the figures show them: steepest, adamw, then the rest."""
    order = {"steepest": 0, "adamw": 1}
    return sorted(set(names), key=lambda o: (order.get(o, 2), o))


def shared_title(configs, vary=("width",), extra=""):
    """A title naming what a set of runs share: run_title of the run_config fields equal in all
    of them, the optimizer and the model fields in `vary` left out, then `extra`."""
    first = configs[0]
    shared = {k: v for k, v in first.items()
              if k not in ("optimizer", "model") and all(c.get(k) == v for c in configs)}
    shared["model"] = {k: v for k, v in first.get("model", {}).items()
                       if k not in vary and all(c.get("model", {}).get(k) == v for c in configs)}
    return run_title(shared) + extra


# ---- probe reports --------------------------------------------------------------------------

def safetensors_metadata(path):
    """The __metadata__ of a safetensors file (empty when absent or unreadable)."""
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if n > 100 << 20:
                return {}
            return json.loads(f.read(n)).get("__metadata__", {}) or {}
    except (OSError, ValueError, struct.error):
        return {}


def checkpoint_step(path):
    """A checkpoint's training step: safetensors metadata "steps" (harness/train writes it),
    else the digits of a step-NNNNNN name, else None."""
    steps = safetensors_metadata(path).get("steps") if os.path.exists(path) else None
    if steps is not None and str(steps).isdigit():
        return int(steps)
    m = re.search(r"step[-_]?(\d+)", os.path.basename(path))
    return int(m.group(1)) if m else None


def checkpoint_list(items):
    """Checkpoints and reports named by `items` (files; a directory stands for its
    step-*.safetensors and model.safetensors), ordered by step, as (path, step) pairs."""
    paths = []
    for it in items:
        if os.path.isdir(it):
            here = glob.glob(os.path.join(it, "step-*.safetensors"))
            here += glob.glob(os.path.join(it, "model.safetensors"))
            if not here:
                raise InputError("checkpoints %s: no step-*.safetensors or model.safetensors in it" % it)
            paths += here
        elif os.path.exists(it):
            paths.append(it)
        else:
            raise InputError("checkpoint %s: no such file or directory" % it)
    out = []
    for p in paths:
        if p.endswith(".json"):
            try:
                with open(p) as f:
                    ckpt = json.load(f).get("checkpoint") or p
            except (OSError, ValueError) as e:
                raise InputError("report %s: not readable as JSON (%s)" % (p, e)) from None
            step = checkpoint_step(ckpt)
        else:
            step = checkpoint_step(p)
        out.append((p, step))
    # Without steps, keep the order given.
    if all(s is not None for _, s in out):
        out.sort(key=lambda t: t[1])
    seen, unique = set(), []
    for p, s in out:
        key = os.path.realpath(p)
        if key not in seen:
            seen.add(key)
            unique.append((p, s))
    return unique


def probe_program():
    """harness/probe to run: $STAB_PROBE, else ./harness/probe, else stabmeter-probe on PATH."""
    p = os.environ.get("STAB_PROBE", "").strip()
    if p:
        return p
    if os.access("harness/probe", os.X_OK):
        return "./harness/probe"
    return "stabmeter-probe"


def load_report(text, where):
    """A probe report from JSON text, checked against the shape docs/manual/metrics.md gives it."""
    try:
        r = json.loads(text)
    except ValueError as e:
        raise InputError("%s: not JSON (%s)" % (where, e)) from None
    if r.get("format") != "stabmeter-probe":
        raise InputError("%s: format is %r, not 'stabmeter-probe'" % (where, r.get("format")))
    if not isinstance(r.get("layers"), list):
        raise InputError("%s: no layers list" % where)
    return r


def probe_report(path, prev=None):
    """The probe report of one checkpoint: read when `path` is a .json report, else the output
    of `probe --json path [--prev prev]`."""
    if path.endswith(".json"):
        with open(path) as f:
            return load_report(f.read(), path)
    cmd = [probe_program(), "--json", "--quiet", path] + (["--prev", prev] if prev else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise InputError("cannot run %s (%s); set STAB_PROBE to harness/probe" % (cmd[0], e)) from None
    if p.returncode != 0:
        raise InputError("%s failed (exit %d): %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    return load_report(p.stdout, " ".join(cmd))


# ---- plotting -----------------------------------------------------------------------------

def mark_rows(ax, steps, rows, color="red", label=None):
    """Shades the given rows' steps across `ax` (vertical bands one step wide)."""
    for j, i in enumerate(rows):
        ax.axvspan(steps[i] - 0.5, steps[i] + 0.5, color=color, alpha=0.25, lw=0,
                   label=label if j == 0 else None)


def _plain_log_formatter(minor_thresholds=None):
    """A log-axis tick formatter writing 0.3, 1, 20 and 1e-05 instead of 3x10^-1: matplotlib's
    choice of which ticks to label, with plain numbers."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def __call__(self, x, pos=None):
            return "%g" % x if super().__call__(x, pos) else ""

    if minor_thresholds is None:
        return Plain(labelOnlyBase=False)
    return Plain(labelOnlyBase=False, minor_thresholds=minor_thresholds)


def log_axis(ax, axis="y"):
    """A log scale labelled in plain numbers, minor ticks labelled too when the data span less
    than about two decades."""
    getattr(ax, "set_%sscale" % axis)("log")
    a = ax.yaxis if axis == "y" else ax.xaxis
    a.set_major_formatter(_plain_log_formatter())
    a.set_minor_formatter(_plain_log_formatter((2, 0.4)))
    ax.tick_params(axis=axis, which="minor", labelsize=7)


def width_axes(ax, widths):
    """Log-log axes against model width: x in base 2 with a tick at each width swept, y a
    log_axis, a grid, the x label."""
    import matplotlib.ticker
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(widths))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%d"))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlim(widths[0] / 1.25, widths[-1] * 1.25)
    log_axis(ax)
    ax.grid(alpha=0.3, which="both")
    ax.set_xlabel("width (model dimension d)", fontsize=9)


def legend_height(entries):
    """Inches a legend_below with this many one-line entries needs at font size 8."""
    return 0.25 + 0.165 * max(entries, 1)


def legend_below(fig, cell, handles, labels, ncol=1):
    """A legend in its own grid cell under a panel, so it never covers data and the panel keeps
    its full width (the cell is an invisible axes; the legend is left out of the layout)."""
    lax = fig.add_subplot(cell)
    lax.axis("off")
    if handles:
        leg = lax.legend(handles, labels, loc="upper center", fontsize=8, frameon=False, ncol=ncol,
                         borderaxespad=0)
        leg.set_in_layout(False)
    return lax


def undefined_panel(ax, kind, metric):
    ax.text(0.5, 0.5, "%s stability is not defined\nfor %s layers (docs/manual/metrics.md)" % (metric, kind),
            ha="center", va="center", transform=ax.transAxes, color="0.4", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


class LiveTrace:
    """Follows a trace while a writer appends to it (SWMR): poll() reads it again and says how
    many rows there are now; snapshot() gives them. Waits for the file to appear and be opened."""

    def __init__(self, path, metrics=("forward", "dependency", "update", "flags")):
        self.path, self.metrics, self.last = path, metrics, None

    def open(self, deadline):
        while time.time() < deadline:
            if os.path.exists(self.path):
                try:
                    self.last = stabmeter.read_trace(self.path)
                    return True
                except stabmeter.Error:
                    pass  # the writer is still creating it
            time.sleep(0.2)
        return False

    def poll(self):
        try:
            self.last = stabmeter.read_trace(self.path)
        except stabmeter.Error as e:  # a read racing the writer: the caller tries again
            raise OSError(str(e)) from None
        return len(self.last.steps)

    def snapshot(self):
        return trace_from_library(self.last, self.metrics)

    def close(self):
        self.last = None
