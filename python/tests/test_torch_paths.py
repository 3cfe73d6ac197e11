"""The ways a PyTorch program reaches strideattn, each checked against the numpy fp64
reference (npref.py, docs/semantics.md's tolerance rule) on the seed pattern (split views of
one fused sbhd buffer through DotProductAttention), and the paths against each other:
- eager: the autograd.Function that calls the extension itself (the fast path);
- the registered ops, taken under a dispatch mode, and their fake kernels (FakeTensor);
- torch.compile(fullgraph=True) of a module (aot_eager on CPU tensors, inductor on CUDA);
- CUDA-graph capture and replay of forward + backward (CUDA only);
- in-place change of the output before the backward and double backward (both refused),
  opcheck of both ops.
Runs on CPU tensors (CI) and on CUDA when present; skips without torch."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import strideattn.torch as sat  # noqa: E402
from strideattn import _torch_call  # noqa: E402
from npref import attention_ref, backward_targets, check, grad_magnitude  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
CUDA = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
H, HG, D = 8, 1, 32


def np32(t):
    return t.detach().float().cpu().numpy()


def fused(seed, device, s=24, b=2, dtype=torch.float16):
    torch.manual_seed(seed)
    return torch.randn(s, b, H + 2 * HG, D, device=device).to(dtype).requires_grad_()


def split(qkv):
    return qkv.split([H, HG, HG], dim=2)  # sbhd views


def module(**kw):
    # deterministic: the paths below must agree bit for bit, so no atomics in dQ
    return sat.DotProductAttention(
        H, D, num_gqa_groups=HG, qkv_format="sbhd", attn_mask_type="causal",
        deterministic=True, **kw,
    )  # fmt: skip


def check_against_reference(qkv, o, do, seed):
    """O [s, b, h*d] and qkv.grad against the fp64 reference of the same inputs."""
    s, b = qkv.shape[:2]
    q, k, v = split(qkv)
    bshd = lambda x: np32(x.transpose(0, 1))  # noqa: E731
    dtype = qkv.dtype
    exact = attention_ref(bshd(q), bshd(k), bshd(v), mask="causal")
    naive = attention_ref(bshd(q), bshd(k), bshd(v), mask="causal", lowp=dtype)
    o4 = o.view(s, b, H, D)
    check("o", bshd(o4), exact["o"], naive["o"], dtype, seed)
    gexact, gnaive = backward_targets(
        bshd(q), bshd(k), bshd(v), bshd(o4), bshd(do.view(s, b, H, D)), dtype, mask="causal"
    )
    mag = grad_magnitude(gexact)
    for name, got in zip(("dq", "dk", "dv"), split(qkv.grad)):
        check(name, bshd(got), gexact[name], gnaive[name], dtype, seed, magnitude=mag)


class OpLog(TorchDispatchMode):
    """Records the ops dispatched under it (a dispatch mode makes strideattn take its ops)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


# ----------------------------------------------------------------------------- eager vs ops


@pytest.mark.parametrize("device", DEVICES)
def test_eager_fast_path_and_ops_agree(seed, device, monkeypatch):
    qkv = fused(seed, device)
    do = torch.randn(qkv.shape[0], qkv.shape[1], H * D, device=device).to(qkv.dtype)
    calls = []
    real = _torch_call.forward_layout
    monkeypatch.setattr(
        _torch_call, "forward_layout", lambda *a: calls.append(1) or real(*a)
    )  # fmt: skip
    mod = module()
    o = mod(*split(qkv))
    o.backward(do)
    assert calls == [1], "eager call did not take the fast path"
    assert o.shape == (qkv.shape[0], qkv.shape[1], H * D) and o.is_contiguous()
    assert o._base is None  # its own base: in-place use is allowed (see below)
    check_against_reference(qkv, o, do, seed)
    g_eager = qkv.grad.clone()

    qkv.grad = None
    log = OpLog()
    with log:
        o2 = mod(*split(qkv))
        o2.backward(do)
    assert calls == [1], "under a dispatch mode the fast path must not run"
    assert "strideattn.attention_fwd.default" in log.ops
    assert "strideattn.attention_bwd.default" in log.ops
    assert torch.equal(o2, o) and torch.equal(qkv.grad, g_eager)


@pytest.mark.parametrize("device", DEVICES)
def test_fake_tensors_match_the_real_outputs(seed, device):
    from torch._subclasses.fake_tensor import FakeTensorMode

    qkv = fused(seed, device)
    real = module()(*split(qkv))
    mode = FakeTensorMode()
    fake_qkv = mode.from_tensor(qkv.detach()).requires_grad_()
    with mode:
        fake = module()(*split(fake_qkv))
        fake.sum().backward()
        grad = fake_qkv.grad
    assert fake.shape == real.shape and fake.stride() == real.stride()
    assert fake.dtype == real.dtype and grad.shape == qkv.shape


@pytest.mark.parametrize(
    "device, backend",
    [
        ("cpu", "auto"),
        ("cpu", "cpu"),
        pytest.param("cuda", "auto", marks=CUDA),
        pytest.param("cuda", "cuda", marks=CUDA),
        pytest.param("cuda", "cudnn", marks=CUDA),
    ],
)
def test_steady_steps_run_cached_plans(seed, device, backend):
    """A training loop's steps (fresh values, the same shapes and strides) make the eager
    path's plans on the first step only, for each backend a user names, auto included: the
    path bench/host_overhead.py times. Every step's O and gradients against the fp64
    reference."""
    import strideattn as sa

    if backend != "auto" and backend not in sa.compiled_backends():
        pytest.skip(f"backend {backend} is not compiled into this build")
    torch.manual_seed(seed)
    b, s, h, d, dtype = 2, 24, 4, 64, torch.float16
    sa.clear_plan_cache()  # cold: the first step makes the plans, whatever ran before
    before = _torch_call.plans_made()
    for step in range(3):
        q, k, v = (
            torch.randn(b, s, h, d, device=device).to(dtype).requires_grad_() for _ in range(3)
        )
        do = torch.randn(b, s, h, d, device=device).to(dtype)
        o = sat.attention(q, k, v, mask="causal", backend=backend)
        grads = torch.autograd.grad(o, (q, k, v), do)
        assert _torch_call.plans_made() == (before[0] + 1, before[1] + 1), f"step {step}"
        q64, k64, v64, o64, do64 = (np32(t).astype("float64") for t in (q, k, v, o, do))
        exact = attention_ref(q64, k64, v64, mask="causal")
        naive = attention_ref(q64, k64, v64, mask="causal", lowp=dtype)
        check("o", o64, exact["o"], naive["o"], dtype, seed)
        gexact, gnaive = backward_targets(q64, k64, v64, o64, do64, dtype, mask="causal")
        mag = grad_magnitude(gexact)
        for name, got in zip(("dq", "dk", "dv"), grads):
            check(name, np32(got), gexact[name], gnaive[name], dtype, seed, magnitude=mag)


@pytest.mark.parametrize("device", DEVICES)
def test_inplace_on_the_output_and_double_backward(seed, device):
    qkv = fused(seed, device)
    do = torch.randn(qkv.shape[0], qkv.shape[1], H * D, device=device).to(qkv.dtype)
    mod = module()
    o = mod(*split(qkv))
    o.backward(do)
    g1 = qkv.grad.clone()
    qkv.grad = None
    o = mod(*split(qkv)) * 1
    o.mul_(2)  # on a copy: fine, and the gradient doubles
    o.backward(do)
    # (2 * dO is exact, but fp16 subnormals on the way are not: a relative comparison)
    torch.testing.assert_close(qkv.grad.float(), 2 * g1.float(), rtol=2e-3, atol=1e-4)
    qkv.grad = None
    o = mod(*split(qkv))
    o.mul_(2)  # the output itself: the backward needs O, so autograd must refuse, not miscompute
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        o.backward(do)

    # a backward under a dispatch mode after an eager forward: the op, in the caller's layout
    qkv.grad = None
    o = mod(*split(qkv))
    with OpLog() as log:
        o.backward(do)
    assert "strideattn.attention_bwd.default" in log.ops
    assert torch.equal(qkv.grad, g1)

    q, k, v = (x.transpose(0, 1) for x in split(qkv))
    (g,) = torch.autograd.grad(sat.attention(q, k, v).float().sum(), qkv, create_graph=True)
    with pytest.raises(RuntimeError):
        g.float().sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_both_ops(device):
    torch.manual_seed(0)
    buf = torch.randn(12, 2, 6, 32, device=device, dtype=torch.float16)
    q, k, v = (x.transpose(0, 1) for x in buf.split([4, 1, 1], dim=2))
    opts = ("causal", -1, -1, 0.125, "auto", True)
    out, lse = torch.ops.strideattn.attention_fwd(q, k, v, None, None, None, None, *opts)
    do = torch.randn_like(out)
    torch.library.opcheck(
        torch.ops.strideattn.attention_bwd.default,
        (do, q, k, v, out, lse, None, None, None, None, *opts),
    )


# ----------------------------------------------------------------------------- compile


class Attn(torch.nn.Module):
    """DotProductAttention over the split views of a fused buffer."""

    def __init__(self):
        super().__init__()
        self.attn = module()

    def forward(self, qkv):
        return self.attn(*split(qkv))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_checks_outputs_and_gradients(seed, device):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"  # aot_eager: CI's time budget
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(Attn(), backend=counter, fullgraph=True)
    eager = Attn()
    for step in range(2):  # a second call with new values: no recompilation
        qkv = fused(seed + step, device)
        do = torch.randn(qkv.shape[0], qkv.shape[1], H * D, device=device).to(qkv.dtype)
        o = compiled(qkv)
        o.backward(do)
        check_against_reference(qkv, o, do, seed + step)
        g = qkv.grad.clone()
        qkv.grad = None
        o_eager = eager(qkv)
        o_eager.backward(do)
        if device == "cpu":  # aot_eager: the same kernels on the same views
            assert torch.equal(o, o_eager) and torch.equal(g, qkv.grad)
        else:  # inductor may lay the op's inputs out otherwise: a few ulps
            torch.testing.assert_close(o, o_eager, rtol=2e-3, atol=2e-3)
            torch.testing.assert_close(g, qkv.grad, rtol=2e-3, atol=2e-3)
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"


# ----------------------------------------------------------------------------- CUDA graphs


@CUDA
def test_cuda_graph_capture_and_replay_forward_backward(seed):
    mod = module()
    static = fused(seed, "cuda", s=64, b=2)
    static_do = torch.randn(64, 2, H * D, device="cuda").to(static.dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream: plans, allocator
        for _ in range(3):
            static.grad = None
            mod(*split(static)).backward(static_do)
    torch.cuda.current_stream().wait_stream(side)
    static.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o = mod(*split(static))
        static_o.backward(static_do)
    for step in range(2):  # replay on new values copied into the captured buffers
        fresh = fused(seed + 1 + step, "cuda", s=64, b=2)
        with torch.no_grad():
            static.copy_(fresh)
            static_do.normal_()
        graph.replay()
        torch.cuda.synchronize()
        replay_o, replay_g = static_o.clone(), static.grad.clone()
        eager = static.detach().clone().requires_grad_()
        eager_o = mod(*split(eager))
        eager_o.backward(static_do)
        assert torch.equal(replay_o, eager_o) and torch.equal(replay_g, eager.grad)
        check_against_reference(eager, replay_o, static_do, seed + 1 + step)
