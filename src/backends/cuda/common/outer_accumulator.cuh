// Blocked accumulation of the forward over long key ranges: the O and l of a warp's rows are
// accumulated in registers for kFoldKeys keys at a time and then folded into a second-level
// fp32 accumulator in global memory (the warp's slot), so each element's sum over n keys is a
// sum of n / kFoldKeys block sums instead of n / Bc sequential adds into one register: the
// rounding error grows like kFoldKeys / Bc + n / kFoldKeys additions, not n / Bc (with K and V
// one row repeated over 2^23 keys the single accumulator is off by 9% in bf16).
//
// Slots: the host sizes a pool of at least as many warp slots as warps of the kernel can be
// resident on the GPU at once (forward_resident_warps); a warp whose row block sees more than
// kFoldKeys keys claims a free slot at its start (atomicCAS on a flag) and releases it at the
// end, so the pool never runs dry and its size does not grow with the problem. Element e of
// the warp's register fragment lives at slot[e * 32 + lane]: coalesced, owned by one thread.
#pragma once

#include <cstdint>

#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/softmax.cuh"

namespace strideattn::cuda_impl {

template <int MT, int D>
struct OuterAccumulator {
  float* slot = nullptr;  // this warp's slot; nullptr: the keys are short, nothing to fold
  int index = -1;
  bool filled = false;
  float max[MT][2], sum[MT][2];  // m at the last fold and the folded l (per-thread partial)

  // Claims a slot when this warp's rows see more than kFoldKeys keys (`keys`: an upper
  // bound on that count, the same for every lane).
  __device__ __forceinline__ void claim(const KernelParams& kp, int64_t keys, int warp_id) {
    if (kp.outer_count == 0 || keys <= kFoldKeys) return;
    const int lane = threadIdx.x & 31;
    int i = 0;
    if (lane == 0) {
      i = int(uint32_t(warp_id) % uint32_t(kp.outer_count));
      while (atomicCAS(&kp.outer_flags[i], 0, 1) != 0) i = i + 1 == kp.outer_count ? 0 : i + 1;
    }
    index = __shfl_sync(0xffffffffu, i, 0);
    slot = kp.outer_slots + int64_t(index) * (16 * MT * D);
  }

  // o, l (and their max m) -> the slot; o and l start again from 0 against the same m.
  __device__ __forceinline__ void fold(float (&o)[MT][D / 8][4], const float (&row_max)[MT][2], float (&row_sum)[MT][2],
                                       float scale_log2) {
    const int lane = threadIdx.x & 31;
    float beta[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m = row_max[mt][h];
        beta[mt][h] =
            !filled || m == -INFINITY ? 0.f : exp2f(scaled_log2(max[mt][h], scale_log2) - scaled_log2(m, scale_log2));
        sum[mt][h] = filled ? sum[mt][h] * beta[mt][h] + row_sum[mt][h] : row_sum[mt][h];
        max[mt][h] = m;
        row_sum[mt][h] = 0.f;
      }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float* at = slot + ((mt * (D / 8) + n) * 4 + e) * 32 + lane;
          *at = filled ? *at * beta[mt][e >> 1] + o[mt][n][e] : o[mt][n][e];
          o[mt][n][e] = 0.f;
        }
    filled = true;
  }

  // The folded blocks back into o and l (against the final m), and the slot released.
  __device__ __forceinline__ void merge_and_release(const KernelParams& kp, float (&o)[MT][D / 8][4],
                                                    const float (&row_max)[MT][2], float (&row_sum)[MT][2],
                                                    float scale_log2) {
    if (slot == nullptr) return;
    const int lane = threadIdx.x & 31;
    if (filled) {
      float beta[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float m = row_max[mt][h];
          beta[mt][h] = m == -INFINITY ? 0.f : exp2f(scaled_log2(max[mt][h], scale_log2) - scaled_log2(m, scale_log2));
          row_sum[mt][h] += sum[mt][h] * beta[mt][h];
        }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][n][e] += slot[((mt * (D / 8) + n) * 4 + e) * 32 + lane] * beta[mt][e >> 1];
    }
    __syncwarp();
    if (lane == 0) {
      __threadfence();
      atomicExch(&kp.outer_flags[index], 0);
    }
  }
};

}  // namespace strideattn::cuda_impl
