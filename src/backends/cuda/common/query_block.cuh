// The schedule of the kernels that run one CTA per block of queries and walk the keys (the
// forwards and the dQ pass): which (query block, head, sequence) a CTA owns, the keys its
// rows see under the mask, and the blocks of keys that cover them. The dK/dV passes' schedule
// is common/kv_pass.cuh.
#pragma once

#include <cstdint>

#include "backends/cuda/common/kernel_params.hpp"

namespace strideattn::cuda_impl {

struct QueryBlockWork {
  int64_t batch = 0, head = 0, kv_head = 0;
  int64_t r0 = 0, r1 = 0;  // the block's query rows [r0, r1) of the sequence
  int64_t s_kv = 0;        // keys of the sequence
  bool empty = true;       // r0 >= s_q: the sequence is shorter, nothing to do
  MaskRule mask;
  TileRange keys;         // the keys any of the rows sees (key_range_for_rows)
  int64_t first_key = 0;  // the first key of the first block of KeyBlock keys that meets them
  int n_key_blocks = 0;   // blocks of KeyBlock keys from first_key that cover them
  // A KV-cache call (KernelParams::kv): the block's rows [fill_begin, fill_end) past the
  // sequence's seqlens_q get O = 0 and LSE = -inf, or every row of a broken sequence NaN
  // (fill_nan); fill_rows (kv_fill.cuh) writes them. Empty otherwise.
  int64_t fill_begin = 0, fill_end = 0;
  bool fill_nan = false;
};

// CTA (blockIdx.x, head blockIdx.y, sequence blockIdx.z) of a grid of Br-query blocks. The
// heaviest query blocks (the latest rows under a causal mask) are scheduled first.
// KvCache: a KV-cache call's lengths from device memory (KernelParams::kv).
template <int Br, int KeyBlock, bool KvCache = false>
__device__ __forceinline__ QueryBlockWork query_block_work(const KernelParams& kp) {
  const kernel::AttentionParams& p = kp.p;
  QueryBlockWork w;
  w.batch = blockIdx.z, w.head = blockIdx.y;
  int64_t s_q = p.q_seq.length(w.batch);
  w.s_kv = p.kv_seq.length(w.batch);
  const int64_t n_qblocks = kernel::ceil_div(p.q_seq.max_len, Br);
  w.r0 = (n_qblocks - 1 - int64_t(blockIdx.x)) * Br;
  if constexpr (KvCache) {
    // KV cache: the lengths of device memory; the grid covers all s_q rows of every sequence
    const SeqLengths len = kv_seq_lengths(kp.kv, w.batch);
    w.fill_begin = kernel::max64(w.r0, len.q_rows);
    w.fill_end = kernel::min64(w.r0 + Br, p.q_seq.max_len);
    w.fill_nan = len.broken;
    s_q = len.q_rows;
    w.s_kv = len.attended;
    w.mask = kv_seq_mask(len, p.mask_kind, p.window_left, p.window_right);
  } else {
    w.mask = p.mask(w.batch);
  }
  w.empty = w.r0 >= s_q;
  w.r1 = kernel::min64(w.r0 + Br, s_q);
  w.keys = kernel::key_range_for_rows(w.mask, w.r0, w.r1);
  w.kv_head = kernel::kv_head_of(w.head, p.heads, p.kv_heads);
  w.first_key = (w.keys.begin / KeyBlock) * KeyBlock;
  w.n_key_blocks = w.keys.end > w.keys.begin ? int(kernel::ceil_div(w.keys.end - w.first_key, KeyBlock)) : 0;
  return w;
}

}  // namespace strideattn::cuda_impl
