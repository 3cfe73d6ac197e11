#!/usr/bin/env python3
"""strideattn against PyTorch SDPA, in one process, on the same tensors.

Runs PyTorch SDPA with its flash and cuDNN backends (torch.nn.attention.sdpa_kernel) and
strideattn's cuda and cudnn backends (libstrideattn_c.so through ctypes, called with the torch
tensors' data pointers and real strides on torch's current stream) on DESIGN.md's shapes, and
prints TFLOP/s and the ratios ours / SDPA flash and ours / SDPA cudnn.

Protocol (DESIGN.md): CUDA events around each run, warm-up first, the median of >= 20 runs;
fwd+bwd times the forward and the whole backward (every kernel); FLOPs: forward
2 * visible_pairs * (d_qk + d_v) summed over batch and query heads, backward 2.5x forward;
bf16 unless a row says otherwise.

  python3 bench/compare_sdpa.py [--quick | --only NAME-PART] [--out bench.md] [--append-results]
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import math
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ------------------------------------------------------------------ C ABI (strideattn.h)

SA_F16, SA_BF16 = 0, 1
SA_MASK_NONE, SA_MASK_CAUSAL = 0, 1
SA_BACKEND = {"cuda": 3, "cudnn": 4}
SA_MEMORY_DEVICE = 1


class TensorView(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4), ("stride", ctypes.c_int64 * 4)]


class LseView(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("shape", ctypes.c_int64 * 3),
                ("stride", ctypes.c_int64 * 3)]


class Varlen(ctypes.Structure):
    _fields_ = [("count", ctypes.c_int64), ("seqlens_q", ctypes.c_void_p),
                ("seqlens_kv", ctypes.c_void_p), ("offsets_q", ctypes.c_void_p),
                ("offsets_kv", ctypes.c_void_p)]


class Options(ctypes.Structure):
    _fields_ = [("mask", ctypes.c_int32), ("has_window", ctypes.c_int32),
                ("window_left", ctypes.c_int64), ("window_right", ctypes.c_int64),
                ("scale", ctypes.c_double), ("deterministic", ctypes.c_int32)]


class ForwardArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("q", TensorView), ("k", TensorView),
                ("v", TensorView), ("o", TensorView), ("lse", LseView), ("options", Options),
                ("varlen", Varlen), ("backend", ctypes.c_int32), ("memory", ctypes.c_int32),
                ("stream", ctypes.c_void_p), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", ctypes.c_size_t)]


class BackwardArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("q", TensorView), ("k", TensorView),
                ("v", TensorView), ("o", TensorView), ("d_o", TensorView), ("lse", LseView),
                ("dq", TensorView), ("dk", TensorView), ("dv", TensorView),
                ("options", Options), ("varlen", Varlen), ("backend", ctypes.c_int32),
                ("memory", ctypes.c_int32), ("stream", ctypes.c_void_p),
                ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t)]


def view_of(t: torch.Tensor) -> TensorView:
    """A [b, s, h, d] torch tensor (any strides) as an sa_tensor_view: its real strides."""
    assert t.dim() == 4
    return TensorView(t.data_ptr(), SA_BF16 if t.dtype == torch.bfloat16 else SA_F16,
                      (ctypes.c_int64 * 4)(*t.shape), (ctypes.c_int64 * 4)(*t.stride()))


def lse_of(t: torch.Tensor) -> LseView:
    return LseView(t.data_ptr(), (ctypes.c_int64 * 3)(*t.shape), (ctypes.c_int64 * 3)(*t.stride()))


class Strideattn:
    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        for fn, argt in (("sa_forward", ForwardArgs), ("sa_backward", BackwardArgs)):
            f = getattr(self.lib, fn)
            f.argtypes = [ctypes.POINTER(argt), ctypes.c_char_p, ctypes.c_size_t]
            f.restype = ctypes.c_int
        self.lib.sa_backend_compiled.argtypes = [ctypes.c_int32]
        self.lib.sa_backend_compiled.restype = ctypes.c_int
        self.msg = ctypes.create_string_buffer(4096)

    def compiled(self, backend: str) -> bool:
        return bool(self.lib.sa_backend_compiled(SA_BACKEND[backend]))

    def _check(self, rc: int):
        if rc != 0:
            raise RuntimeError(self.msg.value.decode(errors="replace"))

    def forward_args(self, backend, q, k, v, o, lse, causal) -> ForwardArgs:
        a = ForwardArgs()
        a.struct_size = ctypes.sizeof(ForwardArgs)
        a.q, a.k, a.v, a.o = view_of(q), view_of(k), view_of(v), view_of(o)
        a.lse = lse_of(lse)
        a.options.mask = SA_MASK_CAUSAL if causal else SA_MASK_NONE
        a.backend = SA_BACKEND[backend]
        a.memory = SA_MEMORY_DEVICE
        a.stream = torch.cuda.current_stream().cuda_stream
        return a

    def backward_args(self, backend, q, k, v, o, do, lse, dq, dk, dv, causal) -> BackwardArgs:
        a = BackwardArgs()
        a.struct_size = ctypes.sizeof(BackwardArgs)
        a.q, a.k, a.v, a.o, a.d_o = view_of(q), view_of(k), view_of(v), view_of(o), view_of(do)
        a.lse = lse_of(lse)
        a.dq, a.dk, a.dv = view_of(dq), view_of(dk), view_of(dv)
        a.options.mask = SA_MASK_CAUSAL if causal else SA_MASK_NONE
        a.backend = SA_BACKEND[backend]
        a.memory = SA_MEMORY_DEVICE
        a.stream = torch.cuda.current_stream().cuda_stream
        return a

    def forward(self, args: ForwardArgs):
        self._check(self.lib.sa_forward(ctypes.byref(args), self.msg, len(self.msg)))

    def backward(self, args: BackwardArgs):
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
    dtype: torch.dtype = torch.bfloat16
    layout: str = "bshd"  # "bshd" (contiguous) or "seed" (split views of sb(h+2hg)d)

    def flops_fwd(self) -> float:
        pairs = self.s * (self.s + 1) / 2 if self.causal else float(self.s) * self.s
        return 2.0 * pairs * self.b * self.h * (2 * self.d)


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
        shapes.append(Shape(f"seed {'strided' if layout == 'seed' else 'contiguous'}", 8, 2048,
                            16, 1, 64, True, torch.float16, layout))
    return shapes


def make_inputs(sh: Shape):
    """q, k, v as [b, s, h, d] torch views with the shape's real memory layout."""
    dev = "cuda"
    if sh.layout == "seed":
        fused = torch.randn(sh.s, sh.b, sh.h + 2 * sh.hg, sh.d, device=dev, dtype=sh.dtype)
        q, k, v = fused.split([sh.h, sh.hg, sh.hg], dim=2)  # [s, b, ., d] views
        return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    q = torch.randn(sh.b, sh.s, sh.h, sh.d, device=dev, dtype=sh.dtype)
    k = torch.randn(sh.b, sh.s, sh.hg, sh.d, device=dev, dtype=sh.dtype)
    v = torch.randn(sh.b, sh.s, sh.hg, sh.d, device=dev, dtype=sh.dtype)
    return q, k, v


# ------------------------------------------------------------------ timing

def time_ms(fn, runs: int, warmup: int) -> float:
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
    return statistics.median(times)


def sdpa_fns(sh: Shape, q, k, v, backend):
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
    o = torch.empty(sh.b, sh.s, sh.h, sh.d, device="cuda", dtype=sh.dtype)
    lse = torch.empty(sh.b, sh.h, sh.s, device="cuda", dtype=torch.float32)
    do = torch.randn_like(o)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fa = sa.forward_args(backend, q, k, v, o, lse, sh.causal)
    ba = sa.backward_args(backend, q, k, v, o, do, lse, dq, dk, dv, sh.causal)

    def fwd():
        sa.forward(fa)

    def fwd_bwd():
        sa.forward(fa)
        sa.backward(ba)

    return fwd, fwd_bwd


COLUMNS = ["sdpa-flash", "sdpa-cudnn", "cuda", "cudnn"]


@dataclass
class Row:
    shape: Shape
    tflops: dict = field(default_factory=dict)  # (column, mode) -> TFLOP/s or error string


def run_shape(sh: Shape, sa: Strideattn | None, backends: list[str], runs: int, warmup: int,
              modes: list[str]) -> Row:
    row = Row(sh)
    torch.manual_seed(0)
    q, k, v = make_inputs(sh)
    flops = {"fwd": sh.flops_fwd(), "fwd+bwd": sh.flops_fwd() * 3.5}
    impls = {}
    impls["sdpa-flash"] = lambda: sdpa_fns(sh, q, k, v, SDPBackend.FLASH_ATTENTION)
    impls["sdpa-cudnn"] = lambda: sdpa_fns(sh, q, k, v, SDPBackend.CUDNN_ATTENTION)
    for be in backends:
        impls[be] = (lambda be=be: ours_fns(sa, be, sh, q, k, v))
    for col, make in impls.items():
        try:
            fwd, fwd_bwd = make()
        except Exception as e:  # noqa: BLE001 - report, keep going
            for m in modes:
                row.tflops[(col, m)] = f"error: {str(e).splitlines()[0][:80]}"
            continue
        for m in modes:
            try:
                ms = time_ms(fwd if m == "fwd" else fwd_bwd, runs, warmup)
                row.tflops[(col, m)] = flops[m] / (ms * 1e-3) / 1e12
            except Exception as e:  # noqa: BLE001
                row.tflops[(col, m)] = "n/a: " + str(e).splitlines()[0][:100]
        torch.cuda.synchronize()
    return row


def fmt(x) -> str:
    return f"{x:.0f}" if isinstance(x, float) else "—"


def ratio(a, b) -> str:
    return f"{a / b:.2f}" if isinstance(a, float) and isinstance(b, float) and b > 0 else "—"


def table(rows: list[Row], backends: list[str], modes: list[str]) -> str:
    head = ["shape (b, h/hg, s, d)", "mask", "dtype", "mode", "SDPA flash", "SDPA cuDNN"]
    for be in backends:
        head += [f"ours {be}", f"{be}/flash", f"{be}/sdpa-cudnn"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    notes = []
    for r in rows:
        sh = r.shape
        hh = f"{sh.h}" if sh.h == sh.hg else f"{sh.h}/{sh.hg}"
        for m in modes:
            fl, cu = r.tflops.get(("sdpa-flash", m)), r.tflops.get(("sdpa-cudnn", m))
            cells = [f"{sh.name}: {sh.b}, {hh}, {sh.s}, {sh.d}", "causal" if sh.causal else "none",
                     "fp16" if sh.dtype == torch.float16 else "bf16", m, fmt(fl), fmt(cu)]
            for be in backends:
                ours = r.tflops.get((be, m))
                cells += [fmt(ours), ratio(ours, fl), ratio(ours, cu)]
            lines.append("| " + " | ".join(cells) + " |")
            for col in COLUMNS:
                val = r.tflops.get((col, m))
                if isinstance(val, str):
                    notes.append(f"- {sh.name} {m} {col}: {val}")
    out = "\n".join(lines)
    if notes:
        out += "\n\nNot measured:\n" + "\n".join(sorted(set(notes)))
    return out


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001 - the GPU machine may have no git metadata
        return os.environ.get("STRIDEATTN_COMMIT", "unknown")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.path.join(REPO, "build-gpu/src/libstrideattn_c.so"),
                    help="libstrideattn_c.so (C ABI)")
    ap.add_argument("--strideattn", help="path of the CLI (accepted for scripts/gpu-check; unused)")
    ap.add_argument("--quick", action="store_true", help="a subset that runs in a few minutes")
    ap.add_argument("--only", help="only the shapes whose name contains this (e.g. 'd256', 'seed')")
    ap.add_argument("--backends", default="cuda,cudnn", help="strideattn backends to time")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per measurement (>= 20)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--fwd-only", action="store_true")
    ap.add_argument("--out", help="write the table (markdown) here")
    ap.add_argument("--append-results", action="store_true",
                    help="append date, commit, GPU, command and table to bench/RESULTS.md")
    args = ap.parse_args()
    if args.runs < 20:
        ap.error("--runs must be >= 20 (DESIGN's protocol)")
    shapes = [sh for sh in design_shapes(args.quick and not args.only) if not args.only or args.only in sh.name]
    if not shapes:
        names = sorted({sh.name for sh in design_shapes(False)})
        ap.error(f"--only {args.only!r} matches no shape; the names: {', '.join(names)}")
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

    modes = ["fwd"] if args.fwd_only else ["fwd", "fwd+bwd"]
    rows = []
    for sh in shapes:
        row = run_shape(sh, sa, backends, args.runs, args.warmup, modes)
        rows.append(row)
        summary = ", ".join(f"{c} {m} {fmt(row.tflops.get((c, m)))}"
                            for m in modes for c in COLUMNS[:2] + backends)
        print(f"{sh.name} {'causal' if sh.causal else 'none'}: {summary}", flush=True)

    gpu = torch.cuda.get_device_name()
    text = table(rows, backends, modes)
    header = (f"GPU {gpu}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
              f"TFLOP/s (DESIGN FLOPs; fwd+bwd counts 3.5x forward FLOPs), median of "
              f"{args.runs} runs after {args.warmup} warm-ups, CUDA events")
    print()
    print(header)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(header + "\n\n" + text + "\n")
    if args.append_results:
        cmd = "python3 bench/compare_sdpa.py " + " ".join(sys.argv[1:])
        with open(os.path.join(REPO, "bench/RESULTS.md"), "a") as f:
            f.write(f"\n## {datetime.date.today().isoformat()} — commit {git_commit()} — {gpu}\n\n"
                    f"`{cmd}`\n\n{header}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
