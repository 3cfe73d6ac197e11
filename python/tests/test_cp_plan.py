"""The context-parallel plans (strideattn/_cp_plan.py) against brute force: over every rank
and ring step, the calls' own masks (the library's mask kinds and windows, as npref.visible
reads them) must cover every visible (query, key) pair of the global mask exactly once and
no invisible pair, for random sequence lengths, padding, masks and windows. No torch, no
processes: pure planning."""

import numpy as np
import pytest

from npref import visible
from strideattn import _cp_plan as plan

MASKS = ["none", "causal", "causal_bottom_right"]


def local_to_global(padded, actual, cp, rank):
    """Global position of each local token of `rank` (-1 for padding)."""
    c = padded // (2 * cp)
    out = np.full(2 * c, -1)
    for pos, chunk in enumerate((rank, 2 * cp - 1 - rank)):
        g = chunk * c + np.arange(c)
        out[pos * c : (pos + 1) * c] = np.where(g < actual, g, -1)
    return out


def coverage(cp, mask, window, pq, aq, pkv, akv):
    """How many calls cover each global (query, key) pair, over all ranks and steps."""
    count = np.zeros((aq, akv), int)
    left, right = window
    for r in range(cp):
        steps = plan.sequence_plan(cp, r, mask, left, right, pq, aq, pkv, akv)
        gq = local_to_global(pq, aq, cp, r)
        for i, blocks in enumerate(steps):
            gk = local_to_global(pkv, akv, cp, (r - i) % cp)
            for b in blocks:
                m, wl, wr = plan.mask_and_window(b.left, b.right)
                vis = visible(b.q1 - b.q0, b.k1 - b.k0, m, (wl, wr))
                rows, keys = gq[b.q0 : b.q1], gk[b.k0 : b.k1]
                assert (rows >= 0).all() and (keys >= 0).all(), "a call reaches padding"
                assert vis.any(axis=1).all(), "a call has a row that sees nothing"
                ii, jj = np.nonzero(vis)
                np.add.at(count, (rows[ii], keys[jj]), 1)
    return count


def random_case(rng):
    cp = int(rng.choice([1, 2, 3, 4, 8]))
    unit = 2 * cp
    pq = unit * int(rng.integers(1, 6))
    pkv = pq if rng.random() < 0.6 else unit * int(rng.integers(1, 6))
    aq = pq if rng.random() < 0.6 else int(rng.integers(1, pq + 1))
    akv = pkv if rng.random() < 0.6 else int(rng.integers(1, pkv + 1))
    mask = str(rng.choice(MASKS))
    side = lambda: int(rng.choice([-1, 0, 1, int(rng.integers(0, 3 * pq + 2))]))
    window = (side(), side()) if rng.random() < 0.7 else (-1, -1)
    return cp, mask, window, pq, aq, pkv, akv


def test_random_plans_cover_exactly_the_mask(rng, seed):
    for _ in range(300):
        cp, mask, window, pq, aq, pkv, akv = random_case(rng)
        want = visible(aq, akv, mask, window).astype(int)
        got = coverage(cp, mask, window, pq, aq, pkv, akv)
        assert np.array_equal(got, want), (
            f"cp={cp} mask={mask} window={window} q={aq}/{pq} kv={akv}/{pkv}: "
            f"{int((got > want).sum())} pairs extra or doubled, {int((got < want).sum())} "
            f"missing (seed {seed})"
        )


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_causal_is_one_call_per_step_and_balanced(cp):
    # The load-balanced layout's point: every rank computes the same number of pairs, and
    # no step needs more than two calls (one where the block is a single band).
    s = 2 * cp * 16
    work = []
    for r in range(cp):
        steps, last = plan.dense_plan(cp, r, "causal", -1, -1, s, s)
        assert last == cp - 1
        assert len(steps[0]) <= 2 and all(len(b) == 1 for b in steps[1:])
        pairs = 0
        for blocks in steps:
            for b in blocks:
                m, wl, wr = plan.mask_and_window(b.left, b.right)
                pairs += int(visible(b.q1 - b.q0, b.k1 - b.k0, m, (wl, wr)).sum())
        work.append(pairs)
    assert len(set(work)) == 1, f"causal work per rank differs: {work}"


def test_no_mask_is_one_call_per_step():
    steps, last = plan.dense_plan(4, 1, "none", -1, -1, 64, 64)
    assert last == 3 and all(len(b) == 1 for b in steps)
    assert all((b[0].q1 - b[0].q0, b[0].k1 - b[0].k0) == (16, 16) for b in steps)
    assert all(plan.mask_and_window(b[0].left, b[0].right)[0] == "none" for b in steps)


def test_sliding_window_skips_blocks_it_never_reaches():
    # window (3, 0) with chunks of 8: each chunk sees itself and the one before, which the
    # layout puts on rank r - 1 (step 1) or rank r + 1 (step cp - 1): the other steps are empty.
    cp, s = 4, 64
    for r in range(cp):
        steps, last = plan.dense_plan(cp, r, "none", 3, 0, s, s)
        assert last == cp - 1
        busy = [i for i, blocks in enumerate(steps) if blocks]
        assert set(busy) <= {0, 1, cp - 1}, f"rank {r}: work at steps {busy}"
    # a window inside each chunk needs no ring at all past step 0
    assert plan.dense_plan(4, 0, "none", 0, 0, 64, 64)[1] == 0


def test_varlen_calls_never_overlap_within_a_call():
    seqs = ((16, 16, 16, 16), (32, 29, 32, 32), (8, 3, 8, 8), (16, 16, 16, 9))
    for r in range(4):
        steps, last = plan.varlen_plan(4, r, "causal", 5, -1, seqs)
        for calls in steps:
            for c in calls:
                for side in (0, 2):
                    spans = sorted((it[side], it[side] + it[side + 1]) for it in c.items)
                    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
