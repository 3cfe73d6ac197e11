"""Drop-in entry points with the names and meanings of PyTorch's
scaled_dot_product_attention (`sdpa`) and FlashAttention 2's `flash_attn_func` /
`flash_attn_varlen_func` and their packed QKV / KV forms, mapped onto strideattn.attention
without copies:

- SDPA's tensors are [batch, heads, seq, head_dim]: they are handed over as [b, s, h, d]
  views (the strides permuted) and the output is permuted back. is_causal is top-left
  aligned (our `causal`); KV heads may differ from query heads only with enable_gqa=True.
- FlashAttention's tensors are already [b, s, h, d] (varlen: [tokens, h, d]); causal=True is
  BOTTOM-RIGHT aligned (our `causal_bottom_right`), window_size=(left, right) is measured
  from the bottom-right diagonal as ours is, -1 unbounded; cu_seqlens_* (length b + 1) become
  our lengths and offsets. The packed forms read q, k, v (or k, v) as views of the one
  buffer, with the same arguments.

Arguments that strideattn cannot honour raise NotImplementedError naming the argument."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from ._core import attention
from ._util import cu_seqlens_lengths, describe, framework, int64


def _bhsd_to_bshd(x: Any, name: str) -> Any:
    """The [b, s, h, d] view of a [b, h, s, d] tensor (a stride permutation, no copy)."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) != 4:
        raise ValueError(
            f"{name} must have 4 dimensions [batch, heads, seq, head_dim] (PyTorch "
            f"SDPA's layout); got {describe(x)}"
        )
    if framework(x) == "torch":
        return x.transpose(1, 2)
    if not hasattr(x, "transpose"):
        raise ValueError(
            f"{name}: {describe(x)} has no transpose(); sdpa needs a numpy, torch, "
            "cupy or jax array"
        )
    return x.transpose(0, 2, 1, 3)


def _no(arg: str, value: Any, supported: str) -> NotImplementedError:
    return NotImplementedError(
        f"{arg}={describe(value)} is not supported by strideattn; supported: {supported}"
    )


def sdpa(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> Any:
    """torch.nn.functional.scaled_dot_product_attention's arguments and meaning, computed by
    strideattn on any DLPack-capable tensors (numpy, torch, cupy, jax).

    query [b, h_q, s_q, d_qk], key [b, h_kv, s_kv, d_qk], value [b, h_kv, s_kv, d_v], any
    strides with a unit head-dim stride; returns [b, h_q, s_q, d_v]. is_causal masks key j
    from query i when j > i (top-left aligned, strideattn's `causal`). scale defaults to
    1/sqrt(d_qk). h_kv != h_q needs enable_gqa=True and h_q % h_kv == 0. A floating-point
    attn_mask is SDPA's additive bias on the scaled scores, any shape that broadcasts to
    [b, h_q, s_q, s_kv]: strideattn's post-scale bias, read through a broadcast view (no
    copy; with PyTorch, a mask that requires grad gets its gradient). A boolean attn_mask
    raises NotImplementedError. dropout_p > 0 (PyTorch tensors) drops probabilities with
    strideattn's Philox mask, its seed drawn from PyTorch's generator of the tensors' device
    (torch.manual_seed reproduces a run; _dropout). PyTorch tensors that require grad are
    differentiable (strideattn.torch's autograd op)."""
    drop = _dropout(dropout_p, query)
    q, k, v = (_bhsd_to_bshd(x, n) for x, n in ((query, "query"), (key, "key"), (value, "value")))
    h_q, h_kv = int(q.shape[2]), int(k.shape[2])
    if h_q != h_kv and not enable_gqa:
        raise ValueError(
            f"query has {h_q} heads but key/value have {h_kv}: different head "
            "counts need enable_gqa=True (as in PyTorch SDPA)"
        )
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be a bool, got {describe(is_causal)}")
    bias = {}
    if attn_mask is not None:
        if is_causal:
            raise ValueError("attn_mask and is_causal=True together (PyTorch SDPA refuses them)")
        shape = (int(q.shape[0]), h_q, int(q.shape[1]), int(k.shape[1]))
        bias = dict(bias=_sdpa_bias(attn_mask, shape), bias_type="post_scale")
    o = attention(q, k, v, mask="causal" if is_causal else "none", scale=scale, **bias, **drop)
    return o.transpose(1, 2) if framework(o) == "torch" else o.transpose(0, 2, 1, 3)


def _sdpa_bias(mask: Any, shape: Tuple[int, int, int, int]) -> Any:
    """SDPA's floating-point attn_mask as a [b, h, s_q, s_kv] view (broadcast dims at stride 0,
    the rules of numpy and PyTorch broadcasting)."""
    dtype = str(getattr(mask, "dtype", ""))
    if "bool" in dtype:
        raise _no(
            "attn_mask",
            mask,
            "a floating-point additive mask (a boolean one as 0 / -inf in the query's dtype, "
            "made by the caller: strideattn makes no hidden copy); is_causal for a causal mask, "
            "strideattn.attention's window= for sliding windows",
        )
    if "float" not in dtype:
        raise ValueError(f"attn_mask must be a floating-point array, got {describe(mask)}")
    fw = framework(mask)
    if fw == "torch":
        return mask.expand(shape)
    if fw == "cupy":
        import cupy as xp
    elif fw == "jax":
        import jax.numpy as xp
    else:
        import numpy as xp
    return xp.broadcast_to(mask, shape)


def _flash_features(softcap: float, alibi_slopes: Any, dropout_p: Any, like: Any) -> dict:
    """FlashAttention-2's softcap, ALiBi and dropout as strideattn's features (docs/
    semantics.md: the same definitions, in the same order; the dropout mask strideattn's)."""
    feats = _dropout(dropout_p, like)
    if softcap != 0.0:
        feats["softcap"] = float(softcap)
    if alibi_slopes is not None:
        feats["alibi_slopes"] = alibi_slopes
    return feats


def _dropout(p: Any, like: Any) -> dict:
    """strideattn's dropout keywords for a drop-in's dropout_p: none at 0; with PyTorch
    tensors p and a seed and offset drawn from PyTorch's generator of like's device (on CUDA
    a device tensor the kernels read: no synchronisation, fresh under graph replay), as
    DotProductAttention draws them. The mask is strideattn's (Philox of the seed and each
    element's position, docs/semantics.md), not the original library's: the same
    distribution, other draws."""
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise ValueError(f"dropout_p must be a number, got {describe(p)}")
    if p == 0:
        return {}
    if framework(like) != "torch":
        raise _no(
            "dropout_p",
            p,
            "0.0 with non-PyTorch arrays (strideattn.attention takes dropout_p with an "
            "explicit dropout_seed)",
        )
    from ._torch_te_features import dropout_rng

    return dict(dropout_p=float(p), **dropout_rng(like))


def _flash_unsupported(return_attn_probs: bool) -> None:
    if return_attn_probs:
        raise _no(
            "return_attn_probs",
            return_attn_probs,
            "False (strideattn.attention(..., return_lse=True) returns the LSE)",
        )


def _flash_window(window_size: Any) -> Tuple[int, int]:
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(
            f"window_size must be (left, right) with -1 for unbounded, got {describe(window_size)}"
        ) from None
    left, right = int64(left, "window_size[0]"), int64(right, "window_size[1]")
    for side, w in (("window_size[0]", left), ("window_size[1]", right)):
        if w < -1:
            raise ValueError(f"{side} is {w}; supported: -1 (unbounded) or >= 0")
    return left, right


def flash_attn_func(
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Any:
    """FlashAttention 2's flash_attn_func, computed by strideattn.

    q [b, s_q, h, d_qk], k [b, s_kv, h_kv, d_qk], v [b, s_kv, h_kv, d_v] (h % h_kv == 0);
    returns [b, s_q, h, d_v]. causal=True is aligned to the BOTTOM-RIGHT corner: query i sees
    key j when j <= i + s_kv - s_q (strideattn's `causal_bottom_right`). window_size=(left,
    right): query i sees keys i + s_kv - s_q - left ... i + s_kv - s_q + right, -1 unbounded.
    softmax_scale defaults to 1/sqrt(d_qk). deterministic=True asks for a reproducible
    backward. softcap > 0 caps the scaled scores (c * tanh(x / c)); alibi_slopes ([h] or
    [b, h] fp32) adds -slope * |i + s_kv - s_q - j|: FlashAttention-2's definitions.
    dropout_p > 0 (PyTorch tensors) as in sdpa. return_attn_probs raises
    NotImplementedError."""
    _flash_unsupported(return_attn_probs)
    return attention(
        q,
        k,
        v,
        mask="causal_bottom_right" if causal else "none",
        window=_flash_window(window_size),
        scale=softmax_scale,
        deterministic=bool(deterministic),
        **_flash_features(softcap, alibi_slopes, dropout_p, q),
    )


def _check_max(max_seqlen: Any, lengths: list, name: str) -> None:
    # FlashAttention sizes its grid from max_seqlen: a smaller value than the longest
    # sequence leaves that sequence's rows unprocessed there; refuse it instead.
    m = int64(max_seqlen, name)
    if lengths and m < max(lengths):
        raise ValueError(
            f"{name} is {m} but the longest sequence has {max(lengths)} tokens; "
            f"supported: {name} >= every sequence's length"
        )


def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Any = None,
) -> Any:
    """FlashAttention 2's flash_attn_varlen_func, computed by strideattn.

    q [total_q, h, d_qk], k [total_k, h_kv, d_qk], v [total_k, h_kv, d_v]; cu_seqlens_q /
    cu_seqlens_k: cumulative sequence lengths (length batch + 1, int32 in FlashAttention; any
    integer array or list here): sequence i has tokens cu_seqlens[i] .. cu_seqlens[i+1] - 1.
    max_seqlen_q / max_seqlen_k must be at least the longest sequence. Returns
    [total_q, h, d_v]; tokens outside every sequence are 0. causal, window_size, softcap,
    alibi_slopes and the unsupported arguments as in flash_attn_func (per sequence; with
    softcap, ALiBi or dropout the lengths are read on the host); block_table (paged KV) raises
    NotImplementedError. PyTorch int32 arrays on q's device go to the kernels as they are
    (nothing read back, nothing synchronised; each length is then clamped to its max_seqlen,
    docs/semantics.md); other arrays and lists are read on the host and checked there."""
    _flash_unsupported(return_attn_probs)
    if block_table is not None:
        raise _no("block_table", block_table, "None (no paged KV cache)")
    feats = _flash_features(softcap, alibi_slopes, dropout_p, q)
    if not feats and _torch_device_arrays(q, k, v, cu_seqlens_q, cu_seqlens_k):
        return attention(
            q, k, v, mask="causal_bottom_right" if causal else "none",
            window=_flash_window(window_size), scale=softmax_scale, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_k, max_seqlen_q=int64(max_seqlen_q, "max_seqlen_q"),
            max_seqlen_kv=int64(max_seqlen_k, "max_seqlen_k"), deterministic=bool(deterministic),
        )  # fmt: skip
    lens_q, offs_q = cu_seqlens_lengths(cu_seqlens_q, "cu_seqlens_q")
    lens_k, offs_k = cu_seqlens_lengths(cu_seqlens_k, "cu_seqlens_k")
    if len(lens_q) != len(lens_k):
        raise ValueError(
            f"cu_seqlens_q has {len(lens_q) + 1} entries but cu_seqlens_k has "
            f"{len(lens_k) + 1}; both are batch + 1"
        )
    _check_max(max_seqlen_q, lens_q, "max_seqlen_q")
    _check_max(max_seqlen_k, lens_k, "max_seqlen_k")
    for name, x in (("q", q), ("k", k), ("v", v)):
        shape = getattr(x, "shape", None)
        if shape is None or len(shape) != 3:
            raise ValueError(
                f"{name} must have 3 dimensions [total_tokens, heads, head_dim]; got {describe(x)}"
            )
    return attention(
        q,
        k,
        v,
        mask="causal_bottom_right" if causal else "none",
        window=_flash_window(window_size),
        scale=softmax_scale,
        seqlens_q=lens_q,
        seqlens_kv=lens_k,
        offsets_q=offs_q,
        offsets_kv=offs_k,
        deterministic=bool(deterministic),
        **feats,
    )


def _torch_device_arrays(q, k, v, cu_q, cu_k) -> bool:
    """Whether flash_attn_varlen_func's cu_seqlens can go to the kernels as they are: PyTorch
    q, k, v with int32 device arrays (strideattn/_torch_call.device_int32) in an eager call
    (the autograd op takes device arrays only there)."""
    if framework(q) != "torch":
        return False
    from . import _torch_call as call
    from ._torch_ops import _eager

    return call.device_int32(cu_q, q) and call.device_int32(cu_k, q) and _eager(q, k, v)


# ----------------------------------------------------------------------------- packed


def _unpack(x: Any, name: str, axis: int, count: int) -> Tuple[Any, ...]:
    """The `count` tensors of FlashAttention's packed buffer `x` (its axis `axis` of extent
    `count`: 3 for QKV, 2 for KV) as views (PyTorch, numpy and CuPy share the buffer, so the
    tensors keep its strides; a JAX array is sliced)."""
    shape = getattr(x, "shape", None)
    rank = axis + 3  # [.., count, h, d]
    if shape is None or len(shape) != rank or int(shape[axis]) != count:
        want = ["b", "s"] if axis == 2 else ["total"]
        dims = ", ".join(want + [str(count), "h", "d"])
        raise ValueError(f"{name} must have shape [{dims}]; got {describe(x)}")
    index = (slice(None),) * axis
    return tuple(x[index + (i,)] for i in range(count))


def flash_attn_qkvpacked_func(qkv: Any, *args: Any, **kwargs: Any) -> Any:
    """FlashAttention 2's flash_attn_qkvpacked_func: qkv [b, s, 3, h, d] read as the q, k, v
    views of flash_attn_func (no copy; with PyTorch the gradient lands in qkv.grad); the
    other arguments are flash_attn_func's after k and v."""
    q, k, v = _unpack(qkv, "qkv", 2, 3)
    return flash_attn_func(q, k, v, *args, **kwargs)


def flash_attn_kvpacked_func(q: Any, kv: Any, *args: Any, **kwargs: Any) -> Any:
    """FlashAttention 2's flash_attn_kvpacked_func: kv [b, s_kv, 2, h_kv, d] read as the k, v
    views of flash_attn_func (no copy); the other arguments are flash_attn_func's."""
    k, v = _unpack(kv, "kv", 2, 2)
    return flash_attn_func(q, k, v, *args, **kwargs)


def flash_attn_varlen_qkvpacked_func(
    qkv: Any, cu_seqlens: Any, max_seqlen: int, *args: Any, **kwargs: Any
) -> Any:
    """FlashAttention 2's flash_attn_varlen_qkvpacked_func: qkv [total, 3, h, d] read as the
    q, k, v views of flash_attn_varlen_func with cu_seqlens and max_seqlen for both sides;
    the other arguments are flash_attn_varlen_func's after max_seqlen_k."""
    q, k, v = _unpack(qkv, "qkv", 1, 3)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, *args, **kwargs
    )


def flash_attn_varlen_kvpacked_func(
    q: Any,
    kv: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """FlashAttention 2's flash_attn_varlen_kvpacked_func: kv [total_k, 2, h_kv, d] read as the
    k, v views of flash_attn_varlen_func; the other arguments are its."""
    k, v = _unpack(kv, "kv", 1, 2)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *args, **kwargs
    )


# ----------------------------------------------------------------------------- KV cache


def flash_attn_with_kvcache(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    k: Any = None,
    v: Any = None,
    rotary_cos: Any = None,
    rotary_sin: Any = None,
    cache_seqlens: Any = None,
    cache_batch_idx: Any = None,
    cache_leftpad: Any = None,
    block_table: Any = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Any = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> Any:
    """FlashAttention 2's flash_attn_with_kvcache, computed by strideattn.attention_with_kvcache
    (its arguments are FlashAttention's; the caches are read through their strides).

    q [b, s_q, h, d]; k_cache / v_cache [b, s_max, h_kv, d] or, with block_table int32
    [b, max_pages], paged [num_pages, page_size, h_kv, d]; cache_seqlens int32 [b] (or an
    int): the tokens cached per sequence, None for full caches (s_max, or max_pages x
    page_size); k, v [b, s_new, h_kv, d] are written into the caches after those tokens and
    attended to. causal=True is aligned to the bottom-right corner of each sequence's
    cache_seqlens + s_new keys, window_size as flash_attn_func's. Returns O [b, s_q, h, d], and
    with return_softmax_lse the fp32 LSE [b, h, s_q]. num_splits is a scheduling hint
    (strideattn picks its own split); rotary embeddings, cache_batch_idx, cache_leftpad,
    softcap and alibi_slopes raise NotImplementedError."""
    refused = (
        ("rotary_cos", rotary_cos, "None (apply rotary embeddings before the call)"),
        ("rotary_sin", rotary_sin, "None (apply rotary embeddings before the call)"),
        ("cache_batch_idx", cache_batch_idx, "None (pass the caches' rows as views instead)"),
        ("cache_leftpad", cache_leftpad, "None (caches filled from token 0)"),
        ("alibi_slopes", alibi_slopes, "None (the KV-cache path has no training features)"),
    )
    for name, value, supported in refused:
        if value is not None:
            raise _no(name, value, supported)
    if softcap != 0.0:
        raise _no("softcap", softcap, "0.0 (the KV-cache path has no training features)")
    int64(num_splits, "num_splits")  # (checked, then left to strideattn's own choice)
    if cache_seqlens is None:  # FlashAttention's full caches
        shape = getattr(k_cache, "shape", None)
        if shape is None or len(shape) != 4:
            raise ValueError(f"k_cache must have 4 dimensions; got {describe(k_cache)}")
        if block_table is None:
            full = int(shape[1])
        else:
            full = int(getattr(block_table, "shape", (0, 0))[1]) * int(shape[1])
        cache_seqlens = [full] * int(getattr(q, "shape", (0,))[0])
    from ._kvcache import attention_with_kvcache

    return attention_with_kvcache(
        q,
        k_cache,
        v_cache,
        k,
        v,
        cache_seqlens=cache_seqlens,
        block_table=block_table,
        mask="causal_bottom_right" if causal else "none",
        window=_flash_window(window_size),
        scale=softmax_scale,
        return_lse=bool(return_softmax_lse),
    )
