"""What each tensor of a model is, by the library's kind rules (stab_model_describe), for
tensors the caller holds in memory: a PyTorch model's parameters or a state dict. The rules
live in lib/model/kind_rules.c alone; this only builds the stab_ckpt_tensor views they read."""

import ctypes

from . import _lib
from ._arrays import C_SIZE, integer, overrides
from ._lib import (DTYPE_BF16, DTYPE_F16, DTYPE_F32, DTYPE_OTHER, KIND_NAMES, KIND_OVERRIDES, LAYOUT_NAMES,
                   LAYOUT_OVERRIDES, NAMING_HF, check, lib)


def _torch_dtype_code(t):
    import torch
    return {torch.float32: (DTYPE_F32, "F32"), torch.float16: (DTYPE_F16, "F16"),
            torch.bfloat16: (DTYPE_BF16, "BF16")}.get(t.dtype, (DTYPE_OTHER, str(t.dtype).replace("torch.", "").upper()))


class Entry:
    """One entry of the description: a layer (kind set, why_not None) or a tensor not measured."""

    __slots__ = ("name", "kind", "layout", "d_in", "d_out", "heads", "kv_heads", "tied", "n_expert",
                 "tensor", "bias", "tensor_k", "why_not", "c")

    def __repr__(self):
        return "Entry(%r, %s%s)" % (self.name, self.kind, ", not measured: %s" % self.why_not if self.why_not else "")


class Model:
    """The description of named tensors [(name, torch tensor)], each on the CPU and contiguous.
    Keeps the views, their names and the C model alive together; close() frees the C model."""

    def __init__(self, named, heads=0, kv_heads=0, head_dim=0, tie=-1, out_major=False, kinds=None,
                 layouts=None, heads_source=None, fn="Monitor"):
        self._c = ctypes.c_void_p()
        fn += ": "
        heads = integer(heads or 0, fn + "heads", 0, C_SIZE[1], "0 or None (from model.config) or more")
        kv_heads = integer(kv_heads or 0, fn + "kv_heads", 0, C_SIZE[1], "0 or None (= heads) or more")
        head_dim = integer(head_dim or 0, fn + "head_dim", 0, C_SIZE[1], "0 or None (d_out / heads) or more")
        tie = integer(-1 if tie is None else int(tie) if isinstance(tie, bool) else tie, fn + "tie", -1, 1,
                      "None, False or True")
        kinds = overrides(kinds, fn + "kinds", KIND_OVERRIDES)
        layouts = overrides(layouts, fn + "layouts", LAYOUT_OVERRIDES)
        self.names = [n for n, _ in named]
        self.tensors = [t for _, t in named]
        n = len(named)
        self._c_tensors = (_lib.CkptTensor * n)()
        self._encoded = []  # the bytes every char * of the views and config points into
        for i, (name, t) in enumerate(named):
            ct = self._c_tensors[i]
            code, dtname = _torch_dtype_code(t)
            nb, db = name.encode("utf-8"), dtname.encode("ascii")
            self._encoded += [nb, db]
            ct.name, ct.dtype_name, ct.dtype = nb, db, code
            ct.elem_size = t.element_size()
            if t.dim() > _lib.STAB_CKPT_MAX_DIMS:
                code = ct.dtype = DTYPE_OTHER  # no rule reads it; described as not measured
            ct.ndim = min(t.dim(), _lib.STAB_CKPT_MAX_DIMS)
            for d in range(ct.ndim):
                ct.shape[d] = t.shape[d]
            ct.count = t.numel()
            ct.data = t.data_ptr() if t.numel() else None
        self._ptrs = (ctypes.POINTER(_lib.CkptTensor) * max(n, 1))()
        for i in range(n):
            self._ptrs[i] = ctypes.pointer(self._c_tensors[i])
        cfg = lib.stab_model_default_config()
        cfg.naming = NAMING_HF
        cfg.out_major = 1 if out_major else 0
        cfg.heads, cfg.kv_heads, cfg.head_dim = heads, kv_heads, head_dim
        if heads_source:
            hs = heads_source.encode("utf-8")
            self._encoded.append(hs)
            cfg.heads_source = hs
        cfg.tie = tie
        self._overrides = []
        for field, count, pairs in (("kinds", "nkinds", kinds), ("layouts", "nlayouts", layouts)):
            if pairs:
                arr = (_lib.ModelOverride * len(pairs))()
                for j, (glob, value) in enumerate(pairs):
                    g, v = glob.encode("utf-8"), value.encode("utf-8")
                    self._encoded += [g, v]
                    arr[j].glob, arr[j].value = g, v
                self._overrides.append(arr)
                setattr(cfg, field, arr)
                setattr(cfg, count, len(pairs))
        self._cfg = cfg
        check(lib.stab_model_describe(self._ptrs, n, ctypes.byref(cfg), ctypes.byref(self._c)))
        by_address = {ctypes.addressof(self._c_tensors[i]): i for i in range(n)}

        def index_of(p):
            return by_address.get(ctypes.addressof(p.contents)) if p else None

        self.entries = []
        for i in range(lib.stab_model_count(self._c)):
            c = lib.stab_model_entry_at(self._c, i).contents
            e = Entry()
            e.c = c
            e.name = c.name.decode("utf-8")
            e.why_not = c.why_not.decode("utf-8") if c.why_not else None
            e.kind = None if e.why_not else KIND_NAMES.get(c.kind)
            e.layout = LAYOUT_NAMES.get(c.layout)
            e.d_in, e.d_out, e.heads, e.kv_heads = c.d_in, c.d_out, c.heads, c.kv_heads
            e.tied, e.n_expert = bool(c.tied), c.n_expert
            e.tensor, e.bias, e.tensor_k = index_of(c.weight), index_of(c.bias), index_of(c.weight_k)
            self.entries.append(e)

    def layer(self, e, dtype=DTYPE_F32):
        """The stab_layer of a measured entry, reading the tensors' own memory, stored as dtype
        (DTYPE_F32, _F16 or _BF16: the tensors' own type)."""
        out = _lib.Layer()
        c = e.c
        check(lib.stab_model_entry_layer(ctypes.byref(c), dtype, c.weight.contents.data,
                                         c.bias.contents.data if c.bias else None,
                                         c.weight_k.contents.data if c.weight_k else None, ctypes.byref(out)))
        return out

    def read_spans(self):
        """[(first byte, past the last)] of the memory the measured entries read."""
        out = []
        for e in self.entries:
            if e.why_not is None and not e.n_expert:
                for t in (e.c.weight, e.c.bias, e.c.weight_k):
                    if t and t.contents.data:
                        t = t.contents
                        out.append((t.data, t.data + t.count * t.elem_size))
        return out

    def close(self):
        if getattr(self, "_c", None):
            lib.stab_model_free(self._c)
            self._c = ctypes.c_void_p()
            self.entries = []

    def __del__(self):
        self.close()
