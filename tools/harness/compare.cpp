// The correctness rule (see compare.hpp and docs/semantics.md "Correctness rule"):
// elementwise error statistics against the fp64 reference, and the tolerances
// 2 * naive_err + floor(dtype) + fp32 and output-rounding terms (compare.hpp).
#include "harness/compare.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace strideattn::harness {

namespace {

// Absolute floors per dtype: a few units in the last place of values of magnitude ~1 in the
// dtype's own precision (bf16 ulp(1) = 7.8e-3, f16 9.8e-4, f32 1.2e-7), kept small enough
// that a real bug (a wrong row, a missing key) cannot hide under them. They only matter
// when the naive error happens to be tiny (e.g. O of rows that see one key).
double floor_of(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 2e-5;
    case DType::f16:
      return 1e-4;
    case DType::bf16:
      return 1e-3;
  }
  return 1e-3;
}

// Whether a pair with at least one non-finite side agrees under `policy` (see compare.hpp).
// `tol`: the element's tolerance (0 without element tolerances).
bool non_finite_agrees(double x, double e, double tol, bool naive_overflowed, const NonFinitePolicy& policy) {
  if (x == e) return !std::isnan(x) && (std::isinf(x) ? x < 0 || policy.inputs_non_finite : true);
  // an infinity that a value within the tolerance rounds to in the dtype (the exact value's
  // own rounding when the tolerance is 0)
  if (std::isfinite(e) && std::isinf(x) && (x > 0 ? e + tol : tol - e) >= policy.rounds_to_inf) return true;
  if (std::isfinite(e)) {  // the output is the non-finite side
    // LSE = -inf is the "no key" answer, never fp32 overflow
    if (policy.lse && x == -std::numeric_limits<double>::infinity() && !policy.inputs_non_finite) return false;
    return policy.inputs_non_finite || naive_overflowed;
  }
  if (!policy.inputs_non_finite) return false;  // a non-finite reference on finite inputs
  if (std::isnan(e)) return std::isnan(x);
  return std::isnan(x);  // reference +-inf: that inf (x == e above) or NaN (0 * inf)
}

}  // namespace

ErrorStats compare(const std::vector<double>& out, const std::vector<double>& exact, const NonFinitePolicy& policy,
                   const ElementTolerance* tol) {
  ErrorStats st;
  const std::size_t n = std::min(out.size(), exact.size());
  std::int64_t first_bad = -1;  // first non-finite disagreement, reported as the worst
  std::int64_t excess_at = -1;  // the element of the largest excess
  const std::vector<double>* allow = tol != nullptr ? tol->allowance : nullptr;
  auto tol_at = [&](std::size_t i) {
    const double a = allow != nullptr && i < allow->size() ? (*allow)[i] : 0.0;
    return std::max(tol->tensor, a);  // a NaN allowance leaves the tensor's tolerance
  };
  for (std::size_t i = 0; i < n; ++i) {
    const double x = out[i], e = exact[i];
    if (!std::isfinite(x) || !std::isfinite(e)) {
      const bool overflow = (policy.overflow != nullptr && i < policy.overflow->size() && (*policy.overflow)[i] != 0) ||
                            (policy.naive != nullptr && i < policy.naive->size() && !std::isfinite((*policy.naive)[i]));
      if (non_finite_agrees(x, e, tol != nullptr ? tol_at(i) : 0.0, overflow, policy)) continue;
      ++st.non_finite;
      if (first_bad < 0) first_bad = std::int64_t(i);
      continue;
    }
    const double abs_err = std::fabs(x - e);
    const double rel_err = abs_err / std::max(std::fabs(e), 1e-6);
    st.max_rel_err = std::max(st.max_rel_err, rel_err);
    if (abs_err > st.max_abs_err || st.worst_index < 0) {
      st.max_abs_err = abs_err;
      st.worst_index = std::int64_t(i);
      st.worst_value = x;
      st.worst_expected = e;
    }
    if (tol != nullptr) {
      const double t = tol_at(i);
      const double excess = abs_err == 0 ? 0.0 : t > 0 ? abs_err / t : std::numeric_limits<double>::infinity();
      if (excess > st.max_excess || excess_at < 0) st.max_excess = excess, excess_at = std::int64_t(i);
    }
  }
  if (tol != nullptr && st.max_excess > 1) {  // report the element furthest over its tolerance
    st.worst_index = excess_at;
    st.worst_value = out[std::size_t(excess_at)];
    st.worst_expected = exact[std::size_t(excess_at)];
  }
  // A length mismatch means elements are missing: each counts as a disagreement.
  const std::size_t longer = std::max(out.size(), exact.size());
  st.non_finite += std::int64_t(longer - n);
  if (first_bad < 0 && longer > n) first_bad = std::int64_t(n);
  if (first_bad >= 0) {
    st.worst_index = first_bad;
    st.worst_value = std::size_t(first_bad) < out.size() ? out[std::size_t(first_bad)] : std::nan("");
    st.worst_expected = std::size_t(first_bad) < exact.size() ? exact[std::size_t(first_bad)] : std::nan("");
  }
  if (tol != nullptr) st.worst_tol = st.worst_index >= 0 ? tol_at(std::size_t(st.worst_index)) : tol->tensor;
  return st;
}

double overflow_threshold(DType dtype) {
  const int mantissa_bits = dtype == DType::f32 ? 23 : dtype == DType::f16 ? 10 : 7;
  const int max_exp = dtype == DType::f16 ? 15 : 127;
  return (2.0 - std::ldexp(1.0, -(mantissa_bits + 1))) * std::ldexp(1.0, max_exp);
}

double half_ulp(DType dtype, double x) {
  x = std::fabs(x);
  if (!(x > 0) || !std::isfinite(x)) return 0;
  const int mantissa_bits = dtype == DType::f32 ? 23 : dtype == DType::f16 ? 10 : 7;
  return std::ldexp(1.0, std::ilogb(x) - mantissa_bits - 1);
}

double tolerance(DType dtype, const ToleranceTerms& t) {
  return 2.0 * t.naive_err + floor_of(dtype) + 4e-6 * t.magnitude + half_ulp(dtype, t.largest);
}

double max_abs_finite(const std::vector<double>& values) {
  double m = 0;
  for (double x : values)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

TensorCheck check_tensor(std::string name, DType dtype, const std::vector<double>& out,
                         const std::vector<double>& naive, const std::vector<double>& exact, double magnitude,
                         bool inputs_non_finite, ElementTerms terms) {
  TensorCheck c;
  c.name = std::move(name);
  const double largest = max_abs_finite(exact);
  c.tol = tolerance(dtype, {.naive_err = compare(naive, exact).max_abs_err,
                            .magnitude = magnitude >= 0 ? magnitude : largest,
                            .largest = largest});
  const ElementTolerance et{.tensor = c.tol, .allowance = terms.allowance};
  c.err = compare(out, exact,
                  {.inputs_non_finite = inputs_non_finite,
                   .naive = &naive,
                   .overflow = terms.overflow,
                   .lse = c.name == "lse",
                   .rounds_to_inf = overflow_threshold(dtype)},
                  &et);
  c.excess = c.err.max_excess;
  if (terms.allowance != nullptr)
    for (double a : *terms.allowance)
      if (a > c.tol) ++c.allowed, c.max_allowance = std::max(c.max_allowance, a);
  return c;
}

}  // namespace strideattn::harness
