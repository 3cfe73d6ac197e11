"""KV-cache attention for inference (docs/semantics.md "KV cache"): attention_with_kvcache and
explain_with_kvcache over any DLPack-capable tensors, with FlashAttention's argument names
(flash_attn_with_kvcache: q, k_cache, v_cache, k, v, cache_seqlens, block_table) and the
package's mask keywords. New tokens k / v are written into the caches in place; cache_seqlens
is only read (the caller advances it). Lengths and the block table stay where they are: int32
tensors on the tensors' device, handed to the library without a copy."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

from . import _checks, _ext
from ._core import Window, _call, _check_tensor, _Context, _element_strides, _shape
from ._util import canonical_mask, describe, dim_order, framework, int64, raise_for, window_pair

__all__ = ["attention_with_kvcache", "explain_with_kvcache"]


def _int32_array(ctx: _Context, values, name: str) -> Any:
    """cache_seqlens / seqlens_q as the extension takes them: an int32 tensor of the caller's
    framework is passed as it is (other integer dtypes are refused: converting would copy it
    off the caller's memory); a Python int (every sequence) or a list becomes an int32 array
    in q's framework and device."""
    if hasattr(values, "dtype") and hasattr(values, "shape"):
        _check_tensor(values, name)
        if str(values.dtype).replace("torch.", "") != "int32":
            raise ValueError(
                f"{name} has dtype {values.dtype} ({describe(values)}); supported: int32 "
                f"(e.g. {name}.astype(numpy.int32) / .to(torch.int32))"
            )
        return ctx.prepare(values)
    if isinstance(values, (list, tuple)):
        items = [int64(v, f"{name}[{i}]") for i, v in enumerate(values)]
    else:
        n = int64(values, name)
        items = [n] * int(_shape(ctx.like)[0])
    for i, v in enumerate(items):
        if not -(2**31) <= v < 2**31:
            raise ValueError(f"{name}[{i}] is {v}; supported: a value that fits in int32")
    fw = ctx.fw
    if fw == "torch":
        import torch

        return torch.tensor(items, dtype=torch.int32, device=ctx.like.device)
    if fw == "cupy":
        import cupy

        with ctx.like.device:
            return cupy.asarray(items, dtype=cupy.int32)
    if fw == "jax":
        import jax
        import numpy

        # on q's device: JAX's default device is the GPU where there is one, also when the
        # caller's arrays live on its CPU device
        arr = jax.device_put(
            numpy.asarray(items, dtype=numpy.int32), next(iter(ctx.like.devices()))
        )
        arr.block_until_ready()
        return arr
    import numpy

    return numpy.asarray(items, dtype=numpy.int32)


def _begin(q, k_cache, v_cache, k, v, cache_seqlens, block_table, seqlens_q, out, appends):
    """The shared checks: every tensor readable (the caches writable when appending), and
    the lengths as int32 arrays. Returns the context and the extension's tensor keywords."""
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if appends and name != "q":
            written = "new tokens k, v are written into the caches in place"
            if framework(x) == "jax":
                raise ValueError(
                    f"{name}: JAX arrays are immutable and {written}; use numpy / PyTorch / CuPy "
                    "caches to append, or call without k and v"
                )
            if framework(x) == "numpy" and not x.flags.writeable:
                raise ValueError(f"{name} is a read-only numpy array ({describe(x)}); {written}")
        _check_tensor(x, name, writable=appends and name != "q")
    for name, x in (("k", k), ("v", v), ("block_table", block_table)):
        if x is not None:
            _check_tensor(x, name)
    if (k is None) != (v is None):
        raise ValueError(
            f"{'k' if k is not None else 'v'} is given without {'v' if k is not None else 'k'}; "
            "supported: both new-token tensors k and v ([batch, seq_new, kv_heads, head_dim]), "
            "or neither"
        )
    if out is not None:
        _check_tensor(out, "out", writable=True)
    if cache_seqlens is None:
        raise ValueError(
            "cache_seqlens is required: the tokens already in each sequence's cache (an int, "
            "or int32 [batch] on the tensors' device)"
        )
    ctx = _Context(q)
    cache_dims = (
        "[num_pages, page_size, kv_heads, head_dim] (a paged cache)"
        if block_table is not None
        else "[batch, seq_max, kv_heads, head_dim] (a contiguous cache)"
    )
    dims = {"q": "[batch, seq_q, heads, head_dim]", "k_cache": cache_dims, "v_cache": cache_dims}
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if len(_shape(x)) != 4:
            raise ValueError(f"{name} must have 4 dimensions {dims[name]}; got {describe(x)}")
    tensors = dict(
        q=ctx.prepare(q),
        k_cache=ctx.prepare(k_cache),
        v_cache=ctx.prepare(v_cache),
        cache_seqlens=_int32_array(ctx, cache_seqlens, "cache_seqlens"),
        k=None if k is None else ctx.prepare(k),
        v=None if v is None else ctx.prepare(v),
        block_table=None if block_table is None else ctx.prepare(block_table),
        seqlens_q=None if seqlens_q is None else _int32_array(ctx, seqlens_q, "seqlens_q"),
    )
    return ctx, tensors


def _options(mask, window, scale, backend, ctx) -> dict:
    if not isinstance(backend, str):
        raise ValueError(
            f"backend must be a string (auto, reference, cpu, cuda, cudnn); got {describe(backend)}"
        )
    left, right = window_pair(window)
    return dict(
        mask=canonical_mask(mask),
        window_left=left,
        window_right=right,
        scale=_checks.scale(scale),
        backend=backend,
        stream=int(ctx.stream),
    )


def attention_with_kvcache(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    k: Any = None,
    v: Any = None,
    *,
    cache_seqlens: Any,
    block_table: Any = None,
    seqlens_q: Any = None,
    mask: str = "none",
    window: Window = None,
    scale: Optional[float] = None,
    backend: str = "auto",
    return_lse: bool = False,
    out: Any = None,
) -> Union[Any, Tuple[Any, Any]]:
    """Attention of q against each sequence's cached keys and values (inference decode,
    speculative decoding, chunked prefill), FlashAttention's flash_attn_with_kvcache.

    q [b, s_q, h, d_qk]. Contiguous caches (block_table None): k_cache [b, s_max, hg, d_qk],
    v_cache [b, s_max, hg, d_v]; sequence n's token t is k_cache[n, t]. Paged caches:
    k_cache [num_pages, page_size, hg, d_qk] with block_table int32 [b, max_pages]; token t is
    k_cache[block_table[n, t // page_size], t % page_size]. Pages may be shared for reading.
    cache_seqlens: the tokens already cached per sequence (int32 [b] on the tensors' device,
    or an int / list, made into one). k, v [b, s_new, hg, d]: new tokens, **written into the
    caches in place** at tokens cache_seqlens[n] .. + s_new - 1 (nothing else of the caches
    is written), then attended to; cache_seqlens is not updated (advance it by s_new).
    seqlens_q (optional int32 [b]): query rows each sequence uses (rows past it: O 0, LSE -inf).

    mask / window are measured over each sequence's attended length L = cache_seqlens + s_new:
    "causal_bottom_right" is FlashAttention's causal=True (a decode row sees all L keys);
    "causal" is top-left (j <= i) and with s_q < L sees only the first keys. Returns O like q
    (d_v wide) and, with return_lse, the fp32 LSE [b, h, s_q]; `out` receives O in place.
    Forward only. Tensors may use any strides. Raises ValueError (bad input, with the shapes
    and values found), UnsupportedError (a backend that cannot run the call, with its rule)
    and BackendError."""
    appends = k is not None or v is not None
    ctx, tensors = _begin(
        q, k_cache, v_cache, k, v, cache_seqlens, block_table, seqlens_q, out, appends
    )
    opts = _options(mask, window, scale, backend, ctx)
    qs, vs = _shape(q), _shape(v_cache)
    with ctx.device_scope():
        o = out
        if o is None:
            o = ctx.empty(
                qs[:-1] + (vs[-1],), q.dtype, dim_order(qs, _element_strides(q, ctx.fw)), False
            )
        lse = None
        if return_lse:
            lse = ctx.empty((qs[0], qs[2], qs[1]), "float32", [0, 1, 2], False)
        code, msg = _call(
            _ext.forward_kvcache,
            out=ctx.as_ext(o),
            lse=None if lse is None else ctx.as_ext(lse),
            **tensors,
            **opts,
        )
        raise_for(code, msg)
        o = ctx.finish(o) if out is None else out
        if lse is not None:
            lse = ctx.finish(lse)
    return (o, lse) if return_lse else o


def explain_with_kvcache(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    k: Any = None,
    v: Any = None,
    *,
    cache_seqlens: Any,
    block_table: Any = None,
    seqlens_q: Any = None,
    mask: str = "none",
    window: Window = None,
    scale: Optional[float] = None,
    backend: str = "auto",
) -> Dict[str, Any]:
    """What attention_with_kvcache would do with these arguments, without running anything
    (nothing is read from the lengths or the block table, nothing written): {"valid", "code",
    "error", "layout" (the cache described), "verdicts", "chosen"} as explain() returns."""
    appends = k is not None or v is not None
    try:
        ctx, tensors = _begin(
            q, k_cache, v_cache, k, v, cache_seqlens, block_table, seqlens_q, None, appends
        )
    except ValueError as e:
        return {
            "valid": False,
            "code": "invalid_argument",
            "error": str(e),
            "layout": "",
            "verdicts": [],
            "chosen": None,
        }
    opts = _options(mask, window, scale, backend, ctx)
    qs, vs = _shape(q), _shape(v_cache)
    with ctx.device_scope():
        o = ctx.empty(
            qs[:-1] + (vs[-1],), q.dtype, dim_order(qs, _element_strides(q, ctx.fw)), False
        )
        return _call(_ext.explain_kvcache, out=ctx.as_ext(o), lse=None, **tensors, **opts)
