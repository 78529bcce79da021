"""stabmeter.torch.Monitor: the library's per-step monitor over a PyTorch model's parameters,
registered by what their modules are and, where a module says nothing, by the library's kind
rules from their names; measured in place around optimizer.step() and appended to the same HDF5
trace stabmeter-train writes."""

import concurrent.futures
import ctypes
import fnmatch
import json
import math
import os
import threading
import time
import warnings
import weakref

import torch as _torch

from . import _lib
from ._arrays import C_INT, C_INT64, choice, integer, overrides
from ._lib import (KIND_NAMES, KIND_OVERRIDES, LAYOUT_NAMES, LAYOUT_OVERRIDES, TIGHT_METHODS, UPDATE_SNAPSHOT, check, lib,
                   metrics_dict)
from ._metrics import _spectral_params
from ._device import Mirrors as _Mirrors
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


# ---- what each parameter is, from its module ---------------------------------------------
#
# The module a parameter belongs to says what it is where its name cannot: an nn.Embedding
# named emb is a table, a Conv2d's 4-D weight a linear map, a BatchNorm's weight a gain. These
# decisions reach the C kind rules as exact-name overrides (and 2-D views of convolution
# weights), so that one C description holds every decision; a parameter of a module that says
# nothing (a custom module's nn.Parameter, Hugging Face's Conv1D) is left to the rules' names.

# Wrappers whose wrapped model is one attribute: their names gain its prefix.
_WRAPPERS = {"DistributedDataParallel": "module", "DataParallel": "module", "OptimizedModule": "_orig_mod"}
_PREFIXES = ("module.", "_orig_mod.")


def _unwrap(model):
    """The model inside torch.nn.parallel's (Distributed)DataParallel and torch.compile's
    OptimizedModule wrappers (by type name: torch 1.13 has no torch.compile), so that its
    parameters keep the names the model itself gives them."""
    while type(model).__name__ in _WRAPPERS:
        inner = getattr(model, _WRAPPERS[type(model).__name__], None)
        if not isinstance(inner, _torch.nn.Module):
            break
        model = inner
    return model


def _strip_prefixes(named):
    """A state dict's names without the wrappers' prefix that every name has (a DDP or
    torch.compile model's state_dict())."""
    while named:
        p = next((p for p in _PREFIXES if named[0][0].startswith(p)), None)
        if p is None or not all(n.startswith(p) for n, _ in named):
            break
        named = [(n[len(p):], t) for n, t in named]
    return named


def _norm_types():
    nn = _torch.nn
    types = [nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase]  # BatchNorm*d, InstanceNorm*d
    if hasattr(nn, "RMSNorm"):
        types.append(nn.RMSNorm)
    return tuple(types)


def _full(mname, pname):
    return mname + "." + pname if mname else pname


class _Plan:
    """What the modules of a model say of its parameters.
        kinds    {parameter name: kind} the module decides (nn.Embedding, nn.Linear, norms, convolutions)
        views    {parameter name: tensor} a convolution weight's 2-D view [C_out][C_in*prod(k)]
        refused  {parameter name: why} what the module makes unmeasurable (grouped convolutions)
        tied     [(name, embedding's name)] an output nn.Linear whose weight is an nn.Embedding's
        heads    [(module name, num_heads)] of every nn.MultiheadAttention
        layouts  [(glob, layout)] nn.Linear out-major, Hugging Face's Conv1D in-major"""

    def __init__(self, model):
        nn = _torch.nn
        self.kinds, self.views, self.refused, self.tied, self.heads, self.layouts = {}, {}, {}, [], [], []
        modules = list(model.named_modules(remove_duplicate=False))
        embeddings = {id(m.weight): name for name, m in modules if isinstance(m, nn.Embedding)}
        vocab = {m.num_embeddings for _, m in modules if isinstance(m, nn.Embedding)}
        linears = [(name, m) for name, m in modules if isinstance(m, nn.Linear)]
        last_linear = linears[-1][1] if linears else None
        norms = _norm_types()
        for mname, m in modules:
            w = _full(mname, "weight")
            if isinstance(m, nn.Embedding):
                self.kinds[w] = "embedding"
            elif isinstance(m, nn.Linear):
                self.layouts.append((_glob_literal(w), "out_major"))
                if id(m.weight) in embeddings:
                    self.tied.append((w, _full(embeddings[id(m.weight)], "weight")))
                    self.kinds[w] = "lm_head"
                elif m.out_features in vocab and m is last_linear:
                    self.kinds[w] = "lm_head"
                else:
                    # a head by name (lm_head, output) keeps that kind when it maps to a vocabulary
                    self.kinds[w] = "lm_head?" if m.out_features in vocab else "linear"
            elif isinstance(m, norms):
                if getattr(m, "weight", None) is not None:
                    self.kinds[w] = "gain"
                if getattr(m, "bias", None) is not None:
                    self.kinds[_full(mname, "bias")] = "bias"
            elif isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
                b = _full(mname, "bias")
                if m.groups != 1:
                    why = ("a grouped convolution (groups=%d%s): its weight is no one matrix of the flattened "
                           "patch map; not measured" % (m.groups, ", depthwise" if m.groups == m.in_channels else ""))
                    self.refused[w] = why
                    if m.bias is not None:
                        self.refused[b] = "the bias of %s, a grouped convolution (groups=%d): not measured" % (
                            mname, m.groups)
                elif not m.weight.is_contiguous():
                    self.refused[w] = ("a convolution weight that is not contiguous (channels_last?): the flattened "
                                       "patch map [C_out][C_in*k] is read in place (use a contiguous weight)")
                else:
                    self.kinds[w] = "linear"
                    self.views[w] = m.weight.detach().view(m.weight.shape[0], -1)
            elif isinstance(m, nn.modules.conv._ConvTransposeNd):
                self.refused[w] = "a transposed convolution: no rule for it; not measured"
                if m.bias is not None:
                    self.refused[_full(mname, "bias")] = "the bias of %s, a transposed convolution: not measured" % mname
            elif isinstance(m, nn.MultiheadAttention):
                self.heads.append((mname, m.num_heads))
            elif type(m).__name__ == "Conv1D" and isinstance(getattr(m, "weight", None), nn.Parameter) \
                    and m.weight.dim() == 2:
                self.layouts.append((_glob_literal(w), "in_major"))  # Hugging Face GPT-2: [d_in][d_out]

    def mha_heads(self, heads):
        """The head count of the model's nn.MultiheadAttention modules (None without one), which
        must agree with each other and with heads= (a bound with another count is another bound)."""
        if not self.heads:
            return None
        first, n = self.heads[0]
        for name, h in self.heads[1:]:
            if h != n:
                raise ValueError("Monitor: nn.MultiheadAttention %r has num_heads=%d but %r num_heads=%d; the "
                                 "monitor binds every attention layer with one head count (measure them apart, "
                                 "with kinds={'%s*': 'skip'} on one)" % (first, n, name, h, name))
        if heads and heads != n:
            raise ValueError("Monitor(heads=%d): the model's nn.MultiheadAttention %r has num_heads=%d" % (heads, first, n))
        return n


def _expand_kinds(kinds, named, module_names):
    """kinds= ({glob: kind}) as exact-name overrides: a glob matches parameter names (the kind
    for that parameter) and module names (the kind for that module's own weight; bias for its
    bias; skip for all its parameters). A glob that matches nothing is an error."""
    pairs = overrides(kinds, "Monitor: kinds", KIND_OVERRIDES)
    names = [n for n, _ in named]
    have = set(names)
    by_module = {}
    for n in names:
        by_module.setdefault(n.rpartition(".")[0], []).append(n)
    out = []
    for glob, kind in pairs:
        hit = [n for n in names if fnmatch.fnmatchcase(n, glob)]
        for mname in module_names:
            if not mname or not fnmatch.fnmatchcase(mname, glob):
                continue
            own = by_module.get(mname, [])
            if kind == "skip":
                hit += own
            else:
                want = _full(mname, "bias" if kind == "bias" else "weight")
                hit += [want] if want in have else []
        if not hit:
            raise ValueError("Monitor(kinds={%r: %r}): %r matches no parameter name and no module with a parameter "
                             "it applies to (names look like %r)" % (glob, kind, glob, names[0] if names else ""))
        seen = set()
        out += [(_glob_literal(n), kind) for n in hit if not (n in seen or seen.add(n))]
    return out


class UnmeasuredWarning(UserWarning):
    """Monitor's warning at creation: parameters it does not measure, and why."""


def _all_params(model):
    """(name, parameter) of every module's own parameters, a shared one under each of its names."""
    for mname, m in model.named_modules(remove_duplicate=False):
        for pname, p in m._parameters.items():
            if p is not None:
                yield _full(mname, pname), p


def _module_kinds(plan, views, user_kinds, described):
    """The kind overrides the modules add to the rules' names: where the module says what a
    parameter is and the names alone say otherwise (or nothing), and a skip for what a module
    makes unmeasurable. Where both agree nothing is added, so that the rules' own inferences from
    names stand (a token table named wte tied to an output that is no nn.Linear)."""
    names = {n for n, _ in views}
    first = Model(views, kinds=user_kinds, **described)
    try:
        said = {}
        for e in first.entries:
            if e.why_not is not None or e.tied or e.n_expert or e.kind == "attention":
                continue
            # by the C views' names: a slice of a fused tensor keeps its tensor's name
            said[e.c.weight.contents.name.decode("utf-8")] = e.kind
            if e.c.bias:
                said[e.c.bias.contents.name.decode("utf-8")] = "bias"
    finally:
        first.close()
    out = []
    for name, kind in plan.kinds.items():
        if name not in names:
            continue
        if kind == "lm_head?":  # maps to a vocabulary but is not the output: the name decides
            kind = "lm_head" if said.get(name) == "lm_head" else "linear"
        if said.get(name) != kind:
            out.append((_glob_literal(name), kind))
    return out + [(_glob_literal(n), "skip") for n in plan.refused if n in names]


_JOB_THREADS = set()  # the threads _measure_job has run on (Monitor.__del__ must not wait there)


def _measure_job(m, ticket, measure, with_update, snapshot):
    """background=True's job on the monitor's thread: a step's measurement, then the next step's
    snapshot, in one call of the library's (stab_monitor_measure_idle: at idle priority until
    the training waits for it, unless its ticket was hurried before it started; the switch back
    happens inside the call, so that this thread never takes the GIL at idle priority);
    (status, message) when it fails (stab_last_error is this thread's), else None."""
    _JOB_THREADS.add(threading.get_ident())
    status = lib.stab_monitor_measure_idle(m, ticket, measure, with_update, snapshot)
    if status != 0:
        return status, lib.stab_last_error().decode("utf-8", "replace")
    return None


def idle_priority():
    """(allowed, reason): whether Monitor(background=True, priority='idle') can measure at idle
    priority in this process (stab_idle_priority_allowed)."""
    why = ctypes.c_char_p()
    allowed = lib.stab_idle_priority_allowed(ctypes.byref(why)) != 0
    return allowed, why.value.decode("utf-8", "replace")


def _python_words(why):
    """A reason from the C rules in the words of Monitor's arguments, not the probe's options."""
    return (why.replace("skipped by --kind", "skipped by kinds=")
            .replace("give --heads H; none in the file's metadata or the model's config.json",
                     "give Monitor(heads=H); none in model.config nor an nn.MultiheadAttention")
            .replace("--kind ", "kinds= ").replace("--heads", "heads="))


class Monitor:
    """Per-step stability metrics of a model's layers, optionally traced to HDF5.

        monitor = stabmeter.torch.Monitor(model, trace="run/trace.h5")
        for step in range(1, steps + 1):
            loss = ...; loss.backward()
            monitor.before_step(step)       # snapshot of the weights (when this step is measured)
            optimizer.step()
            monitor.after_step(step, loss=loss.item())  # measure, append a trace row
        monitor.close()

    Layers come from model.named_parameters() (PyTorch's names, a wrapper's prefix removed):
    the kind each module gives its parameters (nn.Embedding, nn.Linear and the LM head,
    nn.MultiheadAttention, norms, convolutions as their flattened patch map), else the library's
    kind rules by name; biases folded into their linear layer, fused or separate q/k pairs as
    attention layers (heads from heads=, nn.MultiheadAttention or model.config), the tied head.
    What is not measured is said at creation by one UnmeasuredWarning (strict=True: ValueError).
    The parameters are read where they are, every step: they must stay in place (torch's
    optimizers update in place), float32, float16 or bfloat16. Off the CPU (a CUDA model), linear
    layers are measured on their device (stabmeter._device) and the others by the library from
    host copies refreshed each measured step; a parameter whose storage moved (model.to(), .data
    reassigned, a module replaced) is detected at the next call, which raises StateError. The
    monitor holds a reference to every storage it reads, so it never reads freed memory.

    A file already at trace= is kept: if_exists='fail' (default) raises AlreadyExists and
    leaves it as it was; 'append' adds this run's steps after its last (the same layers and
    scalars, else InvalidArgument; an earlier step raises RangeError at after_step); 'replace'
    replaces it once the new trace is complete.

    background=True measures on a thread of the monitor's own while the training goes on: a
    measured after_step(step) returns as soon as the measurement has started, and the next call
    to the monitor (before_step, after_step, measure, metrics, reference, flush, close or wait)
    waits for it, then appends its trace row; the snapshot for the next step's update is taken
    there too, from the same weights. The metrics are the same bits as without it. What it asks:
    call before_step(step) before every optimizer.step(), measured step or not (a step without
    one is measured at once, as without background), and write no parameter between after_step
    and the next call. A parameter written in place meanwhile (its torch version changed: an
    optimizer, copy_, load_state_dict; not a write through .data) raises StateError at that call
    and that step's row is not written. An error of the measurement itself is raised at that
    call too, as the exception after_step would have raised, its message naming the step.
    priority='idle' (with background=True) runs the measurement at SCHED_IDLE, taking only CPU
    time the training leaves, until that next call raises it back; only where the process may
    raise a thread back (CAP_SYS_NICE; else a RuntimeWarning, and normal priority).
    background_priority says which ("idle: ..." or "normal: ..."). It pays where the training
    leaves cores idle; a BLAS or OpenMP runtime that spins between products leaves none, and on
    cores other programs keep busy it costs more than normal priority: see
    docs/manual/python.md."""

    def __init__(self, model, trace=None, heads=None, every=1, kv_heads=None, head_dim=None, tie=None,
                 out_major=False, kinds=None, layouts=None, tol=1e-3, threads=None, tight="centred",
                 run_config=None, scalars=("loss", "lr"), flush_every=0, if_exists="fail", strict=False,
                 background=False, priority="normal", _named=None, _on_device=False):
        self._m = ctypes.c_void_p()
        self._trace = ctypes.c_void_p()
        self._pending = None  # background: (future, step, versions, row, snapshot, pid, ticket) of the job running
        self._worker = None
        if not isinstance(background, bool):
            raise TypeError("Monitor: background=%r: expected True or False" % (background,))
        self.background = background
        choice(priority, "Monitor: priority", self.PRIORITIES)
        if priority == "idle" and not background:
            raise ValueError("Monitor: priority='idle' is the background measurement's: give background=True too")
        # background: whether the measurement runs at idle priority while the training runs
        self._idle = False
        self._ticket = 0  # background: the number of the last job started (stab_monitor_hurry's)
        self.background_priority = None
        if background:
            allowed, why = idle_priority()
            self._idle = priority == "idle" and allowed
            if priority == "normal":
                why = "Monitor(priority='normal')"
            elif not allowed:
                warnings.warn("Monitor(priority='idle'): measuring at normal priority: %s" % why, RuntimeWarning,
                              stacklevel=2)
            self.background_priority = ("idle: " if self._idle else "normal: ") + why
        self.every = integer(every, "Monitor: every", 1, C_INT64[1], "every N >= 1 steps")
        flush_every = integer(flush_every, "Monitor: flush_every", 0, C_INT[1], "0 (the library's) or N >= 1 rows")
        tight_code = choice(tight, "Monitor: tight", TIGHT_METHODS)
        choice(if_exists, "Monitor: if_exists", self.IF_EXISTS)
        self._model = None
        plan = None
        if _named is None:
            if not hasattr(model, "named_parameters"):
                raise TypeError("Monitor: expected a torch.nn.Module, got %s (Monitor.from_state_dict "
                                "takes a state dict)" % type(model).__name__)
            model = _unwrap(model)
            plan = _Plan(model)
            named = list(model.named_parameters())
            have = {n for n, _ in named}
            by_name = dict(_all_params(model))
            for pair in plan.tied:  # both names of a shared table: named_parameters() gives one
                named += [(n, by_name[n]) for n in pair if n not in have]
                have.update(pair)
            module_names = [n for n, _ in model.named_modules()]
            self._source = weakref.ref(model)  # the monitor does not keep the model alive
        else:
            named, self._source = _strip_prefixes(list(_named)), None
            module_names = sorted({n.rpartition(".")[0] for n, _ in named})
        c_heads, c_kv, c_hd, c_tie = _config_heads(model) if model is not None else (None,) * 4
        mha = plan.mha_heads(heads) if plan is not None else None
        heads_source = ("heads=" if heads else "nn.MultiheadAttention %r (num_heads)" % plan.heads[0][0] if mha
                        else "model.config" if c_heads else None)
        heads, kv_heads = heads or mha or c_heads or 0, kv_heads or c_kv or 0
        head_dim = head_dim or c_hd or 0
        tie = c_tie if tie is None else tie
        views, ptrs = [], {}
        # parameters off the CPU: host copies for the description and the C monitor's layers,
        # linear layers measured where they are (_device.Mirrors; _on_device: CPU ones too, for tests)
        self._mirrors = _Mirrors(_on_device)
        self._mirrors.tol = tol
        refused = plan.refused if plan is not None else {}
        for name, p in named:
            if plan is not None and name in plan.views:
                p = plan.views[name]  # a convolution's [C_out][C_in*prod(k)]: the same memory
            if name not in refused and not p.is_contiguous():
                raise TypeError("Monitor: parameter %s is not contiguous (strides %s)" % (name, p.stride()))
            if p.numel() and p.data_ptr() % p.element_size():
                raise TypeError("Monitor: parameter %s: its data at address %#x is not aligned to its %d-byte "
                                "elements; C reads whole elements (give the module a copy)"
                                % (name, p.data_ptr(), p.element_size()))
            ptrs[name] = p.data_ptr()
            views.append((name, self._mirrors.host(p.detach(), name)))  # keeps the storage alive whatever the model does
        self._views = views
        self._ptrs = ptrs
        user_kinds = _expand_kinds(kinds, views, module_names) if kinds else []
        layouts = overrides(layouts, "Monitor: layouts", LAYOUT_OVERRIDES)  # the caller's first: first match wins
        if plan is not None:
            layouts += plan.layouts
        described = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, tie=-1 if tie is None else int(tie),
                         out_major=out_major, layouts=layouts, heads_source=heads_source)
        module_kinds = _module_kinds(plan, views, user_kinds, described) if plan is not None else []
        self._model = Model(views, kinds=user_kinds + module_kinds, **described)
        params = lib.stab_monitor_default_params()
        params.metrics.spectral = _spectral_params(tol, "lanczos", None, threads, "Monitor")
        params.metrics.tight = tight_code
        params.update_mode = UPDATE_SNAPSHOT
        check(lib.stab_monitor_create(ctypes.byref(params), ctypes.byref(self._m)))
        self.skipped = {}  # tensor name -> why the rules do not measure it
        self.layers = []   # (name, kind) in registration order
        try:
            found_pair = False
            for e in self._model.entries:
                found_pair |= KIND_NAMES.get(e.c.kind) == "attention"
                if e.why_not is not None:
                    self.skipped[e.name] = refused.get(e.name) or _python_words(e.why_not)
                    continue
                if e.n_expert:
                    continue  # a layer of experts: its experts are the entries after it
                # the C views' own types: an expert's slice of a 3-D tensor is no tensor of ours
                types = {t.contents.dtype_name.decode("ascii", "replace"): t.contents.dtype
                         for t in (e.c.weight, e.c.bias, e.c.weight_k) if t}
                if len(types) > 1:
                    self.skipped[e.name] = ("its tensors are of different types (%s): a layer is read in one "
                                            "type (model.to(dtype))" % ", ".join(sorted(types)))
                    continue
                layer = self._model.layer(e, types.popitem()[1])
                if not self._mirrors.add(self._m, layer, e.kind):
                    check(lib.stab_monitor_add_layer(self._m, ctypes.byref(layer), None))
                self.layers.append((e.name, e.kind))
            if not self.layers:
                raise ValueError("Monitor: no parameter is a layer; " + self._unmeasured()[len("Monitor: "):])
            self._say_unmeasured(strict)
            if heads_source in ("heads=", "model.config") and not found_pair:
                warnings.warn("Monitor(heads=%d): no query/key pair found (by module or by name), so no attention "
                              "layer is bound; the heads are unused" % heads, UserWarning, stacklevel=2)
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
        # background: the tensors whose torch versions say whether a parameter was written, the
        # versions at the last snapshot a background job took (None: none valid), and the step
        # whose before_step was called since the last after_step
        self._watch = [self._mirrors.device_of(v) for _, v in self._views]
        self._pre_snapshot = None
        self._before = None

    def _say_unmeasured(self, strict):
        """One warning (strict: ValueError) naming what is not measured and the share of the
        parameters' elements that is: a skipped tensor must never pass unsaid."""
        if not self.skipped:
            return
        msg = self._unmeasured()
        if strict:
            raise ValueError(msg.replace("; Monitor(strict=True) raises instead of this warning", ""))
        warnings.warn(msg, UnmeasuredWarning, stacklevel=3)

    def _unmeasured(self):
        """The share of the parameters' elements measured, and the first names not measured."""
        total = measured = 0
        spans = sorted(self._model.read_spans())
        seen = set()
        for _, v in self._views:
            key = (v.data_ptr(), v.numel())
            if key in seen:
                continue  # a shared table counts once
            seen.add(key)
            total += v.numel()
            lo, hi = v.data_ptr(), v.data_ptr() + v.numel() * v.element_size()
            # the elements of v that some measured layer reads
            covered, at = 0, lo
            for s0, s1 in spans:
                s0, s1 = max(s0, at), min(s1, hi)
                if s1 > s0:
                    covered += s1 - s0
                    at = s1
            measured += covered // max(v.element_size(), 1)
        shown = list(self.skipped.items())[:5]
        more = len(self.skipped) - len(shown)
        return ("Monitor: %d of %d parameters (%.1f%%) measured; not measured: %s%s. Monitor(kinds={name: kind}) "
               "decides a kind; Monitor(strict=True) raises instead of this warning"
               % (measured, total, 100.0 * measured / total if total else 0.0,
                  "; ".join("%s (%s)" % kv for kv in shown), " and %d more" % more if more else ""))

    @classmethod
    def from_state_dict(cls, state_dict, heads=None, trace=None, **kw):
        """A monitor of the tensors of a state dict (a checkpoint in memory), its names without a
        wrapper's prefix (module., _orig_mod.) that all have. Float tensors that are not float32,
        float16 or bfloat16, or not contiguous, are measured from a float32 copy made here (the
        dict's own memory otherwise); call measure() for the metrics, or after_step to trace them."""
        named = []
        for name, t in state_dict.items():
            if not isinstance(t, _torch.Tensor):
                continue
            t = t.detach()
            if t.device.type != "cpu":
                raise TypeError("from_state_dict: tensor %s is on %s; pass a CPU state dict "
                                "(torch.load(..., map_location='cpu'))" % (name, t.device))
            if t.is_floating_point() and (t.dtype not in (_torch.float32, _torch.float16, _torch.bfloat16)
                                          or not t.is_contiguous()):
                t = t.to(_torch.float32).contiguous()
            if t.numel() and t.data_ptr() % t.element_size():
                t = t.clone()  # aligned storage: C reads whole elements
            named.append((name, t))
        return cls(None, trace=trace, heads=heads, _named=named, **kw)

    # ---- the trace -------------------------------------------------------------------------

    # What trace= may do to a file already there (stab_output_mode, the rule every stabmeter
    # writer keeps): a new Monitor cannot know that its steps continue that trace's run (the
    # same layers are not the same run), so it refuses unless asked, as pandas' to_sql does.
    PRIORITIES = {"normal": 0, "idle": 1}
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
        now = {name: p.data_ptr() for name, p in _all_params(model)}
        for name, ptr in self._ptrs.items():
            if now.get(name) != ptr:
                what = "is gone" if name not in now else "has moved (model.to(), .data reassigned or a module replaced)"
                raise _lib.error_for(-6, "Monitor: parameter %s %s: the monitor reads it where it was "
                                     "registered; create a new Monitor" % (name, what))

    def measures(self, step):
        return step is None or integer(step, "Monitor: step", *C_INT64) % self.every == 0

    def _measures_next(self, step):
        """Whether the step after step (an integer, checked by measures) is measured."""
        return step < C_INT64[1] and (step + 1) % self.every == 0

    def before_step(self, step=None):
        """Call just before optimizer.step(): snapshots the weights when step will be measured
        (every `every` steps; always when step is None), for the update metrics. With
        background=True, first waits for the last measurement (see wait()), whose snapshot it
        uses when no parameter was written since."""
        self._wait()
        self.check_parameters()
        self._before = True
        if self.measures(step):
            self._mirrors.refresh()
            self._mirrors.snapshot()
            if self._pre_snapshot is None or self._written(self._pre_snapshot) is not None:
                check(lib.stab_monitor_snapshot(self._m))
            self._pre_snapshot = None
            self._snapshot = True

    def after_step(self, step, loss=None, lr=None, scalars=None):
        """Call just after optimizer.step(): when step is measured (step % every == 0) measures
        every layer (with the update metrics when before_step took a snapshot) and appends a trace
        row with the scalars (loss, lr, or a dict by name). Returns True when it measured (with
        background=True: started measuring, when before_step was called for this step)."""
        self._wait()
        self.check_parameters()
        before, self._before = self._before, None
        background = self.background and before
        if not self.measures(step):
            if background and self._measures_next(step):
                self._start(step, False, 0, None, True)  # the next step's snapshot, as its before_step would take it
            return False
        if not self._snapshot and not self._warned_no_snapshot:
            # the C monitor refuses an update without a snapshot; here the step is still
            # measured, but a loop that never calls before_step would get NaN updates unsaid
            self._warned_no_snapshot = True
            warnings.warn("Monitor.after_step(%s): no before_step(%s) since the last measurement, so this "
                          "step has no update metrics (NaN); call monitor.before_step(step) just before "
                          "optimizer.step() (said once per Monitor)" % (step, step), RuntimeWarning, stacklevel=2)
        self._mirrors.refresh()
        if background:
            # the row's arguments are checked now, at this call; the row is appended by the call
            # that waits for the measurement, once no parameter was written while it ran
            row = self._row(step, loss, lr, scalars, True) if self._trace else None
            with_update = 1 if self._snapshot else 0
            self._mirrors.measure(self._m, self._snapshot)
            self._snapshot = False
            self.steps += 1
            self._start(step, True, with_update, row, self._measures_next(step))
            return True
        check(lib.stab_monitor_measure(self._m, 1 if self._snapshot else 0))
        self._mirrors.measure(self._m, self._snapshot)
        self._snapshot = False
        self.steps += 1
        if self._trace:
            check(lib.stab_trace_append(self._trace, *self._row(step, loss, lr, scalars, False)))
        return True

    def _row(self, step, loss, lr, scalars, ahead):
        """stab_trace_append's step, wall time and scalars for after_step's arguments. ahead: the
        row is appended later, so its step is checked against the trace's last step now."""
        values = dict(scalars or {})
        if loss is not None:
            values["loss"] = loss
        if lr is not None:
            values["lr"] = lr
        unknown = set(values) - set(self._scalars)
        if unknown:
            raise ValueError("after_step: scalars %s were not declared (Monitor(scalars=...): %s)"
                             % (sorted(unknown), self._scalars))
        step = integer(step, "after_step: step", *C_INT64)
        row = (ctypes.c_double * max(len(self._scalars), 1))(*[float(values.get(s, math.nan)) for s in self._scalars])
        if ahead:
            last = ctypes.c_int64()
            if lib.stab_trace_last_step(self._trace, ctypes.byref(last)) == 0 and step <= last.value:
                raise _lib.error_for(-8, "after_step: %s: step %d is not after the last step %d (steps must "
                                     "increase)" % (self.trace_path, step, last.value))
        return step, time.monotonic() - self._t0, row, None

    # ---- background=True -------------------------------------------------------------------

    def _versions(self):
        return [t._version for t in self._watch]

    def _written(self, versions):
        """The name of the first parameter written in place since versions were taken, or None."""
        for (name, _), t, v in zip(self._views, self._watch, versions):
            if t._version != v:
                return name
        return None

    def _start(self, step, measure, with_update, row, snapshot):
        """Starts step's measurement (measure) and the next step's snapshot (snapshot) on the
        monitor's thread; the next call waits for them (_wait)."""
        if self._worker is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stabmeter-monitor")
        versions = self._versions()
        self._ticket += 1
        if not self._idle:  # hurried before it starts: measured at this thread's own priority
            lib.stab_monitor_hurry(self._m, self._ticket)
        job = self._worker.submit(_measure_job, self._m.value, self._ticket, measure, with_update, snapshot)
        self._pending = (job, step, versions, row, snapshot, os.getpid(), self._ticket)

    def wait(self):
        """background=True: waits for the measurement after_step started, then appends its trace
        row; raises its error, or StateError when a parameter was written while it ran (the row is
        then not written). Every other call of the monitor does this first; returns at once when
        nothing runs."""
        self._wait()

    def _wait(self, closing=False):
        job, self._pending = self._pending, None
        if job is None:
            return
        job, step, versions, row, snapshot, pid, ticket = job
        if pid != os.getpid():
            # a child forked while the job ran: its thread is the parent's, not here
            self._worker = None
            if closing:
                return
            raise _lib.error_for(-6, "Monitor(background=True): step %s is measured by process %d, which this "
                                 "process was forked from while it ran; this copy of the monitor cannot wait for "
                                 "it (close it; the parent's monitor goes on)" % (step, pid))
        lib.stab_monitor_hurry(self._m, ticket)  # the training waits now: back to the thread's priority
        failed = job.result()
        if failed is not None:
            status, message = failed
            raise _lib.error_for(status, "Monitor.after_step(%s), measured in the background: %s" % (step, message))
        name = self._written(versions)
        if name is not None:
            raise _lib.error_for(-6, "Monitor(background=True): parameter %s was written in place after "
                                 "after_step(%s) and before this call, while the monitor read it on its thread: "
                                 "call before_step(step) before every optimizer.step(), measured step or not, "
                                 "and write no parameter in between; step %s's row is not written and its "
                                 "metrics are not those of one state of the weights" % (name, step, step))
        if snapshot:
            self._pre_snapshot = versions
        if row is not None:
            check(lib.stab_trace_append(self._trace, *row))

    def measure(self):
        """Measures every layer now, without update metrics, and returns metrics()."""
        self._wait()
        self.check_parameters()
        self._mirrors.refresh()
        check(lib.stab_monitor_measure(self._m, 0))
        self._mirrors.measure(self._m, False)
        return self.metrics()

    def metrics(self, frame=False):
        """The last measurement: {layer name: {kind, layout, d_in, d_out, forward, ..., flags}}
        (attention layers also head_bounds), or with frame=True a pandas DataFrame, one row per
        layer indexed by name."""
        self._check_open()
        self._wait()
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
        self._wait()
        out = {}
        for i, (name, _) in enumerate(self.layers):
            r = lib.stab_monitor_reference(self._m, i).contents
            out[name] = {"forward": r.forward, "dependency": r.dependency, "update": r.update}
        return out

    def flush(self):
        self._wait()
        if self._trace:
            check(lib.stab_trace_flush(self._trace))

    def close(self):
        """Closes the trace (every row written) and frees the monitor; safe to call twice. With
        background=True, waits first (see wait()): its error is raised once the rest is closed."""
        status, failed = 0, None
        if getattr(self, "_pending", None) is not None:
            try:
                self._wait(closing=True)
            except BaseException as e:  # noqa: B902 -- raised below, once everything is closed
                failed = e
        if getattr(self, "_worker", None) is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        if getattr(self, "_trace", None):
            status = lib.stab_trace_close(self._trace)
            self._trace = ctypes.c_void_p()
        if getattr(self, "_m", None):
            lib.stab_monitor_free(self._m)
            self._m = ctypes.c_void_p()
        if getattr(self, "_model", None) is not None:
            self._model.close()
        if failed is not None:
            raise failed
        check(status)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if getattr(self, "_pending", None) is not None and threading.get_ident() in _JOB_THREADS:
                # collected on the monitor's own thread (a cycle, by the garbage collector during a
                # job): close would wait there for that very job, so another thread closes it
                threading.Thread(target=self._close_quietly, name="stabmeter-monitor-close").start()
                return
            self.close()
        except Exception:
            pass

    def _close_quietly(self):
        try:
            self.close()
        except Exception:
            pass
