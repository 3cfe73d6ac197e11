"""strideattn.jax: attention for JAX, differentiable with jax.grad (a jax.custom_vjp) and
usable under jax.jit and jax.vmap, through XLA's FFI: the C++ handlers of
strideattn._jax_ffi read each tensor as a strided view of an XLA buffer and call the
library, on XLA's CPU platform (host buffers: the reference and cpu backends) and its CUDA
platform (device buffers on XLA's stream: the cuda and cudnn backends).

- `attention(q, k, v, axes=...)`: q, k, v in any axis order; `axes` says, one letter per
  axis, which axis is which (b batch, s seq, t tokens (varlen; the same as s), h heads,
  d head dim). The output keeps q's axis order.
- `attention_qkvpacked(qkv, ...)`: one fused buffer, either with a "3" axis ([b, s, 3, h, d]
  is axes "bs3hd", [s, b, h, 3, d] is "sbh3d") or with h + 2 * num_kv_heads heads on its
  head axis (q's heads first, then k's, then v's: GQA). q, k and v are strided views of that
  one buffer and their gradient is one buffer of its shape: no split and no concatenation.
- `attention_kvpacked(q, kv, ...)`: the same for a fused KV buffer ("2" axis, or
  2 * num_kv_heads heads).

Strides are never looked up from a layout name: each buffer axis is named by its letter and
its stride follows from the buffer's shape (XLA buffers are dense row-major).

Varlen: seqlens_q / seqlens_kv (and offsets) given as Python ints or numpy arrays are fixed
when the function is traced (and work on both platforms); given as JAX arrays they are read
on the host when the call runs, on the CPU platform only (UnsupportedError on the GPU). The
form of FlashAttention and TransformerEngine, cu_seqlens_q / cu_seqlens_kv int32 arrays with
the bounds max_seqlen_q / max_seqlen_kv, works on both platforms: the arrays are handed to
the library where they live and read by the kernels, so a compiled call serves any lengths
within the bounds with no host read.

The library checks each call when it is traced, for each platform: an error it finds
there (shapes, dtypes, options, no backend for the problem) raises ValueError,
UnsupportedError or BackendError with its message when every platform the call could run
on refuses it (the platform of concrete inputs; under jit, every platform of the process).
Errors only the run can find (the values of lengths passed as JAX arrays), and a refusal
by one of several possible platforms, come from XLA as jax.errors.JaxRuntimeError, whose
text carries "strideattn (<code>): <message>".

The training features of strideattn.attention (softcap, bias, bias_type, alibi_slopes,
sinks, dropout_p with a PRNG key as dropout_rng) are keywords of each entry point; the bias
and the sinks get their gradients.

The workspace a GPU backend needs is asked of the library at trace time and requested as
an extra XLA result buffer, so nothing allocates device memory inside the handler (the host
backends take no workspace and allocate their own host scratch)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from . import _jax_args as _args
from ._jax_views import (
    LSE_ROLE,
    ROLE,
    Source,
    default_axes,
    desc,
    extent,
    full_desc,
    has_letter,
    parse_axes,
)
from ._util import (
    CU_SEQLENS_ARRAYS,
    BackendError,
    UnsupportedError,
    cu_seqlens_hint,
    describe,
    raise_for,
)

if not hasattr(getattr(jax, "ffi", None), "ffi_call"):
    raise ImportError(
        f"strideattn.jax needs a JAX with jax.ffi.ffi_call (JAX 0.5 or newer); this is jax "
        f"{jax.__version__}"
    )
try:
    from . import _jax_ffi
except ImportError as _e:  # built without jaxlib's XLA FFI headers
    raise ImportError(
        "strideattn.jax needs the JAX binding (strideattn._jax_ffi), which this build of "
        "strideattn does not have: it was built without jaxlib's XLA FFI headers. Install "
        "jaxlib, then rebuild with `pip install --no-build-isolation strideattn` (or `.` in a "
        f"checkout); its configure summary says 'jax ON'. ({_e})"
    ) from None

__all__ = [
    "BackendError",
    "UnsupportedError",
    "attention",
    "attention_kvpacked",
    "attention_qkvpacked",
]

_FORWARD = "strideattn_forward"
_BACKWARD = "strideattn_backward"
for _platform, (_fwd, _bwd) in _jax_ffi.handlers().items():
    jax.ffi.register_ffi_target(_FORWARD, _fwd, platform=_platform)
    jax.ffi.register_ffi_target(_BACKWARD, _bwd, platform=_platform)

Window = Optional[Tuple[Optional[int], Optional[int]]]
Ints = Any  # Python ints, a numpy array (fixed at trace time) or a JAX array (read at run time)
Axes = Optional[Union[str, Sequence[str]]]


# ----------------------------------------------------------------------------- one call


@dataclasses.dataclass(frozen=True)
class _Call:
    """Everything static about one attention call (hashable: custom_vjp's non-differentiable
    argument). The call's arrays are the buffers, then the varlen arrays (if any), then the
    training features' arrays (feature_arrays, in _jax_args.FEATURE_ARRAYS' order)."""

    sources: Tuple[Source, Source, Source]  # q, k, v
    shapes: Tuple[Tuple[int, ...], ...]  # of the buffers
    dtypes: Tuple[str, ...]
    o_axes: str
    o_shape: Tuple[int, ...]
    lse_axes: str
    lse_shape: Tuple[int, ...]
    options: Tuple[Tuple[str, Any], ...]  # mask, backend, window, scale, deterministic
    static_varlen: Tuple[Tuple[str, Tuple[int, ...]], ...]  # lengths fixed at trace time
    dynamic_varlen: Tuple[str, ...]  # names of the varlen arrays that follow the buffers
    cu_bounds: Optional[Tuple[int, int]]  # set: dynamic_varlen are cu_seqlens arrays
    features: Tuple[Tuple[str, Any], ...]  # softcap, bias_type, dropout_p where set
    feature_arrays: Tuple[str, ...]  # names of the feature arrays that follow
    return_lse: bool
    max_logit_shape: Optional[Tuple[int, int]]  # set: the forward returns the max logit

    @property
    def n_buffers(self) -> int:
        return len(self.shapes)

    @property
    def varlen(self) -> bool:
        return bool(self.static_varlen or self.dynamic_varlen)


def _attrs(call: _Call, backward: bool, n_rets: int) -> Dict[str, Any]:
    """The FFI attributes of a forward or backward call; the workspace is the last result."""
    nb = call.n_buffers
    a: Dict[str, Any] = {}
    for name, src in zip("qkv", call.sources):
        a[name] = desc(src, call.shapes[src.buf])
        if backward:
            a["d" + name] = desc(src, call.shapes[src.buf])  # result i mirrors buffer i
    o_roles = {c: ROLE[c] for c in call.o_axes}
    lse_roles = {c: LSE_ROLE[c] for c in call.lse_axes}
    if backward:
        a["o"] = full_desc(nb, call.o_axes, call.o_shape, o_roles)
        a["do"] = full_desc(nb + 1, call.o_axes, call.o_shape, o_roles)
        a["lse"] = full_desc(nb + 2, call.lse_axes, call.lse_shape, lse_roles)
    else:  # results: O, LSE (when asked), the max logit (when asked), the workspace
        a["o"] = full_desc(0, call.o_axes, call.o_shape, o_roles)
        if n_rets - (call.max_logit_shape is not None) == 3:
            a["lse"] = full_desc(1, call.lse_axes, call.lse_shape, lse_roles)
        if call.max_logit_shape is not None:
            a["max_logit"] = np.int64(n_rets - 2)
    for key, value in call.options:
        a[key] = value
    a["workspace"] = np.int64(n_rets - 1)
    if call.static_varlen:
        a["varlen"] = np.int64(1)
        for key, values in call.static_varlen:
            a[key] = np.asarray(values, np.int64)
    elif call.dynamic_varlen:
        first = nb + (3 if backward else 0)
        names = (
            CU_SEQLENS_ARRAYS
            if call.cu_bounds
            else ("seqlens_q", "seqlens_kv", "offsets_q", "offsets_kv")
        )
        index = [
            first + call.dynamic_varlen.index(n) if n in call.dynamic_varlen else -1 for n in names
        ]
        a["varlen"] = np.int64(3 if call.cu_bounds else 2)
        a["varlen_args"] = np.asarray(index, np.int64)
        if call.cu_bounds:
            a["max_seqlen_q"], a["max_seqlen_kv"] = (np.int64(m) for m in call.cu_bounds)
    else:
        a["varlen"] = np.int64(0)
    if call.features or call.feature_arrays:
        first = nb + (3 if backward else 0) + len(call.dynamic_varlen)
        given = call.feature_arrays
        a["feature_args"] = np.asarray(
            [first + given.index(n) if n in given else -1 for n in _args.FEATURE_ARRAYS], np.int64
        )
        for key, value in call.features:
            a[key] = value
        if backward:  # dBias, then d_sinks, after the buffers' gradients
            has_bias, has_sinks = "bias" in given, "sinks" in given
            a["feature_rets"] = np.asarray(
                [nb if has_bias else -1, nb + has_bias if has_sinks else -1], np.int64
            )
    return a


_SHAPE_WORDS = ("head", "seq", "shape", "extent", "dimension")


def _raise(code: str, message: str, call: _Call) -> None:
    """The library's error as an exception, with a hint for the mistakes it often comes
    from: cumulative cu_seqlens passed as lengths, or a wrong axis order."""
    if code == "invalid_argument":
        if call.varlen:
            message += cu_seqlens_hint({k: list(v) for k, v in call.static_varlen})
        elif any(w in message.lower() for w in _SHAPE_WORDS):
            given = ", ".join(f"{n} '{s.axes}'" for n, s in zip("qkv", call.sources))
            message += (
                f" (strideattn.jax read the arrays with axes {given}: b batch, s seq, "
                "h heads, d head dim; pass axes= for another order)"
            )
    raise_for(code, message)


def _plain(a: Dict[str, Any]) -> Dict[str, Any]:
    """The attributes as Python values, for the trace-time query."""
    out = {}
    for k, v in a.items():
        if isinstance(v, np.ndarray):
            out[k] = [int(x) for x in v.tolist()]
        elif isinstance(v, np.generic):
            out[k] = v.item()
        else:
            out[k] = v
    return out


def _platform_of(name: str) -> str:
    return "cuda" if name in ("gpu", "cuda") else name


_PLATFORMS = ("cpu", "cuda")


def _input_platform(arrays: Sequence[Any]) -> Optional[str]:
    """The platform of the first concrete input's device; None when every input is a tracer
    (under jax.jit, where the platform is only fixed when the program is lowered)."""
    for x in arrays:
        try:
            devices = x.devices()  # a tracer has none (AttributeError or a JAX error)
        except Exception:  # noqa: BLE001
            continue
        for d in devices:
            return _platform_of(d.platform)
    return None


@functools.lru_cache(maxsize=None)
def _available_platforms() -> Tuple[str, ...]:
    """The platforms of this process that the call could run on, JAX's default first."""
    found = []
    for p in ("cpu", "gpu"):
        try:
            if jax.devices(p):
                found.append(_platform_of(p))
        except RuntimeError:
            pass
    default = _platform_of(jax.default_backend())
    return tuple(sorted(found, key=lambda p: p != default))


def _spec(x: Any) -> Tuple[str, List[int]]:
    return (np.dtype(x.dtype).name, [int(s) for s in x.shape])


def _run(call: _Call, backward: bool, arrays, results):
    """The forward or backward FFI call, one branch per platform (jax.lax.platform_dependent:
    the lowering keeps the platform's own). Each branch's problem is checked by the library
    now and its workspace (an extra uint8 result) sized for that platform's memory; the
    results are returned without the workspace.

    Errors are raised here when every platform the call could run on refuses it: the
    platform of concrete inputs, else (under jit) every platform of this process. A problem
    that only some of them refuse is reported by that platform's handler if it runs there."""
    attrs = _attrs(call, backward, len(results) + 1)
    args = [_spec(x) for x in arrays]
    rets = [_spec(r) for r in results] + [("uint8", [0])]
    answers = {
        p: _jax_ffi.query(backward, p == "cuda", args, rets, _plain(attrs)) for p in _PLATFORMS
    }
    where = _input_platform(arrays)
    candidates = (where,) if where is not None else _available_platforms()
    if any(p not in _PLATFORMS for p in candidates):
        raise UnsupportedError(
            f"strideattn.jax runs on JAX's cpu and cuda platforms; this call would run on "
            f"'{candidates[0]}'"
        )
    if all(answers[p][0] != "ok" for p in candidates):
        code, msg, _ = answers[candidates[0]]
        _raise(code, msg, call)
    target = _BACKWARD if backward else _FORWARD

    def branch(platform):
        code, _, ws = answers[platform]
        shapes = list(results) + [jax.ShapeDtypeStruct((ws if code == "ok" else 0,), jnp.uint8)]
        call_ffi = jax.ffi.ffi_call(target, shapes, vmap_method="sequential")
        return lambda *xs: tuple(call_ffi(*xs, **attrs)[:-1])

    return jax.lax.platform_dependent(*arrays, cpu=branch("cpu"), cuda=branch("cuda"))


def _forward(call: _Call, arrays, with_lse: bool):
    """(O, LSE or None, the max logit or None)."""
    dtype = call.dtypes[call.sources[0].buf]
    results = [jax.ShapeDtypeStruct(call.o_shape, dtype)]
    if with_lse:
        results.append(jax.ShapeDtypeStruct(call.lse_shape, jnp.float32))
    if call.max_logit_shape is not None:
        results.append(jax.ShapeDtypeStruct(call.max_logit_shape, jnp.float32))
    out = list(_run(call, False, arrays, results))
    o, lse = out.pop(0), out.pop(0) if with_lse else None
    return o, lse, out[0] if out else None


def _outputs(call: _Call, o, lse, max_logit):
    """What the call returns: O, then the LSE and the max logit where asked."""
    extra = ((lse,) if call.return_lse else ()) + ((max_logit,) if max_logit is not None else ())
    return (o,) + extra if extra else o


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(call: _Call, *arrays):
    return _outputs(call, *_forward(call, arrays, call.return_lse))


def _attention_fwd(call: _Call, *primals):
    arrays = tuple(p.value for p in primals)
    o, lse, max_logit = _forward(call, arrays, True)
    return _outputs(call, o, lse, max_logit), (arrays, o, lse)


def _attention_bwd(call: _Call, residuals, cotangent):
    arrays, o, lse = residuals
    nb = call.n_buffers
    zero = jax.custom_derivatives.SymbolicZero
    d_o = cotangent
    if call.return_lse or call.max_logit_shape is not None:
        d_o, *d_rest = cotangent
        if any(not isinstance(d, zero) for d in d_rest):
            raise NotImplementedError(
                "strideattn.jax.attention: gradients through the LSE or max-logit outputs "
                "are not supported (the library's backward takes dO only); apply "
                "jax.lax.stop_gradient to them where they are used"
            )
    if isinstance(d_o, zero):
        d_o = jnp.zeros(o.shape, o.dtype)
    results = [jax.ShapeDtypeStruct(call.shapes[i], call.dtypes[i]) for i in range(nb)]
    # the features' gradients: dBias (the bias's shape and dtype) and d_sinks, always
    # computed where the call has them (whether they are used is not known here)
    first = len(arrays) - len(call.feature_arrays)
    feats = dict(zip(call.feature_arrays, arrays[first:]))
    for name in ("bias", "sinks"):
        if name in feats:
            results.append(jax.ShapeDtypeStruct(feats[name].shape, feats[name].dtype))
    inputs = tuple(arrays[:nb]) + (o, d_o, lse) + tuple(arrays[nb:])
    grads = list(_run(call, True, inputs, results))
    feature_grads = {n: grads.pop(nb) for n in ("bias", "sinks") if n in feats}
    return (
        tuple(grads)
        + (None,) * (first - nb)
        + tuple(feature_grads.get(n) for n in call.feature_arrays)
    )


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


# ----------------------------------------------------------------------------- arguments


def _sequences(q_src: Source, q_shape, static_varlen, dynamic_names, dynamic_arrays) -> int:
    """The sequences of a call (the max logit's rows): the batch, or the varlen count."""
    if "b" in q_src.axes:
        return extent(q_shape, q_src.axes, "b")
    lengths = dict(static_varlen)
    if "seqlens_q" in lengths:
        return len(lengths["seqlens_q"])
    arrays = dict(zip(dynamic_names, dynamic_arrays))
    if "cu_seqlens_q" in arrays:
        return int(arrays["cu_seqlens_q"].shape[0]) - 1
    if "seqlens_q" in arrays:
        return int(arrays["seqlens_q"].shape[0])
    return 1


def _call(
    buffers, sources, mask, window, scale, deterministic, backend, varlen, return_lse, feats,
    return_max_logit=False,
) -> Any:  # fmt: skip
    """Builds the _Call for `buffers` read as the q, k, v `sources` and runs it."""
    static_varlen, dynamic_names, dynamic_arrays, cu_bounds = varlen
    feature_options, feature_names, feature_arrays = feats
    # As every jax.numpy function does: numpy inputs become JAX arrays (float64 becomes
    # float32 unless jax_enable_x64 is set).
    buffers = tuple(jnp.asarray(b) for b in buffers)
    shapes = tuple(tuple(int(s) for s in b.shape) for b in buffers)
    q_src, k_src, v_src = sources
    q_shape, v_shape = shapes[q_src.buf], shapes[v_src.buf]
    heads = q_src.heads if q_src.heads is not None else extent(q_shape, q_src.axes, "h")
    d_v = extent(v_shape, v_src.axes, "d")
    o_axes = q_src.axes.replace("3", "").replace("2", "")
    o_shape = tuple(
        heads if c == "h" else d_v if c == "d" else int(q_shape[q_src.axes.index(c)])
        for c in o_axes
    )
    has_b = "b" in q_src.axes
    lse_axes = ("b" if has_b else "") + "hs"
    lse_shape = ((extent(q_shape, q_src.axes, "b"),) if has_b else ()) + (
        heads,
        extent(q_shape, q_src.axes, "s"),
    )
    call = _Call(
        sources=tuple(sources),
        shapes=shapes,
        dtypes=tuple(np.dtype(b.dtype).name for b in buffers),
        o_axes=o_axes,
        o_shape=o_shape,
        lse_axes=lse_axes,
        lse_shape=lse_shape,
        options=_args.options(mask, window, scale, deterministic, backend),
        static_varlen=static_varlen,
        dynamic_varlen=dynamic_names,
        cu_bounds=cu_bounds,
        features=feature_options,
        feature_arrays=feature_names,
        return_lse=bool(return_lse),
        max_logit_shape=(
            (_sequences(q_src, q_shape, static_varlen, dynamic_names, dynamic_arrays), heads)
            if return_max_logit
            else None
        ),
    )
    return _attention(call, *buffers, *dynamic_arrays, *feature_arrays)


# ----------------------------------------------------------------------------- public API

_DOC_OPTIONS = """
    mask: "none", "causal" (top-left, key j visible from query i iff j <= i) or
    "causal_bottom_right" (j <= i + s_kv - s_q), and the aliases of strideattn.MASKS;
    window=(left, right) around the bottom-right diagonal, -1/None unbounded; scale default
    1/sqrt(d_qk); backend "auto", "reference", "cpu" (CPU platform), "cuda", "cudnn" (GPU);
    deterministic=True asks for a bitwise reproducible backward.
    Varlen: q/k/v without a batch axis (axes "thd"), seqlens_q/seqlens_kv the tokens of
    each sequence and offsets_q/offsets_kv its first token (default: packed back to back);
    Python ints or numpy arrays are fixed at trace time, JAX arrays are read at run time
    (CPU platform only). Or, on both platforms, FlashAttention's and TransformerEngine's
    form: cu_seqlens_q/cu_seqlens_kv (int32, count + 1 running token totals, 0 first),
    optional seq_offsets_q/seq_offsets_kv (int32, the first token of each sequence when they
    are padded apart) and the bounds max_seqlen_q/max_seqlen_kv (required: what the call is
    planned for); the arrays are arguments of the compiled call, read by the kernels, never
    on the host.
    Training features (docs/semantics.md "Training features"): softcap c > 0 caps the scaled
    logits (c tanh(x / c)); bias, float32/float16/bfloat16 of up to 4 dimensions broadcast to
    [b, h, s_q, s_kv] from the right (each extent full or 1), added after the scale and
    softcap (bias_type="post_scale") or before the scale ("pre_scale"), gets its gradient
    (summed over its extent-1 dimensions); alibi_slopes, float32 [h] or [b, h], subtracts
    slope |i + s_kv - s_q - j| (no gradient); sinks, float32 [h], join every row's softmax
    denominator as exp(sink) and get their gradient; dropout_p drops each probability with
    that chance, its Philox seed and offset drawn from dropout_rng (a JAX PRNG key: the same
    key draws the same mask on every backend, and the backward draws it again).
    Returns O (q's dtype, in q's axis order without a packed axis), then with
    return_lse=True the fp32 LSE, [b, h, s_q] (without a batch axis: [h, s_q]), and with
    return_max_logit=True each head's largest logit, fp32 [b, h] (varlen: [sequences, h]),
    for QK-clip; neither takes a gradient (NotImplementedError if one reaches it:
    stop_gradient it)."""


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    axes: Axes = None,
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
    cu_seqlens_q: Ints = None,
    cu_seqlens_kv: Ints = None,
    seq_offsets_q: Ints = None,
    seq_offsets_kv: Ints = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    softcap: Optional[float] = None,
    bias: Any = None,
    bias_type: str = "post_scale",
    alibi_slopes: Any = None,
    sinks: Any = None,
    dropout_p: float = 0.0,
    dropout_rng: Any = None,
    return_max_logit: bool = False,
):
    """Scaled dot-product attention O = softmax(scale * Q K^T + mask) V on JAX arrays,
    differentiable and jit-compatible. q [.., s_q, h, d_qk], k [.., s_kv, hg, d_qk],
    v [.., s_kv, hg, d_v] with h % hg == 0, each in the axis order `axes` gives: one string
    for all three (default "bshd" for 4 dimensions, "thd" for 3) or one per tensor, e.g.
    axes="sbhd" for [s, b, h, d] arrays."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _args.check_array(x, name)
    if axes is None or isinstance(axes, str):
        per = [axes] * 3
    else:
        per = list(axes)
        if len(per) != 3 or not all(isinstance(a, str) for a in per):
            raise ValueError(
                f"axes must be one string for q, k and v or three (q, k, v), got {describe(axes)}"
            )
    sources = []
    for i, (name, x, a) in enumerate(zip("qkv", (q, k, v), per)):
        a = default_axes(len(x.shape), name) if a is None else a
        sources.append(Source(buf=i, axes=parse_axes(a, x.shape, name)))
    return _call(
        (q, k, v),
        sources,
        mask,
        window,
        scale,
        deterministic,
        backend,
        _args.varlen(
            seqlens_q,
            seqlens_kv,
            offsets_q,
            offsets_kv,
            (
                cu_seqlens_q,
                cu_seqlens_kv,
                seq_offsets_q,
                seq_offsets_kv,
                max_seqlen_q,
                max_seqlen_kv,
            ),
        ),
        return_lse,
        _args.features(softcap, bias, bias_type, alibi_slopes, sinks, dropout_p, dropout_rng),
        return_max_logit,
    )


def _split_heads(
    total: int, groups: int, num_kv_heads: Optional[int], what: str
) -> Tuple[int, int]:
    """(h, hg) of a head axis holding h + groups * hg heads (groups 2: qkv; 1: kv)."""
    if num_kv_heads is None:
        if total % (groups + 1) != 0:
            raise ValueError(
                f"{what}'s head axis has {total} heads, not a multiple of {groups + 1}; pass "
                f"num_kv_heads= (the axis holds q's h heads, then {groups} x num_kv_heads)"
            )
        return total // (groups + 1), total // (groups + 1)
    hg = int(num_kv_heads)
    if hg <= 0 or total - groups * hg <= 0:
        raise ValueError(
            f"num_kv_heads={num_kv_heads} does not fit {what}'s head axis of {total} heads; "
            f"supported: 0 < num_kv_heads and h = {total} - {groups} * num_kv_heads > 0"
        )
    return total - groups * hg, hg


def attention_qkvpacked(
    qkv: Any,
    *,
    axes: Axes = None,
    num_kv_heads: Optional[int] = None,
    mask: str = "none",
    window: Window = None,
    scale: Optional[float] = None,
    seqlens: Ints = None,
    offsets: Ints = None,
    backend: str = "auto",
    deterministic: bool = False,
    return_lse: bool = False,
    cu_seqlens: Ints = None,
    seq_offsets: Ints = None,
    max_seqlen: Optional[int] = None,
    softcap: Optional[float] = None,
    bias: Any = None,
    bias_type: str = "post_scale",
    alibi_slopes: Any = None,
    sinks: Any = None,
    dropout_p: float = 0.0,
    dropout_rng: Any = None,
    return_max_logit: bool = False,
):
    """Attention over one fused QKV buffer read as three strided views (no split, no copy;
    its gradient is one buffer of qkv's shape). axes name its axes: with a "3" axis
    (default "bs3hd" for 5 dimensions, "t3hd" for 4) q, k, v are its indices 0, 1, 2; without
    one (e.g. "bshd") the head axis holds q's h heads, then k's and v's num_kv_heads each
    (default: a third each). Varlen: seqlens/offsets, or cu_seqlens/seq_offsets/max_seqlen
    (one set: q and kv share them)."""
    _args.check_array(qkv, "qkv")
    shape = qkv.shape
    if axes is None:
        axes = default_axes(len(shape), "qkv", packed="3")
    letters = parse_axes(axes, shape, "qkv", packed="3" if has_letter(axes, "3") else "")
    if "3" in letters:
        if shape[letters.index("3")] != 3:
            raise ValueError(
                f"qkv's '3' axis (axis {letters.index('3')}) has extent "
                f"{shape[letters.index('3')]}; supported: 3 (q, k, v)"
            )
        if num_kv_heads is not None and num_kv_heads != shape[letters.index("h")]:
            raise ValueError(
                f"num_kv_heads={num_kv_heads} with a '3' axis: q, k and v have the same "
                f"{shape[letters.index('h')]} heads there; leave num_kv_heads out"
            )
        sources = [Source(0, letters, pick=i) for i in range(3)]
    else:
        h, hg = _split_heads(int(shape[letters.index("h")]), 2, num_kv_heads, "qkv")
        sources = [
            Source(0, letters, head_start=0, heads=h),
            Source(0, letters, head_start=h, heads=hg),
            Source(0, letters, head_start=h + hg, heads=hg),
        ]
    return _call(
        (qkv,),
        sources,
        mask,
        window,
        scale,
        deterministic,
        backend,
        _args.varlen(
            seqlens,
            seqlens,
            offsets,
            offsets,
            (cu_seqlens, cu_seqlens, seq_offsets, seq_offsets, max_seqlen, max_seqlen),
        ),
        return_lse,
        _args.features(softcap, bias, bias_type, alibi_slopes, sinks, dropout_p, dropout_rng),
        return_max_logit,
    )


def attention_kvpacked(
    q: Any,
    kv: Any,
    *,
    axes: Axes = None,
    kv_axes: Axes = None,
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
    cu_seqlens_q: Ints = None,
    cu_seqlens_kv: Ints = None,
    seq_offsets_q: Ints = None,
    seq_offsets_kv: Ints = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    softcap: Optional[float] = None,
    bias: Any = None,
    bias_type: str = "post_scale",
    alibi_slopes: Any = None,
    sinks: Any = None,
    dropout_p: float = 0.0,
    dropout_rng: Any = None,
    return_max_logit: bool = False,
):
    """Attention with q in its own buffer (axes: default "bshd" / "thd") and k, v as strided
    views of one fused KV buffer (kv_axes: with a "2" axis, default "bs2hd" / "t2hd", k and v
    are its indices 0 and 1; without one the head axis holds k's heads, then v's, half
    each)."""
    _args.check_array(q, "q")
    _args.check_array(kv, "kv")
    q_axes = parse_axes(default_axes(len(q.shape), "q") if axes is None else axes, q.shape, "q")
    if kv_axes is None:
        kv_axes = default_axes(len(kv.shape), "kv", packed="2")
    packed = "2" if has_letter(kv_axes, "2") else ""
    letters = parse_axes(kv_axes, kv.shape, "kv", packed=packed)
    if packed:
        if kv.shape[letters.index("2")] != 2:
            raise ValueError(
                f"kv's '2' axis (axis {letters.index('2')}) has extent "
                f"{kv.shape[letters.index('2')]}; supported: 2 (k, v)"
            )
        k_src, v_src = Source(1, letters, pick=0), Source(1, letters, pick=1)
    else:
        total = int(kv.shape[letters.index("h")])
        if total % 2 != 0:
            raise ValueError(
                f"kv's head axis has {total} heads; without a '2' axis it holds k's heads "
                "then v's, so an even number"
            )
        k_src = Source(1, letters, head_start=0, heads=total // 2)
        v_src = Source(1, letters, head_start=total // 2, heads=total // 2)
    return _call(
        (q, kv),
        [Source(0, q_axes), k_src, v_src],
        mask,
        window,
        scale,
        deterministic,
        backend,
        _args.varlen(
            seqlens_q,
            seqlens_kv,
            offsets_q,
            offsets_kv,
            (
                cu_seqlens_q,
                cu_seqlens_kv,
                seq_offsets_q,
                seq_offsets_kv,
                max_seqlen_q,
                max_seqlen_kv,
            ),
        ),
        return_lse,
        _args.features(softcap, bias, bias_type, alibi_slopes, sinks, dropout_p, dropout_rng),
        return_max_logit,
    )


for _f in (attention, attention_qkvpacked, attention_kvpacked):
    _f.__doc__ += "\n" + _DOC_OPTIONS
