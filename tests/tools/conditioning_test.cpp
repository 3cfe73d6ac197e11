// The conditioning allowances and overflow flags of the correctness rule
// (tools/harness/conditioning.hpp, docs/semantics.md "Conditioning"), on problems whose
// answers are known by construction: unit-scale rows get no allowance at all (the tensor's
// tolerance holds exactly), one-hot rows none at any magnitude, near-tied rows up to the gap
// between the tied keys' values, and the overflow flags mark exactly the rows whose fp32
// scores can exceed FLT_MAX.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>

#include "backends/reference/ref_case.hpp"
#include "harness/conditioning.hpp"

namespace {

using reftest::Case;
using reftest::CaseSpec;
using strideattn::DType;
using strideattn::harness::Conditioning;
using strideattn::harness::conditioning;
using strideattn::harness::fp32_gamma;

double max_of(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, x);
  return m;
}
int count(const std::vector<std::uint8_t>& v) {
  int n = 0;
  for (auto x : v) n += x;
  return n;
}

// Every input N(0,1)-ish (uniform in [-1, 1)): the largest score bound is far below the gate
// (2^-10), so no element of any output gets an allowance and no overflow flag is set.
TEST(Conditioning, UnitScaleRowsKeepTheTensorTolerance) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (std::int64_t d : {8, 64, 256}) {
      CaseSpec s;
      s.dtype = dt, s.b = 2, s.sq = 19, s.skv = 37, s.h = 4, s.hg = 2, s.dqk = d, s.dv = 24;
      s.options.mask = strideattn::MaskKind::causal_bottom_right;
      const Case c(s, 3);
      const Conditioning k = conditioning(c.problem(true), true, true, false);
      for (const auto* v : {&k.o, &k.lse, &k.dq, &k.dk, &k.dv}) EXPECT_EQ(max_of(*v), 0.0) << to_string(dt) << d;
      for (const auto* f : {&k.o_overflow, &k.lse_overflow, &k.dq_overflow, &k.dk_overflow, &k.dv_overflow})
        EXPECT_EQ(count(*f), 0);
    }
}

// One query, keys 0..3 with scores x * (4, 2, 1, 0.5): key 0 leads by half its score. At
// every magnitude the softmax is one-hot, and no fp32 evaluation can change that: O's and
// dV's allowances stay at fp32 rounding of the values, LSE's at a relative few ulps.
TEST(Conditioning, OneHotRowsHaveNoAllowanceAtAnyMagnitude) {
  for (double x : {1e3, 1e6, 1e12, 1e20, 1e30}) {
    CaseSpec s;
    s.dtype = DType::bf16, s.sq = 1, s.skv = 4, s.dqk = 8, s.dv = 8;
    s.options.scale = 1.0;
    Case c(s, 5);
    const double root = std::sqrt(x / 8);  // q.k = 8 root^2 c_j = x c_j
    const double weight[] = {4, 2, 1, 0.5};
    for (std::int64_t d = 0; d < 8; ++d) {
      c.q.set(0, 0, 0, d, root);
      for (std::int64_t j = 0; j < 4; ++j) c.k.set(0, j, 0, d, root * weight[j]);
    }
    const Conditioning k = conditioning(c.problem(true), true, true, false);
    double vmax = 0, domax = 0;
    for (double v : c.v.logical()) vmax = std::max(vmax, std::fabs(v));
    for (double v : c.d_o.logical()) domax = std::max(domax, std::fabs(v));
    EXPECT_LE(max_of(k.o), 1e-12 * vmax) << x;
    EXPECT_LE(max_of(k.dv), 1e-6 * domax) << x;  // the exponent's own rounding: ~2^-23
    EXPECT_GT(max_of(k.lse), 0.0) << x;          // the score itself may carry rounding
    EXPECT_LE(max_of(k.lse), 1e-4 * 4 * x) << x;
    EXPECT_EQ(count(k.o_overflow), 0) << x;
  }
}

// Two keys whose scores differ by 1 at magnitude 1e10: fp32 cannot tell them apart, so O may
// be either key's V (the allowance covers the gap), the others' allowance stays 0.
TEST(Conditioning, NearTiedRowsMayGiveEitherKey) {
  CaseSpec s;
  s.dtype = DType::f32, s.sq = 2, s.skv = 2, s.dqk = 2, s.dv = 4;
  s.options.scale = 1.0;
  Case c(s, 7);
  c.q.set(0, 0, 0, 0, 1e5), c.q.set(0, 0, 0, 1, 1);  // row 0: scores 1e10 and 1e10 - 1
  c.k.set(0, 0, 0, 0, 1e5), c.k.set(0, 0, 0, 1, 0);
  c.k.set(0, 1, 0, 0, 1e5), c.k.set(0, 1, 0, 1, -1);
  c.q.set(0, 1, 0, 0, 1e-4), c.q.set(0, 1, 0, 1, 0);  // row 1: scores 10 and 10
  const Conditioning k = conditioning(c.problem(false), true, false, false);
  for (std::int64_t d = 0; d < 4; ++d) {
    const double gap = std::fabs(c.v.get(0, 0, 0, d) - c.v.get(0, 1, 0, d));
    EXPECT_GE(k.o[std::size_t(d)], 0.45 * gap) << d;  // row 0, element d
    EXPECT_EQ(k.o[std::size_t(4 + d)], 0.0) << d;     // row 1
  }
}

// The score bound E_j = gamma(d) A_j + gamma(4) (A_j + max A), A_j = scale sum |q k_j|; a row
// that sees one key has LSE = its score, and LSE's allowance is E exactly.
TEST(Conditioning, ScoreBoundIsTheFp32DotProductBound) {
  for (DType dt : {DType::f32, DType::bf16}) {
    CaseSpec s;
    s.dtype = dt, s.sq = 1, s.skv = 1, s.dqk = 16, s.dv = 8;
    s.options.scale = 0.5;
    Case c(s, 9);
    for (std::int64_t d = 0; d < 16; ++d) c.q.set(0, 0, 0, d, d % 2 ? 64.0 : -64.0), c.k.set(0, 0, 0, d, 32.0);
    const Conditioning k = conditioning(c.problem(false), true, false, false);
    const double w = dt == DType::f32 ? 0x1p-24 : 0x1p-23;
    const double a = 0.5 * 16 * 64 * 32;  // the score itself is 0
    EXPECT_DOUBLE_EQ(k.lse[0], fp32_gamma(16, w) * a + fp32_gamma(4, w) * 2 * a) << to_string(dt);
  }
  EXPECT_DOUBLE_EQ(fp32_gamma(4, 0x1p-24), 4 * 0x1p-24 / (1 - 4 * 0x1p-24));
  EXPECT_TRUE(std::isinf(fp32_gamma(1e10)));
}

// Rows whose fp32 scores can exceed FLT_MAX (some order's partial sums reach the sum of
// |q_d k_d|) may be non-finite; the rows next to them may not.
TEST(Conditioning, OverflowFlagsMarkRowsWhoseScoreBoundExceedsFltMax) {
  CaseSpec s;
  s.dtype = DType::bf16, s.sq = 3, s.skv = 5, s.dqk = 8, s.dv = 8;
  s.options.scale = 1.0;
  Case c(s, 11);
  for (std::int64_t d = 0; d < 8; ++d) {
    c.q.set(0, 0, 0, d, 1e19);                  // |q||k| terms 1e19 * 1e19: 8e38 > FLT_MAX
    c.q.set(0, 1, 0, d, 1e18);                  // 8e36 (with every order's slack): below
    c.q.set(0, 2, 0, d, d % 2 ? 1e19 : -1e19);  // score 0, but some order's partial sums reach 4e38
    for (std::int64_t j = 0; j < 5; ++j) c.k.set(0, j, 0, d, 1e19);
  }
  const Conditioning k = conditioning(c.problem(true), true, true, false);
  EXPECT_EQ(k.lse_overflow, (std::vector<std::uint8_t>{1, 0, 1}));
  for (std::int64_t e = 0; e < 8; ++e) {
    EXPECT_EQ(k.o_overflow[std::size_t(e)], 1);
    EXPECT_EQ(k.o_overflow[std::size_t(8 + e)], 0);
    EXPECT_EQ(k.dq_overflow[std::size_t(e)], 1);
  }
  // every key is seen by an overflowing row: its dK and dV may overflow too
  EXPECT_EQ(count(k.dk_overflow), 5 * 8);
  EXPECT_EQ(count(k.dv_overflow), 5 * 8);
}

// dV of a key sums dO over the rows that see it: with dO of 2e36, 200 rows on one key reach
// 4e38 > FLT_MAX (flagged), 10 rows 2e37 (not), though every row on its own is unit-scale
// in its scores.
TEST(Conditioning, DvOverflowFlagsCountEveryRowThatSeesTheKey) {
  for (std::int64_t rows : {10, 200}) {
    CaseSpec s;
    s.dtype = DType::bf16, s.sq = rows, s.skv = 1, s.dqk = 8, s.dv = 8;
    Case c(s, 13);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t d = 0; d < 8; ++d) c.d_o.set(0, i, 0, d, 2e36);
    const Conditioning k = conditioning(c.problem(true), true, true, false);
    EXPECT_EQ(count(k.dv_overflow), rows == 200 ? 8 : 0) << rows;
    EXPECT_EQ(count(k.o_overflow), 0) << rows;
  }
}

}  // namespace
