"""CUDA-event timing shared by the GPU benchmarks (compare_sdpa.py, decode.py, features.py).

The protocol of docs/design.md ("Benchmark protocol"): warm-up calls first, then each run
between two CUDA events recorded on the current stream, synchronised after each run; the
time of a measurement is the median of its runs. torch is imported when a function runs, so
that the scripts' --help and their CPU tests work without it.
"""

from __future__ import annotations

import statistics
import sys


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
