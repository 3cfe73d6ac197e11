"""CPU tests of strideattn.torch.PagedKVCache and DotProductAttention(inference_params=...):
the page allocator (pages per sequence, the block table and lengths as int32 tensors, release
and reuse), append / read, and prefill + decode loops over several layers in bshd and sbhd,
each step's output compared with the fp64 numpy reference (npref.attention_ref) over the
tokens the sequence holds, kept by the test itself."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import strideattn.torch as st  # noqa: E402
from npref import attention_ref, check  # noqa: E402


def randn(g, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def test_pages_table_and_lengths():
    c = st.PagedKVCache(3, 10, 2, 8, page_size=4)
    assert (c.max_pages, c.num_pages, c.free_pages) == (3, 9, 9)
    assert c.block_table.dtype == torch.int32 and c.cache_seqlens.dtype == torch.int32
    assert (c.block_table == -1).all()
    c.pre_step(5)  # 2 pages each
    assert c.sequence_lengths == [5, 5, 5] and c.cache_seqlens.tolist() == [0, 0, 0]
    assert (c.block_table[:, :2] >= 0).all() and (c.block_table[:, 2] == -1).all()
    assert len(set(c.block_table[:, :2].flatten().tolist())) == 6 and c.free_pages == 3
    c.pre_step(1)  # 6 tokens: still 2 pages
    assert c.cache_seqlens.tolist() == [5, 5, 5] and c.free_pages == 3
    c.pre_step(3)  # 9 tokens: 3 pages
    assert c.free_pages == 0 and (c.block_table >= 0).all()
    with pytest.raises(ValueError, match="max_seqlen 10"):
        c.pre_step(2)
    c.release(1)
    assert c.free_pages == 3 and (c.block_table[1] == -1).all()
    assert c.sequence_lengths == [9, 0, 9] and c.cache_seqlens.tolist() == [6, 0, 6]


def test_out_of_pages_is_named():
    c = st.PagedKVCache(2, 16, 1, 8, page_size=4, num_pages=3)
    with pytest.raises(ValueError, match="needs 2 more pages but 1 of 3 are free"):
        c.pre_step(8)
    assert c.free_pages == 3 and c.sequence_lengths == [0, 0]  # nothing half-allocated
    c.pre_step(4)
    assert c.free_pages == 1


def test_append_and_read_back():
    g = torch.Generator().manual_seed(1)
    c = st.PagedKVCache(2, 12, 2, 8, head_dim_v=4, page_size=3)
    ks, vs = [], []
    for step in (4, 1, 2):  # crosses page boundaries
        c.pre_step(step)
        k, v = randn(g, 2, step, 2, 8), randn(g, 2, step, 2, 4)
        c.append(k, v, layer_number=7)
        ks.append(k)
        vs.append(v)
    kr, vr = c.read(1, layer_number=7)
    torch.testing.assert_close(kr, torch.cat(ks, 1)[1].half(), rtol=0, atol=0)
    torch.testing.assert_close(vr, torch.cat(vs, 1)[1].half(), rtol=0, atol=0)
    # Only layer 7 exists; its pages outside the written slots are still zero.
    kc, _ = c.layer(7)
    assert kc.abs().sum() > 0
    written = torch.zeros(kc.shape[:2], dtype=torch.bool)
    for n in range(2):
        pages, slots = c._slots(n, 0, 7)
        written[pages, slots] = True
    assert (kc[~written] == 0).all()
    with pytest.raises(ValueError, match="step_len"):
        c.append(randn(g, 2, 3, 2, 8), randn(g, 2, 3, 2, 4), layer_number=7)


def _ref(q, keys, values, seed):
    """Reference O of one step: q [b, s, h, d] against each sequence's tokens (lists of
    [L, hg, d] tensors), bottom-right causal."""
    outs, naive = [], []
    for n in range(q.shape[0]):
        args = (q[n : n + 1].numpy(), keys[n][None].numpy(), values[n][None].numpy())
        outs.append(attention_ref(*args, mask="causal_bottom_right")["o"])
        naive.append(attention_ref(*args, mask="causal_bottom_right", lowp=np.float32)["o"])
    return np.concatenate(outs), np.concatenate(naive)


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_dpa_prefill_then_decode(fmt):
    g = torch.Generator().manual_seed(2)
    b, h, hg, d, prompt, layers = 2, 4, 2, 8, 5, 2
    cache = st.PagedKVCache(b, 16, hg, d, page_size=4, dtype=torch.float32)
    dpa = [
        st.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format=fmt,
                               attn_mask_type="causal", layer_number=i, backend="cpu")
        for i in range(layers)
    ]  # fmt: skip
    history = [[[] for _ in range(b)] for _ in range(layers)]  # per layer, per sequence
    for step in [prompt, 1, 1, 1, 3, 1]:
        cache.pre_step(step)
        for i in range(layers):
            q, k, v = randn(g, b, step, h, d), randn(g, b, step, hg, d), randn(g, b, step, hg, d)
            for n in range(b):
                history[i][n].append((k[n], v[n]))
            args = (q, k, v) if fmt == "bshd" else tuple(x.transpose(0, 1) for x in (q, k, v))
            o = dpa[i](*args, inference_params=cache)
            if fmt == "sbhd":
                assert o.shape == (step, b, h * d)
                o = o.transpose(0, 1)
            assert o.shape == (b, step, h * d)
            keys = [torch.cat([kv[0] for kv in history[i][n]]) for n in range(b)]
            values = [torch.cat([kv[1] for kv in history[i][n]]) for n in range(b)]
            exact, naive = _ref(q, keys, values, 2)
            check("o", o.reshape(b, step, h, d).numpy(), exact, naive, "float32", 2)
            kr, vr = cache.read(1, layer_number=i)
            torch.testing.assert_close(kr, keys[1], rtol=0, atol=0)
            torch.testing.assert_close(vr, values[1], rtol=0, atol=0)
    assert cache.sequence_lengths == [prompt + 7] * b


def test_release_reuses_pages_without_touching_others():
    g = torch.Generator().manual_seed(3)
    b, h, d = 2, 2, 8
    cache = st.PagedKVCache(b, 8, h, d, page_size=2, num_pages=6, dtype=torch.float32)
    dpa = st.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="padding_causal",
                                 backend="cpu")  # fmt: skip
    kept = []
    for step in (3, 1):
        cache.pre_step(step)
        q, k, v = randn(g, b, step, h, d), randn(g, b, step, h, d), randn(g, b, step, h, d)
        dpa(q, k, v, inference_params=cache)
        kept.append((k[0], v[0]))
    cache.release(1)
    cache.pre_step(2)
    q, k, v = randn(g, b, 2, h, d), randn(g, b, 2, h, d), randn(g, b, 2, h, d)
    o = dpa(q, k, v, inference_params=cache).reshape(b, 2, h, d)
    kept.append((k[0], v[0]))
    k0 = torch.cat([x[0] for x in kept])
    v0 = torch.cat([x[1] for x in kept])
    exact, naive = _ref(q, [k0, k[1]], [v0, v[1]], 3)
    check("o", o.numpy(), exact, naive, "float32", 3)
    torch.testing.assert_close(cache.read(0)[0], k0, rtol=0, atol=0)
    torch.testing.assert_close(cache.read(1)[0], k[1], rtol=0, atol=0)


def test_dpa_refusals():
    cache = st.PagedKVCache(1, 8, 2, 8, dtype=torch.float32)
    cache.pre_step(1)
    q = torch.randn(1, 1, 2, 8)
    with pytest.raises(NotImplementedError, match="PagedKVCache"):
        st.DotProductAttention(2, 8, qkv_format="bshd")(q, q, q, inference_params=object())
    with pytest.raises(NotImplementedError, match="qkv_format"):
        st.DotProductAttention(2, 8, qkv_format="thd")(
            q[0], q[0], q[0], inference_params=cache, cu_seqlens_q=torch.tensor([0, 1]),
            cu_seqlens_kv=torch.tensor([0, 1]),
        )  # fmt: skip
    with pytest.raises(ValueError, match="this step is"):
        st.DotProductAttention(2, 8, qkv_format="bshd")(
            torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8),
            inference_params=cache,
        )  # fmt: skip
