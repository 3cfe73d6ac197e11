"""The ring's per-rank merge logic (strideattn/_cp_ring.py RankState: partial O merged in fp32
by the LSE, dQ and dK/dV accumulated in fp32) in one process that plays N ranks: rank r's
steps get the K/V block of rank (r - i) mod N directly instead of over a network. On CPU
with the `cpu` backend (small problems), and on one GPU with the `cuda` and `cudnn`
backends (the merges then run on the second CUDA stream), against the fp64 reference under
the correctness rule; and which way the ring's calls go (the extension directly when eager,
the registered ops under a dispatch mode). The GPU cases skip, saying why, without a CUDA
device."""

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import strideattn.torch as sat  # noqa: E402
from npref import attention_ref, backward_targets, check, grad_magnitude  # noqa: E402
from strideattn import _cp_plan, _cp_ring, _torch_call, _torch_cp  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


def simulate(q, k, v, do, cp, mask, window, backend, varlen=None):
    """O, LSE, dQ, dK, dV of the whole problem, computed rank by rank (dense [b, s, h, d];
    varlen [t, h, d] with varlen = (seqlens_q, offsets_q, seqlens_kv, offsets_kv))."""
    left, right = window
    scale = 1.0 / q.shape[-1] ** 0.5
    if varlen is None:
        seq, offs_q, offs_kv = 1, None, None
        shape_plan = lambda r: _cp_plan.dense_plan(cp, r, mask, left, right, q.shape[1], k.shape[1])  # fmt: skip
        units = lambda steps: [_torch_cp._dense_units(b) for b in steps]
    else:
        lq, offs_q, lkv, offs_kv = varlen
        pq = _torch_cp._padded(lq, offs_q, q.shape[0], cp, "q")
        pkv = _torch_cp._padded(lkv, offs_kv, k.shape[0], cp, "kv")
        seqs = tuple(zip(pq, lq, pkv, lkv))
        seq = 0
        shape_plan = lambda r: _cp_plan.varlen_plan(cp, r, mask, left, right, seqs)
        tq, tkv = q.shape[0] // cp, k.shape[0] // cp
        units = lambda steps: [_torch_cp._varlen_units(c, tq, tkv) for c in steps]
    part = lambda x, r, off: sat.cp_shard(x, cp, r, seq_dim=seq, offsets=off)
    lift = (lambda x: x.unsqueeze(0)) if varlen else (lambda x: x)
    qs = [lift(part(q, r, offs_q)) for r in range(cp)]
    dos = [lift(part(do, r, offs_q)) for r in range(cp)]
    ks = [lift(part(k, r, offs_kv)) for r in range(cp)]
    vs = [lift(part(v, r, offs_kv)) for r in range(cp)]
    cfgs = []
    for r in range(cp):
        steps, last = shape_plan(r)
        cfgs.append(_cp_ring.RingConfig(units(steps[: last + 1]), last, scale, backend, False))
    outs, lses, dqs = [], [], []
    dk = [torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in ks]
    dv = [torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in vs]
    for r, cfg in enumerate(cfgs):
        st = _cp_ring.RankState(qs[r], vs[r], cfg)
        for i in range(cfg.last + 1):
            j = (r - i) % cp
            st.forward_step(i, qs[r], ks[j], vs[j])
        o, lse = st.finish_forward(qs[r])
        outs.append(o)
        lses.append(lse)
    for r, cfg in enumerate(cfgs):
        st = _cp_ring.RankState(qs[r], vs[r], cfg, backward=True)
        for i in range(cfg.last + 1):
            j = (r - i) % cp
            st.backward_step(i, dos[r], qs[r], ks[j], vs[j], outs[r], lses[r], dk[j], dv[j])
        dqs.append(st.finish_backward(qs[r]))
    drop = (lambda x: x.squeeze(0)) if varlen else (lambda x: x)
    whole = lambda xs, dim, off: sat.cp_unshard([drop(x) for x in xs], seq_dim=dim, offsets=off)
    return (
        whole(outs, seq, offs_q),
        whole(lses, 1 if varlen else 2, offs_q),
        whole(dqs, seq, offs_q),
        whole([x.to(q.dtype) for x in dk], seq, offs_kv),
        whole([x.to(q.dtype) for x in dv], seq, offs_kv),
    )


def run(
    rng, seed, device, backend, dtype, cp, mask, window, b, s_q, s_kv, h, hg, d, varlen=None,
    mode=None,
):  # fmt: skip
    """One problem simulated rank by rank and checked against fp64; the ranks run under
    `mode` (a TorchDispatchMode) when one is given."""

    def draw(*shape):
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(dtype)

    lead_q, lead_kv = ((s_q,), (s_kv,)) if varlen else ((b, s_q), (b, s_kv))
    q, k, v = draw(*lead_q, h, d), draw(*lead_kv, hg, d), draw(*lead_kv, hg, d)
    do = draw(*lead_q, h, d)
    dev = [x.to(device) for x in (q, k, v, do)]
    try:
        with mode if mode is not None else contextlib.nullcontext():
            o, lse, dq, dk, dv = simulate(*dev, cp, mask, window, backend, varlen)
    except NotImplementedError as e:  # a GPU backend's support rule
        pytest.skip(f"{backend} refuses this problem: {e}")
    if device == "cuda":
        torch.cuda.synchronize()
    qn, kn, vn, don = (x.float().numpy() for x in (q, k, v, do))
    opts = dict(mask=mask, window=window)
    if varlen:
        opts.update(seqlens_q=varlen[0], offsets_q=varlen[1], seqlens_kv=varlen[2], offsets_kv=varlen[3])  # fmt: skip
    exact = attention_ref(qn, kn, vn, **opts)
    naive = attention_ref(qn, kn, vn, lowp=dtype, **opts)
    np32 = lambda t: t.detach().float().cpu().numpy()
    check("o", np32(o), exact["o"], naive["o"], dtype, seed)
    check("lse", np32(lse), exact["lse"], naive["lse"], dtype, seed, lse=True)
    ge, gn = backward_targets(qn, kn, vn, np32(o), don, dtype, **opts)
    mag = grad_magnitude(ge)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        check(name, np32(got), ge[name], gn[name], dtype, seed, magnitude=mag)


CPU_CASES = [
    (4, "causal", (-1, -1), 2, 32, 32, 4, 2, 16),
    (3, "none", (5, 0), 1, 24, 24, 2, 1, 16),
    (2, "causal_bottom_right", (-1, -1), 2, 12, 28, 4, 4, 8),
    (8, "causal", (9, -1), 1, 48, 48, 2, 2, 8),
]


@pytest.mark.parametrize("cp,mask,window,b,s_q,s_kv,h,hg,d", CPU_CASES)
def test_cpu_ranks_in_one_process(rng, seed, cp, mask, window, b, s_q, s_kv, h, hg, d):
    run(rng, seed, "cpu", "cpu", torch.bfloat16, cp, mask, window, b, s_q, s_kv, h, hg, d)


def test_cpu_varlen_ranks_in_one_process(rng, seed):
    # padded extents 16 and 24 (multiples of 2 x 4), real lengths 13 and 24 / 16 and 20
    varlen = ([13, 24], [0, 16], [16, 20], [0, 16])
    run(rng, seed, "cpu", "cpu", torch.float16, 4, "causal", (-1, -1), 1, 40, 40, 4, 2, 16, varlen)


class _StrideattnOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the strideattn ops that reach the dispatcher, and runs every op unchanged."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "strideattn":
            self.seen.add(func.name())
        return func(*args, **(kwargs or {}))


class _DirectCalls:
    """strideattn._torch_call as the ring module sees it, counting the ring's own calls of
    forward() and backward() (the ops' kernels keep the real module)."""

    def __init__(self):
        self.n = 0

    def __getattr__(self, name):
        real = getattr(_torch_call, name)
        if name not in ("forward", "backward"):
            return real

        def counted(*args):
            self.n += 1
            return real(*args)

        return counted


@pytest.mark.parametrize("varlen", [False, True])
def test_ring_calls_the_ops_only_under_a_dispatch_mode(rng, seed, monkeypatch, varlen):
    # Eager, the ring calls the extension directly, as the single-process fast path does;
    # under a dispatch mode it calls the registered ops instead, so that the mode sees every
    # call (as it sees the single-process call); the answers are right either way.
    direct = _DirectCalls()
    monkeypatch.setattr(_cp_ring, "call", direct)
    args = ("cpu", "cpu", torch.float16, 4, "causal", (-1, -1), 1, 40, 40, 4, 2, 16)
    var = ([13, 24], [0, 16], [16, 20], [0, 16]) if varlen else None
    run(rng, seed, *args, var)
    assert direct.n > 0, "the eager ring went through the ops"
    direct.n = 0
    mode = _StrideattnOps()
    run(rng, seed, *args, var, mode=mode)
    assert mode.seen == {"strideattn::attention_fwd", "strideattn::attention_bwd"}, mode.seen
    assert direct.n == 0, "the ring called the extension past the dispatch mode"


GPU_CASES = [
    (2, "causal", (-1, -1), 1, 1024, 1024, 8, 2, 128),
    (4, "causal", (-1, -1), 2, 512, 512, 8, 1, 64),
    (4, "none", (-1, -1), 1, 512, 512, 4, 4, 128),
    (4, "none", (100, 0), 1, 512, 512, 8, 2, 128),
    (2, "causal_bottom_right", (-1, -1), 1, 256, 768, 8, 2, 128),
]


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("backend", ["cuda", "cudnn"])
@pytest.mark.parametrize("cp,mask,window,b,s_q,s_kv,h,hg,d", GPU_CASES)
def test_gpu_ranks_in_one_process(rng, seed, backend, cp, mask, window, b, s_q, s_kv, h, hg, d):
    run(rng, seed, "cuda", backend, torch.bfloat16, cp, mask, window, b, s_q, s_kv, h, hg, d)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("backend", ["cuda", "cudnn"])
def test_gpu_varlen_ranks_in_one_process(rng, seed, backend):
    varlen = ([200, 512, 37], [0, 256, 768], [256, 512, 64], [0, 256, 768])
    run(rng, seed, "cuda", backend, torch.bfloat16, 4, "causal", (-1, -1), 1, 832, 832, 8, 2, 128, varlen)  # fmt: skip
