// The correctness rule: a backend passes when its error against the fp64 reference is, at
// every element, at most twice the error of the naive low-precision implementation plus a
// small floor, or the element's conditioning allowance where that is larger
// (conditioning.hpp). Shared by the CLI, the fuzzer and the tests; docs/semantics.md
// "Correctness rule".
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "strideattn/strideattn.hpp"

namespace strideattn::harness {

struct ErrorStats {
  double max_abs_err = 0;         // max |out - exact|
  double max_rel_err = 0;         // max |out - exact| / max(|exact|, 1e-6) over finite elements
  std::int64_t worst_index = -1;  // logical (row-major) index of the worst element
  double worst_value = 0, worst_expected = 0;
  std::int64_t non_finite = 0;  // NaN/inf where the reference is finite (or vice versa)
  // With element tolerances (ElementTolerance): the largest |out - exact| / tolerance of the
  // element, and the tolerance of the worst element. The worst element is then the one of
  // the largest ratio when some element exceeds its tolerance, else the largest error.
  double max_excess = 0;
  double worst_tol = 0;
};

// Which non-finite outputs agree with the reference (docs/semantics.md, "Non-finite values,
// overflow and the scale"). By default none but -inf against -inf (LSE of rows that see no
// key): on finite inputs a NaN is always a failure, even against a NaN reference.
struct NonFinitePolicy {
  // The inputs hold NaN or Inf: the reference's NaN must be NaN, its +-inf must be that inf
  // or NaN (0 * inf), and where it is finite a non-finite output may come from a non-finite
  // input the row does not see but shares a tile with (finite outputs are still checked).
  bool inputs_non_finite = false;
  // The naive fp32 model (same length as `exact`): where it is non-finite and the reference
  // finite, fp32 overflowed, and a non-finite output agrees (but never an LSE of -inf, the
  // "no key" answer: see `lse`).
  const std::vector<double>* naive = nullptr;
  // Per element (same length as `exact`): 1 where some fp32 summation order of an
  // intermediate can exceed FLT_MAX (conditioning.hpp): a non-finite output agrees there
  // where the reference is finite (but never an LSE of -inf).
  const std::vector<std::uint8_t>* overflow = nullptr;
  // The tensor is LSE: -inf is the "no key" answer there and never agrees as overflow.
  bool lse = false;
  // The smallest |value| that rounds to +-inf in the output's dtype: where the exact value,
  // or a value within the element's tolerance, lies beyond it (an LSE below -FLT_MAX, an f16
  // gradient above 65520), the infinity of that sign agrees.
  double rounds_to_inf = std::numeric_limits<double>::infinity();
};

// The tolerance of each element: max(tensor, allowance[e]) (allowance null: the tensor's).
struct ElementTolerance {
  double tensor = 0;
  const std::vector<double>* allowance = nullptr;
};

// Compare `out` with `exact` elementwise (both logical row-major, same length) under
// `policy`. A -inf LSE where the reference is finite never agrees. With `tol`, also the
// excess over each element's tolerance (ErrorStats::max_excess).
[[nodiscard]] ErrorStats compare(const std::vector<double>& out, const std::vector<double>& exact,
                                 const NonFinitePolicy& policy = {}, const ElementTolerance* tol = nullptr);

// Tolerance of one output tensor stored in `dtype` (LSE: DType::f32):
//   2 * naive_err + floor(dtype) + 4e-6 * magnitude + half_ulp(dtype, largest)
// floor(dtype) is a few ulps of 1 in the dtype (f32 2e-5, f16 1e-4, bf16 1e-3); the relative
// term is a few fp32 ulps of `magnitude`, which legitimately different fp32 summation orders
// reach on large values (LSE ~ 10, gradients summed over long sequences and GQA groups ~ 100);
// the last term is half a unit in the last place of the dtype at the tensor's own largest
// value: the output's final rounding, which two correct implementations may take to
// neighbouring values where the naive model happened to round close.
struct ToleranceTerms {
  double naive_err = 0;  // max |naive - exact| of this tensor
  double magnitude = 0;  // scale of the fp32 term: max|exact| (gradients: over dq, dk, dv)
  double largest = 0;    // max|exact| of this tensor alone (its own output rounding)
};
[[nodiscard]] double tolerance(DType dtype, const ToleranceTerms& terms);

// The smallest |x| that rounds to infinity in `dtype` (round to nearest even).
[[nodiscard]] double overflow_threshold(DType dtype);

// Half a unit in the last place of `dtype` at |x| (0 for 0 and non-finite x).
[[nodiscard]] double half_ulp(DType dtype, double x);

// Largest finite |x| of a tensor (0 when none is finite).
[[nodiscard]] double max_abs_finite(const std::vector<double>& values);

// One output's verdict.
struct TensorCheck {
  std::string name;  // "o", "lse", "dq", ...
  ErrorStats err;
  double tol = 0;  // the tensor's tolerance (tolerance())
  // check_tensor: the largest error / element tolerance (pass: <= 1); -1 when the check was
  // made without element tolerances (pass: max_abs_err <= tol).
  double excess = -1;
  // Elements whose conditioning allowance exceeds `tol`, and the largest such allowance.
  std::int64_t allowed = 0;
  double max_allowance = 0;
  [[nodiscard]] bool pass() const {
    return err.non_finite == 0 && (excess >= 0 ? excess <= 1 : err.max_abs_err <= tol);
  }
};

// Per-element terms of the rule for one output (conditioning.hpp), each the length of the
// output, or null.
struct ElementTerms {
  const std::vector<double>* allowance = nullptr;       // tolerance: max(tol, allowance)
  const std::vector<std::uint8_t>* overflow = nullptr;  // NonFinitePolicy::overflow
};

// The whole rule for one output: the tolerance from the naive model's error, then `out`
// against `exact`. `dtype` is the tensor's storage type (DType::f32 for LSE). `magnitude`
// scales the relative term: max|exact| by default (a negative value); for gradients pass the
// largest |value| over dQ, dK and dV, which share the dS intermediate - a gradient that is
// exactly 0 by cancellation (dK when each sequence has one key) still carries fp32 rounding
// of the dP - D difference at the backward's own scale.
// `inputs_non_finite`: the case planted NaN or Inf in its inputs (NonFinitePolicy); the
// naive model's non-finite elements always count as fp32 overflow. `terms`: the element
// allowances and overflow flags (none: the tensor's tolerance everywhere, overflow only where
// the naive model overflowed).
[[nodiscard]] TensorCheck check_tensor(std::string name, DType dtype, const std::vector<double>& out,
                                       const std::vector<double>& naive, const std::vector<double>& exact,
                                       double magnitude = -1.0, bool inputs_non_finite = false,
                                       ElementTerms terms = {});

}  // namespace strideattn::harness
