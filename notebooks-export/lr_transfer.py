# %% [markdown]
# # Learning-rate transfer: the best learning rate at each width, and what the metrics said early
#
# muP's promise is that the best learning rate does not move as the model gets wider, so it can
# be tuned on a narrow model. This notebook reads learning-rate × width sweeps, one per
# optimizer, and draws the held-out loss at the end of each run against its peak learning rate
# (log axis), one curve per width: the best rate of each width is starred, a run whose loss
# turned non-finite is a cross at the top. Printed: the best rate per width and its loss, and
# how far it moves (the best rate at the largest width over the one at the smallest). Sweeps of
# the same optimizer with other seeds (`--seed S`) are averaged: a curve is the mean held-out
# loss over the seeds of each rate, each seed's own loss a small dot, and a rate at which any
# seed diverged counts as diverged. The runs of one optimizer must share the model (but its
# width), the schedule, the batch and the data: directories that differ there are refused, the
# field named, rather than averaged.
#
# Then, for the largest width, the stability metrics over steps at the best and at the worst
# rate (a diverged one when there is one: the smallest rate that diverged) side by side, and a
# table of every run's metrics early in training next to its final loss: do the metrics tell in
# advance which runs will diverge? The metrics here are the values themselves, each kind's
# worst layer (its largest value at a step), not ratios to init: the runs of one width start
# from the same initialisation, and a ratio's reference (the first measured step) is already
# one update at the run's own rate.
#
# Inputs: `STAB_LR_SWEEP` (or the arguments): sweep directories, one per optimizer, each made by
# `harness/train --sweep-lrs L1,L2,... --sweep-widths W1,W2,... --optimizer O --out DIR`:
# `DIR/lr-sweep.csv` (a row per run: optimizer, width, lr, status ok or diverged, steps_done,
# final_train_loss, heldout_loss, seed; a CSV without the seed column, from stabmeter 0.8.0,
# takes each run's seed from its trace) and `DIR/lr-<lr>/width-<W>/trace.h5` (default
# `runs/lr-steepest runs/lr-adamw`). `STAB_EARLY_STEP`: the step the early metrics are read at
# (default 10% of the run's steps). `STAB_OUT`: the figure directory.

# %%
import csv
import math
import os
import re
import sys

import numpy as np

import stabtrace as st

plt = st.pyplot()

if not st.in_kernel() and len(sys.argv) > 1:
    LR_SWEEP = sys.argv[1:]
else:
    LR_SWEEP = re.split(r"[\s,:]+", st.setting("STAB_LR_SWEEP", "runs/lr-steepest runs/lr-adamw").strip())
EARLY = st.number_setting("STAB_EARLY_STEP", None)
NEED = ("optimizer", "width", "lr", "status", "steps_done", "heldout_loss")


class Run:
    """One row of lr-sweep.csv and where its trace is."""

    def __init__(self, row, sweep, where):
        try:
            self.optimizer, self.lr_text = row["optimizer"], row["lr"]
            self.width, self.lr = int(row["width"]), float(row["lr"])
            self.status, self.steps_done = row["status"], int(row["steps_done"])
            self.heldout = float(row["heldout_loss"])
        except (TypeError, ValueError) as e:
            raise st.InputError("%s: a row that does not read (%s): %s" % (where, e, row)) from None
        if self.status not in ("ok", "diverged"):
            raise st.InputError("%s: status %r, not ok or diverged" % (where, self.status))
        # DIR/lr-X/width-W/, or DIR/lr-X/ when the sweep had one width.
        d = os.path.join(sweep, "lr-" + self.lr_text)
        self.trace_path = os.path.join(d, "width-%d" % self.width, "trace.h5")
        if not os.path.exists(self.trace_path) and os.path.exists(os.path.join(d, "trace.h5")):
            self.trace_path = os.path.join(d, "trace.h5")
        self._trace = None
        self.seed = self._seed(row.get("seed"), where)

    def _seed(self, text, where):
        """The run's seed: the CSV's column, or the run_config of its trace for a CSV without it."""
        if text not in (None, ""):
            try:
                return int(text)
            except ValueError:
                raise st.InputError("%s: seed %r is not a whole number" % (where, text)) from None
        seed = self.trace().config.get("seed")
        if not isinstance(seed, int):
            raise st.InputError("%s: no seed column, and the run_config of %s names no seed" % (where, self.trace_path))
        return seed

    @property
    def diverged(self):
        return self.status == "diverged" or not math.isfinite(self.heldout)

    def trace(self):
        if self._trace is None:
            self._trace = st.read_trace(self.trace_path, metrics=st.METRICS)
        return self._trace


def read_lr_sweep(d):
    """The runs of one sweep directory, from its lr-sweep.csv."""
    path = os.path.join(d, "lr-sweep.csv")
    if not os.path.isdir(d):
        raise st.InputError("lr sweep %s: no such directory" % d)
    if not os.path.exists(path):
        raise st.InputError("lr sweep %s: no lr-sweep.csv in it (make one with harness/train --sweep-lrs "
                            "L1,L2,... --sweep-widths W1,W2,... --out %s)" % (d, d))
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in NEED if c not in (reader.fieldnames or [])]
        if missing:
            raise st.InputError("%s: no column %s (header: %s)" % (path, ", ".join(missing), reader.fieldnames))
        runs = [Run(row, d, "%s line %d" % (path, reader.line_num)) for row in reader]
    if not runs:
        raise st.InputError("%s: no runs in it" % path)
    return runs


runs = {}  # (optimizer, width, lr, seed) -> Run
for d in LR_SWEEP:
    for r in read_lr_sweep(d):
        key = (r.optimizer, r.width, r.lr, r.seed)
        if key in runs:
            raise st.InputError("two runs of %s at width %d, lr %g and seed %d: in %s and %s" % (
                key + (os.path.dirname(runs[key].trace_path), os.path.dirname(r.trace_path))))
        runs[key] = r
optimizers = st.optimizer_order(k[0] for k in runs)

# What the runs of one optimizer must share for their curves to compare rates, widths and seeds:
# the model but its width, the schedule, the batch and the data (from each trace's run_config).
SHARED_MODEL = ("vocab", "depth", "context", "biases", "tied", "attn_scale")
SHARED_RUN = ("warmup", "min_lr_frac", "batch", "steps", "data")


def check_same_setup(opt):
    """InputError when two runs of `opt` differ in a field of SHARED_MODEL or SHARED_RUN:
    sweep directories of another model or schedule given together would be averaged."""
    mine = [runs[k] for k in sorted(runs) if k[0] == opt]
    def fields(r):
        config = r.trace().config
        model = config.get("model") if isinstance(config.get("model"), dict) else {}
        return dict([("model." + f, model.get(f)) for f in SHARED_MODEL] + [(f, config.get(f)) for f in SHARED_RUN])
    first = fields(mine[0])
    for r in mine[1:]:
        for name, value in fields(r).items():
            if value != first[name]:
                raise st.InputError("lr sweep: %s runs differ in %s: %r in %s, %r in %s (the curves compare one model "
                                    "and schedule across rates, widths and seeds)" % (
                                        opt, name, first[name], mine[0].trace_path, value, r.trace_path))


for opt in optimizers:
    check_same_setup(opt)


class Cell:
    """The runs of one optimizer, width and learning rate, one per seed: their mean held-out
    loss, diverged when any of them diverged."""

    def __init__(self, rs):
        self.runs = sorted(rs, key=lambda r: r.seed)
        self.lr, self.width = self.runs[0].lr, self.runs[0].width
        self.diverged = any(r.diverged for r in self.runs)
        self.heldout = math.nan if self.diverged else float(np.mean([r.heldout for r in self.runs]))
        self.first = self.runs[0]  # the run drawn and compared: the smallest seed's

    def seeds_text(self):
        """'' for one seed; ' (mean of N seeds: a b)' for more."""
        if len(self.runs) == 1:
            return ""
        return " (mean of %d seeds: %s)" % (len(self.runs), " ".join(
            "div@%d" % r.steps_done if r.diverged else "%.4f" % r.heldout for r in self.runs))


def widths_of(opt):
    return sorted({k[1] for k in runs if k[0] == opt})


def seeds_of(opt):
    return sorted({k[3] for k in runs if k[0] == opt})


def of_width(opt, w):
    """The runs of one optimizer and width, by learning rate then seed."""
    return [runs[k] for k in sorted(k for k in runs if k[:2] == (opt, w))]


def cells_of(opt, w):
    """The cells of one optimizer and width, by learning rate."""
    by_lr = {}
    for r in of_width(opt, w):
        by_lr.setdefault(r.lr, []).append(r)
    return [Cell(by_lr[lr]) for lr in sorted(by_lr)]


def best_cell(opt, w):
    """The cell of lowest finite mean held-out loss, or None when every rate diverged."""
    done = [c for c in cells_of(opt, w) if not c.diverged]
    return min(done, key=lambda c: c.heldout) if done else None


for opt in optimizers:
    lrs = sorted({k[2] for k in runs if k[0] == opt})
    print("%s: widths %s; learning rates %s; seeds %s; %d runs, %d diverged" % (
        opt, ", ".join(map(str, widths_of(opt))), ", ".join("%g" % x for x in lrs),
        ", ".join(map(str, seeds_of(opt))),
        sum(1 for k in runs if k[0] == opt), sum(1 for k, r in runs.items() if k[0] == opt and r.diverged)))

# %% [markdown]
# ## The best learning rate per width
#
# `best OPTIMIZER width W lr X held-out L` (with more than one seed, L is the mean and the seeds'
# own losses follow; then `best OPTIMIZER width W seed S lr X held-out L`, each seed's own best,
# among the rates that seed ran); then `transfer OPTIMIZER: best lr at width Wmax / at width
# Wmin = R`: 1 when the best rate transfers across widths (on the grid swept).

# %%
for opt in optimizers:
    for w in widths_of(opt):
        b = best_cell(opt, w)
        if b is None:
            print("best %s width %d: every run diverged" % (opt, w))
        else:
            print("best %s width %d lr %g held-out %.4f%s" % (opt, w, b.lr, b.heldout, b.seeds_text()))
    if len(seeds_of(opt)) > 1:
        for w in widths_of(opt):
            for seed in seeds_of(opt):
                done = [r for r in of_width(opt, w) if r.seed == seed and not r.diverged]
                if done:
                    r = min(done, key=lambda r: r.heldout)
                    print("best %s width %d seed %d lr %g held-out %.4f" % (opt, w, seed, r.lr, r.heldout))
    ws = widths_of(opt)
    lo, hi = best_cell(opt, ws[0]), best_cell(opt, ws[-1])
    if len(ws) < 2:
        print("transfer %s: one width only" % opt)
    elif lo is None or hi is None:
        print("transfer %s: no best lr at width %d" % (opt, ws[0] if lo is None else ws[-1]))
    else:
        ratio = hi.lr / lo.lr
        print("transfer %s: best lr at width %d / at width %d = %g (%s)" % (
            opt, ws[-1], ws[0], ratio, "the same rate" if ratio == 1 else
            "moves %s with width" % ("up" if ratio > 1 else "down")))

# %%
fig, axes = plt.subplots(1, len(optimizers), figsize=(st.FIG_WIDTH_IN, 5.2), layout="constrained", squeeze=False)
fig.suptitle("Held-out loss at the end against the peak learning rate, one curve per width\n%s" %
             st.shared_title([r.trace().config for r in runs.values() if os.path.exists(r.trace_path)] or [{}],
                             vary=("width", "heads")), fontsize=11)
for ax, opt in zip(axes[0], optimizers):
    ws = widths_of(opt)
    colors = plt.get_cmap("plasma")(np.linspace(0.0, 0.8, len(ws)))
    several = len(seeds_of(opt)) > 1
    for color, w in zip(colors, ws):
        cells = cells_of(opt, w)
        done = [c for c in cells if not c.diverged]
        b = best_cell(opt, w)
        ax.plot([c.lr for c in done], [c.heldout for c in done], marker="o", ms=5, color=color, lw=1.6,
                label="width %d: best lr %s" % (w, "%g (%.3f)" % (b.lr, b.heldout) if b else "-"))
        if several:  # each seed's own loss, around the mean
            seen = [r for c in done for r in c.runs]
            ax.plot([r.lr for r in seen], [r.heldout for r in seen], marker=".", ms=4, color=color, alpha=0.6,
                    ls="none")
        if b:
            ax.plot(b.lr, b.heldout, marker="*", ms=16, color=color, mec="black", zorder=4, ls="none")
        for c in cells:
            if c.diverged:  # at the top edge: its loss is not a number
                ax.plot(c.lr, 0.96, marker="x", ms=10, mew=2.2, color=color, ls="none",
                        transform=ax.get_xaxis_transform(), zorder=4)
    ax.plot([], [], marker="*", ms=12, color="white", mec="black", ls="none", label="best lr of a width")
    if several:
        ax.plot([], [], marker=".", ms=6, color="0.3", ls="none",
                label="one seed's loss (curves: the mean of seeds %s)" % ", ".join(map(str, seeds_of(opt))))
    if any(r.diverged for k, r in runs.items() if k[0] == opt):
        ax.plot([], [], marker="x", ms=9, mew=2, color="0.3", ls="none", label="diverged (loss non-finite)")
    st.log_axis(ax, "x")
    st.log_axis(ax)
    ax.grid(alpha=0.3, which="both")
    ax.set_xlabel("peak learning rate", fontsize=9)
    ax.set_ylabel("held-out loss at the end (nats/token)", fontsize=9)
    ax.set_title(opt, fontsize=11)
    ax.legend(fontsize=8, loc="upper left")
st.save_figure(fig, "lr_transfer")

# %% [markdown]
# ## Early metrics against the final loss
#
# Per run, each kind's worst layer at an early step (`STAB_EARLY_STEP`, default 10% of the run's
# steps): the linear layers' forward and update stability, the attention logit bound and the LM
# head's forward bound (nats), next to how the run ended; last, `max x init`: the largest ratio
# to init over every layer and metric at that step (the update's per unit of learning rate),
# what `harness/train --alarm X` compares with X, and the kind of the layer it is in.
# `early OPT W LR SEED ...` lines; then per width the Spearman rank correlation of each early
# metric with the final loss (a diverged run ranked worst): near +1, the early metric orders the
# runs as their outcome does (over a grid on both sides of the best rate the relation is
# U-shaped, too small a rate as bad as too large: read the table).

# %%
EARLY_COLUMNS = (("linear", "forward", "linear fwd"), ("linear", "update", "linear upd"),
                 ("attention", "forward", "attn bound"), ("lm_head", "forward", "lm_head fwd"))


def early_step(r):
    return int(EARLY) if EARLY is not None else max(1, int(round(0.1 * r.trace().config.get("steps", r.steps_done))))


def value_at(tr, kind, metric, step):
    """The kind's worst layer's value at `step`; NaN when the trace lacks the step or the kind."""
    rows = np.flatnonzero(tr.steps == step)
    if not len(rows) or not tr.of_kind(kind):
        return math.nan
    return float(st.kind_value(tr.of_kind(kind), metric, len(tr), "max")[rows[0]])


def max_ratio_at(tr, step):
    """The largest ratio to init at `step` over every layer and metric (stabtrace.ratio, the
    update per unit of learning rate), with the kind of its layer: (NaN, '-') when none."""
    rows = np.flatnonzero(tr.steps == step)
    best = (math.nan, "-")
    if not len(rows):
        return best
    for l in tr.layers:
        for metric in st.METRICS:
            v = st.ratio(l, metric, len(tr), tr.scalars.get("lr"))[rows[0]]
            if math.isfinite(v) and not v <= best[0]:
                best = (float(v), l.kind)
    return best


def ranks(x):
    return np.argsort(np.argsort(np.asarray(x, dtype=np.float64), kind="stable"), kind="stable").astype(float)


early = {}
for opt in optimizers:
    print("early %-9s %6s %8s %4s %-9s %6s %10s %6s %s %10s %s" % (
        "optimizer", "width", "lr", "seed", "status", "steps", "held-out", "step",
        " ".join("%12s" % c[2] for c in EARLY_COLUMNS), "max x init", "in"))
    for w in widths_of(opt):
        for r in of_width(opt, w):
            s = early_step(r)
            vals = [value_at(r.trace(), kind, metric, s) for kind, metric, _ in EARLY_COLUMNS]
            early[opt, w, r.lr, r.seed] = (s, vals)
            most, where = max_ratio_at(r.trace(), s)
            print("early %-9s %6d %8g %4d %-9s %6d %10.4f %6d %s %10.4g %s" % (
                opt, w, r.lr, r.seed, r.status, r.steps_done, r.heldout, s, " ".join("%12.4g" % v for v in vals),
                most, where))
    for w in widths_of(opt):
        rs = [r for r in of_width(opt, w)]
        outcome = [math.inf if r.diverged else r.heldout for r in rs]
        words = []
        for j, (_, _, name) in enumerate(EARLY_COLUMNS):
            pairs = [(early[opt, w, r.lr, r.seed][1][j], o) for r, o in zip(rs, outcome)
                     if math.isfinite(early[opt, w, r.lr, r.seed][1][j])]
            if len(pairs) < 3:
                words.append("%s -" % name)
                continue
            a, b = ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs])
            rho = float(np.corrcoef(a, b)[0, 1]) if a.std() and b.std() else math.nan
            words.append("%s %+.2f" % (name, rho))
        print("spearman %s width %d (early metric against final loss, %d runs): %s" % (opt, w, len(rs), "; ".join(words)))

# %% [markdown]
# ## The metrics over steps at the best and the worst learning rate, largest width
#
# Per optimizer two rows: the best rate's run and the worst one's (a diverged run when there is
# one: the smallest rate that diverged, a red line where its loss turned non-finite; else the
# worst of the rates above the best, the side where runs diverge; else the worst of all), each
# the smallest seed's run of its rate (the best and the worst by the seeds' mean). Columns:
# forward stability (each kind's worst layer; the attention bound has its own column), update
# stability, the attention logit bound. Each column shares its vertical scale across the two
# rows, so the runs compare directly.

# %%
def worst_run(opt, w):
    cells = cells_of(opt, w)
    diverged = [c for c in cells if c.diverged]
    if diverged:
        return next(r for r in diverged[0].runs if r.diverged)
    b = best_cell(opt, w)
    above = [c for c in cells if b and c.lr > b.lr]
    if above or len(cells) > 1:
        return max(above or cells, key=lambda c: c.heldout).first
    return None


# (metric, kinds drawn, axis label with unit)
PANELS = (("forward", [k for k in st.KINDS if k != "attention"], "forward stability\n(%s)" % st.METRIC_UNIT),
          ("update", list(st.KINDS), "update stability\n(%s)" % st.METRIC_UNIT),
          ("forward", ["attention"], "attention logit bound\n(a logit)"))
pairs = []
for opt in optimizers:
    w = widths_of(opt)[-1]
    b, worst = best_cell(opt, w), worst_run(opt, w)
    b = b and b.first
    if b is None or worst is None or worst is b:
        print("%s width %d: no best and worst run to compare" % (opt, w))
        continue
    pairs.append((opt, w, [("best", b), ("diverged" if worst.diverged else "worst", worst)]))
    print("%s width %d: best lr %g against %s lr %g" % (opt, w, b.lr, "diverged" if worst.diverged else "worst",
                                                         worst.lr))

if pairs:
    heights = []
    for _ in pairs:
        heights += [2.6, 2.6, st.legend_height(-(-(len(st.KINDS) + 1) // 3))]
    fig = plt.figure(figsize=(st.FIG_WIDTH_IN, 0.7 + sum(heights)), layout="constrained")
    grid = fig.add_gridspec(len(heights), 3, height_ratios=heights)
    fig.suptitle("Stability over steps at the best and the worst learning rate, largest width "
                 "(values, each kind's worst layer)", fontsize=11)
    for p, (opt, w, which) in enumerate(pairs):
        for c, (metric, kinds, what) in enumerate(PANELS):
            col_axes = []
            for j, (word, r) in enumerate(which):
                ax = fig.add_subplot(grid[3 * p + j, c], sharex=col_axes[0] if col_axes else None,
                                     sharey=col_axes[0] if col_axes else None)
                col_axes.append(ax)
                tr = r.trace()
                for kind in kinds:
                    if tr.of_kind(kind):
                        v = st.positive(st.kind_value(tr.of_kind(kind), metric, len(tr), "max"))
                        if st.defined(v):
                            ax.plot(tr.steps, v, color=st.KIND_COLORS.get(kind), lw=1.5,
                                    marker=st.KIND_MARKERS.get(kind), ms=3, label=kind)
                if r.diverged:
                    ax.axvline(r.steps_done + 0.5, color="red", lw=1.2, ls="--",
                               label="loss non-finite after step %d" % r.steps_done)
                st.log_axis(ax)
                ax.grid(alpha=0.3, which="both")
                ax.set_xlabel("optimizer step", fontsize=9)
                ax.set_ylabel(what, fontsize=8)
                ax.set_title("%s, width %d, lr %g (%s)" % (
                    opt, w, r.lr, "diverged after step %d" % r.steps_done if r.diverged
                    else "%s: held-out %.3f" % (word, r.heldout)), fontsize=9)
            handles, labels = {}, {}
            for ax in col_axes:
                for h, l in zip(*ax.get_legend_handles_labels()):
                    handles.setdefault(l, h)
            st.legend_below(fig, grid[3 * p + 2, c], list(handles.values()), list(handles.keys()),
                            ncol=min(3, max(1, len(handles))))
    st.save_figure(fig, "lr_transfer_metrics")
