"""stabmeter.probe: what `stabmeter-probe --json` reports of a checkpoint, through the library's
probe (stab_probe_open, stab_probe_measure, stab_probe_json: the very text the program prints)."""

import ctypes
import json
import warnings
from ctypes import POINTER, Structure, c_char_p, c_double, c_int, c_int64, c_size_t, c_void_p

from . import _lib
from ._arrays import C_INT, C_INT64, C_SIZE, choice, integer, overrides
from ._lib import KIND_OVERRIDES, LAYOUT_OVERRIDES, TIGHT_METHODS, check, lib

_NOTE_FN = ctypes.CFUNCTYPE(None, c_void_p, c_char_p)
_FILE_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_char_p, c_void_p, c_size_t)


class _ProbeParams(Structure):
    _fields_ = [("tol", c_double), ("exact", c_int), ("tight", c_int), ("threads", c_int), ("heads", c_size_t),
                ("prev", c_char_p), ("kinds", POINTER(_lib.ModelOverride)), ("nkinds", c_size_t),
                ("layouts", POINTER(_lib.ModelOverride)), ("nlayouts", c_size_t),
                ("filters", POINTER(c_char_p)), ("nfilters", c_size_t), ("note_fn", _NOTE_FN),
                ("file_fn", _FILE_FN), ("user", c_void_p)]


class _ReportOptions(Structure):
    _fields_ = [("sort", c_int), ("top", c_size_t), ("experts", c_int), ("per_head", c_int),
                ("step", c_int64), ("step_source", c_char_p)]


lib.stab_probe_default_params.restype = _ProbeParams
lib.stab_probe_default_params.argtypes = []
lib.stab_probe_default_report_options.restype = _ReportOptions
lib.stab_probe_default_report_options.argtypes = []
lib.stab_probe_open.restype = c_int
lib.stab_probe_open.argtypes = [c_char_p, POINTER(_ProbeParams), POINTER(c_void_p)]
lib.stab_probe_free.restype = None
lib.stab_probe_free.argtypes = [c_void_p]
lib.stab_probe_measure.restype = c_int
lib.stab_probe_measure.argtypes = [c_void_p, c_void_p, c_void_p, c_void_p]
lib.stab_probe_set_init.restype = c_int
lib.stab_probe_set_init.argtypes = [c_void_p, c_char_p]
lib.stab_probe_measure_init.restype = c_int
lib.stab_probe_measure_init.argtypes = [c_void_p, c_void_p, c_void_p, c_void_p]
lib.stab_probe_json.restype = c_int
lib.stab_probe_json.argtypes = [c_void_p, POINTER(_ReportOptions), POINTER(c_void_p), POINTER(c_size_t)]
lib.stab_probe_sort_name.restype = c_char_p
lib.stab_probe_sort_name.argtypes = [c_int]
_libc_free = ctypes.CDLL(None).free  # the text is malloc'd by the library: free() it
_libc_free.restype = None
_libc_free.argtypes = [c_void_p]

_SORTS = {}
for _i in range(64):
    _n = lib.stab_probe_sort_name(_i)
    if _n is None:
        break
    _SORTS[_n.decode()] = _i


def _overrides(pairs, what, values, keep):
    pairs = overrides(pairs, what, values)
    arr = (_lib.ModelOverride * max(len(pairs), 1))()
    for j, (glob, value) in enumerate(pairs):
        g, v = glob.encode("utf-8"), value.encode("utf-8")
        keep += [g, v]
        arr[j].glob, arr[j].value = g, v
    keep.append(arr)
    return arr, len(pairs)


def probe_report(path, prev=None, heads=None, tol=1e-3, exact=False, tight="centred", kinds=None,
                 layouts=None, filters=None, threads=0, sort="file", top=0, experts=False, step=None, init=None):
    """The whole report of stabmeter-probe --json on path (a safetensors file, a Hugging Face
    model directory or index, a GGUF file, an llm.c checkpoint) as a dict: checkpoint,
    reference, step, metadata, layers (one dict per row), summary, errors. prev: the older
    checkpoint for the update metrics (--prev); init: the checkpoint at initialisation (or any
    earlier one) for forward_ratio and dependency_ratio (--init; without it, the ratios are to
    prev, as the program's); the other arguments are the program's options
    (--heads, --tol, --exact, --tight, --kind GLOB=KIND as {glob: kind}, --layout, --filter as a
    list, --sort, --top, --experts, --step). Its notes and warnings become Python warnings."""
    fn = "probe_report: "
    keep = []
    params = lib.stab_probe_default_params()
    params.tol, params.exact = float(tol), 1 if exact else 0
    params.tight = choice(tight, fn + "tight", TIGHT_METHODS)
    sort_code = choice(sort, fn + "sort", _SORTS)
    params.threads = integer(threads, fn + "threads", 0, C_INT[1], "0 (the library's choice) or more")
    params.heads = integer(heads or 0, fn + "heads", 0, C_SIZE[1], "0 or None (from the file) or more")
    top = integer(top, fn + "top", 0, C_SIZE[1], "0 (every row) or more")
    if step is not None:
        step = integer(step, fn + "step", 0, C_INT64[1], "a step >= 0, or None")
    if prev is not None:
        pb = str(prev).encode("utf-8")
        keep.append(pb)
        params.prev = pb
    params.kinds, params.nkinds = _overrides(kinds, fn + "kinds", KIND_OVERRIDES, keep)
    params.layouts, params.nlayouts = _overrides(layouts, fn + "layouts", LAYOUT_OVERRIDES, keep)
    if filters:
        fs = [str(f).encode("utf-8") for f in ([filters] if isinstance(filters, str) else filters)]
        arr = (c_char_p * len(fs))(*fs)
        keep += fs + [arr]
        params.filters, params.nfilters = arr, len(fs)
    notes = []
    note_fn = _NOTE_FN(lambda user, text: notes.append(text.decode("utf-8", "replace")))
    params.note_fn = note_fn  # alive (note_fn) until the probe is freed
    p = c_void_p()
    try:
        check(lib.stab_probe_open(str(path).encode("utf-8"), ctypes.byref(params), ctypes.byref(p)))
        if init is not None or prev is not None:
            check(lib.stab_probe_set_init(p, str(init if init is not None else prev).encode("utf-8")))
        check(lib.stab_probe_measure(p, None, None, None))
        check(lib.stab_probe_measure_init(p, None, None, None))
        opts = lib.stab_probe_default_report_options()
        opts.sort, opts.top, opts.experts = sort_code, top, 1 if experts else 0
        if step is not None:
            opts.step, opts.step_source = step, b"step="
        text, n = c_void_p(), c_size_t()
        check(lib.stab_probe_json(p, ctypes.byref(opts), ctypes.byref(text), ctypes.byref(n)))
        try:
            report = json.loads(ctypes.string_at(text, n.value).decode("utf-8"))
        finally:
            _libc_free(text)
    finally:
        lib.stab_probe_free(p)
        for note in notes:
            warnings.warn(note, RuntimeWarning, stacklevel=2)
    del keep, note_fn
    return report


def probe(path, prev=None, frame=None, init=None, **options):
    """The rows of stabmeter-probe --json's report of path (probe_report: its options), one
    dict per layer with the program's keys (name, tensor, kind, shape, dtype, layout, d_in,
    d_out, forward, ..., flags; with init or prev forward_init, dependency_init, forward_ratio,
    dependency_ratio; None where the JSON has null). frame=True gives a pandas
    DataFrame indexed by name; frame=None (default) a DataFrame when pandas imports, else the
    list; frame=False always the list."""
    rows = probe_report(path, prev=prev, init=init, **options)["layers"]
    if frame is False:
        return rows
    try:
        import pandas as pd
    except ImportError:
        if frame:
            raise
        return rows
    return pd.DataFrame(rows).set_index("name", drop=False) if rows else pd.DataFrame(rows)
