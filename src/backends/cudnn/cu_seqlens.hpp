// The `cudnn` backend's device side of varlen cu_seqlens arrays (docs/semantics.md, "cu_seqlens
// arrays"): kernels on the caller's stream turn cu_seqlens (and seq_offsets) into the int32
// seq_len and ragged-offset tables a cuDNN graph reads, the int64 tables of the LSE copy, and a
// mark per token of the tokens cuDNN writes; then write the tokens it does not (O, dQ, dK, dV
// 0; LSE -inf). Nothing is read on the host and nothing synchronises. Every length and offset is
// clamped into its view first, so arrays that break the caller's promise cannot make cuDNN or
// these kernels reach outside the views.
#pragma once

#include <cstdint>
#include <string>

namespace strideattn::detail::cudnn {

// The ragged-offset tables in cuDNN's slot order (graph.hpp RaggedSlot): q, k, v, o, then
// backward dO, dQ, dK, dV. Slots 0, 3, 4, 5 are query-side, 1, 2, 6, 7 key-side.
inline constexpr int kRaggedSlots = 8;
[[nodiscard]] constexpr bool ragged_slot_is_query(int slot) { return slot == 0 || slot == 3 || slot == 4 || slot == 5; }

struct CuSeqlensTables {
  // The caller's arrays (device memory): cu_* count + 1 entries, off_* count entries or null.
  const std::int32_t* cu_q = nullptr;
  const std::int32_t* cu_kv = nullptr;
  const std::int32_t* off_q = nullptr;
  const std::int32_t* off_kv = nullptr;
  std::int64_t count = 0, max_q = 0, max_kv = 0, q_tokens = 0, kv_tokens = 0;
  bool backward = false;
  int slots = 4;                               // ragged tables: 4 forward, 8 backward
  std::int64_t seq_stride[kRaggedSlots] = {};  // each tensor's seq stride (0: one token)
  // Written (workspace): what the graph reads ...
  std::int32_t* seq_q = nullptr;   // [count] query rows per sequence (0 where it has no keys)
  std::int32_t* seq_kv = nullptr;  // [count]
  std::int32_t* ragged = nullptr;  // [slots][count + 1] element offsets; the last is the end
  // ... what the LSE copy reads (fixup.hpp LseCopy) ...
  std::int64_t* lens64 = nullptr;  // [count] = seq_q
  std::int64_t* offs64 = nullptr;  // [count] first query token
  // ... and the tokens written by cuDNN (1) or left to the fix-up (0).
  std::int64_t* kv_offs64 = nullptr;  // [count] first key token
  std::int64_t* kv_own64 = nullptr;   // [count] keys whose dK/dV cuDNN writes
  std::uint8_t* q_marks = nullptr;    // [q_tokens]
  std::uint8_t* kv_marks = nullptr;   // [kv_tokens]
};

// Bytes of workspace the tables of `count` sequences over these tokens take, and the layout
// from a base pointer (256-byte aligned pieces).
[[nodiscard]] std::size_t cu_seqlens_bytes(std::int64_t count, std::int64_t q_tokens, std::int64_t kv_tokens,
                                           int slots);
void cu_seqlens_layout(void* base, CuSeqlensTables* t);

// Enqueues the conversion (three launches and a memset) on `stream`. "" on success.
[[nodiscard]] std::string convert_cu_seqlens(const CuSeqlensTables& t, void* stream);

// Zero the `d` 2-byte elements of every head of each token t < tokens of a [1, tokens, heads,
// d] view with marks[t] == 0; LSE -inf there.
[[nodiscard]] std::string zero_unmarked_tokens(void* base, std::int64_t stride_s, std::int64_t stride_h,
                                               std::int64_t heads, std::int64_t d, const std::uint8_t* marks,
                                               std::int64_t tokens, void* stream);
[[nodiscard]] std::string lse_fill_unmarked_tokens(float* lse, std::int64_t stride_h, std::int64_t stride_s,
                                                   std::int64_t heads, const std::uint8_t* marks, std::int64_t tokens,
                                                   void* stream);

}  // namespace strideattn::detail::cudnn
