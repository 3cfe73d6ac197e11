// The parameter block of the KV-cache (decode) kernels of the `cuda` backend: the caller's
// views as pointers and element strides, the lengths and the block table as device pointers
// (read by the kernels, never by the host), the split of each sequence's key range, and the
// workspace pieces. Plain host-device C++ filled by decode_host.cpp; also the one place that
// says how a sequence's lengths are read and clamped (seq_lengths), shared by every kernel.
#pragma once

#include <cstdint>

#include "backends/cuda/common/kv_cache_rows.hpp"
#include "common/attention_math.hpp"

namespace strideattn::cuda_impl {

struct DecodeParams {
  // Q [b, s_q, h, d_qk], O [b, s_q, h, d_v], LSE [b, h, s_q] (lse null: not written).
  const void* q = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  kernel::Strides q_st, o_st;
  kernel::LseStrides lse_st;
  // The caches: [b, s_max, hg, d] (block_table null) or [num_pages, page_size, hg, d]; the `b`
  // stride is the sequence's (contiguous) or the page's (paged), the `s` stride the slot's.
  void* k = nullptr;
  void* v = nullptr;
  kernel::Strides k_st, v_st;
  // New tokens [b, s_new, hg, d] (s_new 0: none).
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  kernel::Strides kn_st, vn_st;
  // int32 [b, max_pages] with any strides; null for contiguous caches.
  const std::int32_t* block_table = nullptr;
  std::int64_t bt_b = 0, bt_p = 0;
  // int32 [b] in device memory; seqlens_q may be null (every sequence has s_q rows).
  const std::int32_t* cache_seqlens = nullptr;
  const std::int32_t* seqlens_q = nullptr;

  std::int64_t batch = 0, s_q = 0, heads = 0, kv_heads = 0, group = 1, d_qk = 0, d_v = 0;
  std::int64_t page_size = 0;  // 0: contiguous
  std::int64_t num_pages = 0;  // paged: valid block-table entries are 0 .. num_pages - 1
  std::int64_t capacity = 0;   // tokens per sequence: s_max, or max_pages * page_size
  std::int64_t s_new = 0;
  int mask_kind = kernel::kMaskNone;
  std::int64_t window_left = -1, window_right = -1;
  float scale = 1.f, scale_log2 = 1.f;

  // Grid: blockIdx.x = kv_head + kv_heads * (row_tile + row_tiles * split), blockIdx.y = sequence.
  int row_tiles = 1;
  int splits = 1;
  // splits > 1: the split kernel writes fp32 partial rows, [splits][b][h][s_q] x d_v for O
  // (normalised by the split's own sum) and [splits][b][h][s_q] for the natural-log LSE, and
  // the combine kernel writes O and LSE from them.
  float* part_o = nullptr;
  float* part_lse = nullptr;
  std::uint32_t aligned = 0;  // AlignBits (kernel_params.hpp): kVecQ, kVecK, kVecV
};

// One sequence's lengths as the kernels read them (common/kv_cache_rows.hpp, the rule the
// dense forward's KV-cache calls share).
SA_HD SeqLengths seq_lengths(const DecodeParams& p, std::int64_t n) {
  return kv_seq_lengths(p.cache_seqlens, p.seqlens_q, p.s_q, p.s_new, p.capacity, n);
}

// The mask of a sequence: its query rows against its attended keys, so that every
// bottom-right diagonal and window is measured from the attended end.
SA_HD kernel::MaskRule seq_mask(const DecodeParams& p, const SeqLengths& s) {
  return kv_seq_mask(s, p.mask_kind, p.window_left, p.window_right);
}

// Where token t of sequence n lives: the cache row (the sequence, or its page through the block
// table) and the slot in it; row -1 when the block-table entry is outside 0 .. num_pages - 1
// (a broken promise: the kernels then read and write nothing there). The element offset of
// (head 0, dim 0) is row * st.b + slot * st.s for a cache with strides st.
struct CacheSlot {
  std::int64_t row = -1, slot = 0;
};
// (32-bit division: a paged cache holds at most 2^31 - 1 tokens per sequence, validated, and
// a 64-bit division costs several times as many instructions per row.)
SA_HD CacheSlot cache_slot(const DecodeParams& p, std::int64_t n, std::int64_t t) {
  if (p.block_table == nullptr) return {n, t};
  const std::uint32_t tok = std::uint32_t(t), size = std::uint32_t(p.page_size), j = tok / size;
  const std::int64_t page = p.block_table[n * p.bt_b + std::int64_t(j) * p.bt_p];
  if (page < 0 || page >= p.num_pages) return {-1, 0};
  return {page, std::int64_t(tok - j * size)};
}

}  // namespace strideattn::cuda_impl
