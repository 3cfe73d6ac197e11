"""TransformerEngine's training-feature arguments of DotProductAttention (_torch_module.py),
mapped onto strideattn's features (docs/semantics.md "Training features"):
attention_dropout (in training mode; see dropout_rng for where the seed and offset come from),
softmax_type ("vanilla"; "off-by-one": a sink of 0; "learnable": the module's softmax_offset
parameter [h] as the sinks), return_max_logit (forward then returns (out, max_logit [h]), the
largest logit of each head over the batch and every position), core_attention_bias_type
("no_bias", "post_scale_bias", "pre_scale_bias", "alibi") with core_attention_bias
[b or 1, h or 1, s_q, s_kv] and alibi_slopes ([h] or [b, h] fp32; for "alibi" without
slopes, the ALiBi paper's geometric slopes). Computed through the differentiable
strideattn.torch.attention (eager; cuda runs them all, cudnn the post-scale bias and sinks
within cuDNN's limits: docs/backends.md "cudnn")."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch

from . import _torch_call as call
from ._util import describe

SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
BIAS_TYPES = ("no_bias", "post_scale_bias", "pre_scale_bias", "alibi")


def check_init(attention_dropout: Any, softmax_type: Any, heads: int) -> Optional[Any]:
    """Checks the constructor's feature arguments; returns the learnable softmax offset
    (a zero Parameter [h]) for softmax_type "learnable", else None."""
    if isinstance(attention_dropout, bool) or not isinstance(attention_dropout, (int, float)):
        raise ValueError(f"attention_dropout must be a number; got {describe(attention_dropout)}")
    if not 0.0 <= float(attention_dropout) < 1.0:
        raise ValueError(f"attention_dropout = {attention_dropout}; supported: 0 <= p < 1")
    if softmax_type not in SOFTMAX_TYPES:
        raise ValueError(
            f"softmax_type={describe(softmax_type)}; supported: {', '.join(SOFTMAX_TYPES)}"
        )
    if softmax_type == "learnable":
        return torch.nn.Parameter(torch.zeros(heads, dtype=torch.float32))
    return None


def alibi_slopes(heads: int) -> torch.Tensor:
    """The ALiBi paper's slopes: 2^(-8 i / n) for the nearest power of two n <= heads, then
    the odd steps of 2n for the rest (Press et al.; TE's get_alibi slopes)."""
    n = 2 ** math.floor(math.log2(heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(heads - n)]
    return torch.tensor(slopes, dtype=torch.float32)


def dropout_rng(like: torch.Tensor) -> Dict[str, Any]:
    """The dropout seed and offset of one call on `like`'s device. CUDA tensors: a [2] int64
    tensor (seed, offset) drawn on the device from PyTorch's CUDA generator of that device, a
    Philox stream (torch.manual_seed / torch.cuda.manual_seed make it reproducible), and
    handed to the kernels by pointer: nothing goes through the host, and under CUDA-graph
    capture the draw is a node of the graph whose generator state PyTorch advances on each
    replay, so every replay reads a fresh seed there. Host tensors: a seed drawn from
    PyTorch's default CPU generator."""
    if like.is_cuda:
        return {"dropout_rng": torch.randint(0, 2**62, (2,), dtype=torch.int64, device=like.device)}
    return {"dropout_seed": int(torch.randint(0, 2**62, (1,)).item())}


def features(module, bias_type: Any, bias: Any, slopes: Any, like: torch.Tensor) -> Dict[str, Any]:
    """The feature keywords of one forward call ({}: none asked)."""
    p = float(module.attention_dropout) if module.training else 0.0
    if (
        bias_type == "no_bias"
        and bias is None
        and slopes is None
        and p == 0.0
        and module.softmax_type == "vanilla"
        and not module.return_max_logit
    ):
        return {}
    if bias_type not in BIAS_TYPES:
        raise ValueError(
            f"core_attention_bias_type={describe(bias_type)}; supported: {', '.join(BIAS_TYPES)}"
        )
    out: Dict[str, Any] = {}
    if bias_type in ("post_scale_bias", "pre_scale_bias"):
        if bias is None:
            raise ValueError(f"core_attention_bias_type='{bias_type}' needs core_attention_bias")
        out["bias"], out["bias_type"] = bias, bias_type[: -len("_bias")]
    elif bias is not None:
        raise ValueError(
            f"core_attention_bias is given with core_attention_bias_type='{bias_type}'; "
            "supported: 'post_scale_bias' or 'pre_scale_bias' with a bias"
        )
    if slopes is not None and bias_type != "alibi":
        raise ValueError(
            f"alibi_slopes are given with core_attention_bias_type='{bias_type}'; "
            "supported: 'alibi'"
        )
    if bias_type == "alibi":
        out["alibi_slopes"] = (
            alibi_slopes(module.num_heads).to(like.device) if slopes is None else slopes
        )
    if p > 0.0:
        out["dropout_p"] = p
        out.update(dropout_rng(like))
    if module.softmax_type == "off-by-one":
        out["sinks"] = torch.zeros(module.num_heads, dtype=torch.float32, device=like.device)
    elif module.softmax_type == "learnable":
        out["sinks"] = module.softmax_offset.float()
    if module.return_max_logit:
        out["return_max_logit"] = True
    return out


def attend(q, k, v, varlen, win, opts, layout, feats):
    """The module's _attend with features: O with heads merged in the caller's layout, and
    (out, max_logit [h]) with return_max_logit."""
    from ._torch_ops import attention

    if layout == call.SBHD:
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    sq, skv, oq, okv = varlen or (None, None, None, None)
    r = attention(
        q, k, v, mask=opts["mask"], window=win, scale=opts["scale"], seqlens_q=sq,
        seqlens_kv=skv, offsets_q=oq, offsets_kv=okv, backend=opts["backend"],
        deterministic=bool(opts["deterministic"]), **feats,
    )  # fmt: skip
    o, ml = (r[0], r[1]) if feats.get("return_max_logit") else (r, None)
    if layout == call.SBHD:
        o = o.transpose(0, 1)
    o = o.reshape(o.shape[:-2] + (-1,))
    return o if ml is None else (o, ml.amax(dim=0))
