"""Framework-neutral entry points: attention, attention_backward and explain over any
DLPack-capable tensors (numpy, PyTorch, CuPy, JAX). Tensors are passed to the C++ library
as pointers plus their own strides; outputs are allocated in the caller's framework, dtype
and device, in the dimension order of the matching input (so an sbhd input gives an sbhd
output). Status codes from the library become exceptions here."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _checks, _ext
from ._util import (
    MASKS,
    BackendError,
    UnsupportedError,
    canonical_mask,
    describe,
    dim_order,
    framework,
    int64,
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


# ----------------------------------------------------------------------------- frameworks


def _np():
    import numpy

    return numpy


def _element_strides(x: Any, fw: str) -> Optional[Sequence[int]]:
    """Strides in elements, or None where the framework has no strides (JAX: row-major)."""
    if fw == "torch":
        return tuple(x.stride())
    if fw in ("numpy", "cupy"):
        item = x.dtype.itemsize
        if any(s % item for s in x.strides):
            raise ValueError(
                f"tensor strides {tuple(x.strides)} (bytes) are not multiples of the element "
                f"size {item}; DLPack needs element strides"
            )
        return tuple(s // item for s in x.strides)
    return None


def _is_cuda(x: Any, fw: str) -> bool:
    if fw == "torch":
        return x.device.type == "cuda"
    if fw == "cupy":
        return True
    if fw == "jax":
        return any(d.platform == "gpu" for d in x.devices())
    if hasattr(x, "__dlpack_device__"):
        return x.__dlpack_device__()[0] in (2, 13)
    return False


class _Context:
    """Where a call runs and how its outputs are made: the framework of `like` (the first
    input), its device, the stream to use, and allocation in that framework."""

    def __init__(self, like: Any):
        self.fw = framework(like)
        self.like = like
        self.cuda = _is_cuda(like, self.fw)
        self.stream = 0
        self.sync_after = False
        self._device_ctx = contextlib.nullcontext()
        if self.fw == "torch" and self.cuda:
            import torch

            self._device_ctx = torch.cuda.device(like.device)
            self.stream = torch.cuda.current_stream(like.device).cuda_stream
        elif self.fw == "cupy":
            import cupy

            self._device_ctx = like.device
            with like.device:
                self.stream = cupy.cuda.get_current_stream().ptr
        elif self.fw == "jax" and self.cuda:
            # JAX has no current stream to share: wait for the inputs, run on the legacy
            # default stream, and wait for the result before JAX sees it.
            self.sync_after = True
            dev = next(iter(like.devices()))
            try:
                import torch

                self._device_ctx = torch.cuda.device(
                    getattr(dev, "local_hardware_id", None) or dev.id
                )
            except ImportError:
                pass
        elif self.fw == "other" and self.cuda:
            self.sync_after = True

    def device_scope(self):
        return self._device_ctx

    def prepare(self, x: Any) -> Any:
        """What is handed to the extension for tensor x (no copies)."""
        fw = framework(x)
        if fw == "torch":
            return x.detach()
        if fw == "jax":
            x.block_until_ready()
        return x

    def empty(self, shape: Sequence[int], dtype: Any, order: Sequence[int], zero: bool) -> Any:
        """A new tensor of logical `shape`, laid out with dims `order` outermost first."""
        shape = tuple(int(s) for s in shape)
        phys = tuple(shape[i] for i in order)
        inverse = [0] * len(order)
        for pos, dim in enumerate(order):
            inverse[dim] = pos
        fw = self.fw
        if fw == "numpy" or (fw == "other" and not self.cuda):
            np = _np()
            dt = np.float32 if dtype == "float32" else dtype
            make = np.zeros if zero else np.empty
            return make(phys, dtype=dt).transpose(inverse)
        if fw == "torch":
            import torch

            dt = torch.float32 if dtype == "float32" else dtype
            make = torch.zeros if zero else torch.empty
            return make(phys, dtype=dt, device=self.like.device).permute(inverse)
        if fw == "cupy":
            import cupy

            dt = cupy.float32 if dtype == "float32" else dtype
            with self.like.device:
                make = cupy.zeros if zero else cupy.empty
                return make(phys, dtype=dt).transpose(inverse)
        if fw == "jax":
            return self._jax_staging(shape, dtype)
        raise ValueError(
            f"cannot allocate outputs for a {type(self.like).__module__}.{type(self.like).__name__} "
            "on a GPU; pass out= (and dq=, dk=, dv=) tensors"
        )

    def _jax_staging(self, shape, dtype):
        # JAX arrays are immutable: compute into a PyTorch (or CuPy) buffer on the same GPU,
        # then hand it to JAX through DLPack in finish().
        import jax.numpy as jnp

        name = "float32" if dtype == "float32" else jnp.dtype(dtype).name
        if not self.cuda:  # JAX on the CPU: a numpy buffer (ml_dtypes gives numpy bfloat16)
            return ("staged", _np().zeros(shape, dtype=jnp.dtype(name)))
        dev = next(iter(self.like.devices()))
        dev_id = getattr(dev, "local_hardware_id", None)
        if dev_id is None:
            dev_id = dev.id
        try:
            import torch

            return (
                "staged",
                torch.zeros(shape, dtype=getattr(torch, name), device=f"cuda:{dev_id}"),
            )
        except ImportError:
            import cupy

            if name == "bfloat16":
                raise UnsupportedError(
                    "bfloat16 JAX outputs need PyTorch installed (CuPy has "
                    "no bfloat16); use float16/float32 or install torch"
                ) from None
            with cupy.cuda.Device(dev_id):
                return ("staged", cupy.zeros(shape, dtype=name))

    def as_ext(self, x: Any) -> Any:
        """The object the extension reads for an output allocated by empty()."""
        return x[1] if isinstance(x, tuple) else x

    def finish(self, x: Any) -> Any:
        if self.sync_after:
            _device_synchronize()
        if isinstance(x, tuple):
            import jax.dlpack

            if type(x[1]).__module__ == "numpy":
                import jax.numpy as jnp

                return jnp.asarray(x[1])
            return jax.dlpack.from_dlpack(x[1])
        return x


def _device_synchronize() -> None:
    try:
        import torch

        torch.cuda.synchronize()
        return
    except ImportError:
        pass
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def _dtype_of(x: Any) -> Any:
    return x.dtype


# ----------------------------------------------------------------------------- arguments


# Varlen cu_seqlens arrays (int32 tensors on the tensors' device), their bounds and a caller's
# workspace: passed to the extension as they are (no copy, nothing read on the host).
_ARRAYS = ("cu_seqlens_q", "cu_seqlens_kv", "seq_offsets_q", "seq_offsets_kv")


def _device_options(ctx, extra: dict) -> dict:
    """The extension keywords of cu_seqlens arrays, max_seqlen bounds and workspace in `extra`
    (None: not given)."""
    out = {}
    given = [n for n in _ARRAYS if extra.get(n) is not None]
    for name in given:
        _check_tensor(extra[name], name)
        out[name] = ctx.prepare(extra[name])
    if given:
        for side in ("q", "kv"):
            if extra.get("cu_seqlens_" + side) is None:
                raise ValueError(
                    f"cu_seqlens_{side} is missing; cu_seqlens varlen needs both cu_seqlens_q and "
                    "cu_seqlens_kv (int32, count + 1 entries)"
                )
            bound = extra.get("max_seqlen_" + side)
            if bound is None:
                raise ValueError(
                    f"max_seqlen_{side} is required with cu_seqlens_{side}: the bound on every "
                    "length that a plan is made for (FlashAttention's max_seqlen); it is not read "
                    "from the arrays, which stay on their device"
                )
            out["max_seqlen_" + side] = int64(bound, "max_seqlen_" + side)
    else:
        for side in ("q", "kv"):
            if extra.get("max_seqlen_" + side) is not None:
                raise ValueError(f"max_seqlen_{side} is given without cu_seqlens_q / cu_seqlens_kv")
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


def _check_tensor(x: Any, name: str, writable: bool = False) -> None:
    if x is None:
        raise ValueError(f"{name} is required")
    fw = framework(x)
    if not (hasattr(x, "__dlpack__") or fw == "numpy"):
        raise ValueError(
            f"{name} must be a DLPack-capable tensor (numpy, torch, cupy, jax), got {describe(x)}"
        )
    if fw == "numpy":
        _checks.numpy_array(x, name, writable)
    if fw in ("numpy", "cupy"):
        _element_strides(x, fw)
    if writable:
        if fw == "numpy" and not x.flags.writeable:
            raise ValueError(f"{name} is a read-only numpy array; outputs must be writable")
        if fw == "jax":
            raise ValueError(
                f"{name}: JAX arrays are immutable and cannot be outputs; "
                "leave it out to get a new array"
            )


def _shape(x: Any) -> tuple:
    return tuple(int(s) for s in x.shape)


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
) -> Union[Any, Tuple[Any, Any]]:
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

    PyTorch tensors that require grad go through the autograd op of strideattn.torch.
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
    hook = _AUTOGRAD.get(framework(q))
    if hook is not None and out is None and hook[0](q, k, v):
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
    return (o, lse) if return_lse else o


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
) -> Tuple[Any, Any, Any]:
    """Gradients of attention(): returns (dq, dk, dv) for the forward output `out`, its
    gradient `dout` and the forward's LSE (return_lse=True). dk/dv are summed over each GQA
    group. dq/dk/dv may be given as (strided) views to write into, e.g. slices of the
    gradient of a fused QKV buffer; the others are allocated like q, k, v. Options must match
    the forward call. deterministic=True asks for a bitwise reproducible result. cu_seqlens
    arrays, their bounds and a workspace as attention() takes them."""
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
    given = (dq, dk, dv)
    with ctx.device_scope():
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
) -> Dict[str, Any]:
    """What the library would do with these tensors, without running anything.

    Returns {"valid": bool, "code": str, "error": message or None, "layout": str,
    "verdicts": [{"backend", "supported", "rule", "reason"}, ... in auto preference order],
    "chosen": the backend `auto` would run, or None}. grad=True explains the backward pass
    (missing out/dout/lse are allocated)."""
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
    """Drops the extension's plans (the next call of each problem makes its plan again)."""
    _ext.clear_plan_cache()


def version() -> str:
    """The C++ library's version."""
    return _ext.version()


def compiled_backends() -> List[str]:
    """Backends this build contains (reference and cpu always; cuda/cudnn with CUDA)."""
    return list(_ext.compiled_backends())
