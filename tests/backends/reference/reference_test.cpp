// The reference backend through the public API: hand-computed cases, every mask (with
// asymmetric windows and s_q != s_kv both ways) against an independent brute force written
// from the formula in docs/semantics.md, rows with no visible key, strided views with guard
// bands, and the backend's support rule.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "ref_case.hpp"

namespace reftest {
namespace {

using strideattn::MaskKind;

// --------------------------------------------------------------------- hand-computed

// s_kv = 1: every row's softmax is [1], so O = V (whatever Q is) and LSE = scale * q.k.
TEST(ReferenceHand, SingleKeyGivesV) {
  CaseSpec s;
  s.sq = 5, s.skv = 1, s.h = 3, s.hg = 1, s.dqk = 8, s.dv = 16;
  Case c(s, 11);
  c.run_forward();
  for (std::int64_t i = 0; i < s.sq; ++i)
    for (std::int64_t h = 0; h < s.h; ++h) {
      double qk = 0;
      for (std::int64_t d = 0; d < s.dqk; ++d) qk += c.q.get(0, i, h, d) * c.k.get(0, 0, 0, d);
      EXPECT_NEAR(c.lse_at(0, h, i), c.scale() * qk, 1e-6);
      for (std::int64_t d = 0; d < s.dv; ++d)
        EXPECT_EQ(c.o.get(0, i, h, d), c.v.get(0, 0, 0, d)) << "row " << i << " head " << h;
    }
}

// Equal keys: the visible scores are equal, so O = mean of the visible V rows and
// LSE = score + log(count). Causal top-left: row i sees keys 0..i.
TEST(ReferenceHand, EqualKeysGiveMeanOfVisibleValues) {
  CaseSpec s;
  s.sq = 6, s.skv = 6, s.dqk = 8, s.dv = 8;
  s.options.mask = MaskKind::causal;
  Case c(s, 12);
  for (std::int64_t j = 0; j < s.skv; ++j)
    for (std::int64_t d = 0; d < s.dqk; ++d) c.k.set(0, j, 0, d, c.k.get(0, 0, 0, d));
  c.run_forward();
  for (std::int64_t i = 0; i < s.sq; ++i) {
    double qk = 0;
    for (std::int64_t d = 0; d < s.dqk; ++d) qk += c.q.get(0, i, 0, d) * c.k.get(0, 0, 0, d);
    EXPECT_NEAR(c.lse_at(0, 0, i), c.scale() * qk + std::log(double(i + 1)), 1e-6);
    for (std::int64_t d = 0; d < s.dv; ++d) {
      double mean = 0;
      for (std::int64_t j = 0; j <= i; ++j) mean += c.v.get(0, j, 0, d);
      mean /= double(i + 1);
      EXPECT_NEAR(c.o.get(0, i, 0, d), mean, 1e-6) << "row " << i << " dim " << d;
    }
  }
}

// A 2x3 example worked by hand (d = 1, scale = 1): q = [1, 2], k = [0, 1, 2], v = [1, 2, 3].
//   row 0: S = [0, 1, 2], l = 1 + e + e^2 = 11.107337927, O = (1 + 2e + 3e^2) / l
//   row 1: S = [0, 2, 4], l = 1 + e^2 + e^4 = 62.987213867, O = (1 + 2e^2 + 3e^4) / l
// Causal bottom-right (shift s_kv - s_q = 1): row 0 sees keys 0..1, row 1 sees all three.
// Causal top-left: row 0 sees key 0 only (O = 1, LSE = 0), row 1 keys 0..1.
TEST(ReferenceHand, TwoByThreeByHand) {
  struct Expect {
    MaskKind mask;
    double o0, lse0, o1, lse1;
  };
  const Expect cases[] = {
      {MaskKind::none, 2.5752103826044412, 2.40760596444438, 2.850937092220868, 4.142931628499899},
      {MaskKind::causal_bottom_right, 1.7310585786300048, 1.3132616875182228, 2.850937092220868, 4.142931628499899},
      {MaskKind::causal, 1.0, 0.0, 1.8807970779778824, 2.1269280110429727},
  };
  for (const Expect& e : cases) {
    CaseSpec s;
    s.sq = 2, s.skv = 3, s.dqk = 1, s.dv = 1;
    s.options.scale = 1.0;
    s.options.mask = e.mask;
    Case c(s);
    c.q.set(0, 0, 0, 0, 1.0);
    c.q.set(0, 1, 0, 0, 2.0);
    for (int j = 0; j < 3; ++j) {
      c.k.set(0, j, 0, 0, double(j));
      c.v.set(0, j, 0, 0, double(j + 1));
    }
    c.run_forward();
    SCOPED_TRACE(std::string(strideattn::to_string(e.mask)));
    EXPECT_NEAR(c.o.get(0, 0, 0, 0), e.o0, 1e-6);
    EXPECT_NEAR(c.o.get(0, 1, 0, 0), e.o1, 1e-6);
    EXPECT_NEAR(c.lse_at(0, 0, 0), e.lse0, 1e-6);
    EXPECT_NEAR(c.lse_at(0, 0, 1), e.lse1, 1e-6);
  }
}

// --------------------------------------------------------------------- masks vs brute force

struct MaskCase {
  MaskKind mask;
  std::int64_t left, right, sq, skv;
};

void check_against_brute(const MaskCase& m, DType dtype, std::uint64_t seed) {
  CaseSpec s;
  s.dtype = dtype;
  s.b = 2, s.sq = m.sq, s.skv = m.skv, s.h = 2, s.hg = 1, s.dqk = 8, s.dv = 16;
  s.options.mask = m.mask;
  s.options.window = {m.left, m.right};
  s.order = Order::sbhd;
  s.pad = 3;
  Case c(s, seed);
  c.run_both();
  // f32 outputs: the fp64 result rounded once; 16-bit outputs: half an ulp of values <= 4.
  const double tol = dtype == DType::f32 ? 2e-6 : dtype == DType::f16 ? 2e-3 : 1.6e-2;
  for (std::int64_t b = 0; b < s.b; ++b) {
    std::vector<std::vector<double>> dk(std::size_t(s.skv), std::vector<double>(s.dqk, 0.0));
    std::vector<std::vector<double>> dv(std::size_t(s.skv), std::vector<double>(s.dv, 0.0));
    for (std::int64_t h = 0; h < s.h; ++h) {
      const Brute r =
          brute_force(rows_of(c.q, b, h, 0, s.sq), rows_of(c.k, b, 0, 0, s.skv), rows_of(c.v, b, 0, 0, s.skv),
                      rows_of(c.d_o, b, h, 0, s.sq), c.scale(), m.mask, m.left, m.right);
      for (std::int64_t i = 0; i < s.sq; ++i) {
        if (std::isinf(r.lse[i])) {
          EXPECT_TRUE(std::isinf(c.lse_at(b, h, i)) && c.lse_at(b, h, i) < 0) << "row " << i;
        } else {
          EXPECT_NEAR(c.lse_at(b, h, i), r.lse[i], 1e-5) << "row " << i;
        }
        for (std::int64_t d = 0; d < s.dv; ++d)
          ASSERT_NEAR(c.o.get(b, i, h, d), r.o[i][d], tol) << "b " << b << " row " << i << " head " << h;
        for (std::int64_t d = 0; d < s.dqk; ++d)
          ASSERT_NEAR(c.dq.get(b, i, h, d), r.dq[i][d], 2 * tol) << "dq b " << b << " row " << i;
      }
      for (std::int64_t j = 0; j < s.skv; ++j) {
        for (std::int64_t d = 0; d < s.dqk; ++d) dk[j][d] += r.dk[j][d];
        for (std::int64_t d = 0; d < s.dv; ++d) dv[j][d] += r.dv[j][d];
      }
    }
    for (std::int64_t j = 0; j < s.skv; ++j) {
      for (std::int64_t d = 0; d < s.dqk; ++d)
        ASSERT_NEAR(c.dk.get(b, j, 0, d), dk[j][d], 2 * tol) << "dk b " << b << " key " << j;
      for (std::int64_t d = 0; d < s.dv; ++d)
        ASSERT_NEAR(c.dv.get(b, j, 0, d), dv[j][d], 2 * tol) << "dv b " << b << " key " << j;
    }
  }
  EXPECT_TRUE(written_and_guarded(c.o));
  EXPECT_TRUE(written_and_guarded(c.dq));
  EXPECT_TRUE(written_and_guarded(c.dk));
  EXPECT_TRUE(written_and_guarded(c.dv));
}

TEST(ReferenceMask, EveryMaskAndWindowAgainstDocFormula) {
  const std::pair<std::int64_t, std::int64_t> windows[] = {{-1, -1}, {0, 0}, {2, 0},  {0, 3}, {1, -1},
                                                           {-1, 1},  {3, 1}, {-1, 0}, {5, 2}};
  const std::pair<std::int64_t, std::int64_t> sizes[] = {{5, 5}, {3, 7}, {7, 3}, {1, 4}, {4, 1}, {1, 1}};
  std::uint64_t seed = 100;
  for (MaskKind mask : {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right})
    for (auto [left, right] : windows)
      for (auto [sq, skv] : sizes) {
        SCOPED_TRACE(testing::Message() << "mask " << strideattn::to_string(mask) << " window (" << left << "," << right
                                        << ") s_q " << sq << " s_kv " << skv);
        check_against_brute({mask, left, right, sq, skv}, DType::f32, ++seed);
        if (HasFatalFailure()) return;
      }
}

TEST(ReferenceMask, LowPrecisionStorageRoundsTheExactResult) {
  for (DType t : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(std::string(strideattn::to_string(t)));
    check_against_brute({MaskKind::causal_bottom_right, 2, 1, 6, 9}, t, 7);
    check_against_brute({MaskKind::causal, -1, -1, 9, 4}, t, 8);
  }
}

// --------------------------------------------------------------------- rows that see nothing

// Bottom-right causal with s_q > s_kv: the first s_q - s_kv rows see no key. Window (0, -1)
// around the diagonal also leaves keys nobody sees (key j is seen only by row j + s_q - s_kv).
TEST(ReferenceEmptyRows, ZeroOutputMinusInfLseNoNan) {
  CaseSpec s;
  s.sq = 7, s.skv = 3, s.h = 2, s.hg = 2, s.dqk = 8, s.dv = 8;
  s.options.mask = MaskKind::causal_bottom_right;
  Case c(s, 21);
  c.run_both();
  for (std::int64_t h = 0; h < s.h; ++h)
    for (std::int64_t i = 0; i < s.sq; ++i) {
      const bool empty = i < s.sq - s.skv;
      EXPECT_EQ(std::isinf(c.lse_at(0, h, i)) && c.lse_at(0, h, i) < 0, empty) << "row " << i;
      for (std::int64_t d = 0; d < s.dv; ++d) {
        EXPECT_FALSE(std::isnan(c.o.get(0, i, h, d)));
        if (empty) EXPECT_EQ(c.o.get(0, i, h, d), 0.0) << "row " << i;
      }
      for (std::int64_t d = 0; d < s.dqk; ++d) {
        EXPECT_FALSE(std::isnan(c.dq.get(0, i, h, d)));
        if (empty) EXPECT_EQ(c.dq.get(0, i, h, d), 0.0) << "dq row " << i;
      }
    }
}

TEST(ReferenceEmptyRows, UnseenKeysGetZeroGradient) {
  CaseSpec s;
  s.sq = 3, s.skv = 8, s.h = 2, s.hg = 1, s.dqk = 8, s.dv = 8;
  s.options.window = {1, 0};  // row i sees keys i+4, i+5 only: keys 0..3 unseen
  Case c(s, 22);
  c.run_both();
  for (std::int64_t j = 0; j < s.skv; ++j) {
    const bool unseen = j < 4;
    bool all_zero = true;
    for (std::int64_t d = 0; d < s.dqk; ++d) all_zero = all_zero && c.dk.get(0, j, 0, d) == 0.0;
    for (std::int64_t d = 0; d < s.dv; ++d) all_zero = all_zero && c.dv.get(0, j, 0, d) == 0.0;
    EXPECT_EQ(all_zero, unseen) << "key " << j;
  }
}

// --------------------------------------------------------------------- views and support

// Every memory order with padded rows: the same numbers as the packed bshd case, every
// element of every output view written and nothing outside changed.
TEST(ReferenceViews, StridesAreTheTruth) {
  CaseSpec base;
  base.b = 2, base.sq = 5, base.skv = 6, base.h = 4, base.hg = 2, base.dqk = 16, base.dv = 8;
  base.options.mask = MaskKind::causal;
  Case ref(base, 31);
  ref.run_both();
  for (Order order : {Order::sbhd, Order::bhsd})
    for (std::int64_t pad : {0, 5}) {
      CaseSpec s = base;
      s.order = order;
      s.pad = pad;
      Case c(s, 31);  // same seed, same logical values
      c.run_both();
      EXPECT_EQ(c.q.logical(), ref.q.logical());
      EXPECT_EQ(c.o.logical(), ref.o.logical());
      EXPECT_EQ(c.dq.logical(), ref.dq.logical());
      EXPECT_EQ(c.dk.logical(), ref.dk.logical());
      EXPECT_EQ(c.dv.logical(), ref.dv.logical());
      EXPECT_EQ(c.lse.data, ref.lse.data);
      for (const Tensor* t : {&c.o, &c.dq, &c.dk, &c.dv}) EXPECT_TRUE(written_and_guarded(*t));
    }
}

TEST(ReferenceSupport, HostMemoryOnly) {
  CaseSpec s;
  Case c(s);
  strideattn::ForwardArgs a = c.forward_args();
  a.memory = strideattn::Memory::device;
  const strideattn::Status st = strideattn::forward(a);
  EXPECT_EQ(st.code(), strideattn::StatusCode::unsupported) << st.message();
  EXPECT_NE(st.message().find("memory"), std::string::npos) << st.message();
  const strideattn::Explanation ex = strideattn::explain(c.forward_args());
  bool found = false;
  for (const auto& v : ex.verdicts)
    if (v.backend == strideattn::Backend::reference) found = v.supported;
  EXPECT_TRUE(found);
}

TEST(ReferenceSupport, ForwardWithoutLseWritesOnlyO) {
  CaseSpec s;
  s.sq = 3, s.skv = 5;
  Case c(s, 41);
  strideattn::ForwardArgs a = c.forward_args();
  a.lse = {};
  ASSERT_TRUE(strideattn::forward(a).ok());
  EXPECT_TRUE(written_and_guarded(c.o));
  for (float x : c.lse.data) EXPECT_TRUE(std::isnan(x));
}

}  // namespace
}  // namespace reftest
