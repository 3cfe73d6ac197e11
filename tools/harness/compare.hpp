// The correctness rule: a backend passes when its max error against the fp64 reference
// is at most twice the error of the naive low-precision implementation plus a small floor.
// Shared by the CLI, the fuzzer and the tests; docs/semantics.md "Correctness rule".
#pragma once

#include <cstdint>
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
  // "no key" answer).
  const std::vector<double>* naive = nullptr;
  // The inputs are large enough that some fp32 summation order of the scores (or of dP)
  // overflows even where the naive model's does not: a non-finite output agrees anywhere the
  // reference is finite (but never an LSE of -inf).
  bool overflow_possible = false;
};

// Compare `out` with `exact` elementwise (both logical row-major, same length) under
// `policy`. A -inf output where the reference is finite never agrees.
[[nodiscard]] ErrorStats compare(const std::vector<double>& out, const std::vector<double>& exact,
                                 const NonFinitePolicy& policy = {});

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

// Half a unit in the last place of `dtype` at |x| (0 for 0 and non-finite x).
[[nodiscard]] double half_ulp(DType dtype, double x);

// Largest finite |x| of a tensor (0 when none is finite).
[[nodiscard]] double max_abs_finite(const std::vector<double>& values);

// One output's verdict.
struct TensorCheck {
  std::string name;  // "o", "lse", "dq", ...
  ErrorStats err;
  double tol = 0;
  [[nodiscard]] bool pass() const { return err.non_finite == 0 && err.max_abs_err <= tol; }
};

// The whole rule for one output: the tolerance from the naive model's error, then `out`
// against `exact`. `dtype` is the tensor's storage type (DType::f32 for LSE). `magnitude`
// scales the relative term: max|exact| by default (a negative value); for gradients pass the
// largest |value| over dQ, dK and dV, which share the dS intermediate - a gradient that is
// exactly 0 by cancellation (dK when each sequence has one key) still carries fp32 rounding
// of the dP - D difference at the backward's own scale.
// `inputs_non_finite`: the case planted NaN or Inf in its inputs (NonFinitePolicy); the
// naive model's non-finite elements always count as fp32 overflow.
[[nodiscard]] TensorCheck check_tensor(std::string name, DType dtype, const std::vector<double>& out,
                                       const std::vector<double>& naive, const std::vector<double>& exact,
                                       double magnitude = -1.0, bool inputs_non_finite = false,
                                       bool overflow_possible = false);

}  // namespace strideattn::harness
