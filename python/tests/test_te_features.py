"""TransformerEngine's training-feature arguments of strideattn.torch.DotProductAttention on
CPU tensors (attention_dropout, softmax_type, return_max_logit, core_attention_bias_type,
core_attention_bias, alibi_slopes), forward and gradients against the fp64 model of
docs/semantics.md (npref.features_ref), fresh random inputs."""

import numpy as np
import pytest

from npref import features_ref

torch = pytest.importorskip("torch")
st = pytest.importorskip("strideattn.torch")


def close(name, got, exact, seed, tol=1e-4):
    got = got.detach().double().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    exact = np.asarray(exact, np.float64)
    assert got.shape == exact.shape, f"{name}: shape {got.shape} != {exact.shape}"
    err = float(np.abs(got - exact).max())
    tol = tol * max(1.0, float(np.abs(exact).max()))
    assert err <= tol, f"{name}: max abs error {err:.3e} > {tol:.3e} (seed {seed})"


def tensors(rng, b=2, s_q=7, s_kv=10, h=4, hg=2, d=8):
    """q, k, v, dout as numpy [b, s, h, d] and as leaf tensors that require grad."""
    arrs = [rng.standard_normal(shape).astype(np.float32) for shape in
            ((b, s_q, h, d), (b, s_kv, hg, d), (b, s_kv, hg, d), (b, s_q, h, d))]  # fmt: skip
    leaves = [torch.from_numpy(x.copy()).requires_grad_() for x in arrs[:3]]
    return arrs, leaves


def module(fmt="bshd", mask="no_mask", **kw):
    return st.DotProductAttention(
        4, 8, num_gqa_groups=2, qkv_format=fmt, attn_mask_type=mask, backend="cpu", **kw
    )


def as_fmt(t, fmt):
    return t.transpose(0, 1) if fmt == "sbhd" else t


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("bias_type", ["post_scale_bias", "pre_scale_bias"])
def test_bias_and_max_logit(rng, seed, fmt, bias_type):
    (q, k, v, do), t = tensors(rng)
    bias = rng.standard_normal((1, 4, 7, 10)).astype(np.float32)
    tb = torch.from_numpy(bias.copy()).requires_grad_()
    m = module(fmt, "causal_bottom_right", return_max_logit=True)
    o, ml = m(*(as_fmt(x, fmt) for x in t), core_attention_bias_type=bias_type,
              core_attention_bias=tb)  # fmt: skip
    ref = features_ref(q, k, v, mask="causal_bottom_right", bias=bias, do=do,
                       bias_type=bias_type[: -len("_bias")])  # fmt: skip
    o4 = as_fmt(o, fmt).reshape(2, 7, 4, 8)
    close("o", o4, ref["o"], seed)
    close("max_logit", ml, ref["max_logit"].max(axis=0), seed)
    o4.backward(torch.from_numpy(do))
    for name, x in (("dq", t[0]), ("dk", t[1]), ("dv", t[2]), ("dbias", tb)):
        close(name, x.grad, ref[name], seed)


@pytest.mark.parametrize("softmax_type", ["off-by-one", "learnable"])
def test_softmax_types(rng, seed, softmax_type):
    (q, k, v, do), t = tensors(rng)
    m = module(softmax_type=softmax_type)
    sinks = np.zeros(4, np.float32)
    if softmax_type == "learnable":
        sinks = rng.standard_normal(4).astype(np.float32)
        with torch.no_grad():
            m.softmax_offset.copy_(torch.from_numpy(sinks))
    o = m(*t).reshape(2, 7, 4, 8)
    ref = features_ref(q, k, v, sinks=sinks, do=do)
    close("o", o, ref["o"], seed)
    o.backward(torch.from_numpy(do))
    close("dq", t[0].grad, ref["dq"], seed)
    if softmax_type == "learnable":
        close("softmax_offset.grad", m.softmax_offset.grad, ref["d_sinks"], seed)
    else:
        assert not hasattr(m, "softmax_offset")


@pytest.mark.parametrize("heads", [4, 6])
def test_alibi_default_and_given_slopes(rng, seed, heads):
    arrs = [rng.standard_normal((2, 6, heads, 8)).astype(np.float32) for _ in range(3)]
    t = [torch.from_numpy(x) for x in arrs]
    m = st.DotProductAttention(heads, 8, qkv_format="bshd", attn_mask_type="causal_bottom_right",
                               backend="cpu")  # fmt: skip
    o = m(*t, core_attention_bias_type="alibi")
    # Press et al.: 2^(-8 i / n) for n = 4, then (6 heads) 2^(-1), 2^(-3)
    want = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8] + [2.0**-1, 2.0**-3][: heads - 4]
    ref = features_ref(*arrs, mask="causal_bottom_right", alibi_slopes=np.array(want))
    close("o (default slopes)", o.reshape(2, 6, heads, 8), ref["o"], seed)
    slopes = rng.uniform(0.1, 1.0, (2, heads)).astype(np.float32)
    o = m(*t, core_attention_bias_type="alibi", alibi_slopes=torch.from_numpy(slopes))
    ref = features_ref(*arrs, mask="causal_bottom_right", alibi_slopes=slopes)
    close("o (given slopes)", o.reshape(2, 6, heads, 8), ref["o"], seed)


def test_dropout_in_training_mode(rng, seed):
    (q, k, v, do), t = tensors(rng)
    m = module(attention_dropout=0.25)
    torch.manual_seed(seed)
    drawn = int(torch.randint(0, 2**62, (1,)).item())  # what the module draws next
    torch.manual_seed(seed)
    o = m(*t).reshape(2, 7, 4, 8)
    ref = features_ref(q, k, v, dropout_p=0.25, dropout_seed=drawn, do=do)
    close("o", o, ref["o"], seed)
    o.backward(torch.from_numpy(do))
    close("dk", t[1].grad, ref["dk"], seed)
    m.eval()  # no dropout outside training
    close("o (eval)", m(*t).reshape(2, 7, 4, 8), features_ref(q, k, v)["o"], seed)


def test_thd_bias(rng, seed):
    lens_q, lens_kv = [3, 5], [4, 6]
    q = rng.standard_normal((8, 4, 8)).astype(np.float32)
    k = rng.standard_normal((10, 2, 8)).astype(np.float32)
    v = rng.standard_normal((10, 2, 8)).astype(np.float32)
    bias = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    cu = [torch.tensor([0, 3, 8], dtype=torch.int32), torch.tensor([0, 4, 10], dtype=torch.int32)]
    m = module("thd", "padding_causal_bottom_right")
    o = m(*(torch.from_numpy(x) for x in (q, k, v)), cu_seqlens_q=cu[0], cu_seqlens_kv=cu[1],
          core_attention_bias_type="post_scale_bias", core_attention_bias=torch.from_numpy(bias))  # fmt: skip
    for n, (oq, okv) in enumerate(((0, 0), (3, 4))):
        lq, lk = lens_q[n], lens_kv[n]
        ref = features_ref(q[None, oq : oq + lq], k[None, okv : okv + lk], v[None, okv : okv + lk],
                           mask="causal_bottom_right", bias=bias[n : n + 1, :, :lq, :lk])  # fmt: skip
        close(f"o[{n}]", o[oq : oq + lq].reshape(1, lq, 4, 8), ref["o"], seed)


@pytest.mark.parametrize(
    "make, call, exc, match",
    [
        (dict(softmax_type="sigmoid"), {}, ValueError, "softmax_type='sigmoid'"),
        (dict(attention_dropout=1.0), {}, ValueError, "attention_dropout = 1.0"),
        ({}, dict(core_attention_bias_type="post_scale_bias"), ValueError, "needs core_attention_bias"),
        ({}, dict(core_attention_bias_type="bias"), ValueError, "core_attention_bias_type='bias'"),
        ({}, dict(alibi_slopes=torch.ones(4)), ValueError, "alibi_slopes are given with"),
        (dict(mask="padding"), dict(core_attention_bias_type="alibi"), NotImplementedError,
         "padding mask type in qkv_format 'bshd'"),
    ],
)  # fmt: skip
def test_bad_arguments(rng, make, call, exc, match):
    _, t = tensors(rng)
    with pytest.raises(exc, match=match):
        m = module(**make)
        lens = torch.tensor([0, 7, 14], dtype=torch.int32)
        extra = dict(cu_seqlens_q=lens, cu_seqlens_kv=lens) if "mask" in make else {}
        m(*t, **call, **extra)


# ----------------------------------------------------------------------------- dropout on CUDA

HAS_CUDA = torch.cuda.is_available()
CUDA = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")


def cuda_case(rng, b=2, s_q=48, s_kv=64, h=4, hg=2, d=32):
    """q, k, v, dout rounded to float16: numpy float32 copies and CUDA float16 tensors."""
    shapes = ((b, s_q, h, d), (b, s_kv, hg, d), (b, s_kv, hg, d), (b, s_q, h, d))
    halves = [torch.from_numpy(rng.standard_normal(s).astype(np.float32)).half() for s in shapes]
    return [x.float().numpy() for x in halves], [x.cuda() for x in halves]


def cuda_module(**kw):
    return st.DotProductAttention(
        4, 32, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="causal_bottom_right",
        backend="cuda", **kw,
    )  # fmt: skip


@pytest.fixture
def drawn(monkeypatch):
    """The dropout seed tensors the module draws, in order (the module's own function)."""
    from strideattn import _torch_te_features as te_features

    seen = []
    original = te_features.dropout_rng

    def recording(like):
        out = original(like)
        seen.append(out)
        return out

    monkeypatch.setattr(te_features, "dropout_rng", recording)
    return seen


@CUDA
def test_dropout_on_cuda_draws_from_the_cuda_generator(rng, seed, drawn):
    """The module draws (seed, offset) on the device from PyTorch's CUDA generator (no host
    round trip; torch.cuda.manual_seed reproduces it) and the kernels read them there: O and
    the gradients match the fp64 model of that seed and offset, not of another seed."""
    (q, k, v, do), (tq, tk, tv, tdo) = cuda_case(rng)
    leaves = [x.clone().requires_grad_() for x in (tq, tk, tv)]
    m = cuda_module(attention_dropout=0.25)
    torch.cuda.manual_seed(seed)
    o = m(*leaves).reshape(2, 48, 4, 32)
    rng_t = drawn[-1]["dropout_rng"]
    assert rng_t.is_cuda and rng_t.dtype == torch.int64 and rng_t.shape == (2,)
    torch.cuda.manual_seed(seed)
    again = torch.randint(0, 2**62, (2,), dtype=torch.int64, device="cuda")
    assert torch.equal(again, rng_t)
    s, off = (int(x) for x in rng_t.cpu())
    ref = features_ref(q, k, v, mask="causal_bottom_right", dropout_p=0.25, dropout_seed=s,
                       dropout_offset=off, do=do)  # fmt: skip
    close("o", o.float().cpu(), ref["o"], seed, tol=1e-2)
    o.backward(tdo)
    for name, x in zip(("dq", "dk", "dv"), leaves):
        close(name, x.grad.float().cpu(), ref[name], seed, tol=2e-2)
    # a planted error: the model of another seed is far from this O
    other = features_ref(q, k, v, mask="causal_bottom_right", dropout_p=0.25, dropout_seed=s + 1,
                         dropout_offset=off)  # fmt: skip
    with pytest.raises(AssertionError):
        close("o (another seed)", o.float().cpu(), other["o"], seed, tol=1e-2)


@CUDA
def test_dropout_under_cuda_graph_replays_fresh_masks(rng, seed, drawn):
    """Captured once, the module's forward draws a new (seed, offset) on each replay (the
    draw is a node of the graph; the kernels read the seed tensor by pointer): every replay
    matches the fp64 model of what it drew, and the masks differ between replays."""
    (q, k, v, _), (tq, tk, tv, _) = cuda_case(rng)
    m = cuda_module(attention_dropout=0.25)
    torch.cuda.manual_seed(seed)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream: plans, allocator
        for _ in range(2):
            m(tq, tk, tv)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o = m(tq, tk, tv)
    rng_t = drawn[-1]["dropout_rng"]
    seen = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        s, off = (int(x) for x in rng_t.cpu())
        ref = features_ref(q, k, v, mask="causal_bottom_right", dropout_p=0.25, dropout_seed=s,
                           dropout_offset=off)  # fmt: skip
        close("o", static_o.reshape(2, 48, 4, 32).float().cpu(), ref["o"], seed, tol=1e-2)
        seen.append(((s, off), static_o.clone()))
    assert len({key for key, _ in seen}) == 3, "each replay draws a fresh seed"
    assert not torch.equal(seen[0][1], seen[1][1])


def test_dropout_rng_tensor_is_checked(rng):
    _, t = tensors(rng)
    with pytest.raises(ValueError, match=r"dropout_rng has shape \(3,\)"):
        st.attention(
            *t, dropout_p=0.1, dropout_rng=torch.zeros(3, dtype=torch.int64), backend="cpu"
        )


def test_dropout_rng_tensor_reads_seed_and_offset(rng, seed):
    """dropout_rng ([seed, offset], read when the call runs) gives the mask of those values,
    forward and backward (host memory for the cpu backend)."""
    (q, k, v, do), t = tensors(rng)
    rng_t = torch.tensor([seed, 3], dtype=torch.int64)
    o = st.attention(*t, dropout_p=0.25, dropout_rng=rng_t, backend="cpu")
    ref = features_ref(q, k, v, dropout_p=0.25, dropout_seed=seed, dropout_offset=3, do=do)
    close("o", o, ref["o"], seed)
    o.backward(torch.from_numpy(do))
    close("dk", t[1].grad, ref["dk"], seed)
