"""strideattn.jax's views: how each axis of a call's XLA buffer maps onto a logical dimension
of q, k, v (or O, the LSE), from the letters of `axes` and the buffer's shape (XLA buffers are
dense row-major, so strides follow from the shape), written as the view attributes of
strideattn._jax_ffi."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence

import numpy as np

from ._util import describe

# Logical dimension of each axis letter: tensors [batch, seq, head, head_dim]; "t" (varlen
# tokens) is the seq dimension. The LSE is [batch, head, seq].
ROLE = {"b": 0, "s": 1, "t": 1, "h": 2, "d": 3}
LSE_ROLE = {"b": 0, "h": 1, "s": 2}
HELD = -1  # an axis held at one index (the "3" / "2" axis of a packed buffer)


# ----------------------------------------------------------------------------- views


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a logical tensor lives: buffer `buf` of the call, read with `axes` (one letter
    per buffer axis), at index `pick` of its packed ("3"/"2") axis, and heads
    [head_start, head_start + heads) of its head axis (None: all of them)."""

    buf: int
    axes: str
    pick: Optional[int] = None
    head_start: int = 0
    heads: Optional[int] = None


def parse_axes(axes: Any, shape: Sequence[int], what: str, packed: str = "") -> str:
    """The axes of a buffer as a string of one letter per axis, checked: each of s (or t),
    h, d once, b at most once, and the packed letter (3 or 2) once when `packed`."""
    if isinstance(axes, (list, tuple)) and all(isinstance(a, str) and len(a) == 1 for a in axes):
        axes = "".join(axes)
    if not isinstance(axes, str):
        raise ValueError(f"{what} axes must be a string such as 'bshd', got {describe(axes)}")
    letters = axes.strip().lower()
    allowed = "bsthd" + packed
    supported = (
        f"one letter per axis of the buffer, each once: b (batch, optional), s or t (seq), "
        f"h (heads), d (head dim){f', {packed} (which of the packed tensors)' if packed else ''}"
    )
    if len(letters) != len(shape):
        raise ValueError(
            f"{what} axes '{axes}' name {len(letters)} axes but {what} has shape "
            f"{tuple(shape)}; supported: {supported}"
        )
    seq = [c for c in letters if c in "st"]
    if (
        any(c not in allowed for c in letters)
        or len(set(letters)) != len(letters)
        or len(seq) != 1
        or "h" not in letters
        or "d" not in letters
        or (packed and packed not in letters)
    ):
        raise ValueError(f"{what} axes '{axes}' are not valid; supported: {supported}")
    return letters


def has_letter(axes: Any, letter: str) -> bool:
    """Whether axes (a string or a sequence of letters) has `letter`."""
    return isinstance(axes, (str, list, tuple)) and letter in "".join(str(a) for a in axes)


def default_axes(rank: int, what: str, packed: str = "") -> str:
    # The default for each rank is written out as letters and parsed like any other.
    table = {5: "bs" + packed + "hd", 4: "t" + packed + "hd"} if packed else {4: "bshd", 3: "thd"}
    if rank not in table:
        raise ValueError(
            f"{what} has {rank} dimensions; pass axes= to say which axis is which "
            f"(default axes exist for {' and '.join(str(r) for r in table)} dimensions: "
            f"{', '.join(table.values())})"
        )
    return table[rank]


def extent(shape: Sequence[int], axes: str, letter: str) -> int:
    if letter == "s":
        return int(shape[axes.index("s" if "s" in axes else "t")])
    return int(shape[axes.index(letter)]) if letter in axes else 1


def desc(src: Source, shape: Sequence[int]) -> np.ndarray:
    """The view attribute of strideattn._jax_ffi: [buffer, (role, start, extent) per axis]."""
    out = [src.buf]
    for ax, c in enumerate(src.axes):
        if c in "32":
            out += [HELD, src.pick, 1]
        elif c == "h" and src.heads is not None:
            out += [ROLE[c], src.head_start, src.heads]
        else:
            out += [ROLE[c], 0, int(shape[ax])]
    return np.asarray(out, np.int64)


def full_desc(buf: int, axes: str, shape: Sequence[int], roles: Dict[str, int]) -> np.ndarray:
    out = [buf]
    for ax, c in enumerate(axes):
        out += [roles[c], 0, int(shape[ax])]
    return np.asarray(out, np.int64)
