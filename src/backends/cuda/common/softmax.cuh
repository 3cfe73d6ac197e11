// The softmax in base 2: the scaled exponent, the forward's online softmax step (running
// row max and sum, rescale of O), and the log-sum-exp as the backward consumes it.
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

// Scaled log-sum-exp in base 2 as the kernels consume it: rows that saw no key (LSE = -inf)
// and rows past the sequence end give +inf, so P = 2^(S - LSE) is exactly 0 there.
__device__ __forceinline__ float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

}  // namespace strideattn::cuda_impl
