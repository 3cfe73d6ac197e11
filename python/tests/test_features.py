"""Training features through the Python API on the host backends (issue #19): softcap,
post/pre-scale bias (broadcast and transposed views, dbias), ALiBi [h] and [b, h], sinks
(d_sinks), max_logit and dropout, each against the fp64 model of docs/semantics.md in
npref.features_ref (fresh random inputs), the dropout mask against numpy Philox4x32-10, and
bad input. float32 throughout: errors are a few ulps of values ~1."""

import math

import numpy as np
import pytest

import strideattn as sa
from npref import dropout_keep, features_ref

HOST = ["reference", "cpu"]


def randn(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def close(name, got, exact, seed, tol=3e-5):
    got, exact = np.asarray(got, np.float64), np.asarray(exact, np.float64)
    assert got.shape == exact.shape, f"{name}: shape {got.shape} != {exact.shape}"
    inf = np.isinf(exact)
    assert np.array_equal(np.isinf(got), inf), f"{name}: infinities differ (seed {seed})"
    fin = ~inf
    mag = max(1.0, float(np.abs(exact[fin]).max()) if fin.any() else 0.0)
    err = float(np.abs(got[fin] - exact[fin]).max()) if fin.any() else 0.0
    assert err <= tol * mag, f"{name}: max abs error {err:.3e} > {tol * mag:.3e} (seed {seed})"


def problem(rng, b=2, s_q=9, s_kv=13, h=4, hg=2, d=16):
    q = randn(rng, (b, s_q, h, d))
    k = randn(rng, (b, s_kv, hg, d))
    v = randn(rng, (b, s_kv, hg, d))
    do = randn(rng, (b, s_q, h, d))
    return q, k, v, do


def run(q, k, v, do, seed, backend="cpu", mask="none", grads=True, **feat):
    """Forward (with LSE and max logit) and backward through strideattn vs features_ref."""
    o, lse, ml = sa.attention(
        q, k, v, mask=mask, backend=backend, return_lse=True, return_max_logit=True, **feat
    )
    ref = features_ref(q, k, v, mask=mask, do=do, o_given=o, **feat)
    close("o", o, ref["o"], seed)
    close("lse", lse, ref["lse"], seed)
    close("max_logit", ml, ref["max_logit"], seed)
    if not grads:
        return ref
    bwd = dict(feat)
    if "bias" in feat:
        bwd["bias_requires_grad"] = True
    g = sa.attention_backward(q, k, v, o, do, lse, mask=mask, backend=backend, **bwd)
    names = ["dq", "dk", "dv"] + (["dbias"] if "bias" in feat else [])
    names += ["d_sinks"] if "sinks" in feat else []
    assert len(g) == len(names)
    for name, got in zip(names, g):
        close(name, got, ref[name], seed, tol=1e-4)
    return ref


@pytest.mark.parametrize("backend", HOST)
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_softcap(rng, seed, backend, mask):
    q, k, v, do = problem(rng)
    q *= 3  # logits of several units, so that the cap bends them
    ref = run(q, k, v, do, seed, backend, mask, softcap=2.5)
    assert ref["max_logit"].max() < 2.5  # capped below c


def _biases(rng, b, h, s_q, s_kv):
    """(name, bias view): full, broadcast by extent-1 dims, stride-0 view, transposed view."""
    full = randn(rng, (b, h, s_q, s_kv))
    ext1 = randn(rng, (1, h, 1, s_kv))
    stride0 = np.broadcast_to(randn(rng, (1, h, s_q, s_kv)), (b, h, s_q, s_kv))
    transposed = randn(rng, (s_kv, s_q, h, b)).transpose(3, 2, 1, 0)
    return [("full", full), ("extent1", ext1), ("stride0", stride0), ("transposed", transposed)]


@pytest.mark.parametrize("bias_type", ["post_scale", "pre_scale"])
@pytest.mark.parametrize("kind", ["full", "extent1", "stride0", "transposed"])
def test_bias(rng, seed, bias_type, kind):
    q, k, v, do = problem(rng)
    bias = dict(_biases(rng, 2, 4, 9, 13))[kind]
    assert kind != "stride0" or bias.strides[0] == 0
    run(q, k, v, do, seed, mask="causal_bottom_right", bias=bias, bias_type=bias_type)


def test_bias_float16_and_dbias_dtype(rng, seed):
    q, k, v, do = problem(rng)
    bias = randn(rng, (2, 1, 9, 13), np.float16)
    o, lse = sa.attention(q, k, v, backend="cpu", bias=bias, return_lse=True)
    ref = features_ref(q, k, v, bias=bias.astype(np.float32), do=do, o_given=o)
    close("o", o, ref["o"], seed)
    dq, dk, dv, db = sa.attention_backward(
        q, k, v, o, do, lse, backend="cpu", bias=bias, bias_requires_grad=True
    )
    assert db.dtype == np.float16 and db.shape == bias.shape
    close("dbias", db, ref["dbias"], seed, tol=2e-3)  # rounded to float16


@pytest.mark.parametrize("rows", ["h", "bh"])
def test_alibi(rng, seed, rows):
    q, k, v, do = problem(rng, s_q=7, s_kv=12)
    shape = (4,) if rows == "h" else (2, 4)
    slopes = rng.uniform(0.05, 1.0, shape).astype(np.float32)
    run(q, k, v, do, seed, mask="causal_bottom_right", alibi_slopes=slopes)


@pytest.mark.parametrize("backend", HOST)
def test_sinks(rng, seed, backend):
    q, k, v, do = problem(rng)
    sinks = randn(rng, (4,))
    ref = run(q, k, v, do, seed, backend, mask="causal", sinks=sinks)
    assert np.abs(ref["d_sinks"]).max() > 1e-3  # the gradient is not trivially 0


def test_all_features_together(rng, seed):
    q, k, v, do = problem(rng)
    bias = randn(rng, (1, 4, 9, 13))
    run(
        q,
        k,
        v,
        do,
        seed,
        mask="causal_bottom_right",
        softcap=4.0,
        bias=bias,
        bias_type="pre_scale",
        alibi_slopes=rng.uniform(0.1, 0.5, (2, 4)).astype(np.float32),
        sinks=randn(rng, (4,)),
    )


def test_model_gradients_by_finite_differences(rng):
    # the closed forms of dbias and d_sinks in features_ref against its own forward (fp64)
    q, k, v, do = (x.astype(np.float64) for x in problem(rng, b=1, s_q=4, s_kv=5, h=2, hg=1))
    bias = rng.standard_normal((1, 2, 4, 5))
    sinks = rng.standard_normal(2)
    for bias_type in ("post_scale", "pre_scale"):
        opts = dict(softcap=2.0, bias_type=bias_type, mask="causal")

        def loss(bb, ss, opts=opts):
            return float((features_ref(q, k, v, bias=bb, sinks=ss, **opts)["o"] * do).sum())

        g = features_ref(q, k, v, bias=bias, sinks=sinks, do=do, **opts)
        eps = 1e-6
        for idx in [(0, 0, 1, 0), (0, 1, 3, 2), (0, 1, 2, 1)]:
            bp, bm = bias.copy(), bias.copy()
            bp[idx] += eps
            bm[idx] -= eps
            fd = (loss(bp, sinks) - loss(bm, sinks)) / (2 * eps)
            assert abs(fd - g["dbias"][idx]) < 1e-6 * max(1, abs(fd)), (bias_type, idx)
        for hh in range(2):
            sp, sm = sinks.copy(), sinks.copy()
            sp[hh] += eps
            sm[hh] -= eps
            fd = (loss(bias, sp) - loss(bias, sm)) / (2 * eps)
            assert abs(fd - g["d_sinks"][hh]) < 1e-6 * max(1, abs(fd)), hh


def test_returns_in_order(rng):
    q, k, v, _ = problem(rng)
    o = sa.attention(q, k, v, backend="cpu")
    o2, ml = sa.attention(q, k, v, backend="cpu", return_max_logit=True)
    assert ml.shape == (2, 4) and ml.dtype == np.float32
    np.testing.assert_array_equal(o, o2)
    o3, lse, ml3 = sa.attention(q, k, v, backend="cpu", return_lse=True, return_max_logit=True)
    assert lse.shape == (2, 4, 9)
    np.testing.assert_array_equal(ml, ml3)


def test_max_logit_varlen(rng, seed):
    q, k, v = randn(rng, (12, 4, 8)), randn(rng, (15, 2, 8)), randn(rng, (15, 2, 8))
    sq, skv = [5, 7], [6, 9]
    o, ml = sa.attention(
        q, k, v, backend="cpu", seqlens_q=sq, seqlens_kv=skv, return_max_logit=True
    )
    assert ml.shape == (2, 4)
    for n, (oq, okv) in enumerate(((0, 0), (5, 6))):
        qq, kk = q[oq : oq + sq[n]], k[okv : okv + skv[n]]
        logits = np.einsum("ihd,jhd->hij", qq, np.repeat(kk, 2, axis=1)) / math.sqrt(8)
        close("max_logit", ml[n], logits.max(axis=(1, 2)), seed)


def _dropout_mask(backend, p, seed_, offset, b=2, h=3, s_q=24, s_kv=16):
    """The keep mask a backend draws, read from O with V = identity (all keys visible, so a
    kept key's probability is > 0 and a dropped one gives exactly 0)."""
    q = np.zeros((b, s_q, h, 8), np.float32)
    k = np.zeros((b, s_kv, h, 8), np.float32)
    v = np.broadcast_to(np.eye(s_kv, dtype=np.float32)[None, :, None, :], (b, s_kv, h, s_kv))
    o = sa.attention(
        q, k, v, backend=backend, dropout_p=p, dropout_seed=seed_, dropout_offset=offset
    )
    kept = o != 0
    # uniform P = 1/s_kv, weight 1/(1-p): every kept entry has that value
    np.testing.assert_allclose(o[kept], 1.0 / s_kv / (1 - p), rtol=1e-6)
    return kept.transpose(0, 2, 1, 3)  # [b, h, s_q, s_kv]


def test_dropout_mask_matches_philox(rng):
    p = float(rng.uniform(0.1, 0.6))
    seed_, offset = int(rng.integers(0, 2**63)) * 2 + 1, int(rng.integers(0, 2**40))
    masks = {be: _dropout_mask(be, p, seed_, offset) for be in HOST}
    np.testing.assert_array_equal(masks["cpu"], masks["reference"])
    for bi in range(2):
        for hq in range(3):
            want = dropout_keep(p, seed_, offset, bi, hq, 3, 24, 16)
            np.testing.assert_array_equal(masks["cpu"][bi, hq], want, err_msg=f"b={bi} h={hq}")
    other = _dropout_mask("cpu", p, seed_ + 1, offset)
    assert not np.array_equal(other, masks["cpu"])  # the seed matters


def test_dropout_keep_rate(rng):
    p = float(rng.uniform(0.05, 0.9))
    kept = _dropout_mask("cpu", p, int(rng.integers(0, 2**63)), 0, b=4, h=4, s_q=64, s_kv=64)
    n, q_keep = kept.size, 1 - math.floor(p * 2**32) / 2**32
    assert abs(kept.sum() - n * q_keep) <= 6 * math.sqrt(n * q_keep * (1 - q_keep)), p


@pytest.mark.parametrize("backend", HOST)
def test_dropout_forward_backward(rng, seed, backend):
    q, k, v, do = problem(rng)
    feat = dict(dropout_p=0.3, dropout_seed=int(rng.integers(0, 2**63)), dropout_offset=7)
    run(q, k, v, do, seed, backend, mask="causal", **feat)


def test_torch_cpu_tensors(rng, seed):
    torch = pytest.importorskip("torch")
    q, k, v, do = problem(rng)
    bias, sinks = randn(rng, (1, 4, 9, 13)), randn(rng, (4,))
    feat = dict(softcap=3.0, bias=bias, sinks=sinks, alibi_slopes=np.full(4, 0.25, np.float32))
    tf = {kk: torch.from_numpy(vv) if isinstance(vv, np.ndarray) else vv for kk, vv in feat.items()}
    t = [torch.from_numpy(x) for x in (q, k, v, do)]
    o, lse, ml = sa.attention(*t[:3], backend="cpu", return_lse=True, return_max_logit=True, **tf)
    assert isinstance(ml, torch.Tensor)
    ref = features_ref(q, k, v, do=do, **feat)
    close("o", o.numpy(), ref["o"], seed)
    close("max_logit", ml.numpy(), ref["max_logit"], seed)
    g = sa.attention_backward(*t[:3], o, t[3], lse, backend="cpu", bias_requires_grad=True, **tf)
    close("dbias", g[3].numpy(), ref["dbias"], seed, tol=1e-4)
    close("d_sinks", g[4].numpy(), ref["d_sinks"], seed, tol=1e-4)


@pytest.mark.parametrize("bias_type", ["post_scale", "pre_scale"])
def test_torch_autograd(rng, seed, bias_type):
    # tensors that require grad: gradients reach q, k, v, the bias (through an expanded
    # view) and the sinks; the max logit is not differentiable
    torch = pytest.importorskip("torch")
    q, k, v, do = problem(rng)
    bias, sinks = randn(rng, (1, 4, 9, 13)), randn(rng, (4,))
    slopes = np.full(4, 0.25, np.float32)
    t = [torch.from_numpy(x.copy()).requires_grad_() for x in (q, k, v)]
    tb = torch.from_numpy(bias.copy()).requires_grad_()
    ts = torch.from_numpy(sinks.copy()).requires_grad_()
    o, ml = sa.attention(
        *t,
        backend="cpu",
        bias=tb.expand(2, 4, 9, 13),
        bias_type=bias_type,
        sinks=ts,
        softcap=3.0,
        alibi_slopes=torch.from_numpy(slopes),
        return_max_logit=True,
    )
    assert not ml.requires_grad
    o.backward(torch.from_numpy(do))
    ref = features_ref(
        q, k, v, do=do, bias=bias, bias_type=bias_type, sinks=sinks, softcap=3.0,
        alibi_slopes=slopes,
    )  # fmt: skip
    close("o", o.detach().numpy(), ref["o"], seed)
    for name, x in (("dq", t[0]), ("dk", t[1]), ("dv", t[2]), ("dbias", tb), ("d_sinks", ts)):
        close(name, x.grad.numpy(), ref[name], seed, tol=1e-4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(bias=np.zeros((4, 9, 13), np.float32)), r"bias has shape \(4, 9, 13\)"),
        (dict(bias=np.zeros((2, 4, 9, 13))), "bias has dtype float64"),
        (dict(bias=np.zeros((2, 4, 8, 13), np.float32)), "bias: s_q extent 8"),
        (dict(bias=np.zeros((1, 4, 9, 13), np.float32), bias_type="mid"), "bias_type='mid'"),
        (dict(sinks=np.zeros((2, 4), np.float32)), r"sinks has shape \(2, 4\); supported: \[h\]"),
        (dict(sinks=np.zeros(4)), "sinks has dtype float64"),
        (dict(sinks=np.zeros(3, np.float32)), r"sinks: shape \[1, 3\]"),
        (dict(alibi_slopes=np.zeros((1, 2, 4), np.float32)), "alibi_slopes has shape"),
        (dict(alibi_slopes=np.zeros((3, 4), np.float32)), r"alibi_slopes: shape \[3, 4\]"),
        (dict(dropout_p=1.0), "dropout_p = 1.0"),
        (dict(dropout_p="x"), "dropout_p must be a number"),
        (dict(dropout_p=0.1, dropout_seed=-1), "dropout_seed = -1 is out of range"),
        (dict(dropout_offset=2**64), "dropout_offset = 18446744073709551616"),
        (dict(softcap=-1.0), "softcap = -1.0"),
        (dict(softcap=float("nan")), "softcap = nan"),
    ],
)
def test_bad_input(rng, kwargs, match):
    q, k, v, _ = problem(rng)
    with pytest.raises(ValueError, match=match):
        sa.attention(q, k, v, backend="cpu", **kwargs)


def test_bad_backward_input(rng):
    q, k, v, do = problem(rng)
    o, lse = sa.attention(q, k, v, backend="cpu", return_lse=True)
    with pytest.raises(ValueError, match="bias_requires_grad=True without a bias"):
        sa.attention_backward(q, k, v, o, do, lse, backend="cpu", bias_requires_grad=True)


def test_explain_names_the_feature_rules(rng):
    q, k, v, _ = problem(rng)
    feat = dict(bias=randn(rng, (1, 4, 9, 13)), sinks=randn(rng, (4,)), return_max_logit=True)
    ex = sa.explain(q, k, v, **feat)
    assert ex["valid"] and ex["chosen"] in ("cpu", "reference"), ex
    ex = sa.explain(q, k, v, grad=True, bias_requires_grad=True, **feat)
    assert ex["valid"], ex  # return_max_logit is dropped for the backward
    bad = sa.explain(q, k, v, bias=randn(rng, (1, 4, 8, 13)))
    assert not bad["valid"] and "bias: s_q extent 8" in bad["error"]
    assert sa.workspace_size(q, k, v, sinks=feat["sinks"]) >= 0
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['softcapp'\\]"):
        sa.explain(q, k, v, softcapp=1.0)
