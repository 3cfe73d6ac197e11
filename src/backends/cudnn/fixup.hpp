// Small CUDA kernels around the cuDNN graphs: write the elements cuDNN leaves untouched
// (varlen padding tokens of O/dQ/dK/dV get 0, of LSE get -inf: docs/semantics.md says every
// element of an output view is written) and move LSE between the caller's strided view and
// the packed [b, h, s_q] stats layout cuDNN reads and writes.
#pragma once

#include <cstdint>
#include <string>

namespace strideattn::detail::cudnn {

// Zero `d` 2-byte elements at every (token, head) of a [1, tokens, heads, d] view whose token
// index is listed in `tokens` (device memory).
[[nodiscard]] std::string zero_tokens(void* base, std::int64_t stride_s, std::int64_t stride_h, std::int64_t heads,
                                      std::int64_t d, const std::int64_t* tokens, std::int64_t n_tokens, void* stream);

// LSE[0, head, token] = -inf for every listed token and every head.
[[nodiscard]] std::string lse_fill_tokens(float* lse, std::int64_t stride_h, std::int64_t stride_s, std::int64_t heads,
                                          const std::int64_t* tokens, std::int64_t n_tokens, void* stream);

// Copy between the caller's LSE view and packed stats [batch, heads, s_max]. Row i of
// sequence b exists for i < lens[b] (lens == nullptr: every sequence has s_max rows); in the
// caller's view it is token offsets[b] + i of batch 0 (varlen) or token i of batch b (dense).
struct LseCopy {
  float* user = nullptr;
  std::int64_t user_stride_b = 0, user_stride_h = 0, user_stride_s = 0;
  float* packed = nullptr;
  std::int64_t batch = 0, heads = 0, s_max = 0;
  const std::int64_t* lens = nullptr;     // device, batch entries (varlen)
  const std::int64_t* offsets = nullptr;  // device, batch entries (varlen)
};
[[nodiscard]] std::string lse_copy(const LseCopy& c, bool packed_to_user, void* stream);

}  // namespace strideattn::detail::cudnn
