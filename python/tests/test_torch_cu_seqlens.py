"""PyTorch varlen with device cu_seqlens arrays (strideattn.torch.attention's cu_seqlens_*,
seq_offsets_*, max_seqlen_* and DotProductAttention's thd path with max_seqlen given): the
arrays reach the kernels as they are (and DotProductAttention's right-padded bshd batch with
cu_seqlens). Checked against the same call with host lengths (bit
for bit: the same kernels on the same problem), that nothing reads them on the host (the
host readers replaced by ones that fail; on CUDA, a graph capture, during which a read-back
is an error, replayed with new contents), that a plan serves new contents of the arrays,
and the refusals by name. Runs on CPU tensors, and on CUDA when present."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import strideattn.torch as sat  # noqa: E402
from strideattn import _torch_call as call  # noqa: E402
from strideattn import _torch_module  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")),
]


def i32(a, device):
    return torch.tensor(np.asarray(a), dtype=torch.int32, device=device)


def problem(seed, device, lens_q, lens_kv, gap, h=4, hg=2, d=32, dtype=torch.bfloat16):
    """q [t_q, h, d], k, v [t_kv, hg, d] (fresh random; q a slice of a wider buffer, k and v
    the split of one fused buffer: views with other strides than their shapes'), the
    cumulative arrays and the starts of sequences `gap` tokens apart."""
    g = torch.Generator().manual_seed(seed)
    cu_q, cu_kv = np.cumsum([0] + lens_q), np.cumsum([0] + lens_kv)
    st_q = np.cumsum([0] + [n + gap for n in lens_q])
    st_kv = np.cumsum([0] + [n + gap for n in lens_kv])
    t_q, t_kv = int(st_q[-1]), int(st_kv[-1])

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device).requires_grad_()

    q = rand(t_q, h, 2 * d)[..., :d]
    k, v = rand(t_kv, 2 * hg, d).split([hg, hg], dim=1)
    do = torch.randn(t_q, h, d, generator=g).to(dtype).to(device)
    return q, k, v, do, (cu_q, cu_kv, st_q[:-1], st_kv[:-1])


def fwd_bwd(q, k, v, do, **kw):
    o, lse = sat.attention(q, k, v, return_lse=True, **kw)
    return (o, lse) + torch.autograd.grad(o, (q, k, v), do)


@pytest.fixture
def no_host_reads(monkeypatch):
    """The host readers of lengths fail: a call that goes through them fails the test."""

    def fail(*_):
        raise AssertionError("varlen lengths were read on the host")

    monkeypatch.setattr(call, "_varlen", fail)
    monkeypatch.setattr(_torch_module, "cu_seqlens_lengths", fail)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.parametrize("gap", [0, 3])
def test_device_arrays_equal_host_lengths(seed, device, mask, gap):
    lens_q, lens_kv = [7, 1, 20, 12], [9, 4, 20, 13]
    q, k, v, do, (cu_q, cu_kv, st_q, st_kv) = problem(seed, device, lens_q, lens_kv, gap)
    offs = dict(offsets_q=list(st_q), offsets_kv=list(st_kv)) if gap else {}
    want = fwd_bwd(q, k, v, do, mask=mask, seqlens_q=lens_q, seqlens_kv=lens_kv, **offs)
    arrays = dict(cu_seqlens_q=i32(cu_q, device), cu_seqlens_kv=i32(cu_kv, device))
    if gap:
        arrays.update(seq_offsets_q=i32(st_q, device), seq_offsets_kv=i32(st_kv, device))
    for step in range(3):  # the first call makes the plans, the others run them
        made = call.plans_made()
        got = fwd_bwd(q, k, v, do, mask=mask, max_seqlen_q=20, max_seqlen_kv=20, **arrays)
        for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, want):
            assert torch.equal(a, b), f"{name} differs from the host-lengths call (step {step})"
        if step:
            assert call.plans_made() == made, "a repeated call made new plans"
    assert want[0].abs().sum() > 0 and want[2].abs().sum() > 0  # (not vacuous)


@pytest.mark.parametrize("device", DEVICES)
def test_a_plan_reads_the_arrays_new_contents(seed, device, no_host_reads):
    q, k, v, do, (cu_q, cu_kv, _, _) = problem(seed, device, [5, 9, 3], [5, 9, 3], 0)
    cu = i32(cu_q, device)
    kw = dict(mask="causal", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=9, max_seqlen_kv=9)
    first = fwd_bwd(q, k, v, do, **kw)
    made = call.plans_made()
    cu.copy_(i32(np.cumsum([0, 9, 5, 3]), device))  # other lengths, same array
    second = fwd_bwd(q, k, v, do, **kw)
    assert call.plans_made() == made, "new contents made a new plan"
    assert not torch.equal(first[0], second[0]), "the run did not read the new lengths"
    cu_new = i32(np.cumsum([0, 9, 5, 3]), device)
    fresh = fwd_bwd(q, k, v, do, **dict(kw, cu_seqlens_q=cu_new, cu_seqlens_kv=cu_new))
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), second, fresh):
        assert torch.equal(a, b), (
            f"{name}: the plan's run of new contents differs from a fresh call"
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True])
def test_module_thd_passes_the_arrays(seed, device, padded, monkeypatch):
    lens_q, lens_kv = [7, 1, 20, 12], [9, 4, 20, 13]
    gap = 2 if padded else 0
    q, k, v, do, (cu_q, cu_kv, st_q, st_kv) = problem(seed, device, lens_q, lens_kv, gap)
    h, hg, d = q.shape[1], k.shape[1], q.shape[2]
    mod = sat.DotProductAttention(
        h, d, num_gqa_groups=hg, qkv_format="thd", attn_mask_type="padding_causal_bottom_right"
    )
    kw = dict(cu_seqlens_q=i32(cu_q, device), cu_seqlens_kv=i32(cu_kv, device))
    if padded:
        pads = np.append(st_q, st_q[-1] + lens_q[-1] + gap), np.append(st_kv, st_kv[-1] + 15)
        kw.update(
            cu_seqlens_q_padded=i32(pads[0], device), cu_seqlens_kv_padded=i32(pads[1], device)
        )
        kw.update(pad_between_seqs=True)
    # without the bounds: the lengths are read on the host (TE's behaviour)
    o_host = mod(q, k, v, **kw)
    g_host = torch.autograd.grad(o_host, (q, k, v), do.reshape(o_host.shape))

    def fail(*_):
        raise AssertionError("the module read cu_seqlens on the host")

    monkeypatch.setattr(_torch_module, "cu_seqlens_lengths", fail)
    o_dev = mod(q, k, v, max_seqlen_q=20, max_seqlen_kv=20, **kw)
    g_dev = torch.autograd.grad(o_dev, (q, k, v), do.reshape(o_dev.shape))
    assert torch.equal(o_dev, o_host)
    for name, a, b in zip(("dq", "dk", "dv"), g_dev, g_host):
        assert torch.equal(a, b), name
    # int64 arrays cannot go to the kernels as they are: the host path, as before
    monkeypatch.undo()
    kw64 = {n: (a.long() if isinstance(a, torch.Tensor) else a) for n, a in kw.items()}
    assert torch.equal(mod(q, k, v, max_seqlen_q=20, max_seqlen_kv=20, **kw64), o_host)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_type", ["padding_causal", "padding_causal_bottom_right"])
def test_module_bshd_padding_passes_the_arrays(seed, device, mask_type, monkeypatch):
    # A right-padded [b, s, h, d] batch with device cu_seqlens: the batch merges into tokens
    # and the arrays go to the kernels; the same as the attention_mask path (host lengths).
    b, s, h, hg, d = 3, 20, 4, 2, 32
    lens = [7, 0, 20]
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16).to(device).requires_grad_()

    q = rand(b, s, h, 2 * d)[..., :d]  # a slice of a wider buffer
    k, v = rand(b, s, 2 * hg, d).split([hg, hg], dim=2)  # the split of one fused buffer
    do = torch.randn(b, s, h * d, generator=g).to(torch.bfloat16).to(device)
    mod = sat.DotProductAttention(
        h, d, num_gqa_groups=hg, qkv_format="bshd", attn_mask_type=mask_type
    )
    padding = torch.arange(s)[None, :] >= torch.tensor(lens)[:, None]  # True = padding
    o_host = mod(q, k, v, attention_mask=padding[:, None, None, :].to(device))
    g_host = torch.autograd.grad(o_host, (q, k, v), do)

    def fail(*_):
        raise AssertionError("the module read the lengths on the host")

    monkeypatch.setattr(_torch_module, "cu_seqlens_lengths", fail)
    monkeypatch.setattr(_torch_module, "_mask_lengths", fail)
    monkeypatch.setattr(call, "_varlen", fail)
    cu = i32(np.cumsum([0] + lens), device)
    for step in range(2):  # the second call runs the plans the first made
        made = call.plans_made()
        o_dev = mod(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=s, max_seqlen_kv=s)
        g_dev = torch.autograd.grad(o_dev, (q, k, v), do)
        assert torch.equal(o_dev, o_host), f"o differs from the attention_mask path ({step})"
        for name, a, c in zip(("dq", "dk", "dv"), g_dev, g_host):
            assert torch.equal(a, c), f"{name} differs from the attention_mask path ({step})"
        if step:
            assert call.plans_made() == made, "a repeated call made new plans"
    assert not o_dev[1].any() and not o_dev[0, 7:].any() and o_dev[0, :7].abs().sum() > 0


def test_cuda_graph_replays_new_lengths(seed):
    if not HAS_CUDA:
        pytest.skip("no CUDA device")
    dev = "cuda"
    q, k, v, do, (cu_q, _, _, _) = problem(seed, dev, [64, 17, 100], [64, 17, 100], 0)
    cu = i32(cu_q, dev)
    kw = dict(mask="causal", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=128, max_seqlen_kv=128)
    fwd_bwd(q, k, v, do, **kw)  # warm-up: plans made outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a host read-back inside a capture raises
        out = fwd_bwd(q, k, v, do, **kw)
    for lens in ([64, 17, 100], [100, 64, 17]):
        cu.copy_(i32(np.cumsum([0] + lens), dev))
        graph.replay()
        torch.cuda.synchronize()
        want = fwd_bwd(q, k, v, do, mask="causal", seqlens_q=lens, seqlens_kv=lens)
        for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), out, want):
            assert torch.equal(a, b), f"{name}, lengths {lens}"


def test_refusals_name_what_and_why():
    q = torch.randn(12, 2, 16, requires_grad=True)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    both = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu)
    bounds = dict(max_seqlen_q=7, max_seqlen_kv=7)
    cases = [
        (dict(cu_seqlens_q=cu, **bounds), ValueError, "cu_seqlens_kv is missing"),
        (both, ValueError, "max_seqlen_q is required"),
        (dict(both, **bounds, seqlens_q=[5, 7], seqlens_kv=[5, 7]), ValueError, "pass one of"),
        (dict(both, **bounds, softcap=3.0), NotImplementedError, "with softcap: not supported"),
        (dict(cu_seqlens_q=cu.long(), cu_seqlens_kv=cu.long(), **bounds), ValueError,
         "cu_seqlens_q has dtype int64; supported: int32"),
        (dict(cu_seqlens_q=[0, 5, 12], cu_seqlens_kv=cu, **bounds), ValueError,
         "cu_seqlens_q must be a torch.Tensor"),
    ]  # fmt: skip
    for kw, err, text in cases:
        with pytest.raises(err, match=text):
            sat.attention(q, q, q, **kw)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passthrough(), pytest.raises(NotImplementedError, match="a dispatch mode"):
        sat.attention(q, q, q, **both, **bounds)

    class Sub(torch.Tensor):
        pass

    with pytest.raises(NotImplementedError, match="a tensor subclass as q, k or v"):
        sat.attention(q, q.as_subclass(Sub), q, **both, **bounds)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad", [False, True])
def test_flash_varlen_and_core_pass_the_arrays(seed, device, grad, monkeypatch):
    import strideattn as sa
    from strideattn import _dropin

    lens_q, lens_kv = [7, 1, 20, 12], [9, 4, 20, 13]
    q, k, v, do, (cu_q, cu_kv, _, _) = problem(seed, device, lens_q, lens_kv, 0)
    if not grad:
        q, k, v = (x.detach() for x in (q, k, v))
    as_lists = sa.flash_attn_varlen_func(q, k, v, list(cu_q), list(cu_kv), 20, 20, causal=True)

    def fail(*_):
        raise AssertionError("cu_seqlens were read on the host")

    monkeypatch.setattr(_dropin, "cu_seqlens_lengths", fail)
    monkeypatch.setattr(call, "_varlen", fail)
    cq, ckv = i32(cu_q, device), i32(cu_kv, device)
    got = sa.flash_attn_varlen_func(q, k, v, cq, ckv, 20, 20, causal=True)
    assert torch.equal(got, as_lists)
    # the library's own entry point: tensors that require grad reach the autograd op with
    # the arrays (its keywords), the others the extension directly
    core = sa.attention(
        q, k, v, mask="causal_bottom_right", cu_seqlens_q=cq, cu_seqlens_kv=ckv,
        max_seqlen_q=20, max_seqlen_kv=20,
    )  # fmt: skip
    assert torch.equal(core, as_lists)
    assert core.requires_grad == grad
    if grad:
        g = torch.autograd.grad(core, (q, k, v), do)
        monkeypatch.undo()
        o = sa.flash_attn_varlen_func(q, k, v, list(cu_q), list(cu_kv), 20, 20, causal=True)
        for name, a, b in zip(("dq", "dk", "dv"), g, torch.autograd.grad(o, (q, k, v), do)):
            assert torch.equal(a, b), name
