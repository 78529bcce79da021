"""stabmeter.read_trace: a stabmeter trace (any format_version, 1 to 4) read into numpy arrays
through the library's one trace reader (stab_trace_read_*, include/stabmeter/trace_read.h), the
reader stabmeter-export uses; .to_xarray() and .to_pandas() when those packages import."""

import ctypes
import json
import os
import re
from ctypes import byref, c_char_p, c_size_t, c_void_p, POINTER

from ._lib import TraceAttr, TraceReadParams, check, lib

_HEAD_BOUND = re.compile(r"head(\d+)_bound\Z")


def _text(b):
    # Names are UTF-8 as the writer checked them; surrogateescape keeps any other byte.
    return b.decode("utf-8", "surrogateescape") if b is not None else None


def _names(values):
    if values is None:
        return None, 0
    if isinstance(values, (str, bytes)):
        values = [values]
    encoded = [os.fsencode(v) for v in values]
    return (c_char_p * max(len(encoded), 1))(*encoded), len(encoded)


class TraceLayer:
    """One layer of a trace: its name (as the trace stores it, '/' already '.'), kind, attrs (a
    dict: layout, description, shares_storage_with, d_in, d_out, param_count ... as the trace
    has them) and metrics (a dict of float64 arrays, one value per row: forward, dependency,
    update ..., the layer extras, head<h>_bound per attention head)."""

    def __init__(self, name, kind, attrs, metrics):
        self.name, self.kind, self.attrs, self.metrics = name, kind, attrs, metrics

    def __repr__(self):
        return "TraceLayer(%r, kind=%r, %d metrics)" % (self.name, self.kind, len(self.metrics))


class Trace:
    """A trace read into memory.
        path, format_version, run_config (the JSON text) and config (it parsed)
        steps      int64 array, one per row (/step)
        wall_time  float64 array (None when `metrics` left it out)
        scalars    {name: float64 array} (loss, lr ...), in name order
        layers     [TraceLayer], in name order (numbers compared as numbers: h.2 before h.10)
    Every array has len(steps) values; a value the writer did not have is NaN."""

    def __init__(self, path, format_version, run_config, steps, wall_time, scalars, layers):
        self.path, self.format_version, self.run_config = path, format_version, run_config
        self.steps, self.wall_time, self.scalars, self.layers = steps, wall_time, scalars, layers

    def __len__(self):
        return len(self.steps)

    def __repr__(self):
        return "Trace(%r, format_version=%d, %d steps, %d scalars, %d layers)" % (
            self.path, self.format_version, len(self.steps), len(self.scalars), len(self.layers))

    @property
    def config(self):
        """run_config parsed (a dict; {} when the trace has none)."""
        return json.loads(self.run_config or "{}")

    def layer(self, name):
        """The layer of that name; KeyError when there is none."""
        for l in self.layers:
            if l.name == name:
                return l
        raise KeyError(name)

    def to_xarray(self):
        """An xarray.Dataset shaped as format 4 reads with xarray directly: dims step, layer and
        head; each layer metric a (step, layer) variable (NaN where a layer lacks it), each
        scalar and wall_time a (step) variable, the attention heads' bounds head_bound (step,
        head) with coordinates head (the head's number) and head_layer (its layer's name); the
        layers' kind and attributes are coordinates along layer. attrs: path, format_version,
        run_config. ImportError when xarray does not import."""
        xr = _need("xarray", "to_xarray")
        import numpy as np
        n = len(self.steps)
        names = [l.name for l in self.layers]
        coords = {"step": ("step", self.steps), "layer": ("layer", np.array(names, dtype=object)),
                  "kind": ("layer", np.array([l.kind for l in self.layers], dtype=object))}
        keys = []
        for l in self.layers:
            keys += [k for k in l.attrs if k not in keys and k != "kind"]
        for k in keys:
            values = [l.attrs.get(k) for l in self.layers]
            if all(isinstance(v, int) for v in values):
                coords[k] = ("layer", np.array(values, dtype=np.int64))
            else:
                coords[k] = ("layer", np.array(values, dtype=object))
        data = {}
        if self.wall_time is not None:
            data["wall_time"] = ("step", self.wall_time)
        for k, v in self.scalars.items():
            data[k] = ("step", v)
        metrics, heads = [], []
        for l in self.layers:
            for m in l.metrics:
                h = _HEAD_BOUND.match(m)
                if h:
                    heads.append((l.name, int(h.group(1)), l.metrics[m]))
                elif m not in metrics:
                    metrics.append(m)
        for m in metrics:
            a = np.full((n, len(self.layers)), np.nan)
            for i, l in enumerate(self.layers):
                if m in l.metrics:
                    a[:, i] = l.metrics[m]
            data[m] = (("step", "layer"), a)
        if heads:
            data["head_bound"] = (("step", "head"), np.stack([h[2] for h in heads], axis=1))
            coords["head"] = ("head", np.array([h[1] for h in heads], dtype=np.int64))
            coords["head_layer"] = ("head", np.array([h[0] for h in heads], dtype=object))
        return xr.Dataset(data, coords=coords,
                          attrs={"path": self.path, "format_version": self.format_version,
                                 "run_config": self.run_config})

    def to_pandas(self, form="long"):
        """A pandas.DataFrame, as stabmeter-export writes the trace: form "long", one value a row
        (columns step, layer, kind, metric, value: per step wall_time and the scalars with layer
        "" and kind "scalar", then every layer's metrics), or "wide", one row per step (index
        step; columns wall_time, the scalars, then LAYER.METRIC). ImportError when pandas does
        not import."""
        pd = _need("pandas", "to_pandas")
        import numpy as np
        columns = []  # (layer, kind, metric, values) in export's order
        if self.wall_time is not None:
            columns.append(("", "scalar", "wall_time", self.wall_time))
        columns += [("", "scalar", k, v) for k, v in self.scalars.items()]
        for l in self.layers:
            columns += [(l.name, l.kind, m, v) for m, v in l.metrics.items()]
        if form == "wide":
            wide = {(m if not layer else layer + "." + m): v for layer, _, m, v in columns}
            if len(wide) != len(columns) or "step" in wide:
                raise ValueError("trace %s: two columns of the wide form would have one name: use form='long'"
                                 % self.path)
            return pd.DataFrame(wide, index=pd.Index(self.steps, name="step"))
        if form != "long":
            raise ValueError("form must be 'long' or 'wide', not %r" % (form,))
        n, k = len(self.steps), len(columns)
        # row r of column c at r * k + c: the rows of a step together, in export's order
        return pd.DataFrame({
            "step": np.repeat(self.steps, k),
            "layer": np.tile(np.array([c[0] for c in columns], dtype=object), n),
            "kind": np.tile(np.array([c[1] for c in columns], dtype=object), n),
            "metric": np.tile(np.array([c[2] for c in columns], dtype=object), n),
            "value": np.stack([c[3] for c in columns], axis=1).reshape(-1) if k else np.empty(0),
        })


def _need(module, what):
    try:
        return __import__(module)
    except ImportError as e:
        raise ImportError("stabmeter.Trace.%s needs %s, which does not import here (%s); on Debian: "
                          "apt-get install python3-%s" % (what, module, e, module)) from None


def read_trace(path, layers=None, metrics=None):
    """The trace at `path` read into memory (a Trace), through the library's reader: every
    format_version from 1 to 4, a trace whose writer is still running included (its flushed rows).
        layers   shell patterns of layer names (fnmatch: "h.*.attn"), one or a list; None: all
        metrics  column names (layer metrics, scalars, "wall_time"), one or a list; None: all
    A pattern or name that selects nothing raises, as a file that is missing or not a regular
    file (stabmeter.IOError_), not a stabmeter trace or damaged (stabmeter.FormatError): the
    message names the file and the object at fault."""
    import numpy as np
    globs, n_globs = _names(layers)
    names, n_names = _names(metrics)
    params = TraceReadParams(ctypes.cast(globs, POINTER(c_char_p)) if globs is not None else None, n_globs,
                             ctypes.cast(names, POINTER(c_char_p)) if names is not None else None, n_names)
    r = c_void_p()
    check(lib.stab_trace_read_open(os.fsencode(path), byref(params), byref(r)))
    try:
        rows = lib.stab_trace_read_rows(r)

        def column(read, *where):
            a = np.empty(rows, dtype=np.float64)
            check(read(r, *where, 0, rows, a.ctypes.data_as(c_void_p)))
            return a

        steps = np.empty(rows, dtype=np.int64)
        check(lib.stab_trace_read_steps(r, 0, rows, steps.ctypes.data_as(c_void_p)))
        wall = column(lib.stab_trace_read_wall_time) if lib.stab_trace_read_has_wall_time(r) else None
        scalars = {_text(lib.stab_trace_read_scalar_name(r, i)): column(lib.stab_trace_read_scalar, i)
                   for i in range(lib.stab_trace_read_scalar_count(r))}
        out = []
        for li in range(lib.stab_trace_read_layer_count(r)):
            attrs_p, n_attrs = POINTER(TraceAttr)(), c_size_t()
            check(lib.stab_trace_read_layer_attrs(r, li, byref(attrs_p), byref(n_attrs)))
            attrs = {}
            for a in attrs_p[:n_attrs.value]:
                attrs[_text(a.name)] = _text(a.text) if a.text is not None else int(a.value)
            metrics_ = {_text(lib.stab_trace_read_metric_name(r, li, m)): column(lib.stab_trace_read_metric, li, m)
                        for m in range(lib.stab_trace_read_metric_count(r, li))}
            out.append(TraceLayer(_text(lib.stab_trace_read_layer_name(r, li)),
                                  _text(lib.stab_trace_read_layer_kind(r, li)), attrs, metrics_))
        config = c_char_p()
        check(lib.stab_trace_read_run_config(r, byref(config)))
        return Trace(os.fspath(path), lib.stab_trace_read_format_version(r), _text(config.value), steps, wall,
                     scalars, out)
    finally:
        lib.stab_trace_read_close(r)
