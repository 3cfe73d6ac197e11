// The `cpu` backend on very long sequences: its sums over key tiles (forward O and l, dQ)
// and over query tiles (dK, dV) must be pairwise, so the error stays near fp32 rounding
// instead of growing with the length (sequential accumulation gave O error 7e-3 at 1e6 keys).
// Stride-0 views repeat one row millions of times in a few bytes and have exact answers:
//   every score equal, P = 1/n, O = V's row, LSE = s + log n.
// Bound used: every partial is a chain of kTilesPerPartial * kBlockKeys = 256 terms (each
// adding at most one rounding of its running sum) and a tree of log2(partials) merges, each
// adding one rounding, plus a few for the final divide and exp, so
//   |err| <= (256 + log2(partials) + 16) * FLT_EPSILON * |exact|   (about 3.5e-5 here)
// against 1e-2 and more for a running sum over millions of terms.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/cpu/cpu_accumulate.hpp"
#include "backends/cpu/cpu_common.hpp"
#include "backends/cpu/cpu_pack.hpp"
#include "strideattn/strideattn.hpp"

namespace {

using strideattn::Backend;
using strideattn::DType;
using strideattn::TensorView;
using strideattn::detail::cpu::kBlockKeys;

constexpr std::int64_t kD = 8;

std::vector<float> normal_row(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> r(kD);
  for (auto& x : r) x = dist(rng);
  return r;
}
double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::int64_t c = 0; c < kD; ++c) s += double(a[c]) * double(b[c]);
  return s;
}
// [1, n, 1, kD]: stride 0 over the sequence (one row repeated), or contiguous.
TensorView rows(std::vector<float>& x, std::int64_t n, bool repeat) {
  return {x.data(), DType::f32, {1, n, 1, kD}, {repeat ? 0 : n * kD, repeat ? 0 : kD, kD, 1}};
}
double bound(std::int64_t n) {
  const double chain = double(kBlockKeys) * strideattn::detail::cpu::kTilesPerPartial;
  return (chain + std::log2(double(n) / chain) + 16) * FLT_EPSILON;
}

// Forward: 5 queries against 5,000,000 copies of one key/value row.
TEST(CpuLong, ForwardOverMillionsOfKeysIsExact) {
  const std::int64_t s_q = 5, n = 5'000'000;
  std::vector<float> q(static_cast<std::size_t>(s_q * kD)), k = normal_row(2), v = normal_row(3);
  for (std::int64_t i = 0; i < s_q; ++i) {
    const auto r = normal_row(10 + i);
    std::copy(r.begin(), r.end(), q.begin() + i * kD);
  }
  std::vector<float> o(q.size(), 12345.f), lse(s_q, 12345.f);
  strideattn::ForwardArgs a;
  a.q = rows(q, s_q, false), a.k = rows(k, n, true), a.v = rows(v, n, true);
  a.o = rows(o, s_q, false);
  a.lse = {lse.data(), {1, 1, s_q}, {s_q, s_q, 1}};
  a.backend = Backend::cpu;
  const strideattn::Status st = strideattn::forward(a);
  ASSERT_TRUE(st.ok()) << st.message();
  const double scale = 1.0 / std::sqrt(double(kD));
  double vmax = 0;
  for (float x : v) vmax = std::max(vmax, double(std::fabs(x)));
  for (std::int64_t i = 0; i < s_q; ++i) {
    for (std::int64_t c = 0; c < kD; ++c)
      EXPECT_NEAR(o[i * kD + c], v[c], bound(n) * vmax) << "row " << i << " col " << c;
    const std::vector<float> qi(q.begin() + i * kD, q.begin() + (i + 1) * kD);
    const double s = scale * dot(qi, k), want = s + std::log(double(n));
    EXPECT_NEAR(lse[i], want, 8 * FLT_EPSILON * (std::fabs(s) + std::fabs(want) + 1)) << i;
  }
}

// dQ over 2,000,000 copies of one key: with the given O = 0, D = 0 and
// dQ = scale * (sum_j P_j) * (dO . V) * K, P_j = exp(s - LSE) for the given LSE.
TEST(CpuLong, DqOverMillionsOfKeysIsExact) {
  const std::int64_t s_q = 3, n = 2'000'000;
  std::vector<float> q(static_cast<std::size_t>(s_q * kD)), d_o(q.size());
  for (std::int64_t i = 0; i < s_q; ++i) {
    const auto r = normal_row(20 + i), g = normal_row(30 + i);
    std::copy(r.begin(), r.end(), q.begin() + i * kD);
    std::copy(g.begin(), g.end(), d_o.begin() + i * kD);
  }
  std::vector<float> k = normal_row(4), v = normal_row(5), o(q.size(), 0.f), lse(s_q);
  const double scale = 1.0 / std::sqrt(double(kD));
  for (std::int64_t i = 0; i < s_q; ++i) {
    const std::vector<float> qi(q.begin() + i * kD, q.begin() + (i + 1) * kD);
    lse[i] = static_cast<float>(scale * dot(qi, k) + std::log(double(n)));
  }
  // dK and dV are outputs: one row per key (outputs must not overlap).
  std::vector<float> dq(q.size(), 12345.f), dk(static_cast<std::size_t>(n * kD)), dv(dk.size());
  auto& budget = strideattn::detail::cpu::pack_budget();  // no fp32 pack of 2e6 keys
  const std::int64_t saved = budget.load();
  budget = 0;
  strideattn::BackwardArgs a;
  a.q = rows(q, s_q, false), a.k = rows(k, n, true), a.v = rows(v, n, true);
  a.o = rows(o, s_q, false), a.d_o = rows(d_o, s_q, false);
  a.lse = {lse.data(), {1, 1, s_q}, {s_q, s_q, 1}};
  a.dq = rows(dq, s_q, false), a.dk = rows(dk, n, false), a.dv = rows(dv, n, false);
  a.backend = Backend::cpu;
  const strideattn::Status st = strideattn::backward(a);
  budget = saved;
  ASSERT_TRUE(st.ok()) << st.message();
  for (std::int64_t i = 0; i < s_q; ++i) {
    const std::vector<float> qi(q.begin() + i * kD, q.begin() + (i + 1) * kD);
    const std::vector<float> gi(d_o.begin() + i * kD, d_o.begin() + (i + 1) * kD);
    const double s = scale * dot(qi, k);
    const double mass = double(n) * std::exp(s - double(lse[i]));
    const double dp = dot(gi, v);
    const double err = bound(n) + 8 * FLT_EPSILON * (std::fabs(s) + std::fabs(lse[i]));
    for (std::int64_t c = 0; c < kD; ++c) {
      const double want = scale * mass * dp * k[c];
      EXPECT_NEAR(dq[i * kD + c], want, err * std::fabs(scale * dp) * 3 + 1e-30) << "row " << i << " col " << c;
    }
  }
}

// dK and dV over 1,000,000 copies of one query row against 3 keys:
// dV_j = n P_j dO, dK_j = scale n P_j (dO . V_j - D) Q with the given O = 0 (D = 0).
TEST(CpuLong, DkDvOverMillionsOfQueriesAreExact) {
  const std::int64_t n = 1'000'000, s_kv = 3;
  std::vector<float> q = normal_row(6), d_o = normal_row(7);
  std::vector<float> k(static_cast<std::size_t>(s_kv * kD)), v(k.size());
  for (std::int64_t j = 0; j < s_kv; ++j) {
    const auto kr = normal_row(40 + j), vr = normal_row(50 + j);
    std::copy(kr.begin(), kr.end(), k.begin() + j * kD);
    std::copy(vr.begin(), vr.end(), v.begin() + j * kD);
  }
  const double scale = 1.0 / std::sqrt(double(kD));
  std::vector<double> s(s_kv);
  double m = -1e300, l = 0;
  for (std::int64_t j = 0; j < s_kv; ++j) {
    const std::vector<float> kj(k.begin() + j * kD, k.begin() + (j + 1) * kD);
    s[j] = scale * dot(q, kj);
    m = std::max(m, s[j]);
  }
  for (double x : s) l += std::exp(x - m);
  const float lse_row = static_cast<float>(m + std::log(l));
  std::vector<float> lse(static_cast<std::size_t>(n), lse_row);
  std::vector<float> o(kD, 0.f), dq(static_cast<std::size_t>(n * kD), 12345.f);
  std::vector<float> dk(k.size(), 12345.f), dv(v.size(), 12345.f);
  // The per-tile path (no fp32 pack of 1e6 rows): the sums are the same.
  auto& budget = strideattn::detail::cpu::pack_budget();
  const std::int64_t saved = budget.load();
  budget = 0;
  strideattn::BackwardArgs a;
  a.q = rows(q, n, true), a.d_o = rows(d_o, n, true), a.o = rows(o, n, true);
  a.k = rows(k, s_kv, false), a.v = rows(v, s_kv, false);
  a.lse = {lse.data(), {1, 1, n}, {n, n, 1}};
  a.dq = rows(dq, n, false), a.dk = rows(dk, s_kv, false), a.dv = rows(dv, s_kv, false);
  a.backend = Backend::cpu;
  const strideattn::Status st = strideattn::backward(a);
  budget = saved;
  ASSERT_TRUE(st.ok()) << st.message();
  for (std::int64_t j = 0; j < s_kv; ++j) {
    const double p = std::exp(s[j] - double(lse_row));
    const std::vector<float> vj(v.begin() + j * kD, v.begin() + (j + 1) * kD);
    const double dp = dot(d_o, vj);
    const double err = bound(n) + 8 * FLT_EPSILON * (std::fabs(s[j]) + std::fabs(lse_row));
    for (std::int64_t c = 0; c < kD; ++c) {
      const double want_v = double(n) * p * d_o[c];
      const double want_k = scale * double(n) * p * dp * q[c];
      EXPECT_NEAR(dv[j * kD + c], want_v, 3 * err * double(n) * p * std::fabs(d_o[c]) + 1e-30)
          << "dV key " << j << " col " << c;
      EXPECT_NEAR(dk[j * kD + c], want_k, 3 * err * std::fabs(want_k) + 1e-30) << "dK key " << j << " col " << c;
    }
  }
}

}  // namespace
