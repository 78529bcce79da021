# %% [markdown]
# # Following a run while it trains
#
# Opens a trace that `harness/train` is still writing (HDF5 SWMR: the writer flushes every
# measured step and a reader sees each one as it lands), refreshes it every `STAB_LIVE_EVERY`
# seconds and redraws: the loss, and per layer kind the largest forward, dependency and update
# stability over that kind's layers. It stops when the trace has not grown for
# `STAB_LIVE_IDLE` seconds (the run ended, or died) or after `STAB_LIVE_LIMIT` seconds, and
# saves the last picture. In Jupyter the figure updates in place; as a script or under
# `make notebooks` it is written once at the end.
#
# Inputs: `STAB_TRACE` (or the first argument; default `runs/demo/trace.h5`; the file may not
# exist yet: it is waited for), `STAB_LIVE_EVERY` (default 1 s), `STAB_LIVE_IDLE` (default
# 5 s), `STAB_LIVE_LIMIT` (default 600 s), `STAB_OUT` (figure directory).
# Try it: `./harness/train --out runs/live & python3 notebooks-export/live.py runs/live/trace.h5`.

# %%
import time

import matplotlib.figure
import numpy as np

import stabtrace as st

TRACE = st.setting("STAB_TRACE", "runs/demo/trace.h5", position=1)
EVERY = st.number_setting("STAB_LIVE_EVERY", 1.0)
IDLE = st.number_setting("STAB_LIVE_IDLE", 5.0)
LIMIT = st.number_setting("STAB_LIVE_LIMIT", 600.0)
for name, value in (("STAB_LIVE_EVERY", EVERY), ("STAB_LIVE_IDLE", IDLE), ("STAB_LIVE_LIMIT", LIMIT)):
    if not value > 0:
        raise st.InputError("%s=%g: must be a positive number of seconds" % (name, value))


def draw(fig, tr, status):
    """The whole picture from a snapshot of the trace."""
    fig.clear()
    grid = fig.add_gridspec(3, 3, height_ratios=[2.0, 3.0, st.legend_height(1)])
    fig.suptitle("Live: %s\n%s" % (status, st.run_title(tr.config, tr.path)), fontsize=11)
    x = tr.steps
    ax = fig.add_subplot(grid[0, :])
    if "loss" in tr.scalars:
        ax.plot(x, tr.scalars["loss"], color="black", lw=1.2)
    ax.set_ylabel("loss (nats/token)")
    ax.set_xlabel("optimizer step")
    ax.grid(alpha=0.3)
    bad = st.nan_steps(tr)
    st.mark_rows(ax, x, bad, label="NaN step")
    if len(bad):
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=9, frameon=False)
    handles = {}
    for col, metric in enumerate(st.METRICS):
        ax = fig.add_subplot(grid[1, col])
        for kind in tr.kinds():
            vals = np.array([l.get(metric, len(tr)) for l in tr.of_kind(kind)])
            if not np.isfinite(vals).any():
                continue
            # The largest over the kind's layers, step by step; NaN only where all are NaN.
            worst = np.nan_to_num(vals, nan=-np.inf).max(axis=0)
            line, = ax.plot(x, st.positive(worst), color=st.KIND_COLORS.get(kind, "0.3"), lw=1.4)
            handles.setdefault(kind, line)
        st.mark_rows(ax, x, bad)
        st.log_axis(ax)
        ax.grid(alpha=0.3, which="both")
        ax.set_title("%s stability, worst layer per kind" % metric, fontsize=10)
        ax.set_xlabel("optimizer step", fontsize=9)
        ax.set_ylabel("%s (%s)" % (metric, st.METRIC_UNIT), fontsize=9)
    kinds = [k for k in tr.kinds() if k in handles]
    st.legend_below(fig, grid[2, :], [handles[k] for k in kinds], ["%s layers" % k for k in kinds],
                    ncol=len(kinds))


# %% [markdown]
# ## Follow the trace

# %%
display_handle = None
if st.in_kernel():
    from IPython.display import Image, display

fig = matplotlib.figure.Figure(figsize=(st.FIG_WIDTH_IN, 6.5), layout="constrained")
live = st.LiveTrace(TRACE)
start = time.time()
if not live.open(start + LIMIT):
    raise st.InputError("trace %s: not there (or not a trace) after %g s" % (TRACE, LIMIT))
rows, grown_at, refreshes, seen, reason = -1, time.time(), 0, [], None
while reason is None:
    try:
        n = live.poll()
    except (OSError, KeyError) as e:  # a read racing the writer: try again next round
        print("refresh failed, retrying: %s" % e)
        n = rows
    now = time.time()
    if n != rows:
        rows, grown_at = n, now
        seen.append(n)
        if n > 0:
            tr = live.snapshot()
            draw(fig, tr, "following, %d steps so far (last step %d)" % (n, tr.steps[-1]))
            refreshes += 1
            if st.in_kernel():
                # The figure is not pyplot's, so the kernel does not show it twice: as an image.
                if display_handle is None:
                    display_handle = display(Image(st.png_bytes(fig)), display_id=True)
                else:
                    display_handle.update(Image(st.png_bytes(fig)))
    if now - grown_at >= IDLE:
        reason = "no new step for %g s" % IDLE
    elif now - start >= LIMIT:
        reason = "time limit of %g s reached" % LIMIT
    else:
        time.sleep(EVERY)

tr = live.snapshot()
live.close()
if len(tr) == 0:
    raise st.InputError("trace %s: no measured step in %g s" % (TRACE, time.time() - start))
draw(fig, tr, "%d steps, stopped: %s" % (len(tr), reason))
if display_handle is not None:
    display_handle.update(Image(st.png_bytes(fig)))
print("followed %s for %.1f s: row counts seen %s; %d redraws; stopped: %s" % (
    TRACE, time.time() - start, " ".join(map(str, seen)), refreshes, reason))
print("final rows: %d (steps %d..%d)" % (len(tr), tr.steps[0], tr.steps[-1]))
st.save_figure(fig, "live", show=False)  # shown above, in place
