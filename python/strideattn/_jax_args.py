"""strideattn.jax's arguments, checked and normalised for its _Call (strideattn/jax.py): varlen
lengths (fixed at trace time, read at run time on the host, or cu_seqlens arrays handed to
the library), the options, and the training features (softcap, bias, ALiBi slopes, sinks,
dropout with a JAX PRNG key)."""

from __future__ import annotations

import math
from typing import Any, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _checks
from ._features import BIAS_TYPES
from ._util import (
    CU_SEQLENS_ARRAYS,
    canonical_mask,
    cu_seqlens_bounds,
    describe,
    int_list,
    window_pair,
)


def is_jax(x: Any) -> bool:
    return isinstance(x, jax.Array)


def varlen(seqlens_q, seqlens_kv, offsets_q, offsets_kv, cu=(None,) * 6):
    """(static pairs, dynamic names, dynamic arrays, cu_seqlens bounds): lengths as
    Python/numpy values are fixed at trace time; any given as a JAX array makes them all
    arrays read at run time, on the host. `cu` (cu_seqlens_q, cu_seqlens_kv, seq_offsets_q,
    seq_offsets_kv, max_seqlen_q, max_seqlen_kv) are int32 arrays handed to the library where
    they live, with the bounds (max_seqlen_q, max_seqlen_kv) a plan is made for."""
    given = {
        "seqlens_q": seqlens_q,
        "seqlens_kv": seqlens_kv,
        "offsets_q": offsets_q,
        "offsets_kv": offsets_kv,
    }
    given = {k: v for k, v in given.items() if v is not None}
    cu_arrays = dict(zip(CU_SEQLENS_ARRAYS, cu[:4]))
    bounds = cu_seqlens_bounds(cu_arrays, cu[4], cu[5])
    if bounds is not None:
        if given:
            raise ValueError(
                "cu_seqlens_q/cu_seqlens_kv and seqlens_q/seqlens_kv/offsets_q/offsets_kv "
                "describe the same thing; pass one of the two"
            )
        names, arrays = [], []
        for k, v in cu_arrays.items():
            if v is None:
                continue
            a = v if is_jax(v) else jnp.asarray(np.asarray(int_list(v, k), np.int32))
            if a.ndim != 1 or a.dtype != jnp.int32:
                raise ValueError(f"{k} must be a one-dimensional int32 array, got {describe(a)}")
            names.append(k)
            arrays.append(a)
        return (), tuple(names), tuple(arrays), bounds
    if not any(is_jax(v) for v in given.values()):
        pairs = tuple((k, tuple(int_list(v, k))) for k, v in given.items())
        return tuple((k, v) for k, v in pairs if v), (), (), None
    names, arrays = [], []
    for k, v in given.items():
        a = v if is_jax(v) else jnp.asarray(np.asarray(int_list(v, k), np.int32))
        if a.ndim != 1 or a.dtype not in (jnp.int32, jnp.int64):
            raise ValueError(
                f"{k} must be a one-dimensional int32 or int64 array, got {describe(a)}"
            )
        names.append(k)
        arrays.append(a)
    return (), tuple(names), tuple(arrays), None


def options(mask, window, scale, deterministic, backend) -> Tuple[Tuple[str, Any], ...]:
    mask = canonical_mask(mask)
    if not isinstance(backend, str):
        raise ValueError(
            f"backend must be a string (auto, reference, cpu, cuda, cudnn); got {describe(backend)}"
        )
    left, right = window_pair(window)
    scale = _checks.scale(scale)
    return (
        ("mask", mask),
        ("backend", backend),
        ("window_left", np.int64(left)),
        ("window_right", np.int64(right)),
        ("has_scale", np.bool_(scale is not None)),
        ("scale", np.float64(0.0 if scale is None else scale)),
        ("deterministic", np.bool_(bool(deterministic))),
    )


def check_array(x: Any, name: str) -> None:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(f"{name} must be a JAX array, got {describe(x)}")


# The feature arrays of a call, in the order they follow the buffers and varlen arrays.
FEATURE_ARRAYS = ("bias", "alibi_slopes", "sinks", "dropout_rng")


def features(
    softcap: Any,
    bias: Any,
    bias_type: Any,
    alibi_slopes: Any,
    sinks: Any,
    dropout_p: Any,
    dropout_rng: Any,
) -> Tuple[Tuple[Tuple[str, Any], ...], Tuple[str, ...], Tuple[Any, ...]]:
    """(static options, names of the feature arrays given, those arrays): softcap c > 0 caps
    the logits, bias (broadcast to [b, h, s_q, s_kv] from the right, float) is added after the
    scale and softcap (post_scale) or before the scale (pre_scale), alibi_slopes float32 [h]
    or [b, h], sinks float32 [h], dropout_p with dropout_rng, a JAX PRNG key from which the
    call's Philox seed and offset are drawn (uint32 [4], read when the call runs)."""
    opts: Dict[str, Any] = {}
    if softcap is not None and softcap != 0:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
            raise ValueError(f"softcap must be a number; got {describe(softcap)}")
        if not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(
                f"softcap = {softcap}; supported: None or 0 (off), or a finite value > 0"
            )
        opts["softcap"] = np.float64(softcap)
    p = 0.0 if dropout_p is None else dropout_p
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(
            f"dropout_p = {dropout_p!r}; supported: a number 0 <= dropout_p < 1 (0: no dropout)"
        )
    names, arrays = [], []
    if bias is not None:
        if not isinstance(bias_type, str) or bias_type not in BIAS_TYPES:
            raise ValueError(
                f"bias_type={bias_type!r} is not a bias type; supported: post_scale, pre_scale "
                "(or TransformerEngine's post_scale_bias, pre_scale_bias)"
            )
        b = jnp.asarray(bias)
        if b.dtype not in (jnp.float32, jnp.float16, jnp.bfloat16) or not 1 <= b.ndim <= 4:
            raise ValueError(
                f"bias must be a float32, float16 or bfloat16 array of 1 to 4 dimensions "
                f"(broadcast to [b, h, s_q, s_kv] from the right); got {describe(b)}"
            )
        opts["bias_type"] = BIAS_TYPES[bias_type]
        names.append("bias")
        arrays.append(b)
    for name, x, ranks in (("alibi_slopes", alibi_slopes, (1, 2)), ("sinks", sinks, (1,))):
        if x is None:
            continue
        a = jnp.asarray(x)
        if a.dtype != jnp.float32 or a.ndim not in ranks:
            shapes = "[h] or [b, h]" if len(ranks) == 2 else "[h]"
            raise ValueError(f"{name} must be a float32 array {shapes}; got {describe(a)}")
        names.append(name)
        arrays.append(a)
    if p > 0:
        if dropout_rng is None:
            raise ValueError(
                "dropout_p > 0 needs dropout_rng, a JAX PRNG key (jax.random.key or PRNGKey): "
                "the call's dropout seed and offset are drawn from it"
            )
        opts["dropout_p"] = np.float64(p)
        names.append("dropout_rng")
        arrays.append(jax.random.bits(dropout_rng, (4,), jnp.uint32))
    elif dropout_rng is not None:
        raise ValueError("dropout_rng is given but dropout_p is 0; pass dropout_p > 0, or no key")
    return tuple(opts.items()), tuple(names), tuple(arrays)
