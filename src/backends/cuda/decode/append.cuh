// The append of a KV-cache call: new token t of sequence n (k_new / v_new [b, s_new, hg, d])
// into cache token cache_seqlens[n] + t, through the block table for a paged cache, before
// the attention kernels read the caches (the same stream orders them). Only those slots are
// written. A sequence whose lengths break the caller's promises (seq_lengths) appends nothing,
// and a token whose block-table entry is outside the cache's pages is not written (the
// attention then makes the sequence's rows NaN): never an out-of-bounds store.
#pragma once

#include <cstdint>

#include "backends/cuda/decode/decode_params.hpp"

namespace strideattn::cuda_impl {

// One CTA per (token, sequence) pair, grid-strided; its threads copy the hg * d_qk and
// hg * d_v elements (16-bit, element-wise: any strides, and the copy is small next to the
// attention's reads). T: the dtype (each dtype's translation unit has its own instance).
template <class T>
__global__ void __launch_bounds__(128) append_kernel(const DecodeParams p) {
  const std::int64_t pairs = p.batch * p.s_new;
  for (std::int64_t pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
    const std::int64_t n = pair / p.s_new, t = pair % p.s_new;
    if (seq_lengths(p, n).broken) continue;
    const std::int64_t tok = p.cache_seqlens[n] + t;
    const CacheSlot at = cache_slot(p, n, tok);
    if (at.row < 0) continue;
    auto copy = [&](void* cache, const kernel::Strides& cst, const void* fresh, const kernel::Strides& nst,
                    std::int64_t d) {
      std::uint16_t* dst = static_cast<std::uint16_t*>(cache) + at.row * cst.b + at.slot * cst.s;
      const std::uint16_t* src = static_cast<const std::uint16_t*>(fresh) + n * nst.b + t * nst.s;
      for (std::int64_t e = threadIdx.x; e < p.kv_heads * d; e += blockDim.x) {
        const std::int64_t h = e / d, c = e % d;
        dst[h * cst.h + c] = src[h * nst.h + c];
      }
    };
    copy(p.k, p.k_st, p.k_new, p.kn_st, p.d_qk);
    copy(p.v, p.v_st, p.v_new, p.vn_st, p.d_v);
  }
}

}  // namespace strideattn::cuda_impl
