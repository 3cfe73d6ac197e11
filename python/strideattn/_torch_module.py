"""DotProductAttention: a torch.nn.Module that takes TransformerEngine's DotProductAttention
constructor and forward arguments (TE 2.x names, order and defaults) and computes with
strideattn's autograd op on the tensors' real strides (no `.contiguous()`).

Every TE argument is accepted; the training features (attention_dropout, softmax_type,
return_max_logit, core_attention_bias_type / core_attention_bias, alibi_slopes) run through
strideattn/_torch_te_features.py; those strideattn cannot honour (FP8, score_mod, GDN,
arbitrary masks) raise
NotImplementedError naming the argument when set to anything but their neutral value. TE's
mask-type spellings are normalised ('padding,causal' == 'causal,padding' ==
'padding_causal'); strideattn's mask vocabulary is accepted too. Padding comes from
cu_seqlens_q/kv or, for padding mask types, from a right-padded boolean attention_mask; a
padding mask type with neither is refused. int32 cu_seqlens on q's device go to the kernels
as they are, with no read on the host, in thd (with max_seqlen_q/kv given) and in bshd (or
sbhd with one sequence) right-padded batches, where no feature, cp_group or top-left window
needs the lengths on the host. Windows follow TE's alignment rule
(bottom_right_diagonal) and are translated onto strideattn's bottom-right window. With
cp_group, each rank passes its shard of the sequence and the call runs context-parallel
(strideattn/_torch_cp.py; cp_comm_type p2p or a2a). inference_params takes a
strideattn.torch.PagedKVCache (strideattn/_torch_kvcache.py): the step's k / v are appended
to the layer's caches and q attends over them; any other object is refused."""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _checks
from . import _torch_call as call
from . import _torch_te_features as te_features
from ._torch_kvcache import PagedKVCache
from ._torch_ops import _eager, attend, attention
from ._torch_te_args import (
    _batch_rows,
    _mask_lengths,
    _mergeable,
    _mask_type_cached,
    _nondeterminism_off,
    _our_window,
    _refuse,
    _unpack,
    _window,
    mask_type,
)
from ._util import (
    cu_seqlens_lengths,
    describe,
    int64,
    int_list,
)

_FORMATS = ("sbhd", "bshd", "thd")


class DotProductAttention(torch.nn.Module):
    """Scaled dot-product attention with TransformerEngine's DotProductAttention arguments,
    computed by strideattn on the tensors' real strides.

    Constructor (TE's): num_attention_heads, kv_channels (int or (d_qk, d_v)),
    num_gqa_groups, attention_dropout (in training mode), qkv_format (sbhd, bshd, thd),
    attn_mask_type, window_size, bottom_right_diagonal, sequence_parallel, tp_size,
    get_rng_state_tracker, tp_group, layer_number, attention_type (self, cross), cp_group
    (a torch.distributed group; see set_context_parallel_group), cp_global_ranks, cp_stream,
    cp_comm_type, softmax_scale, softmax_type (vanilla, off-by-one, learnable: the parameter
    softmax_offset [h]), return_max_logit (forward returns (out, max_logit [h])), name.
    strideattn's extras (keyword only):
    backend, deterministic (default: torch.are_deterministic_algorithms_enabled() or
    NVTE_ALLOW_NONDETERMINISTIC_ALGO=0).

    forward takes TE's arguments and returns [s, b, h*d_v] (sbhd), [b, s, h*d_v] (bshd) or
    [t, h*d_v] (thd); padding rows are 0. checkpoint_core_attention, fast_zero_fill and
    num_splits change nothing here (the op keeps only O and the LSE for the backward, and
    always zero-fills); max_seqlen_* are checked (the s extent for sbhd/bshd, at least the
    longest sequence for thd).
    """

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: Union[int, Tuple[int, int]],
        num_gqa_groups: Optional[int] = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size: Optional[Tuple[int, int]] = None,
        bottom_right_diagonal: Optional[bool] = None,
        sequence_parallel: bool = False,
        tp_size: int = 1,
        get_rng_state_tracker: Optional[Callable] = None,
        tp_group: Any = None,
        layer_number: Optional[int] = None,
        attention_type: str = "self",
        cp_group: Any = None,
        cp_global_ranks: Optional[List[int]] = None,
        cp_stream: Any = None,
        cp_comm_type: str = "p2p",
        softmax_scale: Optional[float] = None,
        softmax_type: str = "vanilla",
        return_max_logit: Optional[bool] = False,
        name: Optional[str] = None,
        *,
        backend: str = "auto",
        deterministic: Optional[bool] = None,
    ):
        super().__init__()
        self.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)
        if attention_type not in ("self", "cross"):
            raise ValueError(f"attention_type='{attention_type}'; supported: self, cross")
        if tp_group is not None:
            tp_size = torch.distributed.get_world_size(tp_group)
        if num_attention_heads % tp_size:
            raise ValueError(
                f"num_attention_heads {num_attention_heads} is not divisible by tp_size {tp_size}"
            )
        groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        if groups % tp_size or num_attention_heads % groups:
            raise ValueError(
                f"num_gqa_groups {groups} must divide num_attention_heads "
                f"{num_attention_heads} and be divisible by tp_size {tp_size}"
            )
        self.num_heads = num_attention_heads // tp_size
        self.num_kv_heads = groups // tp_size
        offset = te_features.check_init(attention_dropout, softmax_type, self.num_heads)
        if offset is not None:
            self.softmax_offset = offset  # the sinks of softmax_type "learnable"
        self.attention_dropout, self.softmax_type = float(attention_dropout), softmax_type
        self.return_max_logit = bool(return_max_logit)
        if isinstance(kv_channels, int):
            self.d_qk = self.d_v = kv_channels
        else:
            self.d_qk, self.d_v = (int(x) for x in kv_channels)
        self.qkv_format = self._check_format(qkv_format)
        mask_type(attn_mask_type)  # refuse a bad one here already
        self.attn_mask_type = attn_mask_type
        self.window_size = window_size
        self.bottom_right_diagonal = bottom_right_diagonal
        self.softmax_scale = softmax_scale
        self.backend = backend
        self.deterministic = deterministic
        self.layer_number = 1 if layer_number is None else layer_number
        self.attention_type = attention_type
        self.name = name

    def set_context_parallel_group(
        self,
        cp_group: Any,
        cp_global_ranks: Any = None,
        cp_stream: Any = None,
        cp_comm_type: str = "p2p",
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """TE's context-parallel setter: cp_group (None: no context parallelism) and
        cp_comm_type ('p2p' or 'a2a'); cp_stream is the CUDA stream of the ring's merges;
        cp_global_ranks is not needed (torch.distributed knows the group's ranks)."""
        from ._torch_cp import COMM_TYPES

        if cp_group is not None and not isinstance(cp_group, torch.distributed.ProcessGroup):
            raise ValueError(
                f"cp_group must be a torch.distributed ProcessGroup; got {describe(cp_group)}"
            )
        if cp_group is not None and cp_comm_type not in COMM_TYPES:
            raise _refuse("cp_comm_type", cp_comm_type, ", ".join(COMM_TYPES))
        self.cp = None if cp_group is None else (cp_group, cp_comm_type, cp_stream)

    @staticmethod
    def _check_format(fmt: Any) -> str:
        if fmt not in _FORMATS:
            raise ValueError(
                f"qkv_format={describe(fmt)} is not supported; supported: {', '.join(_FORMATS)}"
            )
        return fmt

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, d_qk={self.d_qk}, "
            f"d_v={self.d_v}, qkv_format={self.qkv_format}, attn_mask_type={self.attn_mask_type}, "
            f"window_size={self.window_size}, backend={self.backend}"
        )

    def _check_shapes(self, q: Tensor, k: Tensor, v: Tensor) -> None:
        qs, ks, vs = q.shape, k.shape, v.shape
        h, hg = self.num_heads, self.num_kv_heads
        if (
            qs[-2] == h
            and ks[-2] == hg
            and vs[-2] == hg
            and qs[-1] == self.d_qk
            and ks[-1] == self.d_qk
            and vs[-1] == self.d_v
        ):
            return
        want = (
            (q, self.num_heads, self.d_qk, "query_layer"),
            (k, self.num_kv_heads, self.d_qk, "key_layer"),
            (v, self.num_kv_heads, self.d_v, "value_layer"),
        )
        for t, heads, dim, name in want:
            if t.shape[-2] != heads or t.shape[-1] != dim:
                raise ValueError(
                    f"{name} has {t.shape[-2]} heads of dim {t.shape[-1]}; this module "
                    f"expects {heads} heads of dim {dim}"
                )

    def _deterministic(self) -> bool:
        if self.deterministic is not None:
            return bool(self.deterministic)
        return torch.are_deterministic_algorithms_enabled() or _nondeterminism_off()

    @staticmethod
    def _refuse_unsupported(args: Dict[str, Any]) -> None:
        neutral = (
            ("inference_params", None),
            ("fp8_output", False),
            ("bf16_backward", False),
            ("score_mod", None),
            ("score_mod_bprop", None),
            ("score_mod_tensors", None),
            ("score_mod_bprop_tensors", None),
            ("g", None),
            ("beta", None),
            ("initial_state", None),
            ("output_final_state", False),
        )
        for name, value in neutral:
            given = args[name]
            if name == "inference_params" and given is not None:
                if isinstance(given, PagedKVCache):
                    continue
                raise _refuse(name, given, "None or a strideattn.torch.PagedKVCache")
            if given is None and value is False:
                continue
            if (given is not None) if value is None else (given != value):
                raise _refuse(name, given, repr(value))
        n = args["num_splits"]
        if n is not None and int64(n, "num_splits") < 1:
            raise ValueError(f"num_splits is {n}; supported: None or an integer >= 1")

    def forward(
        self,
        query_layer: Optional[Tensor] = None,
        key_layer: Optional[Tensor] = None,
        value_layer: Optional[Tensor] = None,
        attention_mask: Union[Tensor, Tuple[Tensor, Tensor], None] = None,
        qkv_format: Optional[str] = None,
        cu_seqlens_q: Optional[Tensor] = None,
        cu_seqlens_kv: Optional[Tensor] = None,
        cu_seqlens_q_padded: Optional[Tensor] = None,
        cu_seqlens_kv_padded: Optional[Tensor] = None,
        max_seqlen_q: Optional[int] = None,
        max_seqlen_kv: Optional[int] = None,
        attn_mask_type: Optional[str] = None,
        window_size: Optional[Tuple[int, int]] = None,
        bottom_right_diagonal: Optional[bool] = None,
        checkpoint_core_attention: bool = False,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: Optional[Tensor] = None,
        alibi_slopes: Optional[Tensor] = None,
        fast_zero_fill: bool = True,
        inference_params: Any = None,
        pad_between_seqs: Optional[bool] = None,
        fp8_output: Optional[bool] = False,
        bf16_backward: Optional[bool] = False,
        num_splits: Optional[int] = 1,
        score_mod: Optional[Callable] = None,
        score_mod_bprop: Optional[Callable] = None,
        score_mod_tensors: Optional[Dict[str, Tensor]] = None,
        score_mod_bprop_tensors: Optional[Dict[str, Tensor]] = None,
        qkv_layer: Optional[Tensor] = None,
        kv_layer: Optional[Tensor] = None,
        qkv_interleave_dim: int = -3,
        g: Optional[Tensor] = None,
        beta: Optional[Tensor] = None,
        initial_state: Optional[Tensor] = None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
    ) -> Tensor:
        if not (  # the neutral values, checked without building anything (the common case)
            inference_params is None
            and not fp8_output
            and not bf16_backward
            and score_mod is None
            and score_mod_bprop is None
            and score_mod_tensors is None
            and score_mod_bprop_tensors is None
            and g is None
            and beta is None
            and initial_state is None
            and not output_final_state
            and (num_splits is None or (type(num_splits) is int and num_splits >= 1))
        ):
            self._refuse_unsupported(
                dict(
                    inference_params=inference_params,
                    fp8_output=fp8_output,
                    bf16_backward=bf16_backward,
                    score_mod=score_mod,
                    score_mod_bprop=score_mod_bprop,
                    score_mod_tensors=score_mod_tensors,
                    score_mod_bprop_tensors=score_mod_bprop_tensors,
                    g=g,
                    beta=beta,
                    initial_state=initial_state,
                    output_final_state=output_final_state,
                    num_splits=num_splits,
                )
            )
        fmt = qkv_format or self.qkv_format
        if fmt not in _FORMATS:
            self._check_format(fmt)
        mask, padding = _mask_type_cached(attn_mask_type or self.attn_mask_type)
        q, k, v = _unpack(
            qkv_layer, kv_layer, query_layer, key_layer, value_layer, fmt, qkv_interleave_dim
        )
        if q.dim() != (3 if fmt == "thd" else 4) or k.dim() != q.dim() or v.dim() != q.dim():
            raise ValueError(
                f"qkv_format '{fmt}' needs {3 if fmt == 'thd' else 4}-D query/key/value; "
                f"got {q.dim()}, {k.dim()}, {v.dim()}"
            )
        self._check_shapes(q, k, v)
        feats = te_features.features(
            self, core_attention_bias_type, core_attention_bias, alibi_slopes, q
        )
        if feats and (
            inference_params is not None or self.cp is not None or padding and fmt != "thd"
        ):
            raise NotImplementedError(
                f"{', '.join(sorted(feats))} with inference_params, cp_group or a padding mask "
                f"type in qkv_format '{fmt}'; supported: bshd/sbhd without padding, or thd"
            )
        # TE's windows (its check_set_window_size): causal kinds end at the diagonal (the mask
        # is that edge here); other kinds take (-1, -1) or (>= 0, >= 0), (-1, 0) meaning no
        # window. The window is aligned top-left for 'causal' and bottom_right_diagonal=False.
        left, right = _window(window_size if window_size is not None else self.window_size)
        if mask != "none":
            right = -1
        elif (left, right) == (-1, 0):
            left, right = -1, -1
        elif (left, right) != (-1, -1) and (left < 0 or right < 0):
            raise ValueError(
                f"window_size={(left, right)} with attn_mask_type "
                f"'{attn_mask_type or self.attn_mask_type}'; supported (as in TE): "
                "(-1, -1) or both sides >= 0"
            )
        brd = (
            bottom_right_diagonal
            if bottom_right_diagonal is not None
            else self.bottom_right_diagonal
        )
        top_left = mask == "causal" or (mask == "none" and brd is False)
        if (  # the common call: one attend() on the tensors as given, nothing else to build
            not padding
            and not feats
            and fmt != "thd"
            and inference_params is None
            and self.cp is None
            and max_seqlen_q is None
            and max_seqlen_kv is None
            and (not top_left or (left == -1 and right == -1))
        ):
            return self._attend_plain(q, k, v, mask, left, right, fmt)
        opts = dict(
            mask=mask,
            scale=self.softmax_scale,
            backend=self.backend,
            deterministic=self._deterministic(),
        )
        cp_size = 1
        if self.cp is not None:  # every call below then runs context-parallel (_attend)
            cp_size = torch.distributed.get_world_size(self.cp[0])
            if padding and fmt != "thd":
                raise _refuse(
                    "attn_mask_type", attn_mask_type or self.attn_mask_type,
                    f"a mask type without padding for qkv_format '{fmt}' with cp_group "
                    "(padding with context parallelism: qkv_format 'thd')",
                )  # fmt: skip

        def window(shifts: Optional[Sequence[int]]) -> Optional[Tuple[int, int]]:
            if not top_left or (left, right) == (-1, -1):
                return left, right  # nothing to translate
            if shifts is None:
                return None  # the translation needs the lengths (host ones)
            why = (
                f"attn_mask_type '{attn_mask_type or self.attn_mask_type}'"
                if mask == "causal"
                else "bottom_right_diagonal=False"
            )
            if len(set(shifts)) > 1:
                raise NotImplementedError(
                    f"window_size={(left, right)} aligned to the top-left diagonal ({why}) with "
                    "sequences whose s_kv - s_q differ; supported: equal s_kv - s_q, or a "
                    "bottom-right mask type"
                )
            return _our_window((left, right), top_left, shifts[0] if shifts else 0, why)

        if inference_params is not None:  # a PagedKVCache (others were refused above)
            return self._cached(q, k, v, inference_params, fmt, mask, (left, right), opts)
        if fmt == "thd":
            return self._thd(
                feats,
                q,
                k,
                v,
                cu_seqlens_q,
                cu_seqlens_kv,
                cu_seqlens_q_padded,
                cu_seqlens_kv_padded,
                max_seqlen_q,
                max_seqlen_kv,
                pad_between_seqs,
                window,
                opts,
            )
        if not padding:  # attention_mask is ignored here, as TE ignores it
            # one call on the tensors as given: the sbhd transposes and the merge of the
            # heads happen inside the autograd function, not as autograd nodes around it
            seq = 0 if fmt == "sbhd" else 1
            s_q, s_kv = q.shape[seq], k.shape[seq]
            if max_seqlen_q is not None or max_seqlen_kv is not None:
                self._check_max_seqlen(max_seqlen_q, max_seqlen_kv, s_q, s_kv, fmt, cp_size)
            layout = call.SBHD if fmt == "sbhd" else call.BSHD
            win = window([(s_kv - s_q) * cp_size]) if top_left else (left, right)
            return self._attend(q, k, v, None, win, opts, layout, feats)
        if fmt == "sbhd":
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        b, s_q, s_kv = q.shape[0], q.shape[1], k.shape[1]
        self._check_max_seqlen(max_seqlen_q, max_seqlen_kv, s_q, s_kv, fmt, cp_size)
        win = window(None)
        if (
            win is not None
            and cu_seqlens_q_padded is None
            and cu_seqlens_kv_padded is None
            and _mergeable(q, k, v)
            and all(
                call.device_int32(a, q) and a.shape[0] == b + 1
                for a in (cu_seqlens_q, cu_seqlens_kv)
            )
            and _eager(q, k, v)
        ):
            # The arrays go to the kernels as they are (no read on the host): the batch and
            # seq dims merge into one token dim, and sequence i starts at row 0 of batch i.
            o = self._attend(
                *(t.flatten(0, 1) for t in (q, k, v)),
                (_batch_rows(cu_seqlens_q, cu_seqlens_kv, b, s_q, s_kv), None, None, None),
                win, opts, call.THD,
            )  # fmt: skip
            o = o.view(b, s_q, -1)
            return o.transpose(0, 1) if fmt == "sbhd" else o
        lens_q, lens_kv = self._padding_lengths(
            b,
            s_q,
            s_kv,
            attention_mask,
            cu_seqlens_q,
            cu_seqlens_kv,
            cu_seqlens_q_padded,
            cu_seqlens_kv_padded,
            fmt,
            attn_mask_type or self.attn_mask_type,
        )
        o = self._padded(q, k, v, lens_q, lens_kv, window, opts)
        if fmt == "sbhd":
            o = o.transpose(0, 1)
        return o.reshape(o.shape[0], o.shape[1], -1)

    def _cached(self, q, k, v, cache, fmt, mask, win, opts) -> Tensor:
        """Inference with a PagedKVCache: this step's k, v appended to the caches of this
        layer (layer_number) and q attending over each sequence's tokens. Causal mask types
        are bottom-right aligned here (a new token sees every earlier one), as TE does with
        its KV cache; padding comes from the cache's lengths (attention_mask is not read)."""
        if fmt == "thd":
            raise _refuse("qkv_format", fmt, "'bshd' or 'sbhd' with inference_params")
        if fmt == "sbhd":
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        o = cache.attend(
            q, k, v, self.layer_number,
            mask="none" if mask == "none" else "causal_bottom_right", window=win,
            scale=self.softmax_scale, backend=self.backend,
        )  # fmt: skip
        if fmt == "sbhd":
            o = o.transpose(0, 1)
        return o.reshape(o.shape[0], o.shape[1], -1)

    @staticmethod
    def _check_max_seqlen(max_seqlen_q, max_seqlen_kv, s_q, s_kv, fmt, cp_size) -> None:
        for name, m, s in (
            ("max_seqlen_q", max_seqlen_q, s_q),
            ("max_seqlen_kv", max_seqlen_kv, s_kv),
        ):
            if m is not None and int64(m, name) != s * cp_size:
                raise ValueError(
                    f"{name} is {m} but the {fmt} tensors have sequence extent {s}"
                    + (f" on each of {cp_size} ranks" if cp_size > 1 else "")
                    + f"; with qkv_format '{fmt}' it is that extent"
                    + (" times the ranks" if cp_size > 1 else "")
                )

    def _attend_plain(self, q, k, v, mask, left, right, fmt) -> Tensor:
        """_attend for bshd / sbhd without padding, features, context parallelism or a
        window to translate: what forward() would do, without its option dict."""
        scale = self.softmax_scale
        if scale is None:
            d = q.shape[-1]
            scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
        elif type(scale) is not float:
            scale = _checks.scale(scale)
        layout = call.SBHD if fmt == "sbhd" else call.BSHD
        det = self.deterministic
        det = self._deterministic() if det is None else bool(det)
        out, _ = attend(
            q, k, v, None, None, None, None, mask, left, right, scale, self.backend, det,
            layout, True, False,
        )  # fmt: skip
        return out

    def _attend(self, q, k, v, varlen, win, opts, layout, feats=None) -> Tensor:
        """attend() with the module's options, O's heads merged ([..., h * d_v]); with a
        cp_group, the context-parallel call on this rank's shard; with training features
        (feats), _torch_te_features.attend."""
        if feats:
            return te_features.attend(q, k, v, varlen, win, opts, layout, feats)
        if self.cp is not None:
            return self._cp_attend(q, k, v, varlen, win, opts, layout)
        scale = opts["scale"]
        if scale is None:
            d = q.shape[-1]
            scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
        elif type(scale) is not float:
            scale = _checks.scale(scale)
        sq, skv, oq, okv = varlen or (None, None, None, None)
        out, _ = attend(
            q, k, v, sq, skv, oq, okv, opts["mask"], win[0], win[1], scale, opts["backend"],
            bool(opts["deterministic"]), layout, True, False,
        )  # fmt: skip
        return out

    def _cp_attend(self, q, k, v, varlen, win, opts, layout) -> Tensor:
        """_attend under context parallelism: cp_attention on this rank's tokens ([b, s, h, d]
        views of sbhd, thd as it is), O's heads merged in the caller's layout."""
        from ._torch_cp import cp_attention

        if layout == call.SBHD:
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        sq, skv, oq, okv = varlen or (None, None, None, None)
        o = cp_attention(
            q, k, v, self.cp[0], cp_comm_type=self.cp[1], mask=opts["mask"], window=win,
            scale=opts["scale"], seqlens_q=sq, seqlens_kv=skv, offsets_q=oq, offsets_kv=okv,
            backend=opts["backend"], deterministic=opts["deterministic"], cp_stream=self.cp[2],
        )  # fmt: skip
        if layout == call.SBHD:
            o = o.transpose(0, 1)
        return o.reshape(o.shape[:-2] + (-1,))

    def _thd(
        self,
        feats,
        q,
        k,
        v,
        cu_q,
        cu_kv,
        pad_q,
        pad_kv,
        max_q,
        max_kv,
        pad_between_seqs,
        window,
        opts,
    ) -> Tensor:
        if cu_q is None or cu_kv is None:
            raise ValueError("qkv_format 'thd' needs cu_seqlens_q and cu_seqlens_kv")
        # With the bounds given (as TE's callers give them), the arrays go to the kernels as
        # they are: no read on the host, no synchronisation. The lengths are read on the
        # host where a feature or cp_group needs them, or the window's translation to the
        # bottom-right diagonal does, or the arrays are not int32 on q's device.
        win = window(None)
        arrays = (cu_q, cu_kv, pad_q, pad_kv)
        if (
            max_q is not None
            and max_kv is not None
            and win is not None
            and not feats
            and self.cp is None
            and all(call.device_int32(a, q) for a in arrays if a is not None)
            and _eager(q, k, v)
        ):
            cu = call.CuSeqlens(
                cu_q, cu_kv, None if pad_q is None else pad_q[:-1],
                None if pad_kv is None else pad_kv[:-1],
                int64(max_q, "max_seqlen_q"), int64(max_kv, "max_seqlen_kv"),
            )  # fmt: skip
            return self._attend(q, k, v, (cu, None, None, None), win, opts, call.THD, feats)
        lens_q, offs_q = cu_seqlens_lengths(cu_q, "cu_seqlens_q")
        lens_kv, offs_kv = cu_seqlens_lengths(cu_kv, "cu_seqlens_kv")
        if len(lens_q) != len(lens_kv):
            raise ValueError(
                f"cu_seqlens_q has {len(lens_q) + 1} entries, cu_seqlens_kv "
                f"{len(lens_kv) + 1}; both are batch + 1"
            )
        if pad_between_seqs and (pad_q is None or pad_kv is None):
            raise ValueError(
                "pad_between_seqs=True needs cu_seqlens_q_padded and "
                "cu_seqlens_kv_padded (where each sequence starts)"
            )
        if pad_q is not None:
            offs_q = cu_seqlens_lengths(pad_q, "cu_seqlens_q_padded")[1]
        if pad_kv is not None:
            offs_kv = cu_seqlens_lengths(pad_kv, "cu_seqlens_kv_padded")[1]
        for name, m, lens in (("max_seqlen_q", max_q, lens_q), ("max_seqlen_kv", max_kv, lens_kv)):
            if m is not None and lens and int64(m, name) < max(lens):
                raise ValueError(f"{name} is {m} but the longest sequence has {max(lens)} tokens")
        win = window([b - a for a, b in zip(lens_q, lens_kv)])
        lens = (lens_q, lens_kv, offs_q, offs_kv)
        return self._attend(q, k, v, lens, win, opts, call.THD, feats)

    @staticmethod
    def _padding_lengths(
        b, s_q, s_kv, attention_mask, cu_q, cu_kv, pad_q, pad_kv, fmt, mask_type_name
    ):
        """Per-sequence lengths of a padded sbhd/bshd batch (padding at the end of each)."""
        for name, pad, s in (
            ("cu_seqlens_q_padded", pad_q, s_q),
            ("cu_seqlens_kv_padded", pad_kv, s_kv),
        ):
            if pad is not None and int_list(pad, name) != [i * s for i in range(b + 1)]:
                raise NotImplementedError(
                    f"{name} with qkv_format '{fmt}': sequence i starts "
                    f"at row 0 of batch i; supported: None"
                )
        if cu_q is not None or cu_kv is not None:
            if cu_q is None or cu_kv is None:
                raise ValueError("padding needs both cu_seqlens_q and cu_seqlens_kv")
            lens_q, lens_kv = (
                cu_seqlens_lengths(cu_q, "cu_seqlens_q")[0],
                cu_seqlens_lengths(cu_kv, "cu_seqlens_kv")[0],
            )
        elif attention_mask is not None:
            if isinstance(attention_mask, (tuple, list)):
                if len(attention_mask) != 2:
                    raise ValueError(
                        f"attention_mask as a tuple holds (q mask, kv mask); got "
                        f"{len(attention_mask)} tensors"
                    )
                lens_q = _mask_lengths(attention_mask[0], s_q, "attention_mask[0]")
                lens_kv = _mask_lengths(attention_mask[1], s_kv, "attention_mask[1]")
            else:
                if s_q != s_kv:
                    raise ValueError(
                        f"one attention_mask for s_q {s_q} != s_kv {s_kv}; pass "
                        "(q mask, kv mask) for cross-attention"
                    )
                lens_q = lens_kv = _mask_lengths(attention_mask, s_q, "attention_mask")
        else:
            raise ValueError(
                f"attn_mask_type '{mask_type_name}' has padding but nothing "
                "says where: pass cu_seqlens_q and cu_seqlens_kv, or a boolean "
                "attention_mask [b, 1, 1, s] (True = padding); without padding use a "
                "mask type without 'padding'"
            )
        for name, lens, s in (("q", lens_q, s_q), ("kv", lens_kv, s_kv)):
            if len(lens) != b:
                raise ValueError(f"{len(lens)} {name} sequence lengths for a batch of {b}")
            if any(n < 0 or n > s for n in lens):
                raise ValueError(
                    f"{name} sequence lengths {lens} must lie in [0, {s}] "
                    f"(the {fmt} sequence extent)"
                )
        return lens_q, lens_kv

    @staticmethod
    def _padded(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        lens_q: List[int],
        lens_kv: List[int],
        window: Callable,
        opts: dict,
    ) -> Tensor:
        """Attention over a [b, s, h, d] batch whose sequence i is the first lens_q[i] /
        lens_kv[i] rows of batch i; [b, s_q, h, d_v] out, padding rows 0."""
        b, s_q, s_kv = q.shape[0], q.shape[1], k.shape[1]
        shifts = [lk - lq for lq, lk in zip(lens_q, lens_kv)]
        one_window = None
        if _mergeable(q, k, v):
            try:
                one_window = window(shifts)
            except NotImplementedError:  # a top-left window that differs per sequence
                pass
        if one_window is not None:
            # the batch and seq dims merge into one token dim (a view): one varlen call
            flat = [t.flatten(0, 1) for t in (q, k, v)]
            o = attention(
                *flat,
                seqlens_q=lens_q,
                seqlens_kv=lens_kv,
                offsets_q=[i * s_q for i in range(b)],
                offsets_kv=[i * s_kv for i in range(b)],
                window=one_window,
                **opts,
            )
            return o.view(b, s_q, o.shape[-2], o.shape[-1])
        # e.g. sbhd memory, or per-sequence windows: one call per sequence on views of its rows
        outs = []
        for i, (lq, lk) in enumerate(zip(lens_q, lens_kv)):
            if lq == 0 or lk == 0:
                outs.append(q.new_zeros(1, s_q, q.shape[2], v.shape[3]))
                continue
            o = attention(
                q[i : i + 1, :lq],
                k[i : i + 1, :lk],
                v[i : i + 1, :lk],
                window=window([lk - lq]),
                **opts,
            )
            outs.append(F.pad(o, (0, 0, 0, 0, 0, s_q - lq)))
        return torch.cat(outs, dim=0)
