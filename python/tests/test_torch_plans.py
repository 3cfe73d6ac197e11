"""The PyTorch eager path's plan cache (strideattn/_torch_call.py): each problem's plan is
kept under everything that determines it, so a call that differs in any of those (strides,
dtype, options, varlen lists, dO strides, the saved tensors' strides, the alignment of an
input) must not be served by a plan made for another. Every call here takes fresh random
inputs and is checked, forward and gradients, against the fp64 numpy reference (npref.py,
docs/semantics.md's tolerance rule); and bad input gives the same error with the cache warm
as with it cold. CPU tensors (the cpu backend); skips without torch."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import strideattn as sa  # noqa: E402
import strideattn.torch as sat  # noqa: E402
from strideattn import _ext, _torch_call  # noqa: E402
from npref import backward_targets, check, grad_magnitude, attention_ref  # noqa: E402

B, S, H, D = 2, 12, 2, 16


def np64(t):
    return t.detach().double().numpy()


def check_call(seed, q, k, v, do=None, dtype=None, **opts):
    """sat.attention(q, k, v, **opts) on the cpu backend and its gradients for `do` (fresh
    random when None) against the reference; returns O."""
    dtype = dtype or q.dtype
    o = sat.attention(q, k, v, backend="cpu", **opts)
    if do is None:
        do = torch.randn(o.shape).to(dtype)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    ref_opts = {key: opts[key] for key in ("mask", "window", "scale") if key in opts}
    lists = {key: opts[key] for key in ("seqlens_q", "seqlens_kv") if key in opts}
    exact = attention_ref(np64(q), np64(k), np64(v), **ref_opts, **lists)
    naive = attention_ref(np64(q), np64(k), np64(v), lowp=dtype, **ref_opts, **lists)
    check("o", np64(o), exact["o"], naive["o"], dtype, seed)
    gexact, gnaive = backward_targets(
        np64(q), np64(k), np64(v), np64(o), np64(do), dtype, **ref_opts, **lists
    )
    mag = grad_magnitude(gexact)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        check(name, np64(got), gexact[name], gnaive[name], dtype, seed, magnitude=mag)
    return o


def bshd(dtype=torch.bfloat16):
    return tuple(torch.randn(B, S, H, D).to(dtype).requires_grad_() for _ in range(3))


def sbhd_views(dtype=torch.bfloat16):
    # the same logical [b, s, h, d] tensors, stored seq first: other strides
    return tuple(
        torch.randn(S, B, H, D).to(dtype).transpose(0, 1).detach().requires_grad_()
        for _ in range(3)
    )


def split_views(dtype=torch.bfloat16):
    # views of one fused buffer (q, k, v interleaved per token): other strides again
    qkv = torch.randn(B, S, 3 * H, D).to(dtype).requires_grad_()
    return tuple(qkv.split([H, H, H], dim=2))


@pytest.fixture(autouse=True)
def cold_cache():
    sa.clear_plan_cache()
    yield
    sa.clear_plan_cache()


def test_changed_strides_take_their_own_plan(seed):
    torch.manual_seed(seed)
    for _ in range(2):  # the second round finds every plan cached
        for make in (bshd, sbhd_views, split_views):
            check_call(seed, *make())


def test_changed_dtype_takes_its_own_plan(seed):
    torch.manual_seed(seed)
    for _ in range(2):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            check_call(seed, *bshd(dtype))


@pytest.mark.parametrize(
    "opts",
    [
        dict(mask="causal"),
        dict(mask="causal_bottom_right", window=(3, 0)),
        dict(scale=0.1),
        dict(window=(2, 2)),
        dict(deterministic=True),
    ],
    ids=["causal", "bottom_right_window", "scale", "window", "deterministic"],
)
def test_changed_options_take_their_own_plan(seed, opts):
    torch.manual_seed(seed)
    for _ in range(2):
        check_call(seed, *bshd())  # the plan without the option, then the option's
        check_call(seed, *bshd(), **opts)


def test_changed_varlen_lists_take_their_own_plan(seed):
    torch.manual_seed(seed)
    t = 2 * S
    for _ in range(2):
        for lens_q, lens_kv in (([5, 7], [5, 7]), ([3, 9], [8, 4]), ([12, 12], [12, 12])):
            q, k, v = (torch.randn(t, H, D).to(torch.bfloat16).requires_grad_() for _ in range(3))
            check_call(seed, q, k, v, seqlens_q=lens_q, seqlens_kv=lens_kv)


def test_changed_dout_strides_take_their_own_plan(seed):
    torch.manual_seed(seed)
    dt = torch.bfloat16
    douts = (
        lambda: torch.randn(B, S, H, D).to(dt),
        lambda: torch.randn(S, B, H, D).to(dt).transpose(0, 1),
        lambda: torch.randn(1, 1, H, D).to(dt).expand(B, S, H, D),  # stride 0 (copied)
        lambda: torch.randn(B, S, H, 2 * D).to(dt)[..., ::2],  # no unit head-dim stride
    )
    for _ in range(2):
        for make in douts:
            check_call(seed, *bshd(), do=make())


def test_saved_tensor_hooks_that_change_strides(seed):
    """Saved tensors come back from hooks in other strides (an offloading hook copies them):
    the backward must not use the plan made for the forward's strides."""
    torch.manual_seed(seed)
    check_call(seed, *split_views())  # plans for the split views' strides, cached
    pack = lambda t: t.detach().clone(memory_format=torch.contiguous_format)  # noqa: E731
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        check_call(seed, *split_views())


def test_less_aligned_inputs_after_aligned_ones(seed):
    """Same shapes and strides, inputs 2 bytes past a 16-byte boundary: not the aligned
    problem's plan (which assumes 16-byte alignment)."""
    torch.manual_seed(seed)
    check_call(seed, *bshd())
    n = B * S * H * D

    def shifted():
        buf = torch.randn(n + 1).to(torch.bfloat16)
        return buf[1:].view(B, S, H, D).detach().requires_grad_()

    q, k, v = shifted(), shifted(), shifted()
    assert q.data_ptr() % 16 == 2
    check_call(seed, q, k, v)
    check_call(seed, *bshd())


def test_module_layouts_take_their_own_plan(seed):
    """DotProductAttention with sbhd and bshd tensors of one shape: the layouts' plans differ."""
    torch.manual_seed(seed)
    for _ in range(2):
        for fmt in ("sbhd", "bshd"):
            mod = sat.DotProductAttention(H, D, qkv_format=fmt, attn_mask_type="causal")
            mod.backend = "cpu"
            x = torch.randn(S, S, 3 * H, D).to(torch.bfloat16).requires_grad_()
            q, k, v = x.split([H, H, H], dim=2)
            o = mod(q, k, v)
            as_bshd = (lambda t: t.transpose(0, 1)) if fmt == "sbhd" else (lambda t: t)
            ref = sat.attention(
                *(as_bshd(t).detach() for t in (q, k, v)), mask="causal", backend="reference"
            )
            torch.testing.assert_close(as_bshd(o.view(S, S, H, D)), ref, rtol=2e-2, atol=2e-2)


def test_the_second_call_runs_the_cached_plan(monkeypatch):
    """The cache works: a repeated problem does not go through the extension's planned call
    again; clear_plan_cache() drops the PyTorch layer's plans too."""
    made = []
    for name in ("forward_planned", "backward_planned"):
        real = getattr(_ext, name)
        monkeypatch.setattr(
            _ext, name, lambda *a, _r=real, _n=name, **kw: made.append(_n) or _r(*a, **kw)
        )
    for _ in range(3):
        q, k, v = bshd()
        o = sat.attention(q, k, v, backend="cpu")
        o.backward(torch.ones_like(o))
    assert made == ["forward_planned", "backward_planned"]
    assert _torch_call._PLANS
    sa.clear_plan_cache()
    assert not _torch_call._PLANS


def test_steady_calls_make_no_plans_and_new_strides_do(seed):
    """The cached path is the one a training loop takes: after a problem's first forward and
    backward, further steps (fresh inputs of the same shapes and strides, through the op and
    through the module) make no plan; a call with other strides makes one forward and one
    backward plan; every result is right."""
    torch.manual_seed(seed)
    mod = sat.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="no_mask")
    mod.backend = "cpu"

    def module_step(q, k, v):
        o = mod(q, k, v)  # the module's own problem: O flat, [b, s, h * d]
        do = torch.randn(o.shape).to(o.dtype)
        grads = torch.autograd.grad(o, (q, k, v), do)
        dt, o4, do4 = q.dtype, np64(o).reshape(B, S, H, D), np64(do).reshape(B, S, H, D)
        exact = attention_ref(np64(q), np64(k), np64(v))
        naive = attention_ref(np64(q), np64(k), np64(v), lowp=dt)
        check("o", o4, exact["o"], naive["o"], dt, seed)
        gexact, gnaive = backward_targets(np64(q), np64(k), np64(v), o4, do4, dt)
        mag = grad_magnitude(gexact)
        for name, got in zip(("dq", "dk", "dv"), grads):
            check(name, np64(got), gexact[name], gnaive[name], dt, seed, magnitude=mag)

    for make, step in (
        (bshd, lambda q, k, v: check_call(seed, q, k, v)),
        (split_views, lambda q, k, v: check_call(seed, q, k, v)),  # other strides
        (bshd, module_step),
    ):
        before = _torch_call.plans_made()
        for i in range(3):
            step(*make())
            assert _torch_call.plans_made() == (before[0] + 1, before[1] + 1), f"step {i}"


@pytest.mark.parametrize(
    "bad",
    ["k_dtype", "v_heads", "mask", "backend", "window"],
)
def test_bad_input_gives_the_same_error_with_the_cache_warm(bad):
    def call():
        q, k, v = bshd()
        opts = dict(backend="cpu")
        if bad == "k_dtype":
            k = k.detach().to(torch.float16).requires_grad_()
        elif bad == "v_heads":
            v = torch.randn(B, S, H + 1, D).to(torch.bfloat16).requires_grad_()
        elif bad == "mask":
            opts["mask"] = "diagonal"
        elif bad == "backend":
            opts["backend"] = "tpu"
        else:
            opts["window"] = (1, 2, 3)
        return sat.attention(q, k, v, **opts)

    with pytest.raises(Exception) as cold:
        call()
    sat.attention(*bshd(), backend="cpu").sum().backward()  # the good problem, cached
    with pytest.raises(Exception) as warm:
        call()
    assert type(warm.value) is type(cold.value) and str(warm.value) == str(cold.value)


def test_no_leak_report_at_exit():
    """The cached plans (and those an autograd graph still holds at exit) are let go before
    the extension's teardown, which would otherwise print nanobind's leak report: the
    library never prints unless logging is on."""
    import subprocess
    import sys

    script = (
        "import torch, strideattn.torch as sat\n"
        "q, k, v = (torch.randn(1, 8, 2, 16).requires_grad_() for _ in range(3))\n"
        "o = sat.attention(q, k, v, backend='cpu')\n"  # a graph alive at exit
        "sat.attention(q, k, v, backend='cpu').sum().backward()\n"
        "m = sat.DotProductAttention(2, 16, qkv_format='bshd', backend='cpu')\n"
        "m(q, k, v).sum().backward()\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # (stderr may carry the framework's own warnings on some machines; none of ours)
    assert r.stdout == "" and "nanobind" not in r.stderr and "leaked" not in r.stderr, r.stderr


def test_the_cache_is_bounded(seed, monkeypatch):
    """Problems beyond the capacity (varlen lists that change every step) evict the oldest
    entry; an evicted problem is made again, correctly."""
    monkeypatch.setattr(_torch_call, "_CAPACITY", 3)
    torch.manual_seed(seed)
    t = 2 * S
    splits = [([n, t - n], [n, t - n]) for n in range(2, 8)]
    for _ in range(2):
        for lens_q, lens_kv in splits:
            q, k, v = (torch.randn(t, H, D).to(torch.bfloat16).requires_grad_() for _ in range(3))
            check_call(seed, q, k, v, seqlens_q=lens_q, seqlens_kv=lens_kv)
            assert len(_torch_call._PLANS) <= 3
