"""Context parallelism for strideattn's PyTorch layer: one sequence split over the ranks of a
torch.distributed process group (NCCL between GPUs, gloo on CPU).

`cp_attention(q, k, v, cp_group, ...)` is `strideattn.torch.attention` on the whole sequence,
called by every rank of the group with its shard: each rank passes the same arguments as the
single-process call would take, except that q, k and v hold only its tokens and the results
are its tokens' rows. The shard of rank r is chunks r and 2N-1-r of the sequence split into 2N
equal chunks (each varlen sequence split so; `cp_shard` / `cp_unshard` make and undo it).
Varlen lengths and offsets are the global ones: `seqlens_*` the real tokens of each sequence,
`offsets_*` where each starts in the global padded token array (TransformerEngine's
cu_seqlens_*_padded[:-1]), so that each sequence's padded extent is a multiple of 2N.

`cp_comm_type`: "p2p" (a ring of K/V blocks, strideattn/_cp_ring.py) or "a2a" (heads
scattered, sequence gathered, strideattn/_cp_a2a.py)."""

from __future__ import annotations

import math
import os
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import _checks, _cp_a2a, _cp_plan, _cp_ring
from ._torch_ops import attention
from ._util import canonical_mask, describe, int_list, window_pair

COMM_TYPES = ("p2p", "a2a")


def _lengths(x, name: str) -> Optional[List[int]]:
    if x is None:
        return None
    if isinstance(x, Tensor):
        x = x.tolist()
    return int_list(x, name)


def _padded(lengths: List[int], offsets: Optional[List[int]], tokens: int, cp: int, side: str):
    """Padded extent of each varlen sequence in the global token array (tokens = cp x the
    local count), from the global offsets (default: packed), checked against the layout."""
    n = len(lengths)
    offs = list(offsets) if offsets is not None else [sum(lengths[:i]) for i in range(n)]
    if len(offs) != n:
        raise ValueError(f"offsets_{side} has {len(offs)} entries for {n} sequences")
    ends = offs[1:] + [tokens]
    padded = [e - o for o, e in zip(offs, ends)]
    if n and offs[0] != 0:
        raise ValueError(
            f"offsets_{side}[0] is {offs[0]}; with context parallelism the first sequence starts "
            "at token 0 and each sequence's padded extent runs to the next one's offset"
        )
    for i, (p, length) in enumerate(zip(padded, lengths)):
        if p < length or p % (2 * cp):
            raise ValueError(
                f"{side} sequence {i} has {length} tokens in a padded extent of {p} "
                f"(offsets_{side} and {tokens} global tokens = {cp} ranks x {tokens // cp}); "
                f"context parallelism splits each sequence into 2 x {cp} = {2 * cp} equal "
                f"chunks, so each extent must be a multiple of {2 * cp} and hold its sequence "
                f"(pad the sequences and pass offsets_{side}: TE's cu_seqlens_{side}_padded[:-1])"
            )
    return tuple(padded)


def _group_info(cp_group) -> Tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "cp_group needs torch.distributed initialised (init_process_group) in every rank"
        )
    if cp_group is not None and not isinstance(cp_group, dist.ProcessGroup):
        raise ValueError(
            f"cp_group must be a torch.distributed ProcessGroup; got {describe(cp_group)}"
        )
    rank = dist.get_rank(cp_group)
    if rank < 0:
        raise ValueError("this process is not a member of cp_group")
    return dist.get_world_size(cp_group), rank


def _check_same(meta: tuple, group, cp: int, device: torch.device) -> None:
    """Every rank must describe the same problem (or the ring would exchange mismatched
    blocks): an all_gather of the arguments, on CPU tensors and with STRIDEATTN_CP_CHECK=1
    (on GPU it would synchronise the host, so it is off there by default)."""
    if device.type != "cpu" and os.getenv("STRIDEATTN_CP_CHECK", "0") in ("", "0"):
        return
    metas = [None] * cp
    dist.all_gather_object(metas, meta, group=group)
    names = (
        "cp_comm_type", "dtype", "q shape", "k shape", "v shape", "mask", "window", "scale",
        "backend", "deterministic", "seqlens_q", "seqlens_kv", "offsets_q", "offsets_kv",
    )  # fmt: skip
    for r, m in enumerate(metas):
        for name, a, b in zip(names, metas[0], m):
            if a != b:
                raise ValueError(
                    f"the ranks of cp_group disagree on {name}: rank 0 has {a}, rank {r} has "
                    f"{b}; every rank passes the same arguments and its own equal share of "
                    "the tokens"
                )


def _dense_units(blocks) -> List[_cp_ring.Unit]:
    units = []
    for b in blocks:
        m, wl, wr = _cp_plan.mask_and_window(b.left, b.right)
        units.append(_cp_ring.Unit(b.q0, b.q1, b.k0, b.k1, m, wl, wr, b.first))
    return units


def _varlen_units(calls, t_q: int, t_kv: int) -> List[_cp_ring.Unit]:
    units = []
    for c in calls:
        m, wl, wr = _cp_plan.mask_and_window(c.left, c.right)
        cols = [[int(x) for x in col] for col in zip(*c.items)]
        units.append(_cp_ring.Unit(0, t_q, 0, t_kv, m, wl, wr, c.first, cols[1], cols[3], cols[0], cols[2]))  # fmt: skip
    return units


def cp_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cp_group,
    *,
    cp_comm_type: str = "p2p",
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
    cp_stream=None,
):
    """strideattn.torch.attention over a sequence split across the ranks of cp_group (see
    the module's description): q [b, s_q/N, h, d] (varlen [tokens_q/N, h, d]) of this rank's
    chunks, likewise k and v; returns this rank's rows of O (and of the fp32 LSE:
    [b, h, s_q/N], varlen [h, tokens_q/N]). Differentiable; every rank must call it with the
    same arguments. cp_stream: the CUDA stream the ring's merges run on (default: one per
    device)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {describe(x)}")
    if cp_comm_type not in COMM_TYPES:
        raise NotImplementedError(
            f"cp_comm_type={describe(cp_comm_type)} is not supported by strideattn; "
            f"supported: {', '.join(COMM_TYPES)}"
        )
    mask = canonical_mask(mask)
    left, right = window_pair(window)
    cp, rank = _group_info(cp_group)
    common = dict(mask=mask, window=(left, right), backend=backend, deterministic=deterministic)
    if cp == 1:
        return attention(
            q, k, v, scale=scale, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
            offsets_q=offsets_q, offsets_kv=offsets_kv, return_lse=return_lse, **common,
        )  # fmt: skip
    if q.dim() not in (3, 4) or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            f"q, k, v must all have 4 dimensions [b, s, h, d] (or 3 for varlen "
            f"[tokens, h, d]); got {q.dim()}, {k.dim()}, {v.dim()}"
        )
    scale = _checks.scale(scale)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] > 0 else 1.0
    varlen = q.dim() == 3
    lens_q, lens_kv = _lengths(seqlens_q, "seqlens_q"), _lengths(seqlens_kv, "seqlens_kv")
    offs_q, offs_kv = _lengths(offsets_q, "offsets_q"), _lengths(offsets_kv, "offsets_kv")
    if varlen != (lens_q is not None) or (lens_q is None) != (lens_kv is None):
        raise ValueError(
            "varlen (3-D [tokens, h, d] tensors) needs both seqlens_q and seqlens_kv, and "
            "4-D tensors take neither"
        )
    seq = 0 if varlen else 1
    if varlen:
        if len(lens_q) != len(lens_kv):
            raise ValueError(f"{len(lens_q)} seqlens_q for {len(lens_kv)} seqlens_kv")
        pad_q = _padded(lens_q, offs_q, cp * q.shape[0], cp, "q")
        pad_kv = _padded(lens_kv, offs_kv, cp * k.shape[0], cp, "kv")
    else:
        for name, t in (("q", q), ("k", k)):
            if t.shape[1] % 2:
                raise ValueError(
                    f"{name} holds {t.shape[1]} tokens of this rank; context parallelism "
                    f"splits the sequence into 2 x {cp} = {2 * cp} equal chunks and each rank "
                    "holds two, so the local sequence extent must be even"
                )
        pad_q, pad_kv = (cp * q.shape[1],), (cp * k.shape[1],)
    meta = (
        cp_comm_type, str(q.dtype), tuple(q.shape), tuple(k.shape), tuple(v.shape), mask,
        (left, right), scale, backend, bool(deterministic), lens_q, lens_kv, pad_q, pad_kv,
    )  # fmt: skip
    _check_same(meta, cp_group, cp, q.device)

    if cp_comm_type == "a2a":
        _cp_a2a.check_heads(q.shape[-2], k.shape[-2], cp)
        sq, skv = _cp_a2a.specs_for(pad_q, pad_kv, cp, seq, q.device)
        qg, kg, vg = _cp_a2a.ToHeads.apply(cp_group, cp, (sq, skv, skv), q, k, v)
        gl = dict(seqlens_q=lens_q, seqlens_kv=lens_kv)
        if varlen:
            gl.update(offsets_q=_offsets(pad_q), offsets_kv=_offsets(pad_kv))
        o, lse = attention(qg, kg, vg, scale=scale, return_lse=True, **gl, **common)
        out = _cp_a2a.ToSeq.apply(cp_group, cp, sq, o)
        if not return_lse:
            return out
        return out, _cp_a2a.lse_to_seq(lse, sq, cp_group, cp)

    if varlen:
        seqs = tuple(zip(pad_q, lens_q, pad_kv, lens_kv))
        steps, last = _cp_plan.varlen_plan(cp, rank, mask, left, right, seqs)
        units = [_varlen_units(c, q.shape[0], k.shape[0]) for c in steps[: last + 1]]
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    else:
        steps, last = _cp_plan.dense_plan(cp, rank, mask, left, right, pad_q[0], pad_kv[0])
        units = [_dense_units(b) for b in steps[: last + 1]]
    cfg = _cp_ring.RingConfig(
        units, last, float(scale), backend, bool(deterministic), cp_group, cp_stream
    )
    out, lse = _cp_ring.RingAttention.apply(q, k, v, cfg)
    if varlen:
        out, lse = out.squeeze(0), lse.squeeze(0)
    return (out, lse) if return_lse else out


def _offsets(padded: Sequence[int]) -> List[int]:
    return [sum(padded[:i]) for i in range(len(padded))]


# ----------------------------------------------------------------------------- layout


def _layout(x: Tensor, cp_size: int, seq_dim: int, offsets):
    if not isinstance(x, Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {describe(x)}")
    if not 0 <= seq_dim < x.dim():
        raise ValueError(f"seq_dim {seq_dim} is not a dimension of a {x.dim()}-D tensor")
    total = x.shape[seq_dim]
    offs = [0] if offsets is None else int_list(offsets, "offsets")
    ends = offs[1:] + [total]
    padded = tuple(e - o for o, e in zip(offs, ends))
    if (offs and offs[0] != 0) or any(p < 0 or p % (2 * cp_size) for p in padded):
        raise ValueError(
            f"cp_shard splits each sequence into 2 x {cp_size} equal chunks: the extents from "
            f"offsets {offs} over {total} tokens are {list(padded)}; they must start at 0 and "
            f"be multiples of {2 * cp_size}"
        )
    return _cp_plan.token_permutation(padded, cp_size)


def cp_shard(x: Tensor, cp_size: int, cp_rank: int, *, seq_dim: int = 1, offsets=None) -> Tensor:
    """Rank cp_rank's tokens of a whole-sequence tensor: chunks r and 2N-1-r of the sequence
    along seq_dim (1 for [b, s, h, d]; 0 for varlen [tokens, h, d], with `offsets` the
    global padded first token of each sequence) split into 2N equal chunks. A copy."""
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank {cp_rank} is not a rank of a group of {cp_size}")
    _, inv = _layout(x, cp_size, seq_dim, offsets)
    t = inv.size // cp_size
    idx = torch.from_numpy(inv[cp_rank * t : (cp_rank + 1) * t].copy()).to(x.device)
    return x.index_select(seq_dim, idx)


def cp_unshard(parts: Sequence[Tensor], *, seq_dim: int = 1, offsets=None) -> Tensor:
    """The whole-sequence tensor from every rank's shard (parts[r] from rank r): the
    inverse of cp_shard."""
    x = torch.cat(list(parts), dim=seq_dim)
    perm, _ = _layout(x, len(parts), seq_dim, offsets)
    return x.index_select(seq_dim, torch.from_numpy(perm.copy()).to(x.device))
