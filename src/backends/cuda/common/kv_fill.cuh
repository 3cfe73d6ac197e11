// The pieces the dense forwards' KvCache instantiations add for a KV-cache call
// (KernelParams::kv): the K and V rows of a sequence, through the block table for a paged
// cache or the cache's own strides for a contiguous one, and the rows a query block writes
// without computing them (past the sequence's seqlens_q: O = 0, LSE = -inf; every row of a
// broken sequence: NaN).
#pragma once

#include <cmath>

#include "backends/cuda/common/element.cuh"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/query_block.cuh"
#include "backends/cuda/common/tensor_ref.hpp"

namespace strideattn::cuda_impl {

// A key row a paged loader may not read (its block-table entry is outside the pool): K gets
// NaN (0xffff is a NaN in f16 and bf16), so every row that sees the key gets NaN; V gets
// zeros, so rows that do not see it (P = 0) stay finite.
inline constexpr uint16_t kMissingK = 0xffffu, kMissingV = 0;

// Sequence `batch` of K or V at `data` (strides st, which must live as long as the ref: the
// kernel's parameters): the cache (KvCache) or the dense / varlen tensor.
template <bool KvCache>
__device__ __forceinline__ auto kv_rows(const KernelParams& kp, const void* data, const kernel::Strides& st,
                                        int64_t batch, uint16_t missing) {
  if constexpr (KvCache)
    return cache_ref(data, st, kp.kv, batch, missing);
  else
    return sequence_ref(data, st, kp.p.kv_seq, batch);
}

// Rows [w.fill_begin, w.fill_end) of `head` (nothing outside a KV-cache call): O and LSE of
// rows past seqlens_q (0, -inf), or of a broken sequence (NaN, NaN). All threads of the CTA.
template <class T>
__device__ __forceinline__ void fill_rows(const KernelParams& kp, const QueryBlockWork& w, int64_t head,
                                          const TensorRef<uint16_t>& o) {
  const kernel::AttentionParams& p = kp.p;
  const int64_t d_v = p.d_v, n = (w.fill_end - w.fill_begin) * d_v;
  const uint16_t value = w.fill_nan ? ElementTraits<T>::from_float(NAN) : uint16_t(0);
  const float lse = w.fill_nan ? NAN : -INFINITY;
  for (int64_t idx = threadIdx.x; idx < n; idx += blockDim.x) {
    const int64_t row = w.fill_begin + idx / d_v, col = idx % d_v;
    o.row(row, head)[col] = value;
    if (col == 0 && p.lse != nullptr) p.lse[kernel::lse_offset(p.q_seq, p.lse_st, w.batch, head, row)] = lse;
  }
}

}  // namespace strideattn::cuda_impl
