"""Test-only numpy reference for attention, independent of the library: an exact fp64
forward/backward and the "naive low-precision" model of docs/semantics.md (inputs in the dtype,
S and softmax in fp32, P (and dS) rounded to the dtype before the second GEMMs, outputs
rounded), whose error against fp64 sets the tolerance: 2 * naive_err + floor(dtype)."""

from __future__ import annotations

import math

import numpy as np

# Absolute floors, as in tools/harness/compare.cpp (a few ulps of values ~1).
FLOOR = {"float32": 2e-5, "float16": 1e-4, "bfloat16": 1e-3}


def dtype_name(dtype) -> str:
    """'float16' / 'bfloat16' / 'float32' for numpy or torch dtypes (numpy has no bf16)."""
    if isinstance(dtype, str) or str(dtype).startswith("torch."):
        return str(dtype).replace("torch.", "")
    return np.dtype(dtype).name


def round_to(x: np.ndarray, lowp) -> np.ndarray:
    """Round float32 values to the low precision `lowp` (kept in float32)."""
    name = dtype_name(lowp)
    x = np.asarray(x, np.float32)
    if name == "bfloat16":  # round to nearest even on the upper 16 bits
        u = x.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return np.where(np.isfinite(x), u.astype(np.uint32).view(np.float32), x)
    return x.astype(name).astype(np.float32)


def visible(s_q: int, s_kv: int, mask: str, window) -> np.ndarray:
    """[s_q, s_kv] bool: which keys each query sees (docs/semantics.md)."""
    i = np.arange(s_q)[:, None]
    j = np.arange(s_kv)[None, :]
    m = np.ones((s_q, s_kv), bool)
    if mask == "causal":
        m &= j <= i
    elif mask.replace("_", "-") == "causal-bottom-right":
        m &= j <= i + s_kv - s_q
    left, right = (-1, -1) if window is None else window
    diag = i + s_kv - s_q
    if left is not None and left >= 0:
        m &= j >= diag - left
    if right is not None and right >= 0:
        m &= j <= diag + right
    return m


def _seq(q, k, v, do, scale, m, lowp, o_given=None):
    """One sequence. q [s_q,h,d], k [s_kv,hg,d], v [s_kv,hg,dv], do [s_q,h,dv] or None.
    lowp: None (exact fp64) or the dtype of the naive model. o_given [s_q,h,dv]: the O the
    backward is handed (D = rowsum(dO * O) uses it); None: this model's own O."""
    h, hg = q.shape[1], k.shape[1]
    g = h // hg
    ct = np.float64 if lowp is None else np.float32  # compute type

    def rnd(x):  # round to the low precision dtype (held in compute type)
        return x if lowp is None else round_to(x, lowp)

    q, k, v = q.astype(ct), k.astype(ct), v.astype(ct)
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("ihd,jhd->hij", q, kk) * ct(scale)
    s = np.where(m[None], s, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        mx = (
            s.max(axis=-1, keepdims=True)
            if s.shape[-1]
            else np.full(s.shape[:-1] + (1,), -np.inf, ct)
        )
        mx_safe = np.where(np.isfinite(mx), mx, 0)
        e = np.exp(s - mx_safe)
        l = e.sum(axis=-1, keepdims=True)
        lse = (np.log(l) + mx_safe)[..., 0]  # -inf for rows that see nothing
        p = np.where(l > 0, e / np.where(l > 0, l, 1), 0)
    lse = np.where(np.isfinite(mx[..., 0]), lse, -np.inf)
    o = np.einsum("hij,jhd->ihd", rnd(p), vv)
    o_r = rnd(o)
    if do is None:
        return o_r, lse, None
    do = do.astype(ct)
    dv_full = np.einsum("hij,ihd->jhd", rnd(p), do)
    dp = np.einsum("ihd,jhd->hij", do, vv)
    o_d = o_r if o_given is None else np.asarray(o_given).astype(ct)
    drow = np.einsum("ihd,ihd->hi", do, o_d)  # rowsum(dO * O), O as the backward receives it
    ds = p * (dp - drow[..., None])
    dq = np.einsum("hij,jhd->ihd", rnd(ds), kk) * ct(scale)
    dk_full = np.einsum("hij,ihd->jhd", rnd(ds), q) * ct(scale)
    s_kv = k.shape[0]
    dk = dk_full.reshape(s_kv, hg, g, dk_full.shape[-1]).sum(axis=2)
    dv = dv_full.reshape(s_kv, hg, g, dv_full.shape[-1]).sum(axis=2)
    return o_r, lse, (rnd(dq), rnd(dk), rnd(dv))


def attention_ref(
    q,
    k,
    v,
    *,
    mask="none",
    window=None,
    scale=None,
    do=None,
    seqlens_q=None,
    seqlens_kv=None,
    offsets_q=None,
    offsets_kv=None,
    lowp=None,
    o_given=None,
):
    """Reference over logical arrays: dense q [b,s_q,h,d] or varlen q [tokens,h,d].
    Returns dict with o (like q, d_v), lse ([b,h,s_q] or [h,tokens]) and, with do, dq/dk/dv.
    Tokens that no sequence covers are 0 (LSE -inf). o_given (like o): the O handed to the
    backward, for the gradient targets of docs/semantics.md ("backward of the given O")."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    d_qk = q.shape[-1]
    scale = 1.0 / np.sqrt(d_qk) if scale is None else scale
    ct = np.float64 if lowp is None else np.float32
    if seqlens_q is None:
        b, s_q, h, _ = q.shape
        s_kv = k.shape[1]
        m = visible(s_q, s_kv, mask, window)
        o = np.zeros(q.shape[:-1] + (v.shape[-1],), ct)
        lse = np.zeros((b, h, s_q), ct)
        grads = [np.zeros(x.shape, ct) for x in (q, k, v)] if do is not None else None
        for bi in range(b):
            r = _seq(
                q[bi],
                k[bi],
                v[bi],
                None if do is None else do[bi],
                scale,
                m,
                lowp,
                None if o_given is None else o_given[bi],
            )
            o[bi], lse[bi] = r[0], r[1]
            if grads is not None:
                for g, x in zip(grads, r[2]):
                    g[bi] = x
        out = dict(o=o, lse=lse)
    else:
        t_q, h = q.shape[0], q.shape[1]
        off_q = (
            offsets_q if offsets_q is not None else np.concatenate([[0], np.cumsum(seqlens_q)[:-1]])
        )
        off_kv = (
            offsets_kv
            if offsets_kv is not None
            else np.concatenate([[0], np.cumsum(seqlens_kv)[:-1]])
        )
        o = np.zeros((t_q, h, v.shape[-1]), ct)
        lse = np.full((h, t_q), -np.inf, ct)
        grads = [np.zeros(x.shape, ct) for x in (q, k, v)] if do is not None else None
        for i, (lq, lk) in enumerate(zip(seqlens_q, seqlens_kv)):
            qs = slice(off_q[i], off_q[i] + lq)
            ks = slice(off_kv[i], off_kv[i] + lk)
            m = visible(lq, lk, mask, window)
            r = _seq(
                q[qs],
                k[ks],
                v[ks],
                None if do is None else do[qs],
                scale,
                m,
                lowp,
                None if o_given is None else o_given[qs],
            )
            o[qs], lse[:, qs] = r[0], r[1]
            if grads is not None:
                grads[0][qs] = r[2][0]
                grads[1][ks] = r[2][1]
                grads[2][ks] = r[2][2]
        out = dict(o=o, lse=lse)
    if grads is not None:
        out.update(dq=grads[0], dk=grads[1], dv=grads[2])
    return out


MANTISSA_BITS = {"float32": 23, "float16": 10, "bfloat16": 7}


def half_ulp(dtype_name_, x):
    """Half a unit in the last place of the dtype at |x| (0 for 0 and non-finite x)."""
    x = abs(float(x))
    if not (x > 0) or not math.isfinite(x):
        return 0.0
    return math.ldexp(1.0, math.frexp(x)[1] - 1 - MANTISSA_BITS[dtype_name_] - 1)


def check(name, got, exact, naive, dtype, seed, lse=False, magnitude=None):
    """The correctness rule as docs/semantics.md states it (tools/harness/compare.hpp):
    max|got - exact| <= 2 * max|naive - exact| + floor(dtype) + 4e-6 * magnitude
                        + half_ulp(dtype, max|exact|),
    magnitude being max|exact| (for gradients pass the largest over dq, dk, dv:
    grad_magnitude()), the last term the tensor's own output rounding;
    infinities (LSE of rows that see nothing) must match exactly; no NaN."""
    got = np.asarray(got, dtype=np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    naive = np.asarray(naive, dtype=np.float64)
    assert got.shape == exact.shape, f"{name}: shape {got.shape} != {exact.shape} (seed {seed})"
    assert not np.isnan(got).any(), f"{name}: {np.isnan(got).sum()} NaN elements (seed {seed})"
    inf_exact = np.isinf(exact)
    assert np.array_equal(np.isinf(got), inf_exact) and np.array_equal(
        got[inf_exact], exact[inf_exact]
    ), f"{name}: infinities differ from the reference (seed {seed})"
    fin = ~inf_exact
    err = float(np.abs(got[fin] - exact[fin]).max()) if fin.any() else 0.0
    naive_err = float(np.abs(naive[fin] - exact[fin]).max()) if fin.any() else 0.0
    floor = FLOOR["float32"] if lse else FLOOR[dtype_name(dtype)]
    if magnitude is None:
        magnitude = float(np.abs(exact[fin]).max()) if fin.any() else 0.0
    largest = float(np.abs(exact[fin]).max()) if fin.any() else 0.0
    tol = (
        2 * naive_err
        + floor
        + 4e-6 * magnitude
        + half_ulp("float32" if lse else dtype_name(dtype), largest)
    )
    assert err <= tol, (
        f"{name}: max abs error {err:.3e} > tolerance {tol:.3e} "
        f"(naive {naive_err:.3e}, seed {seed})"
    )
    return err, tol


def grad_magnitude(ref):
    """The relative term's scale for dq, dk, dv: their largest finite |value| (they share dS)."""
    vals = [np.abs(np.asarray(ref[n], np.float64)) for n in ("dq", "dk", "dv")]
    return max(float(v[np.isfinite(v)].max()) if np.isfinite(v).any() else 0.0 for v in vals)


def backward_targets(q, k, v, o, do, dtype, **opts):
    """(exact, naive) gradient targets as the C++ harness draws them (backward_targets() in
    src/backends/reference/reference.hpp): for 16-bit dtypes, the backward of the O the
    backend was handed (its rounding enters D = rowsum(dO * O) and no backend can undo it);
    for float32, the true gradient."""
    given = None if dtype_name(dtype) == "float32" else np.asarray(o, np.float64)
    exact = attention_ref(q, k, v, do=do, o_given=given, **opts)
    naive = attention_ref(q, k, v, do=do, lowp=dtype, o_given=given, **opts)
    return exact, naive


def kvcache_ref(
    q,
    k_cache,
    v_cache,
    *,
    cache_seqlens,
    k_new=None,
    v_new=None,
    block_table=None,
    seqlens_q=None,
    mask="none",
    window=None,
    scale=None,
    lowp=None,
):
    """KV-cache attention as docs/semantics.md "KV cache" defines it, in plain numpy: the new
    tokens written into copies of the caches (token t of sequence n at cache[n, t], or at
    cache[block_table[n, t // page], t % page] when paged), then each sequence's first
    seqlens_q[n] query rows against its L = cache_seqlens[n] + s_new keys. Returns dict with
    o [b, s_q, h, d_v], lse [b, h, s_q] (rows past seqlens_q and sequences with L = 0: O 0,
    LSE -inf) and the caches after the append (k_cache, v_cache, in the input dtype)."""
    q = np.asarray(q)
    kc, vc = np.array(k_cache, copy=True), np.array(v_cache, copy=True)
    b, s_q, h, d_qk = q.shape
    scale = 1.0 / np.sqrt(d_qk) if scale is None else scale
    s_new = 0 if k_new is None else k_new.shape[1]
    page = None if block_table is None else kc.shape[1]

    def slot(n, t):  # (row, position) of token t of sequence n
        if page is None:
            return n, t
        return int(block_table[n][t // page]), t % page

    for n in range(b):
        for t in range(s_new):
            r, pos = slot(n, int(cache_seqlens[n]) + t)
            kc[r, pos] = k_new[n, t]
            vc[r, pos] = v_new[n, t]
    ct = np.float64 if lowp is None else np.float32
    o = np.zeros((b, s_q, h, vc.shape[-1]), ct)
    lse = np.full((b, h, s_q), -np.inf, ct)
    for n in range(b):
        length = int(cache_seqlens[n]) + s_new
        rows = s_q if seqlens_q is None else int(seqlens_q[n])
        idx = [slot(n, t) for t in range(length)]
        kk = np.stack([kc[r, pos] for r, pos in idx]) if idx else kc[:0, 0]
        vv = np.stack([vc[r, pos] for r, pos in idx]) if idx else vc[:0, 0]
        if rows == 0:
            continue
        m = visible(rows, length, mask, window)
        r = _seq(q[n, :rows], kk, vv, None, scale, m, lowp)
        o[n, :rows], lse[n, :, :rows] = r[0], r[1]
    return dict(o=o, lse=lse, k_cache=kc, v_cache=vc)


# ----------------------------------------------------------------------------- training features
# docs/semantics.md "Training features", written from the text (dense batches only): softcap,
# additive bias (post- or pre-scale), ALiBi, sinks, dropout (Philox4x32-10 keep mask) and the
# max logit, forward and backward in fp64.

_M = (0xD2511F53, 0xCD9E8D57)  # Philox4x32 multipliers
_W = (0x9E3779B9, 0xBB67AE85)  # and key increments (Random123)
_LO = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Random123's Philox4x32-10 on uint32 counter words (arrays broadcast) and key (ints):
    the four output words as uint64 arrays holding 32-bit values."""
    c = [np.asarray(x, np.uint64) & _LO for x in np.broadcast_arrays(c0, c1, c2, c3)]
    k0, k1 = k0 & 0xFFFFFFFF, k1 & 0xFFFFFFFF
    for _ in range(10):
        p0 = np.uint64(_M[0]) * c[0]
        p1 = np.uint64(_M[1]) * c[2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & _LO
        hi1, lo1 = p1 >> np.uint64(32), p1 & _LO
        c = [hi1 ^ c[1] ^ np.uint64(k0), lo1, hi0 ^ c[3] ^ np.uint64(k1), lo0]
        k0, k1 = (k0 + _W[0]) & 0xFFFFFFFF, (k1 + _W[1]) & 0xFFFFFFFF
    return c


def dropout_keep(p, seed, offset, b, hq, h, s_q, s_kv):
    """[s_q, s_kv] bool: the keep decisions of (batch b, query head hq)."""
    n = (offset + b * h + hq) % (1 << 64)
    i = np.arange(s_q, dtype=np.uint64)[:, None]
    j = np.arange(s_kv, dtype=np.uint64)[None, :]
    r = philox4x32_10(j >> np.uint64(2), i, n & 0xFFFFFFFF, n >> 32, seed & 0xFFFFFFFF, seed >> 32)
    word = np.choose((j & np.uint64(3)).astype(np.int64) + np.zeros((s_q, 1), np.int64), r)
    return word >= np.uint64(math.floor(p * 2.0**32))


def features_ref(
    q,
    k,
    v,
    *,
    mask="none",
    window=None,
    scale=None,
    bias=None,
    bias_type="post_scale",
    alibi_slopes=None,
    softcap=0.0,
    sinks=None,
    dropout_p=0.0,
    dropout_seed=0,
    dropout_offset=0,
    do=None,
    o_given=None,
):
    """fp64 model over dense q [b,s_q,h,d], k/v [b,s_kv,hg,d]. bias: [B,H,SQ,SKV] (extents
    full or 1); alibi_slopes [h] or [b,h]; sinks [h]. Returns dict o, lse [b,h,s_q], max_logit
    [b,h] and, with do, dq, dk, dv, dbias (the bias's shape), d_sinks [h]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, s_q, h, d = q.shape
    s_kv, hg = k.shape[1], k.shape[2]
    g = h // hg
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    m = visible(s_q, s_kv, mask, window)
    bias_full = None
    if bias is not None:
        bias_full = np.broadcast_to(np.asarray(bias, np.float64), (b, h, s_q, s_kv))
    slopes = None
    if alibi_slopes is not None:
        slopes = np.broadcast_to(np.asarray(alibi_slopes, np.float64).reshape(-1, h), (b, h))
    dist = np.abs(np.arange(s_q)[:, None] + s_kv - s_q - np.arange(s_kv)[None, :])
    o = np.zeros((b, s_q, h, v.shape[-1]))
    lse = np.full((b, h, s_q), -np.inf)
    max_logit = np.full((b, h), -np.inf)
    grads = None
    if do is not None:
        do = np.asarray(do, np.float64)
        od = o if o_given is None else np.asarray(o_given, np.float64)
        grads = dict(
            dq=np.zeros_like(q),
            dk=np.zeros_like(k),
            dv=np.zeros_like(v),
            dbias_full=np.zeros((b, h, s_q, s_kv)),
            d_sinks=np.zeros(h),
        )
    saved = {}
    for bi in range(b):
        for hq in range(h):
            hk = hq // g
            raw = q[bi, :, hq] @ k[bi, :, hk].T
            pre = bias_full[bi, hq] if bias is not None and bias_type == "pre_scale" else 0.0
            t = scale * (raw + pre)
            u = softcap * np.tanh(t / softcap) if softcap else t
            ll = u.copy()
            if bias is not None and bias_type == "post_scale":
                ll = ll + bias_full[bi, hq]
            if slopes is not None:
                ll = ll - slopes[bi, hq] * dist
            ll = np.where(m, ll, -np.inf)
            if m.any():
                max_logit[bi, hq] = ll[m].max()
            rows = m.any(axis=1)
            mx = np.where(rows, np.max(np.where(m, ll, -np.inf), axis=1, initial=-np.inf), 0)
            if sinks is not None:
                mx = np.maximum(mx, float(sinks[hq]))
            e = np.where(m, np.exp(ll - mx[:, None]), 0.0)
            den = e.sum(axis=1) + (np.exp(float(sinks[hq]) - mx) if sinks is not None else 0)
            lse_r = np.where(rows, np.log(np.where(rows, den, 1)) + mx, -np.inf)
            p = np.where(rows[:, None], e / np.where(rows, den, 1)[:, None], 0.0)
            p_sink = np.where(rows, np.exp(float(sinks[hq]) - lse_r), 0) if sinks is not None else 0
            z = np.ones((s_q, s_kv))
            if dropout_p:
                keep = dropout_keep(dropout_p, dropout_seed, dropout_offset, bi, hq, h, s_q, s_kv)
                z = keep / (1.0 - dropout_p)
            o[bi, :, hq] = (z * p) @ v[bi, :, hk]
            lse[bi, hq] = lse_r
            saved[bi, hq] = (t, p, p_sink, z, rows)
    if grads is None:
        return dict(o=o, lse=lse, max_logit=max_logit)
    od = o if o_given is None else od
    for (bi, hq), (t, p, p_sink, z, rows) in saved.items():
        hk = hq // g
        dd = (do[bi, :, hq] * od[bi, :, hq]).sum(axis=1)
        dp = do[bi, :, hq] @ v[bi, :, hk].T
        dl = np.where(rows[:, None], p * (z * dp - dd[:, None]), 0.0)
        dt = dl * (1 - np.tanh(t / softcap) ** 2) if softcap else dl
        grads["dq"][bi, :, hq] += scale * dt @ k[bi, :, hk]
        grads["dk"][bi, :, hk] += scale * dt.T @ q[bi, :, hq]
        grads["dv"][bi, :, hk] += (z * p).T @ do[bi, :, hq]
        grads["dbias_full"][bi, hq] = dl if bias_type == "post_scale" else scale * dt
        if sinks is not None:
            grads["d_sinks"][hq] -= float(np.sum(np.where(rows, p_sink * dd, 0)))
    out = dict(o=o, lse=lse, max_logit=max_logit, dq=grads["dq"], dk=grads["dk"], dv=grads["dv"])
    out["d_sinks"] = grads["d_sinks"]
    if bias is not None:  # summed over each extent-1 dimension of the bias
        shape = np.shape(bias)
        axes = tuple(ax for ax in range(4) if shape[ax] == 1)
        out["dbias"] = grads["dbias_full"].sum(axis=axes, keepdims=True)
    return out
