"""strideattn.torch.DotProductAttention against TransformerEngine's DotProductAttention
interface (TE 2.x): the whole argument list in TE's order, refusals that name the argument,
mask-type spellings, padding from cu_seqlens or a boolean attention_mask (sbhd included),
attention_mask ignored where TE ignores it, max_seqlen checks, and TE's window alignment
(top-left for 'causal' and bottom_right_diagonal=False). Values are checked against numpy
fp64 on CPU tensors; runs without a GPU, skips without torch."""

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import strideattn.torch as sat  # noqa: E402
from npref import attention_ref, backward_targets, check, grad_magnitude  # noqa: E402

DPA = sat.DotProductAttention
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]

# TE 2.x DotProductAttention.__init__ / forward parameters, in order (from the TE source,
# transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py).
TE_INIT = [
    "num_attention_heads",
    "kv_channels",
    "num_gqa_groups",
    "attention_dropout",
    "qkv_format",
    "attn_mask_type",
    "window_size",
    "bottom_right_diagonal",
    "sequence_parallel",
    "tp_size",
    "get_rng_state_tracker",
    "tp_group",
    "layer_number",
    "attention_type",
    "cp_group",
    "cp_global_ranks",
    "cp_stream",
    "cp_comm_type",
    "softmax_scale",
    "softmax_type",
    "return_max_logit",
    "name",
]
TE_FORWARD = [
    "query_layer",
    "key_layer",
    "value_layer",
    "attention_mask",
    "qkv_format",
    "cu_seqlens_q",
    "cu_seqlens_kv",
    "cu_seqlens_q_padded",
    "cu_seqlens_kv_padded",
    "max_seqlen_q",
    "max_seqlen_kv",
    "attn_mask_type",
    "window_size",
    "bottom_right_diagonal",
    "checkpoint_core_attention",
    "core_attention_bias_type",
    "core_attention_bias",
    "alibi_slopes",
    "fast_zero_fill",
    "inference_params",
    "pad_between_seqs",
    "fp8_output",
    "bf16_backward",
    "num_splits",
    "score_mod",
    "score_mod_bprop",
    "score_mod_tensors",
    "score_mod_bprop_tensors",
    "qkv_layer",
    "kv_layer",
    "qkv_interleave_dim",
    "g",
    "beta",
    "initial_state",
    "output_final_state",
    "use_qk_l2norm_in_kernel",
]


def t(rng, *shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


def np64(x):
    return x.detach().double().cpu().numpy()


def ref_check(name, got, q, k, v, seed, **opts):
    """got vs the fp64 reference under the correctness rule (fp32 naive model)."""
    args = [np64(x) for x in (q, k, v)]
    exact = attention_ref(*args, **opts)
    naive = attention_ref(*args, lowp=np.float32, **opts)
    check(name, np64(got), exact["o"], naive["o"], np.float32, seed)


def cu(lens):
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)


# ----------------------------------------------------------------------------- the interface


def test_signatures_follow_te():
    init = list(inspect.signature(DPA.__init__).parameters)[1:]
    fwd = list(inspect.signature(DPA.forward).parameters)[1:]
    assert init[: len(TE_INIT)] == TE_INIT
    assert fwd == TE_FORWARD


def test_every_argument_at_its_te_default_runs(rng, seed):
    b, s, h, d = 2, 9, 4, 16
    q, k, v = t(rng, b, s, h, d), t(rng, b, s, 2, d), t(rng, b, s, 2, d)
    # positional, in TE's order, each at TE's default
    mod = DPA(
        h,
        d,
        2,
        0.0,
        "bshd",
        "causal",
        None,
        None,
        False,
        1,
        None,
        None,
        None,
        "self",
        None,
        None,
        None,
        "p2p",
        None,
        "vanilla",
        False,
        None,
    )
    o = mod(
        q,
        k,
        v,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        False,
        "no_bias",
        None,
        None,
        True,
        None,
        None,
        False,
        False,
        1,
        None,
        None,
        None,
        None,
        None,
        None,
        -3,
        None,
        None,
        None,
        False,
        False,
    )
    ref_check("o", o.view(b, s, h, d), q, k, v, seed, mask="causal")
    o2 = mod(
        q,
        k,
        v,
        checkpoint_core_attention=True,
        fast_zero_fill=False,
        num_splits=4,
        inference_params=None,
        max_seqlen_q=s,
        max_seqlen_kv=s,
    )
    torch.testing.assert_close(o2, o, rtol=0, atol=0)


@pytest.mark.parametrize(
    "arg,value",
    [
        ("inference_params", object()),
        ("fp8_output", True),
        ("bf16_backward", True),
        ("score_mod", lambda s: s),
        ("score_mod_bprop", lambda s: s),
        ("score_mod_tensors", {}),
        ("score_mod_bprop_tensors", {}),
        ("g", "tensor"),
        ("beta", "tensor"),
        ("initial_state", "tensor"),
        ("output_final_state", True),
    ],
)
def test_unsupported_forward_arguments_are_named(rng, arg, value):
    q = t(rng, 1, 4, 2, 8)
    if value == "tensor":
        value = torch.ones(2)
    with pytest.raises(NotImplementedError, match=arg):
        DPA(2, 8, qkv_format="bshd")(q, q, q, **{arg: value})


def test_training_feature_constructor_arguments_are_accepted():
    # attention_dropout, softmax_type and return_max_logit run (test_te_features.py)
    mod = DPA(2, 8, attention_dropout=0.1, softmax_type="learnable", return_max_logit=True)
    assert mod.softmax_offset.shape == (2,) and mod.softmax_offset.requires_grad


def test_packed_qkv_layer_and_kv_layer(rng, seed):
    b, s, h, d = 2, 7, 2, 16
    qkv = t(rng, b, s, 3, h, d)  # bs3hd
    mod = DPA(h, d, qkv_format="bshd", attn_mask_type="no_mask")
    o = mod(qkv_layer=qkv)
    ref_check("qkv_layer", o.view(b, s, h, d), qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], seed)
    kv = t(rng, b, s, h, 2, d)  # bsh2d
    q = t(rng, b, s, h, d)
    o = mod(q, kv_layer=kv, qkv_interleave_dim=-2)
    ref_check("kv_layer", o.view(b, s, h, d), q, kv[..., 0, :], kv[..., 1, :], seed)


# ----------------------------------------------------------------------------- mask types, padding


@pytest.mark.parametrize(
    "spelling,mask",
    [
        ("padding,causal", "causal"),
        ("causal,padding", "causal"),
        ("causal_padding", "causal"),
        ("padding_causal", "causal"),
        ("padding,causal_bottom_right", "causal_bottom_right"),
        ("padding_causal_bottom_right", "causal_bottom_right"),
        ("padding", "none"),
        ("padding,bottom_right", "causal_bottom_right"),
    ],
)
def test_padding_mask_type_spellings(rng, seed, spelling, mask):
    b, s_q, s_kv, h, d = 3, 8, 12, 2, 16
    q, k, v = t(rng, b, s_q, h, d), t(rng, b, s_kv, h, d), t(rng, b, s_kv, h, d)
    lq, lk = [8, 3, 5], [12, 7, 2]
    o = DPA(h, d, qkv_format="bshd", attn_mask_type=spelling)(
        q, k, v, cu_seqlens_q=cu(lq), cu_seqlens_kv=cu(lk)
    ).view(b, s_q, h, d)
    for i in range(b):
        ref_check(
            f"seq {i}",
            o[i : i + 1, : lq[i]],
            q[i : i + 1, : lq[i]],
            k[i : i + 1, : lk[i]],
            v[i : i + 1, : lk[i]],
            seed,
            mask=mask,
        )
        assert (o[i, lq[i] :] == 0).all()


def test_bad_mask_types():
    with pytest.raises(ValueError, match="attn_mask_type='padding,diagonal' is not a mask type"):
        DPA(2, 8, attn_mask_type="padding,diagonal")
    with pytest.raises(NotImplementedError, match="arbitrary"):
        DPA(2, 8, attn_mask_type="arbitrary")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_padding_with_split_views_and_grads(rng, seed, fmt, device):
    # the seed layout: q, k, v split from one fused buffer; sbhd used to raise
    # NotImplementedError with padding (its batch and seq dims do not merge)
    b, s, h, hg, d = 3, 10, 4, 1, 16
    shape = (s, b, h + 2 * hg, d) if fmt == "sbhd" else (b, s, h + 2 * hg, d)
    dtype = torch.float16 if device == "cuda" else torch.float32
    lowp = np.float16 if device == "cuda" else np.float32
    qkv = t(rng, *shape).to(device=device, dtype=dtype).requires_grad_()
    q, k, v = qkv.split([h, hg, hg], dim=2)
    lens = [10, 4, 0]
    o = DPA(h, d, num_gqa_groups=hg, qkv_format=fmt, attn_mask_type="padding_causal")(
        q, k, v, cu_seqlens_q=cu(lens).to(device), cu_seqlens_kv=cu(lens).to(device)
    )
    assert o.device.type == device and o.dtype == dtype
    g = t(rng, *o.shape).to(device=device, dtype=dtype)
    o.backward(g)
    bshd = (lambda x: x.transpose(0, 1)) if fmt == "sbhd" else (lambda x: x)
    ob, gb = bshd(o.view(*shape[:2], h, d)), bshd(g.view(*shape[:2], h, d))
    grads = [bshd(x) for x in qkv.grad.split([h, hg, hg], dim=2)]
    qb, kb, vb = bshd(q), bshd(k), bshd(v)
    for i, n in enumerate(lens):
        assert (ob[i, n:] == 0).all(), "padding rows of O must be 0"
        for gr in grads:
            assert (gr[i, n:] == 0).all(), "padding rows get no gradient"
        if n == 0:
            continue
        args = [np64(x[i : i + 1, :n]) for x in (qb, kb, vb)]
        exact = attention_ref(*args, mask="causal")
        naive = attention_ref(*args, mask="causal", lowp=lowp)
        check(f"o[{i}]", np64(ob[i : i + 1, :n]), exact["o"], naive["o"], lowp, seed)
        gexact, gnaive = backward_targets(
            *args, np64(ob[i : i + 1, :n]), np64(gb[i : i + 1, :n]), lowp, mask="causal"
        )
        for name, gr in zip(("dq", "dk", "dv"), grads):
            check(
                f"{name}[{i}]",
                np64(gr[i : i + 1, :n]),
                gexact[name],
                gnaive[name],
                lowp,
                seed,
                magnitude=grad_magnitude(gexact),
            )


def test_padding_from_attention_mask(rng, seed):
    b, s, h, d = 3, 8, 2, 16
    q, k, v = t(rng, b, s, h, d), t(rng, b, s, h, d), t(rng, b, s, h, d)
    lens = [8, 5, 1]
    mask = torch.arange(s)[None, :] >= torch.tensor(lens)[:, None]  # True = padding
    mod = DPA(h, d, qkv_format="bshd", attn_mask_type="padding_causal")
    o = mod(q, k, v, attention_mask=mask[:, None, None, :])
    want = mod(q, k, v, cu_seqlens_q=cu(lens), cu_seqlens_kv=cu(lens))
    torch.testing.assert_close(o, want, rtol=0, atol=0)
    ref_check(
        "seq 1",
        o.view(b, s, h, d)[1:2, :5],
        q[1:2, :5],
        k[1:2, :5],
        v[1:2, :5],
        seed,
        mask="causal",
    )
    holes = mask.clone()
    holes[0, 2] = True  # a padded token inside sequence 0
    with pytest.raises(NotImplementedError, match="right padding"):
        mod(q, k, v, attention_mask=holes[:, None, None, :])


def test_padding_mask_type_without_padding_information_is_refused(rng):
    # used to run as if nothing were padded
    q = t(rng, 2, 6, 2, 8)
    for fmt in ("bshd", "sbhd"):
        with pytest.raises(ValueError, match="has padding but nothing says where"):
            DPA(2, 8, qkv_format=fmt, attn_mask_type="padding")(q, q, q)
        with pytest.raises(ValueError, match="attn_mask_type .causal,padding. has padding"):
            DPA(2, 8, qkv_format=fmt)(q, q, q, attn_mask_type="causal,padding")


def test_attention_mask_is_ignored_for_non_padding_types(rng, seed):
    # TE ignores attention_mask for causal / no_mask; this used to raise NotImplementedError
    b, s, h, d = 2, 6, 2, 16
    q, k, v = t(rng, b, s, h, d), t(rng, b, s, h, d), t(rng, b, s, h, d)
    junk = torch.ones(b, 1, 1, s, dtype=torch.bool)
    for mt, mask in (("causal", "causal"), ("no_mask", "none")):
        mod = DPA(h, d, qkv_format="bshd", attn_mask_type=mt)
        o = mod(q, k, v, attention_mask=junk)
        torch.testing.assert_close(o, mod(q, k, v), rtol=0, atol=0)
        ref_check(mt, o.view(b, s, h, d), q, k, v, seed, mask=mask)


def test_max_seqlen_is_checked(rng):
    q = t(rng, 2, 6, 2, 8)
    mod = DPA(2, 8, qkv_format="bshd", attn_mask_type="no_mask")
    with pytest.raises(
        ValueError, match="max_seqlen_q is 5 but the bshd tensors have sequence extent 6"
    ):
        mod(q, q, q, max_seqlen_q=5)
    thd = DPA(2, 8, qkv_format="thd", attn_mask_type="padding")
    tq = t(rng, 10, 2, 8)
    # int32 arrays with the bounds go to the library as they are (host memory here: it
    # checks them), others are read and checked in Python first
    for arrays, said in (
        (cu, r"sequence 1 has 6 tokens \(cu_seqlens_kv\[2\] - cu_seqlens_kv\[1\]\) but max_seqlen_kv is 5"),
        (lambda lens: cu(lens).long(), "max_seqlen_kv is 5 but the longest sequence has 6"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=said):
            thd(
                tq,
                tq,
                tq,
                cu_seqlens_q=arrays([4, 6]),
                cu_seqlens_kv=arrays([4, 6]),
                max_seqlen_q=6,
                max_seqlen_kv=5,
            )


# ----------------------------------------------------------------------------- windows


def window_ref(q, k, v, allowed, scale):
    """fp64 attention with an explicit [s_q, s_kv] visibility matrix (TE's window)."""
    qn, kn, vn = np64(q)[0], np64(k)[0], np64(v)[0]  # [s, h, d]
    s = np.einsum("ihd,jhd->hij", qn, kn) * scale
    s = np.where(allowed[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", p, vn)[None]


def test_te_top_left_windows(rng):
    h, d = 2, 16
    i = np.arange(6)[:, None]
    j = np.arange(10)[None, :]
    q, k, v = t(rng, 1, 6, h, d), t(rng, 1, 10, h, d), t(rng, 1, 10, h, d)
    cases = [
        # (mask type, window, bottom_right_diagonal, TE's visibility for s_q=6, s_kv=10)
        ("causal", (2, 0), None, (j <= i) & (j >= i - 2)),
        ("no_mask", (1, 5), False, (j >= i - 1) & (j <= i + 5)),
        ("no_mask", (1, 5), None, (j >= i + 4 - 1) & (j <= i + 4 + 5)),
        ("causal_bottom_right", (3, 0), False, (j <= i + 4) & (j >= i + 4 - 3)),
    ]
    for mt, window, brd, allowed in cases:
        mod = DPA(
            h,
            d,
            qkv_format="bshd",
            attn_mask_type=mt,
            window_size=window,
            bottom_right_diagonal=brd,
        )
        o = mod(q, k, v).view(1, 6, h, d)
        want = window_ref(q, k, v, allowed, d**-0.5)
        err = np.abs(np64(o) - want).max()
        assert err < 2e-5, f"{mt} {window} brd={brd}: max error {err:.3e}"
    # TE's rules for windows of non-causal types: (-1, 0) is no window, one open side an error
    mod = DPA(h, d, qkv_format="bshd", attn_mask_type="no_mask")
    torch.testing.assert_close(mod(q, k, v, window_size=(-1, 0)), mod(q, k, v), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"window_size=\(3, -1\) with attn_mask_type 'no_mask'"):
        mod(q, k, v, window_size=(3, -1))
    # a top-left window that no bottom-right window equals: refused, not computed wrongly
    with pytest.raises(NotImplementedError, match="top-left"):
        DPA(h, d, qkv_format="bshd", attn_mask_type="causal", window_size=(2, 0))(k, q, q)


def test_window_and_determinism_environment_are_read_every_call(rng, monkeypatch):
    """The module remembers the window pairs it has checked and reads TE's
    NVTE_ALLOW_NONDETERMINISTIC_ALGO cheaply: neither may hide a change. Values that compare
    equal to a remembered pair (1.0, True) are still refused, and the variable set or unset
    between calls reaches the next call's `deterministic`."""
    from strideattn import _torch_module

    h, d = 2, 16
    q, k, v = t(rng, 1, 6, h, d), t(rng, 1, 6, h, d), t(rng, 1, 6, h, d)
    mod = DPA(h, d, qkv_format="bshd", attn_mask_type="no_mask")
    mod(q, k, v, window_size=(1, 2))  # a valid pair, remembered
    for bad in ((1.0, 2), (True, 2)):
        with pytest.raises(ValueError, match="window left must be an integer"):
            mod(q, k, v, window_size=bad)
    seen = []
    real = _torch_module.attend
    monkeypatch.setattr(
        _torch_module, "attend", lambda *a: seen.append(a[12]) or real(*a)
    )  # fmt: skip
    name = "NVTE_ALLOW_NONDETERMINISTIC_ALGO"
    monkeypatch.delenv(name, raising=False)
    mod(q, k, v)
    monkeypatch.setenv(name, "0")
    mod(q, k, v)
    monkeypatch.setenv(name, "1")
    mod(q, k, v)
    monkeypatch.delenv(name)
    mod(q, k, v)
    assert seen == [False, True, False, False]
