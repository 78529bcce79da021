"""The exceptions of stabmeter: one per status of the C library, all under stabmeter.Error."""


class Error(Exception):
    """A call into libstabmeter failed. `status` is the C status (a negative int), `message`
    the library's own text (stab_last_error: what failed and where)."""

    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class InvalidArgument(Error, ValueError):
    status = -1  # STAB_EINVAL


class DimensionError(Error, ValueError):
    status = -2  # STAB_EDIM


class OutOfMemory(Error, MemoryError):
    status = -3  # STAB_ENOMEM


class NotFound(Error, LookupError):
    status = -4  # STAB_ENOTFOUND


class AlreadyExists(Error):
    status = -5  # STAB_EEXIST


class StateError(Error, RuntimeError):
    status = -6  # STAB_ESTATE: a call out of order


class LapackError(Error, ArithmeticError):
    status = -7  # STAB_ELAPACK


class RangeError(Error, ValueError):
    status = -8  # STAB_ERANGE


class IOError_(Error, OSError):
    status = -9  # STAB_EIO (named so as not to shadow the builtin alias of OSError)


class FormatError(Error, ValueError):
    status = -10  # STAB_EFORMAT: a checkpoint breaks its format's rules


class Busy(Error):
    status = -11  # STAB_EBUSY: another process writes that trace


_BY_STATUS = {cls.status: cls for cls in (InvalidArgument, DimensionError, OutOfMemory, NotFound,
                                          AlreadyExists, StateError, LapackError, RangeError,
                                          IOError_, FormatError, Busy)}


def error_for(status, message):
    """The exception for a non-OK status (Error itself for a status this version does not know)."""
    cls = _BY_STATUS.get(status, Error)
    return cls(message, status)
