# %% [markdown]
# # Coordinate check: each metric against width at the first steps and at the end
#
# The view muP users know: for every layer kind and metric, the value against the model's width
# on log-log axes, one line per training step — steps 1, 2, 3, 4 and the last step. In a
# width-independent parametrisation every line is flat (slope ≈ 0): the first updates move
# every layer by the same amount at every width. A line whose slope grows with the step is a
# width-dependence the training builds up; one already steep at step 1 is the initialisation's.
#
# Each point is one trace at one step: the **geometric mean over the kind's layers** of the
# metric's value (the values themselves, not ratios to init: at step 1 a ratio is 1 by
# definition), or with `STAB_COORD_STAT=max` the kind's **worst layer** (the largest value).
# Runs made with `--metrics-every 1` have every step; a step some width's trace lacks is left
# out of that optimizer's figure, and the notebook says which.
#
# Inputs: `STAB_SWEEP` (or the arguments): sweep directories, one per optimizer, each holding
# `width-W/trace.h5` (`harness/train --sweep-widths W1,W2,... --out DIR`; default
# `runs/sweep-steepest runs/sweep-adamw`); `STAB_COORD_STEPS` (default `1,2,3,4`; the last step
# is always added); `STAB_COORD_STAT` (`gmean` or `max`); `STAB_OUT`: the figure directory.

# %%
import re
import sys

import numpy as np

import stabtrace as st

plt = st.pyplot()

if not st.in_kernel() and len(sys.argv) > 1:
    SWEEP = sys.argv[1:]
else:
    SWEEP = re.split(r"[\s,:]+", st.setting("STAB_SWEEP", "runs/sweep-steepest runs/sweep-adamw").strip())
STAT = st.setting("STAB_COORD_STAT", "gmean")
if STAT not in ("gmean", "max"):
    raise st.InputError("STAB_COORD_STAT=%r: gmean (the kind's geometric mean) or max (its worst layer)" % STAT)
try:
    STEPS = [int(s) for s in re.split(r"[\s,]+", st.setting("STAB_COORD_STEPS", "1,2,3,4").strip())]
except ValueError:
    raise st.InputError("STAB_COORD_STEPS=%r: not a list of step numbers" % st.setting("STAB_COORD_STEPS", "")) from None
STAT_WORDS = {"gmean": "geometric mean over the kind's layers", "max": "the kind's worst layer (largest value)"}

runs = st.read_sweep(SWEEP, metrics=st.METRICS)  # (optimizer, width) -> trace
optimizers = st.optimizer_order(o for o, _ in runs)
widths_of = {opt: sorted(w for o, w in runs if o == opt) for opt in optimizers}
title = st.shared_title([tr.config for _, tr in sorted(runs.items())],
                        extra="; %s" % STAT_WORDS[STAT])
print(title)

# The lines of each optimizer's figure: (label, {width: row}); a step any width lacks is left out.
lines = {}
for opt in optimizers:
    lines[opt] = []
    for s in STEPS:
        rows = {w: np.flatnonzero(runs[opt, w].steps == s) for w in widths_of[opt]}
        missing = [w for w in widths_of[opt] if not len(rows[w])]
        if missing:
            print("%s: step %d left out: not measured in %s" % (
                opt, s, ", ".join(runs[opt, w].path for w in missing)))
            continue
        lines[opt].append(("step %d" % s, {w: int(r[0]) for w, r in rows.items()}))
    last = {w: len(runs[opt, w]) - 1 for w in widths_of[opt]}
    lines[opt].append(("last", last))
    ends = sorted({int(runs[opt, w].steps[i]) for w, i in last.items()})
    print("%s: widths %s; last step %s" % (
        opt, ", ".join(map(str, widths_of[opt])), ends[0] if len(ends) == 1 else
        "differs: " + ", ".join("%d: %d" % (w, runs[opt, w].steps[i]) for w, i in last.items())))

# %% [markdown]
# ## The values and each line's slope
#
# `coord OPTIMIZER KIND METRIC STEP slope S (width: value, ...)`; S is the least-squares slope of
# log(value) against log(width): 0 is width-independent, +0.5 grows like √width.

# %%
points = {}  # (optimizer, kind, metric, label) -> {width: value}
slopes = {}
for opt in optimizers:
    kinds = [k for k in st.KINDS if any(runs[opt, w].of_kind(k) for w in widths_of[opt])]
    for kind in kinds:
        for metric in st.METRICS:
            for label, rows in lines[opt]:
                pts = {}
                for w, i in rows.items():
                    tr = runs[opt, w]
                    if tr.of_kind(kind):
                        v = st.kind_value(tr.of_kind(kind), metric, len(tr), STAT)[i]
                        if np.isfinite(v):
                            pts[w] = float(v)
                if not pts:
                    continue  # a metric this kind lacks (docs/manual/metrics.md)
                ws = sorted(pts)
                key = (opt, kind, metric, label)
                points[key] = pts
                slopes[key] = st.loglog_slope(ws, [pts[w] for w in ws])
                print("coord %-9s %-10s %-10s %-7s slope %+.4f  (%s)" % (
                    opt, kind, metric, label.replace("step ", ""), round(slopes[key], 4) + 0.0,
                    ", ".join("%d: %.4g" % (w, pts[w]) for w in ws)))

# %% [markdown]
# ## Each metric against width, a line per step
#
# A figure per optimizer; rows: layer kinds, columns: forward, dependency, update stability.

# %%
step_colors = plt.get_cmap("viridis")(np.linspace(0, 0.85, max(1, len(STEPS))))
for opt in optimizers:
    kinds = [k for k in st.KINDS if any(key[:2] == (opt, k) for key in points)]
    widths = widths_of[opt]
    heights = []
    for kind in kinds:
        heights += [2.6, st.legend_height(len(lines[opt]))]
    fig = plt.figure(figsize=(st.FIG_WIDTH_IN, 0.7 + sum(heights)), layout="constrained")
    grid = fig.add_gridspec(len(heights), 3, height_ratios=heights)
    fig.suptitle("Coordinate check, %s: each metric against width at steps %s and the last (each point: %s)\n%s"
                 % (opt, ", ".join(l.replace("step ", "") for l, _ in lines[opt][:-1]) or "-",
                    STAT_WORDS[STAT], title), fontsize=11)
    for r, kind in enumerate(kinds):
        for c, metric in enumerate(st.METRICS):
            ax = fig.add_subplot(grid[2 * r, c])
            if r == 0:
                ax.set_title(metric + " stability", fontsize=11)
            drawn = [(label, points[opt, kind, metric, label]) for label, _ in lines[opt]
                     if (opt, kind, metric, label) in points]
            if not drawn:
                st.undefined_panel(ax, kind, metric)
                st.legend_below(fig, grid[2 * r + 1, c], [], [])
                continue
            for j, (label, pts) in enumerate(drawn):
                ws = sorted(pts)
                last = label == "last"
                ax.plot(ws, st.positive([pts[w] for w in ws]), marker="o", ms=5,
                        color="black" if last else step_colors[STEPS.index(int(label.split()[1]))],
                        lw=2.0 if last else 1.3, ls="--" if last else "-",
                        label="%s: slope %+.2f" % (label, round(slopes[opt, kind, metric, label], 2) + 0.0))
            st.width_axes(ax, widths)
            ax.set_ylabel("%s\n%s (%s)" % (kind, metric, st.unit(kind, metric)), fontsize=9)
            st.legend_below(fig, grid[2 * r + 1, c], *ax.get_legend_handles_labels())
    st.save_figure(fig, "coord_check_" + opt)
