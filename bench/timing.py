"""CUDA-event timing shared by the GPU benchmarks (compare_sdpa.py, decode.py, features.py).

The protocol of docs/design.md ("Benchmark protocol"): warm-up calls first, then each run
between two CUDA events recorded on the current stream, synchronised after each run; the
time of a measurement is the median of its runs. The runs are taken in interleaved rounds
whose orders come from a Williams design (williams_orders): what one measurement leaves in
the GPU (heat, clocks, caches) falls on the next, so none may always follow the same one.
torch is imported when a function runs, so that the scripts' --help and their CPU tests
work without it.
"""

from __future__ import annotations

import statistics
import sys


def williams_orders(n: int) -> list[list[int]]:
    """A Williams design on n columns: n orders (n even) or 2n (n odd) of 0..n-1, each column
    in each place equally often and right after each other column equally often. The first
    order is 0, 1, n-1, 2, n-2, ...; order r adds r (mod n); for odd n the reversed orders
    follow."""
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    orders = [[(x + r) % n for x in first] for r in range(n)] if n else []
    return orders + [o[::-1] for o in orders] if n % 2 else orders


def in_round_order(items: list, r: int) -> list:
    """`items` in round r's order: order r (mod the design's length) of williams_orders."""
    if not items:
        return []
    orders = williams_orders(len(items))
    return [items[i] for i in orders[r % len(orders)]]


def balanced_rounds(n_columns: int) -> int:
    """The rounds a balanced order over n columns takes (williams_orders' length)."""
    return len(williams_orders(n_columns)) if n_columns else 1


def import_cuda_torch(script: str):
    """torch, when it is installed and sees a CUDA device; else None, after saying why on
    stderr (the GPU benchmarks then exit 2)."""
    try:
        import torch
    except ImportError as e:
        print(f"{script}: PyTorch is not installed ({e}); nothing to measure", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print(f"{script}: no CUDA device", file=sys.stderr)
        return None
    return torch


def event_times(fn, runs: int, warmup: int) -> list[float]:
    """Milliseconds of each of `runs` calls of fn, after `warmup` untimed calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def time_ms(fn, runs: int, warmup: int) -> float:
    """The median of event_times: one measurement of the protocol."""
    return statistics.median(event_times(fn, runs, warmup))


def graph_ms(fn, runs: int, warmup: int, reps: int = 10) -> float | None:
    """Median time of one call inside a CUDA graph of `reps` calls, replayed between CUDA
    events: the kernels' time without the host's per-call work (a serving loop captures its
    decode step in a graph). None, with the reason on stderr, when fn cannot be captured."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            fn()  # (a warm-up on the capture stream, as torch's graph docs ask)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
    except RuntimeError as e:
        print(f"graph capture failed: {e}", file=sys.stderr)
        return None
    g.replay()
    torch.cuda.synchronize()
    return time_ms(g.replay, runs, warmup) / reps
