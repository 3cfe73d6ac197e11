"""The PyTorch autograd op of strideattn: `attention(q, k, v, ...)`, differentiable over any
strided views (e.g. the `split` of a fused QKV projection, passed straight in). Forward and
backward are custom ops (`torch.ops.strideattn.attention_fwd/_bwd`, registered with
torch.library, with fake implementations), so it works under torch.compile. Gradients come
back as new tensors that autograd accumulates into the views' bases (e.g. the fused
buffer's .grad). Importing this module registers `attention` with strideattn._core, which
then routes strideattn.attention() calls on tensors that require grad here.

Work runs on torch.cuda.current_stream() of the tensors' device. The LSE output is not
differentiable (gradients through it are not propagated)."""

from __future__ import annotations

import contextlib
import math
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _checks, _core, _ext
from ._util import canonical_mask, describe, dim_order, int_list, raise_status, window_pair

# ----------------------------------------------------------------------------- helpers


def _alloc(
    shape: Sequence[int], dtype: torch.dtype, device: torch.device, like: Tensor, zero: bool
) -> Tensor:
    """A tensor of logical `shape` laid out in `like`'s dimension order (head dim innermost);
    the real and the fake implementations share this, so their strides agree."""
    order = dim_order(tuple(like.shape), tuple(like.stride()))
    phys = [shape[i] for i in order]
    inverse = [0] * len(order)
    for pos, dim in enumerate(order):
        inverse[dim] = pos
    make = torch.zeros if zero else torch.empty
    return make(phys, dtype=dtype, device=device).permute(inverse)


def _lse_shape(q: Tensor) -> List[int]:
    return [q.shape[0], q.shape[2], q.shape[1]]


def _scope(t: Tensor):
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.device.type == "cuda" else 0


def _ints(t: Optional[Tensor]) -> List[int]:
    return [] if t is None else [int(x) for x in t.tolist()]


def _head_dim_dense(t: Tensor) -> Tensor:
    # Gradients handed to us by autograd may be expanded (stride 0) or otherwise lack a unit
    # head-dim stride; the library needs one, so only then make a copy.
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _options(
    mask, window_left, window_right, scale, backend, deterministic, sq, skv, oq, okv, stream
):
    return dict(
        mask=mask,
        window_left=window_left,
        window_right=window_right,
        scale=scale,
        deterministic=deterministic,
        seqlens_q=_ints(sq),
        seqlens_kv=_ints(skv),
        offsets_q=_ints(oq),
        offsets_kv=_ints(okv),
        backend=backend,
        stream=stream,
    )


# ----------------------------------------------------------------------------- custom ops


@torch.library.custom_op("strideattn::attention_fwd", mutates_args=())
def _attention_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    seqlens_q: Optional[Tensor],
    seqlens_kv: Optional[Tensor],
    offsets_q: Optional[Tensor],
    offsets_kv: Optional[Tensor],
    mask: str,
    window_left: int,
    window_right: int,
    scale: float,
    backend: str,
    deterministic: bool,
) -> Tuple[Tensor, Tensor]:
    varlen = seqlens_q is not None
    with _scope(q):
        out = _alloc(list(q.shape[:-1]) + [v.shape[-1]], q.dtype, q.device, q, zero=varlen)
        lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=q.device)
        if varlen:
            lse.fill_(-math.inf)  # padding tokens: no sequence covers them
        opts = _options(
            mask,
            window_left,
            window_right,
            scale,
            backend,
            deterministic,
            seqlens_q,
            seqlens_kv,
            offsets_q,
            offsets_kv,
            _stream(q),
        )
        code, msg = _ext.forward(q, k, v, out, lse, **opts)
    raise_status(code, msg, opts, varlen)
    return out, lse


@_attention_fwd.register_fake
def _attention_fwd_fake(
    q,
    k,
    v,
    seqlens_q,
    seqlens_kv,
    offsets_q,
    offsets_kv,
    mask,
    window_left,
    window_right,
    scale,
    backend,
    deterministic,
):
    out = _alloc(list(q.shape[:-1]) + [v.shape[-1]], q.dtype, q.device, q, zero=False)
    lse = q.new_empty(_lse_shape(q), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("strideattn::attention_bwd", mutates_args=())
def _attention_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    seqlens_q: Optional[Tensor],
    seqlens_kv: Optional[Tensor],
    offsets_q: Optional[Tensor],
    offsets_kv: Optional[Tensor],
    mask: str,
    window_left: int,
    window_right: int,
    scale: float,
    backend: str,
    deterministic: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    varlen = seqlens_q is not None
    with _scope(q):
        dq = _alloc(q.shape, q.dtype, q.device, q, zero=varlen)
        dk = _alloc(k.shape, k.dtype, k.device, k, zero=varlen)
        dv = _alloc(v.shape, v.dtype, v.device, v, zero=varlen)
        opts = _options(
            mask,
            window_left,
            window_right,
            scale,
            backend,
            deterministic,
            seqlens_q,
            seqlens_kv,
            offsets_q,
            offsets_kv,
            _stream(q),
        )
        code, msg = _ext.backward(q, k, v, out, _head_dim_dense(dout), lse, dq, dk, dv, **opts)
    raise_status(code, msg, opts, varlen)
    return dq, dk, dv


@_attention_bwd.register_fake
def _attention_bwd_fake(
    dout,
    q,
    k,
    v,
    out,
    lse,
    seqlens_q,
    seqlens_kv,
    offsets_q,
    offsets_kv,
    mask,
    window_left,
    window_right,
    scale,
    backend,
    deterministic,
):
    return (
        _alloc(q.shape, q.dtype, q.device, q, zero=False),
        _alloc(k.shape, k.dtype, k.device, k, zero=False),
        _alloc(v.shape, v.dtype, v.device, v, zero=False),
    )


def _setup_context(ctx, inputs, output):
    (q, k, v, sq, skv, oq, okv, mask, wl, wr, scale, backend, det) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.varlen = (sq, skv, oq, okv)
    ctx.opts = (mask, wl, wr, scale, backend, det)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.strideattn.attention_bwd(dout, q, k, v, out, lse, *ctx.varlen, *ctx.opts)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------- functional


def _as_index_tensor(x, name: str) -> Optional[Tensor]:
    if x is None:
        return None
    if isinstance(x, Tensor):
        if x.dim() != 1 or x.dtype.is_floating_point:
            raise ValueError(
                f"{name} must be a 1-D integer tensor, got shape {tuple(x.shape)} dtype {x.dtype}"
            )
        return x
    return torch.tensor(int_list(x, name), dtype=torch.int64)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: str = "none",
    window=None,
    scale: Optional[float] = None,
    seqlens_q=None,
    seqlens_kv=None,
    offsets_q=None,
    offsets_kv=None,
    backend: str = "auto",
    deterministic: bool = False,
    return_lse: bool = False,
):
    """Differentiable strideattn.attention for PyTorch tensors (same arguments and shapes:
    q [b, s_q, h, d_qk] or varlen [tokens, h, d_qk] with seqlens_*/offsets_* as lists or 1-D
    integer tensors). Returns O (and the fp32, non-differentiable LSE)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {describe(x)}")
    mask = canonical_mask(mask)
    if not isinstance(backend, str):
        raise ValueError(
            f"backend must be a string (auto, reference, cpu, cuda, cudnn); got {describe(backend)}"
        )
    left, right = window_pair(window)
    if q.dim() not in (3, 4) or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            f"q, k, v must all have 4 dimensions [b, s, h, d] (or 3 for varlen "
            f"[tokens, h, d]); got {q.dim()}, {k.dim()}, {v.dim()}"
        )
    scale = _checks.scale(scale)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] > 0 else 1.0
    sq, skv = _as_index_tensor(seqlens_q, "seqlens_q"), _as_index_tensor(seqlens_kv, "seqlens_kv")
    oq, okv = _as_index_tensor(offsets_q, "offsets_q"), _as_index_tensor(offsets_kv, "offsets_kv")
    if (sq is None) != (skv is None):
        raise ValueError("varlen needs both seqlens_q and seqlens_kv")
    lifted = q.dim() == 3
    if lifted:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    out, lse = torch.ops.strideattn.attention_fwd(
        q, k, v, sq, skv, oq, okv, mask, left, right, float(scale), backend, bool(deterministic)
    )
    if lifted:
        out = out.squeeze(0)
    if sq is not None:
        lse = lse.squeeze(0)  # [h, tokens]
    return (out, lse) if return_lse else out


def _wants_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in (q, k, v))


# strideattn.attention() on tensors that need gradients comes here (it does not import us).
_core.register_autograd("torch", _wants_grad, attention)
