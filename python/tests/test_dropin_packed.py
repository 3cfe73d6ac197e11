"""FlashAttention 2's packed drop-ins (flash_attn_qkvpacked_func, flash_attn_kvpacked_func and
their varlen forms) against the definition written out in test_dropin.py (numpy fp64, a
bottom-right causal mask and window), on fresh random buffers whose q, k, v are read as
views; bit for bit equal to the unpacked function on the same views; with PyTorch, the
gradient lands in the packed buffer's .grad as the unpacked function's gradients, stacked;
a buffer of the wrong shape is refused by name."""

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
