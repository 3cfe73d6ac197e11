// The max-logit output of the `cudnn` backend (docs/semantics.md, "Max logit"): cuDNN's SDPA
// forward writes the per-row max of the scaled, biased, masked logits (its `Max` output,
// packed [b, h, s_q, 1] fp32); the definition's max logit is per (batch, query head), the max
// over that head's rows, which this reduction forms on the caller's stream.
#pragma once

#include <cstdint>
#include <string>

namespace strideattn::detail::cudnn {

// out[b * stride_b + h * stride_h] = max over i < s_q of rows[(b * heads + h) * s_q + i],
// NaN rows ignored (a NaN logit reaches O and LSE, never the max), -inf when every row is
// -inf or NaN. One block per (batch, head); the max is exact and order-free (deterministic).
[[nodiscard]] std::string reduce_max_logit(const float* rows, std::int64_t batch, std::int64_t heads, std::int64_t s_q,
                                           float* out, std::int64_t stride_b, std::int64_t stride_h, void* stream);

}  // namespace strideattn::detail::cudnn
