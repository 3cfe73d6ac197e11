"""JAX tests of the training features in strideattn.jax (softcap, post/pre-scale bias with
its gradient, ALiBi [h] and [b, h], sinks with theirs, dropout drawn from a JAX PRNG key):
forward and jax.grad under jax.jit against the fp64 model of docs/semantics.md
(npref.features_ref; fresh random inputs), biases of fewer dimensions broadcast from the
right, the packed entry points, the dropout mask from the key's bits (the same key draws
the same mask, another key another), and bad input refused by name. CPU platform (the
reference and cpu backends); the GPU test runs the cuda backend and skips, saying why,
without a JAX GPU device or a strideattn build with the GPU backends."""

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed")
import jax.numpy as jnp  # noqa: E402

import strideattn.jax as sj  # noqa: E402  (fails, saying why, when the binding was not built)
from npref import features_ref  # noqa: E402
from test_features import close  # noqa: E402
from test_jax import CPU, expect_raises, gpu_device  # noqa: E402

B, S_Q, S_KV, H, HG, D = 2, 9, 13, 4, 2, 16


def arrays(rng, device=CPU, scale=1.0, dtype=jnp.float32):
    """q, k, v, dO as JAX arrays of `dtype` on `device`, and their values as float32 numpy."""
    shapes = ((B, S_Q, H, D), (B, S_KV, HG, D), (B, S_KV, HG, D), (B, S_Q, H, D))
    host = [
        (scale if i == 0 else 1.0) * rng.standard_normal(s).astype(np.float32)
        for i, s in enumerate(shapes)
    ]
    dev = [jax.device_put(jnp.asarray(x).astype(dtype), device) for x in host]
    return dev, [np.asarray(x.astype(jnp.float32)) for x in dev]


def fwd_bwd(backend, mask, **feat):
    """jit(value_and_grad) of sum(attention(q, k, v, bias, sinks) * do): O and the gradients
    of q, k, v and (where given) the bias and the sinks."""
    argnums = [0, 1, 2] + [i for i, n in ((4, "bias"), (5, "sinks")) if n in feat]

    def loss(q, k, v, do, bias, sinks):  # (the loss in float32)
        o = sj.attention(
            q, k, v, mask=mask, backend=backend, bias=bias, sinks=sinks,
            **{n: x for n, x in feat.items() if n not in ("bias", "sinks")},
        )  # fmt: skip
        return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32)), o

    run = jax.jit(jax.value_and_grad(loss, argnums=argnums, has_aux=True))

    def call(q, k, v, do):
        (_, o), grads = run(q, k, v, do, feat.get("bias"), feat.get("sinks"))
        return np.asarray(o.astype(jnp.float32)), [np.asarray(g.astype(jnp.float32)) for g in grads]

    return call


def check_against_model(
    q, k, v, do, host, o, grads, seed, mask, ref_feat, bias_shape=None, tol=(3e-5, 1e-4)
):
    """O within tol[0] and the gradients within tol[1] of the model's, relative to each
    output's magnitude (test_features.close)."""
    o, grads = np.asarray(o, np.float32), [np.asarray(g, np.float32) for g in grads]
    ref = features_ref(*host[:3], mask=mask, do=host[3], o_given=o, **ref_feat)
    close("o", o, ref["o"], seed, tol=tol[0])
    names = ["dq", "dk", "dv"] + (["dbias"] if "bias" in ref_feat else [])
    names += ["d_sinks"] if "sinks" in ref_feat else []
    assert len(grads) == len(names)
    for name, got in zip(names, grads):
        want = ref[name]
        if name == "dbias" and bias_shape is not None:
            want = want.reshape(bias_shape)
        close(name, got, want, seed, tol=tol[1])


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_each_feature_and_its_gradient(rng, seed, backend, mask):
    (q, k, v, do), host = arrays(rng, scale=3.0)  # logits of several units: the cap bends them
    bias4 = rng.standard_normal((1, H, S_Q, S_KV)).astype(np.float32)
    bias1 = rng.standard_normal((S_KV,)).astype(np.float32)  # broadcast from the right
    slopes = np.abs(rng.standard_normal((B, H))).astype(np.float32) / 4
    sinks = rng.standard_normal(H).astype(np.float32)
    cases = [
        (dict(softcap=2.5), dict(softcap=2.5), None),
        (dict(bias=jnp.asarray(bias4)), dict(bias=bias4), None),
        (
            dict(bias=jnp.asarray(bias1), bias_type="pre_scale"),
            dict(bias=bias1.reshape(1, 1, 1, S_KV), bias_type="pre_scale"),
            bias1.shape,
        ),
        (dict(alibi_slopes=jnp.asarray(slopes)), dict(alibi_slopes=slopes), None),
        (dict(alibi_slopes=jnp.asarray(slopes[0])), dict(alibi_slopes=slopes[0]), None),
        (dict(sinks=jnp.asarray(sinks)), dict(sinks=sinks), None),
        (
            dict(softcap=4.0, bias=jnp.asarray(bias4), alibi_slopes=jnp.asarray(slopes[0]),
                 sinks=jnp.asarray(sinks)),
            dict(softcap=4.0, bias=bias4, alibi_slopes=slopes[0], sinks=sinks),
            None,
        ),
    ]  # fmt: skip
    for feat, ref_feat, bias_shape in cases:
        o, grads = fwd_bwd(backend, mask, **feat)(q, k, v, do)
        check_against_model(q, k, v, do, host, o, grads, seed, mask, ref_feat, bias_shape)


def _seed_offset(key):
    """The Philox seed and offset strideattn.jax draws from a PRNG key: uint32 [4] bits, the
    seed then the offset as little-endian uint64."""
    w = [int(x) for x in np.asarray(jax.random.bits(key, (4,), jnp.uint32))]
    return w[0] | w[1] << 32, w[2] | w[3] << 32


def test_dropout_from_a_key(rng, seed):
    (q, k, v, do), host = arrays(rng)
    p = 0.3

    def loss(q, k, v, do, key):
        o = sj.attention(q, k, v, mask="causal", backend="cpu", dropout_p=p, dropout_rng=key)
        return jnp.sum(o * do), o

    run = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    outs = []
    for key in (jax.random.key(7), jax.random.key(8)):
        (_, o), grads = run(q, k, v, do, key)
        s, off = _seed_offset(key)
        ref_feat = dict(dropout_p=p, dropout_seed=s, dropout_offset=off)
        check_against_model(q, k, v, do, host, np.asarray(o), [np.asarray(g) for g in grads],
                            seed, "causal", ref_feat)  # fmt: skip
        outs.append(np.asarray(o))
    assert not np.array_equal(outs[0], outs[1]), "another key drew the same mask"
    (_, again), _ = run(q, k, v, do, jax.random.key(7))
    np.testing.assert_array_equal(np.asarray(again), outs[0])  # the same key, the same mask
    assert run._cache_size() == 1  # the key is an argument: one compilation
    # the reference backend draws the same mask: the same O within rounding
    o_ref = sj.attention(q, k, v, mask="causal", backend="reference", dropout_p=p,
                         dropout_rng=jax.random.key(7))  # fmt: skip
    close("o", o_ref, outs[0], seed)


def test_packed_entry_points_take_the_features(rng, seed):
    t, h, d = 12, 2, 8
    qkv = rng.standard_normal((1, t, 3, h, d)).astype(np.float32)
    sinks = rng.standard_normal(h).astype(np.float32)
    o = sj.attention_qkvpacked(
        jnp.asarray(qkv), mask="causal", softcap=3.0, sinks=jnp.asarray(sinks)
    )
    q, k, v = (qkv[:, :, i] for i in range(3))
    close("o", o, features_ref(q, k, v, mask="causal", softcap=3.0, sinks=sinks)["o"], seed)
    kv = rng.standard_normal((1, t, 2, h, d)).astype(np.float32)
    bias = rng.standard_normal((t, t)).astype(np.float32)
    o = sj.attention_kvpacked(jnp.asarray(qkv[:, :, 0]), jnp.asarray(kv), bias=jnp.asarray(bias))
    ref = features_ref(qkv[:, :, 0], kv[:, :, 0], kv[:, :, 1], bias=bias.reshape(1, 1, t, t))
    close("o", o, ref["o"], seed)


def test_features_bad_input():
    x = jnp.zeros((1, 6, 2, 8), jnp.float32)
    cases = [
        (ValueError, "softcap = -1", dict(softcap=-1.0)),
        (ValueError, "dropout_p = 1.5", dict(dropout_p=1.5)),
        (ValueError, "dropout_p > 0 needs dropout_rng", dict(dropout_p=0.1)),
        (
            ValueError,
            "dropout_rng is given but dropout_p is 0",
            dict(dropout_rng=jax.random.key(0)),
        ),
        (
            ValueError,
            "bias_type='mid' is not a bias type",
            dict(bias=jnp.zeros(6), bias_type="mid"),
        ),
        (
            ValueError,
            "bias must be a float32, float16 or bfloat16",
            dict(bias=jnp.zeros(6, jnp.int32)),
        ),
        (
            ValueError,
            "alibi_slopes must be a float32 array",
            dict(alibi_slopes=jnp.zeros((1, 1, 2))),
        ),
        (ValueError, "sinks must be a float32 array", dict(sinks=jnp.zeros((1, 2)))),
        # the library's own checks, at trace time: a bias extent that is neither full nor 1
        (ValueError, "bias", dict(bias=jnp.zeros((3, 6)))),
    ]
    expect_raises([(exc, pat, lambda kw=kw: sj.attention(x, x, x, **kw)) for exc, pat, kw in cases])


def test_gpu_features(rng, seed):
    # float16 (the GPU backends' dtypes): within 1e-2 (O) and 2e-2 (gradients) of the model's
    # magnitude, as test_te_features' CUDA cases
    dev = gpu_device()
    (q, k, v, do), host = arrays(rng, dev, scale=3.0, dtype=jnp.float16)
    bias = rng.standard_normal((1, H, S_Q, S_KV)).astype(np.float32)
    sinks = rng.standard_normal(H).astype(np.float32)
    slopes = np.abs(rng.standard_normal(H)).astype(np.float32) / 4
    feat = dict(softcap=4.0, bias=jax.device_put(jnp.asarray(bias), dev),
                alibi_slopes=jax.device_put(jnp.asarray(slopes), dev),
                sinks=jax.device_put(jnp.asarray(sinks), dev))  # fmt: skip
    o, grads = fwd_bwd("cuda", "causal", **feat)(q, k, v, do)
    ref_feat = dict(softcap=4.0, bias=bias, alibi_slopes=slopes, sinks=sinks)
    check_against_model(q, k, v, do, host, o, grads, seed, "causal", ref_feat, tol=(1e-2, 2e-2))


def test_max_logit(rng, seed):
    # Each head's largest logit after the features, [b, h], as the model's; with the LSE too;
    # varlen: one row per sequence (lengths fixed at trace time and as cu_seqlens arrays).
    (q, k, v, do), host = arrays(rng, scale=3.0)
    feat = dict(softcap=4.0, mask="causal")
    o, lse, ml = sj.attention(
        q, k, v, return_lse=True, return_max_logit=True, backend="cpu", **feat
    )
    ref = features_ref(*host[:3], softcap=4.0, mask="causal")
    close("max_logit", ml, ref["max_logit"], seed)
    close("lse", lse, ref["lse"], seed)
    assert ml.shape == (B, H) and ml.max() < 4.0  # capped below c

    # grad with the max logit as an output: fine where it is not differentiated
    def loss(q):
        o, ml = sj.attention(q, k, v, return_max_logit=True, **feat)
        return jnp.sum(o * do) + jnp.sum(jax.lax.stop_gradient(ml))

    g = jax.jit(jax.grad(loss))(q)
    assert np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).sum() > 0
    with pytest.raises(NotImplementedError, match="max-logit"):
        jax.grad(lambda q: jnp.sum(sj.attention(q, k, v, return_max_logit=True)[1]))(q)

    # varlen: sequences 0 and 1 of the batch, packed into tokens
    lens = [S_Q, 5]
    tq = jnp.concatenate([q[0], q[1, :5]])
    tk, tv = (jnp.concatenate([x[0], x[1, :5]]) for x in (k, v))
    want = np.stack(
        [
            features_ref(*(x[i : i + 1, :n] for x in host[:3]), **feat)["max_logit"][0]
            for i, n in enumerate(lens)
        ]
    )
    _, ml = sj.attention(
        tq, tk, tv, seqlens_q=lens, seqlens_kv=[S_KV, 5], return_max_logit=True, **feat
    )
    close("varlen max_logit", ml, want, seed)
    cu_q, cu_kv = (
        jnp.asarray([0, S_Q, S_Q + 5], jnp.int32),
        jnp.asarray([0, S_KV, S_KV + 5], jnp.int32),
    )
    _, ml = jax.jit(
        lambda q, k, v, a, c: sj.attention(
            q, k, v, cu_seqlens_q=a, cu_seqlens_kv=c, max_seqlen_q=S_Q, max_seqlen_kv=S_KV,
            return_max_logit=True, **feat,
        )
    )(tq, tk, tv, cu_q, cu_kv)  # fmt: skip
    close("cu_seqlens max_logit", ml, want, seed)
