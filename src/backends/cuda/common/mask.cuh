// The mask applied to register fragments: entries of an S (queries x keys) or S^T (keys x
// queries) tile that the mask rule (src/common/attention_math.hpp) hides are set to a value
// (-inf before the softmax, kMaskedP = -0 in a recomputed P).
#pragma once

#include <cstdint>

#include "backends/cuda/common/kernel_params.hpp"

namespace strideattn::cuda_impl {

// A recomputed P that the mask hides is -0, a value exp() never returns: dS = P (dP - D) is
// then 0 for it whatever dP holds, so a masked pair whose dP overflows fp32 (finite inputs of
// large magnitude) adds nothing, as the definition says, while a visible pair with P = 0 still
// propagates a NaN in dP.
constexpr float kMaskedP = -0.0f;
__device__ __forceinline__ bool is_masked_p(float p) { return __float_as_uint(p) == 0x80000000u; }

// Set masked entries of a warp's C[MT][N/8][4] tile to `masked_value`: rows are
// row0 + 16 * mt + g (+8) and columns col0 + 8 * n + 2t (+1), each side either queries or
// keys (`rows_are_queries`). Visibility is MaskRule::visible, the rule the reference uses.
template <int MT, int N>
__device__ __forceinline__ void apply_mask(float (&c)[MT][N / 8][4], const MaskRule& m, int64_t row0, int64_t col0,
                                           bool rows_are_queries, float masked_value) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = row0 + mt * 16 + g + 8 * half;
      if (rows_are_queries) {
        const int64_t kb = m.key_begin(r), ke = m.key_end(r);
#pragma unroll
        for (int n = 0; n < N / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int64_t j = col0 + n * 8 + 2 * t + e;
            if (j < kb || j >= ke) c[mt][n][2 * half + e] = masked_value;
          }
      } else {
#pragma unroll
        for (int n = 0; n < N / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int64_t i = col0 + n * 8 + 2 * t + e;
            if (!m.visible(i, r)) c[mt][n][2 * half + e] = masked_value;
          }
      }
    }
}

// Zero the entries of a warp's slice of P^T (keys key0 + g (+8) as rows, queries r0 + 8 n +
// 2 t (+1) as columns) that the mask hides, keys past s_kv included: one query interval per
// key (kernel::queries_seeing_key), then 32-bit compares. (apply_mask's per-element 64-bit
// rule over 64 columns x 2 rows made ptxas spill 376 bytes at Br 128.)
template <int NT>
__device__ __forceinline__ void mask_key_rows(float (&c)[NT][4], const MaskRule& m, int64_t key0, int64_t r0) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const TileRange q = kernel::queries_seeing_key(m, key0 + g + 8 * h);
    const int lo = int(kernel::min64(kernel::max64(q.begin - r0, 0), NT * 8));
    const int hi = int(kernel::min64(kernel::max64(q.end - r0, 0), NT * 8));
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = n * 8 + 2 * t + e;
        if (col < lo || col >= hi) c[n][2 * h + e] = kMaskedP;
      }
  }
}

}  // namespace strideattn::cuda_impl
