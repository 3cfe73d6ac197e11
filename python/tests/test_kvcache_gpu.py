"""GPU tests of strideattn.attention_with_kvcache on CuPy arrays and on JAX arrays on the GPU
(lengths and block table on the device too), on the cuda and cudnn backends, against the fp64
numpy model npref.kvcache_ref under the correctness rule: paged caches (shuffled and shared
block tables, -1 past the pages in use, lengths 0 / 1 / page boundaries) and contiguous ones,
appends into CuPy caches (the appended slots hold the new tokens, every other byte is
unchanged), JAX's read-only caches. Cache slots no sequence uses hold NaN, so a read of them
shows. Each test skips, saying why, without CuPy / JAX, a GPU, or the backend in this build."""

import numpy as np
import pytest

import strideattn as sa
from npref import check, kvcache_ref

GPU_BACKENDS = ["cuda", "cudnn"]


def need_backend(backend):
    if backend not in sa.compiled_backends():
        pytest.skip(f"this strideattn build has no {backend} backend")


def cupy_or_skip():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("CuPy sees no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError as e:
        pytest.skip(f"CuPy sees no CUDA device ({e})")
    return cupy


def jax_gpu_or_skip():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("JAX has no GPU device here")
    return jax, gpus[0]


def make_case(rng, lens, *, page, s_q=1, s_new=0, h=8, hg=2, d=64, share=0, unused=np.nan):
    """numpy float16 inputs: q, caches with `unused` (NaN; cudnn: a large finite value, the
    limit docs/backends.md states) in every slot no sequence holds, the block
    table (shuffled pages, -1 past the pages each sequence uses, `share` pages of sequence 0
    read by every sequence) or None for a contiguous cache, and the new tokens."""
    b = len(lens)
    lens = np.asarray(lens, np.int32)
    dt = np.float16
    q = rng.standard_normal((b, s_q, h, d)).astype(dt)
    if page is None:
        cap = int(lens.max()) + s_new + 3
        valid = np.arange(cap)[None, :] < lens[:, None]
        shape, table = (b, cap, hg, d), None
    else:
        used = [-(-(int(n) + s_new) // page) for n in lens]
        max_pages = max(used) + 1
        num_pages = sum(used) - share * (b - 1) + 2
        order = rng.permutation(num_pages)
        table = np.full((b, max_pages), -1, np.int32)
        valid = np.zeros((num_pages, page), bool)
        nxt = 0
        for n in range(b):
            for j in range(used[n]):
                if n > 0 and j < share:
                    table[n, j] = table[0, j]
                else:
                    table[n, j] = order[nxt]
                    nxt += 1
            for t in range(int(lens[n])):
                valid[table[n, t // page], t % page] = True
        shape = (num_pages, page, hg, d)

    def cache():
        c = np.full(shape, unused, dt)
        c[valid] = rng.standard_normal(shape).astype(dt)[valid]
        return c

    kc, vc = cache(), cache()
    k = rng.standard_normal((b, s_new, hg, d)).astype(dt) if s_new else None
    v = rng.standard_normal((b, s_new, hg, d)).astype(dt) if s_new else None
    return dict(q=q, kc=kc, vc=vc, table=table, k=k, v=v, lens=lens)


def references(case, **opts):
    args = dict(
        cache_seqlens=case["lens"],
        k_new=case["k"],
        v_new=case["v"],
        block_table=case["table"],
        **opts,
    )
    exact = kvcache_ref(case["q"], case["kc"], case["vc"], **args)
    naive = kvcache_ref(case["q"], case["kc"], case["vc"], lowp=np.float16, **args)
    return exact, naive


# What fills the slots no sequence holds: NaN, except on cudnn, which reads them (times 0) and
# needs finite values there (docs/backends.md, "Limit: unused cache slots ...").
UNUSED = {"cuda": np.nan, "cudnn": 3.0e4}


def refused_page(backend, page) -> bool:
    """cudnn takes power-of-two page sizes only (rule kv_cache_page_size)."""
    return backend == "cudnn" and page is not None and page & (page - 1) != 0


CASES = [
    # (page size, cached lengths, s_q, s_new, shared pages)
    (16, [0, 1, 15, 16, 17, 100], 1, 0, 0),
    (16, [0, 1, 16, 33], 1, 1, 0),
    (3, [5, 3, 0, 9], 2, 2, 0),
    (16, [40, 35, 70], 1, 1, 2),  # sequences 1, 2 read sequence 0's first two pages
    (None, [0, 1, 64, 65, 200], 1, 2, 0),
]


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("page,lens,s_q,s_new,share", CASES)
def test_cupy(seed, backend, page, lens, s_q, s_new, share):
    cupy = cupy_or_skip()
    need_backend(backend)
    rng = np.random.default_rng(seed)
    case = make_case(
        rng, lens, page=page, s_q=s_q, s_new=s_new, share=share, unused=UNUSED[backend]
    )
    opts = dict(mask="causal_bottom_right")
    exact, naive = references(case, **opts)
    dev = {
        k: None if x is None else cupy.asarray(x)
        for k, x in case.items()
        if k in ("q", "kc", "vc", "table", "k", "v", "lens")
    }
    call = dict(cache_seqlens=dev["lens"], block_table=dev["table"], backend=backend, **opts)
    if refused_page(backend, page):
        with pytest.raises(sa.UnsupportedError, match="kv_cache_page_size"):
            sa.attention_with_kvcache(dev["q"], dev["kc"], dev["vc"], dev["k"], dev["v"], **call)
        return
    o, lse = sa.attention_with_kvcache(
        dev["q"], dev["kc"], dev["vc"], dev["k"], dev["v"], return_lse=True, **call
    )
    assert isinstance(o, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    assert o.dtype == cupy.float16 and o.shape == case["q"].shape
    check("o", cupy.asnumpy(o), exact["o"], naive["o"], np.float16, seed)
    check("lse", cupy.asnumpy(lse), exact["lse"], naive["lse"], np.float16, seed, lse=True)
    for name, key in (("k_cache", "kc"), ("v_cache", "vc")):
        got = cupy.asnumpy(dev[key])
        assert np.array_equal(got, exact[name], equal_nan=True), f"{name} differs (seed {seed})"


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_cupy_planted_error_is_caught(seed, backend):
    """The comparison is not vacuous: a changed V element of an attended token fails O."""
    cupy = cupy_or_skip()
    need_backend(backend)
    rng = np.random.default_rng(seed)
    case = make_case(rng, [20, 9], page=16, unused=UNUSED[backend])
    exact, naive = references(case)
    vc = case["vc"].copy()
    vc[case["table"][0, 0], 3, 0, 5] += np.float16(64)
    o = sa.attention_with_kvcache(
        cupy.asarray(case["q"]),
        cupy.asarray(case["kc"]),
        cupy.asarray(vc),
        cache_seqlens=cupy.asarray(case["lens"]),
        block_table=cupy.asarray(case["table"]),
        backend=backend,
    )
    with pytest.raises(AssertionError, match="max abs error"):
        check("o", cupy.asnumpy(o), exact["o"], naive["o"], np.float16, seed)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize(
    "page,lens,s_q", [(16, [0, 1, 16, 17, 90], 1), (5, [7, 0, 10], 3), (None, [3, 50], 2)]
)
def test_jax_gpu(seed, backend, page, lens, s_q):
    jax, gpu = jax_gpu_or_skip()
    need_backend(backend)
    rng = np.random.default_rng(seed)
    case = make_case(rng, lens, page=page, s_q=s_q, unused=UNUSED[backend])
    seqlens_q = np.asarray([s_q - (n % s_q) for n in range(len(lens))], np.int32)
    opts = dict(mask="causal_bottom_right", seqlens_q=seqlens_q)
    exact, naive = references(case, **opts)

    def put(x):
        return None if x is None else jax.device_put(x, gpu)

    call = dict(
        cache_seqlens=put(case["lens"]),
        block_table=put(case["table"]),
        seqlens_q=put(seqlens_q),
        mask="causal_bottom_right",
        backend=backend,
    )
    if refused_page(backend, page):
        with pytest.raises(sa.UnsupportedError, match="kv_cache_page_size"):
            sa.attention_with_kvcache(put(case["q"]), put(case["kc"]), put(case["vc"]), **call)
        return
    o, lse = sa.attention_with_kvcache(
        put(case["q"]), put(case["kc"]), put(case["vc"]), return_lse=True, **call
    )
    assert next(iter(o.devices())).platform == "gpu"
    check("o", np.asarray(o), exact["o"], naive["o"], np.float16, seed)
    check("lse", np.asarray(lse), exact["lse"], naive["lse"], np.float16, seed, lse=True)
