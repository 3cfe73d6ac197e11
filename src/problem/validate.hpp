// Validation rules of the contract (docs/semantics.md "What is rejected"). Each failure is
// one message naming the tensor, the value found and what is supported.
#pragma once

#include "problem/problem.hpp"

namespace strideattn::detail {

// All rules, in a fixed order; the first failure is returned. Runs on a resolved but
// unvalidated problem and must not crash on any input (garbage sizes, null pointers,
// mismatched varlen vector lengths).
[[nodiscard]] Status validate_problem(const Problem& problem);

}  // namespace strideattn::detail
