// `cpu` training features at the edges of fp32 (docs/semantics.md "Non-finite values,
// overflow and the scale"): scores whose fp32 dot products overflow with the wrong sign (the
// first product overflows one way, the sum lies the other way) under a softcap (the exact,
// finite answer) and with sinks (a non-finite LSE, never the sink's), on the AVX2 and the
// portable inner loops; and a fully broadcast dBias over 2^17 (batch, head, row) terms per
// element against the fp64 reference, within a bound that a serial fp32 sum misses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/cpu_kernels.hpp"
#include "backends/cpu/feature_case.hpp"

namespace strideattn {
namespace {

using test_support::FeatureCase;
using i64 = std::int64_t;

// Storage index of element (batch bb, position t, head hh, column c) of a FeatureCase view.
std::size_t at(const FeatureCase& c, i64 heads, i64 bb, i64 t, i64 hh, i64 x) {
  return std::size_t(t * c.vb() * c.row(heads) + bb * c.row(heads) + hh * c.d + x);
}

// Query rows `qrows` of every batch and head get entries of magnitude ~1e20 (positive); key
// rows `krows` of kv head 0 in every batch get k[0] = sign * 1e20, k[1] = -sign * 3e20: with
// FMA the fp32 dot product overflows to sign * inf at its first term, while the exact score
// is about -sign * 2e40 (scale 1/sqrt(8): beyond FLT_MAX either way).
void plant(FeatureCase& c, const std::vector<i64>& qrows, const std::vector<i64>& krows, float sign,
           std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(1.f, 2.f);
  for (i64 bb = 0; bb < c.b; ++bb) {
    for (i64 t : qrows)
      for (i64 hh = 0; hh < c.h; ++hh)
        for (i64 x = 0; x < c.d; ++x) c.q[at(c, c.h, bb, t, hh, x)] = 1e20f * u(rng);
    for (i64 t : krows) {
      c.k[at(c, c.hg, bb, t, 0, 0)] = sign * 1e20f * u(rng);
      c.k[at(c, c.hg, bb, t, 0, 1)] = -sign * 3e20f * u(rng);
    }
  }
}

// got within 1e-4 * max|want| + 1e-5 of want, element by element (every element finite).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  float m = 0;
  for (float e : want) m = std::max(m, std::fabs(e));
  const float tol = 1e-4f * m + 1e-5f;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(std::isfinite(want[i]) && std::fabs(got[i] - want[i]) <= tol)
        << what << "[" << i << "] = " << got[i] << " vs " << want[i] << " (tol " << tol << ")";
}

// Runs `body` on the AVX2 inner loops (where the machine has them) and on the portable ones.
template <class Body>
void both_kernels(Body body) {
  auto& force = detail::cpu::force_portable_kernels();
  for (bool portable : {false, true}) {
    SCOPED_TRACE(portable ? "portable kernels" : "default kernels");
    force = portable;
    body();
  }
  force = false;
}

// Softcap c: the logit of a pair whose score overflows is -c or +c exactly, so the exact
// answer is finite and fp32 can represent it: cpu must give it (the old code capped the
// wrong-signed infinity: LSE +c where the exact value is -c).
TEST(CpuFeaturesOverflow, SoftcapOfAnOverflowingScoreHasTheExactSign) {
  both_kernels([] {
    for (float sign : {1.f, -1.f}) {
      FeatureCase c;
      c.b = 2, c.s_q = 4, c.s_kv = 6, c.h = 2, c.hg = 1, c.d = 8;
      c.options.softcap = 3.5;
      c.fill(101 + (sign > 0));
      plant(c, {0, 2}, {1, 4}, sign, 7);
      FeatureCase::Out rf = c.forward(Backend::reference);
      ASSERT_TRUE(rf.status.ok()) << rf.status.message();
      FeatureCase::Out cf = c.forward(Backend::cpu);
      ASSERT_TRUE(cf.status.ok()) << cf.status.message();
      expect_close(c.logical(cf.o, c.tq(), c.h), c.logical(rf.o, c.tq(), c.h), "o");
      expect_close(cf.lse, rf.lse, "lse");
      FeatureCase::Out rb = c.backward(Backend::reference, rf.o, rf.lse);
      ASSERT_TRUE(rb.status.ok()) << rb.status.message();
      FeatureCase::Out cb = c.backward(Backend::cpu, rf.o, rf.lse);
      ASSERT_TRUE(cb.status.ok()) << cb.status.message();
      expect_close(c.logical(cb.dq, c.tq(), c.h), c.logical(rb.dq, c.tq(), c.h), "dq");
      expect_close(c.logical(cb.dk, c.tk(), c.hg), c.logical(rb.dk, c.tk(), c.hg), "dk");
      expect_close(c.logical(cb.dv, c.tk(), c.hg), c.logical(rb.dv, c.tk(), c.hg), "dv");
    }
  });
}

// Sinks: rows 0 and 2 see a key whose exact score (about +2e40) lies beyond fp32 while fp32
// sums it to -inf. Their exact LSE is beyond fp32, so it must come out non-finite and not
// -inf (the old code dropped the key: the LSE of the other keys and the sink, or the sink
// itself in batch 1, where every key overflows); their O is non-finite or exact. Rows 1
// and 3 do not overflow and must match the reference.
TEST(CpuFeaturesOverflow, SinkNeverHidesAnOverflowingLse) {
  both_kernels([] {
    FeatureCase c;
    c.b = 2, c.s_q = 4, c.s_kv = 5, c.h = 2, c.hg = 1, c.d = 8;
    c.sinks = true;
    c.fill(211);
    plant(c, {0, 2}, {3}, -1.f, 9);
    // Batch 1: every key overflows for rows 0 and 2.
    for (i64 t = 0; t < c.s_kv; ++t) {
      c.k[at(c, c.hg, 1, t, 0, 0)] = -1e20f * float(1 + t);
      c.k[at(c, c.hg, 1, t, 0, 1)] = 3e20f * float(2 + t);
    }
    FeatureCase::Out rf = c.forward(Backend::reference);
    ASSERT_TRUE(rf.status.ok()) << rf.status.message();
    FeatureCase::Out cf = c.forward(Backend::cpu);
    ASSERT_TRUE(cf.status.ok()) << cf.status.message();
    for (i64 bb = 0; bb < c.b; ++bb)
      for (i64 hh = 0; hh < c.h; ++hh)
        for (i64 t = 0; t < c.s_q; ++t) {
          SCOPED_TRACE(testing::Message() << "b " << bb << " h " << hh << " row " << t);
          const std::size_t e = std::size_t((bb * c.h + hh) * c.tq() + t);
          const bool overflows = t == 0 || t == 2;
          if (overflows) {
            EXPECT_TRUE(std::isinf(rf.lse[e]) && rf.lse[e] > 0) << rf.lse[e];  // fp64 ~2e40, rounded
            EXPECT_FALSE(std::isfinite(cf.lse[e])) << cf.lse[e];
            EXPECT_NE(cf.lse[e], -std::numeric_limits<float>::infinity());
          } else {
            EXPECT_NEAR(cf.lse[e], rf.lse[e], 1e-5f * std::fabs(rf.lse[e]) + 1e-4f);
          }
          for (i64 x = 0; x < c.d; ++x) {
            const std::size_t o = at(c, c.h, bb, t, hh, x);
            ASSERT_TRUE(std::isfinite(rf.o[o]));
            if (overflows && !std::isfinite(cf.o[o])) continue;
            EXPECT_NEAR(cf.o[o], rf.o[o], 1e-4f) << "o column " << x;
          }
        }
  });
}

// dBias of a fully broadcast bias [1, 1, 1, s_kv] sums b * h * s_q = 2^17 terms per element.
// dO leans along V's key 0, so dL of that key has one sign and the sum grows with the rows,
// where a serial fp32 sum loses most. The bound, 2e-7 of the sum of |terms|, holds for the
// pairwise merge with a 40x margin and is missed by a serial fp32 sum of the fp64 terms by
// 25x (the test checks that it is missed at all, so it can tell the two apart).
TEST(CpuFeaturesOverflow, BroadcastDbiasIsABlockedSum) {
  FeatureCase c;
  c.b = 4, c.s_q = 4096, c.s_kv = 4, c.h = 8, c.hg = 2, c.d = 4;
  c.bias_shape = {1, 1, 1, c.s_kv};
  c.dbias = true;
  c.fill(307);
  for (i64 bb = 0; bb < c.b; ++bb)
    for (i64 t = 0; t < c.s_kv; ++t)
      for (i64 hh = 0; hh < c.hg; ++hh) c.v[at(c, c.hg, bb, t, hh, 0)] += t == 0 ? 3.f : 0.f;
  for (i64 bb = 0; bb < c.b; ++bb)
    for (i64 t = 0; t < c.s_q; ++t)
      for (i64 hh = 0; hh < c.h; ++hh) c.d_o[at(c, c.h, bb, t, hh, 0)] += 1.f;
  FeatureCase::Out rf = c.forward(Backend::reference);
  ASSERT_TRUE(rf.status.ok()) << rf.status.message();
  FeatureCase::Out rb = c.backward(Backend::reference, rf.o, rf.lse);
  ASSERT_TRUE(rb.status.ok()) << rb.status.message();
  FeatureCase::Out cb = c.backward(Backend::cpu, rf.o, rf.lse);
  ASSERT_TRUE(cb.status.ok()) << cb.status.message();

  // The terms dL[i, j] = P (dP - D) in fp64 from the given O and LSE (post-scale bias: the
  // logit is scale q.k + bias), summed in fp64 (the oracle) and serially in fp32.
  const double scale = 1.0 / std::sqrt(double(c.d));
  std::vector<double> exact(std::size_t(c.s_kv), 0.0), abs_sum(std::size_t(c.s_kv), 0.0);
  std::vector<float> serial(std::size_t(c.s_kv), 0.f);
  for (i64 bb = 0; bb < c.b; ++bb)
    for (i64 hh = 0; hh < c.h; ++hh) {
      const i64 kh = hh / (c.h / c.hg);
      for (i64 t = 0; t < c.s_q; ++t) {
        const double lse = rf.lse[std::size_t((bb * c.h + hh) * c.tq() + t)];
        double dd = 0;
        for (i64 x = 0; x < c.d; ++x) dd += double(c.d_o[at(c, c.h, bb, t, hh, x)]) * rf.o[at(c, c.h, bb, t, hh, x)];
        for (i64 j = 0; j < c.s_kv; ++j) {
          double s = 0, dp = 0;
          for (i64 x = 0; x < c.d; ++x) {
            s += double(c.q[at(c, c.h, bb, t, hh, x)]) * c.k[at(c, c.hg, bb, j, kh, x)];
            dp += double(c.d_o[at(c, c.h, bb, t, hh, x)]) * c.v[at(c, c.hg, bb, j, kh, x)];
          }
          const double term = std::exp(scale * s + c.bias[std::size_t(j)] - lse) * (dp - dd);
          exact[std::size_t(j)] += term, abs_sum[std::size_t(j)] += std::fabs(term);
          serial[std::size_t(j)] += float(term);
        }
      }
    }
  double serial_worst = 0;
  for (i64 j = 0; j < c.s_kv; ++j) {
    const std::size_t e = std::size_t(j);
    const double bound = 2e-7 * abs_sum[e];
    EXPECT_NEAR(rb.dbias[e], exact[e], 1e-7 * abs_sum[e]) << "the reference, key " << j;
    EXPECT_LE(std::fabs(cb.dbias[e] - exact[e]), bound)
        << "cpu dbias, key " << j << ": " << cb.dbias[e] << " vs " << exact[e];
    serial_worst = std::max(serial_worst, std::fabs(serial[e] - exact[e]) / bound);
  }
  EXPECT_GT(serial_worst, 1.0) << "a serial fp32 sum meets the bound too: the test cannot tell";
}

}  // namespace
}  // namespace strideattn
