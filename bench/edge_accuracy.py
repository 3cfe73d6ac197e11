#!/usr/bin/env python3
"""Accuracy at the numerical edges: strideattn's GPU backends against PyTorch SDPA, on one GPU.

For each case the same inputs go to strideattn's `cuda` and `cudnn` backends (C ABI, real
strides) and to SDPA's flash and cuDNN backends; every output is compared with an fp64
evaluation of the definition (docs/semantics.md) on the same rounded inputs. Cases:
  magnitude  Q and K standard normal times a factor (logits up to the dtype's range), V
             standard normal: max |O - O_fp64|, NaN count, and whether a one-hot answer is exact;
  scale      extreme `scale` values on standard-normal inputs;
  long       K and V one row repeated over s_kv keys through stride-0 views (exact O = that row);
  nonfinite  a NaN or Inf planted in Q, K or V: every output element the fp64 definition makes
             non-finite must be non-finite (NaN where it is NaN), every other one finite.
Prints one table and writes the rows as JSON (--out).

  python3 bench/edge_accuracy.py --lib build-gpu/src/libstrideattn_c.so [--out edges.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_sdpa import Strideattn  # noqa: E402  (the C ABI through ctypes)


def fp64_attention(q, k, v, scale, causal=False):
    """O and LSE in fp64 from [b, s, h, d] inputs (GQA by repeating KV heads)."""
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))  # [b, h, s, d]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        sq, skv = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, skv, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    lse = torch.logsumexp(s, -1)
    o = torch.matmul(torch.exp(s - lse[..., None]), v)
    return o.transpose(1, 2), lse


def run_ours(sa, backend, q, k, v, scale):
    b, s, h, _ = q.shape
    o = torch.full((b, s, h, v.shape[-1]), float("nan"), device="cuda", dtype=q.dtype)
    lse = torch.full((b, h, s), float("nan"), device="cuda", dtype=torch.float32)
    args = sa.forward_args(backend, q, k, v, o, lse, False)
    args.options.scale = scale
    sa.forward(args)
    torch.cuda.synchronize()
    return o


def run_sdpa(kind, q, k, v, scale):
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel(kind):
        o = F.scaled_dot_product_attention(
            qt, kt, vt, scale=scale, enable_gqa=q.shape[2] != k.shape[2]
        )
    torch.cuda.synchronize()
    return o.transpose(1, 2)


def columns(sa, backends, q, k, v, scale):
    out = {}
    for be in backends:
        try:
            out[be] = run_ours(sa, be, q, k, v, scale)
        except Exception as e:  # noqa: BLE001 - a refusal is a result
            out[be] = "refused: " + str(e).splitlines()[0][:60]
    for name, kind in (
        ("sdpa-flash", SDPBackend.FLASH_ATTENTION),
        ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
    ):
        try:
            out[name] = run_sdpa(kind, q, k, v, scale)
        except Exception as e:  # noqa: BLE001
            out[name] = "n/a: " + str(e).splitlines()[0][:60]
    return out


def max_err(o, ref):
    if isinstance(o, str):
        return o
    o = o.double()
    nan = int(torch.isnan(o).sum())
    err = float((o - ref).abs().nan_to_num(nan=math.inf).max())
    return f"{err:.2e}" + (f" ({nan} NaN)" if nan else "")


def magnitude_rows(sa, backends, gen):
    rows = []
    for dtype, factors in (
        (torch.bfloat16, [1, 10, 30, 100, 300, 1000, 1e4]),
        (torch.float16, [1, 10, 30, 100, 200]),
    ):
        for f in factors:
            q = (torch.randn(2, 512, 4, 128, device="cuda", generator=gen) * f).to(dtype)
            k = (torch.randn(2, 512, 4, 128, device="cuda", generator=gen) * f).to(dtype)
            v = torch.randn(2, 512, 4, 128, device="cuda", generator=gen).to(dtype)
            scale = 1 / math.sqrt(128)
            ref, _ = fp64_attention(q, k, v, scale)
            outs = columns(sa, backends, q, k, v, scale)
            rows.append(
                {
                    "case": f"magnitude {str(dtype)[6:]} x{f:g}",
                    **{c: max_err(o, ref) for c, o in outs.items()},
                }
            )
    return rows


def scale_rows(sa, backends, gen):
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for scale in (1e-30, 1e-8, 1e4, 1e10, 1e30):
            q, k, v = (
                torch.randn(2, 256, 4, 64, device="cuda", generator=gen).to(dtype) for _ in range(3)
            )
            ref, _ = fp64_attention(q, k, v, scale)
            outs = columns(sa, backends, q, k, v, scale)
            rows.append(
                {
                    "case": f"scale {str(dtype)[6:]} {scale:g}",
                    **{c: max_err(o, ref) for c, o in outs.items()},
                }
            )
    return rows


def long_rows(sa, backends, gen):
    rows = []
    for s_kv in (4096, 1 << 20, 1 << 23):
        q = torch.randn(1, 128, 4, 128, device="cuda", generator=gen).to(torch.bfloat16)
        krow = torch.randn(1, 1, 4, 128, device="cuda", generator=gen).to(torch.bfloat16)
        vrow = torch.randn(1, 1, 4, 128, device="cuda", generator=gen).to(torch.bfloat16)
        k, v = krow.expand(1, s_kv, 4, 128), vrow.expand(1, s_kv, 4, 128)
        ref = vrow.double().expand(1, 128, 4, 128)
        outs = {}
        for be in backends:
            try:
                outs[be] = run_ours(sa, be, q, k, v, 1 / math.sqrt(128))
            except Exception as e:  # noqa: BLE001
                outs[be] = "refused: " + str(e).splitlines()[0][:60]
        rows.append({"case": f"long s_kv={s_kv}", **{c: max_err(o, ref) for c, o in outs.items()}})
    return rows


def nonfinite_rows(sa, backends, gen):
    rows = []
    plants = [
        ("k", (0, 2, 0, 0), math.nan),
        ("q", (0, 3, 1, 5), math.nan),
        ("v", (0, 7, 0, 9), math.nan),
        ("k", (0, 5, 1, 0), math.inf),
        ("v", (0, 1, 1, 3), -math.inf),
    ]
    for dtype in (torch.bfloat16, torch.float16):
        for tensor, idx, val in plants:
            t = {
                n: torch.randn(1, 64, 2, 64, device="cuda", generator=gen).to(dtype) for n in "qkv"
            }
            t[tensor][idx] = val
            scale = 0.125
            ref, _ = fp64_attention(t["q"], t["k"], t["v"], scale)
            outs = columns(sa, backends, t["q"], t["k"], t["v"], scale)
            res = {}
            for c, o in outs.items():
                if isinstance(o, str):
                    res[c] = o
                    continue
                o = o.double()
                bad = int(
                    ((~torch.isfinite(ref)) & torch.isfinite(o)).sum()
                    + (torch.isnan(ref) & ~torch.isnan(o)).sum()
                    + (torch.isfinite(ref) & ~torch.isfinite(o)).sum()
                )
                fin = torch.isfinite(ref)
                err = float((o[fin] - ref[fin]).abs().max()) if fin.any() else 0.0
                res[c] = "ok" if bad == 0 and err < 0.1 else f"{bad} wrong, err {err:.1e}"
            rows.append({"case": f"{tensor}{list(idx)}={val} {str(dtype)[6:]}", **res})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="path to libstrideattn_c.so")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--only", default="magnitude,scale,long,nonfinite")
    args = ap.parse_args()
    sa = Strideattn(args.lib)
    backends = [b for b in ("cuda", "cudnn") if sa.compiled(b)]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    rows = []
    groups = {
        "magnitude": magnitude_rows,
        "scale": scale_rows,
        "long": long_rows,
        "nonfinite": nonfinite_rows,
    }
    for name in args.only.split(","):
        rows += groups[name](sa, backends, gen)
    cols = ["case"] + backends + ["sdpa-flash", "sdpa-cudnn"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
