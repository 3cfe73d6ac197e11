// The training features as the kernels' feature variant (Variant::mods) applies them
// (docs/semantics.md "Training features"), written once for the mma.sync and the wgmma
// kernels, forward and backward:
//   - the logit of a pair from its raw dot product S = q.k (score_mod): T = scale (S + Bpre),
//     U = c tanh(T / c) with a softcap, L = U + Bpost - slope |i + s_kv - s_q - j|, the bias
//     read through its strides (stride 0 broadcasts) by bias_read.cuh;
//   - the sink joining a row's softmax denominator at the end of the forward (join_sink);
//   - the max-logit output (record_max_logit: a warp's max, one float atomic max);
//   - the backward's dL -> dT, times the softcap's derivative 1 - tanh^2 (score_grad_*),
//     with tanh taken back from the recomputed P and the row's LSE: L = LSE + ln P, so no
//     fragment of tanh values stays in registers across the dP GEMM (one did: 592 bytes of
//     spills in the wgmma dK/dV pass at d 64); and dBias = dL (post_scale) or scale dT
//     (pre_scale), written by the dK/dV passes (score_grad_cols).
// The feature variant takes L in natural units: its softmax runs with scale 1 (scale_log2 =
// log2 e), its LSE is round(m) + ln l and its backward's P is exp(L - LSE), so the plain
// kernels' code (softmax.cuh, epilogue.cuh) runs unchanged on L.
#pragma once

#include <cmath>
#include <type_traits>

#include "backends/cuda/common/bias_read.cuh"
#include "backends/cuda/common/element.cuh"
#include "backends/cuda/common/feature_set.hpp"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/lse.hpp"
#include "backends/cuda/common/mask.cuh"
#include "backends/cuda/common/softmax.cuh"

namespace strideattn::cuda_impl {

// tanh(x) from one exponential: 1 - 2 / (e^(2|x|) + 1) with x's sign. Its absolute error is a
// few fp32 ulps of 1 (tanh.approx.f32, which --use_fast_math may pick for tanhf, has a
// relative error of 2^-11: 1e-2 in a logit capped at 30, past the correctness rule).
__device__ __forceinline__ float tanh_full(float x) {
  const float e = __expf(2.f * fabsf(x));  // inf for |x| > 44: tanh = 1
  return copysignf(1.f - 2.f / (e + 1.f), x);
}

// Element `off` of a dBias view of dtype `dt` (DType's value) gets x.
__device__ __forceinline__ void store_element(void* base, int64_t off, int dt, float x) {
  if (dt == int(DType::f32))
    static_cast<float*>(base)[off] = x;
  else
    static_cast<uint16_t*>(base)[off] =
        dt == int(DType::f16) ? ElementTraits<__half>::from_float(x) : ElementTraits<__nv_bfloat16>::from_float(x);
}

inline constexpr int kBiasPost = int(BiasType::post_scale), kBiasPre = int(BiasType::pre_scale);

// The score modifiers of one (sequence, query head): every kernel builds one where it knows
// the pair's head (a dK/dV pass: per iteration of its GQA loop).
struct ScoreMod {
  float scale = 1.f;               // the softmax scale
  float cap = 0.f, inv_cap = 0.f;  // softcap c and 1 / c; 0: off
  float slope = 0.f;               // ALiBi slope of (sequence, head); 0 without ALiBi
  int64_t shift = 0;               // s_kv - s_q of the sequence (ALiBi's diagonal)
  int64_t s_q = 0, s_kv = 0;       // the sequence's lengths: the bias is read inside them only
  // bias: element (i, j) of the (sequence, head) slab at bias[bias_off + i si + j sj]
  const void* bias = nullptr;
  int bias_kind = 0, bias_dtype = 0;
  int64_t bias_off = 0, bias_si = 0, bias_sj = 0;
  // dBias: element (i, j) stored at dbias[dbias_off + i si + j sj] or added into
  // dbias_acc[dbias_off + ...] (the accumulator's offsets then)
  void* dbias = nullptr;
  float* dbias_acc = nullptr;
  int dbias_dtype = 0;
  int64_t dbias_off = 0, dbias_si = 0, dbias_sj = 0;

  // Feats (common/feature_set.hpp): the features an instantiation compiles in; the others
  // stay off here (their defaults above), which the compiler carries into every use.
  template <int Feats = kFeatAll>
  __device__ __forceinline__ static ScoreMod of(const KernelParams& kp, const MaskRule& m, int64_t batch,
                                                int64_t head) {
    const FeatureParams& f = kp.f;
    ScoreMod s;
    s.scale = kp.p.scale;
    if constexpr ((Feats & kFeatSoftcap) != 0) {
      s.cap = f.softcap;
      s.inv_cap = f.softcap > 0.f ? 1.f / f.softcap : 0.f;
    }
    if constexpr ((Feats & kFeatAlibi) != 0)
      s.slope = f.alibi != nullptr ? f.alibi[batch * f.alibi_sb + head * f.alibi_sh] : 0.f;
    s.shift = m.shift();
    s.s_q = m.s_q, s.s_kv = m.s_kv;
    if constexpr ((Feats & kFeatBias) != 0) {
      if (f.bias != nullptr) {
        s.bias = f.bias, s.bias_kind = f.bias_kind, s.bias_dtype = f.bias_dtype;
        s.bias_off = batch * f.bias_st[0] + head * f.bias_st[1];
        s.bias_si = f.bias_st[2], s.bias_sj = f.bias_st[3];
      }
      if (f.dbias_accum != nullptr) {
        s.dbias_acc = f.dbias_accum;
        s.dbias_off = batch * f.dbias_accum_st[0] + head * f.dbias_accum_st[1];
        s.dbias_si = f.dbias_accum_st[2], s.dbias_sj = f.dbias_accum_st[3];
      } else if (f.dbias != nullptr) {
        s.dbias = f.dbias, s.dbias_dtype = f.dbias_dtype;
        s.dbias_off = batch * f.dbias_st[0] + head * f.dbias_st[1];
        s.dbias_si = f.dbias_st[2], s.dbias_sj = f.dbias_st[3];
      }
    }
    return s;
  }

  [[nodiscard]] __device__ __forceinline__ BiasRef bias_ref() const {
    return BiasRef{bias, bias_dtype, bias_off, bias_si, bias_sj, s_q, s_kv};
  }

  [[nodiscard]] __device__ __forceinline__ bool writes_dbias() const {
    return dbias != nullptr || dbias_acc != nullptr;
  }
};

// Each modifier below is its own loop over a fragment, each branch on a dtype taken once
// per fragment: one loop per score with every modifier and a dtype switch per element inside
// made ptxas keep the bias loads of a whole fragment in flight (2.6 KB of spills in the wgmma
// dK/dV pass at d 64, against 20 bytes without the bias).

// f(x, i, j, slot, col) for each entry x of a warp's C[MT][N/8][4] fragment: rows row0 +
// 16 mt + g (+8) (slot 2 mt + h), columns col0 + col, col = 8 n + 2 t (+1); i is its query
// and j its key (rows are queries where `rows_are_queries`, else keys). Column by column,
// so what f computes from a column (a bias address) serves the column's few rows at once
// rather than staying live across the fragment (row by row, the sm90a mma.sync forward at
// d 64 spilled 2,962 bytes; column by column 1,910).
template <int MT, int N, class F>
__device__ __forceinline__ void for_each_pair(float (&c)[MT][N / 8][4], int64_t row0, int64_t col0,
                                              bool rows_are_queries, F&& f) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = n * 8 + 2 * t + e;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t r = row0 + mt * 16 + g + 8 * h;
          float& x = c[mt][n][2 * h + e];
          if (rows_are_queries)
            f(x, r, col0 + col, 2 * mt + h, col);
          else
            f(x, col0 + col, r, 2 * mt + h, col);
        }
    }
}

// x += mul * |i + s_kv - s_q - j|, ALiBi's distance (exact in fp32 below 2^24). Entry (mt,
// h, n, e) of for_each_pair's layout is at distance d0 +- (16 mt + 8 h - 8 n - e) from the
// lane's first one (row row0 + g, column col0 + 2 t; + where rows are queries): where the
// whole fragment is within 2^24 of the diagonal, d0 is converted once and each entry costs
// an add of a constant and a fused multiply-add on its absolute value (in int64 per entry,
// with a 64-bit conversion each, ALiBi nearly doubled the forward's time); the same values,
// since every distance is an integer below 2^24 either way. Farther out, entry by entry.
template <int MT, int N>
__device__ __forceinline__ void add_distance(float (&c)[MT][N / 8][4], const ScoreMod& m, int64_t row0, int64_t col0,
                                             bool rows_are_queries, float mul) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t q0 = rows_are_queries ? row0 + g : col0 + 2 * t, k0 = rows_are_queries ? col0 + 2 * t : row0 + g;
  const int64_t d0 = q0 + m.shift - k0;
  constexpr int64_t kReach = 16 * MT + N;  // |entry's distance - d0| < kReach
  if ((d0 < 0 ? -d0 : d0) < (int64_t(1) << 24) - kReach) {
    const float base = float(d0), sign = rows_are_queries ? 1.f : -1.f;
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float d = base + sign * float(16 * mt + 8 * h - 8 * n - e);
            c[mt][n][2 * h + e] += mul * fabsf(d);
          }
    return;
  }
  for_each_pair<MT, N>(c, row0, col0, rows_are_queries, [&](float& x, int64_t i, int64_t j, int, int) {
    const int64_t d = i + m.shift - j;
    x += mul * float(d < 0 ? -d : d);
  });
}

// c (a warp's C[MT][N/8][4] fragment of raw scores; for_each_pair's layout) becomes L:
// T = scale S (+ scale Bpre), U = c tanh(T / c), L = U (+ Bpost) - slope |...|. Masking comes
// after (mask.cuh).
template <int MT, int N>
__device__ __forceinline__ void score_mod(float (&c)[MT][N / 8][4], const ScoreMod& m, int64_t row0, int64_t col0,
                                          bool rows_are_queries) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[mt][n][e] = __fmul_rn(c[mt][n][e], m.scale);
  if (m.bias_kind == kBiasPre) add_bias<MT, N>(c, m.bias_ref(), row0, col0, rows_are_queries, m.scale);
  if (m.cap > 0.f)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < N / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[mt][n][e] = m.cap * tanh_full(c[mt][n][e] * m.inv_cap);
  if (m.bias_kind == kBiasPost) add_bias<MT, N>(c, m.bias_ref(), row0, col0, rows_are_queries, 1.f);
  if (m.slope != 0.f) add_distance<MT, N>(c, m, row0, col0, rows_are_queries, -m.slope);
}

// ------------------------------------------------------------------ backward

// A recomputed P the pass must not take dBias from: the mask hides the pair (kMaskedP), or
// softcap_grad marked it so (-inf).
__device__ __forceinline__ bool hidden_pair(float p) { return is_masked_p(p) || p == -INFINITY; }

// dBias(i, j) gets mul * ds of each pair inside the sequence that `p` does not hide: stored
// in dBias's dtype, or added into the fp32 accumulator.
template <class E, int MT, int N>
__device__ __forceinline__ void store_dbias_as(const float (&ds)[MT][N / 8][4], float (&p)[MT][N / 8][4],
                                               const ScoreMod& m, int64_t row0, int64_t col0, bool rows_are_queries,
                                               float mul) {
  E* const base = static_cast<E*>(m.dbias) + m.dbias_off;
  for_each_pair<MT, N>(p, row0, col0, rows_are_queries, [&](float& x, int64_t i, int64_t j, int slot, int col) {
    const float d = mul * ds[slot >> 1][col >> 3][2 * (slot & 1) + (col & 1)];
    if (hidden_pair(x) || i >= m.s_q || j >= m.s_kv) return;
    if constexpr (std::is_same_v<E, float>)
      base[i * m.dbias_si + j * m.dbias_sj] = d;
    else if constexpr (std::is_same_v<E, __half>)
      base[i * m.dbias_si + j * m.dbias_sj] = __float2half_rn(d);
    else
      base[i * m.dbias_si + j * m.dbias_sj] = __float2bfloat16_rn(d);
  });
}
// The same where rows are keys row0 + ..., columns queries col0 + ..., every entry inside the
// sequence and dbias_sj == 1: per query column one pointer, the thread's keys at immediate
// offsets from it.
template <class E, int MT, int N>
__device__ __forceinline__ void store_dbias_key_rows(const float (&ds)[MT][N / 8][4], const float (&p)[MT][N / 8][4],
                                                     const ScoreMod& m, int64_t row0, int64_t col0, float mul) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  E* const base = static_cast<E*>(m.dbias) + m.dbias_off + row0 + g;
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      E* const col = base + (col0 + 8 * n + 2 * t + e) * m.dbias_si;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (hidden_pair(p[mt][n][2 * h + e])) continue;
          const float d = mul * ds[mt][n][2 * h + e];
          if constexpr (std::is_same_v<E, float>)
            col[16 * mt + 8 * h] = d;
          else if constexpr (std::is_same_v<E, __half>)
            col[16 * mt + 8 * h] = __float2half_rn(d);
          else
            col[16 * mt + 8 * h] = __float2bfloat16_rn(d);
        }
    }
}

template <int MT, int N>
__device__ __forceinline__ void put_dbias(const float (&ds)[MT][N / 8][4], float (&p)[MT][N / 8][4], const ScoreMod& m,
                                          int64_t row0, int64_t col0, bool rows_are_queries, float mul) {
  if (m.dbias != nullptr && !rows_are_queries && m.dbias_sj == 1 && row0 + 16 * MT <= m.s_kv && col0 + N <= m.s_q) {
    if (m.dbias_dtype == int(DType::f32))
      store_dbias_key_rows<float, MT, N>(ds, p, m, row0, col0, mul);
    else if (m.dbias_dtype == int(DType::f16))
      store_dbias_key_rows<__half, MT, N>(ds, p, m, row0, col0, mul);
    else
      store_dbias_key_rows<__nv_bfloat16, MT, N>(ds, p, m, row0, col0, mul);
  } else if (m.dbias_acc != nullptr) {
    float* const acc = m.dbias_acc + m.dbias_off;
    for_each_pair<MT, N>(p, row0, col0, rows_are_queries, [&](float& x, int64_t i, int64_t j, int slot, int col) {
      if (hidden_pair(x) || i >= m.s_q || j >= m.s_kv) return;
      atomicAdd(acc + i * m.dbias_si + j * m.dbias_sj, mul * ds[slot >> 1][col >> 3][2 * (slot & 1) + (col & 1)]);
    });
  } else if (m.dbias_dtype == int(DType::f32)) {
    store_dbias_as<float, MT, N>(ds, p, m, row0, col0, rows_are_queries, mul);
  } else if (m.dbias_dtype == int(DType::f16)) {
    store_dbias_as<__half, MT, N>(ds, p, m, row0, col0, rows_are_queries, mul);
  } else {
    store_dbias_as<__nv_bfloat16, MT, N>(ds, p, m, row0, col0, rows_are_queries, mul);
  }
}

// How far the taken-back tanh may be from the true one, per unit of magnitude of the terms it
// is taken back from (softcap_grad): the LSE's and ln P's roundings (a few ulps each) and the
// bias and ALiBi terms', with room to spare.
inline constexpr float kTakenBackErr = 0x1p-20f;

// bias(i, j) as fp32: 0 outside the sequence (the tiles' padding rows and keys have none).
__device__ __forceinline__ float bias_at(const ScoreMod& m, int64_t i, int64_t j) {
  if (i >= m.s_q || j >= m.s_kv) return 0.f;
  const int64_t at = m.bias_off + i * m.bias_si + j * m.bias_sj;
  if (m.bias_dtype == int(DType::f32)) return static_cast<const float*>(m.bias)[at];
  if (m.bias_dtype == int(DType::f16)) return as_float(static_cast<const __half*>(m.bias)[at]);
  return as_float(static_cast<const __nv_bfloat16*>(m.bias)[at]);
}

// dL -> dT with a softcap: ds *= 1 - tanh^2 where P > 0 (entries with P = 0 have dS = 0, or
// NaN from dP, and stay so), tanh taken back from P and the row's LSE (lse_of(slot, col):
// its lse_for_p value): L = LSE + ln P, U = L - Bpost + slope |...| (the terms after the
// softcap taken back), tanh = U / c. That tanh errs by up to e = kTakenBackErr (|LSE| + |U|
// + |Bpost| + |slope |...|| + 1) / c (each term's rounding; ALiBi's distance term reaches
// slope x s_kv); within e of +-1 the true factor 1 - tanh^2 is below 2 e, noise: it is taken
// as 0, which it is exactly where the score is infinite (the definition's 0 * K = NaN for an
// infinite key, not +-inf). Farther from +-1 the factor is kept however small (a nearly
// saturated score still has its gradient). p is overwritten with U (+inf where P = 0, -inf
// where the mask hides the pair: hidden_pair).
template <int MT, int N, class Lse>
__device__ __forceinline__ void softcap_grad(float (&ds)[MT][N / 8][4], float (&p)[MT][N / 8][4], const ScoreMod& m,
                                             int64_t row0, int64_t col0, bool rows_are_queries, Lse&& lse_of) {
  for_each_pair<MT, N>(p, row0, col0, rows_are_queries, [&](float& x, int64_t i, int64_t j, int slot, int col) {
    if (!(x > 0.f)) {
      x = is_masked_p(x) ? -INFINITY : INFINITY;
      return;
    }
    const float lse = lse_of(slot, col);
    const float b = m.bias_kind == kBiasPost ? bias_at(m, i, j) : 0.f;
    const int64_t d = i + m.shift - j;
    const float dist = m.slope != 0.f ? m.slope * float(d < 0 ? -d : d) : 0.f;
    const float u = lse + __logf(x) - b + dist;
    x = u;
    if (!(u > -INFINITY && u < INFINITY)) return;
    const float th = fminf(fmaxf(u * m.inv_cap, -1.f), 1.f);
    const float err = kTakenBackErr * (fabsf(lse) + fabsf(u) + fabsf(b) + fabsf(dist) + 1.f) * m.inv_cap;
    ds[slot >> 1][col >> 3][2 * (slot & 1) + (col & 1)] *= fabsf(th) > 1.f - err ? 0.f : 1.f - th * th;
  });
}

// The backward's modifiers on dS (= dL, from ds_cols / ds_rows), P (`p`, which they
// overwrite) recomputed in the same fragment layout: dBias = dL (post_scale) or scale dT
// (pre_scale) where the pass writes dBias, and dL -> dT with a softcap. `_cols` (the dK/dV
// passes, which alone write dBias): rows are keys key0 + 16 mt + g (+8), columns queries q0 +
// 8 n + 2 t (+1) whose LSE (as stored) is lse[8 n + 2 t (+1)] in shared memory; `_rows` (the
// dQ pass: the softcap only): rows are queries row0 + ..., their lse_for_p values in
// registers, columns keys col0 + ....
template <int MT, int NT>
__device__ __forceinline__ void score_grad_cols(float (&ds)[MT][NT][4], float (&p)[MT][NT][4], const float* lse,
                                                const ScoreMod& m, int64_t key0, int64_t q0) {
  constexpr int N = NT * 8;
  const bool dbias = m.writes_dbias();
  if (dbias && m.bias_kind == kBiasPost) put_dbias<MT, N>(ds, p, m, key0, q0, false, 1.f);
  if (m.cap > 0.f) softcap_grad<MT, N>(ds, p, m, key0, q0, false, [&](int, int col) { return lse_for_p(lse[col]); });
  if (dbias && m.bias_kind == kBiasPre) put_dbias<MT, N>(ds, p, m, key0, q0, false, m.scale);
}
template <int MT, int NT>
__device__ __forceinline__ void score_grad_rows(float (&ds)[MT][NT][4], float (&p)[MT][NT][4],
                                                const float (&lse)[MT][2], const ScoreMod& m, int64_t row0,
                                                int64_t col0) {
  if (m.cap > 0.f)
    softcap_grad<MT, NT * 8>(ds, p, m, row0, col0, true, [&](int slot, int) { return lse[slot >> 1][slot & 1]; });
}

// The max-logit output: atomically *dst = max(*dst, x) for a finite or infinite x (never NaN)
// on fp32 bits: non-negative floats order as signed ints, negative ones in reverse as
// unsigned ints. *dst starts at -inf (launch_init_max_logit).
__device__ __forceinline__ void atomic_max_float(float* dst, float x) {
  if (!signbit(x))
    atomicMax(reinterpret_cast<int*>(dst), __float_as_int(x));
  else
    atomicMin(reinterpret_cast<unsigned*>(dst), __float_as_uint(x));
}

// The forward's max-logit contribution of a warp's rows row0 + 16 mt + g (+8), those below
// r1: row_max holds each row's max L over its visible keys (-inf: none; NaN never, fmaxf skips
// it), reduced over the warp, then one atomic max into max_logit[batch, head].
template <int MT>
__device__ __forceinline__ void record_max_logit(const KernelParams& kp, int64_t batch, int64_t head, int64_t row0,
                                                 int64_t r1, const float (&row_max)[MT][2]) {
  const int g = (threadIdx.x & 31) >> 2;
  float m = -INFINITY;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (row0 + mt * 16 + g + 8 * h < r1) m = fmaxf(m, row_max[mt][h]);
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if ((threadIdx.x & 31) == 0 && m != -INFINITY)
    atomic_max_float(kp.f.max_logit + batch * kp.f.max_logit_sb + head * kp.f.max_logit_sh, m);
}

// The sink of query head `head` joins the denominator of a warp's rows row0 + 16 mt + g (+8)
// (row_max: their max L, natural units; row_sum: each thread's part of l, relative to it):
// m' = max(m, sink), O and l scaled by e^(m - m') (0 when m = -inf: no visible logit is
// finite), one thread of each row's quad adds e^(sink - m'). Rows the mask leaves no key keep
// their "no key" answer (l = 0; store_o_lse). store_o_lse then stores O / l' and
// LSE = m' + ln l'.
template <int MT, int D>
__device__ __forceinline__ void join_sink(const KernelParams& kp, const MaskRule& mask, int64_t head, int64_t row0,
                                          float (&o_acc)[MT][D / 8][4], float (&row_max)[MT][2],
                                          float (&row_sum)[MT][2]) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const float sink = kp.f.sinks[head * kp.f.sinks_sh];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + mt * 16 + g + 8 * h;
      if (mask.key_end(row) <= mask.key_begin(row)) continue;
      const float m = row_max[mt][h];
      const float mm = fmaxf(m, sink);
      const float keep = m == -INFINITY ? 0.f : exp2f(mul_rn(sub_rn(m, mm), kLog2e));
      row_sum[mt][h] = row_sum[mt][h] * keep + (t == 0 ? exp2f(mul_rn(sub_rn(sink, mm), kLog2e)) : 0.f);
      row_max[mt][h] = mm;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o_acc[mt][n][2 * h] *= keep;
        o_acc[mt][n][2 * h + 1] *= keep;
      }
    }
}

}  // namespace strideattn::cuda_impl
