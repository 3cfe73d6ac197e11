#!/usr/bin/env python3
"""KV-cache attention (decode) on `cuda` against the GPU's copy bandwidth and PyTorch SDPA.

One run measures, on the same GPU in one process (issue 20's targets):
  - copy: device-to-device copy bandwidth (torch copy_ of a 2 GiB buffer; bytes read + written);
  - decode rows: s_q = 1, bf16, d = 128, GQA 32/8 and 64/8, (b, s_kv) in (1, 32768),
    (16, 8192), (64, 4096), (8, 16384): our `cuda` KV-cache call (libstrideattn_c.so through
    bench/sa_abi.py, sa_forward_with_kvcache) on a contiguous cache [b, s_kv, hg, d] and on
    paged caches of page size 16 and 64 (a shuffled block table), and PyTorch SDPA's flash
    backend on the contiguous tensors (query [b, h, 1, d]; GQA through enable_gqa=True where
    torch has it, else K/V repeated per query head outside the timed region);
  - prefill rows: s_q = 512, b = 4, s_kv = 4096 (the cache already holds all 4096 keys; the
    512 queries are its last 512 tokens, causal bottom-right), paged (16, 64) vs contiguous:
    `cuda` runs them through its dense forward (s_q >= 64; the decode rows, s_q = 1, through
    its decode kernels: docs/backends.md "KV-cache attention").
Bandwidth counts the K and V bytes read once: b * s_kv * hg * d * 2 tensors * 2 bytes, over the
median time of >= 20 runs timed with CUDA events after a warm-up: of one call inside a CUDA
graph of 10 (the kernels' speed; serving loops capture their decode step), and "eager", one
call and a synchronise (the host's per-call work included), both for ours and for SDPA. Prints a markdown table and
writes RESULTS_DIR/<date>-<gpu>-<commit>.json.

  python3 bench/decode.py [--lib build-gpu/src/libstrideattn_c.so] [--results-dir DIR]
                          [--runs N] [--quick]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import sa_abi  # noqa: E402  (bench/sa_abi.py, generated from include/strideattn/strideattn.h)
from compare_sdpa import data_file_name, git_commit  # noqa: E402
from timing import graph_ms, import_cuda_torch, time_ms  # noqa: E402  (bench/timing.py: CUDA events, median)

torch = None  # imported by main(): --help and the CPU test work without torch

D = 128
DECODE_ROWS = [(1, 32768), (16, 8192), (64, 4096), (8, 16384)]
GROUPS = [(32, 8), (64, 8)]
PAGES = [16, 64]
PREFILL = (4, 512, 4096)  # b, s_q, s_kv


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--lib",
        default=os.path.join(REPO, "build-gpu/src/libstrideattn_c.so"),
        help="libstrideattn_c.so (C ABI)",
    )
    ap.add_argument("--runs", type=int, default=50, help="timed runs per measurement (>= 20)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="GQA 32/8 decode rows only, no prefill")
    ap.add_argument(
        "--results-dir",
        default=os.path.join(BENCH, "results", "decode"),
        help="where the run's data file goes (default bench/results/decode)",
    )
    args = ap.parse_args(argv)
    if args.runs < 20:
        ap.error("--runs must be >= 20 (the protocol of docs/design.md)")
    return args


def kv_bytes(b: int, s_kv: int, hg: int, d: int = D) -> int:
    """K and V bytes one call reads once (bf16)."""
    return b * s_kv * hg * d * 2 * 2


def gbps(nbytes: float, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else nbytes / (ms * 1e-3) / 1e9


def fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def render_table(copy_gbps: float | None, rows: list[dict]) -> str:
    """The markdown table of a run's rows (each a dict of data_rows' form)."""
    out = [
        f"device-to-device copy: {fmt(copy_gbps)} GB/s",
        "",
        "Graph columns: one call inside a CUDA graph (the kernels alone); eager: one call, then a",
        "synchronise (the host's per-call work included).",
        "",
        "| case | b | s_q | s_kv | h/hg | layout | ours ms | ours GB/s | % of copy | SDPA flash GB/s"
        " | ours / SDPA | eager GB/s | SDPA eager GB/s |",
        "| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        pct = None if r["gbps"] is None or not copy_gbps else 100.0 * r["gbps"] / copy_gbps
        ratio = (
            None
            if r.get("sdpa_gbps") in (None, 0) or r["gbps"] is None
            else r["gbps"] / r["sdpa_gbps"]
        )
        out.append(
            f"| {r['case']} | {r['b']} | {r['s_q']} | {r['s_kv']} | {r['h']}/{r['hg']} | "
            f"{r['layout']} | {fmt(r['ms'], 3)} | {fmt(r['gbps'])} | {fmt(pct, 1)} | "
            f"{fmt(r.get('sdpa_gbps'))} | {fmt(ratio, 2)} | {fmt(r.get('eager_gbps'))} | "
            f"{fmt(r.get('sdpa_eager_gbps'))} |"
        )
    return "\n".join(out)


def copy_bandwidth(runs: int, warmup: int) -> float | None:
    """Device-to-device copy of a 2 GiB buffer: bytes read + written per second, in GB/s."""
    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), runs, warmup)
    return gbps(2 * src.numel() * src.element_size(), ms)


def view_of(t) -> sa_abi.sa_tensor_view:
    assert t.dim() == 4
    return sa_abi.sa_tensor_view(
        t.data_ptr(),
        sa_abi.SA_BF16,
        (ctypes.c_int64 * 4)(*t.shape),
        (ctypes.c_int64 * 4)(*t.stride()),
    )


class KvCall:
    """One sa_forward_with_kvcache call on torch's current stream, its arguments built once."""

    def __init__(self, lib, q, k_cache, v_cache, o, lens, table=None, causal=False):
        self.lib, self.msg = lib, ctypes.create_string_buffer(4096)
        self.keep = (q, k_cache, v_cache, o, lens, table)
        a = sa_abi.sa_kvcache_args()
        a.struct_size = ctypes.sizeof(sa_abi.sa_kvcache_args)
        a.q, a.k_cache, a.v_cache, a.o = view_of(q), view_of(k_cache), view_of(v_cache), view_of(o)
        if table is not None:
            a.block_table = sa_abi.sa_block_table_view(
                table.data_ptr(),
                (ctypes.c_int64 * 2)(*table.shape),
                (ctypes.c_int64 * 2)(*table.stride()),
            )
        a.cache_seqlens = lens.data_ptr()
        a.options.mask = sa_abi.SA_MASK_CAUSAL_BOTTOM_RIGHT if causal else sa_abi.SA_MASK_NONE
        a.backend = sa_abi.SA_BACKEND_CUDA
        a.memory = sa_abi.SA_MEMORY_DEVICE
        self.args = a

    def __call__(self):
        self.args.stream = torch.cuda.current_stream().cuda_stream  # (a graph captures on its own)
        rc = self.lib.sa_forward_with_kvcache(ctypes.byref(self.args), self.msg, len(self.msg))
        if rc != sa_abi.SA_OK:
            raise RuntimeError(self.msg.value.decode(errors="replace"))


def paged_copy(k, v, page: int):
    """The contiguous caches [b, s, hg, d] as paged ones [pages, page, hg, d] behind a shuffled
    block table [b, s / page] (int32): the same tokens, each page somewhere else."""
    b, s, hg, d = k.shape
    per = s // page
    perm = torch.randperm(b * per, device=k.device)
    kp = torch.empty(b * per, page, hg, d, dtype=k.dtype, device=k.device)
    vp = torch.empty_like(kp)
    kp[perm] = k.reshape(b * per, page, hg, d)
    vp[perm] = v.reshape(b * per, page, hg, d)
    return kp, vp, perm.reshape(b, per).to(torch.int32).contiguous()


def sdpa_flash(q, k, v, h: int, hg: int, causal: bool):
    """SDPA's flash backend on [b, h, s, d] views of the contiguous tensors."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    try:
        F.scaled_dot_product_attention(qt[:, :, :1], kt[:, :, :1], vt[:, :, :1], enable_gqa=True)
        gqa = {"enable_gqa": True}
    except TypeError:
        gqa = {}
        kt = kt.repeat_interleave(h // hg, dim=1)  # outside the timed region
        vt = vt.repeat_interleave(h // hg, dim=1)

    def fn():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **gqa)

    return fn


def measure(lib, b, s_q, s_kv, h, hg, runs, warmup, case: str, causal: bool) -> list[dict]:
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(b, s_q, h, D, dtype=dt, device=dev)
    k = torch.randn(b, s_kv, hg, D, dtype=dt, device=dev)
    v = torch.randn_like(k)
    o = torch.empty(b, s_q, h, D, dtype=dt, device=dev)
    lens = torch.full((b,), s_kv, dtype=torch.int32, device=dev)
    nbytes = kv_bytes(b, s_kv, hg)
    rows = []
    sdpa = sdpa_eager = None
    if s_q == 1:  # (the prefill row compares paged with contiguous only)
        try:
            fn = sdpa_flash(q, k, v, h, hg, False)
            sdpa = gbps(nbytes, graph_ms(fn, runs, warmup))
            sdpa_eager = gbps(nbytes, time_ms(fn, runs, warmup))
        except RuntimeError as e:
            print(f"decode: SDPA flash on {case} b={b} s_kv={s_kv}: {e}", file=sys.stderr)
    base = {"case": case, "b": b, "s_q": s_q, "s_kv": s_kv, "h": h, "hg": hg, "bytes": nbytes}
    call = KvCall(lib, q, k, v, o, lens, causal=causal)
    ms, eager = graph_ms(call, runs, warmup), time_ms(call, runs, warmup)
    rows.append(
        {
            **base,
            "layout": "contiguous",
            "ms": ms,
            "gbps": gbps(nbytes, ms),
            "sdpa_gbps": sdpa,
            "eager_ms": eager,
            "eager_gbps": gbps(nbytes, eager),
            "sdpa_eager_gbps": sdpa_eager,
        }
    )
    want = o.clone()
    for page in PAGES:
        kp, vp, table = paged_copy(k, v, page)
        call = KvCall(lib, q, kp, vp, o, lens, table, causal=causal)
        ms, eager = graph_ms(call, runs, warmup), time_ms(call, runs, warmup)
        same = bool(torch.equal(o, want))  # the same tokens: the same bytes out
        rows.append(
            {
                **base,
                "layout": f"paged {page}",
                "ms": ms,
                "gbps": gbps(nbytes, ms),
                "sdpa_gbps": sdpa,
                "eager_ms": eager,
                "eager_gbps": gbps(nbytes, eager),
                "sdpa_eager_gbps": sdpa_eager,
                "equals_contiguous": same,
            }
        )
        del kp, vp, table
    return rows


def main(argv=None) -> int:
    global torch
    args = parse_args(argv)
    torch = import_cuda_torch("decode")
    if torch is None:
        return 2
    lib = sa_abi.load(args.lib)
    torch.manual_seed(0)

    copy_gbps = copy_bandwidth(args.runs, args.warmup)

    rows = []
    for h, hg in GROUPS[:1] if args.quick else GROUPS:
        for b, s_kv in DECODE_ROWS:
            rows += measure(lib, b, 1, s_kv, h, hg, args.runs, args.warmup, "decode", False)
            print("\n".join(render_table(copy_gbps, rows[-3:]).splitlines()[-3:]), flush=True)
    if not args.quick:
        b, s_q, s_kv = PREFILL
        rows += measure(lib, b, s_q, s_kv, 32, 8, args.runs, args.warmup, "prefill", True)

    gpu = torch.cuda.get_device_name()
    date, commit = datetime.date.today().isoformat(), git_commit()
    data = {
        "date": date,
        # (UTC: render.py orders one day's runs by it)
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S"),
        "commit": commit,
        "gpu": gpu,
        "command": "python3 bench/decode.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "versions": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": sys.version.split()[0],
        },
        "protocol": {
            "runs": args.runs,
            "warmup": args.warmup,
            "timer": "CUDA events, median; ms / gbps: one call inside a CUDA graph of 10 (the"
            " kernels alone), eager_*: one call then a synchronise (with the host's per-call work)",
            "bandwidth": "K and V bytes read once (b * s_kv * hg * d * 2 * 2) / time; copy: read + write",
            "sdpa": "flash backend on the contiguous tensors; prefill row without a mask",
        },
        "copy_gbps": copy_gbps,
        "rows": rows,
    }
    table = render_table(copy_gbps, rows)
    print()
    print(f"decode on {gpu}, commit {commit}, {date}")
    print()
    print(table)
    os.makedirs(args.results_dir, exist_ok=True)
    path = os.path.join(args.results_dir, data_file_name(date, gpu, commit))
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"\ndecode: data file {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
