"""Differentiable attention with training features (docs/semantics.md "Training features")
for PyTorch tensors: an autograd.Function over strideattn.attention / attention_backward
(_core.py), eager only. Gradients flow to q, k, v, to the bias (dbias) and to the sinks
(d_sinks, TransformerEngine's learnable softmax) when they require grad; ALiBi slopes, the
LSE and the max logit are not differentiable. The dropout mask is drawn again in the
backward from the same seed and offset, so nothing of size s_q x s_kv is kept."""

from __future__ import annotations

from typing import Any, Dict

import torch

from . import _core

# Keywords of strideattn.attention() that are training features (passed through here).
FEATURES = (
    "dropout_p",
    "dropout_seed",
    "dropout_offset",
    "dropout_rng",
    "bias",
    "bias_type",
    "alibi_slopes",
    "softcap",
    "sinks",
    "return_max_logit",
)


class _FeatureAttention(torch.autograd.Function):
    """(O, LSE, max logit or None) = attention(q, k, v, bias, sinks; opts). opts: the
    options and features of strideattn.attention() other than bias, sinks and the returns."""

    @staticmethod
    def forward(ctx, q, k, v, bias, sinks, opts):
        want_ml = opts.pop("return_max_logit", False)
        r = _core.attention(
            q, k, v, bias=bias, sinks=sinks, return_lse=True, return_max_logit=want_ml, **opts
        )
        out, lse = r[0], r[1]
        ml = r[2] if want_ml else None
        ctx.save_for_backward(q, k, v, out, lse, bias, sinks)
        ctx.opts = opts
        ctx.mark_non_differentiable(lse)
        if ml is not None:
            ctx.mark_non_differentiable(ml)
        return out, lse, ml

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse, _dml):
        q, k, v, out, lse, bias, sinks = ctx.saved_tensors
        g = _core.attention_backward(
            q,
            k,
            v,
            out,
            dout.contiguous() if dout.stride(-1) != 1 else dout,
            lse,
            bias=bias,
            sinks=sinks,
            bias_requires_grad=bias is not None and ctx.needs_input_grad[3],
            **ctx.opts,
        )
        dq, dk, dv = g[:3]
        rest = list(g[3:])
        dbias = rest.pop(0) if bias is not None and ctx.needs_input_grad[3] else None
        d_sinks = rest.pop(0) if sinks is not None else None
        if not ctx.needs_input_grad[4]:
            d_sinks = None
        return dq, dk, dv, dbias, d_sinks, None


def attention(q, k, v, *, return_lse: bool = False, **options: Any):
    """strideattn.attention() with training features, differentiable: returns O, then the
    LSE (return_lse) and the max logit (return_max_logit), as strideattn.attention does."""
    for name in ("out", "workspace"):
        if options.get(name) is not None:
            raise ValueError(f"{name}= is not taken by the differentiable attention")
    if torch.compiler.is_compiling():
        raise NotImplementedError(
            "training features (bias, sinks, softcap, ALiBi, dropout, max logit) of "
            "strideattn.torch.attention run eagerly only, not under torch.compile"
        )
    bias, sinks = options.pop("bias", None), options.pop("sinks", None)
    opts: Dict[str, Any] = {key: val for key, val in options.items() if val is not None}
    want_ml = bool(opts.get("return_max_logit", False))
    out, lse, ml = _FeatureAttention.apply(q, k, v, bias, sinks, opts)
    result = (out,) + ((lse,) if return_lse else ()) + ((ml,) if want_ml else ())
    return result if len(result) > 1 else out
