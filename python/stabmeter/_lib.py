"""libstabmeter through ctypes: finding the library, its structs as the header lays them out,
the prototypes of the functions the package calls, and statuses turned into exceptions."""

import ctypes
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_int, c_int64, c_size_t, c_uint64,
                    c_void_p)

from ._errors import error_for


def _library_path():
    # The build tree's tests name the library they built; an installed package knows the
    # exact file configure and libtool made (_paths.py, written at build time).
    path = os.environ.get("STABMETER_LIBRARY")
    if path:
        return path
    try:
        from ._paths import LIBRARY
    except ImportError:
        raise ImportError("stabmeter: this package was not installed by `make install` (no _paths.py): "
                          "set STABMETER_LIBRARY to the path of libstabmeter.so.N") from None
    return LIBRARY


def _load():
    path = _library_path()
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise ImportError("stabmeter: cannot load the C library %s: %s" % (path, e)) from None


lib = _load()
LIBRARY_PATH = _library_path()

# ---- structs, field for field as include/stabmeter.h has them -----------------------------

STAB_CKPT_MAX_DIMS = 8


class SpectralParams(Structure):
    _fields_ = [("method", c_int), ("tol", c_double), ("max_passes", c_int), ("krylov_dim", c_int),
                ("threads", c_int), ("seed", c_uint64)]


class SigmaResult(Structure):
    _fields_ = [("sigma", c_double), ("rel_err", c_double), ("passes", c_int), ("converged", c_int),
                ("nonfinite", c_int)]


METRIC_FIELDS = ("forward", "dependency", "update", "forward_tight", "dependency_tight",
                 "update_tight", "spread", "sigma", "sigma_rel_err", "sigma_update",
                 "sigma_update_rel_err", "rel_update")
COUNT_FIELDS = ("passes", "update_passes", "tight_method", "flags")


class Metrics(Structure):
    _fields_ = [(f, c_double) for f in METRIC_FIELDS] + [(f, c_int) for f in COUNT_FIELDS]


class Layer(Structure):
    _fields_ = [("name", c_char_p), ("kind", c_int), ("d_in", c_size_t), ("d_out", c_size_t),
                ("vocab", c_size_t), ("width", c_size_t), ("layout", c_int), ("ld", c_size_t),
                ("weight", c_void_p), ("bias", c_void_p), ("weight_k", c_void_p), ("heads", c_size_t),
                ("scale", c_double), ("kv_heads", c_size_t), ("dtype", c_int)]


class MetricsParams(Structure):
    _fields_ = [("spectral", SpectralParams), ("tight", c_int)]


class MonitorParams(Structure):
    _fields_ = [("metrics", MetricsParams), ("update_mode", c_int)]


class TraceParams(Structure):
    _fields_ = [("flush_every", c_int), ("flush_seconds", c_double), ("run_config", c_char_p),
                ("scalars", POINTER(c_char_p)), ("n_scalars", c_size_t),
                ("layer_extras", POINTER(c_char_p)), ("n_layer_extras", c_size_t),
                ("on_error", c_int), ("append", c_int), ("resume_step", c_int64)]


class TraceReadParams(Structure):
    _fields_ = [("layer_globs", POINTER(c_char_p)), ("n_layer_globs", c_size_t),
                ("metrics", POINTER(c_char_p)), ("n_metrics", c_size_t)]


class TraceAttr(Structure):
    _fields_ = [("name", c_char_p), ("text", c_char_p), ("value", c_int64)]


class CkptTensor(Structure):
    _fields_ = [("name", c_char_p), ("dtype_name", c_char_p), ("dtype", c_int), ("elem_size", c_size_t),
                ("ndim", c_size_t), ("shape", c_uint64 * STAB_CKPT_MAX_DIMS), ("count", c_uint64),
                ("data", c_void_p), ("offset", c_uint64)]


class ModelOverride(Structure):
    _fields_ = [("glob", c_char_p), ("value", c_char_p)]


class ModelConfig(Structure):
    _fields_ = [("naming", c_int), ("out_major", c_int), ("heads", c_size_t), ("kv_heads", c_size_t),
                ("head_dim", c_size_t), ("heads_source", c_char_p), ("heads_error", c_char_p),
                ("tie", c_int), ("other_names", POINTER(c_char_p)), ("n_other", c_size_t),
                ("kinds", POINTER(ModelOverride)), ("nkinds", c_size_t),
                ("layouts", POINTER(ModelOverride)), ("nlayouts", c_size_t)]


class ModelEntry(Structure):
    _fields_ = [("name", c_char_p), ("kind", c_int), ("layout", c_int), ("d_in", c_size_t),
                ("d_out", c_size_t), ("weight", POINTER(CkptTensor)), ("bias", POINTER(CkptTensor)),
                ("weight_k", POINTER(CkptTensor)), ("ld", c_size_t), ("q_off", c_size_t),
                ("k_off", c_size_t), ("heads", c_size_t), ("kv_heads", c_size_t), ("tied", c_int),
                ("n_expert", c_size_t), ("expert", c_size_t), ("group", c_size_t), ("why_not", c_char_p),
                # appended in 0.11.0: a fused q/k/v part's block (stab_model_entry_layer applies them)
                ("offset", c_size_t), ("bias_offset", c_size_t), ("part", c_int)]


# ---- enums ---------------------------------------------------------------------------------

KINDS = {"linear": 0, "embedding": 1, "lm_head": 2, "gain": 3, "bias": 4, "attention": 5}
KIND_NAMES = {v: k for k, v in KINDS.items()}
LAYOUTS = {"natural": 0, "out_major": 1, "in_major": 2}
LAYOUT_NAMES = {v: k for k, v in LAYOUTS.items()}
# the values of a kind override (stab_model_config.kinds) and of a layout override
KIND_OVERRIDES = ("linear", "embedding", "lm_head", "gain", "bias", "skip")
LAYOUT_OVERRIDES = ("in_major", "out_major")
DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_OTHER = 0, 1, 2, 3
SPECTRAL_METHODS = {"lanczos": 0, "power": 1, "exact": 2}
TIGHT_METHODS = {"centred": 0, "exact": 1, "none": 2}
UPDATE_SNAPSHOT = 1
NAMING_HF = 1
FLAG_NONFINITE_WEIGHT, FLAG_NONFINITE_UPDATE, FLAG_NOT_CONVERGED = 1, 2, 4
MODEL_NO_EXPERT = ctypes.c_size_t(-1).value

# ---- prototypes ----------------------------------------------------------------------------


def _proto(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_proto("stab_version", c_char_p)
_proto("stab_last_error", c_char_p)
_proto("stab_strerror", c_char_p, c_int)
_proto("stab_spectral_default_params", SpectralParams)
_proto("stab_metrics_default_params", MetricsParams)
_proto("stab_monitor_default_params", MonitorParams)
_proto("stab_trace_default_params", TraceParams)
_proto("stab_model_default_config", ModelConfig)
_proto("stab_sigma", c_int, c_void_p, c_size_t, c_size_t, c_size_t, POINTER(SpectralParams),
       POINTER(c_double), POINTER(SigmaResult))
_proto("stab_layer_metrics", c_int, POINTER(Layer), POINTER(Layer), POINTER(MetricsParams),
       POINTER(Metrics), POINTER(c_double))
_proto("stab_monitor_create", c_int, POINTER(MonitorParams), POINTER(c_void_p))
_proto("stab_monitor_free", None, c_void_p)
_proto("stab_monitor_add_layer", c_int, c_void_p, POINTER(Layer), POINTER(c_size_t))
_proto("stab_monitor_layer_count", c_size_t, c_void_p)
_proto("stab_monitor_layer", POINTER(Layer), c_void_p, c_size_t)
_proto("stab_monitor_snapshot", c_int, c_void_p)
_proto("stab_monitor_measure", c_int, c_void_p, c_int)
_proto("stab_monitor_measure_idle", c_int, c_void_p, ctypes.c_uint64, c_int, c_int, c_int)
_proto("stab_monitor_hurry", None, c_void_p, ctypes.c_uint64)
_proto("stab_idle_priority_allowed", c_int, POINTER(c_char_p))
_proto("stab_monitor_metrics", POINTER(Metrics), c_void_p, c_size_t)
_proto("stab_monitor_head_bounds", POINTER(c_double), c_void_p, c_size_t)
_proto("stab_monitor_reference", POINTER(Metrics), c_void_p, c_size_t)
_proto("stab_monitor_memory", c_size_t, c_void_p)
_proto("stab_trace_open", c_int, c_char_p, c_void_p, POINTER(TraceParams), POINTER(c_void_p))
_proto("stab_trace_append", c_int, c_void_p, c_int64, c_double, POINTER(c_double), POINTER(c_double))
_proto("stab_trace_flush", c_int, c_void_p)
_proto("stab_trace_last_step", c_int, c_void_p, POINTER(c_int64))
_proto("stab_trace_close", c_int, c_void_p)
_proto("stab_trace_read_open", c_int, c_char_p, POINTER(TraceReadParams), POINTER(c_void_p))
_proto("stab_trace_read_close", None, c_void_p)
_proto("stab_trace_read_format_version", c_int, c_void_p)
_proto("stab_trace_read_rows", c_int64, c_void_p)
_proto("stab_trace_read_run_config", c_int, c_void_p, POINTER(c_char_p))
_proto("stab_trace_read_has_wall_time", c_int, c_void_p)
_proto("stab_trace_read_scalar_count", c_size_t, c_void_p)
_proto("stab_trace_read_scalar_name", c_char_p, c_void_p, c_size_t)
_proto("stab_trace_read_layer_count", c_size_t, c_void_p)
_proto("stab_trace_read_layer_name", c_char_p, c_void_p, c_size_t)
_proto("stab_trace_read_layer_kind", c_char_p, c_void_p, c_size_t)
_proto("stab_trace_read_metric_count", c_size_t, c_void_p, c_size_t)
_proto("stab_trace_read_metric_name", c_char_p, c_void_p, c_size_t, c_size_t)
_proto("stab_trace_read_layer_attrs", c_int, c_void_p, c_size_t, POINTER(POINTER(TraceAttr)), POINTER(c_size_t))
_proto("stab_trace_read_steps", c_int, c_void_p, c_int64, c_size_t, c_void_p)
_proto("stab_trace_read_wall_time", c_int, c_void_p, c_int64, c_size_t, c_void_p)
_proto("stab_trace_read_scalar", c_int, c_void_p, c_size_t, c_int64, c_size_t, c_void_p)
_proto("stab_trace_read_metric", c_int, c_void_p, c_size_t, c_size_t, c_int64, c_size_t, c_void_p)
_proto("stab_model_describe", c_int, POINTER(POINTER(CkptTensor)), c_size_t, POINTER(ModelConfig),
       POINTER(c_void_p))
_proto("stab_model_free", None, c_void_p)
_proto("stab_model_count", c_size_t, c_void_p)
_proto("stab_model_entry_at", POINTER(ModelEntry), c_void_p, c_size_t)
_proto("stab_model_entry_layer", c_int, POINTER(ModelEntry), c_int, c_void_p, c_void_p, c_void_p,
       POINTER(Layer))


def check(status):
    """Raises the exception of a non-OK status with the library's message; returns otherwise."""
    if status != 0:
        raise error_for(status, lib.stab_last_error().decode("utf-8", "replace"))


def metrics_dict(m):
    """A stab_metrics as a dict of its fields (NaN where a metric does not apply)."""
    d = {f: getattr(m, f) for f in METRIC_FIELDS}
    d.update({f: int(getattr(m, f)) for f in COUNT_FIELDS})
    return d
