"""Input checks at the Python edge (strideattn/_checks.py): scale accepts only real numbers;
numpy arrays nanobind cannot take (big-endian, object dtype, read-only outputs) get a message
naming the argument, its shape and dtype (never its contents); explain() reports them as an
invalid problem instead of raising; scale outside the normal fp32 range is refused."""

import re

import numpy as np
import pytest

import strideattn as sa


def _qkv(rng, dtype=np.float32):
    return tuple(rng.standard_normal((1, 8, 2, 16)).astype(dtype) for _ in range(3))


@pytest.mark.parametrize(
    "bad, kind",
    [
        ("0.5", "str"),
        (True, "bool"),
        (np.bool_(True), "bool"),
        (np.array([0.5]), r"ndarray of shape \(1,\), dtype float64"),
        (np.array(0.5), r"ndarray of shape \(\), dtype float64"),
        ([0.5], "list"),
        (None.__class__, "type"),
        (1 + 2j, "complex"),
    ],
)
def test_scale_must_be_a_real_number(rng, bad, kind):
    q, k, v = _qkv(rng)
    with pytest.raises(
        TypeError, match=rf"scale must be a real number \(int or float\), got {kind}"
    ):
        sa.attention(q, k, v, scale=bad)
    with pytest.raises(TypeError, match=r"scale must be a real number"):
        sa.explain(q, k, v, scale=bad)


def test_scale_real_numbers_accepted(rng):
    q, k, v = _qkv(rng)
    want = sa.attention(q, k, v, scale=0.5, backend="reference")
    for ok in (0.5, np.float32(0.5), np.float64(0.5), np.float16(0.5)):
        np.testing.assert_array_equal(sa.attention(q, k, v, scale=ok, backend="reference"), want)
    want = sa.attention(q, k, v, scale=2.0, backend="reference")
    for ok in (2, np.int64(2), np.int8(2), np.uint16(2)):
        np.testing.assert_array_equal(sa.attention(q, k, v, scale=ok, backend="reference"), want)


@pytest.mark.parametrize(
    "bad, shown",
    [
        (1e39, "1e+39"),
        (1e-39, "1e-39"),
        (-1.0, "-1"),
        (0.0, "0"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
    ],
)
def test_scale_outside_normal_fp32_is_refused(rng, bad, shown):
    q, k, v = _qkv(rng)
    with pytest.raises(
        ValueError,
        match=rf"scale is {re.escape(shown)}; supported: a finite value > 0 that is a normal fp32",
    ):
        sa.attention(q, k, v, scale=bad)
    ex = sa.explain(q, k, v, scale=bad)
    assert ex["valid"] is False and f"scale is {shown}" in ex["error"]


def test_big_endian_input(rng):
    q, k, v = _qkv(rng)
    kb = k.astype(">f4")
    kb[...] = 12345.678
    with pytest.raises(
        ValueError,
        match=r"k: byte order big-endian \(shape \(1, 8, 2, 16\), dtype >f4\); "
        r"supported: the machine's native byte order",
    ) as e:
        sa.attention(q, kb, v)
    assert "12345" not in str(e.value)
    ex = sa.explain(q, kb, v)
    assert ex["valid"] is False and ex["code"] == "invalid_argument"
    assert ex["error"].startswith("k: byte order big-endian") and "12345" not in ex["error"]


def test_object_array(rng):
    q, k, v = _qkv(rng)
    vo = np.empty(v.shape, object)
    vo[...] = 12345.678
    with pytest.raises(
        TypeError,
        match=r"v: dtype object \(shape \(1, 8, 2, 16\), dtype object\); "
        r"supported: float16, bfloat16, float32",
    ) as e:
        sa.attention(q, k, vo)
    assert "12345" not in str(e.value)
    ex = sa.explain(q, k, vo)
    assert ex["valid"] is False and ex["error"].startswith("v: dtype object")


def test_read_only_output(rng):
    q, k, v = _qkv(rng)
    ro = np.zeros_like(q)
    ro.flags.writeable = False
    with pytest.raises(
        ValueError, match=r"out is a read-only numpy array \(shape \(1, 8, 2, 16\), dtype float32\)"
    ):
        sa.attention(q, k, v, out=ro)
    ex = sa.explain(q, k, v, out=ro)
    assert ex["valid"] is False and ex["error"].startswith("out is a read-only numpy array")
    # A read-only input is fine.
    qr = q.copy()
    qr.flags.writeable = False
    np.testing.assert_array_equal(
        sa.attention(qr, k, v, backend="reference"), sa.attention(q, k, v, backend="reference")
    )
    assert sa.explain(qr, k, v)["valid"] is True


def test_messages_about_arrays_show_shape_not_contents(rng):
    q, k, v = _qkv(rng)
    t = rng.standard_normal((8, 2, 16)).astype(np.float32)
    secret = np.full((2, 2), 12345, np.int64)
    with pytest.raises(
        ValueError,
        match=r"seqlens_q must be one-dimensional, got .*ndarray of shape \(2, 2\)"
        r".*dtype int64",
    ) as e:
        sa.attention(t, t, t, seqlens_q=secret, seqlens_kv=[4, 4])
    assert "12345" not in str(e.value)
    with pytest.raises(
        ValueError, match=r"window must be \(left, right\).*got .*ndarray of shape \(3,\)"
    ) as e:
        sa.attention(q, k, v, window=np.array([12345, 12345, 12345]))
    assert "12345" not in str(e.value)


def test_zero_heads_gives_empty_outputs(rng):
    q = np.zeros((2, 5, 0, 16), np.float32)
    for backend in ("auto", "reference", "cpu"):
        o = sa.attention(q, q, q, backend=backend)
        assert o.shape == (2, 5, 0, 16)
        o, lse = sa.attention(q, q, q, backend=backend, return_lse=True)
        assert o.shape == (2, 5, 0, 16) and lse.shape == (2, 0, 5)


@pytest.mark.parametrize("backend", ["reference", "cpu", "auto"])
@pytest.mark.parametrize("flip", [np.s_[::-1], np.s_[:, ::-1], np.s_[:, :, ::-1], np.s_[..., ::-1]])
def test_reversed_numpy_views(rng, backend, flip):
    # numpy's x[:, ::-1] is a view with a negative stride: inputs, outputs and gradients
    # through such views match the same backend on contiguous copies.
    q, k, v, do = (rng.standard_normal((2, 6, 4, 16)).astype(np.float32) for _ in range(4))

    def reversed_copy(x):
        r = np.ascontiguousarray(x[flip])[flip]
        assert min(r.strides) < 0 and np.array_equal(r, x, equal_nan=True)
        return r

    want, want_lse = sa.attention(q, k, v, mask="causal", backend=backend, return_lse=True)
    out = reversed_copy(np.full_like(q, np.nan))
    got, lse = sa.attention(
        reversed_copy(q),
        reversed_copy(k),
        reversed_copy(v),
        mask="causal",
        backend=backend,
        out=out,
        return_lse=True,
    )
    assert got is out or np.shares_memory(got, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-6)
    gw = sa.attention_backward(q, k, v, want, do, want_lse, mask="causal", backend=backend)
    gr = sa.attention_backward(
        reversed_copy(q),
        reversed_copy(k),
        reversed_copy(v),
        reversed_copy(want),
        reversed_copy(do),
        want_lse,
        mask="causal",
        backend=backend,
    )
    for a, b in zip(gr, gw):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_torch_scale_must_be_a_real_number():
    torch = pytest.importorskip("torch")
    import strideattn.torch as sat

    q = torch.zeros((1, 4, 2, 16))
    for bad, kind in (("0.5", "str"), (True, "bool"), (torch.tensor([0.5]), "Tensor of shape")):
        with pytest.raises(
            TypeError, match=rf"scale must be a real number \(int or float\), got {kind}"
        ):
            sat.attention(q, q, q, scale=bad, backend="cpu")
