// The `cpu` backend's scores at large logits: a score whose fp32 dot product could carry more
// rounding than a unit logit's is the exact score rounded once (src/backends/cpu/cpu_common.hpp,
// scale_scores), in the forward and in every backward pass alike. With one key per row the LSE
// is that key's score, so it shows the score bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "host_problem.hpp"

namespace {

using strideattn::Backend;
using strideattn::test_support::HostProblem;

// The definition's score for (row i, head hq) against key 0, rounded once to fp32.
float exact_score(const HostProblem& p, std::int64_t i, std::int64_t hq, double scale) {
  const std::int64_t hk = hq / (p.h / p.hg);
  double dot = 0;
  for (std::int64_t c = 0; c < p.d; ++c)
    dot += double(p.q[p.at(0, p.s_q, p.h, i, hq, c)]) * double(p.k[p.at(0, p.s_kv, p.hg, 0, hk, c)]);
  return static_cast<float>(scale * dot);
}

// Inputs of size 6 at d = 56 (logits near 100, the fuzz case that first showed the fp32 dot
// product's rounding, docs/semantics.md "Conditioning"): every row's LSE is its one score,
// and every score of magnitude 4 or more is the exact one rounded once. An fp32 dot product
// of 56 terms of size 36 misses that by a few ulps on most rows.
TEST(CpuScores, LargeLogitsAreTheExactScoreRoundedOnce) {
  HostProblem p;
  p.b = 1, p.s_q = 96, p.s_kv = 1, p.h = 4, p.hg = 2, p.d = 56;
  p.options.scale = 0.125;
  p.fill(7);
  for (auto* x : {&p.q, &p.k, &p.v, &p.d_o})
    for (float& e : *x) e *= 6.f;
  const HostProblem::Forward f = p.forward(Backend::cpu);
  ASSERT_TRUE(f.status.ok()) << f.status.message();
  int large = 0;
  for (std::int64_t hq = 0; hq < p.h; ++hq)
    for (std::int64_t i = 0; i < p.s_q; ++i) {
      const float want = exact_score(p, i, hq, 0.125), got = f.lse[std::size_t(hq * p.s_q + i)];
      if (std::fabs(want) >= 4.f) {
        ++large;
        EXPECT_EQ(got, want) << "row " << i << " head " << hq;
      } else {
        EXPECT_NEAR(got, want, 1e-4) << "row " << i << " head " << hq;  // the fp32 path
      }
    }
  EXPECT_GE(large, p.h * p.s_q * 3 / 4);  // the draw reaches large logits
}

// The backward recomputes P = exp(S - LSE) from its own scores, whatever its tiles: with one
// key per row P must come out exactly 1 (the backward's score equal to the forward's LSE bit
// for bit), so dV is the sum of dO over the 4 rows that see the key (a GQA group of 2 heads, 2
// rows each) to fp32 rounding. A backward score one ulp (7.6e-6 at 100) off the LSE gives
// P = 1 +- 7.6e-6 and dV off by about 1.5e-4, 10x the bound here.
TEST(CpuScores, BackwardScoresMatchTheForwardLse) {
  HostProblem p;
  p.b = 1, p.s_q = 2, p.s_kv = 1, p.h = 4, p.hg = 2, p.d = 56;
  p.options.scale = 0.125;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    p.fill(seed);
    for (auto* x : {&p.q, &p.k, &p.v, &p.d_o})
      for (float& e : *x) e *= 6.f;
    HostProblem::Forward f = p.forward(Backend::cpu);
    ASSERT_TRUE(f.status.ok()) << f.status.message();
    const HostProblem::Backward g = p.backward(Backend::cpu, f.o, f.lse);
    ASSERT_TRUE(g.status.ok()) << g.status.message();
    for (std::int64_t hk = 0; hk < p.hg; ++hk)
      for (std::int64_t c = 0; c < p.d; ++c) {
        double want = 0, size = 0;
        for (std::int64_t hq = hk * 2; hq < hk * 2 + 2; ++hq)
          for (std::int64_t i = 0; i < p.s_q; ++i) {
            want += p.d_o[p.at(0, p.s_q, p.h, i, hq, c)];
            size += std::fabs(p.d_o[p.at(0, p.s_q, p.h, i, hq, c)]);
          }
        EXPECT_NEAR(g.dv[p.at(0, p.s_kv, p.hg, 0, hk, c)], want, 4e-7 * size) << "seed " << seed;
      }
  }
}

}  // namespace
