// The combine of a split KV-cache call: O and LSE of every row [b, h, s_q] from the splits'
// fp32 partial rows (split_kernel.cuh), weighted by their LSEs: with M the largest partial LSE,
// w_s = exp(lse_s - M), O = sum_s w_s O_s / sum_s w_s and LSE = M + log sum_s w_s. One warp per
// row; the sums run in split order (the weights' sum as a fixed shuffle tree), so the result is
// deterministic. Rows past seqlens_q, rows of a sequence with nothing to attend and rows whose
// mask leaves no key get O = 0, LSE = -inf; a NaN partial (a NaN score, an invalid page) or a
// row that sees keys but sums to 0 gives NaN, as does every row of a sequence whose lengths
// break the caller's promises.
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/cuda/common/element.cuh"
#include "backends/cuda/decode/decode_params.hpp"
#include "backends/cuda/decode/decode_tiles.hpp"

namespace strideattn::cuda_impl {

template <class T>
__global__ void __launch_bounds__(kDecodeThreads) decode_combine_kernel(const DecodeParams p) {
  __shared__ float weight[kDecodeWarps][kDecodeMaxSplits];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t total = p.batch * p.heads * p.s_q;
  for (std::int64_t row = std::int64_t(blockIdx.x) * kDecodeWarps + warp; row < total;
       row += std::int64_t(gridDim.x) * kDecodeWarps) {
    const std::int64_t i = row % p.s_q, nh = row / p.s_q, head = nh % p.heads, n = nh / p.heads;
    const SeqLengths len = seq_lengths(p, n);
    std::uint16_t* const out = static_cast<std::uint16_t*>(p.o) + n * p.o_st.b + i * p.o_st.s + head * p.o_st.h;
    float fill = 0.f, lse = -INFINITY;  // the row's O value and LSE when it is not a weighted sum
    bool sum = false;
    float total_w = 0.f;
    if (len.broken) {
      fill = lse = NAN;
    } else if (i < len.q_rows) {
      float mx = -INFINITY;
      bool nan = false;
      for (int s = lane; s < p.splits; s += 32) {
        const float x = p.part_lse[s * total + row];
        nan |= isnan(x);
        mx = fmaxf(mx, x);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      nan = __any_sync(0xffffffffu, nan);
      if (nan) {
        fill = lse = NAN;
      } else if (mx == -INFINITY) {
        const kernel::MaskRule m = seq_mask(p, len);
        if (m.key_end(i) > m.key_begin(i)) fill = lse = NAN;  // sees keys, every score -inf
      } else {
        for (int s = lane; s < p.splits; s += 32) {
          const float w = expf(p.part_lse[s * total + row] - mx);
          weight[warp][s] = w;
          total_w += w;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) total_w += __shfl_xor_sync(0xffffffffu, total_w, off);
        lse = mx + logf(total_w);
        sum = true;
      }
    }
    __syncwarp();
    for (std::int64_t c = lane; c < p.d_v; c += 32) {
      float x = fill;
      if (sum) {
        float acc = 0.f;
        for (int s = 0; s < p.splits; ++s) acc += weight[warp][s] * p.part_o[(s * total + row) * p.d_v + c];
        x = acc / total_w;
      }
      out[c] = ElementTraits<T>::from_float(x);
    }
    if (lane == 0 && p.lse != nullptr) p.lse[n * p.lse_st.b + head * p.lse_st.h + i * p.lse_st.s] = lse;
    __syncwarp();
  }
}

}  // namespace strideattn::cuda_impl
