"""The one mask vocabulary (canonical none, causal, causal_bottom_right and their aliases)
across attention, attention_backward and explain, and the error messages for bad input:
arrays described by shape and dtype (never their contents), the hint when sequence lengths
look like cumulative cu_seqlens, and the note about SDPA's [b, h, s, d] layout."""

import numpy as np
import pytest

import strideattn as sa
from npref import attention_ref, check

# s_q != s_kv, so that top-left and bottom-right causal masks see different keys
B, SQ, SKV, H, D = 2, 7, 12, 2, 16

SPELLINGS = {
    "none": ["none", "no_mask", "no-mask"],
    "causal": ["causal", "top_left", "causal_top_left", "causal-top-left", "top-left"],
    "causal_bottom_right": [
        "causal_bottom_right",
        "causal-bottom-right",
        "bottom_right",
        "bottom-right",
    ],
}


def _qkv(rng, dtype=np.float32):
    return (
        rng.standard_normal((B, SQ, H, D)).astype(dtype),
        rng.standard_normal((B, SKV, H, D)).astype(dtype),
        rng.standard_normal((B, SKV, H, D)).astype(dtype),
    )


def test_canonical_names():
    assert sa.MASKS == ("none", "causal", "causal_bottom_right")
    assert sa.MASK_ALIASES == {
        "no_mask": "none",
        "top_left": "causal",
        "causal_top_left": "causal",
        "bottom_right": "causal_bottom_right",
    }


@pytest.mark.parametrize("canonical", list(SPELLINGS))
def test_every_spelling_means_its_mask(rng, seed, canonical):
    q, k, v = _qkv(rng)
    exact = attention_ref(q, k, v, mask=canonical)
    naive = attention_ref(q, k, v, mask=canonical, lowp=np.float32)
    others = [attention_ref(q, k, v, mask=m)["o"] for m in SPELLINGS if m != canonical]
    for spelling in SPELLINGS[canonical]:
        o = sa.attention(q, k, v, mask=spelling, backend="reference")
        check(f"o ({spelling})", o, exact["o"], naive["o"], np.float32, seed)
        for other in others:  # the three masks really differ here, so a wrong alias shows
            assert np.abs(o - other).max() > 1e-2, f"{spelling} gave another mask's output"


def test_aliases_in_backward_and_explain(rng):
    q, k, v = _qkv(rng)
    o, lse = sa.attention(q, k, v, mask="bottom_right", return_lse=True, backend="cpu")
    do = rng.standard_normal(o.shape).astype(np.float32)
    want = sa.attention_backward(q, k, v, o, do, lse, mask="causal_bottom_right", backend="cpu")
    got = sa.attention_backward(q, k, v, o, do, lse, mask="bottom_right", backend="cpu")
    top = sa.attention_backward(q, k, v, o, do, lse, mask="top_left", backend="cpu")
    for a, b, c in zip(want, got, top):
        np.testing.assert_array_equal(a, b)
    assert any(np.abs(a - c).max() > 1e-3 for a, c in zip(want, top))
    for spelling in ("no_mask", "causal_top_left", "bottom-right"):
        ex = sa.explain(q, k, v, mask=spelling)
        assert ex["valid"], ex["error"]
        assert sa.explain(q, k, v, mask=spelling, grad=True)["valid"]


def test_unknown_mask_lists_the_vocabulary(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError) as e:
        sa.attention(q, k, v, mask="bottom_left")
    msg = str(e.value)
    assert "mask='bottom_left' is not a mask" in msg
    for name in (
        "none",
        "causal",
        "causal_bottom_right",
        "no_mask",
        "top_left",
        "causal_top_left",
        "bottom_right",
    ):
        assert name in msg
    with pytest.raises(ValueError, match="mask='top_left ish' is not a mask"):
        sa.explain(q, k, v, mask="top_left ish")


def test_an_array_as_mask_is_described_not_printed(rng):
    # A boolean mask array passed as `mask` used to print every element in the message.
    q, k, v = _qkv(rng)
    big = np.zeros((B, 1, SQ, SKV), bool)
    big[0, 0, 3, 5] = True
    for fn in (
        lambda: sa.attention(q, k, v, mask=big),
        lambda: sa.explain(q, k, v, mask=big),
        lambda: sa.attention(q, k, v, window=big),
        lambda: sa.attention(q, k, v, backend=big),
    ):
        with pytest.raises(ValueError) as e:
            fn()
        msg = str(e.value)
        assert "numpy.ndarray of shape (2, 1, 7, 12) and dtype bool" in msg, msg
        assert "False" not in msg and "[[" not in msg and len(msg) < 400, msg
    with pytest.raises(ValueError) as e:
        sa.attention(q[0], q[0], q[0], seqlens_q=np.zeros((2, 3), np.int32), seqlens_kv=[1])
    assert "shape (2, 3) and dtype int32" in str(e.value) and "[[" not in str(e.value)


def test_cu_seqlens_passed_as_lengths_gets_a_hint(rng):
    t = rng.standard_normal((12, 2, 16)).astype(np.float16)
    cu = np.array([0, 5, 12], np.int32)
    with pytest.raises(
        ValueError, match=r"hint: seqlens_q and seqlens_kv start at 0 .*cumulative cu_seqlens"
    ):
        sa.attention(t, t, t, seqlens_q=cu, seqlens_kv=cu)
    # real lengths whose error has another cause get no such hint
    with pytest.raises(ValueError) as e:
        sa.attention(t, t, t, seqlens_q=[7, 6], seqlens_kv=[5, 7])
    assert "hint" not in str(e.value)


def test_sdpa_layout_mistake_is_named_in_shape_errors(rng):
    # SDPA's [b, h, s, d] cross-attention tensors read as [b, s, h, d]: 6 "heads" vs 9
    q = rng.standard_normal((1, 4, 6, 16)).astype(np.float16)
    k = rng.standard_normal((1, 4, 9, 16)).astype(np.float16)
    with pytest.raises(ValueError, match=r"\[batch, seq, heads, head_dim\].*strideattn\.sdpa"):
        sa.attention(q, k, k)
