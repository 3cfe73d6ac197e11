// Reading the cu_seqlens arrays of a varlen problem on the host (docs/semantics.md,
// "Tensors"): what the host backends do when a run gives the arrays in host memory. The
// arrays become the problem's lists, checked by the varlen rules of validate.cpp and against
// the plan's max_seqlen bounds, so a host backend refuses a broken promise with a message.
#pragma once

#include "problem/problem.hpp"

namespace strideattn::detail {

// Preconditions: p->cu_seqlens, p->memory == host, the arrays of the run bound (non-null
// cu_seqlens_q/kv). Fills seqlens_* and offsets_*; invalid_argument names the array, the
// entry and the value when a length is negative or above its bound, or a sequence lies outside
// its view or overlaps another.
[[nodiscard]] Status read_cu_seqlens(Problem* p);

}  // namespace strideattn::detail
