// The softmax in base 2, the pieces every mainloop calls: the scaled exponent, the forward's
// online softmax step (running row max and sum, rescale of O), and the backward's P and dS
// recomputed from the scores with the saved LSE (one base for it: see lse_log2).
#pragma once

#include <cmath>

#include "backends/cuda/common/kernel_params.hpp"

namespace strideattn::cuda_impl {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;
// scaled_log2 (outer_accumulator.cuh): x * scale_log2 rounded to fp32 on its own, never
// fused into a following add: the exponent of P is then round(S c) - round(m c), exactly 0
// for the row's max (P = 1, exact in f16 and bf16 too, so a one-hot row is exact) and never
// positive. With an FMA the exact product meets the rounded max: at |S c| ~ 1e6 the max's P
// is off by a few percent once rounded to T, and at |S c| ~ 1e31 the exponent is +-1e24,
// P = inf and the row NaN.

// The online softmax's exponent scaling, rounded on its own (sm80/forward.cuh says why).
__device__ __forceinline__ float scaled_log2(float x, float scale_log2) { return __fmul_rn(x, scale_log2); }

// One key block of the online softmax for a warp's rows (16 * MT of them; S and O in the
// m16n8k16 C layout, rows g and g + 8 of each m-tile): S becomes P, and l and, where the
// row max rises, O are updated. With m the running row max (raw units) and c = scale_log2:
// P = 2^(round(S c) - round(m c)) (scaled_log2), l = rowsum P; when the block max exceeds m,
// m is raised to it and O and l are rescaled by 2^(round(m_old c) - round(m_new c)). The
// row's max has P = 1 exactly, which keeps large logits exact where the answer is one-hot
// (a lazily raised reference max, P up to 2^8, loses that: its P is rounded to T for P V
// while l sums the unrounded value). Blocks where no row of the warp raises its max skip the
// rescale of O. Masked entries of S are -inf (P = 0); the scale is applied inside the
// exponent (the validation guarantees scale > 0, so the max of S is the max of scale * S).
// A NaN score makes P, l and so the row's O and LSE NaN (fmaxf skips NaN in the max).
// Shared by the mma.sync and the sm_90a wgmma forward.
template <int MT, int Bc, int D>
__device__ __forceinline__ void online_softmax_step(float (&s)[MT][Bc / 8][4], float (&o_acc)[MT][D / 8][4],
                                                    float (&row_max)[MT][2], float (&row_sum)[MT][2],
                                                    float scale_log2) {
  float alpha[MT][2];
  bool raised = false;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < Bc / 8; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * h], s[mt][n][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_old = row_max[mt][h];
      const bool raise = mx > m_old;
      // 0 when m_old = -inf
      alpha[mt][h] = raise ? exp2f(scaled_log2(m_old, scale_log2) - scaled_log2(mx, scale_log2)) : 1.f;
      raised |= raise;
      if (raise) row_max[mt][h] = mx;
      // a row with nothing visible yet keeps m = -inf; its reference point is 0
      const float m_ref = row_max[mt][h] == -INFINITY ? 0.f : scaled_log2(row_max[mt][h], scale_log2);
      row_sum[mt][h] *= alpha[mt][h];
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < Bc / 8; ++n) {
        s[mt][n][2 * h] = exp2f(scaled_log2(s[mt][n][2 * h], scale_log2) - m_ref);
        s[mt][n][2 * h + 1] = exp2f(scaled_log2(s[mt][n][2 * h + 1], scale_log2) - m_ref);
        sum += s[mt][n][2 * h] + s[mt][n][2 * h + 1];
      }
      row_sum[mt][h] += sum;
    }
  // rescale O
  if (__any_sync(0xffffffffu, raised)) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_acc[mt][n][e] *= alpha[mt][e >> 1];
  }
}

// ------------------------------------------------------------------ backward

// The LSE in one base inside the kernels: natural log wherever it is stored (the API's LSE,
// written by the forward epilogue, and the shared-memory copies of the dK/dV passes, which
// cp.async moves unchanged from global memory), base 2 in registers, converted by lse_log2
// where a kernel loads it, because the softmax runs in base 2 (P = 2^(S c - LSE_2), one
// FFMA and one MUFU.EX2 per score). Rows that saw no key (LSE = -inf) and rows past the
// sequence end (stored as -inf) give +inf, so P = 2^(S c - LSE_2) is exactly 0 there.
__device__ __forceinline__ float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

// The backward's P and dS, recomputed from the scores of a fragment in the m16n8k16 C layout
// (MT m-tiles x NT n8 tiles; rows g and g + 8, columns 8 n + 2 t and + 1 of each):
//   P = 2^(S * scale_log2 - LSE_2)     (the forward's softmax, from its saved LSE)
//   dS = P * (dP - delta)               (delta = rowsum(dO * O), the softmax's backward)
// with the row values (LSE, delta) of each query, which is a column of S^T in the dK/dV
// passes (`_cols`: read from shared memory, natural-log LSE, two columns per 8-byte load)
// and a row of S in the dQ pass (`_rows`: in registers, LSE already base 2). The mask is
// applied to P after the recompute (common/mask.cuh); dS of a masked entry is then 0.
template <int MT, int NT>
__device__ __forceinline__ void recompute_p_cols(float (&s)[MT][NT][4], const float* lse, float scale_log2) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const float2 l = *reinterpret_cast<const float2*>(lse + n * 8 + 2 * t);
    const float l0 = lse_log2(l.x), l1 = lse_log2(l.y);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][n][e] = exp2f(s[mt][n][e] * scale_log2 - ((e & 1) ? l1 : l0));
  }
}
template <int MT, int NT>
__device__ __forceinline__ void ds_cols(float (&dp)[MT][NT][4], const float (&p)[MT][NT][4], const float* delta) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const float2 dl = *reinterpret_cast<const float2*>(delta + n * 8 + 2 * t);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[mt][n][e] = p[mt][n][e] * (dp[mt][n][e] - ((e & 1) ? dl.y : dl.x));
  }
}
template <int MT, int NT>
__device__ __forceinline__ void recompute_p_rows(float (&s)[MT][NT][4], const float (&lse2)[MT][2], float scale_log2) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][n][e] = exp2f(s[mt][n][e] * scale_log2 - lse2[mt][e >> 1]);
}
template <int MT, int NT>
__device__ __forceinline__ void ds_rows(float (&dp)[MT][NT][4], const float (&p)[MT][NT][4],
                                        const float (&delta)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[mt][n][e] = p[mt][n][e] * (dp[mt][n][e] - delta[mt][e >> 1]);
}

}  // namespace strideattn::cuda_impl
