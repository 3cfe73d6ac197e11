"""Ring (point-to-point) context-parallel attention on torch.distributed, forward and backward.

Each rank keeps its queries; the K/V blocks travel around the ring (rank r sends to r + 1 and
receives from r - 1) while the current block computes; each step's partial O is merged into
an fp32 accumulator by its LSE. The backward runs the ring again and passes an fp32 dK/dV
accumulator along with the K/V it belongs to, so that after the last step it reaches the
block's owner. Which calls each step makes comes from strideattn/_cp_plan.py (`Unit`s below,
built by strideattn/_torch_cp.py); this file only runs them.

On CUDA tensors the communication runs on NCCL's own stream (torch.distributed orders it
after the compute stream's work at the time of the call, and `wait()` orders the compute
stream after it), and the merges run on a second stream (`cp_stream`) so that the next
block's attention does not wait for them. On CPU tensors everything runs in order on the
calling thread, and gloo moves the bytes in its own threads. `RankState` holds one rank's
accumulators, so that tests can drive the same merge logic for N simulated ranks in one
process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import _torch_call as call
from ._torch_ops import _as_tensors, _eager


@dataclass
class Unit:
    """One attention call of a step: local query rows [q0, q1) against keys [k0, k1) of the
    step's K/V block, with the library's mask and window; varlen calls carry seqlens and
    offsets (host lists of ints, as the extension takes them) and span every local token.
    `first`: no earlier call of this rank wrote these rows."""

    q0: int
    q1: int
    k0: int
    k1: int
    mask: str
    left: int
    right: int
    first: bool
    seqlens_q: Optional[List[int]] = None
    seqlens_kv: Optional[List[int]] = None
    offsets_q: Optional[List[int]] = None
    offsets_kv: Optional[List[int]] = None


@dataclass
class RingConfig:
    """What every step needs: the calls of each step (up to `last`, the last step at which
    any rank has work), the library options, and the ring's group."""

    units: Sequence[Sequence[Unit]]
    last: int
    scale: float
    backend: str
    deterministic: bool
    group: Optional[object] = None
    stream: Optional[object] = None  # the merge stream (CUDA), or None for the default one
    comm: bool = True  # False: every step reuses the local K/V (benchmarks: compute alone)


# ----------------------------------------------------------------------------- library calls


def _varlen(u: Unit):
    return (u.seqlens_q, u.seqlens_kv, u.offsets_q, u.offsets_kv)


# direct: the extension is called here (strideattn/_torch_call.py), as the eager autograd
# path of strideattn.torch.attention calls it; the ring runs inside its own autograd.Function,
# so the ops' dispatch would only add host time to every call of every step. Under a dispatch
# mode, tracer or functorch transform (_torch_ops._eager false) the calls go through the
# registered ops instead, so that the mode sees them, as it sees the single-process call.


def _fwd(q, k, v, u: Unit, cfg: RingConfig, direct: bool) -> Tuple[Tensor, Tensor]:
    qs, ks, vs = q[:, u.q0 : u.q1], k[:, u.k0 : u.k1], v[:, u.k0 : u.k1]
    opts = (u.mask, u.left, u.right, cfg.scale, cfg.backend, cfg.deterministic)
    if direct:
        return call.forward(qs, ks, vs, _varlen(u), *opts)
    return torch.ops.strideattn.attention_fwd(qs, ks, vs, *_as_tensors(*_varlen(u)), *opts)


def _bwd(dout, q, k, v, out, lse, u: Unit, cfg: RingConfig, direct: bool):
    rows, cols = slice(u.q0, u.q1), slice(u.k0, u.k1)
    views = (dout[:, rows], q[:, rows], k[:, cols], v[:, cols], out[:, rows], lse[:, :, rows])
    opts = (u.mask, u.left, u.right, cfg.scale, cfg.backend, cfg.deterministic)
    if direct:
        return call.backward(*views, _varlen(u), *opts)
    return torch.ops.strideattn.attention_bwd(*views, *_as_tensors(*_varlen(u)), *opts)


# ----------------------------------------------------------------------------- streams


class _Side:
    """Runs work on a second CUDA stream after what the compute stream has queued so far
    (inline on CPU); join() makes the compute stream wait for all of it."""

    def __init__(self, device: torch.device, stream=None):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.main = torch.cuda.current_stream(device)
            self.side = stream if stream is not None else _merge_stream(device)

    def run(self, fn, *used: Tensor) -> None:
        if not self.cuda:
            fn()
            return
        self.side.wait_stream(self.main)
        with torch.cuda.stream(self.side):
            fn()
        for t in used:  # made on the compute stream, read on the side stream
            t.record_stream(self.side)

    def join(self) -> None:
        if self.cuda:
            self.main.wait_stream(self.side)


_STREAMS = {}


def _merge_stream(device: torch.device):
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device=key)
    return _STREAMS[key]


# ----------------------------------------------------------------------------- one rank's state


def _safe_weights(old: Tensor, part: Tensor):
    """(new LSE, weight of the old partial, weight of the new one) in fp32; rows that no
    call has reached yet (both -inf) get weight 0, not NaN."""
    new = torch.logaddexp(old, part)
    none = new == float("-inf")
    w_old = torch.where(none, 0.0, torch.exp(old - new))
    w_part = torch.where(none, 0.0, torch.exp(part - new))
    return new, w_old, w_part


def _zeros_like_order(shape, like: Tensor) -> Tensor:
    """fp32 zeros of `shape` in like's dimension order: O and dQ come back laid out as the
    single-process call lays them out (e.g. an sbhd caller's O merges its heads as a view)."""
    strides = call.order_strides(shape, like.shape, like.stride())
    return torch.empty_strided(shape, strides, dtype=torch.float32, device=like.device).zero_()


class RankState:
    """One rank's forward accumulators (fp32 O and LSE over its local rows) and backward
    accumulators (fp32 dQ; fp32 dK/dV of the block at hand)."""

    def __init__(self, q: Tensor, v: Tensor, cfg: RingConfig, backward: bool = False):
        self.cfg = cfg
        self.side = _Side(q.device, cfg.stream)
        self.direct = _eager(q, q, v)  # see _fwd
        b, s, h = q.shape[0], q.shape[1], q.shape[2]
        if backward:
            self.dq = _zeros_like_order(q.shape, q)
            return
        self.o = _zeros_like_order(q.shape[:-1] + v.shape[-1:], q)
        self.lse = torch.full((b, h, s), float("-inf"), dtype=torch.float32, device=q.device)

    def forward_step(self, i: int, q: Tensor, k: Tensor, v: Tensor) -> None:
        """The calls of step i against this K/V block, merged into the accumulators."""
        for u in self.cfg.units[i]:
            o, lse = _fwd(q, k, v, u, self.cfg, self.direct)
            self.side.run(lambda u=u, o=o, lse=lse: self._merge(u, o, lse), o, lse)

    def _merge(self, u: Unit, o: Tensor, lse: Tensor) -> None:
        acc_o, acc_lse = self.o[:, u.q0 : u.q1], self.lse[:, :, u.q0 : u.q1]
        if u.first and u.seqlens_q is None:
            acc_o.copy_(o)
            acc_lse.copy_(lse)
            return
        if u.first:  # varlen: the library writes 0 / -inf into o / lse outside its sequences
            acc_o.add_(o)
            torch.maximum(acc_lse, lse, out=acc_lse)
            return
        new, w_old, w_part = _safe_weights(acc_lse, lse)
        acc_o.mul_(w_old.transpose(1, 2).unsqueeze(-1))
        acc_o.add_(o.float() * w_part.transpose(1, 2).unsqueeze(-1))
        acc_lse.copy_(new)

    def finish_forward(self, q: Tensor) -> Tuple[Tensor, Tensor]:
        self.side.join()
        return self.o.to(q.dtype), self.lse

    # backward (a RankState made with backward=True)

    def backward_step(self, i, dout, q, k, v, out, lse, dk: Tensor, dv: Tensor) -> None:
        """Adds step i's gradients: dQ into the accumulator, dK/dV of this block into dk/dv
        (fp32, shaped like the block)."""
        direct = self.direct and type(dout) is Tensor
        for u in self.cfg.units[i]:
            gq, gk, gv = _bwd(dout, q, k, v, out, lse, u, self.cfg, direct)

            def add(u=u, gq=gq, gk=gk, gv=gv):
                self.dq[:, u.q0 : u.q1].add_(gq)
                dk[:, u.k0 : u.k1].add_(gk)
                dv[:, u.k0 : u.k1].add_(gv)

            self.side.run(add, gq, gk, gv)

    def finish_backward(self, q: Tensor) -> Tensor:
        self.side.join()
        return self.dq.to(q.dtype)


# ----------------------------------------------------------------------------- communication


class _Ring:
    """Point-to-point exchanges within the group (group ranks; NCCL batches each pair)."""

    def __init__(self, group):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.nccl = dist.get_backend(group) == "nccl"

    def _global(self, r: int) -> int:
        return dist.get_global_rank(self.group, r) if self.group is not None else r

    def exchange(self, send: Tensor, dst: int, recv: Tensor, src: int) -> List:
        """Sends `send` to group rank dst and receives `recv` from src, asynchronously."""
        dst, src = self._global(dst % self.size), self._global(src % self.size)
        if self.nccl:
            ops = [
                dist.P2POp(dist.isend, send, dst, self.group),
                dist.P2POp(dist.irecv, recv, src, self.group),
            ]
            return dist.batch_isend_irecv(ops)
        # even ranks send first and odd ranks receive first, so that transports that pair
        # blocking calls never wait on each other around the ring
        if self.rank % 2 == 0:
            return [dist.isend(send, dst, self.group), dist.irecv(recv, src, self.group)]
        return [dist.irecv(recv, src, self.group), dist.isend(send, dst, self.group)]


def _wait(works: List) -> None:
    for w in works:
        w.wait()


def _pack(k: Tensor, v: Tensor, dtype=None) -> Tuple[Tensor, Tensor, Tensor]:
    """A flat buffer holding K and V (contiguous, in `dtype`), and the two views of it."""
    dtype = dtype or k.dtype
    buf = torch.empty(k.numel() + v.numel(), dtype=dtype, device=k.device)
    return buf, *_views(buf, k.shape, v.shape)


def _views(buf: Tensor, k_shape, v_shape) -> Tuple[Tensor, Tensor]:
    nk = 1
    for x in k_shape:
        nk *= x
    return buf[:nk].view(k_shape), buf[nk:].view(v_shape)


def ring_forward(q: Tensor, k: Tensor, v: Tensor, cfg: RingConfig) -> Tuple[Tensor, Tensor]:
    """O (q's dtype) and the fp32 LSE of this rank's queries over the whole sequence."""
    state = RankState(q, v, cfg)
    if cfg.last >= 1 and cfg.comm:
        ring = _Ring(cfg.group)
        cur, ck, cv = _pack(k, v)
        ck.copy_(k)
        cv.copy_(v)
        nxt = torch.empty_like(cur)
    for i in range(cfg.last + 1):
        works = []
        if i < cfg.last and cfg.comm:
            works = ring.exchange(cur, ring.rank + 1, nxt, ring.rank - 1)
        kb, vb = (k, v) if i == 0 or not cfg.comm else _views(cur, k.shape, v.shape)
        state.forward_step(i, q, kb, vb)
        if works:
            _wait(works)
            cur, nxt = nxt, cur
    return state.finish_forward(q)


def ring_backward(dout, q, k, v, out, lse, cfg: RingConfig) -> Tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV (the inputs' dtypes) of this rank's Q and K/V blocks."""
    state = RankState(q, v, cfg, backward=True)
    if cfg.last < 0:
        return state.finish_backward(q), torch.zeros_like(k), torch.zeros_like(v)
    ring = _Ring(cfg.group) if cfg.last >= 1 and cfg.comm else None
    if ring is not None:
        cur, ck, cv = _pack(k, v)
        ck.copy_(k)
        cv.copy_(v)
        nxt = torch.empty_like(cur)
        recv = [_pack(k, v, torch.float32)[0] for _ in range(2)]
    acc = torch.zeros(k.numel() + v.numel(), dtype=torch.float32, device=q.device)
    dkv_works: List = []
    for i in range(cfg.last + 1):
        works = []
        if i < cfg.last and ring is not None:
            works = ring.exchange(cur, ring.rank + 1, nxt, ring.rank - 1)
        kb, vb = (k, v) if i == 0 or ring is None else _views(cur, k.shape, v.shape)
        part = acc if i == 0 or ring is None else torch.zeros_like(acc)
        pk, pv = _views(part, k.shape, v.shape)
        state.backward_step(i, dout, q, kb, vb, out, lse, pk, pv)
        if i > 0 and ring is not None:  # this block's accumulator from the ranks before
            _wait(dkv_works)
            acc = recv[(i - 1) % 2]
            state.side.join()
            acc.add_(part)
        if ring is not None:
            state.side.join()  # the send reads what the merge stream wrote
            if i < cfg.last:
                dkv_works = ring.exchange(acc, ring.rank + 1, recv[i % 2], ring.rank - 1)
            else:  # to the block's owner: (rank - last) holds ours
                final = torch.empty_like(acc)
                dkv_works = ring.exchange(acc, ring.rank - i, final, ring.rank + i)
        if works:
            _wait(works)
            cur, nxt = nxt, cur
    dq = state.finish_backward(q)
    if ring is not None:
        _wait(dkv_works)
        acc = final
    dk, dv = _views(acc, k.shape, v.shape)
    return dq, dk.to(k.dtype), dv.to(v.dtype)


def ring_comm_only(k: Tensor, v: Tensor, cfg: RingConfig) -> None:
    """The exchanges of one forward and one backward ring and nothing else (benchmarks:
    communication alone), on the same buffers and in the same order."""
    if cfg.last < 1:
        return
    ring = _Ring(cfg.group)
    for _ in range(2):  # forward, then the backward's K/V
        cur, nxt = _pack(k, v)[0], _pack(k, v)[0]
        for i in range(cfg.last):
            _wait(ring.exchange(cur, ring.rank + 1, nxt, ring.rank - 1))
            cur, nxt = nxt, cur
    acc, other = _pack(k, v, torch.float32)[0], _pack(k, v, torch.float32)[0]
    for i in range(cfg.last + 1):
        peer = 1 if i < cfg.last else -i
        _wait(ring.exchange(acc, ring.rank + peer, other, ring.rank - peer))
        acc, other = other, acc


class RingAttention(torch.autograd.Function):
    """Autograd over ring_forward / ring_backward; the LSE output is not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, cfg: RingConfig):
        out, lse = ring_forward(q, k, v, cfg)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cfg = cfg
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(dout, q, k, v, out, lse, ctx.cfg)
        return dq, dk, dv, None
