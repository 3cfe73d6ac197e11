"""Helpers shared by the framework-neutral entry points (_core.py), the drop-in APIs
(_dropin.py) and the PyTorch layer (torch.py): the exceptions and the status-code mapping,
argument parsing (integers, windows, the mask vocabulary), dimension orders, and describing
a bad value in an error message without printing its contents. Imports nothing from the
package but the extension, so no module here depends on another's import order."""

from __future__ import annotations

import operator
from typing import Any, List, Optional, Sequence, Tuple


class UnsupportedError(NotImplementedError):
    """Valid input that the requested backend (or every backend, for ``auto``) cannot run.
    The message names the first failing support rule, the value found and what is
    supported."""


class BackendError(RuntimeError):
    """A backend failed at run time (CUDA or cuDNN error, out of memory, internal error)."""


def raise_for(code: str, message: str) -> None:
    """Turns the extension's (status code, message) into the matching exception."""
    if code == "ok":
        return
    if code == "invalid_argument":
        raise ValueError(message)
    if code == "unsupported":
        raise UnsupportedError(message)
    raise BackendError(f"{message} [{code}]")


def framework(x: Any) -> str:
    """numpy, torch, cupy, jax or other: the framework a tensor belongs to."""
    mod = type(x).__module__.split(".")[0]
    if mod in ("numpy", "torch", "cupy"):
        return mod
    if mod in ("jax", "jaxlib"):
        return "jax"
    return "other"


# ----------------------------------------------------------------------------- describing values


def describe(x: Any) -> str:
    """A short description of a value for an error message: an array's type, shape and dtype
    (never its contents), or a repr cut to 80 characters."""
    shape = getattr(x, "shape", None)
    if shape is not None and hasattr(x, "dtype") and not isinstance(x, (str, bytes)):
        try:
            dims = tuple(int(s) for s in shape)
        except TypeError:
            dims = None
        if dims is not None and dims != ():
            mod = type(x).__module__.split(".")[0]
            return f"a {mod}.{type(x).__name__} of shape {dims} and dtype {x.dtype}"
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + "..."


# ----------------------------------------------------------------------------- masks

# The one mask vocabulary of the Python package: canonical names, then the aliases each maps
# to. Hyphens and underscores are interchangeable ("causal-bottom-right" is the CLI's spelling).
MASKS = ("none", "causal", "causal_bottom_right")
MASK_ALIASES = {
    "no_mask": "none",
    "top_left": "causal",
    "causal_top_left": "causal",
    "bottom_right": "causal_bottom_right",
}


def mask_vocabulary() -> str:
    aliases = ", ".join(f"{a} -> {c}" for a, c in MASK_ALIASES.items())
    return f"{', '.join(MASKS)} (aliases: {aliases})"


def canonical_mask(mask: Any, what: str = "mask") -> str:
    """The canonical name (none, causal, causal_bottom_right) of a mask name or alias;
    ValueError naming the value and the vocabulary otherwise."""
    if not isinstance(mask, str):
        raise ValueError(
            f"{what} must be a string, one of {mask_vocabulary()}; got {describe(mask)}"
        )
    key = mask.strip().replace("-", "_")
    if key in MASKS:
        return key
    if key in MASK_ALIASES:
        return MASK_ALIASES[key]
    raise ValueError(f"{what}='{mask}' is not a mask; supported: {mask_vocabulary()}")


# ----------------------------------------------------------------------------- integers, windows

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def int64(v: Any, what: str) -> int:
    # An integer (Python or numpy) that fits the library's int64; floats are not truncated
    # and out-of-range values are refused here (nanobind would raise a misleading TypeError).
    if isinstance(v, bool):
        raise ValueError(f"{what} must be an integer, got {v!r}")
    try:
        i = operator.index(v)
    except TypeError:
        raise ValueError(f"{what} must be an integer, got {describe(v)}") from None
    if not _INT64_MIN <= i <= _INT64_MAX:
        raise ValueError(f"{what} is {i}; supported: a value that fits in int64")
    return int(i)


def int_list(x: Any, name: str) -> List[int]:
    """A 1-D sequence of integers (list, tuple, numpy/torch/... 1-D integer array) as a list."""
    if x is None:
        return []
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) != 1:
        raise ValueError(f"{name} must be one-dimensional, got {describe(x)}")
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, (str, bytes)):
        raise ValueError(f"{name} must be a sequence of integers, got {describe(x)}")
    try:
        items = list(x)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of integers, got {describe(x)}") from None
    if any(isinstance(v, (list, tuple)) for v in items):
        raise ValueError(f"{name} must be one-dimensional, got {describe(x)}")
    return [int64(v, f"{name}[{i}]") for i, v in enumerate(items)]


def window_pair(window: Any) -> Tuple[int, int]:
    """(left, right) with -1 for unbounded; None (either side or both) means unbounded."""
    if window is None:
        return (-1, -1)
    shape = getattr(window, "shape", None)
    if shape is not None and tuple(shape) != (2,):
        raise ValueError(
            f"window must be (left, right) with -1 or None for unbounded, got {describe(window)}"
        )
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(
            f"window must be (left, right) with -1 or None for unbounded, got {describe(window)}"
        ) from None
    left = -1 if left is None else left
    right = -1 if right is None else right
    return (int64(left, "window left"), int64(right, "window right"))


def looks_cumulative(values: Sequence[int]) -> bool:
    """Whether a list of sequence lengths looks like cumulative cu_seqlens instead: at least
    two entries, starting at 0, non-decreasing (a cu_seqlens of b sequences has b + 1)."""
    return len(values) >= 2 and values[0] == 0 and all(a <= b for a, b in zip(values, values[1:]))


def cu_seqlens_hint(seqlens: dict) -> str:
    """A sentence for an error message when some seqlens_* list looks cumulative, else ''."""
    names = [n for n, v in seqlens.items() if v and looks_cumulative(v)]
    if not names:
        return ""
    return (
        f" (hint: {' and '.join(names)} start at 0 and never decrease, like cumulative "
        f"cu_seqlens of length batch + 1; seqlens_* are per-sequence lengths "
        f"(cu_seqlens[1:] - cu_seqlens[:-1]); strideattn.flash_attn_varlen_func takes "
        f"cu_seqlens)"
    )


# Appended to shape errors of dense calls: the mistake they most often come from.
LAYOUT_NOTE = (
    " (strideattn.attention reads q, k, v as [batch, seq, heads, head_dim]; "
    "PyTorch SDPA's [batch, heads, seq, head_dim] tensors go to strideattn.sdpa)"
)
_SHAPE_WORDS = ("head", "seq", "shape", "extent", "dimension")


def raise_status(code: str, message: str, opts: dict, varlen: bool) -> None:
    """raise_for() with hints: a cu_seqlens look-alike passed as lengths (varlen), or SDPA's
    [b, h, s, d] layout read as [b, s, h, d] (shape errors of dense calls). opts holds the
    seqlens_q / seqlens_kv lists the call passed."""
    if code == "invalid_argument":
        if varlen:
            message += cu_seqlens_hint(
                {
                    "seqlens_q": opts.get("seqlens_q") or [],
                    "seqlens_kv": opts.get("seqlens_kv") or [],
                }
            )
        elif any(w in message.lower() for w in _SHAPE_WORDS):
            message += LAYOUT_NOTE
    raise_for(code, message)


# ----------------------------------------------------------------------------- dimension orders


def dim_order(shape: Sequence[int], strides: Optional[Sequence[int]]) -> List[int]:
    """Dimensions from outermost to innermost by the input's strides (ties: logical order)."""
    n = len(shape)
    if strides is None:
        return list(range(n))
    # extent-1 and broadcast (zero-stride) dims outermost; the head dim always innermost
    outer = sorted(
        range(n - 1),
        key=lambda i: (0 if shape[i] == 1 or strides[i] == 0 else 1, -abs(strides[i]), i),
    )
    return outer + [n - 1]


def cu_seqlens_lengths(cu: Any, name: str) -> Tuple[List[int], List[int]]:
    """(lengths, offsets) of a cumulative cu_seqlens array of length batch + 1 (FlashAttention's
    and TransformerEngine's form), refusing fewer than 2 entries and decreasing values."""
    if cu is None:
        raise ValueError(f"{name} is required (cumulative sequence lengths, length batch + 1)")
    values = int_list(cu, name)
    if len(values) < 2:
        raise ValueError(
            f"{name} has {len(values)} entries; supported: batch + 1 >= 2 "
            "cumulative sequence lengths starting at the first token"
        )
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError(
                f"{name} decreases at index {i} ({values[i - 1]} -> {values[i]}); "
                "cumulative sequence lengths never decrease"
            )
    lengths = [b - a for a, b in zip(values, values[1:])]
    return lengths, values[:-1]


CU_SEQLENS_ARRAYS = ("cu_seqlens_q", "cu_seqlens_kv", "seq_offsets_q", "seq_offsets_kv")


def cu_seqlens_bounds(arrays: dict, max_q: Any, max_kv: Any) -> Optional[Tuple[int, int]]:
    """(max_seqlen_q, max_seqlen_kv) of the cu_seqlens keywords (FlashAttention's and
    TransformerEngine's device-array varlen), checked: None when no array is given (and then
    no bound either), else both cu_seqlens arrays and both bounds are required."""
    given = [n for n in CU_SEQLENS_ARRAYS if arrays.get(n) is not None]
    bounds = {"q": max_q, "kv": max_kv}
    if not given:
        for side, bound in bounds.items():
            if bound is not None:
                raise ValueError(f"max_seqlen_{side} is given without cu_seqlens_q / cu_seqlens_kv")
        return None
    out = []
    for side, bound in bounds.items():
        if arrays.get("cu_seqlens_" + side) is None:
            raise ValueError(
                f"cu_seqlens_{side} is missing; cu_seqlens varlen needs both cu_seqlens_q and "
                "cu_seqlens_kv (int32, count + 1 entries) and the bounds max_seqlen_q and "
                "max_seqlen_kv"
            )
        if bound is None:
            raise ValueError(
                f"max_seqlen_{side} is required with cu_seqlens_{side}: the bound on every length "
                "that a plan is made for (FlashAttention's max_seqlen); the arrays are not read "
                "on the host"
            )
        out.append(int64(bound, "max_seqlen_" + side))
    return out[0], out[1]
