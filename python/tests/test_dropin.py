"""strideattn.sdpa, flash_attn_func and flash_attn_varlen_func against the documented
semantics of the originals, written out here in numpy fp64 (independent of the library and
of npref.py): PyTorch SDPA's [b, h, s, d] tensors with a top-left causal mask
(tril(diagonal=0)) and repeat_interleave GQA; FlashAttention 2's [b, s, h, d] tensors with a
bottom-right causal mask and window [i + s_k - s_q - left, i + s_k - s_q + right], rows that
see no key giving 0, cu_seqlens cumulative. s_q != s_kv throughout, so the alignment of the
causal mask changes the answer (checked: the other alignment fails the comparison)."""

import math

import numpy as np
import pytest

import strideattn as sa

TOL_F32 = 2e-5  # fp32 inputs: the library's fp32 error is far below this on these sizes


def softmax_attention(q, k, v, allowed, scale, modify=None):
    """q [s_q, d], k [s_k, d], v [s_k, dv], allowed [s_q, s_k] bool; rows with nothing
    allowed give 0 (FlashAttention's documented behaviour; SDPA never has them here).
    modify: a function of the scaled scores [s_q, s_k] (softcap, ALiBi, an additive mask)."""
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
    if modify is not None:
        s = modify(s)
    s = np.where(allowed, s, -np.inf)
    out = np.zeros((q.shape[0], v.shape[1]))
    for i in range(q.shape[0]):
        if allowed[i].any():
            p = np.exp(s[i] - s[i][allowed[i]].max())
            p[~allowed[i]] = 0
            out[i] = (p / p.sum()) @ v.astype(np.float64)
    return out


def sdpa_ref(query, key, value, is_causal=False, scale=None, enable_gqa=False, attn_mask=None):
    """torch.nn.functional.scaled_dot_product_attention's documented reference code (a float
    attn_mask is added to the scaled scores, broadcast to [b, h, L, S])."""
    b, h, L, e = query.shape
    S = key.shape[-2]
    scale = 1 / math.sqrt(e) if scale is None else scale
    allowed = np.tril(np.ones((L, S), bool), k=0) if is_causal else np.ones((L, S), bool)
    if enable_gqa:
        key = np.repeat(key, h // key.shape[1], axis=1)
        value = np.repeat(value, h // value.shape[1], axis=1)
    bias = (
        None if attn_mask is None else np.broadcast_to(attn_mask.astype(np.float64), (b, h, L, S))
    )
    out = np.zeros((b, h, L, value.shape[-1]))
    for bi in range(b):
        for hi in range(h):
            add = None if bias is None else (lambda s, m=bias[bi, hi]: s + m)
            out[bi, hi] = softmax_attention(
                query[bi, hi], key[bi, hi], value[bi, hi], allowed, scale, add
            )
    return out


def flash_allowed(s_q, s_k, causal, window_size):
    """FlashAttention 2's mask: causal aligned bottom-right; window around i + s_k - s_q."""
    i = np.arange(s_q)[:, None]
    j = np.arange(s_k)[None, :]
    diag = i + s_k - s_q
    allowed = np.ones((s_q, s_k), bool)
    left, right = window_size
    if causal:
        right = 0
    if left >= 0:
        allowed &= j >= diag - left
    if right >= 0:
        allowed &= j <= diag + right
    return allowed


def flash_ref(
    q, k, v, causal=False, window_size=(-1, -1), softmax_scale=None, softcap=0.0, alibi_slopes=None
):
    """flash_attn_func: q [b, s_q, h, d], k/v [b, s_k, h_k, d]; head i reads KV head i // (h / h_k).
    softcap > 0: scores softcap * tanh(scores / softcap) (of the scaled scores); alibi_slopes
    [h] or [b, h]: a bias of -slope * |i + s_k - s_q - j| added after that (FlashAttention 2's
    docstring and kernel order)."""
    b, s_q, h, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d) if softmax_scale is None else softmax_scale
    allowed = flash_allowed(s_q, s_k, causal, window_size)
    dist = np.abs(np.arange(s_q)[:, None] + s_k - s_q - np.arange(s_k)[None, :])
    slopes = None if alibi_slopes is None else np.broadcast_to(alibi_slopes, (b, h))
    out = np.zeros((b, s_q, h, v.shape[-1]))
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // h_k)

            def modify(s, bi=bi, hi=hi):
                if softcap > 0:
                    s = softcap * np.tanh(s / softcap)
                if slopes is not None:
                    s = s - float(slopes[bi, hi]) * dist
                return s

            out[bi, :, hi] = softmax_attention(
                q[bi, :, hi], k[bi, :, kh], v[bi, :, kh], allowed, scale, modify
            )
    return out


def assert_close(got, want, what):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert not np.isnan(got).any(), f"{what}: NaN"
    err = np.abs(got - want).max()
    assert err <= TOL_F32 + 4e-6 * np.abs(want).max(), f"{what}: max error {err:.3e}"


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------- sdpa


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("s_q,s_kv", [(5, 11), (11, 5)])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_sdpa_matches_its_definition(rng, is_causal, s_q, s_kv, scale):
    b, h, h_kv, d, dv = 2, 4, 2, 16, 8
    q, k, v = randn(rng, b, h, s_q, d), randn(rng, b, h_kv, s_kv, d), randn(rng, b, h_kv, s_kv, dv)
    o = sa.sdpa(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True)
    want = sdpa_ref(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True)
    assert_close(o, want, "sdpa")
    assert o.flags.c_contiguous, "output laid out like the [b, h, s, d] inputs"
    if is_causal:  # bottom-right alignment would be a different answer
        with pytest.raises(AssertionError):
            assert_close(
                o,
                flash_ref(
                    *(x.transpose(0, 2, 1, 3) for x in (q, k, v)), causal=True, softmax_scale=scale
                ).transpose(0, 2, 1, 3),
                "bottom-right",
            )


def test_sdpa_reads_strided_views(rng):
    # q, k, v as [b, h, s, d] views of one fused [b, s, h + 2, d] projection buffer
    b, s, h, d = 2, 9, 4, 32
    buf = randn(rng, b, s, h + 2, d)
    q, k, v = (
        x.transpose(0, 2, 1, 3) for x in (buf[:, :, :h], buf[:, :, h : h + 1], buf[:, :, h + 1 :])
    )
    o = sa.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    assert_close(o, sdpa_ref(q, k, v, is_causal=True, enable_gqa=True), "sdpa views")


def test_sdpa_refusals(rng):
    q, k = randn(rng, 1, 4, 6, 16), randn(rng, 1, 2, 6, 16)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        sa.sdpa(q, k, k)
    with pytest.raises(NotImplementedError, match=r"attn_mask=a numpy.ndarray of shape \(6, 6\)"):
        sa.sdpa(q, q, q, attn_mask=np.ones((6, 6), bool))
    with pytest.raises(NotImplementedError, match="dropout_p=0.1"):
        sa.sdpa(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"4 dimensions \[batch, heads, seq, head_dim\]"):
        sa.sdpa(q[0], q[0], q[0])


def test_sdpa_torch_forward_and_grad(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import torch.nn.functional as F

    b, h, h_kv, s_q, s_kv, d = 2, 4, 2, 6, 10, 16
    q0, k0, v0 = (
        randn(rng, b, h, s_q, d),
        randn(rng, b, h_kv, s_kv, d),
        randn(rng, b, h_kv, s_kv, d),
    )
    q, k, v = (torch.tensor(x, requires_grad=True) for x in (q0, k0, v0))
    o = sa.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    assert o.shape == (b, h, s_q, d)
    g = torch.tensor(randn(rng, b, h, s_q, d))
    o.backward(g)
    rq, rk, rv = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q0, k0, v0))
    ro = F.scaled_dot_product_attention(rq, rk, rv, is_causal=True, enable_gqa=True)
    ro.backward(g.double())
    assert_close(o.detach().numpy(), ro.detach().numpy(), "o vs torch SDPA fp64")
    for name, got, want in (
        ("dq", q.grad, rq.grad),
        ("dk", k.grad, rk.grad),
        ("dv", v.grad, rv.grad),
    ):
        assert_close(got.numpy(), want.numpy(), f"{name} vs torch SDPA fp64")


# ----------------------------------------------------------------------------- flash_attn_func


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window_size", [(-1, -1), (2, 1), (3, -1), (-1, 0)])
@pytest.mark.parametrize("s_q,s_kv", [(5, 11), (11, 5)])
def test_flash_attn_func_matches_its_definition(rng, causal, window_size, s_q, s_kv):
    b, h, h_kv, d, dv = 2, 4, 2, 16, 8
    q, k, v = randn(rng, b, s_q, h, d), randn(rng, b, s_kv, h_kv, d), randn(rng, b, s_kv, h_kv, dv)
    o = sa.flash_attn_func(q, k, v, causal=causal, window_size=window_size, softmax_scale=0.4)
    assert_close(
        o,
        flash_ref(q, k, v, causal=causal, window_size=window_size, softmax_scale=0.4),
        "flash_attn_func",
    )


def test_flash_causal_is_bottom_right(rng):
    b, h, d, s_q, s_kv = 1, 2, 16, 4, 10
    q, k, v = randn(rng, b, s_q, h, d), randn(rng, b, s_kv, h, d), randn(rng, b, s_kv, h, d)
    o = sa.flash_attn_func(q, k, v, causal=True)
    top_left = sdpa_ref(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)), is_causal=True).transpose(
        0, 2, 1, 3
    )
    assert np.abs(o - top_left).max() > 1e-2, "FlashAttention's causal=True read as top-left"
    # s_q > s_kv: the first s_q - s_kv queries see no key and give 0 (not NaN)
    o = sa.flash_attn_func(k, q, q, causal=True)
    assert (o[:, : s_kv - s_q] == 0).all()
    assert_close(o, flash_ref(k, q, q, causal=True), "s_q > s_kv")


def test_flash_refusals(rng):
    q = randn(rng, 1, 6, 2, 16)
    for kwargs, name in (
        (dict(dropout_p=0.1), "dropout_p"),
        (dict(return_attn_probs=True), "return_attn_probs"),
    ):
        with pytest.raises(NotImplementedError, match=name):
            sa.flash_attn_func(q, q, q, **kwargs)
        with pytest.raises(NotImplementedError, match=name):
            sa.flash_attn_varlen_func(q[0], q[0], q[0], [0, 6], [0, 6], 6, 6, **kwargs)
    with pytest.raises(NotImplementedError, match="block_table"):
        sa.flash_attn_varlen_func(
            q[0], q[0], q[0], [0, 6], [0, 6], 6, 6, block_table=np.zeros((1, 1), np.int32)
        )
    with pytest.raises(ValueError, match=r"window_size\[0\] is -2"):
        sa.flash_attn_func(q, q, q, window_size=(-2, 0))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
@pytest.mark.parametrize("slopes_shape", [None, (3,), (2, 3)])
def test_flash_softcap_and_alibi_match_their_definition(rng, causal, softcap, slopes_shape):
    # s_q != s_kv: the ALiBi distance and the causal mask are both aligned bottom-right
    # q a slice of a wider array, k and v the split of one fused array (strided views)
    q = (3 * randn(rng, 2, 5, 3, 32))[..., :16]  # large scores: the softcap changes the answer
    k, v = np.split(randn(rng, 2, 9, 3, 24), [16], axis=3)
    slopes = (
        None if slopes_shape is None else rng.uniform(0.1, 1.0, slopes_shape).astype(np.float32)
    )
    want = flash_ref(q, k, v, causal, softcap=softcap, alibi_slopes=slopes)
    got = sa.flash_attn_func(q, k, v, causal=causal, softcap=softcap, alibi_slopes=slopes)
    assert_close(got, want, f"flash softcap {softcap} alibi {slopes_shape}")
    if softcap or slopes is not None:  # (the options change the answer: not vacuous)
        assert np.abs(want - flash_ref(q, k, v, causal)).max() > 1e-3
    # varlen: the same per sequence (the sequences packed, the slopes per sequence)
    if slopes_shape != (2, 3):
        cat = [np.concatenate([x[0], x[1]]) for x in (q, k, v)]
        got = sa.flash_attn_varlen_func(
            *cat, [0, 5, 10], [0, 9, 18], 5, 9, causal=causal, softcap=softcap,
            alibi_slopes=slopes,
        )  # fmt: skip
        assert_close(got, np.concatenate([want[0], want[1]]), "varlen softcap / alibi")


@pytest.mark.parametrize("mask_shape", [(5, 9), (2, 1, 5, 9), (1, 3, 1, 9), (3, 5, 9)])
def test_sdpa_float_mask_is_an_additive_bias(rng, mask_shape):
    q, k, v = randn(rng, 2, 3, 5, 16), randn(rng, 2, 3, 9, 16), randn(rng, 2, 3, 9, 8)
    mask = (2 * rng.standard_normal(mask_shape)).astype(np.float32)
    mask[..., :2] = -np.inf  # masked keys, as SDPA's float masks carry them
    got = sa.sdpa(q, k, v, attn_mask=mask)
    assert_close(got, sdpa_ref(q, k, v, attn_mask=mask), f"sdpa mask {mask_shape}")
    assert np.abs(got - sdpa_ref(q, k, v)).max() > 1e-3  # (the mask matters)
    with pytest.raises(ValueError, match="attn_mask and is_causal=True"):
        sa.sdpa(q, k, v, attn_mask=mask, is_causal=True)
    with pytest.raises(NotImplementedError, match="a floating-point additive mask"):
        sa.sdpa(q, k, v, attn_mask=mask > 0)


def test_sdpa_float_mask_gets_its_gradient(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.from_numpy(randn(rng, 2, 3, 5, 16)).double() for _ in range(3))
    q, k, v = (x.float().requires_grad_() for x in (q, k, v))
    mask = torch.from_numpy(randn(rng, 1, 3, 5, 5)).requires_grad_()
    do = torch.from_numpy(randn(rng, 2, 3, 5, 16))
    o = sa.sdpa(q, k, v, attn_mask=mask)
    got = torch.autograd.grad(o, (q, k, v, mask), do)
    with sdpa_kernel(SDPBackend.MATH):
        dd = [x.detach().double().requires_grad_() for x in (q, k, v, mask)]
        ref = F.scaled_dot_product_attention(*dd[:3], attn_mask=dd[3])
        want = torch.autograd.grad(ref, dd, do.double())
    for name, a, b in zip(("dq", "dk", "dv", "dmask"), got, want):
        assert_close(a.detach().numpy(), b.numpy(), f"sdpa {name}")
    assert want[3].abs().max() > 1e-3


def test_dropout_draws_from_torchs_generator(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    q, k, v = (torch.from_numpy(randn(rng, 2, 9, 3, 16)) for _ in range(3))
    bhsd = [x.transpose(1, 2) for x in (q, k, v)]

    def seed_after(s):  # the seed a drop-in draws right after torch.manual_seed(s)
        torch.manual_seed(s)
        return int(torch.randint(0, 2**62, (1,)).item())

    for name, call in (
        ("sdpa", lambda: sa.sdpa(*bhsd, dropout_p=0.3, is_causal=True).transpose(1, 2)),
        ("flash", lambda: sa.flash_attn_func(q, k, v, dropout_p=0.3, causal=True)),
        ("varlen", lambda: sa.flash_attn_varlen_func(
            *(x.reshape(18, 3, 16) for x in (q, k, v)), [0, 9, 18], [0, 9, 18], 9, 9,
            dropout_p=0.3, causal=True).reshape(2, 9, 3, 16)),
    ):  # fmt: skip
        torch.manual_seed(7)
        got = call()
        want = sa.attention(q, k, v, mask="causal", dropout_p=0.3, dropout_seed=seed_after(7))
        assert torch.equal(got, want), f"{name}: not strideattn's mask of the drawn seed"
        torch.manual_seed(7)
        assert torch.equal(call(), got), f"{name}: torch.manual_seed does not reproduce it"
        torch.manual_seed(8)
        assert not torch.equal(call(), got), f"{name}: another seed, the same mask"
        assert not torch.equal(got, sa.attention(q, k, v, mask="causal")), f"{name}: no dropout"


# ----------------------------------------------------------------------------- varlen


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window_size", [(-1, -1), (2, 0)])
def test_flash_attn_varlen_func_matches_its_definition(rng, causal, window_size):
    # sequences with s_q < s_k, s_q > s_k, an empty query side, and two tokens after the last
    cu_q = np.array([0, 3, 3, 10, 14], np.int32)
    cu_k = np.array([0, 6, 8, 9, 17], np.int32)
    t_q, t_k, h, h_kv, d = 16, 17, 4, 1, 16
    q, k, v = randn(rng, t_q, h, d), randn(rng, t_k, h_kv, d), randn(rng, t_k, h_kv, d)
    o = sa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 8, causal=causal, window_size=window_size)
    want = np.zeros((t_q, h, d))
    for i in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        want[sq] = flash_ref(
            q[None, sq], k[None, sk], v[None, sk], causal=causal, window_size=window_size
        )[0]
    assert_close(o, want, "flash_attn_varlen_func")
    assert (o[14:] == 0).all(), "tokens after the last sequence are 0"


def test_varlen_argument_errors(rng):
    t = randn(rng, 10, 2, 16)
    with pytest.raises(ValueError, match="max_seqlen_q is 4 but the longest sequence has 6"):
        sa.flash_attn_varlen_func(t, t, t, [0, 6, 10], [0, 6, 10], 4, 6)
    with pytest.raises(ValueError, match=r"cu_seqlens_k decreases at index 2 \(6 -> 5\)"):
        sa.flash_attn_varlen_func(t, t, t, [0, 6, 10], [0, 6, 5], 6, 6)
    with pytest.raises(ValueError, match="cu_seqlens_q has 3 entries but cu_seqlens_k has 2"):
        sa.flash_attn_varlen_func(t, t, t, [0, 6, 10], [0, 10], 6, 10)
    with pytest.raises(ValueError, match=r"3 dimensions \[total_tokens, heads, head_dim\]"):
        sa.flash_attn_varlen_func(t[None], t[None], t[None], [0, 10], [0, 10], 10, 10)


def test_readme_coming_from_section_holds(rng):
    # The README section exists, names the entry points, and what it says about the causal
    # alignment is what the functions do.
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    m = re.search(
        r"## Coming from SDPA / FlashAttention / TransformerEngine\n(.*?)\n## ", text, re.S
    )
    assert m, "README.md has no 'Coming from SDPA / FlashAttention / TransformerEngine' section"
    section = m.group(1)
    for name in (
        "strideattn.sdpa",
        "strideattn.flash_attn_func",
        "flash_attn_varlen_func",
        "strideattn.torch.DotProductAttention",
        "cu_seqlens",
        "[b, h, s, d]",
    ):
        assert name in section, name
    assert re.search(r"FlashAttention's `causal=True` is our `causal_bottom_right`", section)
    assert re.search(r"Our `causal` is top-left, like SDPA's `is_causal`", section)
    q, k, v = randn(rng, 1, 4, 2, 16), randn(rng, 1, 9, 2, 16), randn(rng, 1, 9, 2, 16)
    np.testing.assert_array_equal(
        sa.flash_attn_func(q, k, v, causal=True), sa.attention(q, k, v, mask="causal_bottom_right")
    )
    bhsd = [x.transpose(0, 2, 1, 3) for x in (q, k, v)]
    np.testing.assert_array_equal(
        sa.sdpa(*bhsd, is_causal=True).transpose(0, 2, 1, 3), sa.attention(q, k, v, mask="causal")
    )


def test_dropins_on_cuda_torch(rng, seed):
    # the GPU path: torch fp16 CUDA tensors in and out, cu_seqlens as int32 CUDA tensors
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from npref import attention_ref, check

    h, h_kv, d, s_q, s_kv = 8, 2, 64, 48, 80
    host = [
        rng.standard_normal(sh).astype(np.float16)
        for sh in ((2, s_q, h, d), (2, s_kv, h_kv, d), (2, s_kv, h_kv, d))
    ]
    q, k, v = (torch.from_numpy(x).cuda() for x in host)
    o = sa.flash_attn_func(q, k, v, causal=True, window_size=(16, -1))
    assert o.is_cuda and o.dtype == torch.float16
    opts = dict(mask="causal_bottom_right", window=(16, -1))
    check(
        "flash",
        o.float().cpu().numpy(),
        attention_ref(*host, **opts)["o"],
        attention_ref(*host, lowp=np.float16, **opts)["o"],
        np.float16,
        seed,
    )
    o = sa.sdpa(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    check(
        "sdpa",
        o.transpose(1, 2).float().cpu().numpy(),
        attention_ref(*host, mask="causal")["o"],
        attention_ref(*host, mask="causal", lowp=np.float16)["o"],
        np.float16,
        seed,
    )
    cu_q = torch.tensor([0, 30, 48], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 50, 80], dtype=torch.int32, device="cuda")
    o = sa.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 30, 50, causal=True)
    opts = dict(mask="causal_bottom_right", seqlens_q=[30, 18], seqlens_kv=[50, 30])
    check(
        "varlen",
        o.float().cpu().numpy(),
        attention_ref(*(x[0] for x in host), **opts)["o"],
        attention_ref(*(x[0] for x in host), lowp=np.float16, **opts)["o"],
        np.float16,
        seed,
    )
