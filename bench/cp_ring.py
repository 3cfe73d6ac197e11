#!/usr/bin/env python3
"""Context-parallel benchmark: strideattn's ring (p2p) attention over N GPUs against one GPU
running the whole sequence, forward + backward, bf16.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
      torchrun --nproc-per-node 2 bench/cp_ring.py --seqlens 65536,131072

For each sequence length: tokens/s of one GPU on the whole sequence (every rank runs it at
the same time on its own GPU; rank 0's time is reported) and of the ring over the N ranks,
the speedup and scaling efficiency (speedup / N), and the overlap fraction: the share of the
ring's communication hidden behind compute, (t_compute + t_comm - t_ring) / t_comm, clipped
to [0, 1], where t_compute is the same ring with every step reusing the local K/V (no
communication) and t_comm the same exchanges with no compute. Times are medians of --runs
after --warmup, CUDA events, the slowest rank's time per run. Each length is also checked:
O, LSE and dQ on sampled query rows and dK, dV on sampled keys, of the ring and of the
single-GPU run, against an fp64 reference under the correctness rule of docs/semantics.md.

Rank 0 prints a table and writes a data file to bench/results/cp/ (`--out`); `--render`
rewrites bench/RESULTS.md from those files (no GPU needed). `--device cpu` runs the same
script on gloo with the cpu backend, at small sizes, to check it without GPUs."""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import platform
import statistics
import subprocess
import sys

# NVLink multicast off (NVLS, symmetric-memory multicast): set before NCCL initialises
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "cp")
RESULTS_MD = os.path.join(HERE, "RESULTS.md")
FLOOR = {"float32": 2e-5, "float16": 1e-4, "bfloat16": 1e-3}
MANTISSA = {"float32": 23, "float16": 10, "bfloat16": 7}


# ----------------------------------------------------------------------------- correctness


def _half_ulp(name, x):
    x = abs(float(x))
    if not (x > 0) or not math.isfinite(x):
        return 0.0
    return math.ldexp(1.0, math.frexp(x)[1] - 2 - MANTISSA[name])


def _rule(got, exact, naive, name, magnitude=None):
    """docs/semantics.md's correctness rule on sampled elements: (error, tolerance)."""
    import torch

    fin = torch.isfinite(exact)
    if not torch.equal(torch.isfinite(got), fin) or torch.isnan(got).any():
        return float("inf"), 0.0
    err = (got[fin] - exact[fin]).abs().max().item() if fin.any() else 0.0
    nerr = (naive[fin] - exact[fin]).abs().max().item() if fin.any() else 0.0
    largest = exact[fin].abs().max().item() if fin.any() else 0.0
    mag = largest if magnitude is None else magnitude
    tol = 2 * nerr + FLOOR[name] + 4e-6 * mag + _half_ulp(name, largest)
    return err, tol


def _visible(rows, keys, s_q, s_kv, mask):
    i, j = rows[:, None], keys[None, :]
    if mask == "causal":
        return j <= i
    if mask == "causal_bottom_right":
        return j <= i + (s_kv - s_q)
    return j >= 0


def _round(x, dtype):
    return x.to(dtype).to(x.dtype)


def reference_check(q, k, v, o, lse, do, dq, dk, dv, mask, scale, rows, keys, block=4096):
    """fp64 reference and the naive low-precision model on sampled query rows (O, LSE, dQ)
    and sampled keys (dK, dV, which need every row's fp64 LSE: computed in blocks).
    Whole-sequence tensors [1, s, heads, d]; o is the O the backward was handed (the
    gradient targets of 16-bit dtypes are the backward of the given O). Returns
    {tensor: (error, tolerance)}."""
    import torch

    dt = q.dtype
    name = str(dt).replace("torch.", "")
    lowp = None if dt == torch.float32 else dt
    s_q, s_kv, h, hg = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    g = h // hg
    f64 = lambda x: x[0].double().repeat_interleave(g, dim=1) if x.shape[2] == hg else x[0].double()  # fmt: skip
    Q, K, V, O, dO = (f64(x) for x in (q, k, v, o, do))  # [s, h, d]
    dev = q.device
    all_q = torch.arange(s_q, device=dev)
    all_k = torch.arange(s_kv, device=dev)

    def rows_of(qr, rows_idx, ct):
        """(P, LSE, S) of these rows against all keys, in compute type ct (the naive model
        rounds P to the dtype)."""
        s = torch.einsum("ihd,jhd->hij", qr.to(ct), K.to(ct)) * scale
        m = _visible(rows_idx, all_k, s_q, s_kv, mask)
        s = s.masked_fill(~m[None], float("-inf"))
        lse_r = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse_r[..., None]).nan_to_num(0.0)
        return p, lse_r

    out = {}
    # rows: O, LSE, dQ
    p, lse_x = rows_of(Q[rows], rows, torch.float64)
    o_x = torch.einsum("hij,jhd->ihd", p, V)
    qn = Q[rows].float()
    s_n = torch.einsum("ihd,jhd->hij", qn, K.float()) * scale
    s_n = s_n.masked_fill(~_visible(rows, all_k, s_q, s_kv, mask)[None], float("-inf"))
    lse_n = torch.logsumexp(s_n, dim=-1)
    p_n = torch.exp(s_n - lse_n[..., None]).nan_to_num(0.0)
    p_nr = _round(p_n, lowp) if lowp else p_n
    o_n = torch.einsum("hij,jhd->ihd", p_nr, V.float())
    o_n = _round(o_n, lowp) if lowp else o_n
    out["o"] = _rule(o[0, rows].double(), o_x, o_n.double(), name)
    out["lse"] = _rule(lse[0, :, rows].double(), lse_x, lse_n.double(), "float32")
    o_given = O[rows] if lowp else o_x
    d_x = (dO[rows] * o_given).sum(-1).T  # [h, rows]
    dp = torch.einsum("ihd,jhd->hij", dO[rows], V)
    ds = p * (dp - d_x[..., None])
    dq_x = torch.einsum("hij,jhd->ihd", ds, K) * scale
    d_n = (dO[rows].float() * o_given.float()).sum(-1).T
    dp_n = torch.einsum("ihd,jhd->hij", dO[rows].float(), V.float())
    p_b = torch.exp(s_n - lse_n[..., None]).nan_to_num(0.0)
    ds_n = p_b * (dp_n - d_n[..., None])
    ds_n = _round(ds_n, lowp) if lowp else ds_n
    dq_n = torch.einsum("hij,jhd->ihd", ds_n, K.float()) * scale
    dq_n = _round(dq_n, lowp) if lowp else dq_n

    # keys: every row's fp64 LSE in blocks, then dK, dV of the sampled keys
    lse_all = torch.empty(h, s_q, dtype=torch.float64, device=dev)
    for a in range(0, s_q, block):
        z = min(s_q, a + block)
        acc = torch.full((h, z - a), float("-inf"), dtype=torch.float64, device=dev)
        for c in range(0, s_kv, block):
            e = min(s_kv, c + block)
            s = torch.einsum("ihd,jhd->hij", Q[a:z], K[c:e]) * scale
            s = s.masked_fill(~_visible(all_q[a:z], all_k[c:e], s_q, s_kv, mask)[None], float("-inf"))  # fmt: skip
            acc = torch.logaddexp(acc, torch.logsumexp(s, dim=-1))
        lse_all[:, a:z] = acc
    s_k = torch.einsum("ihd,jhd->hij", Q, K[keys]) * scale  # [h, s_q, keys]
    vis = _visible(all_q, keys, s_q, s_kv, mask)[None]
    p_k = torch.exp(s_k - lse_all[..., None]).masked_fill(~vis, 0.0).nan_to_num(0.0)
    o_all = O if lowp else None
    if o_all is None:  # f32: the true gradient needs the exact O of every row
        raise NotImplementedError("reference_check takes 16-bit dtypes")
    d_all = (dO * o_all).sum(-1).T  # [h, s_q]
    dp_k = torch.einsum("ihd,jhd->hij", dO, V[keys])
    ds_k = p_k * (dp_k - d_all[..., None])
    dk_x = (torch.einsum("hij,ihd->jhd", ds_k, Q) * scale).unflatten(1, (hg, g)).sum(2)
    dv_x = torch.einsum("hij,ihd->jhd", p_k, dO).unflatten(1, (hg, g)).sum(2)
    s_kn = torch.einsum("ihd,jhd->hij", Q.float(), K[keys].float()) * scale
    lse_nf = lse_all.float()  # the naive model's fp32 LSE, as close as it gets on all rows
    p_kn = torch.exp(s_kn - lse_nf[..., None]).masked_fill(~vis, 0.0)
    dp_kn = torch.einsum("ihd,jhd->hij", dO.float(), V[keys].float())
    ds_kn = _round(p_kn * (dp_kn - d_all.float()[..., None]), lowp)
    dk_n = _round((torch.einsum("hij,ihd->jhd", ds_kn, Q.float()) * scale).unflatten(1, (hg, g)).sum(2), lowp)  # fmt: skip
    dv_n = _round(torch.einsum("hij,ihd->jhd", _round(p_kn, lowp), dO.float()).unflatten(1, (hg, g)).sum(2), lowp)  # fmt: skip
    mag = max(dq_x.abs().max().item(), dk_x.abs().max().item(), dv_x.abs().max().item())
    out["dq"] = _rule(dq[0, rows].double(), dq_x, dq_n.double(), name, mag)
    out["dk"] = _rule(dk[0, keys].double(), dk_x, dk_n.double(), name, mag)
    out["dv"] = _rule(dv[0, keys].double(), dv_x, dv_n.double(), name, mag)
    return out


# ----------------------------------------------------------------------------- timing


class Clock:
    """Wall time of one call on every rank, the slowest rank's (CUDA events on GPU)."""

    def __init__(self, device):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.device = torch, dist, device
        self.cuda = device.type == "cuda"

    def __call__(self, fn, runs, warmup):
        torch, dist = self.torch, self.dist
        times = []
        for it in range(warmup + runs):
            dist.barrier()
            if self.cuda:
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                t = a.elapsed_time(b) / 1e3
            else:
                import time

                t0 = time.perf_counter()
                fn()
                t = time.perf_counter() - t0
            x = torch.tensor([t], dtype=torch.float64, device=self.device)
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
            if it >= warmup:
                times.append(float(x.item()))
        return statistics.median(times)


def visible_pairs(s, mask):
    return s * (s + 1) // 2 if mask in ("causal", "causal_bottom_right") else s * s


def commit():
    c = os.environ.get("STRIDEATTN_COMMIT")
    if c:
        return c[:7]
    try:
        out = subprocess.run(["git", "-C", HERE, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True)  # fmt: skip
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def run_length(args, s, clock, dev, group_rank, world):
    import torch
    import torch.distributed as dist

    import strideattn.torch as sat
    from strideattn import _cp_plan, _cp_ring, _torch_cp

    dtype = torch.bfloat16
    h, hg, d = args.heads, args.kv_heads, args.head_dim
    gen = torch.Generator(device=dev).manual_seed(1000 + s)
    draw = lambda n: torch.randn(1, s, n, d, generator=gen, device=dev).to(dtype)
    q, k, v, do = draw(h), draw(hg), draw(hg), draw(h)
    scale = 1.0 / math.sqrt(d)
    opts = dict(mask=args.mask, backend=args.backend)

    # one GPU, the whole sequence (every rank at once, on its own device)
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    single = {}

    def one():
        for x in (qs, ks, vs):
            x.grad = None
        o, lse = sat.attention(qs, ks, vs, return_lse=True, **opts)
        o.backward(do)
        single.update(o=o.detach(), lse=lse)

    t_single = clock(one, args.runs, args.warmup)

    # the ring over the group
    shard = lambda x: sat.cp_shard(x, world, group_rank)
    ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
    dol = shard(do)
    ring = {}

    def ringed():
        for x in (ql, kl, vl):
            x.grad = None
        o, lse = sat.cp_attention(ql, kl, vl, None, cp_comm_type=args.comm, return_lse=True, **opts)  # fmt: skip
        o.backward(dol)
        ring.update(o=o.detach(), lse=lse)

    t_ring = clock(ringed, args.runs, args.warmup)
    row = dict(seqlen=s, heads=h, kv_heads=hg, head_dim=d, mask=args.mask, dtype="bf16", comm=args.comm, gpus=world)  # fmt: skip
    row.update(single_s=t_single, ring_s=t_ring)
    if args.comm == "p2p":
        steps, last = _cp_plan.dense_plan(world, group_rank, args.mask, -1, -1, s, s)
        units = [_torch_cp._dense_units(b) for b in steps[: last + 1]]
        cfg = _cp_ring.RingConfig(units, last, scale, args.backend, False, None, None, comm=False)
        qc, kc, vc = (x.detach().clone().requires_grad_() for x in (ql, kl, vl))

        def compute_only():
            o, _ = _cp_ring.RingAttention.apply(qc, kc, vc, cfg)
            o.backward(dol)

        cfg_comm = _cp_ring.RingConfig(units, last, scale, args.backend, False)
        t_compute = clock(compute_only, args.runs, args.warmup)
        t_comm = clock(lambda: _cp_ring.ring_comm_only(kl.detach(), vl.detach(), cfg_comm), args.runs, args.warmup)  # fmt: skip
        hidden = (t_compute + t_comm - t_ring) / t_comm if t_comm > 0 else 1.0
        row.update(compute_only_s=t_compute, comm_only_s=t_comm, overlap=min(1.0, max(0.0, hidden)))  # fmt: skip
    flops = 4.0 * visible_pairs(s, args.mask) * h * d * 3.5  # fwd + bwd (docs/design.md)
    row.update(
        tokens_per_s_single=s / t_single,
        tokens_per_s_ring=s / t_ring,
        speedup=t_single / t_ring,
        efficiency=t_single / t_ring / world,
        tflops_per_gpu_single=flops / t_single / 1e12,
        tflops_per_gpu_ring=flops / t_ring / world / 1e12,
    )  # fmt: skip

    if not args.no_check:  # the ring's and the single run's results against fp64
        gather = lambda x, dim: _gather(x.contiguous(), dim, world, dist)
        o_r = gather(ring["o"], 1)
        lse_r = gather(ring["lse"], 2)
        g_r = [gather(x.grad, 1) for x in (ql, kl, vl)]
        if group_rank == 0:
            n = args.samples
            rows = torch.unique(torch.cat([torch.tensor([0, s - 1]), torch.randint(0, s, (n,), generator=torch.Generator().manual_seed(s))])).to(dev)  # fmt: skip
            keys = rows.clone()
            check = {}
            for who, (o, lse, grads) in (
                ("ring", (o_r, lse_r, g_r)),
                ("single", (single["o"], single["lse"], [qs.grad, ks.grad, vs.grad])),
            ):
                check[who] = reference_check(q, k, v, o, lse, do, *grads, args.mask, scale, rows, keys)  # fmt: skip
            row["check"] = {w: {t: [e, tol] for t, (e, tol) in c.items()} for w, c in check.items()}
            row["check_pass"] = all(e <= tol for c in check.values() for e, tol in c.values())
    return row


def _gather(x, dim, world, dist):
    import strideattn.torch as sat

    parts = [x.new_empty(x.shape) for _ in range(world)]
    dist.all_gather(parts, x)
    return sat.cp_unshard(parts, seq_dim=dim)


# ----------------------------------------------------------------------------- output


def table(rows):
    out = [
        "| s | gpus | h/hg, d | mask | 1 GPU tok/s | ring tok/s | speedup | efficiency | overlap | TFLOP/s/GPU 1 / ring | check |",  # fmt: skip
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ov = f"{r['overlap']:.2f}" if "overlap" in r else "-"
        ck = "-" if "check_pass" not in r else ("pass" if r["check_pass"] else "FAIL")
        out.append(
            f"| {r['seqlen']} | {r['gpus']} | {r['heads']}/{r['kv_heads']}, {r['head_dim']} | {r['mask']} | "  # fmt: skip
            f"{r['tokens_per_s_single']:.0f} | {r['tokens_per_s_ring']:.0f} | {r['speedup']:.2f} | "
            f"{r['efficiency']:.2f} | {ov} | {r['tflops_per_gpu_single']:.0f} / {r['tflops_per_gpu_ring']:.0f} | {ck} |"  # fmt: skip
        )
    return "\n".join(out)


HEADER = """# Context-parallel benchmark results

Rendered by `python3 bench/cp_ring.py --render` from the data files in `bench/results/cp/`
(one per run of `bench/cp_ring.py`; newest first). Ring (p2p) forward + backward, bf16, of
the sequence split over N GPUs against one GPU on the whole sequence; tokens/s counts the
whole sequence's tokens; efficiency = speedup / N; overlap = the share of the ring's
communication hidden behind compute. `check`: O, LSE, dQ on sampled rows and dK, dV on
sampled keys, of the ring and of the one-GPU run, against fp64 under the correctness rule
of docs/semantics.md. Target: speedup >= 1.8 at 2 GPUs, s >= 64k, causal, d = 128.

To record a run (a machine with 2, 4 or 8 GPUs; NVLink multicast stays off):

```sh
NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
  torchrun --nproc-per-node 2 bench/cp_ring.py --seqlens 65536,131072
python3 bench/cp_ring.py --render
```
"""


def render(results_dir=RESULTS, path=RESULTS_MD):
    files = sorted(glob.glob(os.path.join(results_dir, "*.json")), reverse=True)
    parts = [HEADER]
    if not files:
        parts.append("No run recorded yet.\n")
    for f in files:
        with open(f) as fh:
            data = json.load(fh)
        parts.append(
            f"## {os.path.basename(f)}\n\n{data['date']}, commit {data['commit']}, "
            f"{data['gpus']} x {data['gpu']}, torch {data['torch']}; `{data['command']}`\n\n"
            f"{table(data['rows'])}\n"
        )
    with open(path, "w") as fh:
        fh.write("\n".join(parts))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlens", default="65536,131072", help="comma-separated sequence lengths")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--mask", default="causal", choices=["causal", "none"])
    ap.add_argument("--comm", default="p2p", choices=["p2p", "a2a"])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--samples", type=int, default=32, help="sampled rows/keys for the check")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", default=RESULTS, help="folder for the data file")
    ap.add_argument("--render", action="store_true", help="rewrite bench/RESULTS.md and exit")
    args = ap.parse_args(argv)
    if args.render:
        render()
        return 0
    import torch
    import torch.distributed as dist

    cpu = args.device == "cpu"
    dist.init_process_group("gloo" if cpu else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cpu:
        dev = torch.device("cpu")
    else:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(dev)
    clock = Clock(dev)
    rows = []
    for s in (int(x) for x in args.seqlens.split(",")):
        row = run_length(args, s, clock, dev, rank, world)
        rows.append(row)
        if rank == 0:
            print(table([row]).splitlines()[-1], flush=True)
    if rank == 0:
        gpu = "cpu" if cpu else torch.cuda.get_device_name(dev)
        data = dict(
            date=datetime.date.today().isoformat(), commit=commit(), gpu=gpu, gpus=world,
            torch=torch.__version__, host=platform.node(), command=" ".join(["bench/cp_ring.py"] + (argv or sys.argv[1:])),  # fmt: skip
            env={k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},  # fmt: skip
            rows=rows,
        )  # fmt: skip
        print(table(rows))
        os.makedirs(args.out, exist_ok=True)
        slug = gpu.lower().replace(" ", "-")
        name = f"{data['date']}-{slug}x{world}-{data['commit']}.json"
        with open(os.path.join(args.out, name), "w") as fh:
            json.dump(data, fh, indent=1)
        print(f"wrote {os.path.join(args.out, name)}")
    dist.destroy_process_group()
    ok = all(r.get("check_pass", True) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
