"""The PyTorch autograd op of strideattn: `attention(q, k, v, ...)`, differentiable over any
strided views (e.g. the `split` of a fused QKV projection, passed straight in). Gradients
come back as new tensors that autograd accumulates into the views' bases (e.g. the fused
buffer's .grad). Importing this module registers `attention` with strideattn._core, which
then routes strideattn.attention() calls on tensors that require grad here.

Two ways through, one implementation (strideattn/_torch_call.py):
- Eager, on plain tensors with no dispatch mode, tracer or functorch transform active (what
  a training loop and a CUDA-graph capture do): `_Attention`, an autograd.Function whose
  forward and backward call the extension directly. torch.library.custom_op costs about
  50 µs per call on the host in its Python layers (argument normalisation against the
  schema, pytree handling), more than the whole SDPA call it stands in for.
- Everything else (torch.compile, FakeTensor, export, opcheck, dispatch modes): the ops
  `torch.ops.strideattn.attention_fwd` / `attention_bwd`, declared with torch.library's
  low-level registration: CPU and CUDA kernels, fake kernels for tracing, and an Autograd
  kernel that runs `_Attention` (whose forward then re-dispatches below autograd).

Work runs on the current CUDA stream of the tensors' device. The LSE output is not
differentiable (gradients through it are not propagated); the backward is not itself
differentiable (double backward raises)."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import _checks, _core
from . import _torch_call as call
from ._util import (
    CU_SEQLENS_ARRAYS,
    canonical_mask,
    cu_seqlens_bounds,
    describe,
    int_list,
    window_pair,
)

# ----------------------------------------------------------------------------- the ops

_lib = torch.library.Library("strideattn", "DEF")  # noqa: TOR901 - the ops' own namespace
_OPTS = "str mask, int window_left, int window_right, float scale, str backend, bool deterministic"
_VARLEN = "Tensor? seqlens_q, Tensor? seqlens_kv, Tensor? offsets_q, Tensor? offsets_kv"
_lib.define(f"attention_fwd(Tensor q, Tensor k, Tensor v, {_VARLEN}, {_OPTS}) -> (Tensor, Tensor)")
_lib.define(
    "attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
    f"{_VARLEN}, {_OPTS}) -> (Tensor, Tensor, Tensor)"
)


def _fwd_kernel(q, k, v, sq, skv, oq, okv, mask, wl, wr, scale, backend, det):
    return call.forward(q, k, v, (sq, skv, oq, okv), mask, wl, wr, scale, backend, det)


def _bwd_kernel(dout, q, k, v, out, lse, sq, skv, oq, okv, mask, wl, wr, scale, backend, det):
    return call.backward(
        dout, q, k, v, out, lse, (sq, skv, oq, okv), mask, wl, wr, scale, backend, det
    )


for _key in ("CPU", "CUDA"):
    _lib.impl("attention_fwd", _fwd_kernel, _key)
    _lib.impl("attention_bwd", _bwd_kernel, _key)


@torch.library.register_fake("strideattn::attention_fwd", lib=_lib)
def _fwd_fake(q, k, v, sq, skv, oq, okv, mask, wl, wr, scale, backend, det):
    out = call.fake_like_order(q.shape[:-1] + v.shape[-1:], q)
    return out, q.new_empty(call.lse_shape(q), dtype=torch.float32)


@torch.library.register_fake("strideattn::attention_bwd", lib=_lib)
def _bwd_fake(dout, q, k, v, out, lse, sq, skv, oq, okv, mask, wl, wr, scale, backend, det):
    return (
        call.fake_like_order(q.shape, q),
        call.fake_like_order(k.shape, k),
        call.fake_like_order(v.shape, v),
    )


# ----------------------------------------------------------------------------- autograd


def _eager(q, k, v) -> bool:
    """Whether the extension may be called directly: not under torch.compile (checked first:
    dynamo then never traces the rest), plain tensors, and no dispatch mode, JIT tracer or
    functorch transform that expects to see the op. The checks are bound once (module
    attribute lookups on every call cost more than the checks themselves)."""
    return (
        not torch.compiler.is_compiling()
        and type(q) is Tensor
        and type(k) is Tensor
        and type(v) is Tensor
        and not _dispatch_modes()
        and not _tracing_state()
        and _functorch_interpreter() is None
    )


# (torch.compiler.is_compiling stays an attribute lookup: dynamo recognises that call.)
_dispatch_modes = torch._C._len_torch_dispatch_stack
_tracing_state = torch._C._get_tracing_state
_functorch_interpreter = torch._C._functorch.peek_interpreter_stack


class _Attention(torch.autograd.Function):
    """O (and LSE) = attention(q, k, v). `args` is (direct, seqlens_q, seqlens_kv, offsets_q,
    offsets_kv, mask, window_left, window_right, scale, backend, deterministic, layout, flat,
    with_lse): one tuple, since every argument of apply() costs host time. direct: the
    caller checked _eager(), the extension is called here (in the caller's layout, see
    _torch_call.forward_layout); else the op runs below autograd ([b, s, h, d], not flat).
    with_lse: LSE is an output (non-differentiable) as well as saved; without it O is the
    only output, so autograd has no LSE gradient to make. Saved: q, k, v, O, LSE (as
    returned: the backward takes its views again)."""

    @staticmethod
    def forward(ctx, q, k, v, args):
        direct, sq, skv, oq, okv, mask, wl, wr, scale, backend, det, layout, flat, with_lse = args
        if direct:
            out, lse = call.forward_layout(
                q, k, v, (sq, skv, oq, okv), mask, wl, wr, scale, backend, det, layout, flat, ctx
            )
            # The backward handles an absent dO: autograd need not make zeros for it.
            ctx.set_materialize_grads(False)
        else:
            with torch._C._AutoDispatchBelowAutograd():
                out, lse = torch.ops.strideattn.attention_fwd.default(q, k, v, *args[1:11])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = args
        if with_lse:
            ctx.mark_non_differentiable(lse)
            return out, lse
        return out

    @staticmethod
    def backward(ctx, dout, *_dlse):
        if dout is None:  # no gradient reached O (only the direct path lets this through)
            return None, None, None, None
        if _grad_enabled():  # create_graph: the gradients refuse a second backward
            return _backward_once(ctx, dout)
        q, k, v, out, lse = ctx.saved_tensors
        direct, sq, skv, oq, okv, mask, wl, wr, scale, backend, det, layout, flat, _ = ctx.args
        if direct and type(dout) is Tensor and _eager(q, k, v):  # _backward's first branch
            dq, dk, dv = call.backward_layout(
                dout, q, k, v, out, lse, (sq, skv, oq, okv), mask, wl, wr, scale, backend, det,
                layout, flat, ctx.plan,
            )  # fmt: skip
            return dq, dk, dv, None
        return _backward(ctx, dout)


_grad_enabled = torch.is_grad_enabled


def _backward(ctx, dout):
    q, k, v, out, lse = ctx.saved_tensors
    direct, sq, skv, oq, okv, mask, wl, wr, scale, backend, det, layout, flat, _ = ctx.args
    if direct and type(dout) is Tensor and _eager(q, k, v):
        dq, dk, dv = call.backward_layout(
            dout, q, k, v, out, lse, (sq, skv, oq, okv), mask, wl, wr, scale, backend, det,
            layout, flat, ctx.plan,
        )  # fmt: skip
    else:
        if type(sq) is call.CuSeqlens:
            raise NotImplementedError(
                "the backward of a cu_seqlens_q/cu_seqlens_kv call under a dispatch mode, a "
                "tracer or a functorch transform (or with a tensor subclass as dO): not "
                "supported; pass the lengths as seqlens_q/seqlens_kv there"
            )
        if flat:
            dout = dout.reshape(*q.shape[:-1], v.shape[-1])
        o4, lse4 = call.views(q, out, lse, layout, flat)
        dq, dk, dv = torch.ops.strideattn.attention_bwd.default(
            call.to_bshd(dout, layout),
            call.to_bshd(q, layout),
            call.to_bshd(k, layout),
            call.to_bshd(v, layout),
            o4,
            lse4,
            *_as_tensors(sq, skv, oq, okv),
            mask, wl, wr, scale, backend, det,
        )  # fmt: skip
        dq, dk, dv = (call.from_bshd(t, layout) for t in (dq, dk, dv))
    return dq, dk, dv, None


# With grad mode on in the backward (create_graph=True): run without recording, and mark the
# results so that differentiating them again raises (double backward is not supported).
_backward_once = once_differentiable(_backward)

# Function.apply without its Python layer (default-argument binding, functorch dispatch and
# the unwrapping of a transform's dead wrappers: ~3 µs a call), for the eager path, which
# runs only with no functorch transform active (_eager) and on tensors with storage (a dead
# wrapper has none: attend() sends those through Function.apply).
_apply = torch._C._FunctionBase.__dict__.get("apply")
_apply = _apply.__get__(None, _Attention) if _apply is not None else _Attention.apply


def _fwd_autograd(q, k, v, *rest):
    # The Autograd kernel of attention_fwd: records _Attention when a gradient is wanted,
    # else runs the kernel below it.
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _Attention.apply(q, k, v, (False, *rest, call.BSHD, False, True))
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.strideattn.attention_fwd.default(q, k, v, *rest)


def _bwd_autograd(dout, q, k, v, out, lse, *rest):
    if torch.is_grad_enabled() and any(
        t.requires_grad for t in (dout, q, k, v, out, lse) if t is not None
    ):
        raise RuntimeError(
            "strideattn::attention_bwd is not differentiable (double backward through "
            "strideattn attention is not supported)"
        )
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.strideattn.attention_bwd.default(dout, q, k, v, out, lse, *rest)


_lib.impl("attention_fwd", _fwd_autograd, "Autograd")
_lib.impl("attention_bwd", _bwd_autograd, "Autograd")


# ----------------------------------------------------------------------------- functional


def _index(x, name: str):
    """Sequence lengths or offsets: None, a list of ints, or a 1-D integer tensor (kept as
    it is: the ops take tensors, and the extension call reads them)."""
    if x is None:
        return None
    if isinstance(x, Tensor):
        if x.dim() != 1 or x.dtype.is_floating_point or x.dtype == torch.bool:
            raise ValueError(
                f"{name} must be a 1-D integer tensor, got shape {tuple(x.shape)} dtype {x.dtype}"
            )
        return x
    return int_list(x, name)


def _as_tensors(*xs):
    """Lists as int64 tensors (what the ops' schema takes); tensors and None unchanged."""
    return tuple(torch.tensor(x, dtype=torch.int64) if isinstance(x, list) else x for x in xs)


_MASKS = {}  # mask argument -> canonical name, for names seen before


def _mask(mask) -> str:
    got = _MASKS.get(mask) if isinstance(mask, str) else None
    if got is None:
        got = canonical_mask(mask)
        if len(_MASKS) < 64:
            _MASKS[mask] = got
    return got


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
    cp_group=None,
    cp_comm_type: str = "p2p",
    cp_stream=None,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_kv: Optional[Tensor] = None,
    seq_offsets_q: Optional[Tensor] = None,
    seq_offsets_kv: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    **features,
):
    """Differentiable strideattn.attention for PyTorch tensors (same arguments and shapes:
    q [b, s_q, h, d_qk] or varlen [tokens, h, d_qk] with seqlens_*/offsets_* as lists or 1-D
    integer tensors). Returns O (and the fp32, non-differentiable LSE). With cp_group (a
    torch.distributed group), each rank passes its shard of the sequence: see
    strideattn.torch.cp_attention. Training features (strideattn.attention's dropout_p,
    dropout_seed, dropout_offset, dropout_rng, bias, bias_type, alibi_slopes, softcap, sinks,
    return_max_logit) run eagerly through strideattn/_torch_features.py: gradients reach a
    bias and sinks that require grad; the max logit comes after O and the LSE.

    Varlen lengths may instead come as FlashAttention's and TransformerEngine's device
    arrays: cu_seqlens_q / cu_seqlens_kv (int32, count + 1 cumulative entries, on q's
    device), optional seq_offsets_q / seq_offsets_kv (int32, count entries: where each
    sequence starts when they are padded apart) and the bounds max_seqlen_q / max_seqlen_kv
    (required: what a plan is made for). They are passed to the kernels as they are: nothing
    is read on the host, nothing synchronises, and a captured CUDA graph replays with the
    arrays' new contents. Eager only (not under torch.compile, a dispatch mode or a functorch
    transform), without training features or cp_group: those refuse them by name."""
    cu = None
    if not (cu_seqlens_q is None and cu_seqlens_kv is None and seq_offsets_q is None
            and seq_offsets_kv is None and max_seqlen_q is None and max_seqlen_kv is None):  # fmt: skip
        cu = _cu_seqlens(
            q, k, v, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q, seq_offsets_kv, max_seqlen_q,
            max_seqlen_kv, (seqlens_q, seqlens_kv, offsets_q, offsets_kv), features, cp_group,
        )  # fmt: skip
    if features:
        from . import _torch_features

        unknown = sorted(set(features) - set(_torch_features.FEATURES))
        if unknown:
            raise TypeError(f"attention() got unexpected keyword arguments {unknown}")
        if cp_group is not None:
            raise NotImplementedError(
                f"{', '.join(sorted(features))}: training features with context parallelism "
                "(cp_group) are not supported"
            )
        return _torch_features.attention(
            q, k, v, mask=mask, window=window, scale=scale, seqlens_q=seqlens_q,
            seqlens_kv=seqlens_kv, offsets_q=offsets_q, offsets_kv=offsets_kv, backend=backend,
            deterministic=deterministic, return_lse=return_lse, **features,
        )  # fmt: skip
    if cp_group is not None:
        from ._torch_cp import cp_attention

        return cp_attention(
            q, k, v, cp_group, cp_comm_type=cp_comm_type, mask=mask, window=window, scale=scale,
            seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, offsets_q=offsets_q,
            offsets_kv=offsets_kv, backend=backend, deterministic=deterministic,
            return_lse=return_lse, cp_stream=cp_stream,
        )  # fmt: skip
    if not (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor):
        for name, x in (("q", q), ("k", k), ("v", v)):
            if not isinstance(x, Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {describe(x)}")
    mask = _mask(mask)
    if not isinstance(backend, str):
        raise ValueError(
            f"backend must be a string (auto, reference, cpu, cuda, cudnn); got {describe(backend)}"
        )
    left, right = (-1, -1) if window is None else window_pair(window)
    nd = q.dim()
    if nd not in (3, 4) or k.dim() != nd or v.dim() != nd:
        raise ValueError(
            f"q, k, v must all have 4 dimensions [b, s, h, d] (or 3 for varlen "
            f"[tokens, h, d]); got {q.dim()}, {k.dim()}, {v.dim()}"
        )
    if scale is None:
        d = q.shape[-1]
        scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
    elif type(scale) is not float:
        scale = _checks.scale(scale)
    det = bool(deterministic)
    sq = skv = oq = okv = None
    if not (seqlens_q is None and seqlens_kv is None and offsets_q is None and offsets_kv is None):
        sq, skv = _index(seqlens_q, "seqlens_q"), _index(seqlens_kv, "seqlens_kv")
        oq, okv = _index(offsets_q, "offsets_q"), _index(offsets_kv, "offsets_kv")
        if (sq is None) != (skv is None):
            raise ValueError("varlen needs both seqlens_q and seqlens_kv")
    if cu is not None:
        sq = cu
    layout = call.THD if nd == 3 else call.BSHD
    out, lse = attend(
        q, k, v, sq, skv, oq, okv, mask, left, right, scale, backend, det, layout, False, return_lse
    )
    if not return_lse:
        return out
    if sq is not None and nd == 4:
        lse = lse.squeeze(0)  # varlen: [h, tokens]
    return out, lse


def _cu_seqlens(q, k, v, cu_q, cu_kv, off_q, off_kv, max_q, max_kv, lists, features, cp_group):
    """The CuSeqlens of attention()'s device-array keywords, checked: both cu_seqlens arrays
    and both bounds, tensors (the library checks their dtype, extent and device), no host
    lengths beside them, no features or cp_group, and an eager call."""
    if features or cp_group is not None:
        what = ", ".join(sorted(features)) if features else "cp_group"
        raise NotImplementedError(
            f"cu_seqlens_q/cu_seqlens_kv with {what}: not supported; pass the lengths as "
            "seqlens_q/seqlens_kv (host lists or tensors) there"
        )
    if any(x is not None for x in lists):
        raise ValueError(
            "cu_seqlens_q/cu_seqlens_kv (device arrays) and seqlens_q/seqlens_kv/offsets_q/"
            "offsets_kv (host lengths) describe the same thing; pass one of the two"
        )
    arrays = dict(zip(CU_SEQLENS_ARRAYS, (cu_q, cu_kv, off_q, off_kv)))
    bounds = cu_seqlens_bounds(arrays, max_q, max_kv)
    for name, x in arrays.items():
        if x is not None and not isinstance(x, Tensor):
            raise ValueError(
                f"{name} must be a torch.Tensor (int32, on q's device), got {describe(x)}"
            )
    assert bounds is not None  # the caller passes at least one of the keywords
    if not _eager(q, k, v):
        raise NotImplementedError(
            "cu_seqlens_q/cu_seqlens_kv under torch.compile, a dispatch mode or a functorch "
            "transform, or with a tensor subclass as q, k or v: not supported; pass the "
            "lengths as seqlens_q/seqlens_kv there"
        )
    return call.CuSeqlens(cu_q, cu_kv, off_q, off_kv, *bounds)


def attend(
    q, k, v, sq, skv, oq, okv, mask, wl, wr, scale, backend, det, layout, flat=False, with_lse=True
):
    """(O, LSE) of checked arguments (canonical mask, window pair, float scale, lengths as
    lists or tensors) in a layout of _torch_call (BSHD, SBHD, THD); flat merges O's heads
    and head dim (TransformerEngine's output). with_lse False: the caller has no use for the
    LSE, which may then come back as None. The eager path calls the extension from
    _Attention (or directly, with no gradient wanted); the rest goes through the op."""
    if _eager(q, k, v):
        if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            args = (
                True, sq, skv, oq, okv, mask, wl, wr, scale, backend, det, layout, flat, with_lse
            )  # fmt: skip
            try:
                q.data_ptr(), k.data_ptr(), v.data_ptr()
            except RuntimeError:  # no storage (a dead functorch wrapper): the full apply
                r = _Attention.apply(q, k, v, args)
            else:
                r = _apply(q, k, v, args)
            return r if with_lse else (r, None)
        return call.forward_layout(
            q, k, v, (sq, skv, oq, okv), mask, wl, wr, scale, backend, det, layout, flat
        )
    out, lse = torch.ops.strideattn.attention_fwd.default(
        call.to_bshd(q, layout),
        call.to_bshd(k, layout),
        call.to_bshd(v, layout),
        *_as_tensors(sq, skv, oq, okv),
        mask, wl, wr, scale, backend, det,
    )  # fmt: skip
    out = call.from_bshd(out, layout)
    if layout == call.THD:
        lse = lse.squeeze(0)  # [h, tokens]
    if flat:
        out = out.reshape(out.shape[:-2] + (-1,))
    return out, lse


def _wants_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in (q, k, v))


# strideattn.attention() on tensors that need gradients comes here (it does not import us).
_core.register_autograd("torch", _wants_grad, attention)
_core.register_plan_cache(call.clear_plans)
