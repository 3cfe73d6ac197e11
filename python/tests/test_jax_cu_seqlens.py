"""JAX tests of varlen given as cu_seqlens arrays (FlashAttention's and TransformerEngine's
form: int32 running token totals, optional seq_offsets for padded layouts, max_seqlen
bounds): the arrays are arguments of the compiled call, handed to the library where they
live. Forward and jax.grad against the fp64 numpy reference, one compilation serving
different lengths, agreement with the lengths-fixed-at-trace-time path, the packed entry
points, and bad input refused by name (at trace time where the shapes tell, at run time where
only the values do). The GPU test runs on the CUDA platform and skips, saying why, without a
JAX GPU device or a strideattn build with the GPU backends."""

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed")
import jax.numpy as jnp  # noqa: E402

import strideattn.jax as sj  # noqa: E402  (fails, saying why, when the binding was not built)
from npref import attention_ref, check  # noqa: E402
from test_jax import CPU, check_all, expect_raises, f32, gpu_device, loss_and_grads, rand  # noqa: E402

H, HG, D = 4, 2, 16
T_Q, T_KV = 17, 16


def lists(cu, first=None):
    """(seqlens, offsets) of a cu_seqlens array and its optional seq_offsets."""
    cu = [int(x) for x in cu]
    lens = [b - a for a, b in zip(cu, cu[1:])]
    return lens, list(first[: len(lens)]) if first is not None else cu[:-1]


def reference_lengths(cu_q, cu_kv, off_q=None, off_kv=None):
    sq, oq = lists(cu_q, off_q)
    skv, okv = lists(cu_kv, off_kv)
    return dict(seqlens_q=sq, seqlens_kv=skv, offsets_q=oq, offsets_kv=okv)


# Two sets of arrays for one compiled call: padded apart (seq_offsets) with an empty sequence,
# then packed with other lengths (seq_offsets equal to the running totals).
CASES = [
    dict(cu_q=[0, 5, 5, 12], cu_kv=[0, 6, 9, 13], off_q=[1, 7, 8], off_kv=[0, 7, 11]),
    dict(cu_q=[0, 2, 11, 15], cu_kv=[0, 7, 14, 16], off_q=[0, 2, 11], off_kv=[0, 7, 14]),
]
BOUNDS = dict(max_seqlen_q=9, max_seqlen_kv=7)


def inputs(rng, dtype, device=CPU):
    (q, qn), (k, kn), (v, vn) = (
        rand(rng, (t, n, D), dtype, device) for t, n in ((T_Q, H), (T_KV, HG), (T_KV, HG))
    )
    do, don = rand(rng, (T_Q, H, D), dtype, device)
    return (q, k, v, do), (qn, kn, vn, don)


def arrays(case, device=CPU):
    return [
        jax.device_put(jnp.asarray(case[n], jnp.int32), device)
        for n in ("cu_q", "cu_kv", "off_q", "off_kv")
    ]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_cu_seqlens_read_at_run_time(rng, seed, dtype):
    (q, k, v, do), (qn, kn, vn, don) = inputs(rng, dtype)

    def fn(q, k, v, cq, ckv, oq, okv):
        return sj.attention(
            q, k, v, mask="causal", cu_seqlens_q=cq, cu_seqlens_kv=ckv, seq_offsets_q=oq,
            seq_offsets_kv=okv, **BOUNDS,
        )  # fmt: skip

    run = loss_and_grads(fn, (0, 1, 2))
    for case in CASES:
        (_, o), grads = run(q, k, v, *arrays(case), do)
        lengths = reference_lengths(case["cu_q"], case["cu_kv"], case["off_q"], case["off_kv"])
        check_all(
            qn, kn, vn, f32(o), don, [f32(g) for g in grads], dtype, seed, mask="causal",
            **lengths,
        )  # fmt: skip
        # Tokens outside every sequence are padding: 0 in O and dQ.
        inside = np.zeros(T_Q, bool)
        for n, first in zip(lengths["seqlens_q"], lengths["offsets_q"]):
            inside[first : first + n] = True
        for x in (f32(o), f32(grads[0])):
            assert not x[~inside].any() and x[inside].any()
    assert run._cache_size() == 1  # one compilation served both sets of lengths


def test_cu_seqlens_equal_the_lengths_fixed_at_trace_time(rng):
    # The same problem through the two forms runs the same kernels: bit for bit equal.
    (q, k, v, do), _ = inputs(rng, jnp.float32)
    case = CASES[0]
    cq, ckv, oq, okv = arrays(case)
    lengths = reference_lengths(case["cu_q"], case["cu_kv"], case["off_q"], case["off_kv"])
    for backend in ("cpu", "reference"):
        got = loss_and_grads(
            lambda q, k, v: sj.attention(
                q, k, v, backend=backend, cu_seqlens_q=cq, cu_seqlens_kv=ckv, seq_offsets_q=oq,
                seq_offsets_kv=okv, **BOUNDS,
            ),
            (0, 1, 2),
        )(q, k, v, do)  # fmt: skip
        want = loss_and_grads(
            lambda q, k, v: sj.attention(q, k, v, backend=backend, **lengths), (0, 1, 2)
        )(q, k, v, do)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_cu_seqlens_packed_entry_points(rng, seed):
    t, h, d = 12, 2, 8
    cu = [0, 5, 12]
    qkv, qkvn = rand(rng, (t, 3, h, d), jnp.float32)
    run = jax.jit(lambda x, c: sj.attention_qkvpacked(x, mask="causal", cu_seqlens=c, max_seqlen=7))
    o = run(qkv, jnp.asarray(cu, jnp.int32))
    q, k, v = (qkvn[:, i] for i in range(3))
    ref = dict(seqlens_q=[5, 7], seqlens_kv=[5, 7])
    exact = attention_ref(q, k, v, mask="causal", **ref)
    naive = attention_ref(q, k, v, mask="causal", lowp=jnp.float32, **ref)
    check("o", f32(o), exact["o"], naive["o"], jnp.float32, seed)

    qn = qkvn[:, 0]
    kv, kvn = rand(rng, (t, 2, h, d), jnp.float32)
    o = sj.attention_kvpacked(
        qkv[:, 0], kv, cu_seqlens_q=cu, cu_seqlens_kv=[0, 8, 12], max_seqlen_q=7, max_seqlen_kv=8
    )  # Python lists are accepted and passed as int32 arrays
    ref = dict(seqlens_q=[5, 7], seqlens_kv=[8, 4])
    exact = attention_ref(qn, kvn[:, 0], kvn[:, 1], **ref)
    naive = attention_ref(qn, kvn[:, 0], kvn[:, 1], lowp=jnp.float32, **ref)
    check("o", f32(o), exact["o"], naive["o"], jnp.float32, seed)


def test_cu_seqlens_bad_input():
    x = jax.device_put(jnp.zeros((10, 2, 8), jnp.float32), CPU)
    cu = jnp.asarray([0, 4, 10], jnp.int32)
    both = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu)
    bounds = dict(max_seqlen_q=6, max_seqlen_kv=6)
    cases = [
        (ValueError, "max_seqlen_q is required with cu_seqlens_q", dict(**both)),
        (ValueError, "cu_seqlens_kv is missing", dict(cu_seqlens_q=cu, **bounds)),
        (ValueError, "max_seqlen_kv is given without cu_seqlens", dict(max_seqlen_kv=3)),
        (
            ValueError,
            "describe the same thing",
            dict(**both, **bounds, seqlens_q=[4, 6], seqlens_kv=[4, 6]),
        ),
        (
            ValueError,
            "cu_seqlens_q must be a one-dimensional int32 array",
            dict(cu_seqlens_q=cu.astype(jnp.float32), cu_seqlens_kv=cu, **bounds),
        ),
        (
            ValueError,
            "cu_seqlens_kv has 2 entries but cu_seqlens_q has 3",
            dict(cu_seqlens_q=cu, cu_seqlens_kv=cu[:2], **bounds),
        ),
        (
            ValueError,
            "cu_seqlens_q has 1 entries; supported: count \\+ 1",
            dict(cu_seqlens_q=cu[:1], cu_seqlens_kv=cu[:1], **bounds),
        ),
        (
            ValueError,
            "seq_offsets_q has 1 entries for 2 sequences",
            dict(**both, **bounds, seq_offsets_q=cu[:1]),
        ),
        (
            ValueError,
            "max_seqlen_q is 11; supported: 0 to the 10 tokens of q",
            dict(**both, max_seqlen_q=11, max_seqlen_kv=6),
        ),
    ]
    expect_raises(
        [(exc, pattern, lambda kw=kw: sj.attention(x, x, x, **kw)) for exc, pattern, kw in cases]
    )


def test_cu_seqlens_values_checked_when_the_call_runs():
    # On the CPU platform the library reads the arrays when the call runs: a length above
    # its bound is refused there, with the library's message.
    x = jax.device_put(jnp.zeros((10, 2, 8), jnp.float32), CPU)
    fn = jax.jit(
        lambda x, c: sj.attention(
            x, x, x, cu_seqlens_q=c, cu_seqlens_kv=c, max_seqlen_q=6, max_seqlen_kv=6
        )
    )
    fn(x, jnp.asarray([0, 4, 10], jnp.int32)).block_until_ready()
    with pytest.raises(
        Exception, match=r"strideattn \(invalid_argument\): varlen: sequence 0 has 8 tokens"
    ):
        fn(x, jnp.asarray([0, 8, 10], jnp.int32)).block_until_ready()


@pytest.mark.parametrize("backend", ["cuda", "cudnn"])
def test_gpu_cu_seqlens(rng, seed, backend):
    # On the GPU the arrays stay on the device and the kernels read them: one compilation
    # serves both sets of lengths, each matching the reference and, bit for bit, the path
    # with the lengths fixed at trace time.
    dev = gpu_device()
    import strideattn as sa

    if backend not in sa.compiled_backends():
        pytest.skip(f"this strideattn build has no {backend} backend")
    dtype = jnp.bfloat16
    (q, k, v, do), (qn, kn, vn, don) = inputs(rng, dtype, dev)

    def fn(q, k, v, cq, ckv, oq, okv):
        return sj.attention(
            q, k, v, mask="causal", backend=backend, cu_seqlens_q=cq, cu_seqlens_kv=ckv,
            seq_offsets_q=oq, seq_offsets_kv=okv, **BOUNDS,
        )  # fmt: skip

    run = loss_and_grads(fn, (0, 1, 2))
    for case in CASES:
        got = run(q, k, v, *arrays(case, dev), do)
        (_, o), grads = got
        lengths = reference_lengths(case["cu_q"], case["cu_kv"], case["off_q"], case["off_kv"])
        check_all(
            qn, kn, vn, f32(o), don, [f32(g) for g in grads], dtype, seed, mask="causal",
            **lengths,
        )  # fmt: skip
        if backend == "cuda":
            want = loss_and_grads(
                lambda q, k, v: sj.attention(q, k, v, mask="causal", backend=backend, **lengths),
                (0, 1, 2),
            )(q, k, v, do)
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert run._cache_size() == 1
