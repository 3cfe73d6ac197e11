"""Plans, cu_seqlens arrays and caller workspaces through the Python package, on numpy (CPU):
cu_seqlens arrays (with and without seq_offsets) against the fp64 numpy reference of npref.py,
their host check and the keyword errors; a caller's workspace and workspace_size(); the
extension's plan cache reusing one plan per problem; and _ext.Plan objects made once from
tensors and run with integer addresses, against the same reference. Outputs are poisoned
views inside guard bands."""

import numpy as np
import pytest

import strideattn as sa
from strideattn import _ext
from npref import attention_ref, backward_targets, check, grad_magnitude

T, H, D = 40, 2, 16


def varlen_inputs(rng, dtype=np.float32):
    q, k, v, do = (rng.standard_normal((T, H, D)).astype(dtype) for _ in range(4))
    return q, k, v, do


@pytest.mark.parametrize("mask", ["none", "causal", "causal_bottom_right"])
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_cu_seqlens_match_the_reference(rng, seed, mask, backend):
    q, k, v, do = varlen_inputs(rng)
    lens_q, lens_kv = [5, 0, 12, 9], [7, 3, 12, 4]
    offs_q, offs_kv = [0, 6, 6, 25], [2, 10, 14, 30]  # gaps and a tail of padding
    cu = lambda lens: np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)  # noqa: E731
    arrays = dict(
        cu_seqlens_q=cu(lens_q),
        cu_seqlens_kv=cu(lens_kv),
        seq_offsets_q=np.array(offs_q, np.int32),
        seq_offsets_kv=np.array(offs_kv, np.int32),
        max_seqlen_q=12,
        max_seqlen_kv=12,
    )
    lists = dict(seqlens_q=lens_q, seqlens_kv=lens_kv, offsets_q=offs_q, offsets_kv=offs_kv)
    o = np.full((T + 8, H, D), np.nan, np.float32)
    view = o[4 : 4 + T]  # a view inside a poisoned buffer
    o_, lse = sa.attention(q, k, v, mask=mask, backend=backend, return_lse=True, out=view, **arrays)
    assert np.isnan(o[:4]).all() and np.isnan(o[4 + T :]).all(), "wrote outside the view"
    exact = attention_ref(q, k, v, mask=mask, **lists)
    naive = attention_ref(q, k, v, mask=mask, lowp=np.float32, **lists)
    check("o", view, exact["o"], naive["o"], np.float32, seed)
    check("lse", lse, exact["lse"], naive["lse"], np.float32, seed, lse=True)
    dq, dk, dv = sa.attention_backward(q, k, v, view, do, lse, mask=mask, backend=backend, **arrays)
    exact, naive = backward_targets(q, k, v, view, do, np.float32, mask=mask, **lists)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        check(
            name, got, exact[name], naive[name], np.float32, seed, magnitude=grad_magnitude(exact)
        )


def test_packed_cu_seqlens_equal_the_lists(rng):
    q, k, v, _ = varlen_inputs(rng)
    cu = np.array([0, 10, 10, 25, 40], np.int32)
    a = sa.attention(
        q, k, v, backend="cpu", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=15, max_seqlen_kv=15
    )
    b = sa.attention(q, k, v, backend="cpu", seqlens_q=[10, 0, 15, 15], seqlens_kv=[10, 0, 15, 15])
    np.testing.assert_array_equal(a, b)


def test_cu_seqlens_keyword_errors(rng):
    q, k, v, _ = varlen_inputs(rng)
    cu = np.array([0, 20, 40], np.int32)
    with pytest.raises(ValueError, match="max_seqlen_q is required"):
        sa.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_kv=20)
    with pytest.raises(ValueError, match="cu_seqlens_kv is missing"):
        sa.attention(q, k, v, cu_seqlens_q=cu, max_seqlen_q=20, max_seqlen_kv=20)
    with pytest.raises(ValueError, match="max_seqlen_q is given without"):
        sa.attention(q, k, v, max_seqlen_q=20)
    with pytest.raises(ValueError, match="int64; supported: int32"):
        sa.attention(
            q,
            k,
            v,
            cu_seqlens_q=cu.astype(np.int64),
            cu_seqlens_kv=cu,
            max_seqlen_q=20,
            max_seqlen_kv=20,
        )
    # The host reads the arrays and checks them: a length above its bound, then decreasing sums.
    with pytest.raises(ValueError, match="sequence 0 has 20 tokens .* but max_seqlen_q is 19"):
        sa.attention(
            q,
            k,
            v,
            backend="cpu",
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            max_seqlen_q=19,
            max_seqlen_kv=20,
        )
    bad = np.array([0, 20, 10], np.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[2\] = 10 is below cu_seqlens_q\[1\] = 20"):
        sa.attention(
            q,
            k,
            v,
            backend="cpu",
            cu_seqlens_q=bad,
            cu_seqlens_kv=cu,
            max_seqlen_q=20,
            max_seqlen_kv=20,
        )
    with pytest.raises(ValueError, match="both forms are given"):
        sa.attention(
            q,
            k,
            v,
            seqlens_q=[20, 20],
            seqlens_kv=[20, 20],
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            max_seqlen_q=20,
            max_seqlen_kv=20,
        )


def test_workspace_size_and_a_callers_workspace(rng, seed):
    q, k, v = (rng.standard_normal((2, 16, 2, 8)).astype(np.float32) for _ in range(3))
    n = sa.workspace_size(q, k, v, backend="cpu", mask="causal")
    assert n == 0  # host backends need none; the GPU ones say how much (a test on the GPU)
    assert sa.workspace_size(q, k, v, backend="cpu", grad=True) == 0
    ws = np.zeros(256, np.uint8)
    o = sa.attention(q, k, v, backend="cpu", mask="causal", workspace=ws)
    exact = attention_ref(q, k, v, mask="causal")
    naive = attention_ref(q, k, v, mask="causal", lowp=np.float32)
    check("o", o, exact["o"], naive["o"], np.float32, seed)
    assert sa.explain(q, k, v, backend="cpu")["workspace_size"] == 0
    with pytest.raises(ValueError, match="workspace: .*supported: a contiguous tensor"):
        sa.attention(q, k, v, backend="cpu", workspace=np.zeros(8, np.uint8)[::2])


def test_the_extension_keeps_one_plan_per_problem(rng):
    sa.clear_plan_cache()
    info = sa.plan_cache_info()
    assert info["size"] == 0 and info["hits"] == 0 and info["capacity"] > 0
    q, k, v = (rng.standard_normal((1, 12, 2, 8)).astype(np.float32) for _ in range(3))
    for _ in range(5):
        sa.attention(q.copy(), k.copy(), v.copy(), backend="reference")  # new buffers each time
    info = sa.plan_cache_info()
    assert info["size"] == 1 and info["misses"] == 1 and info["hits"] == 4, info
    sa.attention(q, k, v, backend="reference", mask="causal")  # another problem
    assert sa.plan_cache_info()["size"] == 2
    sa.clear_plan_cache()
    assert sa.plan_cache_info()["size"] == 0


def test_plan_objects_run_with_addresses(rng, seed):
    q, k, v, do = (rng.standard_normal((2, 10, 2, 8)).astype(np.float32) for _ in range(4))
    o = np.zeros_like(q)
    lse = np.zeros((2, 2, 10), np.float32)
    code, msg, plan = _ext.make_forward_plan(q, k, v, o, lse, mask="causal", backend="cpu")
    assert code == "ok", msg
    assert (
        plan.backend == "cpu" and not plan.backward and plan.writes_lse and plan.workspace_size == 0
    )
    assert "forward runs on cpu" in plan.reason
    exact = attention_ref(q, k, v, mask="causal")
    naive = attention_ref(q, k, v, mask="causal", lowp=np.float32)
    for _ in range(2):  # the same plan on other buffers
        q2, k2, v2 = q.copy(), k.copy(), v.copy()
        o2 = np.full_like(q, np.nan)
        lse2 = np.full_like(lse, np.nan)
        addr = lambda x: x.ctypes.data  # noqa: E731
        assert plan.run_forward(addr(q2), addr(k2), addr(v2), addr(o2), addr(lse2)) == ("ok", "")
        check("o", o2, exact["o"], naive["o"], np.float32, seed)
        check("lse", lse2, exact["lse"], naive["lse"], np.float32, seed, lse=True)
    code, msg = plan.run_forward(addr(q2), addr(k2), addr(v2), addr(q2), addr(lse2))
    assert code == "invalid_argument" and "o overlaps q" in msg
    code, msg = plan.run_forward(addr(q2), addr(k2), addr(v2), addr(o2))
    assert code == "invalid_argument" and "lse: data is null" in msg
    code, msg = plan.run_backward(0, 0, 0, 0, 0, 0, 0, 0, 0)
    assert code == "invalid_argument" and "forward plan" in msg

    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    code, msg, bplan = _ext.make_backward_plan(
        q, k, v, o2, do, lse2, dq, dk, dv, mask="causal", backend="cpu"
    )
    assert code == "ok", msg
    assert bplan.backward
    assert bplan.run_backward(*(x.ctypes.data for x in (q, k, v, o2, do, lse2, dq, dk, dv))) == (
        "ok",
        "",
    )
    exact, naive = backward_targets(q, k, v, o2, do, np.float32, mask="causal")
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        check(
            name, got, exact[name], naive[name], np.float32, seed, magnitude=grad_magnitude(exact)
        )
    code, msg, none = _ext.make_forward_plan(q, k, v, q, None, backend="cpu")
    assert code == "invalid_argument" and none is None and "overlaps" in msg
