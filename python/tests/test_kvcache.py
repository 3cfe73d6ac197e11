"""CPU tests of strideattn.attention_with_kvcache (docs/semantics.md "KV cache") on numpy
arrays, against the plain-numpy model npref.kvcache_ref under the correctness rule: contiguous
and paged caches, shuffled and shared block tables, lengths 0 / 1 / at page boundaries,
appends that cross pages, strided (head-major) caches, and that the caches change exactly at
the appended slots. Unused pages and slots past each length hold NaN, so a read of them shows.
Also bad input (messages with shapes and dtypes, never contents), explain_with_kvcache, and
PyTorch / JAX CPU tensors."""

import re

import numpy as np
import pytest

import strideattn as sa
from npref import check, kvcache_ref

BACKENDS = ["reference", "cpu"]


def randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def poisoned_cache(rng, shape, dtype, valid):
    """A cache of `shape` holding random values where `valid` (bool, shape[:2]) and NaN
    elsewhere."""
    c = np.full(shape, np.nan, dtype)
    c[valid] = randn(rng, shape, dtype)[valid]
    return c


def paged_setup(rng, lens, s_new, page, num_pages=None, shuffle=True, share=0, extra_pages=1):
    """A block table [b, max_pages] for lengths `lens` plus s_new appended tokens: distinct
    pages in shuffled order, -1 past the pages each sequence uses; with `share` > 0 every
    sequence reads the first `share` pages of sequence 0 (a shared prompt prefix, whose
    tokens no one appends to). Returns (table, num_pages, valid [num_pages, page] of the slots
    holding cached tokens)."""
    b = len(lens)
    used = [-(-(n + s_new) // page) for n in lens]
    max_pages = max(used) + extra_pages
    need = sum(used) - share * (b - 1)
    num_pages = num_pages or need + 3
    order = rng.permutation(num_pages) if shuffle else np.arange(num_pages)
    table = np.full((b, max_pages), -1, np.int32)
    valid = np.zeros((num_pages, page), bool)
    nxt = 0
    for n in range(b):
        for j in range(used[n]):
            if n > 0 and j < share:
                table[n, j] = table[0, j]
                continue
            table[n, j] = order[nxt]
            nxt += 1
        for t in range(lens[n]):
            valid[table[n, t // page], t % page] = True
    return table, num_pages, valid


def run_case(
    rng,
    *,
    lens,
    s_q=1,
    s_new=0,
    h=4,
    hg=2,
    d=16,
    d_v=None,
    page=None,
    dtype=np.float32,
    backend="cpu",
    seqlens_q=None,
    share=0,
    shuffle=True,
    head_major=False,
    seed=0,
    **opts,
):
    b = len(lens)
    d_v = d_v or d
    lens = np.asarray(lens, np.int32)
    q = randn(rng, (b, s_q, h, d), dtype)
    if page is None:
        cap = int(lens.max()) + s_new + 2
        valid = np.arange(cap)[None, :] < lens[:, None]
        shape_k, shape_v, table = (b, cap, hg, d), (b, cap, hg, d_v), None
    else:
        table, num_pages, valid = paged_setup(
            rng, lens.tolist(), s_new, page, share=share, shuffle=shuffle
        )
        shape_k, shape_v = (num_pages, page, hg, d), (num_pages, page, hg, d_v)
    if head_major:  # caches laid out [row, head, slot, d], viewed as [row, slot, head, d]

        def make(shape):
            phys = (shape[0], shape[2], shape[1], shape[3])
            c = poisoned_cache(rng, (shape[0], shape[1], shape[2], shape[3]), dtype, valid)
            buf = np.ascontiguousarray(c.transpose(0, 2, 1, 3))
            assert buf.shape == phys
            return buf.transpose(0, 2, 1, 3)

        kc, vc = make(shape_k), make(shape_v)
        assert not kc.flags.c_contiguous
    else:
        kc, vc = (
            poisoned_cache(rng, shape_k, dtype, valid),
            poisoned_cache(rng, shape_v, dtype, valid),
        )
    k_new = randn(rng, (b, s_new, hg, d), dtype) if s_new else None
    v_new = randn(rng, (b, s_new, hg, d_v), dtype) if s_new else None
    sq = None if seqlens_q is None else np.asarray(seqlens_q, np.int32)
    exact = kvcache_ref(
        q,
        kc,
        vc,
        cache_seqlens=lens,
        k_new=k_new,
        v_new=v_new,
        block_table=table,
        seqlens_q=sq,
        **opts,
    )
    naive = kvcache_ref(
        q,
        kc,
        vc,
        cache_seqlens=lens,
        k_new=k_new,
        v_new=v_new,
        block_table=table,
        seqlens_q=sq,
        lowp=dtype,
        **opts,
    )
    o, lse = sa.attention_with_kvcache(
        q,
        kc,
        vc,
        k_new,
        v_new,
        cache_seqlens=lens,
        block_table=table,
        seqlens_q=sq,
        backend=backend,
        return_lse=True,
        **opts,
    )
    assert o.shape == (b, s_q, h, d_v) and o.dtype == q.dtype
    check("o", o, exact["o"], naive["o"], dtype, seed)
    check("lse", lse, exact["lse"], naive["lse"], dtype, seed, lse=True)
    # The caches: the appended slots hold the new tokens, everything else (NaN included) is
    # bit-for-bit what it was.
    for name, got, want in (("k_cache", kc, exact["k_cache"]), ("v_cache", vc, exact["v_cache"])):
        assert np.array_equal(got, want, equal_nan=True), f"{name} differs (seed {seed})"
    return o, lse, (kc, vc)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("s_new", [0, 1, 3])
def test_contiguous(backend, dtype, s_new):
    seed = 100 + s_new
    rng = np.random.default_rng(seed)
    run_case(
        rng,
        lens=[5, 0, 1, 9],
        s_q=2,
        s_new=s_new,
        dtype=dtype,
        backend=backend,
        mask="causal_bottom_right",
        seed=seed,
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page", [1, 3, 4, 16])
@pytest.mark.parametrize("s_new", [0, 1, 5])
def test_paged_shuffled(backend, page, s_new):
    # Lengths at and around page boundaries; appends of 5 cross one or more pages.
    seed = 200 + 10 * page + s_new
    rng = np.random.default_rng(seed)
    lens = [0, 1, page - 1, page, page + 1, 2 * page, 3 * page - 1]
    lens = [max(0, n) for n in lens]
    run_case(
        rng,
        lens=lens,
        s_new=s_new,
        page=page,
        backend=backend,
        mask="causal_bottom_right",
        seed=seed,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_shared_prefix(backend):
    # Sequences 1..3 read the first two pages of sequence 0 (a shared prompt) and append to
    # pages of their own.
    seed = 300
    rng = np.random.default_rng(seed)
    _, _, (kc, _) = run_case(
        rng, lens=[9, 10, 8, 12], s_new=2, page=4, share=2, backend=backend, seed=seed
    )


def test_paged_equals_contiguous():
    # The same tokens in a contiguous cache and scattered over pages give the same O.
    rng = np.random.default_rng(7)
    b, hg, h, d, page = 3, 2, 4, 8, 4
    lens = np.array([6, 11, 1], np.int32)
    cap = 12
    kc = randn(rng, (b, cap, hg, d), np.float32)
    vc = randn(rng, (b, cap, hg, d), np.float32)
    q = randn(rng, (b, 1, h, d), np.float32)
    table = rng.permutation(b * cap // page).astype(np.int32).reshape(b, cap // page)
    kp = np.zeros((b * cap // page, page, hg, d), np.float32)
    vp = np.zeros_like(kp)
    for n in range(b):
        for t in range(cap):
            kp[table[n, t // page], t % page] = kc[n, t]
            vp[table[n, t // page], t % page] = vc[n, t]
    a = sa.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, backend="cpu")
    p = sa.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table, backend="cpu")
    np.testing.assert_allclose(p, a, rtol=0, atol=1e-6)
    assert np.abs(a).max() > 0.1  # a real result, not zeros on both sides


@pytest.mark.parametrize(
    "opts",
    [
        dict(mask="none"),
        dict(mask="causal"),
        dict(mask="causal_bottom_right", window=(3, 0)),
        dict(window=(2, 1), scale=0.3),
    ],
)
def test_masks_gqa_seqlens_q(opts):
    # Chunked prefill / speculative decoding: 4 query rows, some sequences using fewer.
    seed = 400
    rng = np.random.default_rng(seed)
    run_case(
        rng,
        lens=[7, 3, 0, 12],
        s_q=4,
        s_new=4,
        h=6,
        hg=2,
        d=8,
        d_v=12,
        page=5,
        seqlens_q=[4, 1, 0, 3],
        seed=seed,
        **opts,
    )


@pytest.mark.parametrize("page", [None, 4])
def test_head_major_caches(page):
    seed = 500
    rng = np.random.default_rng(seed)
    run_case(
        rng,
        lens=[3, 8, 4],
        s_new=2,
        page=page,
        head_major=True,
        mask="causal_bottom_right",
        seed=seed,
    )


def test_decode_loop_matches_full_attention():
    # Appending one token per step and attending equals attention over the whole prefix.
    rng = np.random.default_rng(600)
    b, h, hg, d, page, steps = 2, 4, 2, 8, 3, 7
    kc = np.zeros((8, page, hg, d), np.float32)
    vc = np.zeros_like(kc)
    table = np.array([[5, 0, 7], [2, 6, 1]], np.int32)
    lens = np.array([0, 2], np.int32)
    ks = randn(rng, (b, steps + 2, hg, d), np.float32)
    vs = randn(rng, (b, steps + 2, hg, d), np.float32)
    # sequence 1 starts with two cached tokens
    for t in range(2):
        kc[table[1, 0], t], vc[table[1, 0], t] = ks[1, t], vs[1, t]
    for step in range(steps):
        q = randn(rng, (b, 1, h, d), np.float32)
        k_new = np.stack([ks[n, lens[n]][None] for n in range(b)])
        v_new = np.stack([vs[n, lens[n]][None] for n in range(b)])
        o = sa.attention_with_kvcache(
            q,
            kc,
            vc,
            k_new,
            v_new,
            cache_seqlens=lens,
            block_table=table,
            mask="causal_bottom_right",
            backend="cpu",
        )
        for n in range(b):
            ln = int(lens[n]) + 1
            want = sa.attention(
                q[n : n + 1], ks[n : n + 1, :ln], vs[n : n + 1, :ln], backend="reference"
            )
            np.testing.assert_allclose(o[n : n + 1], want, rtol=0, atol=2e-6)
        lens += 1


def test_out_view_and_zero_rows():
    # out= is a strided view; a sequence with nothing cached and no append gets O 0, LSE -inf.
    rng = np.random.default_rng(700)
    q = randn(rng, (2, 1, 2, 8), np.float32)
    kc = randn(rng, (2, 5, 1, 8), np.float32)
    vc = randn(rng, (2, 5, 1, 8), np.float32)
    buf = np.full((2, 2, 1, 16), np.nan, np.float32)
    out = buf.transpose(0, 2, 1, 3)[..., :8]
    o, lse = sa.attention_with_kvcache(
        q, kc, vc, cache_seqlens=[0, 5], out=out, return_lse=True, backend="cpu"
    )
    assert o is out
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[0]))
    assert np.isnan(buf[..., 8:]).all(), "wrote outside the out view"
    exact = kvcache_ref(q, kc, vc, cache_seqlens=[0, 5])
    np.testing.assert_allclose(out, exact["o"], rtol=0, atol=2e-6)


def test_int_and_list_lengths():
    rng = np.random.default_rng(800)
    q = randn(rng, (3, 1, 2, 8), np.float32)
    kc = randn(rng, (3, 6, 2, 8), np.float32)
    vc = randn(rng, (3, 6, 2, 8), np.float32)
    a = sa.attention_with_kvcache(q, kc, vc, cache_seqlens=4, backend="cpu")
    b_ = sa.attention_with_kvcache(q, kc, vc, cache_seqlens=np.full(3, 4, np.int32), backend="cpu")
    c = sa.attention_with_kvcache(q, kc, vc, cache_seqlens=[4, 4, 4], backend="cpu")
    np.testing.assert_array_equal(a, b_)
    np.testing.assert_array_equal(a, c)
    exact = kvcache_ref(q, kc, vc, cache_seqlens=[4, 4, 4])
    np.testing.assert_allclose(a, exact["o"], rtol=0, atol=2e-6)


# ----------------------------------------------------------------------------- bad input


def _small(rng, paged=True):
    q = randn(rng, (2, 1, 4, 8), np.float32)
    shape = (6, 4, 2, 8) if paged else (2, 12, 2, 8)
    kc, vc = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    table = np.array([[0, 1, 2], [3, 4, 5]], np.int32) if paged else None
    k = randn(rng, (2, 1, 2, 8), np.float32)
    return q, kc, vc, table, k, k.copy()


def _raises(fn, *needles):
    with pytest.raises(ValueError) as e:
        fn()
    msg = str(e.value)
    for n in needles:
        assert n in msg, msg
    assert not re.search(r"\d\.\d\d\d|\[\[", msg), f"array contents in the message: {msg}"
    return msg


def test_errors():
    rng = np.random.default_rng(900)
    q, kc, vc, table, k, v = _small(rng)
    call = sa.attention_with_kvcache
    _raises(
        lambda: call(q, kc, vc, cache_seqlens=np.array([3, 5]), block_table=table),
        "cache_seqlens",
        "int64",
        "int32",
    )
    _raises(
        lambda: call(q, kc, vc, cache_seqlens=[3, 5, 1], block_table=table),
        "cache_seqlens has 3 entries",
        "2",
    )
    _raises(
        lambda: call(q, kc, vc, cache_seqlens=[3, 13], block_table=table),
        "cache_seqlens[1] is 13",
        "capacity of 12",
    )
    _raises(
        lambda: call(q, kc, vc, k, v, cache_seqlens=[3, 12], block_table=table),
        "cache_seqlens[1] is 12",
        "1 new tokens",
    )
    _raises(
        lambda: call(q, kc, vc, cache_seqlens=[3, 5], block_table=table.astype(np.int64)),
        "block_table has dtype int64",
        "int32",
    )
    _raises(
        lambda: call(q, kc, vc, cache_seqlens=[3, 5], block_table=table[0]),
        "block_table has 1 dimensions",
    )
    _raises(
        lambda: call(q, kc[0], vc, cache_seqlens=[3, 5], block_table=table),
        "k_cache must have 4 dimensions",
        "(4, 2, 8)",
    )
    _raises(
        lambda: call(q, kc, vc, k, cache_seqlens=[3, 5], block_table=table), "k is given without v"
    )
    _raises(
        lambda: call(q, kc, vc, k.astype(np.float16), v, cache_seqlens=[3, 5], block_table=table),
        "dtype",
    )
    _raises(
        lambda: call(q, kc, vc, k[:, :, :1], v, cache_seqlens=[3, 5], block_table=table),
        "head extent 1",
    )
    bad_table = table.copy()
    bad_table[1, 1] = 6
    _raises(
        lambda: call(q, kc, vc, cache_seqlens=[3, 5], block_table=bad_table),
        "block_table[1, 1] is 6",
    )
    shared = table.copy()
    shared[1, 0] = 0  # both sequences append to slot 3 of page 0
    _raises(
        lambda: call(q, kc, vc, k, v, cache_seqlens=[3, 3], block_table=shared),
        "two sequences append to slot 3 of page 0",
    )
    _raises(lambda: call(q, kc, vc, cache_seqlens=None, block_table=table), "cache_seqlens")
    _raises(
        lambda: call(q, kc, vc, cache_seqlens=[3, 5], block_table=table, mask="diag"), "mask='diag'"
    )
    ro = kc.copy()
    ro.setflags(write=False)
    _raises(
        lambda: call(q, ro, vc, k, v, cache_seqlens=[3, 5], block_table=table),
        "k_cache is a read-only numpy array",
        "written into the caches",
    )
    # Without an append a read-only cache is fine.
    call(q, ro, vc, cache_seqlens=[3, 5], block_table=table, backend="cpu")
    # Nothing was written by the refused calls.
    assert not kc.any() and not vc.any()


def test_contiguous_batch_mismatch_hints_paged():
    rng = np.random.default_rng(901)
    q, kc, vc, _, _, _ = _small(rng)
    _raises(
        lambda: sa.attention_with_kvcache(q, kc, vc, cache_seqlens=[1, 1]),
        "k_cache: batch extent 6",
        "block_table",
    )


def test_explain():
    rng = np.random.default_rng(902)
    q, kc, vc, table, k, v = _small(rng)
    ex = sa.explain_with_kvcache(q, kc, vc, k, v, cache_seqlens=[3, 5], block_table=table)
    assert ex["valid"] and ex["chosen"] in ("cpu", "reference")
    assert "paged cache: 6 pages of 4 tokens" in ex["layout"]
    assert "appends 1 tokens" in ex["layout"]
    assert not kc.any(), "explain wrote into the cache"
    ex = sa.explain_with_kvcache(q, kc, vc, cache_seqlens=[3], block_table=table)
    assert not ex["valid"] and "cache_seqlens has 1 entries" in ex["error"]
    cuda = [x for x in ex["verdicts"] if x["backend"] == "cuda"]
    assert cuda == [] or not cuda[0]["supported"]


# ----------------------------------------------------------------------------- frameworks


def test_torch_cpu():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1000)
    q, kc, vc, table, k, v = _small(rng)
    kc[...] = randn(rng, kc.shape, np.float32)
    vc[...] = randn(rng, vc.shape, np.float32)
    lens = np.array([3, 6], np.int32)
    exact = kvcache_ref(
        q,
        kc,
        vc,
        cache_seqlens=lens,
        k_new=k,
        v_new=v,
        block_table=table,
        mask="causal_bottom_right",
    )
    tk, tv = torch.from_numpy(kc.copy()), torch.from_numpy(vc.copy())
    o = sa.attention_with_kvcache(
        torch.from_numpy(q),
        tk,
        tv,
        torch.from_numpy(k),
        torch.from_numpy(v),
        cache_seqlens=torch.from_numpy(lens),
        block_table=torch.from_numpy(table),
        mask="causal_bottom_right",
        backend="cpu",
    )
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float32
    np.testing.assert_allclose(o.numpy(), exact["o"], rtol=0, atol=2e-6)
    np.testing.assert_array_equal(tk.numpy(), exact["k_cache"])
    np.testing.assert_array_equal(tv.numpy(), exact["v_cache"])
    with pytest.raises(ValueError, match="int32"):
        sa.attention_with_kvcache(
            torch.from_numpy(q),
            tk,
            tv,
            cache_seqlens=torch.tensor([3, 6]),
            block_table=torch.from_numpy(table),
        )


def test_jax_cpu_read_only():
    jax = pytest.importorskip("jax")
    cpu = jax.devices("cpu")[0]

    def put(x):  # on JAX's CPU device, also where JAX's default device is a GPU
        return jax.device_put(x, cpu)

    rng = np.random.default_rng(1100)
    q, kc, vc, table, k, v = _small(rng)
    kc[...] = randn(rng, kc.shape, np.float32)
    vc[...] = randn(rng, vc.shape, np.float32)
    exact = kvcache_ref(q, kc, vc, cache_seqlens=[4, 7], block_table=table)
    o = sa.attention_with_kvcache(
        put(q),
        put(kc),
        put(vc),
        cache_seqlens=[4, 7],
        block_table=put(table),
        backend="cpu",
    )
    np.testing.assert_allclose(np.asarray(o), exact["o"], rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="immutable"):
        sa.attention_with_kvcache(
            put(q),
            put(kc),
            put(vc),
            put(k),
            put(v),
            cache_seqlens=[4, 7],
            block_table=put(table),
        )


def test_readme_kvcache_snippet_runs(capsys):
    import pathlib

    text = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    blocks = [
        b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "attention_with_kvcache" in b
    ]
    assert len(blocks) == 1, "README.md lost its KV-cache decode loop"
    exec(compile(blocks[0], "README.md (KV-cache decode loop)", "exec"), {})
    assert capsys.readouterr().out.strip() == "(2, 1, 8, 64) [24 24]"


def test_torch_cuda_paged_decode():
    """The cuda backend through the Python API on CUDA tensors (lengths and block table on the
    device): the appended cache slots are k / v exactly, every other cache byte is unchanged,
    and O and the LSE agree with the cpu backend on the same bf16 inputs within bf16 rounding
    (the C++ tests judge the kernels by the full correctness rule)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    g = torch.Generator().manual_seed(1001)
    bf = torch.bfloat16
    b, h, hg, d, page, pages = 3, 8, 2, 64, 16, 8
    q = torch.randn(b, 1, h, d, generator=g).to(bf)
    kc = torch.randn(b * pages, page, hg, d, generator=g).to(bf)
    vc = torch.randn(b * pages, page, hg, d, generator=g).to(bf)
    k = torch.randn(b, 1, hg, d, generator=g).to(bf)
    v = torch.randn(b, 1, hg, d, generator=g).to(bf)
    table = torch.randperm(b * pages, generator=g).to(torch.int32).reshape(b, pages)
    lens = torch.tensor([0, 17, 100], dtype=torch.int32)
    results = {}
    for backend, dev in (("cpu", "cpu"), ("cuda", "cuda")):
        tk, tv = kc.clone().to(dev), vc.clone().to(dev)
        o, lse = sa.attention_with_kvcache(
            q.to(dev),
            tk,
            tv,
            k.to(dev),
            v.to(dev),
            cache_seqlens=lens.to(dev),
            block_table=table.to(dev),
            mask="causal_bottom_right",
            return_lse=True,
            backend=backend,
        )
        results[backend] = (o.float().cpu(), lse.cpu(), tk.cpu(), tv.cpu())
    o_cpu, lse_cpu, k_cpu, v_cpu = results["cpu"]
    o_gpu, lse_gpu, k_gpu, v_gpu = results["cuda"]
    assert torch.equal(k_gpu, k_cpu) and torch.equal(v_gpu, v_cpu), "the caches after the append"
    assert not torch.isnan(o_gpu).any()
    assert (o_gpu - o_cpu).abs().max().item() <= 2e-2
    assert (lse_gpu - lse_cpu).abs().max().item() <= 1e-3
