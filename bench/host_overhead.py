#!/usr/bin/env python3
"""Host time per call of the PyTorch user path: strideattn against PyTorch SDPA on a problem
so small that the device time is negligible, so what is measured is what Python, the
bindings, the library and the launches cost on the host.

Columns (each with autograd recording, inputs that require grad, as in training):
  sdpa[-flash|-cudnn]  torch.nn.functional.scaled_dot_product_attention on [b, h, s, d] views
                       (on a GPU its flash and cuDNN backends, chosen once around the loop)
  op <be>              strideattn.torch.attention(q, k, v, mask=..., backend=be)
  module <be>          strideattn.torch.DotProductAttention (qkv_format bshd) with backend=be
  ext <be>             the extension call alone (strideattn._ext.forward / .backward with the
                       outputs made beforehand): the binding and the library without the
                       torch layer, tensors through DLPack and options parsed per call
  plan <be>            the extension's plans (made once) run with integer addresses, outputs
                       and workspace made beforehand: the floor under the eager path, which
                       runs cached plans this way (strideattn/_torch_call.py)
  fn <be>              the least an autograd.Function around those plans does per call: the
                       outputs, gradients and workspace allocated per call as the eager path
                       allocates them, q, k, v, O, LSE saved, no argument handling or cache
                       lookup: the floor of strideattn's Python autograd path (op, module)
Modes: fwd (one forward call), fwd+bwd (forward, then torch.autograd.grad of the output
with a fixed upstream gradient; for ext, the forward and backward calls).

Timing: each (column, mode) runs --calls calls per repeat, the repeats interleaved across
columns (a shared machine drifts), each repeat in the next order of a Williams design (no
measurement always right after the same one: what one leaves in the caching allocator and
the CPU's caches falls on the next), and the median over --repeats is reported in
microseconds per call. On a GPU, "enqueue" is the time to issue the calls without waiting
(one synchronize after the loop, not counted) and "synced" the time per call with
torch.cuda.synchronize() after each; on the CPU every call is synchronous: "wall" is the
elapsed time and "cpu" the CPU time of the calling thread (what the host work costs,
steadier than the wall time where other processes share the cores).

Writes one data file, RESULTS_DIR/host/<date>-<machine>-<commit>.json (bench/render.py
renders the newest per machine into bench/README.md), unless --no-write. --profile N prints
a cProfile of N calls of the first `op` column's fwd+bwd (where the Python time goes;
--profile-column picks another column by name, e.g. "module auto"); --trace FILE writes a
torch.profiler Chrome trace of a few of those calls.

  python3 bench/host_overhead.py [--device cpu|cuda] [--shape B,S,H,D] [--dtype bf16|fp16]
                                 [--mask none|causal] [--backends auto,cuda,cudnn]
                                 [--calls N] [--repeats R] [--results-dir DIR] [--no-write]
                                 [--profile N] [--profile-column NAME] [--trace FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import render  # noqa: E402  (bench/render.py: the data file form, the host table)
from compare_sdpa import data_file_name, git_commit  # noqa: E402
from timing import in_round_order  # noqa: E402  (bench/timing.py: the rounds' orders)

torch = None  # imported by main(): --help works without torch

# The tiny problem of each device: on a GPU [1, 128, 4, 64] (microseconds of device work);
# on the CPU the kernels themselves would take as long as the host work around them at that
# size, so a smaller one keeps the measurement about the host path.
DEFAULT_SHAPE = {"cuda": (1, 128, 4, 64), "cpu": (1, 8, 1, 16)}
DEFAULT_BACKENDS = {"cuda": "auto,cuda,cudnn", "cpu": "auto,cpu"}
FORMAT = "strideattn-host/1"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when present")
    ap.add_argument("--shape", help="B,S,H,D (default: 1,128,4,64 on cuda, 1,8,1,16 on cpu)")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--mask", choices=("none", "causal"), default="none")
    ap.add_argument("--backends", help="strideattn backends (default auto,cuda,cudnn / auto,cpu)")
    ap.add_argument("--layers", default="ext,plan,fn,op,module", help="strideattn columns to time")
    ap.add_argument("--calls", type=int, default=500, help="calls per repeat")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--results-dir", default=os.path.join(BENCH, "results"))
    ap.add_argument("--no-write", action="store_true", help="print only, write no data file")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile N calls")
    ap.add_argument(
        "--profile-column", metavar="NAME", help="the column to profile (default: first op)"
    )
    ap.add_argument("--trace", metavar="FILE", help="torch.profiler Chrome trace")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.repeats < 1:
        ap.error("--calls and --repeats must be >= 1")
    if args.shape is not None:
        try:
            shape = tuple(int(x) for x in args.shape.split(","))
        except ValueError:
            shape = ()
        if len(shape) != 4 or min(shape) < 1:
            ap.error(f"--shape {args.shape!r}: four positive integers B,S,H,D")
        args.shape = shape
    layers = [x.strip() for x in args.layers.split(",") if x.strip()]
    bad = [x for x in layers if x not in ("ext", "plan", "fn", "op", "module")]
    if bad:
        ap.error(f"--layers: unknown {', '.join(bad)}; supported: ext, plan, fn, op, module")
    args.layers = layers
    return args


# ------------------------------------------------------------------ the columns


class Column:
    """One way of calling attention: fwd() and fwd_bwd() closures over fixed tensors, and
    the context the timing loop runs in (SDPA's backend choice)."""

    def __init__(self, name, layer, backend, fwd, fwd_bwd, context=contextlib.nullcontext):
        self.name, self.layer, self.backend = name, layer, backend
        self.fwd, self.fwd_bwd, self.context = fwd, fwd_bwd, context


def sdpa_columns(q, k, v, do, causal, device):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
    dot = do.transpose(1, 2)
    gqa = qt.shape[1] != kt.shape[1]

    def fwd():
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)

    def fwd_bwd():
        torch.autograd.grad(fwd(), (qt, kt, vt), dot)

    if device == "cpu":
        return [Column("sdpa", "sdpa", "default", fwd, fwd_bwd)]
    return [
        Column("sdpa-flash", "sdpa", "flash", fwd, fwd_bwd,
               lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
        Column("sdpa-cudnn", "sdpa", "cudnn", fwd, fwd_bwd,
               lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)),
    ]  # fmt: skip


def op_column(q, k, v, do, mask, backend):
    import strideattn.torch as sat

    def fwd():
        return sat.attention(q, k, v, mask=mask, backend=backend)

    def fwd_bwd():
        torch.autograd.grad(fwd(), (q, k, v), do)

    return Column(f"op {backend}", "op", backend, fwd, fwd_bwd)


def module_column(q, k, v, do, mask, backend):
    import strideattn.torch as sat

    h, hg, d = q.shape[2], k.shape[2], q.shape[3]
    te_mask = "no_mask" if mask == "none" else mask
    mod = sat.DotProductAttention(
        h, d, num_gqa_groups=hg, qkv_format="bshd", attn_mask_type=te_mask, backend=backend
    )
    do2 = do.reshape(do.shape[0], do.shape[1], -1)

    def fwd():
        return mod(q, k, v)

    def fwd_bwd():
        torch.autograd.grad(fwd(), (q, k, v), do2)

    return Column(f"module {backend}", "module", backend, fwd, fwd_bwd)


def ext_column(q, k, v, do, mask, backend):
    """The binding alone, called as the torch layer calls it, outputs made beforehand."""
    from strideattn import _ext

    qd, kd, vd = (x.detach() for x in (q, k, v))
    out = torch.empty_like(qd)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
    scale = q.shape[-1] ** -0.5
    cap = torch.utils.dlpack.to_dlpack
    cuda = q.device.type == "cuda"

    def stream():
        return torch.cuda.current_stream().cuda_stream if cuda else 0

    def check(result):
        if result[0] != "ok":
            raise RuntimeError(f"ext {backend}: {result[1]}")

    def fwd():
        check(
            _ext.forward(cap(qd), cap(kd), cap(vd), cap(out), cap(lse),
                         mask=mask, scale=scale, backend=backend, stream=stream())
        )  # fmt: skip

    def fwd_bwd():
        fwd()
        check(
            _ext.backward(cap(qd), cap(kd), cap(vd), cap(out), cap(do), cap(lse), cap(dq),
                          cap(dk), cap(dv), mask=mask, scale=scale, backend=backend,
                          stream=stream())
        )  # fmt: skip

    return Column(f"ext {backend}", "ext", backend, fwd, fwd_bwd)


def make_plans(q, k, v, do, mask, backend, label):
    """The extension's forward and backward plans of the problem (made once, as the eager
    path makes them) and the tensors they were made with: (q, k, v, O, LSE, dQ, dK, dV)."""
    from strideattn import _ext

    qd, kd, vd = (x.detach() for x in (q, k, v))
    out = torch.empty_like(qd)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
    cap = torch.utils.dlpack.to_dlpack
    opts = dict(mask=mask, scale=q.shape[-1] ** -0.5, backend=backend)
    code, msg, fplan = _ext.make_forward_plan(cap(qd), cap(kd), cap(vd), cap(out), cap(lse), **opts)
    if code != "ok":
        raise RuntimeError(f"{label} {backend}: {msg}")
    code, msg, bplan = _ext.make_backward_plan(
        cap(qd), cap(kd), cap(vd), cap(out), cap(do), cap(lse), cap(dq), cap(dk), cap(dv), **opts
    )
    if code != "ok":
        raise RuntimeError(f"{label} {backend}: {msg}")
    return (qd, kd, vd, out, lse, dq, dk, dv), fplan, bplan


def plan_column(q, k, v, do, mask, backend):
    """The extension's plans, made once, run with integer addresses as the eager path runs
    them: no DLPack, no option parsing, workspace from the caching allocator."""
    tensors, fplan, bplan = make_plans(q, k, v, do, mask, backend, "plan")
    qd, kd, vd, out, lse, dq, dk, dv = tensors
    fws, bws = fplan.workspace_size, bplan.workspace_size
    ws = torch.empty(max(fws, bws, 1), dtype=torch.uint8, device=q.device)
    # The runs take addresses only: the column holds the tensors behind them.
    keep = (qd, kd, vd, out, do, lse, dq, dk, dv)
    f_ptrs = [x.data_ptr() for x in keep[:4] + keep[5:6]]
    b_ptrs = [x.data_ptr() for x in keep]
    cuda = q.device.type == "cuda"

    def stream():
        return torch.cuda.current_stream().cuda_stream if cuda else 0

    def check(result):
        if result[0] != "ok":
            raise RuntimeError(f"plan {backend}: {result[1]}")

    def fwd():
        check(fplan.run_forward(*f_ptrs, stream(), ws.data_ptr(), fws))

    def fwd_bwd():
        fwd()
        check(bplan.run_backward(*b_ptrs, stream(), ws.data_ptr(), bws))

    col = Column(f"plan {backend}", "plan", backend, fwd, fwd_bwd)
    col.keep = keep
    return col


def fn_column(q, k, v, do, mask, backend):
    """A minimal torch.autograd.Function over the plans of plan_column: per call it allocates
    O and LSE (forward), dQ, dK, dV (backward) and a device run's workspace with
    torch.empty_strided / torch.empty, runs the plan on the current stream and saves what the
    eager path saves; it looks nothing up and checks nothing. What strideattn.torch.attention
    costs above it is its own Python."""
    tensors, fplan, bplan = make_plans(q, k, v, do, mask, backend, "fn")
    qd, kd, vd, out, lse, dq, dk, dv = tensors
    fws, bws = fplan.workspace_size, bplan.workspace_size
    o_shape, o_stride, l_shape, l_stride = out.shape, out.stride(), lse.shape, lse.stride()
    g_shapes = [(x.shape, x.stride()) for x in (dq, dk, dv)]
    dev, dtype, cuda = q.device, q.dtype, q.device.type == "cuda"
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    index = q.get_device() if cuda else -1

    def stream_ws(ws_bytes):
        """(stream, workspace tensor, its address) of a device run; the tensor lives as long
        as the caller's reference (the run is stream-ordered)."""
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=dev) if ws_bytes else None
        return raw_stream(index), ws, ws.data_ptr() if ws is not None else 0

    empty, f32 = torch.empty_strided, torch.float32
    (sq, tq), (sk, tk), (sv, tv) = g_shapes

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            o = empty(o_shape, o_stride, dtype=dtype, device=dev)
            lse = empty(l_shape, l_stride, dtype=f32, device=dev)
            ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr())
            if cuda:
                stream, ws, wsp = stream_ws(fws)
                r = fplan.run_forward(*ptrs, stream, wsp, fws)
            else:
                r = fplan.run_forward(*ptrs)
            if r[0] != "ok":
                raise RuntimeError(f"fn {backend}: {r[1]}")
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, d_o):
            q, k, v, o, lse = ctx.saved_tensors
            gq = empty(sq, tq, dtype=dtype, device=dev)
            gk = empty(sk, tk, dtype=dtype, device=dev)
            gv = empty(sv, tv, dtype=dtype, device=dev)
            ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), d_o.data_ptr())
            ptrs += (lse.data_ptr(), gq.data_ptr(), gk.data_ptr(), gv.data_ptr())
            if cuda:
                stream, ws, wsp = stream_ws(bws)
                r = bplan.run_backward(*ptrs, stream, wsp, bws)
            else:
                r = bplan.run_backward(*ptrs)
            if r[0] != "ok":
                raise RuntimeError(f"fn {backend}: {r[1]}")
            return gq, gk, gv

    # Function.apply without its Python layer, as strideattn/_torch_ops.py's eager path calls it
    apply = torch._C._FunctionBase.__dict__.get("apply")
    apply = apply.__get__(None, Floor) if apply is not None else Floor.apply

    def fwd():
        return apply(q, k, v)

    def fwd_bwd():
        torch.autograd.grad(fwd(), (q, k, v), do)

    return Column(f"fn {backend}", "fn", backend, fwd, fwd_bwd)


# ------------------------------------------------------------------ timing


# What each device's timing loop reports, in µs per call: on a GPU the time to issue the
# calls without waiting and the time with a synchronize after each; on the CPU the wall time
# and the CPU time of the calling thread (steadier on a loaded machine).
METRICS = {"cuda": ("enqueue_us", "synced_us"), "cpu": ("wall_us", "cpu_us")}


def time_once(fn, calls: int, cuda: bool):
    """The two METRICS of `calls` calls of fn, per call."""
    if not cuda:
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            fn()
        c1, t1 = time.thread_time(), time.perf_counter()
        return (t1 - t0) / calls * 1e6, (c1 - c0) / calls * 1e6
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    enqueue = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
        torch.cuda.synchronize()
    synced = (time.perf_counter() - t0) / calls * 1e6
    return enqueue, synced


def plans_made():
    """The eager path's plan-cache misses so far (forward + backward calls that went through
    the extension's planned call, strideattn/_torch_call.py); None for a strideattn that
    does not count them."""
    from strideattn import _torch_call

    made = getattr(_torch_call, "plans_made", None)
    return None if made is None else sum(made())


def measure(columns, modes, calls, repeats, cuda):
    """({(column name, mode): (metric 0, metric 1)} medians over interleaved repeats, a
    column that fails recording the error instead; {(column name, mode): plan-cache misses
    of the eager path during the timed calls}, which a steady loop over one problem keeps
    at 0: a column with misses is not measuring the cached path; None where strideattn
    does not count them)."""
    samples = {(c.name, m): [] for c in columns for m in modes}
    units = [(c, m) for c in columns for m in modes]
    misses = {key: 0 for key in samples} if plans_made() is not None else None
    errors = {}
    for c in columns:  # warm-up: plans, caches, lazy imports, the allocator
        for m in modes:
            try:
                with c.context():
                    time_once(c.fwd if m == "fwd" else c.fwd_bwd, max(20, calls // 10), cuda)
            except Exception as e:  # noqa: BLE001 - report, keep going
                errors[(c.name, m)] = f"error: {str(e).splitlines()[0][:100]}"
    # each repeat in the next order of a Williams design (timing.in_round_order): no
    # measurement always right after the same one (what one leaves behind, in the caching
    # allocator, the CPU's caches and clocks, falls on the next)
    for r in range(repeats):
        for c, m in in_round_order(units, r):
            if (c.name, m) in errors:
                continue
            made = plans_made()
            with c.context():
                samples[(c.name, m)].append(
                    time_once(c.fwd if m == "fwd" else c.fwd_bwd, calls, cuda)
                )
            if misses is not None:
                misses[(c.name, m)] += plans_made() - made
    result = {}
    for key, s in samples.items():
        if key in errors:
            result[key] = errors[key]
        else:
            result[key] = tuple(statistics.median(x[i] for x in s) for i in range(2))
    return result, misses


def data_rows(columns, modes, result, peers, metrics, misses=None):
    """One row per (column, mode): each metric in µs per call and its ratio to the same
    metric of each SDPA column ("metric/peer"); for the op and module columns the eager
    path's plan-cache misses during the timed calls ("plan_misses", 0 when cached)."""
    rows = []
    for c in columns:
        for m in modes:
            r = result[(c.name, m)]
            row = {"column": c.name, "layer": c.layer, "backend": c.backend, "mode": m}
            if misses is not None and c.layer in ("op", "module"):
                row["plan_misses"] = misses[(c.name, m)]
            if isinstance(r, str):
                row.update({name: None for name in metrics}, error=r)
                rows.append(row)
                continue
            row.update({name: round(val, 2) for name, val in zip(metrics, r)})
            ratios = {}
            for p in peers:
                pr = result[(p, m)]
                if isinstance(pr, str) or c.name == p:
                    continue
                for i, name in enumerate(metrics):
                    ratios[f"{name}/{p}"] = round(r[i] / pr[i], 3) if pr[i] > 0 else None
            row["ratios"] = ratios
            rows.append(row)
    return rows


def machine_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU {model} ({os.cpu_count()} cores)"


def profile(column, n: int, trace: str | None) -> None:
    import cProfile
    import pstats

    if n:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(n):
            column.fwd_bwd()
        pr.disable()
        print(f"\ncProfile of {n} calls of {column.name} fwd+bwd (by own time):")
        pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    if trace:
        from torch.profiler import ProfilerActivity, profile as tprofile

        acts = [ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
        )
        with tprofile(activities=acts) as prof:
            for _ in range(10):
                column.fwd_bwd()
        prof.export_chrome_trace(trace)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
        print(f"host_overhead: trace {trace}")


def main(argv=None) -> int:
    global torch
    args = parse_args(argv)
    try:
        import torch as _torch

        torch = _torch
        import strideattn  # noqa: F401
    except ImportError as e:
        print(f"host_overhead: {e}; nothing to measure", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("host_overhead: no CUDA device", file=sys.stderr)
        return 2
    b, s, h, d = args.shape or DEFAULT_SHAPE[device]
    backends = [
        x.strip() for x in (args.backends or DEFAULT_BACKENDS[device]).split(",") if x.strip()
    ]
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(b, s, h, d, device=device, dtype=dtype).requires_grad_(True) for _ in range(3)
    )
    do = torch.randn(b, s, h, d, device=device, dtype=dtype)
    causal = args.mask == "causal"
    columns = sdpa_columns(q, k, v, do, causal, device)
    peers = [c.name for c in columns]
    make = {
        "ext": ext_column,
        "plan": plan_column,
        "fn": fn_column,
        "op": op_column,
        "module": module_column,
    }
    for layer in args.layers:
        for be in backends:
            columns.append(make[layer](q, k, v, do, args.mask, be))
    modes = ["fwd", "fwd+bwd"]
    result, misses = measure(columns, modes, args.calls, args.repeats, device == "cuda")

    import strideattn

    date, commit = datetime.date.today().isoformat(), git_commit()
    machine = machine_name(device)
    data = {
        "format": FORMAT,
        "date": date,
        # (UTC: render.py orders one day's runs by it)
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S"),
        "commit": commit,
        "machine": machine,
        "device": device,
        "command": "python3 bench/host_overhead.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "versions": {
            "torch": torch.__version__,
            "strideattn": strideattn.version(),
            "python": sys.version.split()[0],
        },
        "protocol": {
            "shape": [b, s, h, d],
            "dtype": args.dtype,
            "mask": args.mask,
            "calls": args.calls,
            "repeats": args.repeats,
            "timer": "time.perf_counter, median of interleaved repeats",
            "order": "Williams design over (column, mode)",
            "threads": torch.get_num_threads(),
        },
        "metrics": list(METRICS[device]),
        "peers": peers,
        "rows": data_rows(columns, modes, result, peers, METRICS[device], misses),
    }
    print(render.host_header(data))
    print(render.host_table(data))
    uncached = [f"{r['column']} {r['mode']}: {r['plan_misses']}" for r in data["rows"]
                if r.get("plan_misses")]  # fmt: skip
    if uncached:
        print("host_overhead: plan-cache misses during the timed calls (the eager path was "
              "not served from its plans): " + "; ".join(uncached))  # fmt: skip
    if not args.no_write:
        folder = os.path.join(args.results_dir, "host")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, data_file_name(date, machine, commit))
        with open(path, "w") as f:
            f.write(render.dumps(data))
        print(f"\nhost_overhead: data file {path}")
    if args.profile_column:
        ops = [c for c in columns if c.name == args.profile_column]
        if not ops:
            names = ", ".join(c.name for c in columns)
            print(f"host_overhead: no column {args.profile_column!r}; columns: {names}")
    else:
        ops = [c for c in columns if c.layer == "op"]
    if (args.profile or args.trace) and ops:
        profile(ops[0], args.profile, args.trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
