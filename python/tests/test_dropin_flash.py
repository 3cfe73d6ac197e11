"""FlashAttention 2's packed drop-ins (flash_attn_qkvpacked_func, flash_attn_kvpacked_func and
their varlen forms) and flash_attn_with_kvcache against the definition written out in
test_dropin.py (numpy fp64, a bottom-right causal mask and window), on fresh random buffers:
the packed forms read q, k, v as views and equal the unpacked function bit for bit (with
PyTorch, the gradient lands in the packed buffer's .grad as the unpacked gradients,
stacked); the KV-cache form appends the new tokens (contiguous and shuffled paged caches)
and attends to each sequence's cached plus new keys. Wrong shapes and the arguments
strideattn cannot honour are refused by name."""

import numpy as np
import pytest

import strideattn as sa
from test_dropin import assert_close, flash_ref, randn


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window_size", [(-1, -1), (3, 1)])
def test_qkvpacked_and_kvpacked_match_the_definition(rng, causal, window_size):
    b, s, h, d = 2, 11, 4, 16
    qkv = randn(rng, b, s, 3, h, d)
    o = sa.flash_attn_qkvpacked_func(qkv, causal=causal, window_size=window_size)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert_close(o, flash_ref(q, k, v, causal=causal, window_size=window_size), "qkvpacked")
    np.testing.assert_array_equal(
        o, sa.flash_attn_func(q, k, v, causal=causal, window_size=window_size)
    )
    # GQA 4:2, s_q != s_kv: the bottom-right alignment changes the answer
    q = randn(rng, b, 7, h, d)
    kv = randn(rng, b, 13, 2, 2, d)
    o = sa.flash_attn_kvpacked_func(q, kv, causal=causal, window_size=window_size)
    want = flash_ref(q, kv[:, :, 0], kv[:, :, 1], causal=causal, window_size=window_size)
    assert_close(o, want, "kvpacked")


def test_varlen_packed_match_the_definition(rng):
    cu = np.array([0, 4, 4, 11], np.int32)
    t, h, d = 13, 2, 16  # two tokens after the last sequence
    qkv = randn(rng, t, 3, h, d)
    o = sa.flash_attn_varlen_qkvpacked_func(qkv, cu, 7, causal=True)
    want = np.zeros((t, h, d))
    for i in range(len(cu) - 1):
        sl = slice(cu[i], cu[i + 1])
        want[sl] = flash_ref(*(qkv[None, sl, j] for j in range(3)), causal=True)[0]
    assert_close(o, want, "varlen qkvpacked")
    cu_k = np.array([0, 6, 9, 12], np.int32)
    kv = randn(rng, 12, 2, 1, d)
    o = sa.flash_attn_varlen_kvpacked_func(qkv[:, 0], kv, cu, cu_k, 7, 6, causal=True)
    want = np.zeros((t, h, d))
    for i in range(len(cu) - 1):
        sq, sk = slice(cu[i], cu[i + 1]), slice(cu_k[i], cu_k[i + 1])
        want[sq] = flash_ref(qkv[None, sq, 0], kv[None, sk, 0], kv[None, sk, 1], causal=True)[0]
    assert_close(o, want, "varlen kvpacked")


def test_torch_gradient_lands_in_the_packed_buffer(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    b, s, h, d = 2, 9, 2, 16
    base = torch.from_numpy(randn(rng, b, s, 3, h, d))
    do = torch.from_numpy(randn(rng, b, s, h, d))
    qkv = base.clone().requires_grad_()
    sa.flash_attn_qkvpacked_func(qkv, causal=True).backward(do)
    q, k, v = (base[:, :, i].clone().requires_grad_() for i in range(3))
    sa.flash_attn_func(q, k, v, causal=True).backward(do)
    want = torch.stack([q.grad, k.grad, v.grad], dim=2)
    assert torch.equal(qkv.grad, want)
    assert qkv.grad.abs().sum() > 0


def test_packed_buffers_of_the_wrong_shape_are_refused(rng):
    with pytest.raises(ValueError, match=r"qkv must have shape \[b, s, 3, h, d\]"):
        sa.flash_attn_qkvpacked_func(randn(rng, 2, 5, 2, 4, 8))
    with pytest.raises(ValueError, match=r"kv must have shape \[b, s, 2, h, d\]"):
        sa.flash_attn_kvpacked_func(randn(rng, 2, 5, 4, 8), randn(rng, 2, 5, 4, 8))
    with pytest.raises(ValueError, match=r"qkv must have shape \[total, 3, h, d\]"):
        sa.flash_attn_varlen_qkvpacked_func(randn(rng, 5, 3, 4, 8, 1), [0, 5], 5)


# ----------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_with_kvcache_matches_the_definition(rng, paged, causal):
    # Per sequence n: k, v appended after cache_seqlens[n] cached tokens, then q attends to
    # the first cache_seqlens[n] + s_new keys (causal: bottom-right), as flash_attn_func on
    # them; the caches hold the new tokens afterwards.
    b, s_q, s_new, h, h_kv, d, s_max, page = 3, 2, 2, 4, 2, 16, 12, 4
    lens = np.array([5, 0, 9], np.int32)
    q = randn(rng, b, s_q, h, d)
    k_new, v_new = randn(rng, b, s_new, h_kv, d), randn(rng, b, s_new, h_kv, d)
    k_full, v_full = randn(rng, b, s_max, h_kv, d), randn(rng, b, s_max, h_kv, d)
    if paged:  # each sequence's pages shuffled over the pool
        per = s_max // page
        order = rng.permutation(b * per).astype(np.int32)
        table = order.reshape(b, per)
        k_cache = np.empty((b * per, page, h_kv, d), np.float32)
        v_cache = np.empty_like(k_cache)
        for n in range(b):
            for j in range(per):
                k_cache[table[n, j]] = k_full[n, j * page : (j + 1) * page]
                v_cache[table[n, j]] = v_full[n, j * page : (j + 1) * page]
    else:
        table, k_cache, v_cache = None, k_full.copy(), v_full.copy()
    o, lse = sa.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, block_table=table,
        causal=causal, return_softmax_lse=True,
    )  # fmt: skip
    assert lse.shape == (b, h, s_q)
    for n in range(b):
        L = int(lens[n]) + s_new
        keys = np.concatenate([k_full[n, : lens[n]], k_new[n]])[None]
        vals = np.concatenate([v_full[n, : lens[n]], v_new[n]])[None]
        want = flash_ref(q[n : n + 1], keys, vals, causal=causal)
        assert_close(o[n : n + 1], want, f"sequence {n}")
        row = lambda c, t: (  # noqa: E731  (token t of sequence n in cache c)
            c[table[n, t // page], t % page] if paged else c[n, t]
        )
        for t in range(int(lens[n]), L):
            np.testing.assert_array_equal(row(k_cache, t), k_new[n, t - lens[n]])
            np.testing.assert_array_equal(row(v_cache, t), v_new[n, t - lens[n]])


def test_flash_attn_with_kvcache_full_caches_and_refusals(rng):
    b, s, h, d = 2, 6, 2, 8
    q, kc, vc = randn(rng, b, 1, h, d), randn(rng, b, s, h, d), randn(rng, b, s, h, d)
    o = sa.flash_attn_with_kvcache(q, kc, vc, causal=True)  # cache_seqlens None: all s tokens
    assert_close(o, flash_ref(q, kc, vc, causal=True), "full caches")
    for kw, name in (
        (dict(rotary_cos=kc), "rotary_cos"),
        (dict(cache_batch_idx=np.arange(b, dtype=np.int32)), "cache_batch_idx"),
        (dict(cache_leftpad=np.zeros(b, np.int32)), "cache_leftpad"),
        (dict(softcap=5.0), "softcap"),
        (dict(alibi_slopes=np.ones(h, np.float32)), "alibi_slopes"),
    ):
        with pytest.raises(NotImplementedError, match=name):
            sa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=[3, 3], **kw)
