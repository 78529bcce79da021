# %% [markdown]
# # Checkpoints side by side
#
# The probe's per-layer metrics (docs/manual/metrics.md, "The probe's JSON report") for a series of
# checkpoints, or two:
# `harness/probe --json` runs on each checkpoint, with `--prev` the one before it so that the
# update stability is the change between consecutive checkpoints (the first has none). Reports
# already written by `probe --json` can be given instead of checkpoints.
#
# Inputs: `STAB_CHECKPOINTS` (or the arguments): safetensors or llm.c checkpoints, `.json`
# reports, or directories (a run directory stands for its `step-*.safetensors` and
# `model.safetensors`); ordered by training step (safetensors metadata `steps`, else a
# `step-N` file name). Default: `runs/demo`. `STAB_PROBE`: the probe program (default
# `./harness/probe`, else `stabmeter-probe`). `STAB_OUT`: the figure directory.

# %%
import os
import re
import sys

import numpy as np

import stabtrace as st

plt = st.pyplot()

if not st.in_kernel() and len(sys.argv) > 1:
    ITEMS = sys.argv[1:]
else:
    default = os.path.dirname(st.setting("STAB_TRACE", "runs/demo/trace.h5")) or "."
    ITEMS = re.split(r"[\s,]+", st.setting("STAB_CHECKPOINTS", default).strip())

ckpts = st.checkpoint_list(ITEMS)
reports, prev = [], None
for path, step in ckpts:
    report = st.probe_report(path, prev=prev)
    prev = None if path.endswith(".json") else path
    reports.append(report)
    print("step %-8s %s: %d layers%s" % (step if step is not None else "?", path, len(report["layers"]),
                                        " (update against %s)" % report["reference"] if report.get("reference") else ""))
    for e in report.get("errors", []):
        print("  not measured: %s: %s" % (e.get("name"), e.get("message")))

# x positions: training steps when every checkpoint has one, else the order given.
have_steps = all(s is not None for _, s in ckpts)
xs = [s for _, s in ckpts] if have_steps else list(range(1, len(ckpts) + 1))
xlabel = "checkpoint step" if have_steps else "checkpoint (order given)"
col_names = ["step %d" % x for x in xs] if have_steps else ["#%d" % x for x in xs]

# One row per (name, kind): a tied embedding is reported twice, as embedding and as lm_head.
order = {k: i for i, k in enumerate(st.KINDS)}
keys = []
values = {}  # (name, kind, metric) -> [value or NaN per checkpoint]
for c, report in enumerate(reports):
    for layer in report["layers"]:
        key = (layer["name"], layer["kind"])
        if key not in keys:
            keys.append(key)
        for metric in st.METRICS:
            v = layer.get(metric)
            values.setdefault(key + (metric,), [np.nan] * len(reports))[c] = np.nan if v is None else float(v)
keys.sort(key=lambda k: (order.get(k[1], len(st.KINDS)), st.natural_key(k[0])))
names = {}
for name, kind in keys:
    twice = sum(1 for n, _ in keys if n == name) > 1
    names[name, kind] = "%s [%s]" % (name, kind) if twice else name


def series(key, metric):
    return np.array(values.get(key + (metric,), [np.nan] * len(reports)))


first = reports[0]
if len(reports) > 1:
    title = "%d checkpoints, %s .. %s" % (len(reports), col_names[0], col_names[-1])
else:
    title = "1 checkpoint, %s" % col_names[0]
title += " · " + os.path.dirname(os.path.abspath(first.get("checkpoint") or ckpts[0][0]))
print(title)

# %% [markdown]
# ## The metrics side by side (rows: layers; columns: checkpoints)

# %%
for metric in st.METRICS:
    print("\n%s stability" % metric)
    print("%-44s %-10s" % ("layer", "kind") + "".join("%13s" % c for c in col_names))
    for key in keys:
        v = series(key, metric)
        if not np.isfinite(v).any():
            continue
        print("%-44s %-10s" % (names[key], key[1]) + "".join("%13s" % ("-" if not np.isfinite(x) else "%.4g" % x)
                                                             for x in v))

# %% [markdown]
# ## Every layer against the checkpoint step
#
# One line per layer, coloured by kind; in each panel the layer with the largest value at the
# last checkpoint is drawn thick and named.

# %%
kinds = [k for k in st.KINDS if any(kk == k for _, kk in keys)]
kinds += sorted({kk for _, kk in keys} - set(kinds))
fig = plt.figure(figsize=(st.FIG_WIDTH_IN, 5.6), layout="constrained")
grid = fig.add_gridspec(3, 3, height_ratios=[3.6, st.legend_height(1), st.legend_height(1)])
fig.suptitle("Probe metrics per layer against checkpoint\n" + title, fontsize=11)
kind_handles = {}
for col, metric in enumerate(st.METRICS):
    ax = fig.add_subplot(grid[0, col])
    worst = None
    for key in keys:
        v = series(key, metric)
        if not np.isfinite(v).any():
            continue
        kind = key[1]
        line, = ax.plot(xs, st.positive(v), color=st.KIND_COLORS.get(kind, "0.3"),
                        marker=st.KIND_MARKERS.get(kind, "o"), ms=4, lw=1, alpha=0.75)
        kind_handles.setdefault(kind, line)
        last = v[np.isfinite(v)][-1]
        if worst is None or last > worst[1]:
            worst = (key, last)
    ax.set_title(metric + " stability", fontsize=11)
    if worst is None:
        ax.text(0.5, 0.5, "no layer has %s stability%s" % (
                    metric, "\n(it needs two checkpoints)" if metric == "update" else ""),
                ha="center", va="center", transform=ax.transAxes, color="0.4", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        st.legend_below(fig, grid[1, col], [], [])
        continue
    line, = ax.plot(xs, st.positive(series(worst[0], metric)), color="black", lw=2.4, zorder=0)
    st.log_axis(ax)
    ax.set_xticks(xs)
    ax.grid(alpha=0.3, which="both")
    ax.set_xlabel(xlabel + (" (update: since the previous one)" if metric == "update" else ""), fontsize=9)
    ax.set_ylabel("%s (%s)" % (metric, st.METRIC_UNIT), fontsize=9)
    st.legend_below(fig, grid[1, col], [line], ["largest at the last: %s (%.3g)" % (names[worst[0]], worst[1])])
kinds_shown = [k for k in kinds if k in kind_handles]
st.legend_below(fig, grid[2, :], [kind_handles[k] for k in kinds_shown],
                ["%s layers" % k for k in kinds_shown], ncol=len(kinds_shown))
st.save_figure(fig, "checkpoints")

# %% [markdown]
# ## Each layer at each checkpoint
#
# Rows: layers (input to output, by kind); one marker per checkpoint, so a layer whose
# markers spread apart changed between checkpoints.

# %%
legend_rows = -(-len(reports) // 8)
heights = [1.0 + 0.19 * len(keys), st.legend_height(legend_rows + 1)]
fig = plt.figure(figsize=(st.FIG_WIDTH_IN, 0.7 + sum(heights)), layout="constrained")
fig.suptitle("Per-layer metrics at each checkpoint\n" + title, fontsize=11)
grid = fig.add_gridspec(2, 3, height_ratios=heights)
axes = [fig.add_subplot(grid[0, 0])]
axes += [fig.add_subplot(grid[0, c], sharey=axes[0]) for c in (1, 2)]
cmap = plt.get_cmap("viridis")
colors = [cmap(0.1 + 0.75 * i / max(1, len(reports) - 1)) for i in range(len(reports))]
y = np.arange(len(keys))
for col, (ax, metric) in enumerate(zip(axes, st.METRICS)):
    for c in range(len(reports)):
        v = np.array([series(key, metric)[c] for key in keys])
        ax.plot(st.positive(v), y, ls="none", marker="o" if c < len(reports) - 1 else "D", ms=5,
                color=colors[c], label=col_names[c], mfc="none" if c < len(reports) - 1 else colors[c])
    ax.set_yticks(y)
    ax.set_yticklabels([names[k] for k in keys], fontsize=7)
    ax.set_ylim(len(keys) - 0.5, -0.5)
    if np.isfinite([series(k, metric) for k in keys]).any():
        st.log_axis(ax, "x")
    else:
        ax.text(0.5, 0.5, "no values%s" % ("\n(update needs two checkpoints)" if metric == "update" else ""),
                transform=ax.transAxes, ha="center", va="center", color="0.4")
        ax.set_xticks([])
    ax.grid(alpha=0.3, which="both", axis="x")
    ax.set_title(metric + " stability", fontsize=11)
    ax.set_xlabel("%s (%s)" % (metric, st.METRIC_UNIT), fontsize=9)
    # Kind bands: a thin rule between kinds.
    for i in range(1, len(keys)):
        if keys[i][1] != keys[i - 1][1]:
            ax.axhline(i - 0.5, color="0.5", lw=0.8)
    for tick, key in zip(ax.get_yticklabels(), keys):
        tick.set_color(st.KIND_COLORS.get(key[1], "black"))
    if col:
        ax.tick_params(axis="y", labelleft=False)
lax = st.legend_below(fig, grid[1, :], *axes[0].get_legend_handles_labels(), ncol=min(8, len(reports)))
lax.get_legend().set_title("checkpoint (filled: the last)", prop={"size": 9})
st.save_figure(fig, "checkpoints_layers")
