"""The pure functions of one matrix or one layer: stabmeter.sigma and stabmeter.layer_metrics,
over stab_sigma and stab_layer_metrics, reading the caller's arrays in place."""

import ctypes

from . import _lib
from ._arrays import C_INT, C_SIZE, choice, integer, need_shape, view
from ._lib import DTYPE_F32, KINDS, LAYOUTS, SPECTRAL_METHODS, TIGHT_METHODS, check, lib


def _spectral_params(tol, method, max_passes, threads, fn="sigma"):
    """The stab_spectral_params of the Python arguments of fn (named in every error): each fits
    its C field here; its bounds within are the library's to check (STAB_EINVAL names them)."""
    p = lib.stab_spectral_default_params()
    p.method = choice(method, fn + ": method", SPECTRAL_METHODS)
    p.tol = float(tol)
    if max_passes is not None:
        p.max_passes = integer(max_passes, fn + ": max_passes", *C_INT)
    if threads is not None:
        p.threads = integer(threads, fn + ": threads", *C_INT)
    return p


def sigma(array, tol=1e-3, method="lanczos", max_passes=None, threads=None, full=False):
    """The spectral norm (largest singular value) of a 2-D float32 array, numpy or CPU torch,
    read in place: C-contiguous, or rows of a wider array (a row stride, unit column stride).
    tol: target relative error; method "lanczos" (default), "power" or "exact" (LAPACK, f64).
    Returns the estimate, or with full=True a dict: sigma, rel_err, passes, converged,
    nonfinite. A matrix holding NaN or Inf gives NaN (nonfinite 1), not an error."""
    v = view(array, "sigma: array", ndims=(2,), dtypes=(DTYPE_F32,))
    params = _spectral_params(tol, method, max_passes, threads, "sigma")
    out = _lib.SigmaResult()
    check(lib.stab_sigma(v.ptr, v.shape[0], v.shape[1], v.ld, ctypes.byref(params), None, ctypes.byref(out)))
    if not full:
        return out.sigma
    return {"sigma": out.sigma, "rel_err": out.rel_err, "passes": out.passes,
            "converged": bool(out.converged), "nonfinite": bool(out.nonfinite)}


def _fill_shape(layer, kind, layout, w, what):
    """The sizes of the stab_layer of kind from its weight's shape and layout."""
    if kind in ("gain", "bias"):
        if len(w.shape) != 1:
            raise ValueError("%s: a %s is 1-D, got shape %s" % (what, kind, w.shape))
        layer.d_in = layer.d_out = w.shape[0]
        return
    if len(w.shape) != 2:
        raise ValueError("%s: a %s weight is 2-D, got shape %s" % (what, kind, w.shape))
    rows, cols = w.shape
    if kind == "embedding":  # one token's vector per row unless out-major
        layer.vocab, layer.width = (cols, rows) if layout == "out_major" else (rows, cols)
    elif kind == "lm_head":  # one class's vector per row unless in-major
        layer.vocab, layer.width = (cols, rows) if layout == "in_major" else (rows, cols)
    else:  # linear, attention: out-major [d_out][d_in] unless in-major
        layer.d_in, layer.d_out = (rows, cols) if layout == "in_major" else (cols, rows)


def layer_metrics(kind, weight, before=None, bias=None, before_bias=None, weight_k=None, heads=None,
                  kv_heads=None, layout="natural", scale=0.0, tol=1e-3, method="lanczos",
                  tight="centred", threads=None, name=None):
    """Every metric of one layer (stab_layer_metrics), as a dict with stab_metrics' fields
    (forward, dependency, update, ..., flags; NaN where a metric does not apply) and, for
    attention, head_bounds (one per head).
    kind: linear, embedding, lm_head, gain, bias or attention. weight: the weights after the
    step, float32, float16 or torch.bfloat16, numpy or CPU torch, read in place:
      linear, attention  [d_out][d_in] (PyTorch nn.Linear), or [d_in][d_out] with layout="in_major"
      embedding, lm_head [V][d], one token's (class's) vector per row
      gain, bias         [d]
    before (and before_bias): the same layer's weights before the step, for the update metrics.
    bias: a linear layer's bias [d_out]. Attention: weight the query projection, weight_k the key
    projection, heads the query heads, kv_heads the key heads (default: from weight_k's rows)."""
    fn = "layer_metrics: "
    kind_code = choice(kind, fn + "kind", KINDS)
    layout_code = choice(layout, fn + "layout", LAYOUTS)
    tight_code = choice(tight, fn + "tight", TIGHT_METHODS)
    nd = (1,) if kind in ("gain", "bias") else (2,)
    w = view(weight, fn + "weight", ndims=nd)
    keep = [w]  # every view whose memory C reads, alive until the call returns
    layer = _lib.Layer()
    layer.kind = kind_code
    layer.layout = layout_code
    layer.dtype = w.dtype
    layer.weight = w.ptr
    layer.ld = w.ld
    if name is not None:
        if not isinstance(name, str):
            raise TypeError("%sname=%r: expected a str" % (fn, name))
        layer.name = name.encode("utf-8")
    _fill_shape(layer, kind, layout, w, fn + "weight")
    if bias is not None:
        if kind != "linear":
            raise ValueError("layer_metrics: bias is a linear layer's (kind %s has none)" % kind)
        b = view(bias, fn + "bias", ndims=(1,), dtypes=(w.dtype,))
        need_shape(b, fn + "bias", (layer.d_out,), "the weight has %d outputs" % layer.d_out)
        layer.bias = b.ptr
        keep.append(b)
    n_heads = 0
    if kind == "attention":
        if weight_k is None or heads is None:
            raise ValueError("layer_metrics: attention needs weight_k (the key projection) and heads")
        k = view(weight_k, fn + "weight_k", ndims=(2,), dtypes=(w.dtype,))
        n_heads = integer(heads, fn + "heads", 1, C_SIZE[1], "a positive number of query heads")
        layer.heads = n_heads
        if kv_heads is not None:
            kv_heads = integer(kv_heads, fn + "kv_heads", 1, n_heads,
                               "1 to heads=%d key heads (None: from weight_k's rows)" % n_heads)
        # One stab_layer has one row stride: the key must be stored as the query is.
        if (k.ld or k.cols) != (w.ld or w.cols):
            raise ValueError("layer_metrics: weight_k has shape %s (row stride %d), the query %s (%d): "
                             "both are read with one layout and row stride" % (k.shape, k.ld or k.cols,
                                                                             w.shape, w.ld or w.cols))
        if layer.d_out % n_heads == 0:  # else the library refuses the heads before reading
            dh = layer.d_out // n_heads
            k_out = k.shape[1] if layout == "in_major" else k.shape[0]
            if kv_heads is None:
                if k_out % dh:
                    raise ValueError("layer_metrics: weight_k has %d rows (outputs), not whole heads of "
                                     "head_dim %d (the weight's %d outputs / heads=%d)"
                                     % (k_out, dh, layer.d_out, n_heads))
                kv_heads = k_out // dh
            # every side C reads the key by: kv_heads heads of dh outputs, d_in inputs each
            want = (layer.d_in, kv_heads * dh) if layout == "in_major" else (kv_heads * dh, layer.d_in)
            need_shape(k, fn + "weight_k", want,
                       "kv_heads=%d key heads of head_dim %d (the weight's %d outputs / heads=%d) over "
                       "%d inputs" % (kv_heads, dh, layer.d_out, n_heads, layer.d_in))
        layer.kv_heads = kv_heads or 0
        layer.weight_k = k.ptr
        layer.scale = float(scale)
        keep.append(k)
    elif weight_k is not None or heads is not None or kv_heads is not None:
        raise ValueError("layer_metrics: weight_k, heads and kv_heads are attention's (kind %s)" % kind)
    prev = None
    if before is not None:
        bv = view(before, fn + "before", ndims=nd)
        need_shape(bv, fn + "before", w.shape, "the weight's shape")
        if bv.ld != w.ld:
            raise ValueError("layer_metrics: before has row stride %d, weight %d: the library reads both "
                             "with one row stride" % (bv.ld or bv.cols, w.ld or w.cols))
        prev = _lib.Layer()
        prev.dtype = bv.dtype
        prev.weight = bv.ptr
        keep.append(bv)
        if before_bias is not None:
            if bias is None:
                raise ValueError("layer_metrics: before_bias needs a bias of the same length")
            bb = view(before_bias, fn + "before_bias", ndims=(1,), dtypes=(bv.dtype,))
            need_shape(bb, fn + "before_bias", (layer.d_out,), "the weight has %d outputs" % layer.d_out)
            prev.bias = bb.ptr
            keep.append(bb)
        elif bias is not None:
            raise ValueError("layer_metrics: with bias and before, give before_bias too")
    elif before_bias is not None:
        raise ValueError("layer_metrics: before_bias without before")
    params = lib.stab_metrics_default_params()
    params.spectral = _spectral_params(tol, method, None, threads, "layer_metrics")
    params.tight = tight_code
    out = _lib.Metrics()
    heads_out = (ctypes.c_double * n_heads)() if n_heads else None
    check(lib.stab_layer_metrics(ctypes.byref(layer), ctypes.byref(prev) if prev is not None else None,
                                 ctypes.byref(params), ctypes.byref(out), heads_out))
    del keep
    d = _lib.metrics_dict(out)
    d["kind"] = kind
    if n_heads:
        d["head_bounds"] = list(heads_out)
    return d

