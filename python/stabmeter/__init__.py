"""stabmeter: per-layer stability metrics of neural-network weights, over the C library
libstabmeter (ctypes; numpy arrays and CPU torch tensors read in place).

    stabmeter.sigma(w)                        spectral norm of a 2-D float32 array
    stabmeter.layer_metrics("linear", w, before=w0)   every metric of one layer, a dict
    stabmeter.probe("model.safetensors", prev=None)   stabmeter-probe --json's rows
    stabmeter.torch.Monitor(model, trace="run/trace.h5")   a PyTorch training loop's trace
    stabmeter.read_trace("run/trace.h5")      a trace read back: steps, scalars, every layer's
                                              metrics (.to_xarray(), .to_pandas())

Errors of the library raise stabmeter.Error (a subclass per status) with its message."""

from ._errors import (AlreadyExists, Busy, DimensionError, Error, FormatError, InvalidArgument,
                      IOError_, LapackError, NotFound, OutOfMemory, RangeError, StateError)
from ._lib import LIBRARY_PATH, lib as _clib
from ._metrics import layer_metrics, sigma
from ._probe import probe, probe_report
from ._trace import Trace, TraceLayer, read_trace

__version__ = _clib.stab_version().decode("ascii")

__all__ = ["sigma", "layer_metrics", "probe", "probe_report", "read_trace", "Trace", "TraceLayer", "Error", "InvalidArgument", "DimensionError", "OutOfMemory",
           "NotFound", "AlreadyExists", "StateError", "LapackError", "RangeError", "IOError_",
           "FormatError", "Busy", "LIBRARY_PATH", "__version__"]
