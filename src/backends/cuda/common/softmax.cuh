// The softmax, the pieces every mainloop calls: the scaled exponent, the forward's online
// softmax step in base 2 (running row max and sum, rescale of O), and the backward's P and dS
// recomputed from the scores with the saved natural-log LSE (see recompute_p).
#pragma once

#include <cmath>

#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/lse.hpp"
#include "backends/cuda/common/mask.cuh"

namespace strideattn::cuda_impl {
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
// Shared by the mma.sync and the sm_90a wgmma forwards (online_softmax_step, below: the two
// halves in order); the warp-specialized forward's overlapped consumers run them apart.

// The score half of online_softmax_step: S becomes P, m and l are updated, and alpha[mt][h]
// is the factor the row's O must be multiplied by (1 where m did not rise); returns whether
// any row of the warp rose. For a kernel whose O += P V of the previous block is still
// running while it computes this block's P (sm90/ws_forward.cuh): it applies rescale_o once
// that GEMM has completed.
template <int MT, int Bc>
__device__ __forceinline__ bool online_softmax_scores(float (&s)[MT][Bc / 8][4], float (&row_max)[MT][2],
                                                      float (&row_sum)[MT][2], float scale_log2,
                                                      float (&alpha)[MT][2]) {
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
  return __any_sync(0xffffffffu, raised);
}

// The O half: O's rows times alpha, skipped when no row of the warp rose (`raised`).
template <int MT, int D>
__device__ __forceinline__ void rescale_o(float (&o_acc)[MT][D / 8][4], const float (&alpha)[MT][2], bool raised) {
  if (raised) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_acc[mt][n][e] *= alpha[mt][e >> 1];
  }
}

template <int MT, int Bc, int D>
__device__ __forceinline__ void online_softmax_step(float (&s)[MT][Bc / 8][4], float (&o_acc)[MT][D / 8][4],
                                                    float (&row_max)[MT][2], float (&row_sum)[MT][2],
                                                    float scale_log2) {
  float alpha[MT][2];
  const bool raised = online_softmax_scores<MT, Bc>(s, row_max, row_sum, scale_log2, alpha);
  rescale_o<MT, D>(o_acc, alpha, raised);
}

// ------------------------------------------------------------------ backward

// The backward's P is the forward's softmax taken back from the saved LSE (docs/semantics.md,
// "Backward"): P = exp(round(S scale) - LSE), the score rounded to fp32 on its own and the
// difference taken in the LSE's own units (natural log), so the one rounding between the
// forward's softmax and this P is the LSE's. A one-hot row (l = 1) stores LSE = round(m scale)
// exactly (store_o_lse; common/lse.hpp, lse_of_row), so its max gets exp(0) = 1 at any
// magnitude. The exponent goes to base 2 only after the subtraction (p_exponent_log2), where
// its rounding is relative to the difference, not to the score.
//
// Base 2 before the subtraction is not exact: 2^(round(S c) - round(LSE log2 e)), c = scale
// log2 e, needs round(LSE log2 e) to give back the forward's round(m c), and a natural-log fp32
// LSE cannot carry every base-2 fp32 value (round(round(x ln 2) log2 e) != x, off by one ulp,
// for 17% of all finite fp32 x). It holds where the scale is a power of two (the values
// round(m c) are then images of round(. log2 e)); elsewhere (the default scale at d = 128, at
// any d not a power of 4) it fails on 12-17% of one-hot rows, P of the max being
// 2^(+-ulp(m c)): 0.5% off at |m c| ~ 1e5, 2x at 1e7, 0 or inf past 1e9. An FMA,
// fma(S, c, -LSE_2), adds the rounding of S c on top, on every row. Cost against that FMA: two
// instructions per score (FMUL, FADD, FMUL, MUFU.EX2 for FFMA, MUFU.EX2).

// A row's LSE as the backward uses it: natural log, as stored (the API's LSE, and the
// shared-memory copies of the dK/dV passes, which cp.async moves unchanged from global
// memory). Rows that saw no key (LSE = -inf) and rows past the sequence end (stored as -inf)
// give +inf, so P = exp(S scale - inf) is exactly 0 there.
__device__ __forceinline__ float lse_for_p(float lse) { return lse == -INFINITY ? INFINITY : lse; }

// P of one score s (raw units, scale not applied) against its row's lse_for_p value
// (common/lse.hpp: p_exponent_log2).
__device__ __forceinline__ float recompute_p(float s, float lse, float scale) {
  return exp2f(p_exponent_log2(s, lse, scale));
}

// The backward's P and dS, recomputed from the scores of a fragment in the m16n8k16 C layout
// (MT m-tiles x NT n8 tiles; rows g and g + 8, columns 8 n + 2 t and + 1 of each):
//   P = exp(round(S * scale) - LSE)     (the forward's softmax, from its saved LSE)
//   dS = P * (dP - delta)               (delta = rowsum(dO * O), the softmax's backward)
// with the row values (LSE, delta) of each query, which is a column of S^T in the dK/dV
// passes (`_cols`: read from shared memory, two columns per 8-byte load) and a row of S in
// the dQ pass (`_rows`: in registers, already through lse_for_p). The mask is applied to P
// after the recompute (common/mask.cuh); dS of a masked entry is then 0.
template <int MT, int NT>
__device__ __forceinline__ void recompute_p_cols(float (&s)[MT][NT][4], const float* lse, float scale) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const float2 l = *reinterpret_cast<const float2*>(lse + n * 8 + 2 * t);
    const float l0 = lse_for_p(l.x), l1 = lse_for_p(l.y);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][n][e] = recompute_p(s[mt][n][e], (e & 1) ? l1 : l0, scale);
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
      for (int e = 0; e < 4; ++e) {
        const float pe = p[mt][n][e];
        dp[mt][n][e] = is_masked_p(pe) ? 0.f : pe * (dp[mt][n][e] - ((e & 1) ? dl.y : dl.x));
      }
  }
}
template <int MT, int NT>
__device__ __forceinline__ void recompute_p_rows(float (&s)[MT][NT][4], const float (&lse)[MT][2], float scale) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][n][e] = recompute_p(s[mt][n][e], lse[mt][e >> 1], scale);
}
template <int MT, int NT>
__device__ __forceinline__ void ds_rows(float (&dp)[MT][NT][4], const float (&p)[MT][NT][4],
                                        const float (&delta)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = p[mt][n][e];
        dp[mt][n][e] = is_masked_p(pe) ? 0.f : pe * (dp[mt][n][e] - delta[mt][e >> 1]);
      }
}

}  // namespace strideattn::cuda_impl
