"""Context parallelism on torch.distributed's gloo backend, 2 and 4 processes, the `cpu`
backend: each case splits one problem over the ranks (cp_shard), runs strideattn's ring
(p2p) or all-to-all (a2a) attention forward and backward in every rank (cp_worker.py), puts
the ranks' O, LSE and gradients back together (cp_unshard) and checks them, and
single-process attention on the whole sequence, against the fp64 reference under the
correctness rule of docs/semantics.md (npref.py). Masks (none, causal, bottom-right, sliding
and two-sided windows), GQA/MQA, d_qk != d_v, s_q != s_kv, bshd/sbhd/varlen THD with padded
sequences, strided views of fused buffers, the functional API and DotProductAttention.
The two-rank group is global ranks 1 and 3 of the four, so group and global ranks differ.
Skips, saying why, without torch or gloo."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed has no gloo backend in this build", allow_module_level=True)

import strideattn.torch as sat  # noqa: E402
from cp_worker import Pool, from_wire, to_wire  # noqa: E402
from npref import attention_ref, backward_targets, check, grad_magnitude  # noqa: E402

DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


@pytest.fixture(scope="module")
def pool():
    p = Pool()
    yield p
    p.close()


def live(pool):
    if pool.broken:
        pytest.skip("an earlier case left the process pool hung; see that failure")
    return pool


# ----------------------------------------------------------------------------- cases

# Each case: api (fn = strideattn.torch.attention, module = DotProductAttention), comm, fmt,
# dtype, the library mask/window of the whole problem, heads h/hg, head dims, and sizes in
# chunks (a chunk is 1/(2N) of a sequence): dense (b, chunk_q, chunk_kv); varlen a list of
# sequences (chunk_q, missing_q, chunk_kv, missing_kv): padded extent 2N x chunk, of which
# the last `missing` positions are padding.
CASES = {
    "fn-p2p-bshd-causal-gqa": dict(api="fn", comm="p2p", fmt="bshd", dtype="bf16", mask="causal", h=4, hg=2, dense=(2, 3, 3)),
    "fn-p2p-bshd-none-mqa": dict(api="fn", comm="p2p", fmt="bshd", dtype="f16", mask="none", h=4, hg=1, dense=(2, 3, 3)),
    "fn-p2p-sbhd-sliding": dict(api="fn", comm="p2p", fmt="sbhd", dtype="f32", mask="none", window=(4, 0), h=4, hg=2, dense=(2, 4, 4)),
    "fn-p2p-bshd-two-sided": dict(api="fn", comm="p2p", fmt="bshd", dtype="bf16", mask="none", window=(3, 5), h=2, hg=2, dense=(1, 4, 4)),
    "fn-p2p-bshd-causal-window": dict(api="fn", comm="p2p", fmt="sbhd", dtype="f16", mask="causal", window=(5, -1), h=4, hg=1, dense=(2, 3, 3)),
    "fn-p2p-cross-bottom-right": dict(api="fn", comm="p2p", fmt="bshd", dtype="bf16", mask="causal_bottom_right", h=4, hg=2, d=16, dv=8, dense=(2, 2, 5)),
    "fn-p2p-cross-top-left": dict(api="fn", comm="p2p", fmt="bshd", dtype="f32", mask="causal", window=(-1, 3), h=2, hg=1, dense=(1, 5, 2)),
    "fn-p2p-thd-causal": dict(api="fn", comm="p2p", fmt="thd", dtype="f16", mask="causal", h=4, hg=2, varlen=[(3, 0, 3, 0), (2, 3, 2, 3), (1, 1, 1, 1), (4, 7, 4, 7)]),
    "fn-p2p-thd-window": dict(api="fn", comm="p2p", fmt="thd", dtype="bf16", mask="none", window=(4, 0), h=2, hg=1, d=16, dv=8, varlen=[(3, 2, 4, 0), (2, 0, 1, 1)]),
    "fn-p2p-thd-bottom-right": dict(api="fn", comm="p2p", fmt="thd", dtype="f32", mask="causal_bottom_right", window=(3, -1), h=2, hg=2, varlen=[(2, 1, 3, 2), (3, 0, 3, 0)]),
    "mod-p2p-sbhd-causal": dict(api="module", comm="p2p", fmt="sbhd", dtype="bf16", mask="causal", h=4, hg=1, dense=(2, 3, 3), ctor=dict(attn_mask_type="causal")),
    "mod-p2p-bshd-window": dict(api="module", comm="p2p", fmt="bshd", dtype="f16", mask="causal_bottom_right", window=(4, -1), h=4, hg=2, dense=(1, 4, 4), ctor=dict(attn_mask_type="causal_bottom_right", window_size=(4, 0))),
    "mod-p2p-cross-top-left-window": dict(api="module", comm="p2p", fmt="bshd", dtype="f32", mask="causal", te_left=3, h=2, hg=1, dense=(2, 2, 4), ctor=dict(attn_mask_type="causal", window_size=(3, 0))),
    "mod-p2p-thd-padded": dict(api="module", comm="p2p", fmt="thd", dtype="bf16", mask="causal", h=4, hg=2, varlen=[(2, 1, 2, 1), (3, 0, 3, 0)], ctor=dict(attn_mask_type="padding_causal")),
    "fn-a2a-bshd-causal-gqa": dict(api="fn", comm="a2a", fmt="bshd", dtype="bf16", mask="causal", h=8, hg=4, dense=(2, 3, 3)),
    "fn-a2a-sbhd-window": dict(api="fn", comm="a2a", fmt="sbhd", dtype="f32", mask="none", window=(3, 2), h=4, hg=4, d=16, dv=8, dense=(1, 3, 3)),
    "fn-a2a-thd-causal": dict(api="fn", comm="a2a", fmt="thd", dtype="f16", mask="causal", window=(4, -1), h=8, hg=4, varlen=[(2, 1, 2, 1), (3, 0, 3, 0)]),
    "mod-a2a-bshd-none": dict(api="module", comm="a2a", fmt="bshd", dtype="bf16", mask="none", h=4, hg=4, dense=(2, 3, 3), ctor=dict(attn_mask_type="no_mask")),
}  # fmt: skip


def build(rng, case, n):
    """The whole problem's buffers (fp32 numpy values, exactly representable in the dtype),
    the views and kwargs, and each rank's job."""
    h, hg, d = case["h"], case["hg"], case.get("d", 16)
    dv = case.get("dv", d)
    dtype = DT[case["dtype"]]
    fmt, varlen = case["fmt"], "varlen" in case
    fused = d == dv and (varlen or case["dense"][1] == case["dense"][2])
    fused = fused and not (varlen and any(s[0] != s[2] or s[1] != s[3] for s in case["varlen"]))
    if varlen:
        pq = [2 * n * s[0] for s in case["varlen"]]
        pkv = [2 * n * s[2] for s in case["varlen"]]
        lq = [p - s[1] for p, s in zip(pq, case["varlen"])]
        lkv = [p - s[3] for p, s in zip(pkv, case["varlen"])]
        offs_q = [sum(pq[:i]) for i in range(len(pq))]
        offs_kv = [sum(pkv[:i]) for i in range(len(pkv))]
        rows_q, rows_kv = (sum(pq),), (sum(pkv),)
        seq_dim = 0
    else:
        b, cq, ckv = case["dense"]
        s_q, s_kv = 2 * n * cq, 2 * n * ckv
        rows_q, rows_kv = ((s_q, b), (s_kv, b)) if fmt == "sbhd" else ((b, s_q), (b, s_kv))
        seq_dim = 0 if fmt == "sbhd" else 1
        offs_q = offs_kv = None

    def draw(shape):
        x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
        return x.to(dtype)

    if fused:
        bufs = [draw(rows_q + (h + 2 * hg, d))]
        offs = [offs_q]
    else:
        bufs = [draw(rows_q + (h, d)), draw(rows_kv + (hg, d + dv))]
        offs = [offs_q, offs_kv]

    def logical(ts):  # q, k, v as [b, s, h, d] / [t, h, d] float32 numpy
        q, k, v = (ts[0].split([h, hg, hg], dim=-2) if fused else (ts[0], *ts[1].split([d, dv], -1)))  # fmt: skip
        if fmt == "sbhd":
            q, k, v = (x.transpose(0, 1) for x in (q, k, v))
        return [x.float().numpy() for x in (q, k, v)]

    window = case.get("window")
    if "te_left" in case:  # TE aligns this window top-left: ours is shifted by s_kv - s_q
        window = (case["te_left"] + s_kv - s_q, -1)
    kwargs, ref = {}, dict(mask=case["mask"], window=window)
    if varlen:
        ref.update(seqlens_q=lq, seqlens_kv=lkv, offsets_q=offs_q, offsets_kv=offs_kv)
        if case["api"] == "fn":
            kwargs = dict(seqlens_q=lq, seqlens_kv=lkv, offsets_q=offs_q, offsets_kv=offs_kv)
        else:
            cum = lambda x: [0] + list(np.cumsum(x))
            kwargs = dict(
                cu_seqlens_q=cum(lq), cu_seqlens_kv=cum(lkv), cu_seqlens_q_padded=cum(pq),
                cu_seqlens_kv_padded=cum(pkv), max_seqlen_q=max(lq), max_seqlen_kv=max(lkv),
            )  # fmt: skip
    elif case["api"] == "fn":
        kwargs = dict(mask=case["mask"], window=window)
    else:  # the module checks these against the whole sequence
        kwargs = dict(max_seqlen_q=s_q, max_seqlen_kv=s_kv)
    if varlen and case["api"] == "fn":
        kwargs.update(mask=case["mask"], window=case.get("window"))
    return dict(
        bufs=bufs, offs=offs, seq_dim=seq_dim, logical=logical, kwargs=kwargs, ref=ref,
        h=h, hg=hg, d=d, dv=dv, dtype=dtype, fused=fused, varlen=varlen,
        offs_q=offs_q, api_out=api_out(case, h, dv, varlen),
    )  # fmt: skip


def api_out(case, h, dv, varlen):
    """(to the API's output form, back to logical [b, s, h, dv] / [t, h, dv], its seq dim)."""
    if case["api"] == "fn" or varlen:
        if case["api"] == "fn":
            return (lambda x: x), (lambda x: x), 0 if varlen else 1
        return (lambda x: x.reshape(x.shape[0], -1)), (lambda x: x.view(x.shape[0], h, dv)), 0
    if case["fmt"] == "sbhd":
        to = lambda x: x.transpose(0, 1).reshape(x.shape[1], x.shape[0], -1)
        back = lambda x: x.view(x.shape[0], x.shape[1], h, dv).transpose(0, 1)
        return to, back, 0
    return (lambda x: x.reshape(x.shape[0], x.shape[1], -1)), (lambda x: x.view(*x.shape[:2], h, dv)), 1  # fmt: skip


def run_case(pool, group, rng, seed, case):
    n = 2 if group == "pair" else 4
    p = build(rng, case, n)
    to_api, from_api, o_dim = p["api_out"]
    shape_o = tuple(p["bufs"][0].shape[:-2]) + (p["h"], p["dv"])
    do_logical = torch.from_numpy(rng.standard_normal(shape_o).astype(np.float32)).to(p["dtype"])
    if case["fmt"] == "sbhd":
        do_logical = do_logical.transpose(0, 1)
    do_api = to_api(do_logical)
    jobs = []
    for r in range(n):
        shard = lambda x, off, dim=p["seq_dim"]: sat.cp_shard(x, n, r, seq_dim=dim, offsets=off)
        jobs.append(
            dict(
                api=case["api"],
                comm=case["comm"],
                fmt=case["fmt"],
                h=p["h"],
                hg=p["hg"],
                d=p["d"],
                dv=p["dv"],
                fused=p["fused"],
                kwargs=p["kwargs"],
                ctor=case.get("ctor", {}),
                bufs=[to_wire(shard(b, off)) for b, off in zip(p["bufs"], p["offs"])],
                do=to_wire(shard(do_api, p["offs_q"], o_dim)),
            )  # fmt: skip
        )
    answers = pool.run(group, jobs)
    for r, (status, res) in enumerate(answers):
        assert status == "ok", f"rank {r}: {status}: {res}"
    o = from_api(sat.cp_unshard([from_wire(a[1]["o"]) for a in answers], seq_dim=o_dim, offsets=p["offs_q"]))  # fmt: skip
    grads = [
        sat.cp_unshard(
            [from_wire(a[1]["grads"][i]) for a in answers], seq_dim=p["seq_dim"], offsets=off
        )  # fmt: skip
        for i, off in enumerate(p["offs"])
    ]
    q, k, v = p["logical"](p["bufs"])
    dtype = p["dtype"]
    exact = attention_ref(q, k, v, **p["ref"])
    naive = attention_ref(q, k, v, lowp=dtype, **p["ref"])
    tag = f"[{group}] "
    check(tag + "o", o.float().numpy(), exact["o"], naive["o"], dtype, seed)
    if "lse" in answers[0][1]:
        lse_dim = 1 if p["varlen"] else 2
        lse = sat.cp_unshard([from_wire(a[1]["lse"]) for a in answers], seq_dim=lse_dim, offsets=p["offs_q"])  # fmt: skip
        check(tag + "lse", lse.numpy(), exact["lse"], naive["lse"], dtype, seed, lse=True)
    do = do_logical.float().numpy()
    gexact, gnaive = backward_targets(q, k, v, o.float().numpy(), do, dtype, **p["ref"])
    mag = grad_magnitude(gexact)
    dq, dk, dv = p["logical"](grads)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        check(tag + name, got, gexact[name], gnaive[name], dtype, seed, magnitude=mag)
    return p, q, k, v, do


@pytest.mark.parametrize("group", ["pair", "world"])
@pytest.mark.parametrize("name", list(CASES))
def test_cp_case(pool, rng, seed, group, name):
    run_case(live(pool), group, rng, seed, CASES[name])


def test_single_process_on_the_whole_sequence(rng, seed):
    # the yardstick the ranks are compared with: strideattn on the whole problem, one process
    for name in ("fn-p2p-bshd-causal-gqa", "fn-p2p-thd-causal", "fn-p2p-cross-bottom-right"):
        case = CASES[name]
        p = build(rng, case, 2)
        q, k, v = (torch.from_numpy(x).to(p["dtype"]).requires_grad_() for x in p["logical"](p["bufs"]))  # fmt: skip
        kw = p["kwargs"] if p["varlen"] else {}
        o, lse = sat.attention(q, k, v, mask=case["mask"], window=case.get("window"), return_lse=True, backend="cpu", **{x: y for x, y in kw.items() if x not in ("mask", "window")})  # fmt: skip
        do = torch.randn_like(o)
        o.backward(do)
        qn, kn, vn = (x.detach().float().numpy() for x in (q, k, v))
        exact = attention_ref(qn, kn, vn, **p["ref"])
        naive = attention_ref(qn, kn, vn, lowp=p["dtype"], **p["ref"])
        check(name + " o", o.float().detach().numpy(), exact["o"], naive["o"], p["dtype"], seed)
        check(name + " lse", lse.numpy(), exact["lse"], naive["lse"], p["dtype"], seed, lse=True)
        ge, gn = backward_targets(qn, kn, vn, o.detach().float().numpy(), do.float().numpy(), p["dtype"], **p["ref"])  # fmt: skip
        for nm, t in (("dq", q), ("dk", k), ("dv", v)):
            check(f"{name} {nm}", t.grad.float().numpy(), ge[nm], gn[nm], p["dtype"], seed, magnitude=grad_magnitude(ge))  # fmt: skip


# ----------------------------------------------------------------------------- refusals


def refused(pool, group, rng, case, edit, exc, match):
    """Every rank of the group refuses the case (after `edit` changes rank r's job) with
    `exc` and a message matching `match`, and the pool still answers afterwards."""
    n = 2 if group == "pair" else 4
    p = build(rng, case, n)
    jobs = []
    for r in range(n):
        shard = lambda x, off: sat.cp_shard(x, n, r, seq_dim=p["seq_dim"], offsets=off)
        bufs = [shard(b, off) for b, off in zip(p["bufs"], p["offs"])]
        job = dict(
            api=case["api"], comm=case["comm"], fmt=case["fmt"], h=p["h"], hg=p["hg"],
            d=p["d"], dv=p["dv"], fused=p["fused"], kwargs=dict(p["kwargs"]),
            ctor=case.get("ctor", {}), bufs=bufs, do=torch.zeros(1),
        )  # fmt: skip
        edit(r, job)
        job["bufs"] = [to_wire(b) for b in job["bufs"]]
        job["do"] = to_wire(job["do"])
        jobs.append(job)
    for r, (status, msg) in enumerate(live(pool).run(group, jobs)):
        assert status == exc, f"rank {r}: expected {exc}, got {status}: {msg}"
        assert match in msg.splitlines()[0], f"rank {r}: {msg}"


def test_a2a_refuses_heads_that_do_not_divide(pool, rng):
    case = dict(CASES["fn-a2a-bshd-causal-gqa"], h=6, hg=2)
    refused(pool, "world", rng, case, lambda r, j: None, "ValueError", "6 query heads and 2")


def test_odd_local_sequence_is_refused(pool, rng):
    def edit(r, job):
        job["bufs"] = [b[:, :-1] for b in job["bufs"]]

    case = CASES["fn-p2p-bshd-causal-gqa"]
    refused(pool, "pair", rng, case, edit, "ValueError", "local sequence extent must be even")


def test_varlen_extent_not_a_multiple_of_2n_is_refused(pool, rng):
    def edit(r, job):
        job["kwargs"]["offsets_q"] = [0, 10]

    case = CASES["fn-p2p-thd-causal"]
    case = dict(case, varlen=case["varlen"][:2])
    refused(pool, "pair", rng, case, edit, "ValueError", "multiple of 4")


def test_ranks_that_disagree_are_refused_on_every_rank(pool, rng):
    def edit(r, job):
        if r == 1:
            job["kwargs"]["window"] = (2, 0)

    case = CASES["fn-p2p-bshd-causal-gqa"]
    refused(pool, "world", rng, case, edit, "ValueError", "disagree on window")


def test_unknown_comm_type_is_refused(pool, rng):
    case = dict(CASES["fn-p2p-bshd-causal-gqa"], comm="all_gather")
    refused(pool, "pair", rng, case, lambda r, j: None, "NotImplementedError", "all_gather")


def test_module_padding_mask_on_bshd_is_refused(pool, rng):
    case = dict(CASES["mod-p2p-bshd-window"], ctor=dict(attn_mask_type="padding_causal"))
    refused(pool, "pair", rng, case, lambda r, j: None, "NotImplementedError", "qkv_format 'thd'")


def test_module_cp_group_must_be_a_process_group():
    with pytest.raises(ValueError, match="cp_group must be a torch.distributed ProcessGroup"):
        sat.DotProductAttention(2, 8, cp_group=object())


def test_cp_group_needs_torch_distributed_initialised():
    if dist.is_initialized():
        pytest.skip("torch.distributed is initialised in this process")
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="init_process_group"):
        sat.attention(q, q, q, cp_group=object())


def test_shard_unshard_round_trip_and_layout():
    x = torch.arange(2 * 16).view(2, 16)
    parts = [sat.cp_shard(x, 4, r) for r in range(4)]
    assert parts[1][0].tolist() == [2, 3, 12, 13]  # chunks 1 and 6 of 8
    assert torch.equal(sat.cp_unshard(parts), x)
    t = torch.arange(24)
    parts = [sat.cp_shard(t, 2, r, seq_dim=0, offsets=[0, 8]) for r in range(2)]
    assert parts[0].tolist() == [0, 1, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23]
    assert torch.equal(sat.cp_unshard(parts, seq_dim=0, offsets=[0, 8]), t)
    with pytest.raises(ValueError, match="multiples of 4"):
        sat.cp_shard(t, 2, 0, seq_dim=0, offsets=[0, 10])


def test_readme_two_process_example(tmp_path):
    # The README's example as a user runs it: torchrun, two processes, gloo. Its printout is
    # the largest difference between the two ranks' O and one process on the whole sequence
    # (the correctness rule is checked by the cases above; here it must run and agree).
    import pathlib
    import re
    import subprocess
    import sys

    text = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "# cp_demo.py" in b]
    assert len(blocks) == 1, "README.md lost its two-process example"
    script = tmp_path / "cp_demo.py"
    script.write_text(blocks[0])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]  # fmt: skip
    env = dict(os.environ, STRIDEATTN_CPU_THREADS="1", OMP_NUM_THREADS="1")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    diff = float(res.stdout.strip().splitlines()[-1])
    assert diff < 0.05, f"the two ranks' O differs from one process by {diff}"
