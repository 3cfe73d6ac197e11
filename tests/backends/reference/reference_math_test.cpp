// reference_compute and the reference backend on the semantics that need more than one
// problem to state: GQA/MQA equals MHA with repeated K/V heads (dK/dV summed over the group),
// varlen equals per-sequence dense problems with padding written as documented,
// finite-difference gradients of L = sum(O * dO), and what the naive low-precision model is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "ref_case.hpp"

namespace reftest {
namespace {

using strideattn::MaskKind;
using strideattn::detail::reference_compute;
using strideattn::detail::ReferenceOutputs;
using strideattn::detail::RefPrecision;

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::isinf(a[i]) && a[i] == b[i]) continue;
    m = std::max(m, std::fabs(a[i] - b[i]));
    if (std::isnan(a[i]) || std::isnan(b[i])) m = kInf;
  }
  return m;
}

// --------------------------------------------------------------------- GQA / MQA

// A GQA problem (h query heads, hg KV heads) against the MHA problem whose K/V heads are the
// GQA heads repeated: O, LSE and dQ agree; dK/dV of KV head g equal the sum over the group.
void check_gqa(std::int64_t h, std::int64_t hg, MaskKind mask) {
  CaseSpec s;
  s.b = 2, s.sq = 5, s.skv = 7, s.h = h, s.hg = hg, s.dqk = 8, s.dv = 16;
  s.options.mask = mask;
  s.options.window = {3, -1};
  Case g(s, 51);
  CaseSpec ms = s;
  ms.hg = h;
  Case m(ms, 52);
  const std::int64_t group = h / hg;
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t i = 0; i < s.sq; ++i)
      for (std::int64_t hh = 0; hh < h; ++hh) {
        for (std::int64_t d = 0; d < s.dqk; ++d) m.q.set(b, i, hh, d, g.q.get(b, i, hh, d));
        for (std::int64_t d = 0; d < s.dv; ++d) m.d_o.set(b, i, hh, d, g.d_o.get(b, i, hh, d));
      }
    for (std::int64_t j = 0; j < s.skv; ++j)
      for (std::int64_t hh = 0; hh < h; ++hh) {
        for (std::int64_t d = 0; d < s.dqk; ++d) m.k.set(b, j, hh, d, g.k.get(b, j, hh / group, d));
        for (std::int64_t d = 0; d < s.dv; ++d) m.v.set(b, j, hh, d, g.v.get(b, j, hh / group, d));
      }
  }
  const ReferenceOutputs rg = reference_compute(g.problem(true), RefPrecision::exact);
  const ReferenceOutputs rm = reference_compute(m.problem(true), RefPrecision::exact);
  EXPECT_EQ(max_abs_diff(rg.o, rm.o), 0.0);
  EXPECT_EQ(max_abs_diff(rg.lse, rm.lse), 0.0);
  EXPECT_EQ(max_abs_diff(rg.dq, rm.dq), 0.0);
  std::vector<double> dk_sum(rg.dk.size(), 0.0), dv_sum(rg.dv.size(), 0.0);
  for (std::int64_t b = 0; b < s.b; ++b)
    for (std::int64_t j = 0; j < s.skv; ++j)
      for (std::int64_t hh = 0; hh < h; ++hh) {
        const std::int64_t kh = hh / group;
        for (std::int64_t d = 0; d < s.dqk; ++d)
          dk_sum[std::size_t(((b * s.skv + j) * hg + kh) * s.dqk + d)] +=
              rm.dk[std::size_t(((b * s.skv + j) * h + hh) * s.dqk + d)];
        for (std::int64_t d = 0; d < s.dv; ++d)
          dv_sum[std::size_t(((b * s.skv + j) * hg + kh) * s.dv + d)] +=
              rm.dv[std::size_t(((b * s.skv + j) * h + hh) * s.dv + d)];
      }
  EXPECT_LT(max_abs_diff(rg.dk, dk_sum), 1e-12);
  EXPECT_LT(max_abs_diff(rg.dv, dv_sum), 1e-12);
  double dk_norm = 0;
  for (double x : rg.dk) dk_norm = std::max(dk_norm, std::fabs(x));
  EXPECT_GT(dk_norm, 1e-3);  // the comparison is not between zeros

  // The backend through the API writes the same numbers (rounded to f32).
  g.run_both();
  EXPECT_LT(max_abs_diff(g.dk.logical(), rg.dk), 1e-6);
  EXPECT_LT(max_abs_diff(g.dv.logical(), rg.dv), 1e-6);
}

TEST(ReferenceGqa, GroupedHeadsSumOverTheGroup) { check_gqa(6, 2, MaskKind::causal_bottom_right); }
TEST(ReferenceGqa, MultiQuery) { check_gqa(4, 1, MaskKind::none); }

// --------------------------------------------------------------------- varlen

// Varlen with empty sequences, gaps between sequences and a tail, against each sequence as
// its own dense problem; padding tokens of every output hold 0 (LSE -inf).
TEST(ReferenceVarlen, EqualsPerSequenceDenseAndWritesPadding) {
  const std::vector<std::int64_t> lq{3, 0, 5, 2, 4}, lk{4, 2, 0, 6, 4};
  const std::vector<std::int64_t> oq{1, 4, 6, 13, 15}, ok{0, 6, 8, 9, 17};  // gaps + tails
  for (MaskKind mask : {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right}) {
    SCOPED_TRACE(std::string(strideattn::to_string(mask)));
    CaseSpec s;
    s.b = 1, s.sq = 21, s.skv = 23, s.h = 4, s.hg = 2, s.dqk = 8, s.dv = 8;
    s.options.mask = mask;
    s.options.window = {2, 1};
    s.varlen = {lq, lk, oq, ok};
    s.order = Order::sbhd;
    s.pad = 2;
    Case c(s, 61);
    c.run_both();
    for (const Tensor* t : {&c.o, &c.dq, &c.dk, &c.dv}) EXPECT_TRUE(written_and_guarded(*t));

    std::vector<bool> q_used(std::size_t(s.sq), false), k_used(std::size_t(s.skv), false);
    for (std::size_t n = 0; n < lq.size(); ++n) {
      for (std::int64_t t = 0; t < lq[n]; ++t) q_used[std::size_t(oq[n] + t)] = true;
      for (std::int64_t t = 0; t < lk[n]; ++t) k_used[std::size_t(ok[n] + t)] = true;
      CaseSpec ds = s;
      ds.varlen = {};
      ds.sq = lq[n], ds.skv = lk[n];
      ds.order = Order::bshd, ds.pad = 0;
      Case dense(ds, 62);
      auto copy = [](const Tensor& from, std::int64_t t0, Tensor& to) {
        for (std::int64_t t = 0; t < to.view.shape[1]; ++t)
          for (std::int64_t h = 0; h < to.view.shape[2]; ++h)
            for (std::int64_t d = 0; d < to.view.shape[3]; ++d) to.set(0, t, h, d, from.get(0, t0 + t, h, d));
      };
      copy(c.q, oq[n], dense.q);
      copy(c.d_o, oq[n], dense.d_o);
      copy(c.k, ok[n], dense.k);
      copy(c.v, ok[n], dense.v);
      const ReferenceOutputs r = reference_compute(dense.problem(true), RefPrecision::exact);
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t t = 0; t < lq[n]; ++t) {
          const double want_lse = r.lse[std::size_t(h * lq[n] + t)];
          const double got_lse = c.lse_at(0, h, oq[n] + t);
          if (std::isinf(want_lse))
            EXPECT_EQ(got_lse, want_lse);
          else
            EXPECT_NEAR(got_lse, want_lse, 1e-5);
          for (std::int64_t d = 0; d < s.dv; ++d) {
            EXPECT_NEAR(c.o.get(0, oq[n] + t, h, d), r.o[std::size_t((t * s.h + h) * s.dv + d)], 1e-6);
            EXPECT_NEAR(c.dq.get(0, oq[n] + t, h, d), r.dq[std::size_t((t * s.h + h) * s.dqk + d)], 1e-5);
          }
        }
      for (std::int64_t h = 0; h < s.hg; ++h)
        for (std::int64_t t = 0; t < lk[n]; ++t)
          for (std::int64_t d = 0; d < s.dqk; ++d) {
            EXPECT_NEAR(c.dk.get(0, ok[n] + t, h, d), r.dk[std::size_t((t * s.hg + h) * s.dqk + d)], 1e-5);
            EXPECT_NEAR(c.dv.get(0, ok[n] + t, h, d), r.dv[std::size_t((t * s.hg + h) * s.dv + d)], 1e-5);
          }
    }
    // Padding tokens: exactly 0 (LSE -inf).
    for (std::int64_t t = 0; t < s.sq; ++t) {
      if (q_used[std::size_t(t)]) continue;
      for (std::int64_t h = 0; h < s.h; ++h) {
        EXPECT_EQ(c.lse_at(0, h, t), -kInf) << "token " << t;
        for (std::int64_t d = 0; d < s.dv; ++d) EXPECT_EQ(c.o.get(0, t, h, d), 0.0) << "token " << t;
        for (std::int64_t d = 0; d < s.dqk; ++d) EXPECT_EQ(c.dq.get(0, t, h, d), 0.0) << "token " << t;
      }
    }
    for (std::int64_t t = 0; t < s.skv; ++t) {
      if (k_used[std::size_t(t)]) continue;
      for (std::int64_t h = 0; h < s.hg; ++h) {
        for (std::int64_t d = 0; d < s.dqk; ++d) EXPECT_EQ(c.dk.get(0, t, h, d), 0.0) << "token " << t;
        for (std::int64_t d = 0; d < s.dv; ++d) EXPECT_EQ(c.dv.get(0, t, h, d), 0.0) << "token " << t;
      }
    }
  }
}

// --------------------------------------------------------------------- finite differences

// L = sum(O * dO) with dO fixed; central differences of the fp64 reference (f32 inputs,
// perturbed by representable steps) against the analytic dQ, dK, dV.
TEST(ReferenceGradient, FiniteDifferences) {
  for (MaskKind mask : {MaskKind::causal_bottom_right, MaskKind::causal}) {
    SCOPED_TRACE(std::string(strideattn::to_string(mask)));
    CaseSpec s;
    s.b = 2, s.sq = 4, s.skv = 5, s.h = 4, s.hg = 2, s.dqk = 8, s.dv = 4;
    s.options.mask = mask;
    s.options.window = {2, -1};
    s.options.scale = 0.7;
    Case c(s, 71);
    const ReferenceOutputs r = reference_compute(c.problem(true), RefPrecision::exact);
    auto loss = [&] {
      const ReferenceOutputs f = reference_compute(c.problem(false), RefPrecision::exact);
      const std::vector<double> d_o = c.d_o.logical();
      double l = 0;
      for (std::size_t i = 0; i < f.o.size(); ++i) l += f.o[i] * d_o[i];
      return l;
    };
    auto check = [&](Tensor& x, const std::vector<double>& grad, const char* name) {
      const auto& n = x.view.shape;
      double worst = 0, largest = 0;
      std::size_t idx = 0;
      for (std::int64_t b = 0; b < n[0]; ++b)
        for (std::int64_t t = 0; t < n[1]; ++t)
          for (std::int64_t h = 0; h < n[2]; ++h)
            for (std::int64_t d = 0; d < n[3]; ++d, ++idx) {
              const double x0 = x.get(b, t, h, d);
              x.set(b, t, h, d, x0 + 1e-3);
              const double xp = x.get(b, t, h, d);
              const double lp = loss();
              x.set(b, t, h, d, x0 - 1e-3);
              const double xm = x.get(b, t, h, d);
              const double lm = loss();
              x.set(b, t, h, d, x0);
              const double fd = (lp - lm) / (xp - xm);
              worst = std::max(worst, std::fabs(fd - grad[idx]));
              largest = std::max(largest, std::fabs(grad[idx]));
            }
      EXPECT_LT(worst, 2e-6) << name;
      EXPECT_GT(largest, 1e-2) << name;  // a real gradient, not zeros compared with zeros
    };
    check(c.q, r.dq, "dq");
    check(c.k, r.dk, "dk");
    check(c.v, r.dv, "dv");
  }
}

// The backend's backward reads O as given: with the forward's own outputs it matches
// reference_compute; with a different O the gradients change (rowsum(dO * O) moves) and
// match reference_compute's given_o mode.
TEST(ReferenceGradient, BackendUsesGivenOAndLse) {
  CaseSpec s;
  s.sq = 6, s.skv = 6, s.h = 2, s.hg = 1, s.dqk = 8, s.dv = 8;
  s.options.mask = MaskKind::causal;
  Case c(s, 81);
  c.run_both();
  const ReferenceOutputs r = reference_compute(c.problem(true), RefPrecision::exact);
  EXPECT_LT(max_abs_diff(c.dq.logical(), r.dq), 1e-6);
  EXPECT_LT(max_abs_diff(c.dk.logical(), r.dk), 1e-6);
  EXPECT_LT(max_abs_diff(c.dv.logical(), r.dv), 1e-6);

  const std::vector<double> dq_before = c.dq.logical(), dv_before = c.dv.logical();
  c.o.set(0, 3, 1, 0, c.o.get(0, 3, 1, 0) + 0.5);
  c.run_backward();
  EXPECT_GT(max_abs_diff(c.dq.logical(), dq_before), 1e-3);
  EXPECT_EQ(max_abs_diff(c.dv.logical(), dv_before), 0.0);  // dV = P^T dO does not read O
  // reference_compute's given_o mode is the exact backward of the given O.
  const ReferenceOutputs g =
      reference_compute(c.problem(true), RefPrecision::exact, strideattn::detail::RefBackwardInputs::given_o);
  EXPECT_LT(max_abs_diff(c.dq.logical(), g.dq), 1e-6);
  EXPECT_LT(max_abs_diff(c.dk.logical(), g.dk), 1e-6);
  EXPECT_GT(max_abs_diff(g.dq, r.dq), 1e-3);
}

// --------------------------------------------------------------------- naive low precision

// bf16: the naive model differs from exact by a plausible amount (P rounded to bf16 before
// P.V, O rounded), its values are bf16 numbers, and its LSE (fp32 math on the same bf16
// inputs) is far closer to exact than its O.
TEST(ReferenceNaive, Bf16DiffersPlausibly) {
  CaseSpec s;
  s.dtype = strideattn::DType::bf16;
  s.b = 2, s.sq = 33, s.skv = 40, s.h = 4, s.hg = 2, s.dqk = 64, s.dv = 32;
  s.options.mask = MaskKind::causal_bottom_right;
  Case c(s, 91);
  const auto p = c.problem(true);
  const ReferenceOutputs ex = reference_compute(p, RefPrecision::exact);
  const ReferenceOutputs nv = reference_compute(p, RefPrecision::naive_lowp);
  const double err_o = max_abs_diff(nv.o, ex.o);
  EXPECT_GT(err_o, 1e-4);
  EXPECT_LT(err_o, 5e-2);
  for (auto [n, e] : {std::pair{&nv.dq, &ex.dq}, {&nv.dk, &ex.dk}, {&nv.dv, &ex.dv}}) {
    const double err = max_abs_diff(*n, *e);
    EXPECT_GT(err, 1e-4);
    EXPECT_LT(err, 5e-2);
  }
  EXPECT_LT(max_abs_diff(nv.lse, ex.lse), 1e-4);
  for (const std::vector<double>* v : {&nv.o, &nv.dq, &nv.dk, &nv.dv})
    for (double x : *v) ASSERT_EQ(double(strideattn::detail::round_to(s.dtype, float(x))), x);
}

// f32: the naive model is plain fp32 math, close to exact but (with these sizes) not equal.
TEST(ReferenceNaive, F32IsFp32Math) {
  CaseSpec s;
  s.b = 1, s.sq = 17, s.skv = 23, s.h = 2, s.hg = 1, s.dqk = 32, s.dv = 32;
  Case c(s, 92);
  const auto p = c.problem(true);
  const ReferenceOutputs ex = reference_compute(p, RefPrecision::exact);
  const ReferenceOutputs nv = reference_compute(p, RefPrecision::naive_lowp);
  for (auto [n, e] : {std::pair{&nv.o, &ex.o}, {&nv.dq, &ex.dq}, {&nv.dk, &ex.dk}, {&nv.dv, &ex.dv}}) {
    const double err = max_abs_diff(*n, *e);
    EXPECT_GT(err, 0.0);
    EXPECT_LT(err, 1e-5);
    for (double x : *n) ASSERT_EQ(double(float(x)), x);  // fp32 values
  }
}

// Outputs of the naive model follow the same zero/-inf rules as exact.
TEST(ReferenceNaive, EmptyRowsAndPaddingMatchExact) {
  CaseSpec s;
  s.dtype = strideattn::DType::f16;
  s.b = 1, s.sq = 12, s.skv = 10, s.h = 2, s.hg = 1, s.dqk = 8, s.dv = 8;
  s.options.mask = MaskKind::causal_bottom_right;
  s.varlen = {{5, 0, 4}, {2, 3, 4}, {0, 6, 7}, {0, 3, 6}};
  Case c(s, 93);
  const auto p = c.problem(true);
  const ReferenceOutputs ex = reference_compute(p, RefPrecision::exact);
  const ReferenceOutputs nv = reference_compute(p, RefPrecision::naive_lowp);
  for (std::size_t i = 0; i < ex.lse.size(); ++i) EXPECT_EQ(std::isinf(ex.lse[i]), std::isinf(nv.lse[i]));
  for (std::size_t i = 0; i < ex.o.size(); ++i)
    if (ex.o[i] == 0.0) EXPECT_EQ(nv.o[i], 0.0);
}

}  // namespace
}  // namespace reftest
