"""Which attention calls a context-parallel rank makes at each ring step, and with which mask.

The sequence (each sequence, for varlen) is split into 2N equal chunks and rank r holds chunks
r and 2N-1-r (TransformerEngine's load-balanced layout: under a causal mask every rank then
has the same work). At ring step i, rank r holds the K/V of rank (r - i) mod N. The global
mask of docs/semantics.md is a band of keys per query row, i + lo <= j <= i + hi in global
positions; restricted to a rectangle of local rows and keys it is again a band, which after
trimming the rows and keys that see nothing is exactly a strideattn window measured from the
bottom-right diagonal (both sides >= 0 or unbounded). This module finds those rectangles: as
few calls as possible (one per step where the visible set allows), every visible pair in
exactly one call, nothing invisible in any. Plans are checked against the per-row visible
intervals they came from, so a rectangle that is not exactly a band is never emitted.

Pure Python and numpy: no torch, so the plans are tested without processes or devices."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np


@dataclass(frozen=True)
class Seg:
    """A contiguous piece of one rank's local tokens: local tokens [local, local + n) hold
    global positions [glob, glob + n) of their sequence (n counts real tokens; the padding
    at a chunk's end, for varlen sequences shorter than their padded length, is not in it)."""

    local: int
    glob: int
    n: int


@dataclass(frozen=True)
class Band:
    """Key j is visible from query i (global positions in one sequence) iff
    i + lo <= j <= i + hi, with None for an unbounded side."""

    lo: Optional[int]
    hi: Optional[int]


@dataclass(frozen=True)
class Block:
    """One attention call: local query rows [q0, q1) against keys [k0, k1) of the K/V block
    held at this step, with strideattn's window (left, right) measured from the block's own
    bottom-right diagonal (-1 unbounded). `first`: no earlier call of this rank wrote any of
    these rows (the merge can copy instead of rescaling)."""

    q0: int
    q1: int
    k0: int
    k1: int
    left: int
    right: int
    first: bool = False


def mask_and_window(left: int, right: int) -> Tuple[str, int, int]:
    """(mask, window left, window right) for the library: the plain kinds where they say the
    same thing as the window, so that backends see the forms they are fastest at."""
    if (left, right) == (-1, -1):
        return "none", -1, -1
    if (left, right) == (-1, 0):
        return "causal_bottom_right", -1, -1
    return "none", left, right


def band(mask: str, left: int, right: int, s_q: int, s_kv: int) -> Band:
    """The global band of one sequence of s_q queries and s_kv keys (docs/semantics.md):
    causal j <= i, causal_bottom_right j <= i + shift, window j >= i + shift - left and
    j <= i + shift + right, shift = s_kv - s_q."""
    shift = s_kv - s_q
    his = []
    if mask == "causal":
        his.append(0)
    elif mask == "causal_bottom_right":
        his.append(shift)
    if right >= 0:
        his.append(shift + right)
    lo = shift - left if left >= 0 else None
    return Band(lo, min(his) if his else None)


def rank_segments(padded: int, actual: int, cp: int, rank: int) -> Tuple[Seg, Seg]:
    """The two chunks rank `rank` holds of a sequence of `padded` positions (a multiple of
    2 * cp) whose first `actual` are real tokens."""
    c = padded // (2 * cp)
    segs = []
    for pos, chunk in enumerate((rank, 2 * cp - 1 - rank)):
        g = chunk * c
        segs.append(Seg(pos * c, g, max(0, min(c, actual - g))))
    return segs[0], segs[1]


# ----------------------------------------------------------------------------- fitting


def _intervals(qsegs: Sequence[Seg], ksegs: Sequence[Seg], b: Band):
    """Per local row of the span of qsegs: the visible local keys [lo, hi] over the union of
    ksegs (lo > hi: none), and whether that union is one interval for every row."""
    r0 = qsegs[0].local
    n = qsegs[-1].local + qsegs[-1].n - r0
    lo = np.full(n, 1, np.int64)
    hi = np.zeros(n, np.int64)  # empty (lo > hi) unless a segment says otherwise
    ok = True
    big = np.int64(1) << 62
    for qs in qsegs:
        if qs.n == 0:
            continue
        g = np.arange(qs.glob, qs.glob + qs.n, dtype=np.int64)
        rows = slice(qs.local - r0, qs.local - r0 + qs.n)
        row_lo, row_hi = lo[rows].copy(), hi[rows].copy()
        for ks in ksegs:
            if ks.n == 0:
                continue
            a = np.maximum(ks.glob, g + (b.lo if b.lo is not None else -big))
            z = np.minimum(ks.glob + ks.n - 1, g + (b.hi if b.hi is not None else big))
            seen = a <= z
            a = a - ks.glob + ks.local
            z = z - ks.glob + ks.local
            had = row_lo <= row_hi
            # segments come in local order: a new interval must start right after the last
            ok &= bool(np.all(~(had & seen) | (a == row_hi + 1)))
            row_lo = np.where(seen & ~had, a, row_lo)
            row_hi = np.where(seen, z, row_hi)
        lo[rows], hi[rows] = row_lo, row_hi
    return r0, lo, hi, ok


def _fit(r0: int, lo: np.ndarray, hi: np.ndarray) -> Optional[Block]:
    """The Block whose window gives exactly these per-row intervals, or None if no window
    does. Rows and keys that see nothing are trimmed off first."""
    seen = lo <= hi
    idx = np.flatnonzero(seen)
    a, z = int(idx[0]), int(idx[-1])
    if not seen[a : z + 1].all():
        return None
    lo, hi = lo[a : z + 1], hi[a : z + 1]
    k0, k1 = int(lo.min()), int(hi.max()) + 1
    n, m = z + 1 - a, k1 - k0
    shift = m - n
    i = np.arange(n, dtype=np.int64)
    lo, hi = lo - k0, hi - k0
    free_hi = hi < m - 1  # rows whose right edge is the band's, not the block's
    right = -1
    if free_hi.any():
        offs = hi[free_hi] - i[free_hi] - shift
        right = int(offs[0])
        if right < 0 or not (offs == right).all():
            return None
    free_lo = lo > 0
    left = -1
    if free_lo.any():
        offs = shift + i[free_lo] - lo[free_lo]
        left = int(offs[0])
        if left < 0 or not (offs == left).all():
            return None
    want_hi = np.full(n, m - 1) if right < 0 else np.minimum(m - 1, i + shift + right)
    want_lo = np.zeros(n, np.int64) if left < 0 else np.maximum(0, i + shift - left)
    if not (np.array_equal(want_hi, hi) and np.array_equal(want_lo, lo)):
        return None
    return Block(r0 + a, r0 + z + 1, k0, k1, left, right)


def _try(qsegs, ksegs, b: Band):
    """[] when nothing is visible, [Block] when the rectangle is one band, None otherwise."""
    qsegs = [s for s in qsegs if s.n]
    ksegs = [s for s in ksegs if s.n]
    if not qsegs or not ksegs:
        return []
    r0, lo, hi, ok = _intervals(qsegs, ksegs, b)
    if not (lo <= hi).any():
        return []
    if not ok:
        return None
    blk = _fit(r0, lo, hi)
    return None if blk is None else [blk]


def step_blocks(qsegs: Sequence[Seg], ksegs: Sequence[Seg], b: Band) -> List[Block]:
    """The calls of one step: all queries against all keys in one call if that is one band,
    else one call per query chunk, else one per (query chunk, key chunk) pair (always a
    band: a band restricted to a rectangle of contiguous positions)."""
    whole = _try(qsegs, ksegs, b)
    if whole is not None:
        return whole
    out: List[Block] = []
    for qs in qsegs:
        row = _try([qs], ksegs, b)
        if row is None:
            row = []
            for ks in ksegs:
                pair = _try([qs], [ks], b)
                if pair is None:
                    raise AssertionError(f"strideattn cp plan: no band for {qs} x {ks} {b}")
                row += pair
        out += row
    return out


# ----------------------------------------------------------------------------- rank plans


@functools.lru_cache(maxsize=4096)
def sequence_plan(
    cp: int,
    rank: int,
    mask: str,
    left: int,
    right: int,
    padded_q: int,
    actual_q: int,
    padded_kv: int,
    actual_kv: int,
) -> Tuple[Tuple[Block, ...], ...]:
    """For one sequence: the Blocks of rank `rank` at each step 0..cp-1 (in the order the
    merge applies them, `first` set where no earlier Block wrote the rows)."""
    b = band(mask, left, right, actual_q, actual_kv)
    qsegs = rank_segments(padded_q, actual_q, cp, rank)
    touched = np.zeros(padded_q // cp, bool)
    steps = []
    for i in range(cp):
        ksegs = rank_segments(padded_kv, actual_kv, cp, (rank - i) % cp)
        blocks = []
        for blk in step_blocks(qsegs, ksegs, b):
            first = not touched[blk.q0 : blk.q1].any()
            touched[blk.q0 : blk.q1] = True
            blocks.append(Block(blk.q0, blk.q1, blk.k0, blk.k1, blk.left, blk.right, first))
        steps.append(tuple(blocks))
    return tuple(steps)


def last_step(plans_of_all_ranks: Sequence[Sequence[Sequence[Block]]]) -> int:
    """The last step at which any rank has work (-1: none): the ring stops there, so every
    rank must compute it from the same plans."""
    last = -1
    for steps in plans_of_all_ranks:
        for i, blocks in enumerate(steps):
            if blocks:
                last = max(last, i)
    return last


@dataclass(frozen=True)
class VarCall:
    """One varlen call: sequences (q offset, q length, kv offset, kv length) in local token
    positions, all with the same window; `first` as for Block."""

    left: int
    right: int
    items: Tuple[Tuple[int, int, int, int], ...]
    first: bool


def _group(per_seq) -> List[Tuple[int, int, list]]:
    """Packs one step's Blocks of several sequences, (local q offset, local kv offset,
    blocks) each, into calls: one window per call, and no two pieces of one sequence in one
    call (pieces of a sequence that share rows must be merged one after the other)."""
    calls: List[Tuple[int, int, list, set]] = []
    for s, (qoff, kvoff, blocks) in enumerate(per_seq):
        for blk in blocks:
            item = (qoff + blk.q0, blk.q1 - blk.q0, kvoff + blk.k0, blk.k1 - blk.k0)
            for c in calls:
                if (c[0], c[1]) == (blk.left, blk.right) and s not in c[3]:
                    c[2].append(item)
                    c[3].add(s)
                    break
            else:
                calls.append((blk.left, blk.right, [item], {s}))
    return [(c[0], c[1], c[2]) for c in calls]


@functools.lru_cache(maxsize=256)
def varlen_plan(
    cp: int,
    rank: int,
    mask: str,
    left: int,
    right: int,
    seqs: Tuple[Tuple[int, int, int, int], ...],
) -> Tuple[Tuple[Tuple[VarCall, ...], ...], int]:
    """Varlen sequences (padded_q, actual_q, padded_kv, actual_kv) laid out one after the
    other in every rank's local tokens (padded_q // cp each): the calls of rank `rank` at
    each step, and the last step at which any rank has work."""
    q_off = np.concatenate([[0], np.cumsum([s[0] // cp for s in seqs])]).astype(int)
    kv_off = np.concatenate([[0], np.cumsum([s[2] // cp for s in seqs])]).astype(int)
    last = -1
    mine = None
    for r in range(cp):
        plans = [sequence_plan(cp, r, mask, left, right, *s) for s in seqs]
        last = max(last, last_step(plans))
        if r == rank:
            mine = plans
    touched = np.zeros(int(q_off[-1]), bool)
    steps = []
    for i in range(cp):
        calls = []
        per_seq = [(int(q_off[n]), int(kv_off[n]), p[i]) for n, p in enumerate(mine)]
        for lft, rgt, items in _group(per_seq):
            first = not any(touched[a : a + n].any() for a, n, _, _ in items)
            for a, n, _, _ in items:
                touched[a : a + n] = True
            calls.append(VarCall(lft, rgt, tuple(items), first))
        steps.append(tuple(calls))
    return tuple(steps), last


@functools.lru_cache(maxsize=256)
def dense_plan(
    cp: int, rank: int, mask: str, left: int, right: int, s_q: int, s_kv: int
) -> Tuple[Tuple[Tuple[Block, ...], ...], int]:
    """Dense (bshd) sequences of s_q queries and s_kv keys (global, multiples of 2 * cp):
    the Blocks of rank `rank` at each step, and the last step at which any rank has work."""
    plans = [sequence_plan(cp, r, mask, left, right, s_q, s_q, s_kv, s_kv) for r in range(cp)]
    return plans[rank], last_step(plans)


@functools.lru_cache(maxsize=256)
def token_permutation(padded: Tuple[int, ...], cp: int) -> Tuple[np.ndarray, np.ndarray]:
    """Sequences of `padded` positions each (multiples of 2 * cp), one after the other:
    `perm` with global = concat(local arrays of ranks 0..cp-1)[perm], and `inv` with
    rank p's local array = global[inv[p * t : (p + 1) * t]], t = sum(padded) // cp."""
    t = sum(padded) // cp
    perm = np.empty(sum(padded), np.int64)
    g_off = l_off = 0
    for p_n in padded:
        c = p_n // (2 * cp)
        for a in range(2 * cp):
            owner, half = (a, 0) if a < cp else (2 * cp - 1 - a, 1)
            src = owner * t + l_off + half * c
            perm[g_off + a * c : g_off + (a + 1) * c] = np.arange(src, src + c)
        g_off += p_n
        l_off += p_n // cp
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size)
    perm.setflags(write=False)
    inv.setflags(write=False)
    return perm, inv
