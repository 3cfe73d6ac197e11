"""All-to-all ("Ulysses") context-parallel attention on torch.distributed.

Every rank holds its share of the sequence (the same load-balanced chunks as the ring: rank
r has chunks r and 2N-1-r of each sequence) and all heads. One all-to-all per tensor
scatters the heads and gathers the sequence, so that rank p holds heads
[p h/N, (p+1) h/N) of the whole sequence; the local kernel runs on that (any mask, window and
varlen description, exactly as in one process), and one all-to-all brings O back to the
sequence split. Both directions are permutations of each other, so each is the other's
backward. Q, K and V go out together (three asynchronous all-to-alls) and are reordered as
each arrives. Head counts that N does not divide are refused by the caller."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor


class Spec:
    """How one tensor is split: its sequence dim, and the token permutations of
    _cp_plan.token_permutation (as index tensors on the tensor's device)."""

    def __init__(self, seq_dim: int, perm: Tensor, inv: Tensor):
        self.seq_dim, self.perm, self.inv = seq_dim, perm, inv


def _start(send: Tensor, group):
    recv = torch.empty_like(send)
    return recv, dist.all_to_all_single(recv, send, group=group, async_op=True)


def _to_heads_send(x: Tensor, cp: int) -> Tensor:
    # [..., s_loc, H, d] -> [cp, ..., s_loc, H/cp, d]: head group p goes to rank p
    return x.unflatten(-2, (cp, x.shape[-2] // cp)).movedim(-3, 0).contiguous()


def _to_heads_recv(recv: Tensor, spec: Spec) -> Tensor:
    # [cp (source rank), ..., s_loc, H/cp, d] -> the ranks' tokens in order -> global order
    x = recv.movedim(0, spec.seq_dim).flatten(spec.seq_dim, spec.seq_dim + 1)
    return x.index_select(spec.seq_dim, spec.perm)


def _to_seq_send(y: Tensor, spec: Spec, cp: int) -> Tensor:
    # [..., S, H/cp, d] global -> [cp, ..., s_loc, H/cp, d]: rank p's tokens go to rank p
    x = y.index_select(spec.seq_dim, spec.inv)
    return x.unflatten(spec.seq_dim, (cp, x.shape[spec.seq_dim] // cp)).movedim(spec.seq_dim, 0)


def _to_seq_recv(recv: Tensor) -> Tensor:
    # [cp (source head group), ..., s_loc, H/cp, d] -> [..., s_loc, H, d]
    return recv.movedim(0, -3).flatten(-3, -2)


def to_heads(xs: Sequence[Tensor], specs: Sequence[Spec], group, cp: int) -> List[Tensor]:
    started = [_start(_to_heads_send(x, cp), group) for x in xs]
    out = []
    for (recv, work), spec in zip(started, specs):
        work.wait()
        out.append(_to_heads_recv(recv, spec))
    return out


def to_seq(ys: Sequence[Tensor], specs: Sequence[Spec], group, cp: int) -> List[Tensor]:
    started = [_start(_to_seq_send(y, s, cp).contiguous(), group) for y, s in zip(ys, specs)]
    out = []
    for recv, work in started:
        work.wait()
        out.append(_to_seq_recv(recv))
    return out


class ToHeads(torch.autograd.Function):
    """Sequence split -> head split, for several tensors at once (backward: to_seq)."""

    @staticmethod
    def forward(ctx, group, cp, specs, *xs):
        ctx.group, ctx.cp, ctx.specs = group, cp, specs
        return tuple(to_heads(xs, specs, group, cp))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, *to_seq(grads, ctx.specs, ctx.group, ctx.cp))


class ToSeq(torch.autograd.Function):
    """Head split -> sequence split (backward: to_heads)."""

    @staticmethod
    def forward(ctx, group, cp, spec, y):
        ctx.group, ctx.cp, ctx.spec = group, cp, spec
        return to_seq([y], [spec], group, cp)[0]

    @staticmethod
    def backward(ctx, g):
        return None, None, None, to_heads([g], [ctx.spec], ctx.group, ctx.cp)[0]


def lse_to_seq(lse: Tensor, spec: Spec, group, cp: int) -> Tensor:
    """The LSE of the local heads over the whole sequence ([..., H/cp, S]) -> that of all
    heads over the local tokens ([..., H, s_loc])."""
    x = lse.index_select(-1, spec.inv)
    x = x.unflatten(-1, (cp, x.shape[-1] // cp)).movedim(-2, 0).contiguous()
    recv, work = _start(x, group)
    work.wait()
    return recv.movedim(0, -3).flatten(-3, -2)


def check_heads(h: int, hg: int, cp: int) -> None:
    if h % cp or hg % cp:
        raise ValueError(
            f"cp_comm_type 'a2a' scatters the heads over the {cp} ranks of cp_group: it needs "
            f"both head counts divisible by {cp}; got {h} query heads and {hg} key/value "
            "heads (use cp_comm_type 'p2p', which has no such rule)"
        )


def specs_for(padded_q: Tuple[int, ...], padded_kv: Tuple[int, ...], cp, seq_dim, device):
    from ._cp_plan import token_permutation

    out = []
    for padded in (padded_q, padded_kv):
        perm, inv = token_permutation(padded, cp)
        out.append(
            Spec(
                seq_dim,
                torch.from_numpy(perm.copy()).to(device),
                torch.from_numpy(inv.copy()).to(device),
            )
        )
    return out[0], out[1]
