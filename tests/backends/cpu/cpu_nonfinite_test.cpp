// The `cpu` backend on non-finite inputs and fp32 overflow, against the fp64 `reference` on
// the same inputs (the non-finite contract): wherever the reference gives NaN the cpu
// backend gives NaN, wherever it gives +-inf the cpu backend gives a non-finite value, and
// elsewhere both are finite and close. Random shapes, masks, windows and GQA, forward and
// backward, with NaN or infinities planted in Q, K, V or dO. Also: logits that overflow
// fp32 (inputs of size 1e20) give non-finite rows, never O = 0 / LSE = -inf.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "host_problem.hpp"

namespace {

using strideattn::Backend;
using strideattn::MaskKind;
using strideattn::test_support::HostProblem;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Compares `got` (cpu) with `want` (reference) element by element under the contract.
// Returns how many elements the reference made non-finite.
int expect_contract(const std::vector<float>& want, const std::vector<float>& got, const char* name,
                    const std::string& where) {
  double scale = 1.0;
  for (float w : want)
    if (std::isfinite(w)) scale = std::max(scale, double(std::fabs(w)));
  int non_finite = 0, failures = 0;
  for (std::size_t i = 0; i < want.size() && failures < 5; ++i) {
    const float w = want[i], g = got[i];
    bool ok;
    if (std::isnan(w)) {
      ok = std::isnan(g);
    } else if (!std::isfinite(w)) {
      ok = !std::isfinite(g);
    } else {
      ok = std::isfinite(g) && std::fabs(double(g) - double(w)) <= 2e-4 * scale;
    }
    non_finite += !std::isfinite(w);
    if (!ok) {
      ++failures;
      ADD_FAILURE() << where << ": " << name << "[" << i << "] reference " << w << " cpu " << g;
    }
  }
  return non_finite;
}

// One random problem with one planted non-finite value (or row), forward and backward.
// Returns whether the reference made some forward output non-finite (the plant was seen).
bool check_planted(std::uint64_t seed, int kind) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  HostProblem p;
  p.b = pick(1, 2), p.s_q = pick(1, 150), p.s_kv = pick(1, 150);
  p.hg = pick(1, 2), p.h = p.hg * pick(1, 3);
  p.d = 8 * pick(1, 5);
  p.options.mask = static_cast<MaskKind>(pick(0, 2));
  if (pick(0, 2) == 0) p.options.window = {pick(-1, 40), pick(-1, 40)};
  p.fill(seed * 7 + 1);
  const std::int64_t bi = pick(0, p.b - 1);
  const std::int64_t sq = pick(0, p.s_q - 1), skv = pick(0, p.s_kv - 1);
  const std::int64_t hq = pick(0, p.h - 1), hk = pick(0, p.hg - 1), c = pick(0, p.d - 1);
  switch (kind) {
    case 0:
      p.k[p.at(bi, p.s_kv, p.hg, skv, hk, c)] = kNaN;
      break;  // one NaN in a key
    case 1:   // a NaN query row
      for (std::int64_t x = 0; x < p.d; ++x) p.q[p.at(bi, p.s_q, p.h, sq, hq, x)] = kNaN;
      break;
    case 2:  // a key row of -inf
      for (std::int64_t x = 0; x < p.d; ++x) p.k[p.at(bi, p.s_kv, p.hg, skv, hk, x)] = -kInf;
      break;
    case 3:
      p.v[p.at(bi, p.s_kv, p.hg, skv, hk, c)] = kNaN;
      break;  // one NaN in V
    case 4:
      p.q[p.at(bi, p.s_q, p.h, sq, hq, c)] = kInf;
      break;  // +inf in a query
    case 5:
      p.d_o[p.at(bi, p.s_q, p.h, sq, hq, c)] = kNaN;
      break;  // NaN in dO
  }
  const std::string where = "seed " + std::to_string(seed) + " kind " + std::to_string(kind) + " b " +
                            std::to_string(p.b) + " sq " + std::to_string(p.s_q) + " skv " + std::to_string(p.s_kv) +
                            " h " + std::to_string(p.h) + "/" + std::to_string(p.hg) + " d " + std::to_string(p.d) +
                            " mask " + std::to_string(int(p.options.mask)) + " window " +
                            std::to_string(p.options.window.left) + "," + std::to_string(p.options.window.right);
  auto ref = p.forward(Backend::reference);
  auto cpu = p.forward(Backend::cpu);
  EXPECT_TRUE(ref.status.ok()) << ref.status.message();
  EXPECT_TRUE(cpu.status.ok()) << cpu.status.message();
  int bad = expect_contract(ref.o, cpu.o, "O", where);
  bad += expect_contract(ref.lse, cpu.lse, "LSE", where);
  // Backward of the reference's O and LSE (the same inputs for both backends).
  auto rb = p.backward(Backend::reference, ref.o, ref.lse);
  auto cb = p.backward(Backend::cpu, ref.o, ref.lse);
  EXPECT_TRUE(rb.status.ok()) << rb.status.message();
  EXPECT_TRUE(cb.status.ok()) << cb.status.message();
  bad += expect_contract(rb.dq, cb.dq, "dQ", where);
  bad += expect_contract(rb.dk, cb.dk, "dK", where);
  bad += expect_contract(rb.dv, cb.dv, "dV", where);
  return bad > 0;
}

// The case: q, k, v standard normal [1, 4 or 5, h, 8], k[0, 2, 0, 0] = NaN. Every
// row that sees key 2 gets NaN in O and LSE (the cpu backend used to drop the key).
TEST(CpuNonFinite, NaNKeyMakesEveryRowThatSeesItNaN) {
  for (std::int64_t s : {4, 5})
    for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
      HostProblem p;
      p.s_q = p.s_kv = s, p.h = 2, p.hg = 1, p.d = 8;
      p.options.mask = m;
      p.fill(11);
      p.k[p.at(0, s, 1, 2, 0, 0)] = kNaN;
      auto cpu = p.forward(Backend::cpu);
      ASSERT_TRUE(cpu.status.ok()) << cpu.status.message();
      for (std::int64_t i = 0; i < s; ++i)
        for (std::int64_t hh = 0; hh < 2; ++hh) {
          const bool sees = m == MaskKind::none || i >= 2;
          EXPECT_EQ(std::isnan(cpu.lse[static_cast<std::size_t>(hh * s + i)]), sees) << "row " << i << " head " << hh;
          for (std::int64_t c = 0; c < 8; ++c)
            EXPECT_EQ(std::isnan(cpu.o[p.at(0, s, 2, i, hh, c)]), sees) << "row " << i;
        }
    }
}

// A NaN query row gives NaN O and LSE, never the "no key" answer (O = 0, LSE = -inf).
TEST(CpuNonFinite, NaNQueryRowIsNaNNotEmpty) {
  HostProblem p;
  p.s_q = p.s_kv = 70, p.d = 16;
  p.fill(12);
  for (std::int64_t c = 0; c < p.d; ++c) p.q[p.at(0, 70, 1, 65, 0, c)] = kNaN;
  auto cpu = p.forward(Backend::cpu);
  ASSERT_TRUE(cpu.status.ok());
  EXPECT_TRUE(std::isnan(cpu.lse[65])) << cpu.lse[65];
  for (std::int64_t c = 0; c < p.d; ++c) EXPECT_TRUE(std::isnan(cpu.o[p.at(0, 70, 1, 65, 0, c)]));
  EXPECT_TRUE(std::isfinite(cpu.lse[64]));
}

// Random shapes, masks, windows, GQA; each kind of plant; forward and backward.
// Most plants must be seen by some row, or the test proves little.
TEST(CpuNonFinite, MatchesReferenceOnRandomProblems) {
  int seen = 0, cases = 0;
  for (std::uint64_t seed = 1; seed <= 24; ++seed)
    for (int kind = 0; kind < 6; ++kind, ++cases) seen += check_planted(seed * 6 + kind, kind);
  EXPECT_GT(seen, cases / 2);
}

// Finite f32 inputs of size 1e20: the logits overflow fp32 (fp64 does not). Every row that
// sees a key gives non-finite values or the exact answer; LSE is never -inf there. Rows the
// window leaves without keys still give O = 0 and LSE = -inf.
TEST(CpuNonFinite, OverflowingLogitsAreNotTheNoKeyAnswer) {
  HostProblem p;
  p.s_q = 90, p.s_kv = 40, p.h = 2, p.hg = 1, p.d = 16;
  p.options.window = {3, 3};  // rows beyond key 40 + 3 see nothing
  p.fill(13);
  for (auto& x : p.q) x *= 1e20f;
  for (auto& x : p.k) x *= 1e20f;
  auto ref = p.forward(Backend::reference);
  auto cpu = p.forward(Backend::cpu);
  ASSERT_TRUE(ref.status.ok() && cpu.status.ok()) << cpu.status.message();
  int overflowed = 0;
  for (std::int64_t hh = 0; hh < p.h; ++hh)
    for (std::int64_t i = 0; i < p.s_q; ++i) {
      const float lse = cpu.lse[static_cast<std::size_t>(hh * p.s_q + i)];
      // Keys i + s_kv - s_q - 3 .. i + s_kv - s_q + 3 (the reference's LSE, about -1e40 on
      // some rows, is -inf in fp32 and cannot tell).
      const std::int64_t lo = std::max<std::int64_t>(0, i + p.s_kv - p.s_q - 3);
      const std::int64_t hi = std::min<std::int64_t>(p.s_kv, i + p.s_kv - p.s_q + 4);
      if (hi <= lo) {  // no key visible
        EXPECT_EQ(lse, -kInf) << "row " << i;
        for (std::int64_t c = 0; c < p.d; ++c) EXPECT_EQ(cpu.o[p.at(0, p.s_q, p.h, i, hh, c)], 0.f);
        continue;
      }
      EXPECT_NE(lse, -kInf) << "row " << i << " got the no-key answer";
      bool non_finite = !std::isfinite(lse), exact = true;
      for (std::int64_t c = 0; c < p.d; ++c) {
        const std::size_t e = p.at(0, p.s_q, p.h, i, hh, c);
        non_finite |= !std::isfinite(cpu.o[e]);
        exact &= std::fabs(cpu.o[e] - ref.o[e]) <= 1e-5f * (1.f + std::fabs(ref.o[e]));
      }
      overflowed += non_finite;
      EXPECT_TRUE(non_finite || exact) << "row " << i << ": finite and wrong";
    }
  EXPECT_GT(overflowed, 0) << "the case must overflow fp32";
}

}  // namespace
