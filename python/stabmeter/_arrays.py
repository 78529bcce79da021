"""What the C library is handed for an argument, checked here once for every entry point of
the package: an array's address, shape, row stride and stored type, read from a numpy array or
a CPU torch tensor in place (view), its sides against every dimension C will read it by
(need_shape); an integer within the C type it becomes (integer); an enum-like string among its
values (choice, overrides). Nothing is copied: an array the library cannot read as it is
(another dtype, a column stride, misaligned, a CUDA tensor) is refused with a message saying
what to pass instead, before any pointer reaches C. Every message starts with the Python
argument it is about ("layer_metrics: weight_k ...", "probe_report: top=-1 ...")."""

import operator

import numpy as np

from ._lib import DTYPE_BF16, DTYPE_F16, DTYPE_F32


class ArrayView:
    """One array as the library reads it. `keep` holds the object owning the memory: whoever
    hands `ptr` to C keeps this view alive for as long as C may read it."""

    __slots__ = ("ptr", "shape", "ld", "dtype", "keep", "itemsize")

    def __init__(self, ptr, shape, ld, dtype, keep, itemsize):
        self.ptr, self.shape, self.ld, self.dtype, self.keep, self.itemsize = ptr, shape, ld, dtype, keep, itemsize

    @property
    def rows(self):
        return self.shape[0] if len(self.shape) == 2 else 1

    @property
    def cols(self):
        return self.shape[-1]


_NUMPY_DTYPES = {np.dtype(np.float32): DTYPE_F32, np.dtype(np.float16): DTYPE_F16}
_ALLOWED = "float32 (or, for layer_metrics, float16 and torch.bfloat16)"


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _torch_dtypes():
    import torch
    return {torch.float32: DTYPE_F32, torch.float16: DTYPE_F16, torch.bfloat16: DTYPE_BF16}


def _strides_to_ld(what, shape, strides, itemsize_strides):
    """The row stride in elements of a 1-D or 2-D array whose elements are unit-stride along
    the last axis, or a TypeError naming what."""
    if len(shape) == 1:
        if shape[0] > 1 and strides[0] != 1:
            raise TypeError("%s: a 1-D array with a stride of %d elements; pass a contiguous one "
                            "(numpy.ascontiguousarray / tensor.contiguous())" % (what, strides[0]))
        return 0
    rows, cols = shape
    if cols > 1 and strides[1] != 1:
        raise TypeError("%s: its elements are %d apart along a row (a transposed or column-sliced "
                        "view); pass a C-contiguous array (numpy.ascontiguousarray / tensor.contiguous())"
                        % (what, strides[1]))
    if rows > 1 and strides[0] < cols:
        raise TypeError("%s: a row stride of %d elements, below its row length %d (negative or "
                        "overlapping rows); pass a C-contiguous array" % (what, strides[0], cols))
    return strides[0] if rows > 1 and strides[0] != cols else 0


def view(x, what, ndims=(2,), dtypes=None):
    """The ArrayView of x (numpy array or CPU torch tensor) with ndim in ndims and a stored type
    in dtypes (stab_dtype codes; None: F32, F16, BF16)."""
    allowed = dtypes if dtypes is not None else (DTYPE_F32, DTYPE_F16, DTYPE_BF16)
    if _is_torch(x):
        if x.device.type != "cpu":
            raise TypeError("%s: a tensor on %s; stabmeter reads CPU memory: pass tensor.cpu() "
                            "(a copy; the Monitor needs the parameters on the CPU)" % (what, x.device))
        x = x.detach()  # the same storage without autograd's hold on it
        code = _torch_dtypes().get(x.dtype)
        shape = tuple(x.shape)
        strides = tuple(x.stride())
        itemsize = x.element_size()
        ptr = x.data_ptr()
        dtname = str(x.dtype)
    elif isinstance(x, np.ndarray):
        code = _NUMPY_DTYPES.get(x.dtype)
        shape = x.shape
        itemsize = x.itemsize
        if any(s % itemsize for s in x.strides):
            raise TypeError("%s: strides %s are not whole elements" % (what, x.strides))
        strides = tuple(s // itemsize for s in x.strides)
        ptr = x.ctypes.data
        dtname = str(x.dtype)
    else:
        raise TypeError("%s: expected a numpy array or a torch tensor, got %s" % (what, type(x).__name__))
    if code is None or code not in allowed:
        raise TypeError("%s: dtype %s; stabmeter reads %s in place and copies nothing: convert "
                        "with .astype(numpy.float32) / .float()" % (what, dtname,
                                                                  "float32" if allowed == (DTYPE_F32,) else _ALLOWED))
    if len(shape) not in ndims:
        raise ValueError("%s: %d-D with shape %s; expected %s-D" % (what, len(shape), tuple(shape),
                                                                     " or ".join(str(n) for n in ndims)))
    if any(n == 0 for n in shape):
        raise ValueError("%s: shape %s has a zero side" % (what, tuple(shape)))
    if ptr % itemsize:
        # C reads whole elements at their natural alignment (misaligned float loads are
        # undefined behaviour, and a fault on some machines)
        raise TypeError("%s: its data at address %#x is not aligned to its %d-byte elements (a view "
                        "at an odd byte offset, e.g. numpy.frombuffer(..., offset=1)); pass a copy "
                        "(array.copy() / tensor.clone())" % (what, ptr, itemsize))
    ld = _strides_to_ld(what, shape, strides, itemsize)
    return ArrayView(ptr, tuple(int(n) for n in shape), ld, code, x, itemsize)


def need_shape(v, what, shape, why):
    """Refuses the ArrayView v unless its shape is exactly shape: the sides C reads it by, said
    by why (which arguments they come from). C is handed sizes, not lengths: an array smaller
    than its description would be read past its end."""
    if tuple(v.shape) != tuple(shape):
        raise ValueError("%s: shape %s, but %s: C reads %s" % (what, tuple(v.shape), why, tuple(shape)))


# the C types integers become through ctypes, which wraps silently where it does not fit
C_INT = (-2 ** 31, 2 ** 31 - 1)
C_SIZE = (0, 2 ** 64 - 1)
C_INT64 = (-2 ** 63, 2 ** 63 - 1)


def integer(value, what, lo, hi, meaning=None):
    """value as a Python int within [lo, hi] (bounds of its C type or tighter), or a TypeError
    (not an integer: a float, a string, a bool) or ValueError naming what ("fn: arg")."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("%s=%r: expected an integer, got a bool" % (what, value))
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError("%s=%r: expected an integer, got %s" % (what, value, type(value).__name__)) from None
    if n < lo or n > hi:
        raise ValueError("%s=%d: out of range, expected %s" % (what, n, meaning or "%d to %d" % (lo, hi)))
    return n


def choice(value, what, choices):
    """The code of the string value among choices ({name: code}), or a ValueError naming what
    and listing every value it takes."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError("%s=%r: expected one of %s" % (what, value, ", ".join(choices)))
    return choices[value]


def overrides(pairs, what, values):
    """The (glob, value) pairs of a {glob: value} dict or list of pairs, every value among values
    (a typo refused, as the program's --kind and --layout refuse it)."""
    items = list(pairs.items()) if isinstance(pairs, dict) else list(pairs or ())
    out = []
    for item in items:
        if isinstance(item, (str, bytes)) or len(item) != 2:
            raise ValueError("%s: %r is not a GLOB: VALUE pair (pass {glob: value} or [(glob, value)])"
                             % (what, item))
        glob, value = item
        if not isinstance(glob, str) or not glob:
            raise ValueError("%s: glob %r is not a non-empty string" % (what, glob))
        if value not in values:
            raise ValueError("%s[%r]=%r: expected one of %s" % (what, glob, value, ", ".join(values)))
        out.append((glob, value))
    return out
