"""The eager calls from PyTorch tensors into the extension: forward() and backward() allocate
the outputs (in the dimension order of the matching input, head dim innermost) and run the
library on the tensors' device and current stream. Both the autograd function's fast path
and the registered ops' CPU and CUDA kernels (strideattn/_torch_ops.py) come here, so there
is one place that knows how the extension is called:

- each problem's plans are kept here (see "plans" below) and run with integer addresses;
  the first call of a problem goes through DLPack capsules (torch.utils.dlpack.to_dlpack,
  a C function; the tensors' __dlpack__ method is Python and several times slower), with
  the extension's checks and errors;
- the stream is the raw current stream of the tensors' device, the device is entered only
  when it is not already the current one;
- outputs are torch.empty_strided (the library writes every element of every output, padding
  tokens too: docs/semantics.md, "Which elements are written"); a device run's workspace is
  a torch.empty from the caching allocator;
- varlen lengths go through _varlen() (host lists); cu_seqlens arrays on the tensors'
  device come as a CuSeqlens in the varlen tuple's first slot and reach the library as they
  are (their addresses on a plan's run): nothing is read back, nothing synchronises.
No torch.library or autograd machinery here."""

from __future__ import annotations

import atexit
import weakref
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


class CuSeqlens:
    """Varlen lengths as FlashAttention and TransformerEngine keep them: int32 arrays on the
    tensors' device, cu_seqlens_q / cu_seqlens_kv (count + 1 cumulative entries) and optional
    seq_offsets_q / seq_offsets_kv (count entries: where each sequence starts, for padding
    between sequences), with the caller's bounds max_seqlen_q / max_seqlen_kv (what a plan is
    made for; the library clamps each length to them, docs/semantics.md). Carried in the
    first slot of a varlen tuple (the others None) and handed to the library as they are:
    the plans' key holds the arrays' metadata and the bounds, never their values, and a run
    takes their addresses, so nothing is read on the host and nothing synchronises."""

    __slots__ = ("arrays", "max_q", "max_kv", "key")

    def __init__(self, cu_q: Tensor, cu_kv: Tensor, off_q, off_kv, max_q: int, max_kv: int):
        self.arrays = (cu_q, cu_kv, off_q, off_kv)
        self.max_q, self.max_kv = max_q, max_kv
        self.key = (max_q, max_kv) + tuple(
            None if a is None else (a.shape, a.stride(), a.dtype, a.device) for a in self.arrays
        )

    def pointers(self) -> Tuple[int, int, int, int]:
        return tuple(0 if a is None else a.data_ptr() for a in self.arrays)

    def options(self) -> dict:
        """The extension keywords (DLPack capsules of the arrays, the bounds)."""
        names = ("cu_seqlens_q", "cu_seqlens_kv", "seq_offsets_q", "seq_offsets_kv")
        opts = {n: _capsule(a) for n, a in zip(names, self.arrays) if a is not None}
        opts.update(max_seqlen_q=self.max_q, max_seqlen_kv=self.max_kv)
        return opts


def _lists(varlen) -> Optional[tuple]:
    """The varlen lengths and offsets as tuples (a plan's key holds them), a CuSeqlens's key,
    or None for a dense call."""
    sq, skv, oq, okv = varlen
    if sq is None and skv is None and oq is None and okv is None:
        return None
    if type(sq) is CuSeqlens:
        return sq.key
    return (tuple(_varlen(sq)), tuple(_varlen(skv)), tuple(_varlen(oq)), tuple(_varlen(okv)))


def device_int32(a: Any, like: Tensor) -> bool:
    """Whether a cu_seqlens array can go to the kernels as it is: a tensor, int32, 1-D, unit
    stride, on like's device (what the extension takes; anything else is read on the host)."""
    return (
        isinstance(a, Tensor)
        and a.dtype == torch.int32
        and a.dim() == 1
        and a.device == like.device
        and (a.shape[0] < 2 or a.stride(0) == 1)
    )


def _cu(varlen) -> Optional[CuSeqlens]:
    return varlen[0] if type(varlen[0]) is CuSeqlens else None


class _Device:
    """Enters CUDA device `index` only when it is not the current one (a context manager
    for each call costs more than the check). The tensors' existence means CUDA is
    initialised, so the raw getter and setter serve."""

    __slots__ = ("index", "prev")

    def __init__(self, index: int):
        self.index, self.prev = index, -1

    def __enter__(self):
        cur = _get_device()
        if cur != self.index:
            self.prev = cur
            _set_device(self.index)
        return self

    def __exit__(self, *exc):
        if self.prev >= 0:
            _set_device(self.prev)
        return False


_get_device = getattr(torch._C, "_cuda_getDevice", None) or (lambda: torch.cuda.current_device())
_set_device = getattr(torch._C, "_cuda_setDevice", None) or (lambda i: torch.cuda.set_device(i))


def _stream(index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _options(lists, mask, wl, wr, scale, backend, det, stream, cu=None) -> dict:
    """The extension's keywords of a call (cu: the CuSeqlens of the call, whose key `lists`
    then is)."""
    if cu is not None:
        opts = _options(None, mask, wl, wr, scale, backend, det, stream)
        opts.update(cu.options())
        return opts
    sq, skv, oq, okv = lists or ((), (), (), ())
    return dict(
        mask=mask,
        window_left=wl,
        window_right=wr,
        scale=scale,
        deterministic=det,
        seqlens_q=list(sq),
        seqlens_kv=list(skv),
        offsets_q=list(oq),
        offsets_kv=list(okv),
        backend=backend,
        stream=stream,
    )


def _raise(code: str, msg: str, lists, varlen) -> None:
    cu = _cu(varlen)
    opts = _options(None if cu is not None else lists, "", 0, 0, 0.0, "", False, 0)
    raise_status(code, msg, opts, varlen[0] is not None)


# ----------------------------------------------------------------------------- plans

# The eager path's per-problem decisions, kept the way a plan cache keeps them: keyed by
# everything that determines them (each input's shape, strides, dtype and device, the
# caller's layout, the options and the varlen lists), each entry holds the extension's plan
# (run with integer addresses: no DLPack import, option parsing or plan lookup in C++), the
# outputs' shapes and strides, and the workspace size. A miss makes the call through the
# extension's forward_planned / backward_planned (the checks and errors of any call), which
# hand back the plan they ran. Plans assume 16-byte aligned data (what the allocator gives);
# a call with a less aligned input takes the miss path, which the extension's own cache,
# keyed by alignment, serves. Bounded as the extension's cache is (a model has a handful of
# problems; varlen lists that change every step make one each): the oldest entry goes first.
_PLANS: Dict[tuple, "_Plan"] = {}
_CAPACITY = 128
_BACKWARDS = 8  # backward plans per forward entry (one per dO stride pattern)


class _Plan:
    """A forward problem's plan and outputs, and its backward plans by (dO strides, saved
    tensors' strides). `index`: the CUDA device, -1 for host memory."""

    __slots__ = ("plan", "device", "index", "dtype", "o_shape", "o_stride", "l_shape", "l_stride")
    __slots__ += ("ws", "backwards", "__weakref__")

    def __init__(self, plan, q: Tensor, out: Tensor, lse: Tensor):
        self.plan, self.device, self.dtype = plan, q.device, q.dtype
        self.index = q.get_device() if q.is_cuda else -1
        self.o_shape, self.o_stride = tuple(out.shape), out.stride()
        self.l_shape, self.l_stride = tuple(lse.shape), lse.stride()
        self.ws = plan.workspace_size
        self.backwards: Dict[tuple, "_BackwardPlan"] = {}
        _LIVE.add(self)


class _BackwardPlan:
    __slots__ = ("plan", "ws", "shapes", "strides")

    def __init__(self, plan, grads: Sequence[Tensor]):
        self.plan, self.ws = plan, plan.workspace_size
        self.shapes = tuple(tuple(g.shape) for g in grads)
        self.strides = tuple(g.stride() for g in grads)


def clear_plans() -> None:
    """Drops the eager path's plans (strideattn.clear_plan_cache() calls this)."""
    _PLANS.clear()


# How many forward and backward calls took the miss path (the extension's planned call),
# counted there only: the hit path pays nothing for it. A steady loop over one problem
# adds none after its first step (bench/host_overhead.py reports them per column).
_MADE = [0, 0]


def plans_made() -> Tuple[int, int]:
    """(forward, backward) calls so far that missed the eager path's plans."""
    return _MADE[0], _MADE[1]


# Every entry still referenced (by the cache or by an autograd graph's context), so that
# the extension's plan objects are let go at exit, before the extension's own teardown
# (which reports, on stderr, any of its objects still alive then).
_LIVE: "weakref.WeakSet[_Plan]" = weakref.WeakSet()


@atexit.register
def _release_at_exit() -> None:
    _PLANS.clear()
    for ent in list(_LIVE):
        ent.plan = None
        ent.backwards.clear()


_empty_strided = torch.empty_strided
_F32 = torch.float32


def _key(q, k, v, lists, mask, wl, wr, scale, backend, det, layout, flat) -> tuple:
    """A problem's key in _PLANS (forward_layout writes the same tuple out)."""
    return (
        q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
        q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
        layout, flat, mask, wl, wr, scale, backend, det, lists,
    )  # fmt: skip


def _aligned(*ptrs: int) -> bool:
    acc = 0
    for p in ptrs:
        acc |= p
    return not acc & 15


def _workspace(nbytes: int, device) -> Tuple[Optional[Tensor], int]:
    """Scratch for a device run from PyTorch's caching allocator (no cudaMalloc on the call
    path; stream-ordered reuse after the call)."""
    if not nbytes:
        return None, 0
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return ws, ws.data_ptr()


# ----------------------------------------------------------------------------- forward


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
    return _forward_layout(q, k, v, varlen, mask, wl, wr, scale, backend, det, BSHD, False)


def forward_layout(q, k, v, varlen, mask, wl, wr, scale, backend, det, layout, flat, keep=None):
    """(O, LSE) for the caller's layout: O in q's coordinates and dimension order, its last
    two dims merged when flat (allocated that way: the O returned is its own base, and no
    view of it outlives the call, so autograd's in-place checks stay the usual ones); LSE
    [b, h, s] ([h, t] for thd). keep: an object (the autograd context) whose `plan`
    attribute receives the problem's cached plans (None where the call was not cached), for
    backward_layout."""
    sq, skv, oq, okv = varlen
    lists = None
    if not (sq is None and skv is None and oq is None and okv is None):
        lists = _lists(varlen)
    # _key(), written out: a call costs more than the tuple
    key = (
        q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
        q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
        layout, flat, mask, wl, wr, scale, backend, det, lists,
    )  # fmt: skip
    ent = _PLANS.get(key)
    if ent is not None:
        pq, pk, pv = q.data_ptr(), k.data_ptr(), v.data_ptr()
        if not (pq | pk | pv) & 15:  # as the plan assumes
            if keep is not None:
                keep.plan = ent
            dev = ent.device
            out = _empty_strided(ent.o_shape, ent.o_stride, dtype=ent.dtype, device=dev)
            lse = _empty_strided(ent.l_shape, ent.l_stride, dtype=_F32, device=dev)
            index = ent.index
            cu = sq.pointers() if type(sq) is CuSeqlens else ()  # (device arrays' addresses)
            if index < 0:
                code, msg = ent.plan.run_forward(
                    pq, pk, pv, out.data_ptr(), lse.data_ptr(), *((0, 0, 0) + cu if cu else ())
                )
            else:
                ws, wsp = _workspace(ent.ws, dev)
                prev = _get_device()
                if prev != index:
                    _set_device(index)
                try:
                    code, msg = ent.plan.run_forward(
                        pq, pk, pv, out.data_ptr(), lse.data_ptr(), _stream(index), wsp, ent.ws,
                        *cu,
                    )  # fmt: skip
                finally:
                    if prev != index:
                        _set_device(prev)
            if code != "ok":
                _raise(code, msg, lists, varlen)
            return out, lse
    out, lse, ent = _forward_made(
        key, q, k, v, lists, varlen, mask, wl, wr, scale, backend, det, layout, flat
    )
    if keep is not None:
        keep.plan = ent
    return out, lse


_forward_layout = forward_layout  # forward()'s own reference (tests count forward_layout calls)


def _forward_made(key, q, k, v, lists, varlen, mask, wl, wr, scale, backend, det, layout, flat):
    """forward_layout's miss: the outputs allocated from the caller's strides, the call made
    through the extension's checks, and its plan kept when the pointers allow."""
    _MADE[0] += 1
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
    caps = (
        _capsule(to_bshd(q, layout)),
        _capsule(to_bshd(k, layout)),
        _capsule(to_bshd(v, layout)),
        _capsule(o4),
        _capsule(lse4),
    )
    cu = _cu(varlen)
    if q.is_cuda:
        index = q.get_device()
        opts = _options(lists, mask, wl, wr, scale, backend, det, _stream(index), cu)
        with _Device(index):
            code, msg, plan = _ext.forward_planned(*caps, **opts)
    else:
        opts = _options(lists, mask, wl, wr, scale, backend, det, 0, cu)
        code, msg, plan = _ext.forward_planned(*caps, **opts)
    if code != "ok":
        raise_status(code, msg, opts, varlen[0] is not None)
    ent = None
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr())
    if plan is not None and _aligned(*ptrs):
        if len(_PLANS) >= _CAPACITY:
            del _PLANS[next(iter(_PLANS))]
        ent = _PLANS[key] = _Plan(plan, q, out, lse)
    return out, lse, ent


# ----------------------------------------------------------------------------- backward


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
    """(dQ, dK, dV) of [b, s, h, d] views, each in the dimension order of its input."""
    return backward_layout(
        dout, q, k, v, out, lse, varlen, mask, wl, wr, scale, backend, det, BSHD, False
    )


def backward_layout(
    dout, q, k, v, out, lse, varlen, mask, wl, wr, scale, backend, det, layout, flat, plan=None
):
    """(dQ, dK, dV) in the caller's coordinates, for forward_layout's O and LSE. plan: the
    forward's cached plans (forward_layout's `keep`), else looked up as the forward did."""
    dstride = dout.stride()
    if dstride[-1] != 1 and v.shape[-1] != 1:
        # Gradients handed to us by autograd may be expanded (stride 0) or otherwise lack a
        # unit head-dim stride; the library needs one, so only then make a copy.
        dout = dout.contiguous()
        dstride = dout.stride()
    if plan is None:
        lists = _lists(varlen)
        plan = _PLANS.get(_key(q, k, v, lists, mask, wl, wr, scale, backend, det, layout, flat))
    bkey = None
    if plan is not None:
        # The saved tensors are the forward's unless saved-tensor hooks gave back others.
        bkey = (dstride, dout.dtype, q.stride(), k.stride(), v.stride(), out.stride(), lse.stride())
        ent = plan.backwards.get(bkey)
        if ent is not None:
            pq, pk, pv, po = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
            pd, pl = dout.data_ptr(), lse.data_ptr()
            if not (pq | pk | pv | po | pd | pl) & 15:  # as the plan assumes
                dev, (sq_, sk_, sv_), (tq, tk, tv) = plan.device, ent.shapes, ent.strides
                dq = _empty_strided(sq_, tq, dtype=q.dtype, device=dev)
                dk = _empty_strided(sk_, tk, dtype=k.dtype, device=dev)
                dv = _empty_strided(sv_, tv, dtype=v.dtype, device=dev)
                index = plan.index
                sq = varlen[0]
                cu = sq.pointers() if type(sq) is CuSeqlens else ()  # (as the forward's)
                if index < 0:
                    code, msg = ent.plan.run_backward(
                        pq, pk, pv, po, pd, pl, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                        *((0, 0, 0) + cu if cu else ()),
                    )  # fmt: skip
                else:
                    ws, wsp = _workspace(ent.ws, dev)
                    prev = _get_device()
                    if prev != index:
                        _set_device(index)
                    try:
                        code, msg = ent.plan.run_backward(
                            pq, pk, pv, po, pd, pl, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                            _stream(index), wsp, ent.ws, *cu,
                        )  # fmt: skip
                    finally:
                        if prev != index:
                            _set_device(prev)
                if code != "ok":
                    _raise(code, msg, _lists(varlen), varlen)
                return dq, dk, dv
    lists = _lists(varlen)
    return _backward_made(
        plan, bkey, dout, q, k, v, out, lse, lists, varlen, mask, wl, wr, scale, backend, det,
        layout, flat,
    )  # fmt: skip


def _backward_made(
    plan, bkey, dout, q, k, v, out, lse, lists, varlen, mask, wl, wr, scale, backend, det,
    layout, flat,
):  # fmt: skip
    """backward_layout's miss: as _forward_made, the plan kept under the forward's entry."""
    _MADE[1] += 1
    dq = empty_like_order(q.shape, q)
    dk = empty_like_order(k.shape, k)
    dv = empty_like_order(v.shape, v)
    d4 = dout.view(*q.shape[:-1], v.shape[-1]) if flat else dout
    o4, lse4 = views(q, out, lse, layout, flat)
    caps = (
        _capsule(to_bshd(q, layout)),
        _capsule(to_bshd(k, layout)),
        _capsule(to_bshd(v, layout)),
        _capsule(o4),
        _capsule(to_bshd(d4, layout)),
        _capsule(lse4),
        _capsule(to_bshd(dq, layout)),
        _capsule(to_bshd(dk, layout)),
        _capsule(to_bshd(dv, layout)),
    )
    cu = _cu(varlen)
    if q.is_cuda:
        index = q.get_device()
        opts = _options(lists, mask, wl, wr, scale, backend, det, _stream(index), cu)
        with _Device(index):
            code, msg, made = _ext.backward_planned(*caps, **opts)
    else:
        opts = _options(lists, mask, wl, wr, scale, backend, det, 0, cu)
        code, msg, made = _ext.backward_planned(*caps, **opts)
    if code != "ok":
        raise_status(code, msg, opts, varlen[0] is not None)
    if plan is not None and made is not None:
        ptrs = (q, k, v, out, dout, lse, dq, dk, dv)
        if _aligned(*(t.data_ptr() for t in ptrs)):
            if len(plan.backwards) >= _BACKWARDS:
                plan.backwards.clear()
            plan.backwards[bkey] = _BackwardPlan(made, (dq, dk, dv))
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
