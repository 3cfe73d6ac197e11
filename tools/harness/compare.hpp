// DESIGN's correctness rule: a backend passes when its max error against the fp64 reference
// is at most twice the error of the naive low-precision implementation plus a small
// absolute floor. Shared by the CLI, the fuzzer and the tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strideattn/strideattn.hpp"

namespace strideattn::harness {

struct ErrorStats {
  double max_abs_err = 0;      // max |out - exact|
  double max_rel_err = 0;      // max |out - exact| / max(|exact|, 1e-6) over finite elements
  std::int64_t worst_index = -1;  // logical (row-major) index of the worst element
  double worst_value = 0, worst_expected = 0;
  std::int64_t non_finite = 0;    // NaN/inf where the reference is finite (or vice versa)
};

// Compare `out` with `exact` elementwise (both logical row-major, same length). Elements
// where both are -inf (LSE of empty rows) agree.
[[nodiscard]] ErrorStats compare(const std::vector<double>& out, const std::vector<double>& exact);

// Tolerance for a tensor of `dtype`: 2 * naive_err + floor (floor depends on the dtype).
[[nodiscard]] double tolerance(DType dtype, double naive_max_abs_err);

// Tolerance for LSE (fp32, magnitudes ~ log(s_kv) + max score): 2 * naive_err + the f32
// floor + a relative floor 4e-6 * max|lse| (a few fp32 ulps of the largest finite LSE, which
// legitimately-different fp32 summation orders reach). docs/semantics.md "Correctness rule".
[[nodiscard]] double lse_tolerance(double naive_max_abs_err, double max_abs_lse);

// One output's verdict.
struct TensorCheck {
  std::string name;  // "o", "lse", "dq", ...
  ErrorStats err;
  double tol = 0;
  [[nodiscard]] bool pass() const { return err.non_finite == 0 && err.max_abs_err <= tol; }
};

}  // namespace strideattn::harness
