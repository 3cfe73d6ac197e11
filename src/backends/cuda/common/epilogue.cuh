// The stores at the end of each pass: O and LSE (forward), dQ (the dQ pass), dK and dV or
// their fp32 partials (dK/dV pass), the 2-float atomic add of the single-pass dQ, and the
// folds of the backward over long ranges (kernel_params.hpp, kv_fold_blocks).
#pragma once

#include <cmath>

#include "backends/cuda/common/element.cuh"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/softmax.cuh"
#include "backends/cuda/common/tensor_ref.hpp"

namespace strideattn::cuda_impl {

// The forward epilogue for a warp's rows row0 + 16 * mt + g (+8) (those below r1): O / l
// (its first d_v columns) stored through O's strides (o: the sequence's O),
// LSE = round(m * scale) + log l (natural log; m the raw row max): the score of the row's max
// rounded on its own (common/lse.hpp), as the backward rounds every score (recompute_p), so a
// row with l = 1 stores exactly its max score and the backward's P of it is exp(0) = 1. Rows
// whose mask leaves no key visible get O = 0, LSE = -inf; a row that sees keys but has no
// positive l (NaN scores, or every score -inf) gets NaN, as the definition does (0 / 0).
// Mods: the feature variant's row_max is a logit L, already scaled (score_mod.cuh). KvCache:
// the mask of a KV-cache call's lengths (kernel_params.hpp, mask_of).
template <class T, int MT, int D, bool Mods = false, bool KvCache = false>
__device__ __forceinline__ void store_o_lse(const KernelParams& kp, int64_t batch, int64_t head, int64_t row0,
                                            int64_t r1, int d_v, const TensorRef<uint16_t>& o,
                                            const float (&o_acc)[MT][D / 8][4], const float (&row_max)[MT][2],
                                            const float (&row_sum)[MT][2]) {
  const kernel::AttentionParams& p = kp.p;
  const int t = threadIdx.x & 3, g = (threadIdx.x & 31) >> 2;
  const bool o_pair = (kp.aligned & kPairO) != 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int64_t row = row0 + mt * 16 + g + 8 * h;
      if (row >= r1) continue;
      // l == 0: the row saw no key, or every score it saw was -inf (also by fp32 overflow):
      // NaN unless the mask leaves it no key (the mask rebuilt here, off the main loop's
      // registers); a NaN l gives NaN through 1 / l.
      const bool no_key = l == 0.f && [&] {
        const MaskRule m = mask_of<KvCache>(kp, batch);
        return m.key_end(row) <= m.key_begin(row);
      }();
      const float inv = no_key ? 0.f : 1.f / l;
      uint16_t* out = o.row(row, head);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int col = n * 8 + 2 * t;
        if (col < d_v) store_pair<T>(out, col, o_acc[mt][n][2 * h] * inv, o_acc[mt][n][2 * h + 1] * inv, o_pair);
      }
      if (p.lse != nullptr && t == 0)
        p.lse[kernel::lse_offset(p.q_seq, p.lse_st, batch, head, row)] =
            no_key     ? -INFINITY
            : l == 0.f ? NAN
                       : lse_of_row(row_max[mt][h], log2f(l), Mods ? 1.f : p.scale);
    }
}

// The dQ pass epilogue for a warp's rows row0 + 16 * mt + g (+8) (those below r1): dQ =
// scale * dq (its first d_qk columns), stored through dQ's strides.
template <class T, int MT, int D>
__device__ __forceinline__ void store_dq(const KernelParams& kp, int64_t batch, int64_t head, int64_t row0, int64_t r1,
                                         const float (&dq)[MT][D / 8][4]) {
  const kernel::AttentionParams& p = kp.p;
  const int t = threadIdx.x & 3, g = (threadIdx.x & 31) >> 2;
  const int d_qk = int(p.d_qk);
  const auto dq_ref = sequence_ref(p.dq, p.dq_st, p.q_seq, batch);
  const bool dq_pair = (kp.aligned & kPairDQ) != 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + mt * 16 + g + 8 * h;
      if (row >= r1) continue;
      uint16_t* out = dq_ref.row(row, head);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int col = n * 8 + 2 * t;
        if (col < d_qk) store_pair<T>(out, col, dq[mt][n][2 * h] * p.scale, dq[mt][n][2 * h + 1] * p.scale, dq_pair);
      }
    }
}

// The dQ pass's fold (kp.q_fold_blocks > 0): dq_accum rows row0 + 16 * mt + g (+8) (those
// below r1, which this CTA alone owns: plain loads and stores) += dq, and dq restarts from 0.
// The epilogue folds the last blocks the same way and launch_convert_dq stores dQ.
template <int MT, int D>
__device__ __forceinline__ void fold_dq(const KernelParams& kp, int64_t batch, int64_t head, int64_t row0, int64_t r1,
                                        float (&dq)[MT][D / 8][4]) {
  const int t = threadIdx.x & 3, g = (threadIdx.x & 31) >> 2;
  const int d_qk = int(kp.p.d_qk);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + mt * 16 + g + 8 * h;
      float2* const acc = reinterpret_cast<float2*>(kp.dq_accum + delta_index(kp, batch, head, row) * d_qk);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int col = n * 8 + 2 * t;
        if (row < r1 && col < d_qk) {
          float2 x = acc[col / 2];
          x.x += dq[mt][n][2 * h], x.y += dq[mt][n][2 * h + 1];
          acc[col / 2] = x;
        }
        dq[mt][n][2 * h] = dq[mt][n][2 * h + 1] = 0.f;
      }
    }
}

// dq_accum[row][col], [col + 1] += (x0, x1); col even, the row 8-byte aligned (d_qk % 8 == 0).
__device__ __forceinline__ void atomic_add_pair(float* dst, float x0, float x1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x0, x1));
#else
  atomicAdd(dst, x0);
  atomicAdd(dst + 1, x1);
#endif
}

// The dK/dV pass epilogue for one warp's accumulators dk, dv [MT][N/8][4]: rows (keys)
// key0 + 16 * mt + g (+8), those below c1 only; head-dim columns col0 + 8 * n + 2t (+1).
// One group split: dK * scale and dV, stored through their strides. Several, or the fold:
// fp32 partial rows (unscaled dK, dV) in split gsplit's plane (Fold: added to what the
// fold put there), which launch_reduce_dkv sums.
// The dK/dV passes' fold (kp.kv_fold_blocks > 0, dkv_partial set and zeroed): this warp's
// partial rows (plane gsplit, owned by this thread alone: plain loads and stores) += dk, dv,
// and dk, dv restart from 0. store_dk_dv<..., Fold = true> adds the last blocks the same way.
__device__ __forceinline__ float2* partial_k_row(const KernelParams& kp, int gsplit, int64_t row) {
  return reinterpret_cast<float2*>(kp.dkv_partial + (int64_t(gsplit) * kp.partial_rows + row) * kp.p.d_qk);
}
__device__ __forceinline__ float2* partial_v_row(const KernelParams& kp, int gsplit, int64_t row) {
  return reinterpret_cast<float2*>(kp.dkv_partial + int64_t(kp.group_splits) * kp.partial_rows * kp.p.d_qk +
                                   (int64_t(gsplit) * kp.partial_rows + row) * kp.p.d_v);
}
__device__ __forceinline__ void add_pair(float2* dst, float x0, float x1) {
  float2 x = *dst;
  x.x += x0, x.y += x1;
  *dst = x;
}

template <int MT, int N>
__device__ __forceinline__ void fold_dk_dv(const KernelParams& kp, int64_t batch, int64_t kv_head, int gsplit,
                                           int64_t key0, int64_t c1, int col0, float (&dk)[MT][N / 8][4],
                                           float (&dv)[MT][N / 8][4]) {
  const int d_qk = int(kp.p.d_qk), d_v = int(kp.p.d_v);
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t key = key0 + mt * 16 + g + 8 * h;
      const int64_t row = kv_row_index(kp, batch, kv_head, key);
#pragma unroll
      for (int n = 0; n < N / 8; ++n) {
        const int col = col0 + n * 8 + 2 * t;
        if (key < c1 && col < d_qk)
          add_pair(partial_k_row(kp, gsplit, row) + col / 2, dk[mt][n][2 * h], dk[mt][n][2 * h + 1]);
        if (key < c1 && col < d_v)
          add_pair(partial_v_row(kp, gsplit, row) + col / 2, dv[mt][n][2 * h], dv[mt][n][2 * h + 1]);
        dk[mt][n][2 * h] = dk[mt][n][2 * h + 1] = dv[mt][n][2 * h] = dv[mt][n][2 * h + 1] = 0.f;
      }
    }
}

template <class T, int MT, int N, bool Fold = false>
__device__ __forceinline__ void store_dk_dv(const KernelParams& kp, int64_t batch, int64_t kv_head, int gsplit,
                                            int64_t key0, int64_t c1, int col0, const float (&dk)[MT][N / 8][4],
                                            const float (&dv)[MT][N / 8][4]) {
  const kernel::AttentionParams& p = kp.p;
  const int d_qk = int(p.d_qk), d_v = int(p.d_v);
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const bool partial = kp.dkv_partial != nullptr;
  const auto dk_ref = sequence_ref(p.dk, p.dk_st, p.kv_seq, batch),
             dv_ref = sequence_ref(p.dv, p.dv_st, p.kv_seq, batch);
  const bool dk_pair = (kp.aligned & kPairDK) != 0, dv_pair = (kp.aligned & kPairDV) != 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t key = key0 + mt * 16 + g + 8 * h;
      if (key >= c1) continue;
      if (partial) {
        const int64_t row = kv_row_index(kp, batch, kv_head, key);
        float2 *const pk = partial_k_row(kp, gsplit, row), *const pv = partial_v_row(kp, gsplit, row);
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
          const int col = col0 + n * 8 + 2 * t;  // even; d_qk, d_v are multiples of 8
          if constexpr (Fold) {
            if (col < d_qk) add_pair(pk + col / 2, dk[mt][n][2 * h], dk[mt][n][2 * h + 1]);
            if (col < d_v) add_pair(pv + col / 2, dv[mt][n][2 * h], dv[mt][n][2 * h + 1]);
          } else {
            if (col < d_qk) pk[col / 2] = make_float2(dk[mt][n][2 * h], dk[mt][n][2 * h + 1]);
            if (col < d_v) pv[col / 2] = make_float2(dv[mt][n][2 * h], dv[mt][n][2 * h + 1]);
          }
        }
        continue;
      }
      uint16_t* dk_row = dk_ref.row(key, kv_head);
      uint16_t* dv_row = dv_ref.row(key, kv_head);
#pragma unroll
      for (int n = 0; n < N / 8; ++n) {
        const int col = col0 + n * 8 + 2 * t;
        if (col < d_qk) store_pair<T>(dk_row, col, dk[mt][n][2 * h] * p.scale, dk[mt][n][2 * h + 1] * p.scale, dk_pair);
        if (col < d_v) store_pair<T>(dv_row, col, dv[mt][n][2 * h], dv[mt][n][2 * h + 1], dv_pair);
      }
    }
}

}  // namespace strideattn::cuda_impl
