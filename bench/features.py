#!/usr/bin/env python3
"""What each training feature costs on the GPU backends, and SDPA with the same option (issue 19).

One run, in one process, on the same tensors, on one training shape: b 4, h 16, s 4096,
d 128, bf16, causal by default (compare_sdpa.py's "mha d128 s4k" row, so the plain problem
can be checked against the main benchmark; --shape changes it):
  - ours: libstrideattn_c.so through bench/sa_abi.py on backends cuda and cudnn, forward and
    forward + backward, of the plain problem and of the same problem with one feature:
      bias        a post-scale bias, full [b, h, s, s] bf16, with dBias of the same shape
      bias-bcast  a post-scale bias [1, h, s, s] broadcast over the batch, dBias [1, h, s, s]
      alibi       ALiBi slopes [1, h] fp32 (2^(-8 (i + 1) / h))
      softcap     softcap 30
      sinks       learnable sinks [1, h] fp32, with d_sinks
      dropout     p = 0.1 (fixed seed and offset, the same in the backward)
      max-logit   the [b, h] fp32 max-logit output (forward only; its backward is the plain one)
    cost = time(feature) / time(plain) - 1, per backend and mode. Each call gets a workspace
    of the size the library asks for, allocated once, so no call allocates. A backend that
    refuses an option (status SA_UNSUPPORTED) is recorded as refused with the library's
    reason; nothing else stops the run. Before timing, each call's outputs are poisoned with
    NaN and checked once: O (and dQ, dBias's diagonal, d_sinks, the max logit) written and
    finite, and O different from the plain problem's where the feature changes it.
  - PyTorch SDPA on the same q, k, v: flash (plain; dropout 0.1), memory-efficient (plain;
    the bias as a float attn_mask with its gradient, both shapes), cuDNN (plain; dropout;
    the bias as attn_mask). With a mask, is_causal=True is tried first (checked: query 0's
    output is key 0's value); where SDPA refuses or ignores it, the causal mask is folded
    into a copy of the bias (-inf above the diagonal) and the row says so. What torch
    refuses is recorded with its message and warnings.
  The targets (issue 19; cuda, fwd+bwd): cost <= 10% for the bias, ALiBi, softcap and sinks,
  <= 15% for dropout; speed (SDPA's time / ours) >= 1.0 over SDPA flash with dropout and
  over SDPA memory-efficient with the bias; over SDPA cuDNN with the same option, no lower
  than the plain problem's speed over SDPA cuDNN.
Protocol (docs/design.md): CUDA events around each run, warm-up first, the median of >= 20
runs; the runs of every measurement are taken in interleaved rounds, so that a drift of the
clocks touches the plain problem and each feature alike, in the orders of a Williams design
(no case always runs right after the same one). Prints markdown tables and writes
RESULTS_DIR/<date>-<gpu>-<commit>.json (bench/render.py renders the newest into
bench/README.md, "Training features").

  python3 bench/features.py [--lib build-gpu/src/libstrideattn_c.so] [--results-dir DIR]
                            [--quick] [--runs N] [--rounds R] [--features bias,dropout,...]
                            [--backends cuda,cudnn] [--shape B,H,S,D]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import statistics
import sys
import warnings

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import render  # noqa: E402  (bench/render.py: the tables, the data file format)
import sa_abi  # noqa: E402  (bench/sa_abi.py, generated from include/strideattn/strideattn.h)
from compare_sdpa import data_file_name, git_commit  # noqa: E402
from timing import event_times, import_cuda_torch, in_round_order  # noqa: E402  (bench/timing.py)

torch = None  # imported by main(): --help and the CPU test work without torch

FEATURES = ["plain", "bias", "bias-bcast", "alibi", "softcap", "sinks", "dropout", "max-logit"]
BACKENDS = {"cuda": sa_abi.SA_BACKEND_CUDA, "cudnn": sa_abi.SA_BACKEND_CUDNN}
MODES = ["fwd", "fwd+bwd"]
SOFTCAP = 30.0
DROPOUT_P = 0.1
DROPOUT_SEED, DROPOUT_OFFSET = 0x5EED, 0
SHAPE = (4, 16, 4096, 128)  # b, h, s, d
QUICK_SHAPE = (1, 16, 4096, 128)
# SDPA columns and the features each is measured with ("bias*": the bias as attn_mask).
SDPA_PEERS = {
    "sdpa-flash": ["plain", "dropout"],
    "sdpa-efficient": ["plain", "bias", "bias-bcast"],
    "sdpa-cudnn": ["plain", "dropout", "bias", "bias-bcast"],
}
# Issue 19's targets, written into the data file (bench/render.py reads them from there).
TARGETS = {
    "backend": "cuda",
    "mode": "fwd+bwd",
    "max_cost": {
        "bias": 0.10,
        "bias-bcast": 0.10,
        "alibi": 0.10,
        "softcap": 0.10,
        "sinks": 0.10,
        "dropout": 0.15,
    },
    "min_speed": [
        ["dropout", "sdpa-flash", 1.0],
        ["bias", "sdpa-efficient", 1.0],
        ["bias-bcast", "sdpa-efficient", 1.0],
    ],  # fmt: skip
    "like_plain": [["dropout", "sdpa-cudnn"], ["bias", "sdpa-cudnn"], ["bias-bcast", "sdpa-cudnn"]],
}


def parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = text.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--shape {text!r}: expected four positive integers B,H,S,D")
    return tuple(int(p) for p in parts)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--lib",
        default=os.path.join(REPO, "build-gpu/src/libstrideattn_c.so"),
        help="libstrideattn_c.so (C ABI)",
    )
    ap.add_argument(
        "--results-dir",
        default=os.path.join(BENCH, "results", "features"),
        help="where the run's data file goes (default bench/results/features)",
    )
    ap.add_argument("--quick", action="store_true", help="b 1, 20 runs in 2 rounds")
    ap.add_argument("--runs", type=int, help="timed runs per measurement (>= 20; default 40)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds the runs are split into")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls before each round")
    ap.add_argument(
        "--features",
        default=",".join(FEATURES[1:]),
        help=f"features to measure besides the plain problem (default: all: {', '.join(FEATURES[1:])})",
    )
    ap.add_argument("--backends", default="cuda,cudnn", help="our backends (C ABI)")
    ap.add_argument("--shape", help="B,H,S,D (default 4,16,4096,128; --quick 1,16,4096,128)")
    ap.add_argument("--no-sdpa", action="store_true", help="leave out the SDPA columns")
    args = ap.parse_args(argv)
    args.runs = args.runs if args.runs is not None else (20 if args.quick else 40)
    args.rounds = args.rounds if args.rounds is not None else (2 if args.quick else 4)
    if args.runs < 20:
        ap.error("--runs must be >= 20 (the protocol of docs/design.md)")
    if not 1 <= args.rounds <= args.runs:
        ap.error(f"--rounds {args.rounds}: must be between 1 and --runs ({args.runs})")
    feats = [f.strip() for f in args.features.split(",") if f.strip()]
    bad = [f for f in feats if f not in FEATURES[1:]]
    if bad:
        ap.error(f"--features: unknown {', '.join(bad)}; known: {', '.join(FEATURES[1:])}")
    args.features = ["plain"] + [f for f in FEATURES[1:] if f in feats]
    bes = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in bes if b not in BACKENDS]
    if bad:
        ap.error(f"--backends: unknown {', '.join(bad)}; known: {', '.join(BACKENDS)}")
    args.backends = bes
    try:
        args.shape = (
            parse_shape(args.shape) if args.shape else (QUICK_SHAPE if args.quick else SHAPE)
        )
    except ValueError as e:
        ap.error(str(e))
    return args


# ------------------------------------------------------------------ C ABI (strideattn.h)


class Refused(RuntimeError):
    """The backend does not run this problem (SA_UNSUPPORTED): the library's reason."""


def view_of(t) -> sa_abi.sa_tensor_view:
    """A [b, s, h, d] tensor (its real strides) as an sa_tensor_view."""
    assert t.dim() == 4
    dtype = {torch.bfloat16: sa_abi.SA_BF16, torch.float16: sa_abi.SA_F16}[t.dtype]
    return sa_abi.sa_tensor_view(
        t.data_ptr(), dtype, (ctypes.c_int64 * 4)(*t.shape), (ctypes.c_int64 * 4)(*t.stride())
    )


def lse_of(t) -> sa_abi.sa_lse_view:
    return sa_abi.sa_lse_view(
        t.data_ptr(), (ctypes.c_int64 * 3)(*t.shape), (ctypes.c_int64 * 3)(*t.stride())
    )


def bias_of(t) -> sa_abi.sa_bias_view:
    """A [B, H, SQ, SKV] bias (or dBias) tensor as an sa_bias_view."""
    assert t.dim() == 4
    dtype = {
        torch.bfloat16: sa_abi.SA_BF16,
        torch.float16: sa_abi.SA_F16,
        torch.float32: sa_abi.SA_F32,
    }
    return sa_abi.sa_bias_view(
        t.data_ptr(),
        dtype[t.dtype],
        (ctypes.c_int64 * 4)(*t.shape),
        (ctypes.c_int64 * 4)(*t.stride()),
    )


def head_of(t) -> sa_abi.sa_head_view:
    """An fp32 [rows, h] table (slopes, sinks, d_sinks, max logit) as an sa_head_view."""
    assert t.dim() == 2 and t.dtype == torch.float32
    return sa_abi.sa_head_view(
        t.data_ptr(), (ctypes.c_int64 * 2)(*t.shape), (ctypes.c_int64 * 2)(*t.stride())
    )


class Tensors:
    """Inputs, outputs and the features' tensors of one problem, made once on `device`."""

    def __init__(self, b, h, s, d, device="cuda", features=FEATURES, dtype=None):
        dt = dtype or torch.bfloat16
        self.b, self.h, self.s, self.d, self.device = b, h, s, d, device
        self.q = torch.randn(b, s, h, d, device=device, dtype=dt)
        self.k = torch.randn(b, s, h, d, device=device, dtype=dt)
        self.v = torch.randn(b, s, h, d, device=device, dtype=dt)
        self.do = torch.randn(b, s, h, d, device=device, dtype=dt)
        self.o = torch.empty_like(self.q)
        self.lse = torch.empty(b, h, s, device=device, dtype=torch.float32)
        self.dq, self.dk, self.dv = (torch.empty_like(x) for x in (self.q, self.k, self.v))
        shapes = {"bias": (b, h, s, s), "bias-bcast": (1, h, s, s)}  # (the biases asked only)
        self.bias = {
            key: torch.randn(*shape, device=device, dtype=dt)
            for key, shape in shapes.items()
            if key in features
        }
        self.dbias = {key: torch.empty_like(x) for key, x in self.bias.items()}
        i = torch.arange(1, h + 1, device=device, dtype=torch.float32)
        self.slopes = torch.pow(2.0, -8.0 * i / h).reshape(1, h)
        self.sinks = torch.randn(1, h, device=device, dtype=torch.float32)
        self.d_sinks = torch.empty_like(self.sinks)
        self.max_logit = torch.empty(b, h, device=device, dtype=torch.float32)


def set_features(f: sa_abi.sa_features, feature: str, t: Tensors) -> None:
    """The sa_features of one feature (every other field stays zero: off)."""
    if feature in ("bias", "bias-bcast"):
        f.bias_type = sa_abi.SA_BIAS_POST_SCALE
        f.bias = bias_of(t.bias[feature])
    elif feature == "alibi":
        f.alibi_slopes = head_of(t.slopes)
    elif feature == "softcap":
        f.softcap = SOFTCAP
    elif feature == "sinks":
        f.sinks = head_of(t.sinks)
    elif feature == "dropout":
        f.dropout_p = DROPOUT_P
        f.dropout_seed, f.dropout_offset = DROPOUT_SEED, DROPOUT_OFFSET
    else:
        assert feature in ("plain", "max-logit"), feature


class Ours:
    """sa_forward and sa_backward of one (backend, feature), their arguments and workspaces
    made once. Raises Refused where the backend refuses the problem, RuntimeError otherwise."""

    def __init__(self, lib, backend: int, feature: str, t: Tensors, causal=True, device=True):
        self.lib, self.msg, self.t = lib, ctypes.create_string_buffer(4096), t
        mask = sa_abi.SA_MASK_CAUSAL if causal else sa_abi.SA_MASK_NONE
        memory = sa_abi.SA_MEMORY_DEVICE if device else sa_abi.SA_MEMORY_HOST
        stream = torch.cuda.current_stream().cuda_stream if device else None
        fa = sa_abi.sa_forward_args()
        fa.struct_size = ctypes.sizeof(sa_abi.sa_forward_args)
        fa.q, fa.k, fa.v, fa.o = view_of(t.q), view_of(t.k), view_of(t.v), view_of(t.o)
        fa.lse = lse_of(t.lse)
        ba = sa_abi.sa_backward_args()
        ba.struct_size = ctypes.sizeof(sa_abi.sa_backward_args)
        ba.q, ba.k, ba.v, ba.o, ba.d_o = (view_of(x) for x in (t.q, t.k, t.v, t.o, t.do))
        ba.lse = lse_of(t.lse)
        ba.dq, ba.dk, ba.dv = view_of(t.dq), view_of(t.dk), view_of(t.dv)
        for a in (fa, ba):
            a.options.mask = mask
            a.backend, a.memory, a.stream = backend, memory, stream
            set_features(a.features, feature, t)
        if feature in ("bias", "bias-bcast"):
            ba.dbias = bias_of(t.dbias[feature])
        elif feature == "sinks":
            ba.d_sinks = head_of(t.d_sinks)
        elif feature == "max-logit":
            fa.max_logit = head_of(t.max_logit)
        self.fa, self.ba, self.keep = fa, ba, []
        self.bwd_error = None  # the backward's refusal, kept until a fwd+bwd is asked
        size = ctypes.c_size_t(0)
        self._check(self.lib.sa_workspace_size(ctypes.byref(fa), ctypes.byref(size), *self._m()))
        self._give_workspace(fa, size.value)
        rc = self.lib.sa_backward_workspace_size(ctypes.byref(ba), ctypes.byref(size), *self._m())
        try:
            self._check(rc)
            self._give_workspace(ba, size.value)
        except RuntimeError as e:
            self.bwd_error = e

    def _m(self):
        return self.msg, len(self.msg)

    def _check(self, rc: int):
        if rc == sa_abi.SA_OK:
            return
        text = self.msg.value.decode(errors="replace")
        if rc == sa_abi.SA_UNSUPPORTED:
            raise Refused(text)
        raise RuntimeError(f"{self.lib.sa_status_name(rc).decode()}: {text}")

    def _give_workspace(self, a, nbytes: int):
        if nbytes:  # torch's blocks start 512-byte aligned (the ABI asks for 16)
            ws = torch.empty(nbytes, dtype=torch.uint8, device=self.t.device)
            self.keep.append(ws)
            a.workspace, a.workspace_bytes = ws.data_ptr(), nbytes

    def forward(self):
        self._check(self.lib.sa_forward(ctypes.byref(self.fa), *self._m()))

    def backward(self):
        if self.bwd_error is not None:
            raise self.bwd_error
        self._check(self.lib.sa_backward(ctypes.byref(self.ba), *self._m()))

    def fwd_bwd(self):
        self.forward()
        self.backward()


# ------------------------------------------------------------------ checks of ours


def poison(t: Tensors) -> None:
    """NaN into every output a call may write, so that an unwritten one shows."""
    nan = float("nan")
    for x in (t.o, t.dq, t.dk, t.dv, t.max_logit, t.d_sinks, *t.dbias.values()):
        x.fill_(nan)


def forward_problems(t: Tensors, feature: str, o_plain) -> list[str]:
    """What is wrong with a forward's outputs (poisoned before it ran)."""
    bad = []
    if not bool(torch.isfinite(t.o).all()):
        bad.append("O has NaN or infinite elements (unwritten?)")
    if feature == "max-logit" and not bool(torch.isfinite(t.max_logit).all()):
        bad.append("the max logit has NaN or infinite elements (unwritten?)")
    changes = feature not in ("plain", "max-logit")
    if changes and o_plain is not None and bool(torch.equal(t.o, o_plain)):
        bad.append("O equals the plain problem's: the option had no effect")
    return bad


def backward_problems(t: Tensors, feature: str) -> list[str]:
    bad = []
    for name, x in (("dQ", t.dq), ("dK", t.dk), ("dV", t.dv)):
        if not bool(torch.isfinite(x).all()):
            bad.append(f"{name} has NaN or infinite elements (unwritten?)")
    if feature in t.dbias:  # the diagonal: pairs every causal row sees
        diag = torch.diagonal(t.dbias[feature], dim1=2, dim2=3)
        if not bool(torch.isfinite(diag).all()):
            bad.append("dBias's diagonal has NaN or infinite elements (unwritten?)")
    if feature == "sinks" and not bool(torch.isfinite(t.d_sinks).all()):
        bad.append("d_sinks has NaN or infinite elements (unwritten?)")
    return bad


# ------------------------------------------------------------------ SDPA


def sdpa_fns(column: str, feature: str, t: Tensors, causal=True):
    """(fwd, fwd_bwd, note) for SDPA on [b, h, s, d] views of the same q, k, v (no copy). A
    bias is a float attn_mask with its gradient; is_causal=True is kept where SDPA honours it
    with the mask (query 0 must get key 0's value), else the mask gets the causal part."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {
        "sdpa-flash": SDPBackend.FLASH_ATTENTION,
        "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    }[column]
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (t.q, t.k, t.v))
    dot = t.do.transpose(1, 2)
    p = DROPOUT_P if feature == "dropout" else 0.0
    mask, note = None, ""
    if feature in t.bias:
        mask = t.bias[feature].detach().requires_grad_(True)  # the same bias tensor as ours

    def call(m, is_causal):
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(
                qt, kt, vt, attn_mask=m, dropout_p=p, is_causal=is_causal
            )

    is_causal = causal
    if mask is not None and causal:
        why = None
        try:
            with torch.no_grad():
                out = call(mask, True)
            if not torch.allclose(out[:, :, 0].float(), vt[:, :, 0].float(), atol=1e-2):
                why = "is_causal=True with an attn_mask was ignored (query 0 saw other keys)"
        except Exception as e:  # noqa: BLE001 - then the mask carries the causal part
            why = f"is_causal=True with an attn_mask failed ({str(e).splitlines()[0][:120]})"
        if why:
            s = t.s
            upper = torch.ones(s, s, dtype=torch.bool, device=t.device).triu(1)
            folded = t.bias[feature].masked_fill(upper, float("-inf"))
            mask, is_causal = folded.requires_grad_(True), False
            note = f"{why}: the causal mask folded into the attn_mask (-inf above the diagonal)"
    leaves = (qt, kt, vt) + ((mask,) if mask is not None else ())

    def fwd():
        return call(mask, is_causal)

    def fwd_bwd():  # autograd.grad: no accumulation kernel into .grad
        torch.autograd.grad(fwd(), leaves, dot)

    return fwd, fwd_bwd, note


def first_line(e: BaseException, caught=()) -> str:
    """An exception's first line, with the warnings torch gave while refusing."""
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    said = [str(w.message).strip().replace("\n", " ") for w in caught]
    said = [w for w in said if w and w not in text]
    if said:
        text += " [" + "; ".join(dict.fromkeys(said)) + "]"
    return text[:400]


# ------------------------------------------------------------------ the run


class Case:
    """One measurement: a column (ours or SDPA), a feature, a mode; its runs or why none."""

    def __init__(self, column, feature, mode, fn=None, status="ok", reason="", note=""):
        self.column, self.feature, self.mode, self.fn = column, feature, mode, fn
        self.status, self.reason, self.note, self.check = status, reason, note, None
        self.times: list[float] = []

    def row(self) -> dict:
        ms = statistics.median(self.times) if self.status == "ok" and self.times else None
        r = {"column": self.column, "feature": self.feature, "mode": self.mode, "ms": ms}
        r["runs"] = len(self.times)
        r["status"] = self.status
        if self.reason:
            r["reason"] = self.reason
        if self.note:
            r["note"] = self.note
        if self.check:
            r["check"] = self.check
        return r


def ours_cases(lib, backend: str, features: list[str], t: Tensors) -> list[Case]:
    """Every (feature, mode) of one of our backends: made, run once and checked."""
    cases, o_plain = [], None
    for feature in features:
        fwd = Case(backend, feature, "fwd")
        both = Case(backend, feature, "fwd+bwd")
        try:
            call = Ours(lib, BACKENDS[backend], feature, t)
            poison(t)
            call.forward()
            torch.cuda.synchronize()
        except Refused as e:
            for c in (fwd, both):
                c.status, c.reason = "refused", str(e)
            cases += [fwd, both]
            continue
        except RuntimeError as e:
            for c in (fwd, both):
                c.status, c.reason = "error", first_line(e)
            cases += [fwd, both]
            continue
        fwd.fn = call.forward
        bad = forward_problems(t, feature, o_plain)
        if feature == "plain":
            o_plain = t.o.clone()
        fwd.check = "; ".join(bad) or "ok"
        try:
            call.backward()
            torch.cuda.synchronize()
            both.fn = call.fwd_bwd
            both.check = "; ".join(bad + backward_problems(t, feature)) or "ok"
        except Refused as e:
            both.status, both.reason = "refused", str(e)
        except RuntimeError as e:
            both.status, both.reason = "error", first_line(e)
        cases += [fwd, both]
    return cases


def sdpa_cases(features: list[str], t: Tensors) -> list[Case]:
    """The SDPA columns for the features asked: made, run once; refusals recorded."""
    cases = []
    for column, feats in SDPA_PEERS.items():
        for feature in (f for f in feats if f in features):
            made = [Case(column, feature, m) for m in MODES]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    fwd, fwd_bwd, note = sdpa_fns(column, feature, t)
                    for c, fn in zip(made, (fwd, fwd_bwd)):
                        c.fn, c.note = fn, note
                except Exception as e:  # noqa: BLE001 - torch's refusal: record, keep going
                    for c in made:
                        c.status, c.reason = "refused", first_line(e, caught)
            for c in made:
                if c.fn is None:
                    continue
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        c.fn()
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001 - as above
                        kind = "error" if "out of memory" in str(e) else "refused"
                        c.fn, c.status, c.reason = None, kind, first_line(e, caught)
            cases += made
    return cases


def time_cases(cases: list[Case], runs: int, rounds: int, warmup: int) -> None:
    """runs per case, split over `rounds` rounds that visit every case in turn, each round in
    the next order of a Williams design (timing.in_round_order), so that no case always runs
    right after the same one."""
    live = [c for c in cases if c.fn is not None and c.status == "ok"]
    for r in range(rounds):
        per = runs // rounds + (1 if r < runs % rounds else 0)
        for c in in_round_order(live, r):
            if c.status != "ok":
                continue
            try:
                c.times += event_times(c.fn, per, warmup)
            except RuntimeError as e:  # a later run failing: say so, keep the others going
                c.status, c.reason, c.times = "error", first_line(e), []


def main(argv=None) -> int:
    global torch
    args = parse_args(argv)
    torch = import_cuda_torch("features")
    if torch is None:
        return 2
    lib, backends, version = None, [], None
    try:
        lib = sa_abi.load(args.lib)
        version = lib.sa_version().decode()
        for be in args.backends:
            if lib.sa_backend_compiled(BACKENDS[be]):
                backends.append(be)
            else:
                print(f"features: backend {be} not compiled into {args.lib}", file=sys.stderr)
    except OSError as e:
        print(f"features: cannot load {args.lib}: {e}; timing SDPA only", file=sys.stderr)

    torch.manual_seed(0)
    b, h, s, d = args.shape
    t = Tensors(b, h, s, d, features=args.features)
    cases = []
    for be in backends:
        cases += ours_cases(lib, be, args.features, t)
    if not args.no_sdpa:
        cases += sdpa_cases(args.features, t)
    for c in cases:
        if c.status != "ok" or (c.check and c.check != "ok"):
            print(f"features: {c.column} {c.feature} {c.mode}: {c.status} {c.reason}"
                  f"{' check: ' + c.check if c.check and c.check != 'ok' else ''}",
                  file=sys.stderr)  # fmt: skip
    time_cases(cases, args.runs, args.rounds, args.warmup)

    gpu = torch.cuda.get_device_name()
    date, commit = datetime.date.today().isoformat(), git_commit()
    data = {
        "format": render.FEATURES_FORMAT,
        "date": date,
        # (UTC: render.py orders one day's runs by it)
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S"),
        "commit": commit,
        "gpu": gpu,
        "command": "python3 bench/features.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "versions": {
            "torch": torch.__version__,
            "cudnn": str(torch.backends.cudnn.version()),
            "cuda": torch.version.cuda,
            "strideattn": version,
            "python": sys.version.split()[0],
        },
        "protocol": {
            "runs": args.runs,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "timer": "CUDA events, median",
            "workspace": "ours: sa_(backward_)workspace_size bytes, allocated once",
            "sdpa": "autograd.grad over q, k, v (and the attn_mask)",
        },
        "shape": {"b": b, "h": h, "hg": h, "s": s, "d": d, "dtype": "bf16", "mask": "causal"},
        "options": {
            "softcap": SOFTCAP,
            "dropout_p": DROPOUT_P,
            "bias": "post_scale, bf16, randn",
            "alibi": "slopes 2^(-8 (i + 1) / h), [1, h]",
            "sinks": "randn [1, h]",
        },
        "backends": backends,
        "features": args.features,
        "targets": TARGETS,
        "rows": [c.row() for c in cases],
    }
    text = render.features_header(data) + "\n\n" + render.features_table(data)
    print()
    print(f"training features on {gpu}, commit {commit}, {date}")
    print()
    print(text)
    os.makedirs(args.results_dir, exist_ok=True)
    path = os.path.join(args.results_dir, data_file_name(date, gpu, commit))
    with open(path, "w") as f:
        f.write(render.dumps(data))
    print(f"\nfeatures: data file {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
