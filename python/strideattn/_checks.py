"""Input checks at the Python edge: the scale argument and numpy arrays that DLPack /
nanobind cannot take (non-native byte order, object or other unsupported dtypes, read-only
outputs). Each failure names the argument, the type or value found and what is supported;
a message about an array shows its shape and dtype, never its contents."""

from __future__ import annotations

import numbers
import sys
from typing import Any, Optional

_DTYPES = ("float16", "bfloat16", "float32")


class InputError(ValueError):
    """A tensor argument the library cannot read (explain() reports it as invalid)."""


class InputTypeError(InputError, TypeError):
    """InputError for a wrong type (an unsupported dtype)."""


def describe(x: Any) -> str:
    """Shape and dtype of an array-like, never its contents."""
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is None:
        return type(x).__name__
    return f"shape {tuple(int(s) for s in shape)}, dtype {dtype}"


def shown(x: Any) -> str:
    """How an argument appears in a message: arrays and tensors by shape and dtype, other
    values by repr."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{type(x).__name__} of {describe(x)}"
    return repr(x)


def scale(value: Any) -> Optional[float]:
    """The scale as a float: None (the default) or a real number (int or float, numpy
    integer or floating scalars); bool, str, arrays and other types raise TypeError."""
    if value is None:
        return None
    np = sys.modules.get("numpy")
    is_np_scalar = np is not None and isinstance(value, (np.integer, np.floating))
    if (
        isinstance(value, bool)
        or (np is not None and isinstance(value, np.bool_))
        or not (is_np_scalar or isinstance(value, (int, float)))
        or not isinstance(value, numbers.Real)
    ):
        array = np is not None and isinstance(value, np.ndarray) or hasattr(value, "__dlpack__")
        kind = shown(value) if array else type(value).__name__
        raise TypeError(f"scale must be a real number (int or float), got {kind}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(
            f"scale must be a finite number: the {type(value).__name__} given does not fit "
            "a double; supported: a finite value > 0 that is a normal fp32 number"
        ) from None


def numpy_array(x: Any, name: str, writable: bool) -> None:
    """Refuses numpy arrays that nanobind would reject with its signature dump."""
    dtype = x.dtype
    if dtype.kind == "O" or dtype.hasobject:
        raise InputTypeError(
            f"{name}: dtype object ({describe(x)}); supported: {', '.join(_DTYPES)}"
        )
    if dtype.byteorder not in ("=", "|") and dtype.byteorder != _native():
        order = "big-endian" if dtype.byteorder == ">" else "little-endian"
        raise InputError(
            f"{name}: byte order {order} ({describe(x)}); supported: the machine's "
            f"native byte order (use x.astype(x.dtype.newbyteorder('=')))"
        )
    if writable and not x.flags.writeable:
        raise InputError(
            f"{name} is a read-only numpy array ({describe(x)}); outputs must be writable"
        )


def _native() -> str:
    return "<" if sys.byteorder == "little" else ">"


def unreadable(check, **tensors) -> Optional[dict]:
    """explain()'s answer when a tensor cannot be read (q, k, v always checked; out, dout,
    lse when given, out as an output): a result with valid False naming it, else None."""
    try:
        for name, x in tensors.items():
            if x is not None or name in ("q", "k", "v"):
                check(x, name, writable=name == "out")
    except InputError as e:
        return {
            "valid": False,
            "code": "invalid_argument",
            "error": str(e),
            "layout": "",
            "verdicts": [],
            "chosen": None,
        }
    return None
