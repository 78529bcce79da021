"""stabmeter.torch.Monitor: the library's per-step monitor over a PyTorch model's parameters,
registered by the library's kind rules from their names, measured in place around
optimizer.step() and appended to the same HDF5 trace stabmeter-train writes."""

import ctypes
import json
import math
import os
import time
import warnings
import weakref

import torch as _torch

from . import _lib
from ._arrays import C_INT, C_INT64, choice, integer, overrides
from ._lib import DTYPE_F32, LAYOUT_NAMES, LAYOUT_OVERRIDES, TIGHT_METHODS, UPDATE_SNAPSHOT, check, lib, metrics_dict
from ._metrics import _spectral_params
from ._model import Model

PRODUCER = "stabmeter.torch"


def _config_heads(model):
    """heads, kv_heads, head_dim and tie from a Hugging Face style model.config, where it has them."""
    cfg = getattr(model, "config", None)
    get = (lambda k: getattr(cfg, k, None)) if cfg is not None and not isinstance(cfg, dict) else \
        (lambda k: cfg.get(k) if cfg else None)
    heads = get("num_attention_heads") or get("n_head")
    tie = get("tie_word_embeddings")
    return heads, get("num_key_value_heads"), get("head_dim"), None if tie is None else bool(tie)


def _glob_literal(name):
    """name as an fnmatch pattern matching itself alone."""
    return "".join("[%s]" % c if c in "*?[]" else c for c in name)


def _module_layouts(model):
    """Layout overrides from what each weight's module is: PyTorch's nn.Linear stores
    [d_out][d_in] whatever its name, Hugging Face's GPT-2 Conv1D [d_in][d_out]. The names alone
    cannot tell a square c_proj of one from the other (the rules' shape test); the module can."""
    out = []
    for mname, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if not isinstance(w, _torch.nn.Parameter) or w.dim() != 2:
            continue
        full = (mname + "." if mname else "") + "weight"
        if isinstance(mod, _torch.nn.Linear):
            out.append((_glob_literal(full), "out_major"))
        elif type(mod).__name__ == "Conv1D":
            out.append((_glob_literal(full), "in_major"))
    return out


class Monitor:
    """Per-step stability metrics of a model's layers, optionally traced to HDF5.

        monitor = stabmeter.torch.Monitor(model, trace="run/trace.h5")
        for step in range(1, steps + 1):
            loss = ...; loss.backward()
            monitor.before_step(step)       # snapshot of the weights (when this step is measured)
            optimizer.step()
            monitor.after_step(step, loss=loss.item())  # measure, append a trace row
        monitor.close()

    Layers come from model.named_parameters() (PyTorch's names) through the library's kind
    rules: kinds, layouts, biases folded into their linear layer, fused or separate q/k pairs as
    attention layers (heads from heads= or model.config), the tied head. The parameters are
    read where they are, every step: they must stay float32, on the CPU and in place (torch's
    optimizers update in place); a parameter whose storage moved (model.to(), .data
    reassigned, a module replaced) is detected at the next call, which raises StateError. The
    monitor holds a reference to every storage it reads, so it never reads freed memory.

    A file already at trace= is kept: if_exists='fail' (default) raises AlreadyExists and
    leaves it as it was; 'append' adds this run's steps after its last (the same layers and
    scalars, else InvalidArgument; an earlier step raises RangeError at after_step); 'replace'
    replaces it once the new trace is complete."""

    def __init__(self, model, trace=None, heads=None, every=1, kv_heads=None, head_dim=None, tie=None,
                 out_major=False, kinds=None, layouts=None, tol=1e-3, threads=None, tight="centred",
                 run_config=None, scalars=("loss", "lr"), flush_every=0, if_exists="fail", _named=None):
        self._m = ctypes.c_void_p()
        self._trace = ctypes.c_void_p()
        self.every = integer(every, "Monitor: every", 1, C_INT64[1], "every N >= 1 steps")
        flush_every = integer(flush_every, "Monitor: flush_every", 0, C_INT[1], "0 (the library's) or N >= 1 rows")
        tight_code = choice(tight, "Monitor: tight", TIGHT_METHODS)
        choice(if_exists, "Monitor: if_exists", self.IF_EXISTS)
        self._model = None
        if _named is None:
            if not hasattr(model, "named_parameters"):
                raise TypeError("Monitor: expected a torch.nn.Module, got %s (Monitor.from_state_dict "
                                "takes a state dict)" % type(model).__name__)
            named = list(model.named_parameters())
            self._source = weakref.ref(model)  # the monitor does not keep the model alive
        else:
            named, self._source = _named, None
        c_heads, c_kv, c_hd, c_tie = _config_heads(model) if model is not None else (None,) * 4
        heads_source = "heads=" if heads else ("model.config" if c_heads else None)
        heads, kv_heads = heads or c_heads or 0, kv_heads or c_kv or 0
        head_dim = head_dim or c_hd or 0
        tie = c_tie if tie is None else tie
        layouts = overrides(layouts, "Monitor: layouts", LAYOUT_OVERRIDES)  # the caller's first: first match wins
        if _named is None:
            layouts += _module_layouts(model)
        views = []
        for name, p in named:
            if p.device.type != "cpu":
                raise TypeError("Monitor: parameter %s is on %s; stabmeter reads CPU memory" % (name, p.device))
            if p.dtype == _torch.float32 and not p.is_contiguous():
                raise TypeError("Monitor: parameter %s is not contiguous (strides %s)" % (name, p.stride()))
            if p.numel() and p.data_ptr() % p.element_size():
                raise TypeError("Monitor: parameter %s: its data at address %#x is not aligned to its %d-byte "
                                "elements; C reads whole elements (give the module a copy)"
                                % (name, p.data_ptr(), p.element_size()))
            views.append((name, p.detach()))  # keeps the storage alive whatever the model does
        self._views = views
        self._ptrs = {name: v.data_ptr() for name, v in views}
        self._model = Model(views, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                            tie=-1 if tie is None else int(tie), out_major=out_major, kinds=kinds,
                            layouts=layouts, heads_source=heads_source)
        params = lib.stab_monitor_default_params()
        params.metrics.spectral = _spectral_params(tol, "lanczos", None, threads, "Monitor")
        params.metrics.tight = tight_code
        params.update_mode = UPDATE_SNAPSHOT
        check(lib.stab_monitor_create(ctypes.byref(params), ctypes.byref(self._m)))
        self.skipped = {}  # tensor name -> why the rules do not measure it
        self.layers = []   # (name, kind) in registration order
        try:
            for e in self._model.entries:
                if e.why_not is not None:
                    self.skipped[e.name] = e.why_not
                    continue
                if e.n_expert:
                    continue  # a layer of experts: its experts are the entries after it
                # the C views' own types: an expert's slice of a 3-D tensor is no tensor of ours
                for t in (e.c.weight, e.c.bias, e.c.weight_k):
                    if t and t.contents.dtype != DTYPE_F32:
                        raise TypeError("Monitor: parameter %s is %s; the monitor reads float32 parameters "
                                        "in place (measure other types with stabmeter.layer_metrics)"
                                        % (t.contents.name.decode("utf-8", "replace"),
                                           t.contents.dtype_name.decode("ascii", "replace")))
                layer = self._model.layer(e)
                check(lib.stab_monitor_add_layer(self._m, ctypes.byref(layer), None))
                self.layers.append((e.name, e.kind))
            if not self.layers:
                raise ValueError("Monitor: no parameter is a layer by the kind rules (%d not measured)"
                                 % len(self.skipped))
            self._scalars = [s for s in scalars]
            if trace is not None:
                self._open_trace(trace, model, run_config, flush_every, if_exists)
        except BaseException:
            self.close()
            raise
        self._snapshot = False
        self._warned_no_snapshot = False
        self._t0 = time.monotonic()
        self.steps = 0

    @classmethod
    def from_state_dict(cls, state_dict, heads=None, trace=None, **kw):
        """A monitor of the tensors of a state dict (a checkpoint in memory). Tensors that are not
        float32 or not contiguous are measured from a float32 copy made here (the dict's own
        memory otherwise); call measure() for the metrics, or after_step to trace them."""
        named = []
        for name, t in state_dict.items():
            if not isinstance(t, _torch.Tensor):
                continue
            t = t.detach()
            if t.device.type != "cpu":
                raise TypeError("from_state_dict: tensor %s is on %s; pass a CPU state dict "
                                "(torch.load(..., map_location='cpu'))" % (name, t.device))
            if t.is_floating_point() and (t.dtype != _torch.float32 or not t.is_contiguous()):
                t = t.to(_torch.float32).contiguous()
            if t.numel() and t.data_ptr() % t.element_size():
                t = t.clone()  # aligned storage: C reads whole elements
            named.append((name, t))
        return cls(None, trace=trace, heads=heads, _named=named, **kw)

    # ---- the trace -------------------------------------------------------------------------

    # What trace= may do to a file already there (stab_output_mode, the rule every stabmeter
    # writer keeps): a new Monitor cannot know that its steps continue that trace's run (the
    # same layers are not the same run), so it refuses unless asked, as pandas' to_sql does.
    IF_EXISTS = {"fail": 2, "append": 1, "replace": 0}

    def _open_trace(self, path, model, run_config, flush_every, if_exists):
        path = os.fspath(path)
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        config = {"program": PRODUCER, "producer": PRODUCER, "library_version": lib.stab_version().decode(),
                  "model": {"class": type(model).__name__ if model is not None else "state_dict",
                            "parameters": int(sum(v.numel() for _, v in self._views)),
                            "heads": int(self._model._cfg.heads)},
                  "metrics_every": self.every, "torch_version": _torch.__version__}
        if run_config:
            config.update(run_config)
        self._config_bytes = json.dumps(config).encode("utf-8")
        names = [s.encode("utf-8") for s in self._scalars]
        self._scalar_names = (ctypes.c_char_p * max(len(names), 1))(*names)
        tp = lib.stab_trace_default_params()
        tp.flush_every = flush_every
        tp.run_config = self._config_bytes
        tp.scalars = self._scalar_names
        tp.n_scalars = len(names)
        tp.append = self.IF_EXISTS[if_exists]
        status = lib.stab_trace_open(path.encode("utf-8"), self._m, ctypes.byref(tp), ctypes.byref(self._trace))
        if status == -5 and if_exists == "fail":  # STAB_EEXIST: say how to ask for the others
            raise _lib.error_for(status, "Monitor(trace=%r): %s: if_exists='append' adds this run's steps after "
                                 "its last (the same layers and scalars), if_exists='replace' replaces it"
                                 % (path, lib.stab_last_error().decode("utf-8", "replace")))
        check(status)
        self.trace_path = path

    # ---- the step --------------------------------------------------------------------------

    def _check_open(self):
        if not self._m:
            raise _lib.error_for(-6, "Monitor: closed")

    def check_parameters(self):
        """Raises StateError when a parameter the monitor reads is no longer where it was
        registered (its storage moved or was replaced), or when the model has other ones."""
        self._check_open()
        if self._source is None:
            return  # a state dict's tensors: the monitor holds them itself
        model = self._source()
        if model is None:
            raise _lib.error_for(-6, "Monitor: the model was freed; the monitor reads its parameters")
        now = {}
        for name, p in model.named_parameters():
            now[name] = p.data_ptr()
        for name, ptr in self._ptrs.items():
            if now.get(name) != ptr:
                what = "is gone" if name not in now else "has moved (model.to(), .data reassigned or a module replaced)"
                raise _lib.error_for(-6, "Monitor: parameter %s %s: the monitor reads it where it was "
                                     "registered; create a new Monitor" % (name, what))

    def measures(self, step):
        return step is None or integer(step, "Monitor: step", *C_INT64) % self.every == 0

    def before_step(self, step=None):
        """Call just before optimizer.step(): snapshots the weights when step will be measured
        (every `every` steps; always when step is None), for the update metrics."""
        self.check_parameters()
        if self.measures(step):
            check(lib.stab_monitor_snapshot(self._m))
            self._snapshot = True

    def after_step(self, step, loss=None, lr=None, scalars=None):
        """Call just after optimizer.step(): when step is measured (step % every == 0) measures
        every layer (with the update metrics when before_step took a snapshot) and appends a trace
        row with the scalars (loss, lr, or a dict by name). Returns True when it measured."""
        self.check_parameters()
        if not self.measures(step):
            return False
        if not self._snapshot and not self._warned_no_snapshot:
            # the C monitor refuses an update without a snapshot; here the step is still
            # measured, but a loop that never calls before_step would get NaN updates unsaid
            self._warned_no_snapshot = True
            warnings.warn("Monitor.after_step(%s): no before_step(%s) since the last measurement, so this "
                          "step has no update metrics (NaN); call monitor.before_step(step) just before "
                          "optimizer.step() (said once per Monitor)" % (step, step), RuntimeWarning, stacklevel=2)
        check(lib.stab_monitor_measure(self._m, 1 if self._snapshot else 0))
        self._snapshot = False
        self.steps += 1
        if self._trace:
            values = dict(scalars or {})
            if loss is not None:
                values["loss"] = loss
            if lr is not None:
                values["lr"] = lr
            unknown = set(values) - set(self._scalars)
            if unknown:
                raise ValueError("after_step: scalars %s were not declared (Monitor(scalars=...): %s)"
                                 % (sorted(unknown), self._scalars))
            row = (ctypes.c_double * max(len(self._scalars), 1))(
                *[float(values.get(s, math.nan)) for s in self._scalars])
            check(lib.stab_trace_append(self._trace, integer(step, "after_step: step", *C_INT64),
                                        time.monotonic() - self._t0, row, None))
        return True

    def measure(self):
        """Measures every layer now, without update metrics, and returns metrics()."""
        self.check_parameters()
        check(lib.stab_monitor_measure(self._m, 0))
        return self.metrics()

    def metrics(self, frame=False):
        """The last measurement: {layer name: {kind, layout, d_in, d_out, forward, ..., flags}}
        (attention layers also head_bounds), or with frame=True a pandas DataFrame, one row per
        layer indexed by name."""
        self._check_open()
        out = {}
        for i, (name, kind) in enumerate(self.layers):
            d = {"kind": kind}
            L = lib.stab_monitor_layer(self._m, i).contents
            d.update(layout=LAYOUT_NAMES.get(L.layout), d_in=L.d_in, d_out=L.d_out)
            d.update(metrics_dict(lib.stab_monitor_metrics(self._m, i).contents))
            if kind == "attention":
                hb = lib.stab_monitor_head_bounds(self._m, i)
                d["head_bounds"] = [hb[h] for h in range(L.heads)]
            out[name] = d
        if frame:
            import pandas as pd
            return pd.DataFrame.from_dict(out, orient="index")
        return out

    def reference(self):
        """Each layer's reference, what the trace's forward_ratio, dependency_ratio and
        update_ratio divide by: {layer name: {forward, dependency, update}}, each its first finite
        value > 0 so far (NaN until seen)."""
        self._check_open()
        out = {}
        for i, (name, _) in enumerate(self.layers):
            r = lib.stab_monitor_reference(self._m, i).contents
            out[name] = {"forward": r.forward, "dependency": r.dependency, "update": r.update}
        return out

    def flush(self):
        if self._trace:
            check(lib.stab_trace_flush(self._trace))

    def close(self):
        """Closes the trace (every row written) and frees the monitor; safe to call twice."""
        status = 0
        if getattr(self, "_trace", None):
            status = lib.stab_trace_close(self._trace)
            self._trace = ctypes.c_void_p()
        if getattr(self, "_m", None):
            lib.stab_monitor_free(self._m)
            self._m = ctypes.c_void_p()
        if getattr(self, "_model", None) is not None:
            self._model.close()
        check(status)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
