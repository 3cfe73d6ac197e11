"""Framework-neutral entry points: attention, attention_backward and explain over any
DLPack-capable tensors (numpy, PyTorch, CuPy, JAX). Tensors are passed to the C++ library
as pointers plus their own strides; outputs are allocated in the caller's framework, dtype
and device, in the dimension order of the matching input (so an sbhd input gives an sbhd
output). Status codes from the library become exceptions here."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _checks, _ext, _features
from ._context import _Context, _check_tensor, _dtype_of, _element_strides, _shape
from ._util import (
    CU_SEQLENS_ARRAYS,
    MASKS,
    BackendError,
    UnsupportedError,
    canonical_mask,
    cu_seqlens_bounds,
    describe,
    dim_order,
    framework,
    int_list,
    raise_for,
    raise_status,
    window_pair,
)

__all__ = [
    "MASKS",
    "BackendError",
    "UnsupportedError",
    "attention",
    "attention_backward",
    "explain",
    "version",
    "compiled_backends",
    "register_autograd",
    "workspace_size",
    "plan_cache_info",
    "clear_plan_cache",
]

# Argument types: a (left, right) window with -1 or None for unbounded; integer sequences
# (lists, tuples or 1-D integer arrays of any framework).
Window = Optional[Tuple[Optional[int], Optional[int]]]
Ints = Optional[Sequence[int]]

# Framework name -> (wants(q, k, v): whether this call needs gradients, differentiable
# attention(q, k, v, **options)). A framework's layer registers itself here when imported
# (strideattn.torch does; the package registers a loader for it), so this module never
# imports it.
_AUTOGRAD: Dict[str, Any] = {}


def register_autograd(name: str, wants: Callable[..., bool], fn: Callable[..., Any]) -> None:
    """Routes attention() calls on framework `name`'s tensors (torch, ...) for which
    wants(q, k, v) is true (and no out= is given) to the differentiable `fn`."""
    _AUTOGRAD[name] = (wants, fn)


# Framework layers that keep the extension's plans per problem (strideattn.torch's eager
# path) register how to drop them here, so that clear_plan_cache() drops those too.
_PLAN_CACHES: List[Callable[[], None]] = []


def register_plan_cache(clear: Callable[[], None]) -> None:
    """clear_plan_cache() also calls `clear` (a framework layer's own plans)."""
    _PLAN_CACHES.append(clear)


# ----------------------------------------------------------------------------- arguments


def _device_options(ctx, extra: dict) -> dict:
    """The extension keywords of cu_seqlens arrays, max_seqlen bounds and workspace in `extra`
    (None: not given)."""
    out = {}
    for name in CU_SEQLENS_ARRAYS:
        if extra.get(name) is not None:
            _check_tensor(extra[name], name)
            out[name] = ctx.prepare(extra[name])
    bounds = cu_seqlens_bounds(extra, extra.get("max_seqlen_q"), extra.get("max_seqlen_kv"))
    if bounds is not None:
        out["max_seqlen_q"], out["max_seqlen_kv"] = bounds
    if extra.get("workspace") is not None:
        _check_tensor(extra["workspace"], "workspace", writable=True)
        out["workspace"] = ctx.prepare(extra["workspace"])
    return out


def _options(
    mask,
    window,
    scale,
    deterministic,
    seqlens_q,
    seqlens_kv,
    offsets_q,
    offsets_kv,
    backend,
    stream,
) -> dict:
    mask = canonical_mask(mask)
    if not isinstance(backend, str):
        raise ValueError(
            f"backend must be a string (auto, reference, cpu, cuda, cudnn); got {describe(backend)}"
        )
    left, right = window_pair(window)
    scale = _checks.scale(scale)
    return dict(
        mask=mask,
        window_left=left,
        window_right=right,
        scale=scale,
        deterministic=bool(deterministic),
        seqlens_q=int_list(seqlens_q, "seqlens_q"),
        seqlens_kv=int_list(seqlens_kv, "seqlens_kv"),
        offsets_q=int_list(offsets_q, "offsets_q"),
        offsets_kv=int_list(offsets_kv, "offsets_kv"),
        backend=backend,
        stream=int(stream),
    )


def _begin(
    q,
    v,
    mask,
    window,
    scale,
    deterministic,
    seqlens_q,
    seqlens_kv,
    offsets_q,
    offsets_kv,
    backend,
    extra=None,
):
    """What attention() and explain() share: the caller's framework context, the parsed
    options (with the cu_seqlens arrays, bounds and workspace of `extra`), whether the call is
    varlen, and the q / v shapes (checked for rank)."""
    ctx = _Context(q)
    opts = _options(
        mask,
        window,
        scale,
        deterministic,
        seqlens_q,
        seqlens_kv,
        offsets_q,
        offsets_kv,
        backend,
        ctx.stream,
    )
    opts.update(_device_options(ctx, extra or {}))
    varlen = bool(opts["seqlens_q"] or opts["seqlens_kv"] or "cu_seqlens_q" in opts)
    qs, vs = _shape(q), _shape(v)
    if len(qs) not in (3, 4) or len(vs) not in (3, 4):
        raise ValueError(
            f"q and v must have 4 dimensions [b, s, h, d] (or 3 for varlen "
            f"[tokens, h, d]); got q {qs}, v {vs}"
        )
    return ctx, opts, varlen, qs, vs


def _call(fn, *tensors, **opts):
    try:
        return fn(*tensors, **opts)
    except TypeError as e:
        # nanobind could not import a tensor through DLPack (e.g. a tensor that needs grad)
        raise ValueError(f"a tensor could not be read through DLPack: {e}") from None


# ----------------------------------------------------------------------------- public API


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: str = "none",
    window: Window = None,
    scale: Optional[float] = None,
    seqlens_q: Ints = None,
    seqlens_kv: Ints = None,
    offsets_q: Ints = None,
    offsets_kv: Ints = None,
    backend: str = "auto",
    deterministic: bool = False,
    return_lse: bool = False,
    out: Any = None,
    cu_seqlens_q: Any = None,
    cu_seqlens_kv: Any = None,
    seq_offsets_q: Any = None,
    seq_offsets_kv: Any = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    workspace: Any = None,
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
    dropout_offset: int = 0,
    dropout_rng: Any = None,
    bias: Any = None,
    bias_type: str = "post_scale",
    alibi_slopes: Any = None,
    softcap: Optional[float] = None,
    sinks: Any = None,
    return_max_logit: bool = False,
) -> Union[Any, Tuple[Any, ...]]:
    """Scaled dot-product attention O = softmax(scale * Q K^T + mask) V.

    Shapes (logical; any strides with a unit stride on the head dim): q [b, s_q, h, d_qk],
    k [b, s_kv, hg, d_qk], v [b, s_kv, hg, d_v], h % hg == 0. Varlen: q/k/v are
    [tokens, h, d] (or [1, tokens, h, d]) and seqlens_q/seqlens_kv give each sequence's token
    count, offsets_q/offsets_kv its first token (default: packed back to back).

    mask: "none", "causal" (top-left, j <= i) or "causal_bottom_right" (j <= i + s_kv - s_q);
    window=(left, right) around the bottom-right diagonal, -1/None unbounded.
    Returns O (in q's framework, dtype and device; laid out in q's dimension order), and the
    fp32 LSE [b, h, s_q] (varlen: [h, tokens]) when return_lse. `out` receives O in place.

    q, k, v are [batch, seq, heads, head_dim]: PyTorch SDPA's [batch, heads, seq, head_dim]
    tensors have the same rank and are not told apart here; pass those to strideattn.sdpa.
    mask also accepts the aliases no_mask, top_left / causal_top_left and bottom_right.

    Varlen lengths may instead come as cu_seqlens arrays (FlashAttention's and
    TransformerEngine's form): cu_seqlens_q / cu_seqlens_kv int32 tensors of count + 1
    prefix sums on the tensors' device, seq_offsets_q / seq_offsets_kv (optional) the first
    token of each sequence, and max_seqlen_q / max_seqlen_kv (required with them) the bound
    on every length. They are read by the backend where they are: nothing is copied to the
    host and nothing synchronises. `workspace` is scratch memory for the call (a tensor of at
    least workspace_size() bytes on the tensors' device); without it the library allocates.

    Training features (docs/semantics.md "Training features"; the reference and cpu backends
    run them, cuda too, cudnn refuses each with a named rule): softcap > 0 caps
    the scaled logits (c * tanh(x / c)); bias is an additive bias of logical shape
    [b or 1, h or 1, s_q, s_kv] (each extent full or 1; any strides, stride 0 broadcasts;
    float32/float16/bfloat16),
    added after the scale and softcap (bias_type="post_scale") or to Q K^T before the scale
    ("pre_scale"); alibi_slopes ([h] or [b, h] float32) subtracts slope * |i + s_kv - s_q - j|;
    sinks ([h] float32) joins every row's softmax denominator as exp(sink); dropout_p drops
    each probability with that chance (Philox of dropout_seed, dropout_offset and the
    position: every backend and the backward draw the same mask); dropout_rng, a [2] int64
    tensor (seed, offset) on the tensors' device, is read when the call runs instead of the
    two values (so a captured CUDA graph draws what was written there before each replay). return_max_logit adds a
    float32 [b, h] (varlen: [sequences, h]) table of each head's largest logit after the
    last output: attention() returns o, (o, lse), (o, max_logit) or (o, lse, max_logit).

    PyTorch tensors that require grad go through the autograd op of strideattn.torch (with
    training features: eagerly, gradients to q, k, v, a bias and sinks that require grad).
    Raises ValueError (bad input), UnsupportedError (a NotImplementedError) and
    BackendError (a RuntimeError) with the library's message.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(x, name)
    if out is not None:
        _check_tensor(out, "out", writable=True)
    extra = dict(
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_kv=cu_seqlens_kv,
        seq_offsets_q=seq_offsets_q,
        seq_offsets_kv=seq_offsets_kv,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_kv=max_seqlen_kv,
        workspace=workspace,
    )
    feats = dict(
        dropout_p=dropout_p or None,
        dropout_seed=dropout_seed or None,
        dropout_offset=dropout_offset or None,
        dropout_rng=dropout_rng,
        bias=bias,
        bias_type=bias_type if bias is not None else None,
        alibi_slopes=alibi_slopes,
        softcap=softcap,
        sinks=sinks,
        return_max_logit=return_max_logit or None,
    )
    feats = {key: val for key, val in feats.items() if val is not None}
    hook = _AUTOGRAD.get(framework(q))
    if hook is not None and out is None and hook[0](q, k, v):
        if workspace is not None:
            raise ValueError(
                "workspace is given with tensors that require grad: the autograd op takes "
                "its scratch from the framework's caching allocator (no cudaMalloc on the "
                "call path) and takes none from the caller; call without workspace, or with "
                "tensors that do not require grad"
            )
        return hook[1](
            q,
            k,
            v,
            mask=mask,
            window=window,
            scale=scale,
            seqlens_q=seqlens_q,
            seqlens_kv=seqlens_kv,
            offsets_q=offsets_q,
            offsets_kv=offsets_kv,
            backend=backend,
            deterministic=deterministic,
            return_lse=return_lse,
            **{key: val for key, val in extra.items() if val is not None},
            **feats,
        )

    ctx, opts, varlen, qs, vs = _begin(
        q,
        v,
        mask,
        window,
        scale,
        deterministic,
        seqlens_q,
        seqlens_kv,
        offsets_q,
        offsets_kv,
        backend,
        extra,
    )
    opts.update(
        _features.options(
            ctx,
            softcap=softcap,
            dropout_p=dropout_p,
            dropout_seed=dropout_seed,
            dropout_offset=dropout_offset,
            dropout_rng=dropout_rng,
            bias=bias,
            bias_type=bias_type,
            alibi_slopes=alibi_slopes,
            sinks=sinks,
        )
    )
    with ctx.device_scope():
        o = out
        if o is None:
            o = ctx.empty(
                qs[:-1] + (vs[-1],),
                _dtype_of(q),
                dim_order(qs, _element_strides(q, ctx.fw)),
                zero=varlen,
            )
        lse = None
        if return_lse:
            if varlen:
                lse_shape, lse_order = (qs[-2], qs[-3]), [0, 1]
            else:
                lse_shape, lse_order = (qs[0], qs[2], qs[1]), [0, 1, 2]
            lse = ctx.empty(lse_shape, "float32", lse_order, zero=varlen)
        ml = _features.max_logit(ctx, qs, opts, varlen) if return_max_logit else None
        if ml is not None:
            opts["max_logit"] = ctx.as_ext(ml)
        code, msg = _call(
            _ext.forward,
            ctx.prepare(q),
            ctx.prepare(k),
            ctx.prepare(v),
            ctx.as_ext(o),
            None if lse is None else ctx.as_ext(lse),
            **opts,
        )
        raise_status(code, msg, opts, varlen)
        o = ctx.finish(o) if out is None else out
        if lse is not None:
            lse = ctx.finish(lse)
        if ml is not None:
            ml = ctx.finish(ml)
    result = (o,) + ((lse,) if return_lse else ()) + ((ml,) if return_max_logit else ())
    return result if len(result) > 1 else o


def attention_backward(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    dout: Any,
    lse: Any,
    *,
    mask: str = "none",
    window: Window = None,
    scale: Optional[float] = None,
    seqlens_q: Ints = None,
    seqlens_kv: Ints = None,
    offsets_q: Ints = None,
    offsets_kv: Ints = None,
    backend: str = "auto",
    deterministic: bool = False,
    dq: Any = None,
    dk: Any = None,
    dv: Any = None,
    cu_seqlens_q: Any = None,
    cu_seqlens_kv: Any = None,
    seq_offsets_q: Any = None,
    seq_offsets_kv: Any = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    workspace: Any = None,
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
    dropout_offset: int = 0,
    dropout_rng: Any = None,
    bias: Any = None,
    bias_type: str = "post_scale",
    alibi_slopes: Any = None,
    softcap: Optional[float] = None,
    sinks: Any = None,
    bias_requires_grad: bool = False,
) -> Tuple[Any, ...]:
    """Gradients of attention(): returns (dq, dk, dv) for the forward output `out`, its
    gradient `dout` and the forward's LSE (return_lse=True). dk/dv are summed over each GQA
    group. dq/dk/dv may be given as (strided) views to write into, e.g. slices of the
    gradient of a fused QKV buffer; the others are allocated like q, k, v. Options must match
    the forward call. deterministic=True asks for a bitwise reproducible result. cu_seqlens
    arrays, their bounds and a workspace as attention() takes them.

    Training features as attention() takes them, the same values as the forward had (the
    dropout mask is drawn again from dropout_seed / dropout_offset or dropout_rng). The result is
    (dq, dk, dv), then dbias (the bias's logical shape and dtype, summed over its extent-1
    dimensions) when a bias is given with bias_requires_grad=True, then d_sinks ([h] float32,
    summed over batches and rows) when sinks are given."""
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout), ("lse", lse)):
        _check_tensor(x, name)
    for name, x in (("dq", dq), ("dk", dk), ("dv", dv)):
        if x is not None:
            _check_tensor(x, name, writable=True)
    ctx, opts, varlen, _, _ = _begin(
        q,
        v,
        mask,
        window,
        scale,
        deterministic,
        seqlens_q,
        seqlens_kv,
        offsets_q,
        offsets_kv,
        backend,
        dict(
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv,
            seq_offsets_q=seq_offsets_q,
            seq_offsets_kv=seq_offsets_kv,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv,
            workspace=workspace,
        ),
    )
    opts.update(
        _features.options(
            ctx,
            softcap=softcap,
            dropout_p=dropout_p,
            dropout_seed=dropout_seed,
            dropout_offset=dropout_offset,
            dropout_rng=dropout_rng,
            bias=bias,
            bias_type=bias_type,
            alibi_slopes=alibi_slopes,
            sinks=sinks,
        )
    )
    if bias_requires_grad and bias is None:
        raise ValueError("bias_requires_grad=True without a bias; pass bias= (the forward's bias)")
    given = (dq, dk, dv)
    with ctx.device_scope():
        extras = []  # (dbias, d_sinks) as asked, in that order
        if bias is not None and bias_requires_grad:
            extras.append(_features.dbias(ctx, bias))
            opts["dbias"] = ctx.as_ext(extras[-1])
        if sinks is not None:
            extras.append(_features.d_sinks(ctx, sinks))
            opts["d_sinks"] = ctx.as_ext(extras[-1])
        grads = []
        for g, like in zip(given, (q, k, v)):
            if g is None:
                s = _shape(like)
                g = ctx.empty(
                    s,
                    _dtype_of(like),
                    dim_order(s, _element_strides(like, framework(like))),
                    zero=varlen,
                )
            grads.append(g)
        code, msg = _call(
            _ext.backward,
            ctx.prepare(q),
            ctx.prepare(k),
            ctx.prepare(v),
            ctx.prepare(out),
            ctx.prepare(dout),
            ctx.prepare(lse),
            *[ctx.as_ext(g) for g in grads],
            **opts,
        )
        raise_status(code, msg, opts, varlen)
        result = tuple(g if g0 is not None else ctx.finish(g) for g, g0 in zip(grads, given))
        result += tuple(ctx.finish(x) for x in extras)
    return result


def explain(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: str = "none",
    window: Window = None,
    scale: Optional[float] = None,
    seqlens_q: Ints = None,
    seqlens_kv: Ints = None,
    offsets_q: Ints = None,
    offsets_kv: Ints = None,
    backend: str = "auto",
    deterministic: bool = False,
    grad: bool = False,
    out: Any = None,
    dout: Any = None,
    lse: Any = None,
    cu_seqlens_q: Any = None,
    cu_seqlens_kv: Any = None,
    seq_offsets_q: Any = None,
    seq_offsets_kv: Any = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    **features: Any,
) -> Dict[str, Any]:
    """What the library would do with these tensors, without running anything.

    Returns {"valid": bool, "code": str, "error": message or None, "layout": str,
    "verdicts": [{"backend", "supported", "rule", "reason"}, ... in auto preference order],
    "chosen": the backend `auto` would run, or None}. grad=True explains the backward pass
    (missing out/dout/lse are allocated). Training features as attention() takes them
    (dropout_p, ..., return_max_logit; with grad, bias_requires_grad too)."""
    refused = _checks.unreadable(_check_tensor, q=q, k=k, v=v, out=out, dout=dout, lse=lse)
    if refused is not None:
        return refused
    ctx, opts, varlen, qs, vs = _begin(
        q,
        v,
        mask,
        window,
        scale,
        deterministic,
        seqlens_q,
        seqlens_kv,
        offsets_q,
        offsets_kv,
        backend,
        dict(
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv,
            seq_offsets_q=seq_offsets_q,
            seq_offsets_kv=seq_offsets_kv,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv,
        ),
    )
    with ctx.device_scope():
        opts.update(_features.explain_options(ctx, features, grad, qs, opts, varlen))
        order = dim_order(qs, _element_strides(q, ctx.fw))
        o = out if out is not None else ctx.empty(qs[:-1] + (vs[-1],), _dtype_of(q), order, False)
        if not grad:
            return _call(
                _ext.explain_forward,
                ctx.prepare(q),
                ctx.prepare(k),
                ctx.prepare(v),
                ctx.as_ext(o),
                None,
                **opts,
            )
        d_o = dout if dout is not None else ctx.empty(_shape(o), _dtype_of(q), order, False)
        if lse is None:
            lse = (
                ctx.empty((qs[-2], qs[-3]), "float32", [0, 1], False)
                if varlen
                else ctx.empty((qs[0], qs[2], qs[1]), "float32", [0, 1, 2], False)
            )
        grads = [
            ctx.empty(
                _shape(x),
                _dtype_of(x),
                dim_order(_shape(x), _element_strides(x, framework(x))),
                False,
            )
            for x in (q, k, v)
        ]
        return _call(
            _ext.explain_backward,
            ctx.prepare(q),
            ctx.prepare(k),
            ctx.prepare(v),
            ctx.as_ext(o),
            ctx.as_ext(d_o),
            ctx.as_ext(lse),
            *[ctx.as_ext(g) for g in grads],
            **opts,
        )


def workspace_size(
    q: Any,
    k: Any,
    v: Any,
    *,
    grad: bool = False,
    out: Any = None,
    dout: Any = None,
    lse: Any = None,
    **options: Any,
) -> int:
    """Bytes of workspace a call of attention() (grad=False) or attention_backward()
    (grad=True) with these tensors and options needs: allocate that much in the caller's
    framework (e.g. torch.empty(n, dtype=torch.uint8, device=q.device)) and pass it as
    workspace=. Missing out/dout/lse are allocated for the query. Raises as attention() does."""
    ex = explain(q, k, v, grad=grad, out=out, dout=dout, lse=lse, **options)
    if not ex["valid"]:
        raise_for(ex["code"], ex["error"])
    return int(ex.get("workspace_size", 0))


def plan_cache_info() -> Dict[str, int]:
    """The extension's cache of plans: size, capacity, hits, misses (one plan per problem:
    everything but the pointers)."""
    return dict(_ext.plan_cache_info())


def clear_plan_cache() -> None:
    """Drops the extension's plans, and those a framework layer keeps (the next call of each
    problem makes its plan again)."""
    _ext.clear_plan_cache()
    for clear in _PLAN_CACHES:
        clear()


def version() -> str:
    """The C++ library's version."""
    return _ext.version()


def compiled_backends() -> List[str]:
    """Backends this build contains (reference and cpu always; cuda/cudnn with CUDA)."""
    return list(_ext.compiled_backends())
