"""The training features of attention() / attention_backward() (docs/semantics.md "Training
features"): softcap, dropout (its seed and offset as values, or as a tensor read when the call
runs), an additive bias (post- or pre-scale), ALiBi slopes, sinks and the max-logit output,
checked and turned into the extension's keywords; and the feature outputs (max_logit, dbias,
d_sinks) allocated in the caller's framework."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

from ._context import _check_tensor, _dtype_of, _shape
from ._util import describe

# Python names of the bias types -> the library's (TransformerEngine's names are accepted too).
BIAS_TYPES = {
    "post_scale": "post_scale",
    "pre_scale": "pre_scale",
    "post_scale_bias": "post_scale",
    "pre_scale_bias": "pre_scale",
}

_U64 = 1 << 64


def _number(x: Any, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "__float__"):
        raise ValueError(f"{name} must be a number; got {describe(x)}")
    return float(x)


def _u64(x: Any, name: str) -> int:
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise ValueError(f"{name} must be an integer in [0, 2^64); got {describe(x)}")
    x = int(x.__index__())
    if not 0 <= x < _U64:
        raise ValueError(f"{name} = {x} is out of range; supported: 0 <= {name} < 2^64")
    return x


def options(
    ctx,
    *,
    softcap: Optional[float],
    dropout_p: float,
    dropout_seed: int,
    dropout_offset: int,
    bias: Any,
    dropout_rng: Any = None,
    bias_type: str,
    alibi_slopes: Any,
    sinks: Any,
) -> Dict[str, Any]:
    """The extension keywords of the feature inputs (options and tensors)."""
    out: Dict[str, Any] = {}
    if softcap is not None:
        c = _number(softcap, "softcap")
        if not (math.isfinite(c) and c >= 0):
            raise ValueError(f"softcap = {c}; supported: None or 0 (off), or a finite value > 0")
        out["softcap"] = c
    p = _number(dropout_p, "dropout_p")
    if not 0.0 <= p < 1.0:  # NaN fails too
        raise ValueError(f"dropout_p = {p}; supported: 0 <= dropout_p < 1 (0: no dropout)")
    out["dropout_p"] = p
    out["dropout_seed"] = _u64(dropout_seed, "dropout_seed")
    out["dropout_offset"] = _u64(dropout_offset, "dropout_offset")
    if dropout_rng is not None:  # [seed, offset] read when the call runs (device pointers)
        _check_tensor(dropout_rng, "dropout_rng")
        dt = str(_dtype_of(dropout_rng)).rsplit(".", 1)[-1]
        if _shape(dropout_rng) != (2,) or dt not in ("int64", "uint64"):
            raise ValueError(
                f"dropout_rng has shape {_shape(dropout_rng)} and dtype {dt}; "
                "supported: [2] int64 or uint64 (seed, offset) on the tensors' device"
            )
        out["dropout_rng"] = ctx.prepare(dropout_rng)
    if not isinstance(bias_type, str) or bias_type not in BIAS_TYPES:
        raise ValueError(
            f"bias_type={bias_type!r} is not a bias type; supported: post_scale, pre_scale "
            "(or TransformerEngine's post_scale_bias, pre_scale_bias)"
        )
    if bias is not None:
        _check_tensor(bias, "bias")
        if len(_shape(bias)) != 4:
            raise ValueError(
                f"bias has shape {_shape(bias)}; supported: 4 dimensions "
                "[b or 1, h or 1, s_q or 1, s_kv or 1] (broadcast views with stride 0 are fine)"
            )
        out["bias"] = ctx.prepare(bias)
        out["bias_type"] = BIAS_TYPES[bias_type]
    for name, x, wanted in (
        ("alibi_slopes", alibi_slopes, "[h] or [b, h]"),
        ("sinks", sinks, "[h]"),
    ):
        if x is None:
            continue
        _check_tensor(x, name)
        if len(_shape(x)) not in ((1, 2) if name == "alibi_slopes" else (1,)):
            raise ValueError(f"{name} has shape {_shape(x)}; supported: {wanted} (float32)")
        out[name] = ctx.prepare(x)
    return out


def batch_count(qs: tuple, opts: Dict[str, Any], varlen: bool) -> int:
    """Rows of the max-logit table: the batch, or in varlen the number of sequences."""
    if not varlen:
        return qs[0]
    if opts.get("seqlens_q"):
        return len(opts["seqlens_q"])
    return _shape(opts["cu_seqlens_q"])[0] - 1


def max_logit(ctx, qs: tuple, opts: Dict[str, Any], varlen: bool) -> Any:
    """A new fp32 [b, h] max-logit table (varlen: [sequences, h])."""
    return ctx.empty((batch_count(qs, opts, varlen), qs[-2]), "float32", [0, 1], zero=False)


def dbias(ctx, bias: Any) -> Any:
    """A zeroed gradient of `bias`: its logical shape and dtype, row-major."""
    return ctx.empty(_shape(bias), _dtype_of(bias), [0, 1, 2, 3], zero=True)


def d_sinks(ctx, sinks: Any) -> Any:
    """A zeroed fp32 [h] gradient of the sinks."""
    return ctx.empty(_shape(sinks), "float32", [0], zero=True)


# The feature keywords explain() / workspace_size() take, with attention()'s defaults.
_DEFAULTS = dict(
    softcap=None,
    dropout_p=0.0,
    dropout_seed=0,
    dropout_offset=0,
    dropout_rng=None,
    bias=None,
    bias_type="post_scale",
    alibi_slopes=None,
    sinks=None,
)


def explain_options(ctx, features: Dict[str, Any], grad: bool, qs, opts, varlen) -> Dict[str, Any]:
    """The extension keywords for explaining a call with `features` (attention()'s feature
    keywords, return_max_logit, attention_backward()'s bias_requires_grad), with the
    outputs the call would write allocated."""
    features = dict(features)
    want_ml = bool(features.pop("return_max_logit", False))
    want_dbias = bool(features.pop("bias_requires_grad", False))
    unknown = sorted(set(features) - set(_DEFAULTS))
    if unknown:
        raise TypeError(f"explain() got unexpected keyword arguments {unknown}")
    out = options(ctx, **{**_DEFAULTS, **features})
    if want_ml and not grad:
        out["max_logit"] = ctx.as_ext(max_logit(ctx, qs, opts, varlen))
    if grad and want_dbias and features.get("bias") is not None:
        out["dbias"] = ctx.as_ext(dbias(ctx, features["bias"]))
    if grad and features.get("sinks") is not None:
        out["d_sinks"] = ctx.as_ext(d_sinks(ctx, features["sinks"]))
    return out
