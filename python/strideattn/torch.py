"""strideattn.torch: PyTorch autograd for strideattn.

- `attention(q, k, v, ...)`: differentiable attention over any strided views (e.g. the
  `split` of a fused QKV projection, passed straight in). Forward and backward are custom ops
  (`torch.ops.strideattn.attention_fwd/_bwd`, registered with torch.library, with fake
  implementations), so it works under torch.compile. Gradients come back as new tensors that
  autograd accumulates into the views' bases (e.g. the fused buffer's .grad).
- `DotProductAttention`: a module with TransformerEngine's argument names (num_attention_heads,
  kv_channels, num_gqa_groups, qkv_format sbhd/bshd/thd, attn_mask_type, window_size,
  softmax_scale, cu_seqlens_q/kv(_padded), max_seqlen_q/kv).

Work runs on torch.cuda.current_stream() of the tensors' device. The LSE output is not
differentiable (gradients through it are not propagated)."""

from __future__ import annotations

import contextlib
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _core, _ext

# ----------------------------------------------------------------------------- helpers


def _alloc(shape: Sequence[int], dtype: torch.dtype, device: torch.device, like: Tensor,
           zero: bool) -> Tensor:
    """A tensor of logical `shape` laid out in `like`'s dimension order (head dim innermost);
    the real and the fake implementations share this, so their strides agree."""
    order = _core._dim_order(tuple(like.shape), tuple(like.stride()))
    phys = [shape[i] for i in order]
    inverse = [0] * len(order)
    for pos, dim in enumerate(order):
        inverse[dim] = pos
    make = torch.zeros if zero else torch.empty
    return make(phys, dtype=dtype, device=device).permute(inverse)


def _lse_shape(q: Tensor) -> List[int]:
    return [q.shape[0], q.shape[2], q.shape[1]]


def _scope(t: Tensor):
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.device.type == "cuda" else 0


def _ints(t: Optional[Tensor]) -> List[int]:
    return [] if t is None else [int(x) for x in t.tolist()]


def _head_dim_dense(t: Tensor) -> Tensor:
    # Gradients handed to us by autograd may be expanded (stride 0) or otherwise lack a unit
    # head-dim stride; the library needs one, so only then make a copy.
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _options(mask, window_left, window_right, scale, backend, deterministic, sq, skv, oq, okv, stream):
    return dict(mask=mask, window_left=window_left, window_right=window_right, scale=scale,
                deterministic=deterministic, seqlens_q=_ints(sq), seqlens_kv=_ints(skv),
                offsets_q=_ints(oq), offsets_kv=_ints(okv), backend=backend, stream=stream)


# ----------------------------------------------------------------------------- custom ops


@torch.library.custom_op("strideattn::attention_fwd", mutates_args=())
def _attention_fwd(q: Tensor, k: Tensor, v: Tensor, seqlens_q: Optional[Tensor],
                   seqlens_kv: Optional[Tensor], offsets_q: Optional[Tensor],
                   offsets_kv: Optional[Tensor], mask: str, window_left: int, window_right: int,
                   scale: float, backend: str, deterministic: bool) -> Tuple[Tensor, Tensor]:
    varlen = seqlens_q is not None
    with _scope(q):
        out = _alloc(list(q.shape[:-1]) + [v.shape[-1]], q.dtype, q.device, q, zero=varlen)
        lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=q.device)
        if varlen:
            lse.fill_(-math.inf)  # padding tokens: no sequence covers them
        opts = _options(mask, window_left, window_right, scale, backend, deterministic,
                        seqlens_q, seqlens_kv, offsets_q, offsets_kv, _stream(q))
        code, msg = _ext.forward(q, k, v, out, lse, **opts)
    _core._raise_for(code, msg)
    return out, lse


@_attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, seqlens_q, seqlens_kv, offsets_q, offsets_kv, mask,
                        window_left, window_right, scale, backend, deterministic):
    out = _alloc(list(q.shape[:-1]) + [v.shape[-1]], q.dtype, q.device, q, zero=False)
    lse = q.new_empty(_lse_shape(q), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("strideattn::attention_bwd", mutates_args=())
def _attention_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                   seqlens_q: Optional[Tensor], seqlens_kv: Optional[Tensor],
                   offsets_q: Optional[Tensor], offsets_kv: Optional[Tensor], mask: str,
                   window_left: int, window_right: int, scale: float, backend: str,
                   deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    varlen = seqlens_q is not None
    with _scope(q):
        dq = _alloc(q.shape, q.dtype, q.device, q, zero=varlen)
        dk = _alloc(k.shape, k.dtype, k.device, k, zero=varlen)
        dv = _alloc(v.shape, v.dtype, v.device, v, zero=varlen)
        opts = _options(mask, window_left, window_right, scale, backend, deterministic,
                        seqlens_q, seqlens_kv, offsets_q, offsets_kv, _stream(q))
        code, msg = _ext.backward(q, k, v, out, _head_dim_dense(dout), lse, dq, dk, dv, **opts)
    _core._raise_for(code, msg)
    return dq, dk, dv


@_attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, seqlens_q, seqlens_kv, offsets_q, offsets_kv,
                        mask, window_left, window_right, scale, backend, deterministic):
    return (_alloc(q.shape, q.dtype, q.device, q, zero=False),
            _alloc(k.shape, k.dtype, k.device, k, zero=False),
            _alloc(v.shape, v.dtype, v.device, v, zero=False))


def _setup_context(ctx, inputs, output):
    (q, k, v, sq, skv, oq, okv, mask, wl, wr, scale, backend, det) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.varlen = (sq, skv, oq, okv)
    ctx.opts = (mask, wl, wr, scale, backend, det)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.strideattn.attention_bwd(dout, q, k, v, out, lse, *ctx.varlen, *ctx.opts)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------- functional


def _as_index_tensor(x, name: str) -> Optional[Tensor]:
    if x is None:
        return None
    if isinstance(x, Tensor):
        if x.dim() != 1 or x.dtype.is_floating_point:
            raise ValueError(f"{name} must be a 1-D integer tensor, got shape {tuple(x.shape)} "
                             f"dtype {x.dtype}")
        return x
    return torch.tensor(_core._int_list(x, name), dtype=torch.int64)


def attention(q: Tensor, k: Tensor, v: Tensor, *, mask: str = "none", window=None,
              scale: Optional[float] = None, seqlens_q=None, seqlens_kv=None, offsets_q=None,
              offsets_kv=None, backend: str = "auto", deterministic: bool = False,
              return_lse: bool = False):
    """Differentiable strideattn.attention for PyTorch tensors (same arguments and shapes:
    q [b, s_q, h, d_qk] or varlen [tokens, h, d_qk] with seqlens_*/offsets_* as lists or 1-D
    integer tensors). Returns O (and the fp32, non-differentiable LSE)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(mask, str) or not isinstance(backend, str):
        raise ValueError(f"mask and backend must be strings; got mask={mask!r}, backend={backend!r}")
    left, right = _core._window(window)
    if q.dim() not in (3, 4) or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"q, k, v must all have 4 dimensions [b, s, h, d] (or 3 for varlen "
                         f"[tokens, h, d]); got {q.dim()}, {k.dim()}, {v.dim()}")
    scale = _core._checks.scale(scale)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] > 0 else 1.0
    sq, skv = _as_index_tensor(seqlens_q, "seqlens_q"), _as_index_tensor(seqlens_kv, "seqlens_kv")
    oq, okv = _as_index_tensor(offsets_q, "offsets_q"), _as_index_tensor(offsets_kv, "offsets_kv")
    if (sq is None) != (skv is None):
        raise ValueError("varlen needs both seqlens_q and seqlens_kv")
    lifted = q.dim() == 3
    if lifted:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    out, lse = torch.ops.strideattn.attention_fwd(q, k, v, sq, skv, oq, okv, mask, left, right,
                                                  float(scale), backend, bool(deterministic))
    if lifted:
        out = out.squeeze(0)
    if sq is not None:
        lse = lse.squeeze(0)  # [h, tokens]
    return (out, lse) if return_lse else out


# ----------------------------------------------------------------------------- module

# TransformerEngine attn_mask_type -> (strideattn mask, uses sequence lengths)
_MASK_TYPES = {
    "no_mask": ("none", False),
    "causal": ("causal", False),
    "causal_bottom_right": ("causal-bottom-right", False),
    "padding": ("none", True),
    "padding_causal": ("causal", True),
    "padding_causal_bottom_right": ("causal-bottom-right", True),
}
_FORMATS = ("sbhd", "bshd", "thd")


class DotProductAttention(torch.nn.Module):
    """Scaled dot-product attention with TransformerEngine's DotProductAttention arguments,
    computed by strideattn on the tensors' real strides (no `.contiguous()` needed).

    Args (as in TransformerEngine): num_attention_heads, kv_channels (int, or (d_qk, d_v)),
    num_gqa_groups (KV heads; default num_attention_heads), attention_dropout (only 0.0),
    qkv_format ("sbhd", "bshd", "thd"), attn_mask_type ("no_mask", "causal",
    "causal_bottom_right", "padding", "padding_causal", "padding_causal_bottom_right"),
    window_size ((left, right), -1 unbounded), softmax_scale (default 1/sqrt(d_qk)), tp_size
    (heads are split across tensor-parallel ranks). strideattn extras: backend, deterministic.

    forward(query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None,
    cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
    cu_seqlens_kv_padded=None, max_seqlen_q=None, max_seqlen_kv=None, attn_mask_type=None,
    window_size=None) returns [s, b, h*d_v] (sbhd), [b, s, h*d_v] (bshd) or [t, h*d_v] (thd).
    Padding masks need cu_seqlens (thd, or bshd whose batch and sequence dims can be merged);
    a boolean attention_mask, bias and dropout raise NotImplementedError.
    """

    def __init__(self, num_attention_heads: int, kv_channels: Union[int, Tuple[int, int]],
                 num_gqa_groups: Optional[int] = None, attention_dropout: float = 0.0,
                 qkv_format: str = "sbhd", attn_mask_type: str = "causal",
                 window_size: Optional[Tuple[int, int]] = None, sequence_parallel: bool = False,
                 tp_size: int = 1, get_rng_state_tracker=None, tp_group=None,
                 layer_number: Optional[int] = None, attention_type: str = "self",
                 softmax_scale: Optional[float] = None, backend: str = "auto",
                 deterministic: Optional[bool] = None):
        super().__init__()
        if attention_dropout != 0.0:
            raise NotImplementedError(f"attention_dropout={attention_dropout}: strideattn has no "
                                      "dropout; supported: 0.0")
        if num_attention_heads % tp_size:
            raise ValueError(f"num_attention_heads {num_attention_heads} is not divisible by "
                             f"tp_size {tp_size}")
        groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        if groups % tp_size or num_attention_heads % groups:
            raise ValueError(f"num_gqa_groups {groups} must divide num_attention_heads "
                             f"{num_attention_heads} and be divisible by tp_size {tp_size}")
        self.num_heads = num_attention_heads // tp_size
        self.num_kv_heads = groups // tp_size
        if isinstance(kv_channels, int):
            self.d_qk = self.d_v = kv_channels
        else:
            self.d_qk, self.d_v = (int(x) for x in kv_channels)
        self.qkv_format = self._check_format(qkv_format)
        self.attn_mask_type = self._check_mask_type(attn_mask_type)
        self.window_size = window_size
        self.softmax_scale = softmax_scale
        self.backend = backend
        self.deterministic = deterministic
        self.layer_number = layer_number
        self.attention_type = attention_type

    @staticmethod
    def _check_format(fmt: str) -> str:
        if fmt not in _FORMATS:
            raise ValueError(f"qkv_format='{fmt}' is not supported; supported: {', '.join(_FORMATS)}")
        return fmt

    @staticmethod
    def _check_mask_type(t: str) -> str:
        if t == "arbitrary":
            raise NotImplementedError("attn_mask_type='arbitrary' (a boolean mask tensor) is not "
                                      "supported by strideattn; supported: " + ", ".join(_MASK_TYPES))
        if t not in _MASK_TYPES:
            raise ValueError(f"attn_mask_type='{t}' is not a mask type; supported: " + ", ".join(_MASK_TYPES))
        return t

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, d_qk={self.d_qk}, "
                f"d_v={self.d_v}, qkv_format={self.qkv_format}, attn_mask_type={self.attn_mask_type}, "
                f"window_size={self.window_size}, backend={self.backend}")

    def _check_shapes(self, q: Tensor, k: Tensor, v: Tensor) -> None:
        want = ((q, self.num_heads, self.d_qk, "query_layer"), (k, self.num_kv_heads, self.d_qk, "key_layer"),
                (v, self.num_kv_heads, self.d_v, "value_layer"))
        for t, heads, dim, name in want:
            if t.shape[-2] != heads or t.shape[-1] != dim:
                raise ValueError(f"{name} has {t.shape[-2]} heads of dim {t.shape[-1]}; this module "
                                 f"expects {heads} heads of dim {dim}")

    def forward(self, query_layer: Tensor, key_layer: Tensor, value_layer: Tensor,
                attention_mask: Optional[Tensor] = None, qkv_format: Optional[str] = None,
                cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_kv: Optional[Tensor] = None,
                cu_seqlens_q_padded: Optional[Tensor] = None,
                cu_seqlens_kv_padded: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                max_seqlen_kv: Optional[int] = None, attn_mask_type: Optional[str] = None,
                window_size: Optional[Tuple[int, int]] = None,
                core_attention_bias_type: str = "no_bias",
                core_attention_bias: Optional[Tensor] = None,
                alibi_slopes: Optional[Tensor] = None) -> Tensor:
        fmt = self._check_format(qkv_format or self.qkv_format)
        mask_type = self._check_mask_type(attn_mask_type or self.attn_mask_type)
        window = window_size if window_size is not None else self.window_size
        if attention_mask is not None:
            raise NotImplementedError("attention_mask tensors are not supported; describe padding "
                                      "with cu_seqlens_q/cu_seqlens_kv instead")
        if core_attention_bias_type != "no_bias" or core_attention_bias is not None or alibi_slopes is not None:
            raise NotImplementedError("attention bias and ALiBi are not supported by strideattn")
        mask, padding = _MASK_TYPES[mask_type]
        q, k, v = query_layer, key_layer, value_layer
        if q.dim() != (3 if fmt == "thd" else 4) or k.dim() != q.dim() or v.dim() != q.dim():
            raise ValueError(f"qkv_format '{fmt}' needs {3 if fmt == 'thd' else 4}-D query/key/value; "
                             f"got {q.dim()}, {k.dim()}, {v.dim()}")
        self._check_shapes(q, k, v)
        if fmt == "sbhd":
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        deterministic = (torch.are_deterministic_algorithms_enabled()
                         if self.deterministic is None else self.deterministic)
        opts = dict(mask=mask, window=window, scale=self.softmax_scale, backend=self.backend,
                    deterministic=deterministic)

        varlen = fmt == "thd" or (padding and cu_seqlens_q is not None)
        if not varlen:
            o = attention(q, k, v, **opts)  # [b, s, h, d_v] in q's memory order
            if fmt == "sbhd":
                o = o.transpose(0, 1)
            return o.reshape(o.shape[0], o.shape[1], -1)

        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise ValueError(f"qkv_format '{fmt}' with attn_mask_type '{mask_type}' needs "
                             "cu_seqlens_q and cu_seqlens_kv")
        seqlens_q = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
        seqlens_kv = cu_seqlens_kv[1:] - cu_seqlens_kv[:-1]
        if fmt == "thd":
            offsets_q = None if cu_seqlens_q_padded is None else cu_seqlens_q_padded[:-1]
            offsets_kv = None if cu_seqlens_kv_padded is None else cu_seqlens_kv_padded[:-1]
            o = attention(q, k, v, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
                          offsets_q=offsets_q, offsets_kv=offsets_kv, **opts)
            return o.reshape(o.shape[0], -1)
        # bshd/sbhd with padding: sequence i occupies rows [i*s, i*s + len) of the tokens,
        # which needs the batch and sequence dims to merge into one token dim.
        b, s_q, s_kv = q.shape[0], q.shape[1], k.shape[1]
        flat = []
        for t, s in ((q, s_q), (k, s_kv), (v, s_kv)):
            if b > 1 and t.stride(0) != s * t.stride(1):
                raise NotImplementedError(
                    f"padding masks with qkv_format '{fmt}' need batch stride == seq_len * seq "
                    f"stride to treat the batch as packed sequences (found strides "
                    f"{tuple(t.stride())}); use qkv_format 'thd' or 'bshd'")
            flat.append(t.flatten(0, 1))  # a view: the strides were checked above
        offs_q = torch.arange(b, device=seqlens_q.device, dtype=seqlens_q.dtype) * s_q
        offs_kv = torch.arange(b, device=seqlens_kv.device, dtype=seqlens_kv.dtype) * s_kv
        o = attention(*flat, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, offsets_q=offs_q,
                      offsets_kv=offs_kv, **opts)
        o = o.view(b, s_q, o.shape[-2], o.shape[-1])
        if fmt == "sbhd":
            o = o.transpose(0, 1)
        return o.reshape(o.shape[0], o.shape[1], -1)
