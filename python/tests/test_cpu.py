"""CPU tests of the Python package on numpy arrays (run in CI by scripts/test): the seed case
as views of one fused buffer, odd views, GQA, masks and windows, varlen, backward, bad input.
Every result is compared with the fp64 numpy reference in npref.py (independent of the
library) under the correctness rule of docs/semantics.md; outputs are poisoned views inside
guard bands."""

import subprocess
import sys

import numpy as np
import pytest

import strideattn as sa
from npref import attention_ref, backward_targets, check, grad_magnitude

BACKENDS = ["auto", "reference", "cpu"]


def randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


class Guarded:
    """A NaN-poisoned buffer and a view into it: after a call every element of the view must
    be written (no NaN) and every element outside it untouched (still NaN)."""

    def __init__(self, phys_shape, dtype, select):
        self.buf = np.full(phys_shape, np.nan, dtype)
        self.view = select(self.buf)
        inside = np.zeros(phys_shape, bool)
        select(inside)[...] = True
        self.inside = inside

    def check(self, name, allow_nan_inside=False):
        assert np.isnan(self.buf[~self.inside]).all(), f"{name}: wrote outside its view"
        if not allow_nan_inside:
            assert not np.isnan(self.buf[self.inside]).any(), f"{name}: elements left unwritten"


def run_and_check(q, k, v, *, backend, seed, out=None, do=None, dgrads=None, **opts):
    """Forward (and backward with do) through strideattn vs the numpy reference."""
    dtype = q.dtype
    o, lse = sa.attention(q, k, v, backend=backend, return_lse=True, out=out, **opts)
    if out is not None:
        assert o is out
    ref_opts = {kk: vv for kk, vv in opts.items()}
    exact = attention_ref(q, k, v, **ref_opts)
    naive = attention_ref(q, k, v, lowp=dtype, **ref_opts)
    check("o", o, exact["o"], naive["o"], dtype, seed)
    check("lse", lse, exact["lse"], naive["lse"], dtype, seed, lse=True)
    if do is None:
        return o, lse
    dq, dk, dv = sa.attention_backward(
        q, k, v, o, do, lse, backend=backend, **(dgrads or {}), **opts
    )
    exact, naive = backward_targets(q, k, v, o, do, dtype, **ref_opts)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        check(name, got, exact[name], naive[name], dtype, seed, magnitude=grad_magnitude(exact))
    return o, lse, (dq, dk, dv)


# ----------------------------------------------------------------------------- seed case


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_seed_fused_buffer(rng, seed, backend, mask):
    # The failure strideattn exists for: Q, K, V are views of one [s, b, h + 2hg, d] buffer
    # (h=16, hg=1, d=64), passed straight in. Strides: (1152, 2304, 64, 1) for b=2.
    s, b, h, hg, d = 40, 2, 16, 1, 64
    buf = randn(rng, (s, b, h + 2 * hg, d), np.float16)
    q = buf[:, :, :h].transpose(1, 0, 2, 3)
    k = buf[:, :, h : h + hg].transpose(1, 0, 2, 3)
    v = buf[:, :, h + hg :].transpose(1, 0, 2, 3)
    assert q.strides == (1152 * 2, 2304 * 2, 128, 2) and np.shares_memory(q, buf)
    out = Guarded((s, b, h, d + 8), np.float16, lambda x: x[..., :d].transpose(1, 0, 2, 3))
    run_and_check(q, k, v, backend=backend, seed=seed, out=out.view, mask=mask)
    out.check("o")


def test_seed_output_follows_input_layout(rng, seed):
    s, b, h, hg, d = 24, 2, 16, 1, 64
    buf = randn(rng, (s, b, h + 2 * hg, d), np.float16)
    q, k, v = (buf[:, :, :h], buf[:, :, h : h + hg], buf[:, :, h + hg :])
    q, k, v = (x.transpose(1, 0, 2, 3) for x in (q, k, v))
    o = sa.attention(q, k, v, mask="causal")
    assert o.shape == (b, s, h, d) and o.dtype == np.float16
    # allocated in q's dimension order (s outermost), dense
    assert o.transpose(1, 0, 2, 3).flags.c_contiguous
    exact = attention_ref(q, k, v, mask="causal")
    naive = attention_ref(q, k, v, mask="causal", lowp=np.float16)
    check("o", o, exact["o"], naive["o"], np.float16, seed)


def test_seed_backward_into_fused_grad_buffer(rng, seed):
    # Gradients written straight into views of one fused gradient buffer (plus a guard slot).
    s, b, h, hg, d = 32, 2, 16, 1, 64
    buf = randn(rng, (s, b, h + 2 * hg, d), np.float16)
    q, k, v = (buf[:, :, :h], buf[:, :, h : h + hg], buf[:, :, h + hg :])
    q, k, v = (x.transpose(1, 0, 2, 3) for x in (q, k, v))
    do = randn(rng, (s, b, h, d), np.float16).transpose(1, 0, 2, 3)
    gbuf = np.full((s, b, h + 2 * hg + 1, d), np.nan, np.float16)
    dq = gbuf[:, :, :h].transpose(1, 0, 2, 3)
    dk = gbuf[:, :, h : h + hg].transpose(1, 0, 2, 3)
    dv = gbuf[:, :, h + hg : h + 2 * hg].transpose(1, 0, 2, 3)
    _, _, grads = run_and_check(
        q, k, v, backend="auto", seed=seed, do=do, mask="causal", dgrads=dict(dq=dq, dk=dk, dv=dv)
    )
    assert grads[0] is dq and grads[1] is dk and grads[2] is dv
    assert not np.isnan(gbuf[:, :, : h + 2 * hg]).any(), "gradient elements left unwritten"
    assert np.isnan(gbuf[:, :, h + 2 * hg]).all(), "guard slot of the gradient buffer written"


# ----------------------------------------------------------------------------- odd views


def _views(kind, rng, b, s, h, hg, d, dtype):
    """q, k, v in one of the layouts that classifiers get wrong."""
    if kind == "bhsd_transposed":
        mk = lambda heads: randn(rng, (b, heads, s, d), dtype).transpose(0, 2, 1, 3)
    elif kind == "sbhd_as_bshd":
        mk = lambda heads: randn(rng, (s, b, heads, d), dtype).transpose(1, 0, 2, 3)
    elif kind == "padded_head_dim":
        mk = lambda heads: randn(rng, (b, s, heads, d + 64), dtype)[..., :d]
    elif kind == "odd_offset":

        def mk(heads):
            n = b * s * heads * d
            flat = randn(rng, n + 3, dtype)
            return flat[3:].reshape(b, s, heads, d)
    elif kind == "garbage_size1_strides":

        def mk(heads):
            x = randn(rng, (s, heads, d), dtype)
            st = x.strides
            # batch extent 1 and (for hg=1) head extent 1 carry meaningless strides
            hs = st[1] if heads > 1 else 7777 * x.itemsize
            return np.lib.stride_tricks.as_strided(
                x, (1, s, heads, d), (123457 * x.itemsize, st[0], hs, st[2])
            )
    elif kind == "broadcast_batch":

        def mk(heads):
            x = randn(rng, (1, s, heads, d), dtype)
            return np.broadcast_to(x, (b, s, heads, d))  # zero batch stride, read-only
    else:
        raise AssertionError(kind)
    return mk(h), mk(hg), mk(hg)


@pytest.mark.parametrize(
    "kind",
    [
        "bhsd_transposed",
        "sbhd_as_bshd",
        "padded_head_dim",
        "odd_offset",
        "garbage_size1_strides",
        "broadcast_batch",
    ],
)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_odd_views(rng, seed, kind, dtype):
    b, s, h, hg, d = 2, 19, 4, 1, 32
    q, k, v = _views(kind, rng, b, s, h, hg, d, dtype)
    b = q.shape[0]
    # the output is an odd view too: bhsd memory read as bshd, with a padded head dim
    out = Guarded((b, h, s, d + 3), dtype, lambda x: x[..., :d].transpose(0, 2, 1, 3))
    do = randn(rng, (b, s, h, d), dtype)
    run_and_check(q, k, v, backend="auto", seed=seed, out=out.view, do=do, mask="causal")
    out.check("o")


# ----------------------------------------------------------------------------- GQA, masks


@pytest.mark.parametrize("s_q,s_kv", [(13, 29), (29, 13)])
@pytest.mark.parametrize("mask", ["none", "causal", "causal-bottom-right"])
@pytest.mark.parametrize("window", [None, (4, 0), (3, 2)])
def test_gqa_masks_windows(rng, seed, s_q, s_kv, mask, window):
    b, h, hg, d_qk, d_v = 2, 8, 2, 24, 16
    q = randn(rng, (b, s_q, h, d_qk), np.float32)
    k = randn(rng, (b, s_kv, hg, d_qk), np.float32)
    v = randn(rng, (b, s_kv, hg, d_v), np.float32)
    do = randn(rng, (b, s_q, h, d_v), np.float32)
    run_and_check(q, k, v, backend="cpu", seed=seed, do=do, mask=mask, window=window, scale=0.3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_that_see_nothing(rng, seed, backend):
    # bottom-right causal with s_q > s_kv: the first s_q - s_kv queries see no key.
    b, s_q, s_kv, h, d = 1, 12, 5, 2, 16
    q = randn(rng, (b, s_q, h, d), np.float16)
    k = randn(rng, (b, s_kv, h, d), np.float16)
    v = randn(rng, (b, s_kv, h, d), np.float16)
    o, lse = run_and_check(q, k, v, backend=backend, seed=seed, mask="causal-bottom-right")
    empty = s_q - s_kv
    assert (o[:, :empty] == 0).all() and np.isneginf(lse[:, :, :empty]).all()
    assert np.isfinite(lse[:, :, empty:]).all()


# ----------------------------------------------------------------------------- varlen


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_varlen_with_padding(rng, seed, backend, rank, mask):
    seqlens_q, seqlens_kv = [5, 0, 17, 9], [7, 3, 0, 12]
    offsets_q, offsets_kv = [0, 8, 10, 30], [2, 9, 12, 14]  # gaps between sequences
    t_q, t_kv, h, hg, d = 41, 30, 4, 2, 32
    # q/k/v: thd views of one fused token buffer [t, h + 2hg, d] (t_q == t_kv not needed:
    # separate buffers for q and kv)
    q = randn(rng, (t_q, h, d), np.float16)
    kv = randn(rng, (t_kv, 2 * hg, d), np.float16)
    k, v = kv[:, :hg], kv[:, hg:]
    do = randn(rng, (t_q, h, d), np.float16)
    out = Guarded((t_q, h, d + 5), np.float16, lambda x: x[..., :d])
    opts = dict(
        seqlens_q=seqlens_q,
        seqlens_kv=seqlens_kv,
        offsets_q=offsets_q,
        offsets_kv=offsets_kv,
        mask=mask,
    )
    exact = attention_ref(q, k, v, **opts)
    naive = attention_ref(q, k, v, lowp=np.float16, **opts)
    lift = (lambda x: x[None]) if rank == 4 else (lambda x: x)
    o, lse = sa.attention(
        lift(q), lift(k), lift(v), out=lift(out.view), return_lse=True, backend=backend, **opts
    )
    out.check("o")
    assert lse.shape == (h, t_q)
    o = o[0] if rank == 4 else o
    check("o", o, exact["o"], naive["o"], np.float16, seed)
    check("lse", lse, exact["lse"], naive["lse"], np.float16, seed, lse=True)
    covered = np.zeros(t_q, bool)
    for off, n in zip(offsets_q, seqlens_q):
        covered[off : off + n] = True
    assert (o[~covered] == 0).all(), "padding tokens of O must be 0"
    assert np.isneginf(lse[:, ~covered]).all(), "padding tokens of LSE must be -inf"
    # sequence 1 has 0 queries; sequence 2 has 17 queries and 0 keys: O = 0, LSE = -inf
    assert (o[10:27] == 0).all() and np.isneginf(lse[:, 10:27]).all()
    dq, dk, dv = sa.attention_backward(
        lift(q), lift(k), lift(v), lift(o), lift(do), lse, backend=backend, **opts
    )
    dq, dk, dv = (x[0] if rank == 4 else x for x in (dq, dk, dv))
    exact, naive = backward_targets(q, k, v, o, do, np.float16, **opts)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        check(
            name, got, exact[name], naive[name], np.float16, seed, magnitude=grad_magnitude(exact)
        )


# ----------------------------------------------------------------------------- backward


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "mask,window", [("none", None), ("causal", None), ("causal-bottom-right", (5, 1))]
)
def test_backward_gqa(rng, seed, backend, mask, window):
    b, s_q, s_kv, h, hg, d = 2, 17, 23, 6, 3, 32
    q = randn(rng, (b, s_q, h, d), np.float16)
    k = randn(rng, (b, s_kv, hg, d), np.float16)
    v = randn(rng, (b, s_kv, hg, d), np.float16)
    do = randn(rng, (s_q, b, h, d), np.float16).transpose(1, 0, 2, 3)  # non-contiguous dO
    dq = Guarded((b, h, s_q, d), np.float16, lambda x: x.transpose(0, 2, 1, 3))
    run_and_check(
        q,
        k,
        v,
        backend=backend,
        seed=seed,
        do=do,
        mask=mask,
        window=window,
        dgrads=dict(dq=dq.view),
    )
    dq.check("dq")


def test_deterministic_backward_is_bitwise_reproducible(rng, seed):
    b, s, h, hg, d = 2, 37, 8, 2, 32
    q = randn(rng, (b, s, h, d), np.float16)
    k = randn(rng, (b, s, hg, d), np.float16)
    v = randn(rng, (b, s, hg, d), np.float16)
    do = randn(rng, (b, s, h, d), np.float16)
    o, lse = sa.attention(q, k, v, mask="causal", return_lse=True)
    runs = [
        sa.attention_backward(q, k, v, o, do, lse, mask="causal", deterministic=True)
        for _ in range(2)
    ]
    for a, c in zip(*runs):
        assert a.tobytes() == c.tobytes()


# ----------------------------------------------------------------------------- bad input


def _qkv(rng, q_shape=(1, 8, 4, 16), k_shape=(1, 8, 2, 16), dtype=np.float16):
    return randn(rng, q_shape, dtype), randn(rng, k_shape, dtype), randn(rng, k_shape, dtype)


def test_bad_head_dim_mismatch(rng):
    q, k, v = _qkv(rng, k_shape=(1, 8, 2, 8))
    with pytest.raises(ValueError, match=r"(?s)(8.*16|16.*8)"):
        sa.attention(q, k, v)


def test_bad_heads_not_multiple(rng):
    q, k, v = _qkv(rng, q_shape=(1, 8, 6, 16), k_shape=(1, 8, 4, 16))
    with pytest.raises(ValueError, match=r"(?s)6.*4"):
        sa.attention(q, k, v)


def test_bad_head_dim_stride(rng):
    q, k, v = _qkv(rng)
    q = randn(rng, (1, 8, 4, 32), np.float16)[..., ::2]
    with pytest.raises(ValueError, match=r"(?i)head.dim stride"):
        sa.attention(q, k, v)


def test_bad_dtypes(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match="float64"):
        sa.attention(q.astype(np.float64), k, v)
    with pytest.raises(ValueError, match=r"(?i)dtype"):
        sa.attention(q, k.astype(np.float32), v)


def test_bad_options(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match="mask='diagonal'"):
        sa.attention(q, k, v, mask="diagonal")
    with pytest.raises(ValueError, match="backend='fast'"):
        sa.attention(q, k, v, backend="fast")
    with pytest.raises(ValueError, match=r"window left is -3"):
        sa.attention(q, k, v, window=(-3, 0))
    with pytest.raises(ValueError, match="dimensions"):
        sa.attention(q[0, 0], k[0, 0], v[0, 0])


def test_bad_varlen(rng):
    q, k, v = (randn(rng, (10, 2, 16), np.float16) for _ in range(3))
    with pytest.raises(ValueError, match="seqlens"):
        sa.attention(q, k, v, seqlens_q=[4, 3], seqlens_kv=[4])
    with pytest.raises(ValueError, match=r"(?i)token"):
        sa.attention(q, k, v, seqlens_q=[6, 6], seqlens_kv=[5, 5])


def test_bad_outputs(rng):
    q, k, v = _qkv(rng)
    ro = np.zeros((1, 8, 4, 16), np.float16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        sa.attention(q, k, v, out=ro)
    with pytest.raises(ValueError, match="overlap"):
        sa.attention(q, k, v, out=q)  # output aliasing an input


def test_bad_integers_and_scale_give_value_errors(rng):
    # Out-of-int64 windows/seqlens used to reach nanobind and come back as a multi-line
    # "could not be read through DLPack" message; a huge int scale raised OverflowError;
    # float seqlens were silently truncated; numpy integer windows were refused.
    q, k, v = _qkv(rng)
    with pytest.raises(
        ValueError,
        match=r"window left is 1180591620717411303424; supported: a value that fits in int64",
    ):
        sa.attention(q, k, v, window=(2**70, 0))
    with pytest.raises(ValueError, match=r"window right must be an integer, got 1\.5"):
        sa.attention(q, k, v, window=(0, 1.5))
    with pytest.raises(ValueError, match=r"scale must be a finite number"):
        sa.attention(q, k, v, scale=10**400)
    with pytest.raises(TypeError, match=r"scale must be a real number \(int or float\), got str"):
        sa.attention(q, k, v, scale="x")
    t = randn(rng, (8, 4, 16), np.float16)
    with pytest.raises(ValueError, match=r"seqlens_q\[0\] is 1180591620717411303424"):
        sa.attention(t, t[:, :2], t[:, :2], seqlens_q=[2**70], seqlens_kv=[8])
    with pytest.raises(ValueError, match=r"seqlens_q\[0\] must be an integer, got 4\.7"):
        sa.attention(t, t[:, :2], t[:, :2], seqlens_q=[4.7, 3.2], seqlens_kv=[4, 4])
    # the library caps windows at 2^62 (int64 mask arithmetic); a clear ValueError
    with pytest.raises(ValueError, match=r"window right is 9223372036854775807"):
        sa.attention(q, k, v, window=(-1, 2**63 - 1))
    o = sa.attention(q, k, v, window=(np.int64(2), np.int32(0)))
    np.testing.assert_array_equal(o, sa.attention(q, k, v, window=(2, 0)))


def test_explain_rejects_wrong_rank(rng):
    # explain(grad=True) on 2-d arrays used to raise IndexError
    x = randn(rng, (2, 16), np.float16)
    for grad in (False, True):
        with pytest.raises(ValueError, match="dimensions"):
            sa.explain(x, x, x, grad=grad)


def test_misaligned_array_is_refused(rng):
    # an f16 array at an odd byte address was accepted and read through uint16_t pointers
    raw = np.frombuffer(bytearray(1 + 2 * 8 * 4 * 16), dtype=np.float16, offset=1).reshape(
        1, 8, 4, 16
    )
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match=r"q: data pointer is 1 bytes past a 2-byte boundary"):
        sa.attention(raw, k, v)


def test_unsupported_backend_on_host(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(sa.UnsupportedError) as e:
        sa.attention(q, k, v, backend="cuda")
    assert isinstance(e.value, NotImplementedError) and "cuda" in str(e.value)


def test_backward_needs_lse_shape(rng):
    q, k, v = _qkv(rng)
    o, lse = sa.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="lse"):
        sa.attention_backward(q, k, v, o, o, lse[:, :, :4])


# ----------------------------------------------------------------------------- explain etc.


def test_explain(rng):
    buf = randn(rng, (16, 2, 18, 64), np.float16)
    q, k, v = (x.transpose(1, 0, 2, 3) for x in (buf[:, :, :16], buf[:, :, 16:17], buf[:, :, 17:]))
    ex = sa.explain(q, k, v, mask="causal")
    assert ex["valid"] and ex["error"] is None and ex["chosen"] == "cpu"
    assert [x["backend"] for x in ex["verdicts"]][:2] == ["cpu", "reference"]
    assert {x["backend"] for x in ex["verdicts"]} == {"cpu", "reference", "cuda", "cudnn"}
    for x in ex["verdicts"]:
        assert x["supported"] or (x["rule"] and x["reason"])
    assert isinstance(ex["layout"], str) and ex["layout"]
    exb = sa.explain(q, k, v, mask="causal", grad=True)
    assert exb["valid"] and exb["chosen"] in ("cpu", "reference")
    bad = sa.explain(q, k[..., :32], v)
    assert not bad["valid"] and bad["code"] == "invalid_argument" and bad["error"]


def test_version_and_backends():
    assert sa.version() == sa.__version__
    assert {"reference", "cpu"} <= set(sa.compiled_backends())


def test_import_does_not_import_torch():
    code = "import sys, strideattn; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_readme_cpu_quick_start():
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README.md lost its quick-start block"
    exec(compile(blocks[0], "README.md (numpy quick start)", "exec"), {})
