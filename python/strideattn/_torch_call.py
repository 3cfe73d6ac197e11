"""The eager calls from PyTorch tensors into the extension: forward() and backward() allocate
the outputs (in the dimension order of the matching input, head dim innermost) and run the
library on the tensors' device and current stream. Both the autograd function's fast path
and the registered ops' CPU and CUDA kernels (strideattn/_torch_ops.py) come here, so there
is one place that knows how the extension is called:

- tensors go to it as DLPack capsules (torch.utils.dlpack.to_dlpack, a C function; the
  tensors' __dlpack__ method is Python and several times slower);
- the stream is the raw current stream of the tensors' device, the device is entered only
  when it is not already the current one;
- outputs are torch.empty_strided (the library writes every element of every output, padding
  tokens too: docs/semantics.md, "Which elements are written");
- varlen lengths go through _varlen(), workspace-free calls let the library allocate its own
  scratch: the two places where a device cu_seqlens or a caller-provided workspace plug in.
No torch.library or autograd machinery here."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _ext
from ._util import raise_status

_capsule = torch.utils.dlpack.to_dlpack
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

# ----------------------------------------------------------------------------- allocation

# (logical shape, like's strides) -> the strides of a dense tensor of that shape laid out in
# like's dimension order. A handful of entries in a model; bounded anyway.
_STRIDES: Dict[Tuple, Tuple[int, ...]] = {}


def order_strides(
    shape: Sequence[Any], like_shape: Sequence[Any], like_stride, heads_inner: bool = False
) -> List[Any]:
    """Strides of a dense tensor of logical `shape` whose dimensions are ordered, outermost
    to innermost, as like's are (extent-1 and zero-stride dims outermost, ties in logical
    order, the last dim innermost): what strideattn/_util.dim_order computes. heads_inner:
    the heads dim (-2) right outside the head dim, so that the two merge into one. Works on
    symbolic sizes too (the fake kernels)."""
    n = len(shape)
    fixed = [n - 1, n - 2] if heads_inner else [n - 1]
    outer = sorted(
        range(n - len(fixed)),
        key=lambda i: (
            0 if like_shape[i] == 1 or like_stride[i] == 0 else 1,
            -abs(like_stride[i]),
            i,
        ),
    )
    strides = [0] * n
    step = 1
    for dim in fixed + outer[::-1]:
        strides[dim] = step
        step = step * torch.sym_max(shape[dim], 1)
    return strides


def _strides(shape: Sequence[int], like: Tensor, heads_inner: bool) -> Tuple[int, ...]:
    stride = like.stride()
    key = (shape, stride, heads_inner)
    got = _STRIDES.get(key)
    if got is None:
        if len(_STRIDES) >= 1024:
            _STRIDES.clear()
        got = _STRIDES[key] = tuple(order_strides(shape, like.shape, stride, heads_inner))
    return got


def empty_like_order(shape: Sequence[int], like: Tensor) -> Tensor:
    """An uninitialised tensor of logical `shape` in like's dimension order; shape differs
    from like's at most in the last dim (O of V's head dim, laid out like Q)."""
    return like.new_empty_strided(shape, _strides(shape, like, False))


def fake_like_order(shape: Sequence[Any], like: Tensor) -> Tensor:
    """empty_like_order for the fake kernels (sizes may be symbolic, nothing remembered)."""
    strides = order_strides(shape, like.shape, like.stride())
    return like.new_empty_strided(shape, strides)


def lse_shape(q: Tensor) -> Tuple[int, int, int]:
    return (q.shape[0], q.shape[2], q.shape[1])


def _empty_lse(q: Tensor) -> Tensor:
    b, h, s = q.shape[0], q.shape[2], q.shape[1]
    return q.new_empty_strided((b, h, s), (h * s, s, 1), dtype=torch.float32)


# ----------------------------------------------------------------------------- the call


def _varlen(x: Any) -> List[int]:
    """Sequence lengths or offsets as the extension takes them today: a host list. A list
    passes as it is; a tensor is read back (a device tensor synchronises its stream here;
    an extension that takes device cu_seqlens removes that)."""
    if x is None:
        return []
    if isinstance(x, list):
        return x
    return [int(v) for v in x.tolist()]


class _Device:
    """Enters the tensor's CUDA device only when it is not the current one (a context
    manager for each call costs more than the check)."""

    __slots__ = ("index", "prev")

    def __init__(self, index: int):
        self.index, self.prev = index, -1

    def __enter__(self):
        cur = torch.cuda.current_device()
        if cur != self.index:
            self.prev = cur
            torch.cuda.set_device(self.index)
        return self

    def __exit__(self, *exc):
        if self.prev >= 0:
            torch.cuda.set_device(self.prev)
        return False


def _stream(index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _options(varlen, mask, wl, wr, scale, backend, det, stream) -> dict:
    sq, skv, oq, okv = varlen
    return dict(
        mask=mask,
        window_left=wl,
        window_right=wr,
        scale=scale,
        deterministic=det,
        seqlens_q=_varlen(sq),
        seqlens_kv=_varlen(skv),
        offsets_q=_varlen(oq),
        offsets_kv=_varlen(okv),
        backend=backend,
        stream=stream,
    )


def run_forward(q, k, v, out, lse, varlen, mask, wl, wr, scale, backend, det) -> None:
    """The library's forward into the given O and LSE ([b, s, h, d] and [b, h, s] views)."""
    if q.is_cuda:
        index = q.get_device()
        opts = _options(varlen, mask, wl, wr, scale, backend, det, _stream(index))
        with _Device(index):
            code, msg = _ext.forward(
                _capsule(q), _capsule(k), _capsule(v), _capsule(out), _capsule(lse), **opts
            )
    else:
        opts = _options(varlen, mask, wl, wr, scale, backend, det, 0)
        code, msg = _ext.forward(
            _capsule(q), _capsule(k), _capsule(v), _capsule(out), _capsule(lse), **opts
        )
    if code != "ok":
        raise_status(code, msg, opts, varlen[0] is not None)


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    varlen: Tuple[Optional[Any], Optional[Any], Optional[Any], Optional[Any]],
    mask: str,
    wl: int,
    wr: int,
    scale: float,
    backend: str,
    det: bool,
) -> Tuple[Tensor, Tensor]:
    """(O, LSE) of [b, s, h, d] views (varlen: b = 1, lengths in `varlen`)."""
    out = empty_like_order(q.shape[:-1] + v.shape[-1:], q)
    lse = _empty_lse(q)
    run_forward(q, k, v, out, lse, varlen, mask, wl, wr, scale, backend, det)
    return out, lse


def head_dim_dense(t: Tensor) -> Tensor:
    # Gradients handed to us by autograd may be expanded (stride 0) or otherwise lack a unit
    # head-dim stride; the library needs one, so only then make a copy.
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    varlen: Tuple[Optional[Any], Optional[Any], Optional[Any], Optional[Any]],
    mask: str,
    wl: int,
    wr: int,
    scale: float,
    backend: str,
    det: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """(dQ, dK, dV), each in the dimension order of its input."""
    dq = empty_like_order(q.shape, q)
    dk = empty_like_order(k.shape, k)
    dv = empty_like_order(v.shape, v)
    dout = head_dim_dense(dout)
    caps = (
        _capsule(q),
        _capsule(k),
        _capsule(v),
        _capsule(out),
        _capsule(dout),
        _capsule(lse),
        _capsule(dq),
        _capsule(dk),
        _capsule(dv),
    )
    if q.is_cuda:
        index = q.get_device()
        opts = _options(varlen, mask, wl, wr, scale, backend, det, _stream(index))
        with _Device(index):
            code, msg = _ext.backward(*caps, **opts)
    else:
        opts = _options(varlen, mask, wl, wr, scale, backend, det, 0)
        code, msg = _ext.backward(*caps, **opts)
    if code != "ok":
        raise_status(code, msg, opts, varlen[0] is not None)
    return dq, dk, dv


# ----------------------------------------------------------------------------- layouts

# How the caller's tensors map onto the library's [b, s, h, d]: as they are, seq first
# ([s, b, h, d], TransformerEngine's sbhd) or one sequence dim of tokens ([t, h, d], thd).
# Doing the transpose or unsqueeze here, inside the autograd function, instead of around it
# saves an autograd node per tensor (each one a few µs in the forward and the backward).
BSHD, SBHD, THD = 0, 1, 2


def to_bshd(t: Tensor, layout: int) -> Tensor:
    if layout == SBHD:
        return t.transpose(0, 1)
    if layout == THD:
        return t.unsqueeze(0)
    return t


def from_bshd(t: Tensor, layout: int) -> Tensor:
    if layout == SBHD:
        return t.transpose(0, 1)
    if layout == THD:
        return t.squeeze(0)
    return t


def views(q, out, lse, layout, flat):
    """The library's [b, s, h, d_v] view of O and [b, h, s] view of LSE (as forward_layout
    allocates them)."""
    o_nf = out.view(*q.shape[:-1], -1) if flat else out  # (unpacked: faster than a Size)
    return to_bshd(o_nf, layout), lse.unsqueeze(0) if layout == THD else lse


def forward_layout(q, k, v, varlen, mask, wl, wr, scale, backend, det, layout, flat):
    """(O, LSE) for the caller's layout: O in q's coordinates and dimension order, its last
    two dims merged when flat (allocated that way: the O returned is its own base, and no
    view of it outlives the call, so autograd's in-place checks stay the usual ones); LSE
    [b, h, s] ([h, t] for thd)."""
    shape = q.shape[:-1] + v.shape[-1:]
    if flat:
        strides = _strides(shape, q, True)
        out = q.new_empty_strided(shape[:-2] + (shape[-2] * shape[-1],), strides[:-2] + (1,))
    else:
        out = empty_like_order(shape, q)
    if layout == THD:
        t, h = q.shape[0], q.shape[1]
        lse = q.new_empty_strided((h, t), (t, 1), dtype=torch.float32)
    else:
        lse = _empty_lse(to_bshd(q, layout))
    o4, lse4 = views(q, out, lse, layout, flat)
    run_forward(
        to_bshd(q, layout),
        to_bshd(k, layout),
        to_bshd(v, layout),
        o4,
        lse4,
        varlen,
        mask,
        wl,
        wr,
        scale,
        backend,
        det,
    )
    return out, lse


def backward_layout(
    dout, q, k, v, out, lse, varlen, mask, wl, wr, scale, backend, det, layout, flat
):
    """(dQ, dK, dV) in the caller's coordinates, for forward_layout's O and LSE."""
    if flat:
        dout = dout.reshape(*q.shape[:-1], v.shape[-1])
    o4, lse4 = views(q, out, lse, layout, flat)
    dq, dk, dv = backward(
        to_bshd(dout, layout),
        to_bshd(q, layout),
        to_bshd(k, layout),
        to_bshd(v, layout),
        o4,
        lse4,
        varlen,
        mask,
        wl,
        wr,
        scale,
        backend,
        det,
    )
    return from_bshd(dq, layout), from_bshd(dk, layout), from_bshd(dv, layout)
