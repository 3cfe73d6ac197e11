"""JAX tests of strideattn.jax (the XLA FFI binding): forward, jax.grad and the LSE against
the fp64 numpy reference (npref.py) under docs/semantics.md's correctness rule, under jax.jit
and jax.vmap, with packed QKV / KV buffers read as strided views (and the compiled program
checked for copies), axis orders other than bshd, GQA, masks and windows, varlen with the
lengths fixed at trace time or read at run time; bad input and the handler's own checks.
The CPU tests run on XLA's CPU platform; the GPU tests run on the CUDA platform and skip,
saying why, without a JAX GPU device or a strideattn build with the GPU backends."""

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed")
import jax.numpy as jnp  # noqa: E402

import strideattn as sa  # noqa: E402
import strideattn.jax as sj  # noqa: E402  (fails, saying why, when the binding was not built)
from strideattn import _jax_ffi  # noqa: E402
from npref import attention_ref, backward_targets, check, grad_magnitude  # noqa: E402

DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16]
CPU = jax.devices("cpu")[0]


def gpu_device():
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("JAX has no GPU device here")
    if "cuda" not in sa.compiled_backends():
        pytest.skip("this strideattn build has no GPU backends")
    return gpus[0]


def rand(rng, shape, dtype, device=CPU):
    """A JAX array of `dtype` on `device`, and its values as float32 numpy."""
    x = jax.device_put(jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype), device)
    return x, np.asarray(x.astype(jnp.float32))


def f32(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32))


def to_bshd(x, axes):
    """numpy array with `axes` (letters) as a logical [b, s, h, d] (or [t, h, d]) array."""
    want = "bshd" if "b" in axes else "shd"
    return np.transpose(x, [axes.replace("t", "s").index(c) for c in want])


def check_all(q, k, v, o, do, grads, dtype, seed, **opts):
    """O against the fp64 reference and, when given, the gradients against the backward of
    the O the op produced (docs/semantics.md); arrays are logical numpy."""
    exact = attention_ref(q, k, v, **opts)
    naive = attention_ref(q, k, v, lowp=dtype, **opts)
    check("o", o, exact["o"], naive["o"], dtype, seed)
    if grads is None:
        return
    exact, naive = backward_targets(q, k, v, o, do, dtype, **opts)
    mag = grad_magnitude(exact)
    for name, got in zip(("dq", "dk", "dv"), grads):
        check(name, got, exact[name], naive[name], dtype, seed, magnitude=mag)


def loss_and_grads(fn, argnums):
    """jit(value_and_grad) of sum(fn(*args) * do): the output and the gradients."""

    def loss(*args):
        *xs, do = args
        o = fn(*xs)
        return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32)), o

    return jax.jit(jax.value_and_grad(loss, argnums=argnums, has_aux=True))


# ----------------------------------------------------------------------------- dense


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "mask,window,s_q,s_kv",
    [("none", None, 12, 12), ("causal", None, 12, 12), ("causal_bottom_right", (4, 0), 9, 14)],
)
def test_forward_grad_gqa(rng, seed, dtype, mask, window, s_q, s_kv):
    b, h, hg, d = 2, 4, 2, 16
    (q, qn), (k, kn), (v, vn) = (
        rand(rng, (b, s, n, d), dtype) for s, n in ((s_q, h), (s_kv, hg), (s_kv, hg))
    )
    do, don = rand(rng, (b, s_q, h, d), dtype)
    opts = dict(mask=mask, window=window)
    run = loss_and_grads(lambda q, k, v: sj.attention(q, k, v, **opts), (0, 1, 2))
    (_, o), grads = run(q, k, v, do)
    assert o.shape == (b, s_q, h, d) and o.dtype == dtype
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    check_all(qn, kn, vn, f32(o), don, [f32(g) for g in grads], dtype, seed, **opts)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_backends_scale_deterministic(rng, seed, backend):
    b, s, h, d = 1, 10, 2, 8
    (q, qn), (k, kn), (v, vn), (do, don) = (rand(rng, (b, s, h, d), jnp.float32) for _ in range(4))
    opts = dict(scale=0.3, mask="causal")
    fn = lambda q, k, v: sj.attention(q, k, v, backend=backend, deterministic=True, **opts)  # noqa: E731
    run = loss_and_grads(fn, (0, 1, 2))
    (_, o), grads = run(q, k, v, do)
    check_all(qn, kn, vn, f32(o), don, [f32(g) for g in grads], jnp.float32, seed, **opts)
    _, again = run(q, k, v, do)
    for g, g2 in zip(grads, again):  # deterministic: bitwise the same run to run
        assert np.array_equal(np.asarray(g), np.asarray(g2))


def test_axis_orders(rng, seed):
    # q [s, b, h, d], k [b, h, s, d], v [h, s, b, d]: each read through its own axes; O
    # keeps q's order.
    b, s, h, d = 2, 11, 3, 8
    dtype = jnp.float16
    axes = ("sbhd", "bhsd", "hsbd")
    logical = {}
    arrays = []
    for name, a in zip("qkv", axes):
        shape = tuple({"b": b, "s": s, "h": h, "d": d}[c] for c in a)
        x, xn = rand(rng, shape, dtype)
        arrays.append(x)
        logical[name] = to_bshd(xn, a)
    do, don = rand(rng, (s, b, h, d), dtype)
    run = loss_and_grads(lambda q, k, v: sj.attention(q, k, v, axes=axes, mask="causal"), (0, 1, 2))
    (_, o), grads = run(*arrays, do)
    assert o.shape == (s, b, h, d)
    assert [g.shape for g in grads] == [x.shape for x in arrays]
    got = [to_bshd(f32(g), a) for g, a in zip(grads, axes)]
    check_all(
        logical["q"],
        logical["k"],
        logical["v"],
        to_bshd(f32(o), "sbhd"),
        to_bshd(don, "sbhd"),
        got,
        dtype,
        seed,
        mask="causal",
    )


def test_vmap_and_eager(rng, seed):
    n, b, s, h, d = 3, 1, 7, 2, 8
    (q, qn), (k, kn), (v, vn) = (rand(rng, (n, b, s, h, d), jnp.float32) for _ in range(3))
    o = jax.jit(jax.vmap(lambda q, k, v: sj.attention(q, k, v, mask="causal")))(q, k, v)
    for i in range(n):
        ref = attention_ref(qn[i], kn[i], vn[i], mask="causal")
        naive = attention_ref(qn[i], kn[i], vn[i], mask="causal", lowp=jnp.float32)
        check(f"o[{i}]", f32(o[i]), ref["o"], naive["o"], jnp.float32, seed)
    eager = sj.attention(q[0], k[0], v[0], mask="causal")  # no jit
    assert np.array_equal(np.asarray(eager), np.asarray(o[0]))


def test_lse(rng, seed):
    b, s, h, d = 2, 9, 2, 8
    (q, qn), (k, kn), (v, vn), (do, don) = (rand(rng, (b, s, h, d), jnp.float32) for _ in range(4))
    o, lse = jax.jit(lambda q, k, v: sj.attention(q, k, v, window=(2, 1), return_lse=True))(q, k, v)
    exact = attention_ref(qn, kn, vn, window=(2, 1))
    naive = attention_ref(qn, kn, vn, window=(2, 1), lowp=jnp.float32)
    assert lse.shape == (b, h, s) and lse.dtype == jnp.float32
    check("lse", np.asarray(lse), exact["lse"], naive["lse"], jnp.float32, seed, lse=True)
    check("o", np.asarray(o), exact["o"], naive["o"], jnp.float32, seed)
    # The gradient of O is there with the LSE returned; a gradient through the LSE is refused.
    fn = lambda q: sj.attention(q, k, v, window=(2, 1), return_lse=True)  # noqa: E731
    dq = jax.grad(lambda q: jnp.sum(fn(q)[0] * do) + jnp.sum(jax.lax.stop_gradient(fn(q)[1])))(q)
    ref_dq = jax.grad(lambda q: jnp.sum(sj.attention(q, k, v, window=(2, 1)) * do))(q)
    assert np.array_equal(np.asarray(dq), np.asarray(ref_dq))
    with pytest.raises(NotImplementedError, match="gradients through the LSE"):
        jax.grad(lambda q: jnp.sum(fn(q)[1]))(q)


# ----------------------------------------------------------------------------- packed


@pytest.mark.parametrize(
    "axes,shape,num_kv_heads",
    [
        ("bs3hd", (2, 10, 3, 4, 16), None),  # [b, s, 3, h, d]
        ("sbh3d", (10, 2, 4, 3, 16), None),  # [s, b, h, 3, d]: q, k, v interleaved per head
        ("sbhd", (10, 2, 4 + 2 * 2, 16), 2),  # [s, b, h + 2 hg, d]: GQA
        ("bshd", (2, 10, 3 * 3, 16), None),  # h = hg = 3
    ],
)
def test_qkvpacked(rng, seed, axes, shape, num_kv_heads):
    dtype = jnp.bfloat16
    qkv, qkvn = rand(rng, shape, dtype)
    if "3" in axes:
        at = axes.index("3")
        parts = [np.take(qkvn, i, axis=at) for i in range(3)]
        view_axes = axes.replace("3", "")
        h = shape[axes.index("h")]
    else:
        total = shape[axes.index("h")]
        hg = num_kv_heads or total // 3
        h = total - 2 * hg
        at = axes.index("h")
        parts = np.split(qkvn, [h, h + hg], axis=at)
        view_axes = axes
    q, k, v = (to_bshd(p, view_axes) for p in parts)
    o_shape = tuple(h if c == "h" else shape[axes.index(c)] for c in view_axes)
    do, don = rand(rng, o_shape, dtype)
    fn = lambda x: sj.attention_qkvpacked(  # noqa: E731
        x, axes=axes, num_kv_heads=num_kv_heads, mask="causal"
    )
    (_, o), grad = loss_and_grads(fn, 0)(qkv, do)
    assert o.shape == o_shape and grad.shape == qkv.shape and grad.dtype == dtype
    g = f32(grad)
    if "3" in axes:
        gparts = [np.take(g, i, axis=at) for i in range(3)]
    else:
        gparts = np.split(g, [h, h + (shape[at] - h) // 2], axis=at)
    check_all(
        q,
        k,
        v,
        to_bshd(f32(o), view_axes),
        to_bshd(don, view_axes),
        [to_bshd(p, view_axes) for p in gparts],
        dtype,
        seed,
        mask="causal",
    )


def test_qkvpacked_compiles_without_copies():
    # q, k, v are views of the parameter and dqkv is the backward's own result: the compiled
    # program has the two custom calls and no slice, concatenate, transpose or copy.
    qkv = jax.device_put(jnp.zeros((6, 2, 8, 16), jnp.float16), CPU)
    fn = lambda x: jnp.sum(  # noqa: E731
        sj.attention_qkvpacked(x, axes="sbhd", num_kv_heads=2).astype(jnp.float32)
    )
    hlo = jax.jit(jax.value_and_grad(fn)).lower(qkv).compile().as_text()
    calls = re.findall(r'custom_call_target="(strideattn_\w+)"', hlo)
    assert sorted(calls) == ["strideattn_backward", "strideattn_forward"], calls
    ops = re.findall(r"= \S+ (slice|concatenate|transpose|copy|dynamic-slice)\(", hlo)
    assert not ops, f"the compiled program copies: {ops}"
    fwd = re.search(r"custom-call\((%[\w.]+)\), custom_call_target=\"strideattn_forward\"", hlo)
    assert fwd and re.search(re.escape(fwd.group(1)) + r" = f16\[6,2,8,16\]\S* parameter\(0\)", hlo)


@pytest.mark.parametrize(
    "kv_axes,kv_shape", [("bs2hd", (2, 13, 2, 2, 16)), ("bshd", (2, 13, 4, 16))]
)
def test_kvpacked(rng, seed, kv_axes, kv_shape):
    dtype = jnp.float16
    b, s_q, h, d = 2, 8, 4, 16
    q, qn = rand(rng, (b, s_q, h, d), dtype)
    kv, kvn = rand(rng, kv_shape, dtype)
    if "2" in kv_axes:
        k, v = kvn[:, :, 0], kvn[:, :, 1]
    else:
        k, v = np.split(kvn, 2, axis=2)
    do, don = rand(rng, (b, s_q, h, d), dtype)
    fn = lambda q, kv: sj.attention_kvpacked(q, kv, kv_axes=kv_axes, mask="causal_bottom_right")  # noqa: E731
    (_, o), (dq, dkv) = loss_and_grads(fn, (0, 1))(q, kv, do)
    assert dkv.shape == kv.shape
    g = f32(dkv)
    dk, dv = (g[:, :, 0], g[:, :, 1]) if "2" in kv_axes else np.split(g, 2, axis=2)
    check_all(qn, k, v, f32(o), don, [f32(dq), dk, dv], dtype, seed, mask="causal_bottom_right")


# ----------------------------------------------------------------------------- varlen


def varlen_case(rng, dtype):
    h, hg, d = 4, 2, 16
    seqlens_q, seqlens_kv = [5, 0, 7], [6, 3, 4]
    offsets_q, offsets_kv = [1, 7, 8], [0, 7, 11]  # gaps and a tail: padding tokens
    t_q, t_kv = 17, 16
    (q, qn), (k, kn), (v, vn) = (
        rand(rng, (t, n, d), dtype) for t, n in ((t_q, h), (t_kv, hg), (t_kv, hg))
    )
    do, don = rand(rng, (t_q, h, d), dtype)
    lengths = dict(
        seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, offsets_q=offsets_q, offsets_kv=offsets_kv
    )
    return (q, k, v, do), (qn, kn, vn, don), lengths


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16])
def test_varlen_static(rng, seed, dtype):
    (q, k, v, do), (qn, kn, vn, don), lengths = varlen_case(rng, dtype)
    fn = lambda q, k, v: sj.attention(q, k, v, mask="causal", **lengths)  # noqa: E731
    (_, o), grads = loss_and_grads(fn, (0, 1, 2))(q, k, v, do)
    check_all(
        qn, kn, vn, f32(o), don, [f32(g) for g in grads], dtype, seed, mask="causal", **lengths
    )
    # padding tokens (0, 6, 7, 15, 16 of q): 0 in O and dQ
    for x in (f32(o), f32(grads[0])):
        assert not x[[0, 6, 7, 15, 16]].any() and x[[2, 9]].all(axis=-1).any()


def test_varlen_read_at_run_time(rng, seed):
    # The lengths are arguments of one compiled function: two calls with different lengths
    # both match the reference, so they are read when the call runs, not baked in.
    dtype = jnp.float32
    (q, k, v, do), (qn, kn, vn, don), lengths = varlen_case(rng, dtype)

    def fn(q, k, v, sq, skv, oq, okv):
        return sj.attention(q, k, v, seqlens_q=sq, seqlens_kv=skv, offsets_q=oq, offsets_kv=okv)

    run = loss_and_grads(fn, (0, 1, 2))
    for lens in (
        lengths,
        dict(
            seqlens_q=[2, 9, 4], seqlens_kv=[7, 7, 2], offsets_q=[0, 3, 13], offsets_kv=[0, 7, 14]
        ),
    ):
        arrays = [
            jnp.asarray(lens[n], jnp.int32)
            for n in ("seqlens_q", "seqlens_kv", "offsets_q", "offsets_kv")
        ]
        (_, o), grads = run(q, k, v, *arrays, do)
        check_all(qn, kn, vn, f32(o), don, [f32(g) for g in grads], dtype, seed, **lens)
    assert run._cache_size() == 1  # one compilation served both


def test_varlen_packed(rng, seed):
    h, d, t = 2, 8, 12
    qkv, qkvn = rand(rng, (t, 3, h, d), jnp.float32)
    lens = dict(seqlens=[5, 7])
    o = jax.jit(lambda x: sj.attention_qkvpacked(x, mask="causal", **lens))(qkv)
    ref = dict(seqlens_q=[5, 7], seqlens_kv=[5, 7])
    q, k, v = (qkvn[:, i] for i in range(3))
    exact = attention_ref(q, k, v, mask="causal", **ref)
    naive = attention_ref(q, k, v, mask="causal", lowp=jnp.float32, **ref)
    check("o", f32(o), exact["o"], naive["o"], jnp.float32, seed)


# ----------------------------------------------------------------------------- bad input


def test_errors(rng):
    x = jax.device_put(jnp.zeros((2, 6, 4, 8), jnp.float32), CPU)  # eager: runs on the CPU
    cases = [
        (ValueError, "mask='bogus' is not a mask", lambda: sj.attention(x, x, x, mask="bogus")),
        (ValueError, "scale is -1", lambda: sj.attention(x, x, x, scale=-1.0)),
        (TypeError, "scale must be a real number", lambda: sj.attention(x, x, x, scale="1")),
        (ValueError, "window must be", lambda: sj.attention(x, x, x, window=(1, 2, 3))),
        (ValueError, "axes 'bsh' name 3 axes", lambda: sj.attention(x, x, x, axes="bsh")),
        (ValueError, "axes 'bssd' are not valid", lambda: sj.attention(x, x, x, axes="bssd")),
        (ValueError, "q has 5 dimensions; pass axes=", lambda: sj.attention(x[None], x, x)),
        (
            ValueError,
            r"head-dim extent 4 differs from q's 8 .*axes q 'bshd'",
            lambda: sj.attention(x, x[..., :4], x),
        ),
        (
            ValueError,
            "head-dim stride",
            lambda: sj.attention(x, x, x, axes="bsdh"),
        ),  # d not innermost
        (
            ValueError,
            "has dtype int32; supported: float16",
            lambda: sj.attention(x.astype(jnp.int32), x, x),
        ),
        (
            ValueError,
            "backend='gpu' is not a backend",
            lambda: sj.attention(x, x, x, backend="gpu"),
        ),
        (
            sa.UnsupportedError,
            "backend 'cuda' .* cannot run this problem",
            lambda: sj.attention(x, x, x, backend="cuda"),
        ),
        (
            ValueError,
            "'3' axis .* has extent 2",
            lambda: sj.attention_qkvpacked(jnp.zeros((2, 6, 2, 4, 8))),
        ),
        (
            ValueError,
            "head axis has 4 heads, not a multiple of 3",
            lambda: sj.attention_qkvpacked(x, axes="bshd"),
        ),
        (
            ValueError,
            "num_kv_heads=2 does not fit",
            lambda: sj.attention_qkvpacked(x, axes="bshd", num_kv_heads=2),
        ),
        (ValueError, "'3' axis .* has extent 6", lambda: sj.attention_qkvpacked(x)),  # default t3hd
        (
            ValueError,
            "cumulative cu_seqlens",
            lambda: sj.attention(x[0], x[0], x[0], seqlens_q=[0, 3, 6], seqlens_kv=[0, 3, 6]),
        ),
        (
            ValueError,
            "seqlens_q must be a one-dimensional int32 or int64 array",
            lambda: sj.attention(
                x[0], x[0], x[0], seqlens_q=jnp.ones(1), seqlens_kv=jnp.ones(1, jnp.int32)
            ),
        ),
        (ValueError, "must be a JAX array", lambda: sj.attention([1.0], x, x)),
    ]
    expect_raises(cases)


def expect_raises(cases):
    """Each (exception type, pattern, fn): fn() raises that type with a message matching."""
    for exc, pattern, fn in cases:
        try:
            fn()
        except exc as e:
            assert re.search(pattern, str(e)), f"expected /{pattern}/, got: {e}"
        else:
            pytest.fail(f"no {exc.__name__} matching /{pattern}/")


def test_run_time_error_carries_the_message():
    # Lengths read at run time are validated when the call runs: XLA's error carries the
    # library's code and message.
    x = jax.device_put(jnp.zeros((10, 2, 8), jnp.float32), CPU)
    fn = jax.jit(lambda x, a, b: sj.attention(x, x, x, seqlens_q=a, seqlens_kv=b))
    bad = jax.device_put(jnp.asarray([3, 9], jnp.int32), CPU)
    with pytest.raises(
        Exception, match=r"strideattn \(invalid_argument\): q: sequence 1 runs to token 12"
    ):
        fn(x, bad, jax.device_put(jnp.asarray([3, 3], jnp.int32), CPU)).block_until_ready()


def query_forward(views, rets=(("float32", [2, 6, 4, 8]),), **extra):
    args = [("float32", [2, 6, 4, 8])] * 3
    attrs = dict(mask="none", backend="auto", varlen=0, workspace=-1, **views, **extra)
    return _jax_ffi.query(False, False, args, list(rets), attrs)


def dense_view(buf, shape):
    out = [buf]
    for role, n in enumerate(shape):
        out += [role, 0, n]
    return out


def test_handler_checks():
    # The handler's own checks of the view descriptions (planted errors): each must be
    # refused, never read or written out of bounds, never leave a result element unwritten.
    full = {n: dense_view(i, [2, 6, 4, 8]) for i, n in enumerate("qkv")}
    ok = query_forward(dict(full, o=dense_view(0, [2, 6, 4, 8])))
    assert ok[0] == "ok", ok
    bad = [
        (dict(full, q=[7] + full["q"][1:]), "q view: names argument 7 of 3"),
        (dict(full, q=full["q"][:-3]), "q view: describes 3 axes"),
        (
            dict(full, q=[0, 0, 0, 2, 1, 0, 6, 2, 0, 4, 3, 0, 9]),
            r"axis 3 takes \[0, 9\) of extent 8",
        ),
        (dict(full, q=[0, 0, 0, 2, 0, 0, 6, 2, 0, 4, 3, 0, 8]), "axis 1 has role 0"),
        (dict(full, q=[0, 0, 0, 2, 1, 0, 6, -1, 1, 2, 3, 0, 8]), r"axis 2 takes \[1, 3\)"),
        # O covering half of its result buffer: the rest would reach JAX unwritten
        (dict(full, o=[0, 0, 0, 1, 1, 0, 6, 2, 0, 4, 3, 0, 8]), "every element must be written"),
    ]
    for views, pattern in bad:
        code, msg, _ = query_forward(views)
        assert code in ("invalid_argument", "internal") and re.search(pattern, msg), (code, msg)


# ----------------------------------------------------------------------------- GPU


@pytest.mark.parametrize("backend", ["cuda", "cudnn"])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_gpu_packed_sbhd_grad(rng, seed, backend, dtype):
    dev = gpu_device()
    if backend not in sa.compiled_backends():
        pytest.skip(f"this strideattn build has no {backend} backend")
    s, b, h, hg, d = 256, 2, 8, 2, 64
    qkv, qkvn = rand(rng, (s, b, h + 2 * hg, d), dtype, dev)
    do, don = rand(rng, (s, b, h, d), dtype, dev)
    fn = lambda x: sj.attention_qkvpacked(  # noqa: E731
        x, axes="sbhd", num_kv_heads=hg, mask="causal", backend=backend
    )
    (_, o), grad = loss_and_grads(fn, 0)(qkv, do)
    assert next(iter(o.devices())).platform == "gpu" and grad.shape == qkv.shape
    q, k, v = (to_bshd(p, "sbhd") for p in np.split(qkvn, [h, h + hg], axis=2))
    gq, gk, gv = (to_bshd(p, "sbhd") for p in np.split(f32(grad), [h, h + hg], axis=2))
    check_all(
        q,
        k,
        v,
        to_bshd(f32(o), "sbhd"),
        to_bshd(don, "sbhd"),
        [gq, gk, gv],
        dtype,
        seed,
        mask="causal",
    )


@pytest.mark.parametrize("backend", ["auto", "cuda", "cudnn"])
def test_gpu_bshd_gqa_window(rng, seed, backend):
    dev = gpu_device()
    if backend != "auto" and backend not in sa.compiled_backends():
        pytest.skip(f"this strideattn build has no {backend} backend")
    dtype = jnp.bfloat16
    b, s_q, s_kv, h, hg, d = 2, 200, 333, 8, 2, 128
    (q, qn), (k, kn), (v, vn) = (
        rand(rng, (b, s, n, d), dtype, dev) for s, n in ((s_q, h), (s_kv, hg), (s_kv, hg))
    )
    do, don = rand(rng, (b, s_q, h, d), dtype, dev)
    opts = dict(mask="causal_bottom_right", window=(64, 0))
    fn = lambda q, k, v: sj.attention(q, k, v, backend=backend, **opts)  # noqa: E731
    (_, o), grads = loss_and_grads(fn, (0, 1, 2))(q, k, v, do)
    check_all(qn, kn, vn, f32(o), don, [f32(g) for g in grads], dtype, seed, **opts)


def test_gpu_varlen(rng, seed):
    dev = gpu_device()
    dtype = jnp.float16
    (q, k, v, do), (qn, kn, vn, don), lengths = varlen_case(rng, dtype)
    q, k, v, do = (jax.device_put(x, dev) for x in (q, k, v, do))
    fn = lambda q, k, v: sj.attention(q, k, v, mask="causal", backend="cuda", **lengths)  # noqa: E731
    (_, o), grads = loss_and_grads(fn, (0, 1, 2))(q, k, v, do)
    check_all(
        qn, kn, vn, f32(o), don, [f32(g) for g in grads], dtype, seed, mask="causal", **lengths
    )
    # Lengths as JAX arrays are read on the host: on the GPU the message points at the
    # cu_seqlens arrays, which the kernels read (test_jax_cu_seqlens.py).
    arrays = {n: jax.device_put(jnp.asarray(x, jnp.int32), dev) for n, x in lengths.items()}
    with pytest.raises(sa.UnsupportedError, match="on the GPU pass cu_seqlens_q/cu_seqlens_kv"):
        sj.attention(q, k, v, **arrays)  # eager: refused when traced
    # Under jit the CPU platform could run it, so the GPU handler refuses it when it runs.
    fn = jax.jit(lambda q, k, v, a, b: sj.attention(q, k, v, seqlens_q=a, seqlens_kv=b))
    with pytest.raises(Exception, match=r"strideattn \(unsupported\): .*pass cu_seqlens_q"):
        fn(q, k, v, arrays["seqlens_q"], arrays["seqlens_kv"]).block_until_ready()
