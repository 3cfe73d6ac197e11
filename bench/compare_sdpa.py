#!/usr/bin/env python3
"""strideattn against PyTorch SDPA, in one process, on the same tensors.

Runs PyTorch SDPA with its flash and cuDNN backends (torch.nn.attention.sdpa_kernel) and
strideattn's cuda and cudnn backends (libstrideattn_c.so through the generated ctypes
description bench/sa_abi.py, called with the torch tensors' data pointers and real strides
on torch's current stream) on the shapes of docs/design.md, and prints TFLOP/s and the
ratios ours / SDPA flash and ours / SDPA cudnn. Each run also writes its results as one data
file, RESULTS_DIR/<date>-<gpu>-<commit>.json (bench/render.py renders them into
bench/README.md).

The user path: the same shapes, on the same tensors in the same run, through
strideattn.torch.DotProductAttention (qkv_format sbhd for the seed's split views, bshd
otherwise) with autograd, per backend of --user-backends (columns torch-auto, torch-cuda,
torch-cudnn), as SDPA is called: what a PyTorch user gets, beside the C ABI's kernel speed.
It needs the strideattn package importable (e.g. PYTHONPATH at a `pip install --target`);
without it those columns say why they are empty.

Protocol (docs/design.md, "Benchmark protocol"): CUDA events around each run, warm-up first,
the median of >= 20 runs; fwd+bwd times the forward and the whole backward (every kernel).
The runs of a shape's measurements are taken in interleaved rounds (--rounds; by default
as many as a balanced order needs): each round visits every column and mode in turn, the
rounds' column orders a Williams design, in which every column runs right after every other
column equally often. A drift of the GPU's clock over a shape's measurements, and whatever a
column leaves behind for the next (its heat, clocks and caches), then falls on every column
alike: measured one column after another, the same kernel moved by up to ~8% with its place
in the order (bench/results/auto-order/2026-12-03-nvidia-h200-97c8175.md), and with the
order only rotated round by round (each column still right after the same one), `auto`
measured 0.89-0.93x of the `cudnn` kernel it runs, which it always followed. The first round
of a column warms it up with --warmup calls, later rounds with --round-warmup;
FLOPs: forward 2 * visible_pairs * (d_qk + d_v) summed over batch and query heads, backward
2.5x forward; bf16 unless a row says otherwise.

  python3 bench/compare_sdpa.py [--quick | --only NAME-PART] [--out bench.md]
                                [--results-dir DIR] [--append-results]
                                [--user-backends auto,cuda,cudnn | --user-backends none]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import re
import subprocess
import statistics
import sys
from dataclasses import dataclass, field

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import render  # noqa: E402  (bench/render.py: the table, the data file format)
import sa_abi  # noqa: E402  (bench/sa_abi.py, generated from include/strideattn/strideattn.h)
from timing import balanced_rounds, event_times, in_round_order  # noqa: E402  (bench/timing.py)

torch = F = SDPBackend = sdpa_kernel = None  # imported by main(): --help works without torch


def import_torch() -> None:
    global torch, F, SDPBackend, sdpa_kernel
    import torch as _torch
    import torch.nn.functional as _F
    from torch.nn.attention import SDPBackend as _SDPBackend, sdpa_kernel as _sdpa_kernel

    torch, F, SDPBackend, sdpa_kernel = _torch, _F, _SDPBackend, _sdpa_kernel


# ------------------------------------------------------------------ C ABI (strideattn.h)

SA_BACKEND = {
    "cuda": sa_abi.SA_BACKEND_CUDA,
    "cudnn": sa_abi.SA_BACKEND_CUDNN,
    "auto": sa_abi.SA_BACKEND_AUTO,
}


def view_of(t) -> sa_abi.sa_tensor_view:
    """A [b, s, h, d] torch tensor (any strides) as an sa_tensor_view: its real strides."""
    assert t.dim() == 4
    return sa_abi.sa_tensor_view(
        t.data_ptr(),
        sa_abi.SA_BF16 if t.dtype == torch.bfloat16 else sa_abi.SA_F16,
        (ctypes.c_int64 * 4)(*t.shape),
        (ctypes.c_int64 * 4)(*t.stride()),
    )


def lse_of(t) -> sa_abi.sa_lse_view:
    return sa_abi.sa_lse_view(
        t.data_ptr(), (ctypes.c_int64 * 3)(*t.shape), (ctypes.c_int64 * 3)(*t.stride())
    )


class Strideattn:
    def __init__(self, path: str):
        self.lib = sa_abi.load(path)
        self.msg = ctypes.create_string_buffer(4096)

    def compiled(self, backend: str) -> bool:
        # auto is always there: it picks among the compiled backends
        return backend == "auto" or bool(self.lib.sa_backend_compiled(SA_BACKEND[backend]))

    def version(self) -> str:
        return self.lib.sa_version().decode()

    def _check(self, rc: int):
        if rc != sa_abi.SA_OK:
            raise RuntimeError(self.msg.value.decode(errors="replace"))

    def _common(self, a, backend, sh):
        a.options.mask = sa_abi.SA_MASK_CAUSAL if sh.causal else sa_abi.SA_MASK_NONE
        if sh.window >= 0:
            a.options.has_window = 1
            a.options.window_left, a.options.window_right = sh.window, 0
        a.backend = SA_BACKEND[backend]
        a.memory = sa_abi.SA_MEMORY_DEVICE
        a.stream = torch.cuda.current_stream().cuda_stream
        return a

    def forward_args(self, backend, q, k, v, o, lse, sh) -> sa_abi.sa_forward_args:
        a = sa_abi.sa_forward_args()
        a.struct_size = ctypes.sizeof(sa_abi.sa_forward_args)
        a.q, a.k, a.v, a.o = view_of(q), view_of(k), view_of(v), view_of(o)
        a.lse = lse_of(lse)
        return self._common(a, backend, sh)

    def backward_args(
        self, backend, q, k, v, o, do, lse, dq, dk, dv, sh
    ) -> sa_abi.sa_backward_args:
        a = sa_abi.sa_backward_args()
        a.struct_size = ctypes.sizeof(sa_abi.sa_backward_args)
        a.q, a.k, a.v, a.o, a.d_o = view_of(q), view_of(k), view_of(v), view_of(o), view_of(do)
        a.lse = lse_of(lse)
        a.dq, a.dk, a.dv = view_of(dq), view_of(dk), view_of(dv)
        return self._common(a, backend, sh)

    def forward(self, args: sa_abi.sa_forward_args):
        self._check(self.lib.sa_forward(ctypes.byref(args), self.msg, len(self.msg)))

    def backward(self, args: sa_abi.sa_backward_args):
        self._check(self.lib.sa_backward(ctypes.byref(args), self.msg, len(self.msg)))


# ------------------------------------------------------------------ shapes


@dataclass
class Shape:
    name: str
    b: int
    s: int
    h: int
    hg: int
    d: int
    causal: bool
    dtype: str = "bf16"  # "bf16" or "fp16"
    layout: str = "bshd"  # "bshd" (contiguous) or "seed" (split views of sb(h+2hg)d)
    window: int = -1  # with causal: each query sees itself and the `window` keys before it

    def flops_fwd(self) -> float:
        """FLOPs of the visible (query, key) pairs: QK^T and PV, 2 d each."""
        if self.window >= 0:
            w, s = min(self.window, self.s - 1), self.s
            pairs = (w + 1) * (w + 2) / 2 + (s - w - 1) * (w + 1)
        elif self.causal:
            pairs = self.s * (self.s + 1) / 2
        else:
            pairs = float(self.s) * self.s
        return 2.0 * pairs * self.b * self.h * (2 * self.d)

    def mask_name(self) -> str:
        if self.window >= 0:
            return f"causal, window {self.window}"
        return "causal" if self.causal else "none"

    def torch_dtype(self):
        return torch.float16 if self.dtype == "fp16" else torch.bfloat16


def design_shapes(quick: bool) -> list[Shape]:
    tokens = 16 * 1024
    shapes: list[Shape] = []
    seqs = [4096] if quick else [1024, 2048, 4096, 8192, 16384]
    dims = [64, 128] if quick else [64, 128, 256]
    for d in dims:
        for s in seqs:
            for causal in (False, True):
                h = 2048 // d
                shapes.append(Shape(f"mha d{d} s{s // 1024}k", tokens // s, s, h, h, d, causal))
    gqa_seqs = [8192] if quick else [2048, 4096, 8192, 16384, 32768]
    for s in gqa_seqs:
        shapes.append(Shape(f"gqa 64/8 s{s // 1024}k", max(1, tokens // s), s, 64, 8, 128, True))
    # The seed case (MQA 16/1, d 64, fp16, causal): split views of one fused [s, b, h+2hg, d]
    # buffer, beside the same problem with contiguous inputs.
    for layout in ("seed", "bshd"):
        shapes.append(
            Shape(
                f"seed {'strided' if layout == 'seed' else 'contiguous'}",
                8,
                2048,
                16,
                1,
                64,
                True,
                "fp16",
                layout,
            )
        )
    # Sliding windows (b 2, s 16k, h 16, d 128, causal): where the backends differ most (the
    # window's share of the keys sets the work; SDPA has no window, so no peer column).
    for w in (1024, 256):
        shapes.append(Shape(f"swa w{w} s16k", 2, 16384, 16, 16, 128, True, window=w))
    return shapes


def make_inputs(sh: Shape):
    """q, k, v as [b, s, h, d] torch views with the shape's real memory layout."""
    dev, dt = "cuda", sh.torch_dtype()
    if sh.layout == "seed":
        fused = torch.randn(sh.s, sh.b, sh.h + 2 * sh.hg, sh.d, device=dev, dtype=dt)
        q, k, v = fused.split([sh.h, sh.hg, sh.hg], dim=2)  # [s, b, ., d] views
        return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    q = torch.randn(sh.b, sh.s, sh.h, sh.d, device=dev, dtype=dt)
    k = torch.randn(sh.b, sh.s, sh.hg, sh.d, device=dev, dtype=dt)
    v = torch.randn(sh.b, sh.s, sh.hg, sh.d, device=dev, dtype=dt)
    return q, k, v


def sdpa_fns(sh: Shape, q, k, v, backend):
    if sh.window >= 0:
        raise NotImplementedError("SDPA has no sliding window (only a dense float mask)")
    # SDPA wants [b, h, s, d]: transposed views of the same memory, no copy.
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
    gqa = sh.hg != sh.h
    do = torch.randn_like(qt)

    def fwd():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=sh.causal, enable_gqa=gqa)

    def fwd_bwd():  # autograd.grad: no accumulation kernel into .grad
        out = fwd()
        torch.autograd.grad(out, (qt, kt, vt), do)

    return fwd, fwd_bwd


def ours_fns(sa: Strideattn, backend: str, sh: Shape, q, k, v):
    o = torch.empty(sh.b, sh.s, sh.h, sh.d, device="cuda", dtype=sh.torch_dtype())
    lse = torch.empty(sh.b, sh.h, sh.s, device="cuda", dtype=torch.float32)
    do = torch.randn_like(o)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fa = sa.forward_args(backend, q, k, v, o, lse, sh)
    ba = sa.backward_args(backend, q, k, v, o, do, lse, dq, dk, dv, sh)

    def fwd():
        sa.forward(fa)

    def fwd_bwd():
        sa.forward(fa)
        sa.backward(ba)

    return fwd, fwd_bwd


def user_fns(backend: str, sh: Shape, q, k, v):
    """DotProductAttention with autograd on leaves that are the same views (same strides)
    as q, k, v: the seed's sbhd split views as sbhd, contiguous ones as bshd."""
    import strideattn.torch as sat

    seed = sh.layout == "seed"
    fmt = "sbhd" if seed else "bshd"
    lq, lk, lv = (
        (x.transpose(0, 1) if seed else x).detach().requires_grad_(True) for x in (q, k, v)
    )
    extra = {"window_size": (sh.window, 0)} if sh.window >= 0 else {}
    mod = sat.DotProductAttention(
        sh.h, sh.d, num_gqa_groups=sh.hg, qkv_format=fmt,
        attn_mask_type="causal" if sh.causal else "no_mask", backend=backend, **extra,
    )  # fmt: skip
    do = torch.randn(*lq.shape[:2], sh.h * sh.d, device="cuda", dtype=sh.torch_dtype())

    def fwd():
        return mod(lq, lk, lv)

    def fwd_bwd():  # autograd.grad: no accumulation kernel into .grad, as for SDPA
        torch.autograd.grad(fwd(), (lq, lk, lv), do)

    return fwd, fwd_bwd


COLUMNS = ["sdpa-flash", "sdpa-cudnn", "cuda", "cudnn"]


@dataclass
class Row:
    shape: Shape
    tflops: dict = field(default_factory=dict)  # (column, mode) -> TFLOP/s or error string


def round_order(columns: list[str], r: int) -> list[str]:
    """The columns in round r's order, row r of a Williams design: over a whole design each
    column runs right after every other one equally often (with a fixed or only rotated order,
    a column that always ran right after the same one measured 0.9x of the same kernel run
    elsewhere: the GPU's state, heat, clocks and caches, carries over between columns)."""
    return in_round_order(columns, r)


def run_shape(
    sh: Shape,
    sa: Strideattn | None,
    backends: list[str],
    runs: int,
    warmup: int,
    modes: list[str],
    user_backends: list[str] = (),
    rounds: int = 1,
    round_warmup: int | None = None,
) -> Row:
    """One shape's row: every column's functions made, then `runs` timed calls per column and
    mode in `rounds` interleaved rounds (round_order), `warmup` untimed calls before a column's
    first round and `round_warmup` (default: warmup) before each later one."""
    row = Row(sh)
    torch.manual_seed(0)
    q, k, v = make_inputs(sh)
    flops = {"fwd": sh.flops_fwd(), "fwd+bwd": sh.flops_fwd() * 3.5}
    impls = {}
    impls["sdpa-flash"] = lambda: sdpa_fns(sh, q, k, v, SDPBackend.FLASH_ATTENTION)
    impls["sdpa-cudnn"] = lambda: sdpa_fns(sh, q, k, v, SDPBackend.CUDNN_ATTENTION)
    for be in backends:
        impls[be] = lambda be=be: ours_fns(sa, be, sh, q, k, v)
    for be in user_backends:
        impls[f"torch-{be}"] = lambda be=be: user_fns(be, sh, q, k, v)
    # every column's functions first (their buffers live together), then the runs in rounds
    fns = {}
    for col, make in impls.items():
        try:
            fns[col] = make()
        except Exception as e:  # noqa: BLE001 - report, keep going
            for m in modes:
                row.tflops[(col, m)] = f"error: {str(e).splitlines()[0][:80]}"
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        per = runs // rounds + (1 if r < runs % rounds else 0)
        for col in round_order(list(fns), r):
            fwd, fwd_bwd = fns[col]
            for m in modes:
                if isinstance(row.tflops.get((col, m)), str):
                    continue
                w = warmup if r == 0 or round_warmup is None else round_warmup
                try:
                    times.setdefault((col, m), []).extend(
                        event_times(fwd if m == "fwd" else fwd_bwd, per, w)
                    )
                except Exception as e:  # noqa: BLE001
                    row.tflops[(col, m)] = "n/a: " + str(e).splitlines()[0][:100]
            torch.cuda.synchronize()
    for (col, m), ts in times.items():
        if not isinstance(row.tflops.get((col, m)), str):
            row.tflops[(col, m)] = flops[m] / (statistics.median(ts) * 1e-3) / 1e12
    return row


def data_rows(
    rows: list[Row], backends: list[str], modes: list[str], user_backends: list[str] = ()
) -> list[dict]:
    """The measured rows in the data file's form (bench/render.py): one per shape and mode,
    every table column (TFLOP/s of each column, each ratio) and why a column has no number.
    User-path columns torch-<be> add the ratios torch-<be>/<be> (over the C ABI's same
    backend), torch-<be>/flash and torch-<be>/sdpa-cudnn."""
    out = []
    users = [f"torch-{be}" for be in user_backends]
    for r in rows:
        sh = r.shape
        for m in modes:
            tflops, ratios, missing = {}, {}, {}
            for col in COLUMNS[:2] + backends + users:
                val = r.tflops.get((col, m))
                tflops[col] = val if isinstance(val, float) else None
                if isinstance(val, str):
                    missing[col] = val
            for be in backends:
                for peer, key in (
                    ("sdpa-flash", f"{be}/flash"),
                    ("sdpa-cudnn", f"{be}/sdpa-cudnn"),
                ):
                    a, b = tflops[be], tflops[peer]
                    ratios[key] = a / b if a is not None and b else None
            if "auto" in backends:
                best = [tflops[be] for be in ("cuda", "cudnn") if tflops.get(be) is not None]
                a = tflops["auto"]
                ratios["auto/best"] = a / max(best) if a is not None and best else None
            for be, col in zip(user_backends, users):
                peers = [("sdpa-flash", "flash"), ("sdpa-cudnn", "sdpa-cudnn")]
                if be in backends:
                    peers.append((be, be))
                for peer, name in peers:
                    a, b = tflops[col], tflops[peer]
                    ratios[f"{col}/{name}"] = a / b if a is not None and b else None
            out.append(
                {
                    "shape": sh.name,
                    "b": sh.b,
                    "h": sh.h,
                    "hg": sh.hg,
                    "s": sh.s,
                    "d": sh.d,
                    "mask": sh.mask_name(),
                    "dtype": sh.dtype,
                    "layout": sh.layout,
                    "mode": m,
                    "tflops": tflops,
                    "ratios": ratios,
                    "not_measured": missing,
                }
            )
    return out


def git_commit() -> str:
    # An explicit STRIDEATTN_COMMIT wins: a copied tree may carry a stale .git (the GPU
    # machine's copy of a work tree reported the checkout's first commit).
    if os.environ.get("STRIDEATTN_COMMIT"):
        return os.environ["STRIDEATTN_COMMIT"]
    try:
        return subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except Exception:  # noqa: BLE001 - the GPU machine may have no git metadata
        return "unknown"


def data_file_name(date: str, gpu: str, commit: str) -> str:
    """<date>-<gpu>-<commit>.json with the GPU name as a lower-case slug."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "gpu"
    return f"{date}-{slug}-{re.sub(r'[^A-Za-z0-9]+', '-', commit)}.json"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--lib",
        default=os.path.join(REPO, "build-gpu/src/libstrideattn_c.so"),
        help="libstrideattn_c.so (C ABI)",
    )
    ap.add_argument("--strideattn", help="path of the CLI (accepted for scripts/gpu-check; unused)")
    ap.add_argument("--quick", action="store_true", help="a subset that runs in a few minutes")
    ap.add_argument(
        "--only",
        help="only the shapes whose name contains this, or one of these comma-separated parts "
        "(e.g. 'd256', 'seed', 's16k,s32k')",
    )
    ap.add_argument(
        "--backends",
        default="cuda,cudnn,auto",
        help="strideattn backends to time through the C ABI; auto also gets auto/best, its "
        "speed over the faster of cuda and cudnn in the same run",
    )
    ap.add_argument("--runs", type=int, default=20, help="timed runs per measurement (>= 20)")
    ap.add_argument(
        "--warmup", type=int, default=5, help="untimed calls before a column's first round"
    )
    ap.add_argument(
        "--round-warmup", type=int, default=2, help="untimed calls before each later round"
    )
    ap.add_argument(
        "--rounds",
        type=int,
        help="interleaved rounds a shape's runs are split into (each visits every column; "
        "default: the length of a balanced order, the number of columns, twice that if odd)",
    )
    ap.add_argument("--fwd-only", action="store_true")
    ap.add_argument(
        "--user-backends",
        default="auto,cuda,cudnn",
        help="backends of the user-path columns (DotProductAttention with autograd); 'none'",
    )
    ap.add_argument("--out", help="write the table (markdown) here")
    ap.add_argument(
        "--results-dir",
        default=os.path.join(BENCH, "results"),
        help="where the run's data file goes (default bench/results)",
    )
    ap.add_argument(
        "--append-results",
        action="store_true",
        help="also re-render the summary in bench/README.md from bench/results",
    )
    args = ap.parse_args(argv)
    if args.runs < 20:
        ap.error("--runs must be >= 20 (the protocol of docs/design.md)")
    if args.warmup < 0 or args.round_warmup < 0:
        ap.error("--warmup and --round-warmup must be >= 0")
    if args.rounds is not None and not 1 <= args.rounds <= args.runs:
        ap.error(f"--rounds {args.rounds}: must be between 1 and --runs ({args.runs})")
    shapes = [
        sh
        for sh in design_shapes(args.quick and not args.only)
        if not args.only or any(part and part in sh.name for part in args.only.split(","))
    ]
    if not shapes:
        names = sorted({sh.name for sh in design_shapes(False)})
        ap.error(f"--only {args.only!r} matches no shape; the names: {', '.join(names)}")
    return args, shapes


def run_data(args, argv, sa, gpu, date, commit, backends, user_backends, modes, rows) -> dict:
    """The data file's content (format render.FORMAT) for the rows measured so far."""
    return {
        "format": render.FORMAT,
        "date": date,
        # (UTC: render.py orders one day's runs by it)
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S"),
        "commit": commit,
        "gpu": gpu,
        "command": "python3 bench/compare_sdpa.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "versions": {
            "torch": torch.__version__,
            "cudnn": str(torch.backends.cudnn.version()),
            "cuda": torch.version.cuda,
            "strideattn": sa.version() if sa else None,
            "python": sys.version.split()[0],
        },
        "protocol": {
            "runs": args.runs,
            "warmup": args.warmup,
            "round_warmup": args.round_warmup,
            "rounds": args.rounds,
            "order": "Williams design (each column right after each other equally often)",
            "timer": "CUDA events",
            "flops": "FLOPs of docs/design.md; fwd+bwd counts 3.5x forward FLOPs",
        },
        "backends": backends,
        "user_backends": user_backends,
        "modes": modes,
        "rows": data_rows(rows, backends, modes, user_backends),
    }


def main(argv=None) -> int:
    args, shapes = parse_args(argv)
    try:
        import_torch()
    except ImportError as e:
        print(f"compare_sdpa: PyTorch is not installed ({e}); nothing to measure", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("compare_sdpa: no CUDA device", file=sys.stderr)
        return 2

    sa = None
    backends = []
    try:
        sa = Strideattn(args.lib)
        for be in args.backends.split(","):
            be = be.strip()
            if be and sa.compiled(be):
                backends.append(be)
            elif be:
                print(f"compare_sdpa: backend {be} not compiled into {args.lib}", file=sys.stderr)
    except OSError as e:
        print(f"compare_sdpa: cannot load {args.lib}: {e}; timing SDPA only", file=sys.stderr)

    user_backends = [
        be.strip() for be in args.user_backends.split(",") if be.strip() not in ("", "none")
    ]
    if user_backends:
        try:
            import strideattn.torch  # noqa: F401
        except ImportError as e:
            print(f"compare_sdpa: no user-path columns: strideattn.torch: {e}", file=sys.stderr)
            user_backends = []
    modes = ["fwd"] if args.fwd_only else ["fwd", "fwd+bwd"]
    rows = []
    users = [f"torch-{be}" for be in user_backends]
    if args.rounds is None:  # a balanced order over every column (capped by the runs)
        args.rounds = min(args.runs, balanced_rounds(len(COLUMNS[:2] + backends + users)))
    gpu = torch.cuda.get_device_name()
    date, commit = datetime.date.today().isoformat(), git_commit()
    os.makedirs(args.results_dir, exist_ok=True)
    path = os.path.join(args.results_dir, data_file_name(date, gpu, commit))
    for sh in shapes:
        row = run_shape(
            sh, sa, backends, args.runs, args.warmup, modes, user_backends, args.rounds,
            args.round_warmup,
        )  # fmt: skip
        rows.append(row)
        summary = ", ".join(
            f"{c} {render.fmt(row.tflops.get((c, m)))}"
            for m in modes
            for c in COLUMNS[:2] + backends + users
        )
        print(f"{sh.name} {sh.mask_name()}: {summary}", flush=True)
        # the data file after every shape: a run cut short still leaves the rows it measured
        # (render.py takes each row from the newest file that has it)
        with open(path, "w") as f:
            f.write(
                render.dumps(
                    run_data(
                        args, argv, sa, gpu, date, commit, backends, user_backends, modes, rows
                    )
                )
            )

    data = run_data(args, argv, sa, gpu, date, commit, backends, user_backends, modes, rows)
    header = render.header(data)
    text = render.table(data["rows"], backends)
    if user_backends:
        text += "\n\nUser path (DotProductAttention with autograd):\n\n"
        text += render.user_table(data["rows"], user_backends, backends)
    print()
    print(header)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(header + "\n\n" + text + "\n")
    with open(path, "w") as f:
        f.write(render.dumps(data))
    print(f"\ncompare_sdpa: data file {path}")
    if args.append_results:
        with open(render.README) as f:
            readme = f.read()
        with open(render.README, "w") as f:
            f.write(render.render_readme(readme, render.RESULTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
