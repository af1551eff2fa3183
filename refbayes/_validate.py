"""Input checks shared by the public API.

Every check raises before any state changes, with a message that names the
argument, what was expected and what was received.
"""

import numbers

import numpy as np

__all__ = [
    "as_float_array",
    "as_vector",
    "as_matrix",
    "positive_scalar",
    "nonnegative_scalar",
    "positive_or_vector",
    "positive_int",
    "int_at_least",
]


def as_float_array(value, name, ndim=None, shape=None, allow_nonfinite=False, dtype=np.float64):
    """Return ``value`` as a float64 array (``dtype``: float32 for a float32 belief's arrays) after
    checking dtype, shape and finiteness (after the conversion: a float64 value beyond float32's range
    becomes inf and is rejected).

    ``shape`` may contain ``None`` for a free axis.
    """
    if type(value) is np.ndarray and value.dtype == dtype:  # the common case: no conversion to check
        arr = value
    else:
        try:
            arr = np.asarray(value)
        except Exception as exc:  # ragged lists and similar
            raise TypeError(f"{name} must be array-like of numbers; got {type(value).__name__}") from exc
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise TypeError(f"{name} must contain real numbers; got dtype {arr.dtype}")
        if np.iscomplexobj(arr):
            raise TypeError(f"{name} must be real; got dtype {arr.dtype}")
        with np.errstate(over="ignore", invalid="ignore"):
            out = arr.astype(dtype, copy=False)
        if out.dtype.itemsize < arr.dtype.itemsize and not allow_nonfinite and out.dtype.kind == "f":
            wide = np.isinf(out) & np.isfinite(arr)
            if wide.any():
                raise ValueError(f"{name} holds values beyond the range of {out.dtype} (max |value| = "
                                 f"{np.abs(arr[wide]).max():.3g}); they cannot be stored in a {out.dtype} belief")
        arr = out
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s); got shape {arr.shape}")
    if shape is not None:
        ok = arr.ndim == len(shape) and all(s is None or s == a for s, a in zip(shape, arr.shape))
        if not ok:
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
            raise ValueError(f"{name} must have shape {want}; got {arr.shape}")
    if not allow_nonfinite and not np.isfinite(arr).all():
        raise ValueError(f"{name} contains {'inf' if np.isinf(arr).any() else 'NaN'} (it must be finite)")
    return arr


def as_vector(value, name, size=None):
    """A finite float64 vector, optionally of a given length."""
    return as_float_array(value, name, shape=(size,))


def as_matrix(value, name, rows=None, cols=None):
    """A finite float64 matrix, optionally of a given shape."""
    return as_float_array(value, name, shape=(rows, cols))


def _real_scalar(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        arr = np.asarray(value)
        if arr.shape != () or not np.issubdtype(arr.dtype, np.number):
            raise TypeError(f"{name} must be a real scalar; got {value!r}")
        value = arr.item()
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite; got {value}")
    return value


def positive_scalar(value, name):
    """A finite float > 0."""
    value = _real_scalar(value, name)
    if value <= 0:
        raise ValueError(f"{name} must be > 0; got {value}")
    return value


def nonnegative_scalar(value, name):
    """A finite float >= 0."""
    value = _real_scalar(value, name)
    if value < 0:
        raise ValueError(f"{name} must be >= 0; got {value}")
    return value


def positive_int(value, name):
    """An integer >= 1 (bool and non-integral values are a TypeError)."""
    return int_at_least(value, name, 1)


def int_at_least(value, name, minimum):
    """``value`` as an int, checked to be an integer >= ``minimum``: bool and non-integral values
    (floats included, even 2.0) are a TypeError, smaller integers a ValueError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError(f"{name} must be an integer >= {minimum}; got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


def positive_or_vector(value, name, size, allow_zero=False):
    """A scalar or a (size,) vector of values > 0 (>= 0 if ``allow_zero``), returned as (size,)."""
    arr = as_float_array(value, name)
    if arr.ndim == 0:
        arr = np.full(size, float(arr))
    elif arr.shape != (size,):
        raise ValueError(f"{name} must be a scalar or have shape ({size},); got {arr.shape}")
    bad = arr < 0 if allow_zero else arr <= 0
    if np.any(bad):
        rel = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {rel}; got minimum {arr.min()}")
    return arr
