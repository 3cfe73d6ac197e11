"""PyTorch tests: the autograd custom op and DotProductAttention on the seed pattern
(`q, k, v = qkv.split(...)` passed straight in) against PyTorch's math SDPA in fp64, forward
and gradients (into qkv.grad); GQA, windows, varlen, torch.compile, opcheck; CuPy and JAX
arrays in and out. Runs on CUDA when present (the GPU suite) and on CPU tensors otherwise;
skips, with the reason, without torch / CUDA / CuPy / JAX. Tolerance: docs/semantics.md's rule, with
the naive low-precision error from npref.py."""

import pathlib
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
import torch.nn.functional as F  # noqa: E402

import strideattn as sa  # noqa: E402
import strideattn.torch as sat  # noqa: E402
from npref import attention_ref, backward_targets, check, grad_magnitude, visible  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")),
]
DTYPES = [torch.float16, torch.bfloat16]


def cuda_only():
    if not HAS_CUDA:
        pytest.skip("no CUDA device")


def np32(t):
    return t.detach().float().cpu().numpy()


def sdpa_fp64(q, k, v, mask="none", window=None, scale=None):
    """PyTorch math SDPA in fp64 on [b, s, h, d] tensors (GQA by repeating KV heads)."""
    g = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    m = torch.from_numpy(visible(q.shape[1], k.shape[1], mask, window)).to(q.device)
    assert m.any(dim=1).all(), "test setup: a row sees no key (math SDPA gives NaN there)"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), attn_mask=m, scale=scale
        )
    return o.transpose(1, 2)


def sizes(device):
    # small on CPU (the cpu backend), seed-like on the GPU
    return dict(s=256, b=2) if device == "cuda" else dict(s=24, b=2)


# ----------------------------------------------------------------------------- seed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_type", ["no_mask", "causal"])
def test_seed_split_views_module(rng, seed, device, dtype, mask_type):
    s, b = sizes(device)["s"], sizes(device)["b"]
    h, hg, d = 16, 1, 64
    torch.manual_seed(seed)
    qkv = torch.randn(s, b, h + 2 * hg, d, device=device).to(dtype).requires_grad_()
    q, k, v = qkv.split([h, hg, hg], dim=2)  # sbhd views, strides (b*1152, 1152, 64, 1)
    assert not q.is_contiguous() and q.stride() == (b * (h + 2 * hg) * d, (h + 2 * hg) * d, d, 1)
    mod = sat.DotProductAttention(
        h, d, num_gqa_groups=hg, qkv_format="sbhd", attn_mask_type=mask_type
    )
    o = mod(q, k, v)
    assert o.shape == (s, b, h * d) and o.dtype == dtype and o.device.type == device
    g = torch.randn(s, b, h * d, device=device).to(dtype)
    o.backward(g)

    mask = "none" if mask_type == "no_mask" else "causal"
    ref = qkv.detach().double().requires_grad_()
    rq, rk, rv = (x.transpose(0, 1) for x in ref.split([h, hg, hg], dim=2))
    ro = sdpa_fp64(rq, rk, rv, mask).transpose(0, 1).reshape(s, b, h * d)
    ro.backward(g.double())

    bshd = lambda x: np32(x.transpose(0, 1))
    naive = attention_ref(bshd(q), bshd(k), bshd(v), mask=mask, lowp=dtype)
    check(
        "o", np32(o), np32(ro), naive["o"].transpose(1, 0, 2, 3).reshape(s, b, h * d), dtype, seed
    )
    # Gradients against the backward of the O the op handed it (docs/semantics.md).
    exact, naive = backward_targets(
        bshd(q),
        bshd(k),
        bshd(v),
        bshd(o.view(s, b, h, d)),
        bshd(g.view(s, b, h, d)),
        dtype,
        mask=mask,
    )
    for name, got in zip(("dq", "dk", "dv"), qkv.grad.split([h, hg, hg], dim=2)):
        check(
            name, bshd(got), exact[name], naive[name], dtype, seed, magnitude=grad_magnitude(exact)
        )
    # The numpy answer key itself agrees with PyTorch's math backend in fp64 (true gradients).
    true = attention_ref(bshd(q), bshd(k), bshd(v), mask=mask, do=bshd(g.view(s, b, h, d)))
    for name, r in zip(("dq", "dk", "dv"), ref.grad.split([h, hg, hg], dim=2)):
        np.testing.assert_allclose(
            true[name],
            r.transpose(0, 1).cpu().numpy(),
            rtol=1e-7,
            atol=1e-9,
            err_msg=f"{name}: numpy fp64 reference vs torch math fp64 (seed {seed})",
        )


@pytest.mark.parametrize("device", DEVICES)
def test_seed_functional_expanded_grad(rng, seed, device):
    # o.sum().backward() hands the backward an expanded (stride 0) gradient.
    s, b, h, hg, d = 16, 2, 16, 1, 64
    torch.manual_seed(seed)
    qkv = torch.randn(s, b, h + 2 * hg, d, device=device, dtype=torch.float16, requires_grad=True)
    q, k, v = (x.transpose(0, 1) for x in qkv.split([h, hg, hg], dim=2))
    o = sa.attention(q, k, v, mask="causal")  # torch + requires_grad -> the autograd op
    assert o.requires_grad
    o.float().sum().backward()
    exact, naive = backward_targets(
        np32(q),
        np32(k),
        np32(v),
        np32(o),
        np.ones((b, s, h, d), np.float32),
        torch.float16,
        mask="causal",
    )
    for name, got in zip(("dq", "dk", "dv"), qkv.grad.split([h, hg, hg], dim=2)):
        check(
            name,
            np32(got.transpose(0, 1)),
            exact[name],
            naive[name],
            torch.float16,
            seed,
            magnitude=grad_magnitude(exact),
        )


# ----------------------------------------------------------------------------- GQA, windows


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "mask,window,s_q,s_kv",
    [
        ("none", (8, 8), 40, 40),
        ("causal", (16, 0), 40, 40),
        ("causal-bottom-right", None, 24, 56),
        ("none", (-1, 40), 56, 24),
        ("causal-bottom-right", (5, 0), 24, 56),
    ],
)
def test_gqa_windows(rng, seed, device, mask, window, s_q, s_kv):
    b, h, hg, d_qk, d_v = 2, 8, 2, 64, 32
    torch.manual_seed(seed)
    dtype = torch.bfloat16
    q = torch.randn(b, s_q, h, d_qk, device=device).to(dtype).requires_grad_()
    kv = torch.randn(b, s_kv, hg, d_qk + d_v, device=device).to(dtype).requires_grad_()
    k, v = kv.split([d_qk, d_v], dim=3)  # k is a padded-head-dim view, v starts at an offset
    o, lse = sat.attention(q, k, v, mask=mask, window=window, return_lse=True)
    assert not lse.requires_grad and lse.dtype == torch.float32 and lse.shape == (b, h, s_q)
    do = torch.randn_like(o)
    o.backward(do)
    rq, rkv = q.detach().double(), kv.detach().double()
    rk, rv = rkv.split([d_qk, d_v], dim=3)
    ro = sdpa_fp64(rq, rk, rv, mask, window)
    naive = attention_ref(np32(q), np32(k), np32(v), mask=mask, window=window, lowp=dtype)
    exact = attention_ref(np32(q), np32(k), np32(v), mask=mask, window=window)
    check("o", np32(o), np32(ro), naive["o"], dtype, seed)
    check("lse", np32(lse), exact["lse"], naive["lse"], dtype, seed, lse=True)
    exact, naive = backward_targets(
        np32(q), np32(k), np32(v), np32(o), np32(do), dtype, mask=mask, window=window
    )
    mag = grad_magnitude(exact)
    check("dq", np32(q.grad), exact["dq"], naive["dq"], dtype, seed, magnitude=mag)
    dk, dv = kv.grad.split([d_qk, d_v], dim=3)
    check("dk", np32(dk), exact["dk"], naive["dk"], dtype, seed, magnitude=mag)
    check("dv", np32(dv), exact["dv"], naive["dv"], dtype, seed, magnitude=mag)


# ----------------------------------------------------------------------------- varlen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True])
def test_varlen_thd_module(rng, seed, device, padded):
    h, hg, d = 8, 2, 64
    lens_q, lens_kv = [7, 1, 20, 12], [9, 4, 20, 3]
    gap = 3 if padded else 0
    cu_q = np.concatenate([[0], np.cumsum(lens_q)])
    cu_kv = np.concatenate([[0], np.cumsum(lens_kv)])
    pad_q = np.concatenate([[0], np.cumsum(np.array(lens_q) + gap)])
    pad_kv = np.concatenate([[0], np.cumsum(np.array(lens_kv) + gap)])
    t_q, t_kv = int(pad_q[-1]), int(pad_kv[-1])
    torch.manual_seed(seed)
    dtype = torch.float16
    # q, k, v split from one fused token buffer when the token counts agree, else two buffers
    qbuf = torch.randn(t_q, h, d, device=device).to(dtype).requires_grad_()
    kvbuf = torch.randn(t_kv, 2 * hg, d, device=device).to(dtype).requires_grad_()
    k, v = kvbuf.split([hg, hg], dim=1)
    ti = lambda a: torch.tensor(a, dtype=torch.int32, device=device)
    mod = sat.DotProductAttention(
        h, d, num_gqa_groups=hg, qkv_format="thd", attn_mask_type="padding_causal"
    )
    o = mod(
        qbuf,
        k,
        v,
        cu_seqlens_q=ti(cu_q),
        cu_seqlens_kv=ti(cu_kv),
        cu_seqlens_q_padded=ti(pad_q) if padded else None,
        cu_seqlens_kv_padded=ti(pad_kv) if padded else None,
        max_seqlen_q=max(lens_q),
        max_seqlen_kv=max(lens_kv),
    )
    assert o.shape == (t_q, h * d)
    do = torch.randn_like(o)
    o.backward(do)
    opts = dict(
        mask="causal",
        seqlens_q=lens_q,
        seqlens_kv=lens_kv,
        offsets_q=pad_q[:-1] if padded else None,
        offsets_kv=pad_kv[:-1] if padded else None,
    )
    args = (np32(qbuf), np32(k), np32(v))
    exact = attention_ref(*args, **opts)
    naive = attention_ref(*args, lowp=dtype, **opts)
    check("o", np32(o.view(t_q, h, d)), exact["o"], naive["o"], dtype, seed)
    gexact, gnaive = backward_targets(
        *args, np32(o.view(t_q, h, d)), np32(do.view(t_q, h, d)), dtype, **opts
    )
    mag = grad_magnitude(gexact)
    check("dq", np32(qbuf.grad), gexact["dq"], gnaive["dq"], dtype, seed, magnitude=mag)
    dk, dv = kvbuf.grad.split([hg, hg], dim=1)
    check("dk", np32(dk), gexact["dk"], gnaive["dk"], dtype, seed, magnitude=mag)
    check("dv", np32(dv), gexact["dv"], gnaive["dv"], dtype, seed, magnitude=mag)
    # exact torch check of one sequence (no padding around it) against math SDPA
    i = 2
    sq = slice(int(pad_q[i]), int(pad_q[i]) + lens_q[i])
    skv = slice(int(pad_kv[i]), int(pad_kv[i]) + lens_kv[i])
    r = sdpa_fp64(
        qbuf.detach().double()[sq][None],
        k.detach().double()[skv][None],
        v.detach().double()[skv][None],
        "causal",
    )[0]
    check("o[seq 2]", np32(o.view(t_q, h, d)[sq]), np32(r), naive["o"][sq], dtype, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_bshd_padding_mask(rng, seed, device):
    b, s, h, d = 3, 16, 4, 32
    torch.manual_seed(seed)
    q, k, v = (torch.randn(b, s, h, d, device=device, dtype=torch.float16) for _ in range(3))
    lens = [16, 5, 9]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=device)
    mod = sat.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="padding_causal")
    o = mod(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu).view(b, s, h, d)
    for i, n in enumerate(lens):
        args = [np32(x[i : i + 1, :n]) for x in (q, k, v)]
        exact = attention_ref(*args, mask="causal")
        naive = attention_ref(*args, mask="causal", lowp=torch.float16)
        check(f"o[{i}]", np32(o[i : i + 1, :n]), exact["o"], naive["o"], torch.float16, seed)
        assert (o[i, n:] == 0).all(), "padding rows of O must be 0"


# ----------------------------------------------------------------------------- compile, op


class Block(torch.nn.Module):
    def __init__(self, h, hg, d):
        super().__init__()
        self.h, self.hg = h, hg
        self.proj = torch.nn.Linear(d * 4, (h + 2 * hg) * d, bias=False)
        self.attn = sat.DotProductAttention(
            h, d, num_gqa_groups=hg, qkv_format="sbhd", attn_mask_type="causal"
        )

    def forward(self, x):  # x [s, b, 4d]
        s, b, _ = x.shape
        qkv = self.proj(x).view(s, b, self.h + 2 * self.hg, -1)
        q, k, v = qkv.split([self.h, self.hg, self.hg], dim=2)
        return self.attn(q, k, v)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_module(rng, seed, device):
    torch.manual_seed(seed)
    h, hg, d, s, b = 8, 2, 32, 32, 2
    dtype = torch.float16 if device == "cuda" else torch.float32
    block = Block(h, hg, d).to(device=device, dtype=dtype)
    x = torch.randn(s, b, 4 * d, device=device, dtype=dtype)
    eager = block(x)
    eager.float().square().sum().backward()
    g_eager = block.proj.weight.grad.clone()
    block.proj.weight.grad = None
    # inductor on the GPU; on CPU tensors aot_eager (inductor's C++ build costs CI ~30 s)
    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    out = compiled(x)
    out.float().square().sum().backward()
    # the same attention kernels; only the projection may be fused differently by inductor
    torch.testing.assert_close(out, eager, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(block.proj.weight.grad, g_eager, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    torch.manual_seed(0)
    buf = torch.randn(12, 2, 6, 32, device=device, dtype=torch.float16)
    q, k, v = (x.transpose(0, 1) for x in buf.split([4, 1, 1], dim=2))
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    args = (q, k, v, None, None, None, None, "causal", -1, -1, 0.125, "auto", True)
    torch.library.opcheck(torch.ops.strideattn.attention_fwd.default, args)


# ----------------------------------------------------------------------------- errors


def test_mixed_devices_rejected():
    cuda_only()
    q = torch.randn(1, 8, 2, 16, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="device"):
        sa.attention(q, q.cpu(), q.cpu())


def test_module_shape_errors():
    mod = sat.DotProductAttention(8, 32, num_gqa_groups=2, qkv_format="bshd")
    q = torch.randn(1, 4, 8, 32)
    k = torch.randn(1, 4, 4, 32)
    with pytest.raises(ValueError, match="4 heads"):
        mod(q, k, k)
    with pytest.raises(NotImplementedError):
        sat.DotProductAttention(8, 32, attn_mask_type="arbitrary")


def test_workspace_with_grad_is_refused_by_name():
    # (without grad the extension takes the caller's workspace; the autograd op takes none)
    q = torch.randn(1, 4, 2, 16)
    ws = torch.empty(1 << 16, dtype=torch.uint8)
    o = sa.attention(q, q, q, workspace=ws, backend="cpu")
    assert torch.equal(o, sa.attention(q, q, q, backend="cpu"))
    qg = q.clone().requires_grad_()
    with pytest.raises(ValueError, match="workspace is given with tensors that require grad"):
        sa.attention(qg, qg, qg, workspace=ws)


# ----------------------------------------------------------------------------- CuPy, JAX


def test_stream_and_cupy_in_out(rng, seed):
    cuda_only()
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    s, b, h, hg, d = 64, 2, 16, 1, 64
    host = rng.standard_normal((s, b, h + 2 * hg, d)).astype(np.float16)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        buf = cupy.asarray(host)
        q, k, v = (
            x.transpose(1, 0, 2, 3)
            for x in (buf[:, :, :h], buf[:, :, h : h + hg], buf[:, :, h + hg :])
        )
        o, lse = sa.attention(q, k, v, mask="causal", return_lse=True)
        assert (
            isinstance(o, cupy.ndarray)
            and o.dtype == cupy.float16
            and isinstance(lse, cupy.ndarray)
        )
        o_host, lse_host = cupy.asnumpy(o, stream=stream), cupy.asnumpy(lse, stream=stream)
        stream.synchronize()
    args = [
        x.transpose(1, 0, 2, 3)
        for x in (host[:, :, :h], host[:, :, h : h + hg], host[:, :, h + hg :])
    ]
    exact = attention_ref(*args, mask="causal")
    naive = attention_ref(*args, mask="causal", lowp=np.float16)
    check("o", o_host, exact["o"], naive["o"], np.float16, seed)
    check("lse", lse_host, exact["lse"], naive["lse"], np.float16, seed, lse=True)


def test_jax_in_out(rng, seed):
    cuda_only()
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")
    b, s, h, hg, d = 2, 48, 8, 2, 64
    host = [rng.standard_normal((b, s, n, d)).astype(np.float16) for n in (h, hg, hg)]
    q, k, v = (jax.device_put(x, gpu) for x in host)
    o = sa.attention(q, k, v, mask="causal-bottom-right")
    assert isinstance(o, jax.Array) and o.dtype == np.float16 and o.shape == (b, s, h, d)
    exact = attention_ref(*host, mask="causal-bottom-right")
    naive = attention_ref(*host, mask="causal-bottom-right", lowp=np.float16)
    check("o", np.asarray(o), exact["o"], naive["o"], np.float16, seed)


# ----------------------------------------------------------------------------- README


def test_readme_gpu_quick_start():
    cuda_only()
    text = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2, "README.md lost its quick-start blocks"
    exec(compile(blocks[1], "README.md (PyTorch quick start)", "exec"), {})


def test_attention_needing_grad_loads_the_torch_layer_on_first_use():
    # _core no longer imports strideattn.torch: the package registers a loader instead.
    import subprocess
    import sys

    code = (
        "import sys, torch, strideattn as sa\n"
        "q = torch.randn(1, 6, 2, 16, requires_grad=True)\n"
        "o = sa.attention(q, q.detach(), q.detach(), mask='top_left')\n"
        "assert 'strideattn.torch' in sys.modules and o.requires_grad\n"
        "o.sum().backward(); assert q.grad is not None and q.grad.abs().sum() > 0\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
