// Conversion of a validated Problem into the plain kernel parameter struct shared by the
// cpu backend and the CUDA kernels (src/common/attention_math.hpp).
#pragma once

#include "common/attention_math.hpp"
#include "problem/problem.hpp"

namespace strideattn::detail {

// Varlen tables point into `problem`'s host vectors; GPU backends replace q_seq/kv_seq
// pointers with device copies.
[[nodiscard]] kernel::AttentionParams make_params(const Problem& problem);

}  // namespace strideattn::detail
