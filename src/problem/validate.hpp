// Validation rules of the contract (docs/semantics.md "What is rejected"). Each failure is
// one message naming the tensor, the value found and what is supported.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "problem/problem.hpp"

namespace strideattn::detail {

// All rules, in a fixed order; the first failure is returned. Runs on a resolved but
// unvalidated problem and must not crash on any input (garbage sizes, null pointers,
// mismatched varlen vector lengths). `varlen` is the caller's description (the cu_seqlens
// form's rules need what the problem does not keep); `mode` says what a null pointer means.
[[nodiscard]] Status validate_problem(const Problem& problem, Pointers mode, const Varlen& varlen);

// The overlap rules alone (every output against the inputs, the other outputs and itself) on
// the problem's pointers; pairs with a null (not yet given) pointer are skipped.
[[nodiscard]] Status check_overlap(const Problem& problem);

// One side's varlen lists against the tokens of its views (lengths and offsets >= 0, every
// sequence inside the view, no two overlapping). `lens` and `offs` name the lists in messages.
[[nodiscard]] Status check_varlen_side(const char* side, const char* tensor, const std::vector<std::int64_t>& seqlens,
                                       const std::vector<std::int64_t>& offsets, std::int64_t tokens,
                                       const std::string& lens, const std::string& offs);

// One view alone: extents >= 0, the unit-stride dimension (-1: none), extent overflow, null
// data (`deferred`: a null pointer is given at run time) and alignment to `elem_bytes`.
template <std::size_t N>
[[nodiscard]] Status check_view_alone(const char* name, void* data, std::int64_t elem_bytes,
                                      const std::array<std::int64_t, N>& shape,
                                      const std::array<std::int64_t, N>& stride, const char* const* dim_names,
                                      int unit_stride_dim, bool deferred);

// The training features' rules (validate_features.cpp): options in range, every feature
// tensor's shape, dtype and presence against the problem.
[[nodiscard]] Status check_features(const Problem& problem, Pointers mode);

// Single rules for other argument kinds (problem/kv_cache.cpp), with the messages above: one
// tensor view alone (dtype, head dim, strides, extent, null, alignment), one LSE view alone, and
// the options of a problem (mask, window, scale, memory).
[[nodiscard]] Status check_tensor_view(const char* name, const TensorView& view, Pointers mode);
[[nodiscard]] Status check_lse_view(const LseView& view, Pointers mode);
[[nodiscard]] Status check_problem_options(const Problem& problem);

}  // namespace strideattn::detail
