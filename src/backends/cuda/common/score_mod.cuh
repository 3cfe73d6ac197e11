// The training features as the kernels' feature variant (Variant::mods) applies them
// (docs/semantics.md "Training features"), written once for the mma.sync and the wgmma
// kernels, forward and backward:
//   - the logit of a pair from its raw dot product S = q.k (score_mod): T = scale S,
//     U = c tanh(T / c) with a softcap, L = U - slope |i + s_kv - s_q - j| with ALiBi;
//   - the sink joining a row's softmax denominator at the end of the forward (join_sink);
//   - the max-logit output (record_max_logit: a warp's max, one float atomic max);
//   - the backward's dL -> dT, times the softcap's derivative 1 - tanh^2 (softcap_grad_*),
//     with tanh taken back from the recomputed P and the row's LSE: L = LSE + ln P, so no
//     fragment of tanh values stays in registers across the dP GEMM (one did: 592 bytes of
//     spills in the wgmma dK/dV pass at d 64).
// The feature variant takes L in natural units: its softmax runs with scale 1 (scale_log2 =
// log2 e), its LSE is round(m) + ln l and its backward's P is exp(L - LSE), so the plain
// kernels' code (softmax.cuh, epilogue.cuh) runs unchanged on L.
#pragma once

#include <cmath>

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

// The score modifiers of one (sequence, query head): every kernel builds one where it knows
// the pair's head (a dK/dV pass: per iteration of its GQA loop).
struct ScoreMod {
  float scale = 1.f;               // the softmax scale
  float cap = 0.f, inv_cap = 0.f;  // softcap c and 1 / c; 0: off
  float slope = 0.f;               // ALiBi slope of (sequence, head); 0 without ALiBi
  int64_t shift = 0;               // s_kv - s_q of the sequence (ALiBi's diagonal)

  __device__ __forceinline__ static ScoreMod of(const KernelParams& kp, const MaskRule& m, int64_t batch,
                                                int64_t head) {
    const FeatureParams& f = kp.f;
    ScoreMod s;
    s.scale = kp.p.scale;
    s.cap = f.softcap;
    s.inv_cap = f.softcap > 0.f ? 1.f / f.softcap : 0.f;
    s.slope = f.alibi != nullptr ? f.alibi[batch * f.alibi_sb + head * f.alibi_sh] : 0.f;
    s.shift = m.shift();
    return s;
  }

  // ALiBi's distance of query i and key j, |i + s_kv - s_q - j| (exact in fp32 below 2^24).
  __device__ __forceinline__ float distance(int64_t i, int64_t j) const {
    const int64_t d = i + shift - j;
    return float(d < 0 ? -d : d);
  }

  // L of the raw score s of query i and key j.
  __device__ __forceinline__ float logit(float s, int64_t i, int64_t j) const {
    float t = __fmul_rn(s, scale);
    if (cap > 0.f) t = cap * tanh_full(t * inv_cap);
    if (slope != 0.f) t -= slope * distance(i, j);
    return t;
  }

  // The softcap's derivative dL/dT = 1 - tanh^2 at a pair of query i and key j whose
  // recomputed P is > 0, from P and the row's LSE: L = LSE + ln P, U = L + slope |...| (the
  // terms after the softcap taken back), tanh = U / c. Its absolute error is a few 1e-5 / c
  // (the LSE's ulp and ln's), on a factor in [0, 1] of a dS that is rounded to T anyway.
  __device__ __forceinline__ float softcap_derivative(float p, float lse, int64_t i, int64_t j) const {
    float u = lse + __logf(p);
    if (slope != 0.f) u += slope * distance(i, j);
    const float th = fminf(fmaxf(u * inv_cap, -1.f), 1.f);
    return 1.f - th * th;
  }
};

// c (a warp's C[MT][N/8][4] fragment of raw scores, rows row0 + 16 mt + g (+8), columns
// col0 + 8 n + 2 t (+1); rows are queries or keys: `rows_are_queries`) becomes L. Masking
// comes after (mask.cuh).
template <int MT, int N>
__device__ __forceinline__ void score_mod(float (&c)[MT][N / 8][4], const ScoreMod& m, int64_t row0, int64_t col0,
                                          bool rows_are_queries) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = row0 + mt * 16 + g + 8 * half;
#pragma unroll
      for (int n = 0; n < N / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t x = col0 + n * 8 + 2 * t + e;
          const int k = 2 * half + e;
          c[mt][n][k] = rows_are_queries ? m.logit(c[mt][n][k], r, x) : m.logit(c[mt][n][k], x, r);
        }
    }
}

// The backward's dL -> dT with a softcap: the dS (= dL) entries whose P is > 0 times the
// softcap's derivative (entries with P = 0, masked ones included, have dS = 0 or NaN from dP
// and stay so). Fragments in the m16n8k16 C layout as recompute_p_cols / _rows take them:
// `_cols`: rows are keys key0 + 16 mt + g (+8), columns queries q0 + 8 n + 2 t (+1) whose
// LSE (as stored) is lse[8 n + 2 t (+1)] in shared memory; `_rows`: rows are queries row0 +
// ..., with their lse_for_p values in registers, columns keys col0 + ....
template <int MT, int NT>
__device__ __forceinline__ void softcap_grad_cols(float (&ds)[MT][NT][4], const float (&p)[MT][NT][4], const float* lse,
                                                  const ScoreMod& m, int64_t key0, int64_t q0) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const float2 l = *reinterpret_cast<const float2*>(lse + n * 8 + 2 * t);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = p[mt][n][e];
        if (pe > 0.f)
          ds[mt][n][e] *= m.softcap_derivative(pe, lse_for_p((e & 1) ? l.y : l.x), q0 + n * 8 + 2 * t + (e & 1),
                                               key0 + mt * 16 + g + 8 * (e >> 1));
      }
  }
}
template <int MT, int NT>
__device__ __forceinline__ void softcap_grad_rows(float (&ds)[MT][NT][4], const float (&p)[MT][NT][4],
                                                  const float (&lse)[MT][2], const ScoreMod& m, int64_t row0,
                                                  int64_t col0) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = p[mt][n][e];
        if (pe > 0.f)
          ds[mt][n][e] *= m.softcap_derivative(pe, lse[mt][e >> 1], row0 + mt * 16 + g + 8 * (e >> 1),
                                               col0 + n * 8 + 2 * t + (e & 1));
      }
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
