# %% [markdown]
# # Coordinate check: stability against width
#
# The articles' claim is that with the right initialisation and steepest-descent updates every
# layer's forward, dependency and update stability stays Θ(1) as the model gets wider. This
# notebook puts each metric against width on log-log axes, one line per layer kind, for every
# optimizer swept: a line that stays flat (slope ≈ 0) is width-independent; a slope of ±0.5
# means the metric grows or shrinks like √width.
#
# Each point is one trace: for every layer, the median of the metric over the last 25% of the
# measured steps; then the largest of these over the layers of that kind (the worst layer).
# The slope in the legend is the least-squares fit of log(point) against log(width).
#
# Inputs: `STAB_SWEEP` (or the arguments): sweep directories, one per optimizer, each holding
# `width-W/trace.h5` for every width W, as `harness/train --width W --out DIR/width-W` writes;
# optimizer and width come from each trace's run_config (default
# `runs/sweep-steepest runs/sweep-adamw`). `STAB_OUT`: the figure directory.

# %%
import re
import sys

import numpy as np

import stabtrace as st

plt = st.pyplot()

TAIL = 0.25  # the fraction of the last steps whose median stands for a trace
if not st.in_kernel() and len(sys.argv) > 1:
    SWEEP = sys.argv[1:]
else:
    SWEEP = re.split(r"[\s,:]+", st.setting("STAB_SWEEP", "runs/sweep-steepest runs/sweep-adamw").strip())

points = {}  # (optimizer, kind, metric) -> {width: value}
runs = st.read_sweep(SWEEP, metrics=st.METRICS)  # (optimizer, width) -> trace
for (opt, width), tr in runs.items():
    for kind in tr.kinds():
        for metric in st.METRICS:
            vals = [st.tail_median(l.get(metric, len(tr)), TAIL) for l in tr.of_kind(kind)]
            vals = [v for v in vals if np.isfinite(v)]
            if vals:
                points.setdefault((opt, kind, metric), {})[width] = max(vals)

optimizers = st.optimizer_order(o for o, _ in runs)
widths = sorted({w for _, w in runs})
kinds = [k for k in st.KINDS if any(key[1] == k for key in points)]
for opt in optimizers:
    print("%s: widths %s" % (opt, ", ".join(str(w) for o, w in sorted(runs) if o == opt)))

# What the runs share (besides width and optimizer) names them in the title.
title = st.shared_title([tr.config for _, tr in sorted(runs.items())],
                        extra="; widths %s" % ", ".join(map(str, widths)))
print(title)

# %% [markdown]
# ## Fitted slopes
#
# `slope OPTIMIZER KIND METRIC VALUE`: d log(metric) / d log(width). Θ(1) means a slope near 0.

# %%
slopes = {}
for opt in optimizers:
    for kind in kinds:
        for metric in st.METRICS:
            pts = points.get((opt, kind, metric))
            if not pts:
                continue
            w = sorted(pts)
            slopes[opt, kind, metric] = st.loglog_slope(w, [pts[x] for x in w])
            print("slope %-9s %-10s %-10s %+.4f   (%s)" % (
                opt, kind, metric, round(slopes[opt, kind, metric], 4) + 0.0,  # + 0.0: no "-0.0000"
                ", ".join("%d: %.4g" % (x, pts[x]) for x in w)))

# %% [markdown]
# ## Each metric against width
#
# Columns: optimizers; rows: forward, dependency, update stability. Each row shares its
# vertical scale, so the optimizers compare directly.

# %%
heights = []
for metric in st.METRICS:
    heights += [3.0, st.legend_height(-(-len(kinds) // 3))]
fig = plt.figure(figsize=(st.FIG_WIDTH_IN, 0.7 + sum(heights)), layout="constrained")
grid = fig.add_gridspec(len(heights), len(optimizers), height_ratios=heights)
fig.suptitle("Coordinate check: stability against width, per layer kind (each point: the kind's worst "
             "layer, median of the last %d%% of steps)\n%s" % (round(100 * TAIL), title), fontsize=11)
for r, metric in enumerate(st.METRICS):
    row_axes = []
    for c, opt in enumerate(optimizers):
        ax = fig.add_subplot(grid[2 * r, c], sharey=row_axes[0] if row_axes else None)
        row_axes.append(ax)
        for kind in kinds:
            pts = points.get((opt, kind, metric))
            if not pts:
                continue
            w = sorted(pts)
            ax.plot(w, st.positive([pts[x] for x in w]), marker=st.KIND_MARKERS.get(kind, "o"),
                    color=st.KIND_COLORS.get(kind), lw=1.6, ms=7, mfc="none", mew=1.6,
                    label="%s: slope %+.2f" % (kind, round(slopes[opt, kind, metric], 2) + 0.0))
        st.width_axes(ax, widths)
        ax.set_ylabel("%s stability\n(%s)" % (metric, st.METRIC_UNIT), fontsize=9)
        ax.set_title("%s — %s stability" % (opt, metric), fontsize=11)
        handles, labels = ax.get_legend_handles_labels()
        if not handles:
            ax.text(0.5, 0.5, "no layer has %s stability" % metric, ha="center", va="center",
                    transform=ax.transAxes, color="0.4")
        st.legend_below(fig, grid[2 * r + 1, c], handles, labels, ncol=min(3, max(1, len(handles))))

st.save_figure(fig, "width_sweep")
