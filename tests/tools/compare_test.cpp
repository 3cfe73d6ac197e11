// The correctness rule (docs/semantics.md, tools/harness/compare.hpp): error statistics,
// non-finite handling, the worst element, the tolerance floors, and the element tolerances
// and overflow flags the conditioning gives.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "harness/compare.hpp"

namespace {

using strideattn::DType;
using strideattn::harness::check_tensor;
using strideattn::harness::compare;
using strideattn::harness::ElementTerms;
using strideattn::harness::half_ulp;
using strideattn::harness::TensorCheck;
using strideattn::harness::tolerance;

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNan = std::nan("");

TEST(Compare, ReportsMaxErrorsAndWorstIndex) {
  const auto st = compare({1.0, 2.5, -3.0, 0.0}, {1.0, 2.0, -3.1, 0.0});
  EXPECT_DOUBLE_EQ(st.max_abs_err, 0.5);
  EXPECT_EQ(st.worst_index, 1);
  EXPECT_DOUBLE_EQ(st.worst_value, 2.5);
  EXPECT_DOUBLE_EQ(st.worst_expected, 2.0);
  EXPECT_DOUBLE_EQ(st.max_rel_err, 0.25);
  EXPECT_EQ(st.non_finite, 0);
}

TEST(Compare, IdenticalIsZero) {
  const auto st = compare({0.5, -kInf, 3.0}, {0.5, -kInf, 3.0});
  EXPECT_EQ(st.max_abs_err, 0.0);
  EXPECT_EQ(st.non_finite, 0);
}

TEST(Compare, MinusInfAgreesWithMinusInfOnly) {
  EXPECT_EQ(compare({-kInf}, {-kInf}).non_finite, 0);
  EXPECT_EQ(compare({-1e30}, {-kInf}).non_finite, 1);  // finite where the row is empty
  EXPECT_EQ(compare({-kInf}, {2.0}).non_finite, 1);
  EXPECT_EQ(compare({kInf}, {-kInf}).non_finite, 1);
  EXPECT_EQ(compare({kInf}, {1.0}).non_finite, 1);
}

TEST(Compare, NanNeverPasses) {
  const auto st = compare({0.0, kNan, 1.0}, {0.0, 0.0, 1.0});
  EXPECT_EQ(st.non_finite, 1);
  EXPECT_EQ(st.worst_index, 1);
  EXPECT_TRUE(std::isnan(st.worst_value));
  EXPECT_EQ(compare({kNan}, {kNan}).non_finite, 1);
  TensorCheck c{"o", st, 1e9};
  EXPECT_FALSE(c.pass());  // a NaN fails whatever the tolerance
}

TEST(Compare, NonFiniteIsReportedAsWorstEvenWithLargerFiniteErrors) {
  const auto st = compare({10.0, kInf}, {0.0, 1.0});
  EXPECT_EQ(st.non_finite, 1);
  EXPECT_EQ(st.worst_index, 1);
  EXPECT_DOUBLE_EQ(st.max_abs_err, 10.0);
}

TEST(Compare, RelativeErrorUsesFloorForZeros) {
  const auto st = compare({1e-7}, {0.0});
  EXPECT_NEAR(st.max_rel_err, 0.1, 1e-12);
}

TEST(Compare, LengthMismatchCountsMissingElements) {
  EXPECT_EQ(compare({1.0, 2.0}, {1.0, 2.0, 3.0}).non_finite, 1);
  EXPECT_EQ(compare({1.0, 2.0, 3.0}, {1.0}).non_finite, 2);
}

TEST(Tolerance, TwiceNaivePlusFloor) {
  EXPECT_DOUBLE_EQ(tolerance(DType::f32, {}), 2e-5);
  EXPECT_DOUBLE_EQ(tolerance(DType::f16, {}), 1e-4);
  EXPECT_DOUBLE_EQ(tolerance(DType::bf16, {}), 1e-3);
  EXPECT_DOUBLE_EQ(tolerance(DType::bf16, {.naive_err = 0.01}), 0.021);
  EXPECT_DOUBLE_EQ(tolerance(DType::f32, {.naive_err = 1e-6, .magnitude = 10.0}), 2e-6 + 2e-5 + 4e-5);
  EXPECT_DOUBLE_EQ(strideattn::harness::max_abs_finite({1.0, -3.0, -INFINITY, NAN}), 3.0);
}

TEST(Tolerance, HalfUlpOfTheLargestValue) {
  // bf16 has 7 stored mantissa bits: ulp in [8, 16) is 2^-4; f16 (10 bits) 2^-7; f32 2^-20.
  EXPECT_DOUBLE_EQ(half_ulp(DType::bf16, 11.4), 0.03125);
  EXPECT_DOUBLE_EQ(half_ulp(DType::f16, -11.4), 0.00390625);
  EXPECT_DOUBLE_EQ(half_ulp(DType::f32, 8.0), std::ldexp(1.0, -21));
  EXPECT_DOUBLE_EQ(half_ulp(DType::f16, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(half_ulp(DType::f16, INFINITY), 0.0);
  EXPECT_DOUBLE_EQ(tolerance(DType::f16, {.largest = 11.4}), 1e-4 + 0.00390625);
}

TEST(Tolerance, RoundingTermUsesTheTensorsOwnLargestValue) {
  // dq of magnitude 1 next to dv of magnitude 30: dq's rounding term stays at its own scale.
  const TensorCheck c = check_tensor("dq", DType::bf16, {1.0}, {1.0}, {1.0}, 30.0);
  EXPECT_DOUBLE_EQ(c.tol, 1e-3 + 4e-6 * 30.0 + half_ulp(DType::bf16, 1.0));
}

TEST(Tolerance, PassIsAtMostTolerance) {
  TensorCheck c{"o", compare({1.0009}, {1.0}), tolerance(DType::bf16, {})};
  EXPECT_TRUE(c.pass());
  c.err = compare({1.0011}, {1.0});
  EXPECT_FALSE(c.pass());
  // the same through check_tensor (element tolerances): bf16 floor 1e-3 + half an ulp at 1
  EXPECT_TRUE(check_tensor("o", DType::bf16, {1.0 + 0.0049}, {1.0}, {1.0}).pass());
  EXPECT_FALSE(check_tensor("o", DType::bf16, {1.0 + 0.0051}, {1.0}, {1.0}).pass());
}

// docs/semantics.md "Conditioning": an element's tolerance is the tensor's, or its
// conditioning allowance where that is larger. Under the tensor tolerance alone (the rule
// before the allowance) the first element below fails.
TEST(ElementTolerance, AllowanceAboveTheTensorToleranceAdmitsThatElementOnly) {
  const std::vector<double> exact = {10.0, 10.0, 10.0}, naive = exact;
  const std::vector<double> allowance = {1.0, 0.0, 1.0};
  const std::vector<double> out = {10.5, 10.0, 10.0};
  EXPECT_FALSE(check_tensor("o", DType::f32, out, naive, exact).pass());  // without the allowance
  const TensorCheck c = check_tensor("o", DType::f32, out, naive, exact, -1.0, false, {.allowance = &allowance});
  EXPECT_TRUE(c.pass());
  EXPECT_DOUBLE_EQ(c.excess, 0.5);
  EXPECT_EQ(c.allowed, 2);
  EXPECT_DOUBLE_EQ(c.max_allowance, 1.0);
  // the same error on the element without an allowance is a failure, reported there
  const TensorCheck bad =
      check_tensor("o", DType::f32, {10.0, 10.5, 10.0}, naive, exact, -1.0, false, {.allowance = &allowance});
  EXPECT_FALSE(bad.pass());
  EXPECT_EQ(bad.err.worst_index, 1);
  EXPECT_DOUBLE_EQ(bad.err.worst_tol, bad.tol);
  EXPECT_GT(bad.excess, 1000.0);
}

TEST(ElementTolerance, AllowanceBelowTheTensorToleranceKeepsItExactly) {
  const std::vector<double> exact = {10.0, -3.0}, naive = {10.0, -3.0};
  const double tol = check_tensor("o", DType::f32, exact, naive, exact).tol;
  const std::vector<double> allowance = {0.5 * tol, 0.999 * tol};
  const ElementTerms terms{.allowance = &allowance};
  EXPECT_TRUE(check_tensor("o", DType::f32, {10.0 + 0.99 * tol, -3.0}, naive, exact, -1.0, false, terms).pass());
  EXPECT_FALSE(check_tensor("o", DType::f32, {10.0 + 1.01 * tol, -3.0}, naive, exact, -1.0, false, terms).pass());
  EXPECT_FALSE(check_tensor("o", DType::f32, {10.0, -3.0 - 1.01 * tol}, naive, exact, -1.0, false, terms).pass());
  EXPECT_EQ(check_tensor("o", DType::f32, exact, naive, exact, -1.0, false, terms).allowed, 0);
}

TEST(ElementTolerance, WorstElementIsTheOneFurthestOverItsTolerance) {
  const std::vector<double> exact = {0.0, 0.0}, naive = exact, allowance = {100.0, 0.0};
  // element 0 has the larger error, element 1 the larger excess
  const TensorCheck c =
      check_tensor("dq", DType::f32, {50.0, 0.01}, naive, exact, -1.0, false, {.allowance = &allowance});
  EXPECT_FALSE(c.pass());
  EXPECT_DOUBLE_EQ(c.err.max_abs_err, 50.0);
  EXPECT_EQ(c.err.worst_index, 1);
  EXPECT_DOUBLE_EQ(c.err.worst_value, 0.01);
}

// docs/semantics.md "fp32 overflow is never a finite wrong answer": non-finite outputs agree
// exactly where the conditioning says some fp32 intermediate can exceed FLT_MAX.
TEST(NonFinitePolicy, OverflowFlagsAdmitNonFiniteOnlyWhereSet) {
  const std::vector<double> exact = {1.0, 2.0, 3.0}, naive = exact;
  const std::vector<std::uint8_t> flags = {1, 0, 1};
  const ElementTerms terms{.overflow = &flags};
  EXPECT_TRUE(check_tensor("dq", DType::bf16, {kInf, 2.0, kNan}, naive, exact, -1.0, false, terms).pass());
  EXPECT_TRUE(check_tensor("dq", DType::bf16, {-kInf, 2.0, 3.0}, naive, exact, -1.0, false, terms).pass());
  EXPECT_FALSE(check_tensor("dq", DType::bf16, {1.0, kInf, 3.0}, naive, exact, -1.0, false, terms).pass());
  // a finite value where overflow was possible is still checked
  EXPECT_FALSE(check_tensor("dq", DType::bf16, {1.5, 2.0, 3.0}, naive, exact, -1.0, false, terms).pass());
  // an LSE of -inf is the "no key" answer, never overflow
  EXPECT_FALSE(check_tensor("lse", DType::f32, {-kInf, 2.0, 3.0}, naive, exact, -1.0, false, terms).pass());
  EXPECT_TRUE(check_tensor("lse", DType::f32, {kInf, 2.0, 3.0}, naive, exact, -1.0, false, terms).pass());
  // without flags (the rule before): every one of these fails
  EXPECT_FALSE(check_tensor("dq", DType::bf16, {kInf, 2.0, 3.0}, naive, exact).pass());
}

// An exact value beyond the dtype's range rounds to infinity: that infinity is the answer
// (f16 gradients above 65520, an LSE below -FLT_MAX), never a finite value.
TEST(NonFinitePolicy, ExactValuesBeyondTheDtypeRangeRoundToInfinity) {
  EXPECT_DOUBLE_EQ(strideattn::harness::overflow_threshold(DType::f16), 65520.0);
  EXPECT_DOUBLE_EQ(strideattn::harness::overflow_threshold(DType::f32), std::ldexp(2.0 - std::ldexp(1.0, -24), 127));
  EXPECT_TRUE(check_tensor("dv", DType::f16, {kInf, -kInf}, {kInf, -kInf}, {7e4, -1e5}).pass());
  EXPECT_FALSE(check_tensor("dv", DType::f16, {-kInf}, {65504.0}, {7e4}).pass());     // the wrong sign
  EXPECT_FALSE(check_tensor("dv", DType::f16, {kInf}, {65408.0}, {65400.0}).pass());  // finite in f16
  EXPECT_TRUE(check_tensor("lse", DType::f32, {-kInf}, {kNan}, {-1e50}).pass());
  // an allowance that reaches past 65520: a value it admits rounds to inf in f16
  const std::vector<double> allowance = {2000.0};
  const ElementTerms terms{.allowance = &allowance};
  EXPECT_TRUE(check_tensor("dq", DType::f16, {kInf}, {64000.0}, {64000.0}, -1.0, false, terms).pass());
  EXPECT_FALSE(check_tensor("dq", DType::f16, {-kInf}, {64000.0}, {64000.0}, -1.0, false, terms).pass());
  EXPECT_FALSE(check_tensor("dq", DType::f16, {kInf}, {64000.0}, {64000.0}).pass());
  EXPECT_FALSE(check_tensor("lse", DType::f32, {-kInf}, {-3e38}, {-3e38}).pass());
}

// docs/semantics.md "Non-finite values": what a case with planted NaN/Inf inputs accepts.
TEST(NonFinitePolicy, PlantedInputsDemandNanWhereTheReferenceIsNan) {
  const strideattn::harness::NonFinitePolicy planted{.inputs_non_finite = true};
  EXPECT_EQ(compare({kNan}, {kNan}, planted).non_finite, 0);
  EXPECT_EQ(compare({1.0}, {kNan}, planted).non_finite, 1);  // a hidden NaN
  EXPECT_EQ(compare({kInf}, {kNan}, planted).non_finite, 1);
  EXPECT_EQ(compare({-kInf}, {kNan}, planted).non_finite, 1);  // the "no key" answer
  EXPECT_EQ(compare({kInf}, {kInf}, planted).non_finite, 0);
  EXPECT_EQ(compare({kNan}, {kInf}, planted).non_finite, 0);  // 0 * inf
  EXPECT_EQ(compare({3.0}, {kInf}, planted).non_finite, 1);
  EXPECT_EQ(compare({kNan}, {1.0}, planted).non_finite, 0);  // a leak through a shared tile
  // finite outputs are still compared
  EXPECT_DOUBLE_EQ(compare({kNan, 1.5}, {1.0, 1.0}, planted).max_abs_err, 0.5);
}

TEST(NonFinitePolicy, NaiveOverflowAllowsNonFiniteButNeverTheNoKeyAnswer) {
  const std::vector<double> naive = {kNan, 2.0};
  const strideattn::harness::NonFinitePolicy overflow{.naive = &naive, .lse = true};
  EXPECT_EQ(compare({kNan, 2.0}, {5.0, 2.0}, overflow).non_finite, 0);
  EXPECT_EQ(compare({kInf, 2.0}, {5.0, 2.0}, overflow).non_finite, 0);
  EXPECT_EQ(compare({-kInf, 2.0}, {5.0, 2.0}, overflow).non_finite, 1);  // LSE of "no key"
  const strideattn::harness::NonFinitePolicy grad{.naive = &naive};
  EXPECT_EQ(compare({-kInf, 2.0}, {5.0, 2.0}, grad).non_finite, 0);     // a gradient: overflow
  EXPECT_EQ(compare({5.0, kNan}, {5.0, 2.0}, overflow).non_finite, 1);  // naive finite there
  // without planted inputs a NaN reference never passes
  EXPECT_EQ(compare({kNan, 2.0}, {kNan, 2.0}, overflow).non_finite, 1);
}

}  // namespace
