// The small kernels around the `cudnn` backend's KV-cache graph (docs/backends.md, "cudnn",
// "KV-cache attention"), on the caller's stream, reading the lengths and the block table from
// device memory only (no host synchronisation):
//   before   per sequence: cuDNN's seq_len_q / seq_len_kv (the attended length L =
//            cache_seqlens + s_new; 0 and 0 for a sequence with no key or a broken promise),
//            a broken flag, and for a paged cache a packed copy of the block table in which
//            every entry the sequence does not read is 0 (cuDNN never sees -1 or an entry
//            outside the pages);
//   after    per (sequence, head, row): the rows cuDNN leaves undefined or answers differently
//            from docs/semantics.md: broken sequences get NaN, rows past seqlens_q and rows
//            that see no key (L = 0, or a bottom-right diagonal / window before key 0) get O = 0
//            and LSE = -inf, rows that see a key and whose stats are not finite get NaN
//            (as the dense forward's non-finite fix-up); every other row's LSE is its stats.
#pragma once

#include <cstdint>
#include <string>

#include "common/attention_math.hpp"

namespace strideattn::detail::cudnn {

struct KvFix {
  // inputs, device memory
  const std::int32_t* cache_seqlens = nullptr;
  const std::int32_t* seqlens_q = nullptr;  // null: every sequence has s_q rows
  const std::int32_t* block_table = nullptr;
  std::int64_t bt_b = 0, bt_p = 0;  // block-table strides (elements)
  std::int64_t batch = 0, s_q = 0, heads = 0, d_v = 0, s_new = 0, capacity = 0;
  std::int64_t page_size = 0, num_pages = 0, max_pages = 0;  // page_size 0: contiguous
  int mask_kind = kernel::kMaskNone;
  std::int64_t window_left = -1, window_right = -1;
  // workspace, written by the first kernel and read by the second
  std::int32_t* seq_q = nullptr;   // [b]
  std::int32_t* seq_kv = nullptr;  // [b]
  std::int32_t* broken = nullptr;  // [b]
  std::int32_t* table = nullptr;   // [b, max_pages], paged only
  const float* stats = nullptr;    // packed [b, h, s_q] from cuDNN
  // outputs
  void* o = nullptr;  // [b, s_q, h, d_v], 2-byte elements
  kernel::Strides o_st;
  bool bf16 = true;
  float* lse = nullptr;  // [b, h, s_q] (null: not written)
  std::int64_t lse_b = 0, lse_h = 0, lse_s = 0;
};

// Lengths, flags and the packed table for cuDNN; before the graph. Returns "" or the error.
[[nodiscard]] std::string kv_prepare(const KvFix& f, void* stream);
// The rows' fix-up and the LSE; after the graph.
[[nodiscard]] std::string kv_finish(const KvFix& f, void* stream);

}  // namespace strideattn::detail::cudnn
