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
