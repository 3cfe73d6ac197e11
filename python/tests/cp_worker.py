"""Test helper (not a test file): a pool of processes joined by torch.distributed's gloo
backend that run context-parallel cases for test_cp.py. The pool starts once per test module
(forkserver, with torch preloaded, so that a start costs a fork, not an import); each rank
gets its shard of a case's buffers, builds the strided views the case names, runs
strideattn's context-parallel attention forward and backward on the `cpu` backend, and sends
back O, the LSE and the gradients of its buffers. Tensors cross the process boundary as raw
bytes (bf16 has no numpy dtype)."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import tempfile
import traceback

WORLD = 4
PAIR = (1, 3)  # the ranks of the two-rank group: group ranks 0, 1 are global ranks 1, 3


def to_wire(t):
    import torch

    t = t.detach().contiguous()
    raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return str(t.dtype).replace("torch.", ""), tuple(t.shape), raw.numpy().tobytes()


def from_wire(w):
    import torch

    dtype, shape, raw = w
    dt = getattr(torch, dtype)
    if not raw:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dt).reshape(shape)


# ----------------------------------------------------------------------------- in a rank


def _views(job, bufs):
    """q, k, v as the case lays them out: views of the buffers, in the API's logical order
    (fn: [b, s, h, d] or [t, h, d]; module: its qkv_format's order)."""
    h, hg, d = job["h"], job["hg"], job["d"]
    if job["fused"]:  # one [.., h + 2hg, d] buffer
        q, k, v = bufs[0].split([h, hg, hg], dim=-2)
    else:  # q, and K/V side by side in the head dim of one [.., hg, d + dv] buffer
        q = bufs[0]
        k, v = bufs[1].split([d, job["dv"]], dim=-1)
    if job["api"] == "fn" and job["fmt"] == "sbhd":
        q, k, v = (x.transpose(0, 1) for x in (q, k, v))
    return q, k, v


def _run(job, groups):
    import torch

    import strideattn.torch as sat

    group = groups[job["group"]]
    bufs = [from_wire(w).requires_grad_() for w in job["bufs"]]
    q, k, v = _views(job, bufs)
    lse = None
    if job["api"] == "fn":
        o, lse = sat.attention(
            q, k, v, cp_group=group, cp_comm_type=job["comm"], return_lse=True, backend="cpu",
            **job["kwargs"],
        )  # fmt: skip
    else:
        mod = sat.DotProductAttention(
            job["h"], (job["d"], job["dv"]), num_gqa_groups=job["hg"], qkv_format=job["fmt"],
            cp_group=group, cp_comm_type=job["comm"], backend="cpu", **job["ctor"],
        )  # fmt: skip
        kw = {
            n: torch.tensor(x, dtype=torch.int32) if isinstance(x, list) else x
            for n, x in job["kwargs"].items()
        }
        o = mod(q, k, v, **kw)
    o.backward(from_wire(job["do"]).view(o.shape))
    out = {"o": to_wire(o), "grads": [to_wire(b.grad) for b in bufs]}
    if lse is not None:
        out["lse"] = to_wire(lse)
    return out


def _worker(rank, store, inq, outq):
    os.environ["STRIDEATTN_CPU_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    groups = {"world": dist.group.WORLD, "pair": dist.new_group(list(PAIR))}
    while True:
        job = inq.get()
        if job is None:
            break
        try:
            outq.put((rank, "ok", _run(job, groups)))
        except Exception as e:  # the parent reports it; the next case still runs
            outq.put((rank, type(e).__name__, f"{e}\n{traceback.format_exc()}"))
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- the parent


class Pool:
    """WORLD processes in one gloo world, with the groups 'world' and 'pair'."""

    def __init__(self):
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "strideattn.torch"])
        fd, store = tempfile.mkstemp(prefix="strideattn-cp-")
        os.close(fd)
        os.unlink(store)
        self.inq = [ctx.Queue() for _ in range(WORLD)]
        self.outq = ctx.Queue()
        self.procs = [
            ctx.Process(target=_worker, args=(r, store, self.inq[r], self.outq), daemon=True)
            for r in range(WORLD)
        ]
        for p in self.procs:
            p.start()
        self.broken = False

    def run(self, group: str, jobs, timeout: float = 60.0):
        """jobs[i] for group rank i; returns [(status, result)] in group-rank order."""
        ranks = PAIR if group == "pair" else tuple(range(WORLD))
        assert len(jobs) == len(ranks)
        for r, job in zip(ranks, jobs):
            self.inq[r].put(dict(job, group=group))
        got = {}
        try:
            while len(got) < len(ranks):
                r, status, res = self.outq.get(timeout=timeout)
                got[r] = (status, res)
        except queue.Empty:
            self.broken = True
            raise AssertionError(
                f"context-parallel ranks {sorted(set(ranks) - set(got))} gave no answer in "
                f"{timeout} s (a hang in the ring?); answers so far: {got}"
            ) from None
        return [got[r] for r in ranks]

    def close(self):
        for q, p in zip(self.inq, self.procs):
            if p.is_alive() and not self.broken:
                q.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
