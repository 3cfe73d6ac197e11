// strideattn public C++ API, KV-cache attention (inference): queries against a K/V cache that
// is contiguous [b, s_max, hg, d] or paged [num_pages, page_size, hg, d] with an int32 block
// table, with per-sequence cache lengths read from the tensors' memory and an optional append
// of new K/V tokens into the cache before attending (FlashAttention's flash_attn_with_kvcache).
// docs/semantics.md, "KV cache", is the definition. Included by strideattn/strideattn.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "strideattn/strideattn.hpp"

namespace strideattn {

// An int32 matrix view: the block table [b, max_pages]; strides in elements, any sign.
struct BlockTableView {
  const std::int32_t* data = nullptr;
  std::array<std::int64_t, 2> shape{0, 0};   // b, max_pages
  std::array<std::int64_t, 2> stride{0, 0};  // in elements
};

struct KvCacheArgs {
  TensorView q;  // [b, s_q, h, d_qk]
  // Contiguous (block_table.data == nullptr): [b, s_max, hg, d]; sequence n's token t is
  // k_cache[n, t]. Paged: [num_pages, page_size, hg, d] (page_size 1..256); sequence n's token t
  // is k_cache[block_table[n, t / page_size], t % page_size]. d is d_qk for K, d_v for V. Read
  // for tokens 0 .. cache_seqlens[n] - 1; written at the appended tokens (and nowhere else).
  TensorView k_cache, v_cache;
  // Optional new tokens [b, s_new, hg, d] (both or neither; absent: data null and shape all 0):
  // written into the caches at tokens cache_seqlens[n] .. cache_seqlens[n] + s_new - 1 of each
  // sequence, then attended to like the rest. cache_seqlens itself is not updated.
  TensorView k_new{}, v_new{};
  BlockTableView block_table{};  // data null: contiguous caches
  // int32 [b], in the tensors' memory (device memory on GPU backends: never copied to the host):
  // the tokens already in each sequence's cache. Required.
  const std::int32_t* cache_seqlens = nullptr;
  // Optional int32 [b] in the same memory: sequence n uses its first seqlens_q[n] query rows
  // (0 .. s_q); O rows past them are 0 and their LSE -inf. Null: every sequence has s_q rows.
  const std::int32_t* seqlens_q = nullptr;
  TensorView o;                // [b, s_q, h, d_v], written
  LseView lse{};               // optional output [b, h, s_q] (data == nullptr: not written)
  AttentionOptions options{};  // masks and windows relative to the attended length (semantics)
  Backend backend = Backend::automatic;
  Memory memory = Memory::host;
  void* stream = nullptr;  // cudaStream_t for GPU backends
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// Appends (when k_new / v_new are given) and attends; forward only. invalid_argument for input
// that breaks the contract (docs/semantics.md "KV cache": shapes, a length past the cache's
// capacity, a block-table entry outside the pages, read where the backend reads lengths on the
// host); unsupported when the chosen backend has no KV-cache path (rule `kv_cache`).
[[nodiscard]] Status forward_with_kvcache(const KvCacheArgs& args);
[[nodiscard]] Explanation explain(const KvCacheArgs& args);
// Bytes of scratch forward_with_kvcache needs on the backend that would run `args` (0: none);
// pass at least that much as `workspace` (16-byte aligned) and the call allocates nothing. The
// args' workspace fields and where the pointers live are ignored; the lengths and the block
// table are not read. On `cuda` the bytes depend on the problem's sizes and the device (the
// split count), not on the lengths: one query serves every decode step of the same shapes.
[[nodiscard]] Status workspace_size(const KvCacheArgs& args, std::size_t* bytes);

}  // namespace strideattn
