# %% [markdown]
# # One training run, layer by layer
#
# Every layer's forward, dependency and update stability (docs/manual/metrics.md) at every measured step of one
# stabmeter trace, under the training loss: first every layer's **ratio to init** (its value over
# its value at the first measured step, so 1 is where it started whatever its kind's natural
# scale), then one row of panels per layer kind with the values themselves, on log axes.
# Layers are ranked **within their kind** (an attention bound of 20 and an LM head of 8 nats
# are their kinds' healthy values, not the worst layers): in each kind's panels the three
# layers that reached the largest value are drawn in colour and named below it, the others
# grey; in the ratio panels each kind's largest ratio is drawn bold. Red bands mark steps where
# the loss or a layer went non-finite; crosses mark a layer's flags; with an alarm threshold
# (`STAB_ALARM=X`, a ratio to init, as `harness/train --alarm X`) a dashed line shows it in the
# ratio panels and a triangle marks each layer's first crossing. The update's ratio is per unit
# of learning rate (update / lr over its value at init), as the alarm takes it, so that the
# schedule's warmup and decay alone leave it at 1.
#
# Inputs: `STAB_TRACE` (or the first argument; default `runs/demo/trace.h5`), `STAB_ALARM`
# (optional), `STAB_OUT` (figure directory, default `notebooks-out/`).
# Run as a script: `python3 notebooks-export/trace.py runs/demo/trace.h5`.

# %%
import matplotlib.ticker
import numpy as np

import stabtrace as st

plt = st.pyplot()

TRACE = st.setting("STAB_TRACE", "runs/demo/trace.h5", position=1)
tr = st.read_trace(TRACE, metrics=st.METRICS + st.RATIOS + ("flags",))  # not every extra: traces can be long
n = len(tr)
if n == 0:
    raise st.InputError("trace %s has no measured steps yet" % TRACE)
title = st.run_title(tr.config, TRACE)
print(title)
print("%d measured steps (%d..%d), %d layers: %s" % (
    n, tr.steps[0], tr.steps[-1], len(tr.layers),
    ", ".join("%d %s" % (len(tr.of_kind(k)), k) for k in tr.kinds())))

# %% [markdown]
# ## What to look at first: NaN steps, flags, alarms, and the worst layers

# %%
bad_rows = st.nan_steps(tr)
flags = st.flag_events(tr)
threshold = st.alarm_threshold(tr)
alarms = st.alarm_events(tr, threshold)

if len(bad_rows):
    print("NaN steps (%d): %s%s" % (len(bad_rows), ", ".join(str(tr.steps[i]) for i in bad_rows[:20]),
                                    " ..." if len(bad_rows) > 20 else ""))
else:
    print("NaN steps: none")
if flags:
    by_layer = {}
    for layer, i, bits in flags:
        by_layer.setdefault((layer.name, st.flag_text(bits)), []).append(tr.steps[i])
    for (name, what), steps in by_layer.items():
        print("flag: %s: %s at %d step(s), first %d" % (name, what, len(steps), steps[0]))
else:
    print("flags: none")
if threshold is None:
    print("alarms: no threshold (set STAB_ALARM=X to mark a metric above X times its value at init)")
elif alarms:
    for layer, i, metric, value in alarms:
        print("alarm: %s (%s) %s ratio to init %.4g > %g first at step %d" % (
            layer.name, layer.kind, metric, value, threshold, tr.steps[i]))
else:
    print("alarms: no layer above %g times its value at init" % threshold)

# Where each layer's ratio to init comes from: the trace's own datasets, or its rows.
have = sum(all(r in l.series for r in st.RATIOS) for l in tr.layers)
print("ratio to init: %s" % ("the trace's forward_ratio, dependency_ratio, update_ratio" if have == len(tr.layers)
                             else "computed from the first measured row where each metric is finite and > 0"
                             if have == 0 else "the trace's datasets for %d layers, computed for %d" % (
                                 have, len(tr.layers) - have)))


lr = tr.scalars.get("lr")  # the update's ratio to init is per unit of learning rate when the trace has it


def print_worst(header, of_ratio):
    print()
    print(header)
    print("%-10s %-10s %-4s %-40s %12s %8s %12s" % ("metric", "kind", "rank", "layer", "max", "at step", "last"))
    for metric in st.METRICS:
        for kind in tr.kinds():
            for rank, (layer, value, i) in enumerate(st.worst_layers(tr.of_kind(kind), metric, n, 3, of_ratio, lr), 1):
                last = (st.ratio(layer, metric, n, lr) if of_ratio else layer.get(metric, n))[-1]
                print("%-10s %-10s %-4d %-40s %12.4g %8d %12.4g" % (metric, kind, rank, layer.name, value,
                                                                    tr.steps[i], last))


print_worst("The worst layers of each kind by value (kinds' natural scales differ: compare within a kind):", False)
print_worst("The worst layers of each kind by ratio to init (value over its value at the first measured step%s):"
            % ("; update per unit of learning rate" if lr is not None else ""), True)

# %% [markdown]
# ## Every layer over the run
#
# Under the loss, a row of ratios to init: every layer's metric over its value at the first
# measured step (1 = where it started), in its kind's colour, each kind's largest drawn bold and
# named. Then a row per layer kind present, a column per stability, the values themselves. A
# well-parametrised model keeps each of them Θ(1) (docs/manual/metrics.md); the update stability
# follows the learning-rate schedule.

# %%
kinds = tr.kinds()
highlight = ["tab:red", "tab:blue", "tab:green"]


def legend_entries(kind):
    """The most legend lines any panel of this kind's row will have."""
    layers = tr.of_kind(kind)
    lines = min(3, len(layers)) + (len(layers) > 3) + any(l.kind == kind for l, _, _ in flags)
    return lines + bool(len(bad_rows))


def ratio_legend_entries():
    return len(kinds) + 2 + bool(len(bad_rows)) + (threshold is not None) + bool(alarms)


def plot_flags(ax, kind, values_at):
    """Crosses at a kind's flagged steps: on the series, at the top edge where it is NaN."""
    top = ax.get_xaxis_transform()
    for l, i, bits in flags:
        if l.kind != kind:
            continue
        v = values_at(l)[i]
        if np.isfinite(v) and v > 0:
            ax.plot(x[i], v, "kx", ms=7, mew=1.5, zorder=4)
        else:
            ax.plot(x[i], 0.95, "kx", ms=7, mew=1.5, transform=top, zorder=4)
    if any(l.kind == kind for l, _, _ in flags):
        ax.plot([], [], "kx", ms=7, mew=1.5, label="flagged step (see table)")


# A row of panels and, under it, a row holding their legends (heights in inches): the loss, the
# ratios to init, then one per kind.
heights = [2.2, 2.8, st.legend_height(ratio_legend_entries())]
for kind in kinds:
    heights += [2.6, st.legend_height(legend_entries(kind))]
fig = plt.figure(figsize=(st.FIG_WIDTH_IN, 0.6 + sum(heights)), layout="constrained")
grid = fig.add_gridspec(len(heights), 3, height_ratios=heights)
fig.suptitle("Stability of every layer over steps\n" + title, fontsize=11)
x = tr.steps

# The loss, with the learning rate on a second axis.
ax = fig.add_subplot(grid[0, :])
if "loss" in tr.scalars:
    ax.plot(x, tr.scalars["loss"], color="black", lw=1.2, label="training loss")
ax.set_ylabel("loss (nats/token)")
ax.set_xlabel("optimizer step")
ax.grid(alpha=0.3)
st.mark_rows(ax, x, bad_rows, label="NaN step")
handles, labels = ax.get_legend_handles_labels()
if "lr" in tr.scalars:
    ax2 = ax.twinx()
    ax2.plot(x, tr.scalars["lr"], color="tab:gray", lw=1, ls="--", label="learning rate")
    ax2.set_ylabel("learning rate")
    ax2.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
    h2, l2 = ax2.get_legend_handles_labels()
    handles, labels = handles + h2, labels + l2
ax.legend(handles, labels, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(labels), fontsize=9,
          frameon=False, borderaxespad=0.2)

# Ratios to init: every kind on one axis, since 1 is every layer's start.
for col, metric in enumerate(st.METRICS):
    ax = fig.add_subplot(grid[1, col])
    per_lr = metric == "update" and lr is not None
    ax.set_title(metric + " stability%s: ratio to init" % (" per unit of lr" if per_lr else ""), fontsize=11)
    drawn = False
    for kind in kinds:
        layers = tr.of_kind(kind)
        worst = st.worst_layers(layers, metric, n, 1, of_ratio=True, lr=lr)
        if not worst:
            continue
        drawn = True
        color = st.KIND_COLORS.get(kind, "black")
        for l in layers:
            if l is not worst[0][0]:
                ax.plot(x, st.positive(st.ratio(l, metric, n, lr)), color=color, lw=0.7, alpha=0.45)
        l, value, i = worst[0]
        ax.plot(x, st.positive(st.ratio(l, metric, n, lr)), color=color, lw=1.8, zorder=3,
                label="%s: %s  (max %.3g)" % (kind, l.name, value))
    if not drawn:
        st.undefined_panel(ax, "any", metric)
        st.legend_below(fig, grid[2, col], [], [])
        continue
    ax.plot([], [], color="0.5", lw=0.7, alpha=0.6, label="thin: the kind's other layers")
    ax.axhline(1.0, color="black", lw=0.8, ls=":", label="1 = the value at the first measured step")
    if threshold is not None:
        ax.axhline(threshold, color="red", ls="--", lw=1, label="alarm threshold %g x init" % threshold)
        for l, i, m, value in alarms:
            if m == metric:
                ax.plot(x[i], value, marker="v", color="red", ms=8, ls="none", zorder=4)
        if any(m == metric for _, _, m, _ in alarms):
            ax.plot([], [], marker="v", color="red", ms=8, ls="none", label="first alarm of a layer")
    st.mark_rows(ax, x, bad_rows, label="NaN step" if len(bad_rows) else None)
    st.log_axis(ax)
    ax.grid(alpha=0.3, which="both")
    ax.set_xlabel("optimizer step", fontsize=9)
    ax.set_ylabel("%s%s / its value at init (1)" % (metric, " per unit of lr" if per_lr else ""), fontsize=9)
    st.legend_below(fig, grid[2, col], *ax.get_legend_handles_labels())

for k, kind in enumerate(kinds):
    layers = tr.of_kind(kind)
    row = 3 + 2 * k
    for col, metric in enumerate(st.METRICS):
        ax = fig.add_subplot(grid[row, col])
        if k == 0:
            ax.set_title(metric + " stability", fontsize=11)
        if not any(st.defined(l.get(metric, n)) for l in layers):
            st.undefined_panel(ax, kind, metric)
            if col == 0:
                ax.set_ylabel("%s\n%s" % (kind, metric), fontsize=9)
            st.legend_below(fig, grid[row + 1, col], [], [])
            continue
        worst = st.worst_layers(layers, metric, n, 3)
        named = {l.name for l, _, _ in worst}
        for c, (l, value, i) in zip(highlight, worst):
            ax.plot(x, st.positive(l.get(metric, n)), color=c, lw=1.6, zorder=3,
                    label="%s  (max %.3g)" % (l.name, value))
        for l in layers:
            if l.name not in named:
                ax.plot(x, st.positive(l.get(metric, n)), color="0.6", lw=0.8, alpha=0.7)
        if len(layers) > len(worst):
            others = len(layers) - len(worst)
            ax.plot([], [], color="0.6", lw=0.8,
                    label="%d other %s layer%s" % (others, kind, "s" if others > 1 else ""))
        plot_flags(ax, kind, lambda l: l.get(metric, n))
        st.mark_rows(ax, x, bad_rows, label="NaN step" if len(bad_rows) else None)
        st.log_axis(ax)
        ax.grid(alpha=0.3, which="both")
        ax.set_xlabel("optimizer step", fontsize=9)
        ax.set_ylabel("%s\n%s (%s)" % (kind, metric, st.unit(kind, metric)), fontsize=9)
        st.legend_below(fig, grid[row + 1, col], *ax.get_legend_handles_labels())

st.save_figure(fig, "trace")
