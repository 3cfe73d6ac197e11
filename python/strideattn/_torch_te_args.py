"""TransformerEngine's DotProductAttention arguments, normalised for _torch_module.py: mask
types (TE's spellings and strideattn's), window pairs (remembered: a module passes the same
one every call), the NVTE_ALLOW_NONDETERMINISTIC_ALGO switch (read cheaply at every call),
TE's top-left windows as strideattn's bottom-right ones, right-padding masks as lengths, a
padded batch's device cu_seqlens as token arrays, and the packed qkv_layer / kv_layer as
views."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

import torch
from torch import Tensor

from . import _torch_call as call
from ._util import MASK_ALIASES, MASKS, canonical_mask, describe, window_pair

_environ = os.environ
# os.environ's own mapping of encoded names to values, which os.environ keeps current: a
# lookup there costs a twentieth of os.environ.get of a name that is absent (which raises
# and catches a KeyError), and DotProductAttention reads one on every call.
_ENV_DATA = getattr(_environ, "_data", None)
_ENV_KEY = b"NVTE_ALLOW_NONDETERMINISTIC_ALGO"
if not isinstance(_ENV_DATA, dict) or os.name != "posix":
    _ENV_DATA = None


def _nondeterminism_off() -> bool:
    """TE's NVTE_ALLOW_NONDETERMINISTIC_ALGO=0, read at each call as TE reads it."""
    if _ENV_DATA is not None:
        return _ENV_DATA.get(_ENV_KEY) == b"0"
    return _environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1") == "0"


_WINDOWS: Dict[Any, Tuple[int, int]] = {}  # window_size tuples seen before -> window_pair


def _window(w: Any) -> Tuple[int, int]:
    """window_pair(w), remembered for pairs of ints or None (a module passes the same one
    every call; other types, which compare equal to ints, are checked every time)."""
    if type(w) is tuple and len(w) == 2:
        a, b = w
        if (a is None or type(a) is int) and (b is None or type(b) is int):
            got = _WINDOWS.get(w)
            if got is None:
                got = window_pair(w)
                if len(_WINDOWS) < 64:
                    _WINDOWS[w] = got
            return got
    return window_pair(w)


_TE_MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
)


def mask_type(t: Any) -> Tuple[str, bool]:
    """(strideattn mask, padding) of a TE attn_mask_type; commas and underscores are
    interchangeable and 'padding' may come first or last, as in TE."""
    if not isinstance(t, str):
        raise ValueError(f"attn_mask_type must be a string; got {describe(t)}")
    key = t.strip().replace(",", "_").replace("-", "_")
    if key == "arbitrary":
        raise NotImplementedError(
            "attn_mask_type='arbitrary' (a boolean mask tensor) is not "
            "supported by strideattn; supported: " + ", ".join(_TE_MASK_TYPES)
        )
    padding = False
    if key == "padding":
        key, padding = "none", True
    elif key.startswith("padding_"):
        key, padding = key[len("padding_") :], True
    elif key.endswith("_padding"):
        key, padding = key[: -len("_padding")], True
    try:
        return canonical_mask(key), padding
    except ValueError:
        raise ValueError(
            f"attn_mask_type='{t}' is not a mask type; supported: {', '.join(_TE_MASK_TYPES)} "
            f"(',' for '_', e.g. 'padding,causal'), or strideattn's {', '.join(MASKS)} "
            f"(aliases {', '.join(MASK_ALIASES)})"
        ) from None


_MASK_TYPES: Dict[str, Tuple[str, bool]] = {}  # attn_mask_type -> mask_type(), seen before


def _mask_type_cached(t: Any) -> Tuple[str, bool]:
    got = _MASK_TYPES.get(t) if isinstance(t, str) else None
    if got is None:
        got = mask_type(t)
        if len(_MASK_TYPES) < 64:
            _MASK_TYPES[t] = got
    return got


def _refuse(arg: str, value: Any, supported: str) -> NotImplementedError:
    return NotImplementedError(
        f"{arg}={describe(value)} is not supported by strideattn's "
        f"DotProductAttention; supported: {supported}"
    )


def _our_window(
    te_window: Tuple[int, int], top_left: bool, shift: int, why: str
) -> Tuple[int, int]:
    """strideattn's window (measured from the bottom-right diagonal) equal to TE's window
    (left, right) aligned top-left or bottom-right, for a sequence with s_kv - s_q = shift."""
    left, right = te_window
    if not top_left or shift == 0:
        return left, right
    new_left = -1 if left < 0 else left + shift
    new_right = -1 if right < 0 else right - shift
    if (left >= 0 and new_left < 0) or (right >= 0 and new_right < 0):
        raise NotImplementedError(
            f"window_size={te_window} aligned to the top-left diagonal ({why}) with "
            f"s_kv - s_q = {shift} has no bottom-right equivalent; supported: a window that "
            "still covers the bottom-right diagonal, equal lengths, or a bottom-right mask type"
        )
    return new_left, new_right


def _mask_lengths(m: Any, s: int, name: str) -> List[int]:
    """Sequence lengths from a TE padding mask [b, 1, 1, s] (True = padding), which must be
    right-padded (True only on a tail of each row)."""
    if (
        not isinstance(m, Tensor)
        or m.dtype != torch.bool
        or m.dim() != 4
        or tuple(m.shape[1:]) != (1, 1, s)
    ):
        raise ValueError(
            f"{name} must be a boolean tensor [batch, 1, 1, {s}] (True = padding); "
            f"got {describe(m)}"
        )
    rows = m[:, 0, 0, :]
    lens = (~rows).sum(dim=-1)
    tail = torch.arange(s, device=m.device)[None, :] >= lens[:, None]
    if not torch.equal(rows, tail):
        raise NotImplementedError(
            f"{name} masks tokens other than a tail of each sequence; "
            "supported: right padding (True only after the last token)"
        )
    return [int(x) for x in lens.tolist()]


def _mergeable(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether [b, s, h, d] tensors' batch and seq dims merge into one token dim (a view)."""
    return q.shape[0] == 1 or all(t.stride(0) == t.shape[1] * t.stride(1) for t in (q, k, v))


def _batch_rows(cu_q: Tensor, cu_kv: Tensor, b: int, s_q: int, s_kv: int) -> call.CuSeqlens:
    """The CuSeqlens of a right-padded [b, s, h, d] batch merged into tokens: TE's device
    cu_seqlens give the lengths, sequence i starts at row i * s (int32 arrays made on the
    device, nothing read on the host), and the bounds are the sequence extents."""
    starts_q = torch.arange(0, b * s_q, s_q, dtype=torch.int32, device=cu_q.device)
    starts_kv = (
        starts_q
        if s_kv == s_q
        else torch.arange(0, b * s_kv, s_kv, dtype=torch.int32, device=cu_q.device)
    )
    return call.CuSeqlens(cu_q, cu_kv, starts_q, starts_kv, s_q, s_kv)


def _unpack(qkv_layer, kv_layer, q, k, v, fmt: str, dim: int) -> Tuple[Tensor, Tensor, Tensor]:
    """query/key/value, or views of a packed qkv_layer / kv_layer (TE's declared packing)."""
    if qkv_layer is None and kv_layer is None:
        if q is None or k is None or v is None:
            raise ValueError(
                "query_layer, key_layer and value_layer are required unless "
                "qkv_layer or kv_layer is given"
            )
        return q, k, v
    if dim not in (-3, -2):
        raise ValueError(f"qkv_interleave_dim is {dim}; supported: -3 (e.g. bs3hd) or -2 (bsh3d)")
    if qkv_layer is not None:
        if kv_layer is not None or q is not None or k is not None or v is not None:
            raise ValueError(
                "qkv_layer packs Q, K and V: kv_layer, query_layer, key_layer and "
                "value_layer must be None with it"
            )
        rank = 4 if fmt == "thd" else 5
        if qkv_layer.dim() != rank or qkv_layer.shape[dim] != 3:
            raise ValueError(
                f"qkv_layer must be {rank}-D with extent 3 at dim {dim} for "
                f"qkv_format '{fmt}'; got {describe(qkv_layer)}"
            )
        return tuple(qkv_layer.select(dim, i) for i in range(3))
    if q is None or k is not None or v is not None:
        raise ValueError(
            "kv_layer packs K and V: query_layer is required and key_layer, "
            "value_layer must be None with it"
        )
    if kv_layer.dim() != q.dim() + 1 or kv_layer.shape[dim] != 2:
        raise ValueError(
            f"kv_layer must have one more dimension than query_layer and extent 2 "
            f"at dim {dim}; got {describe(kv_layer)}"
        )
    return (q,) + tuple(kv_layer.select(dim, i) for i in range(2))
