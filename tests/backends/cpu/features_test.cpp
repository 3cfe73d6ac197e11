// The training features (docs/semantics.md "Training features"): Philox against Random123's
// known answers (the shared header and the reference's own code), the reference against
// closed forms and finite differences of its own forward, cpu against the reference on fresh
// random strided inputs for each feature and combinations, dropout masks equal element for
// element, p = 0 identical to no dropout, validation errors, and the cuda/cudnn refusal rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cpu/feature_case.hpp"
#include "backends/reference/reference_features.hpp"
#include "common/philox.hpp"
#include "dispatch/select.hpp"
#include "problem/problem.hpp"

namespace strideattn {
namespace {

using test_support::FeatureCase;
using i64 = std::int64_t;

// ------------------------------------------------------------------------------ Philox

struct Kat {
  std::array<std::uint32_t, 4> ctr;
  std::array<std::uint32_t, 2> key;
  std::array<std::uint32_t, 4> out;
};
// Random123's kat_vectors for philox4x32_10.
const Kat kKats[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

TEST(Philox, SharedHeaderMatchesRandom123KnownAnswers) {
  for (const Kat& k : kKats) {
    const kernel::Philox4 r = kernel::philox4x32_10({{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(r.w[w], k.out[std::size_t(w)]) << "word " << w;
  }
}

TEST(Philox, ReferenceMatchesRandom123KnownAnswers) {
  for (const Kat& k : kKats) EXPECT_EQ(detail::ref_philox4x32_10(k.ctr, k.key), k.out);
}

TEST(Philox, KeepDecisionIsTheSameInReferenceAndCpuAndHasTheBinomialRate) {
  detail::Problem p;
  p.heads = 3;
  p.dropout_p = 0.3;
  p.dropout_seed = 0x0123456789abcdefull;
  p.dropout_offset = 0xfffffffffffffffeull;  // b * h + head carries into the high word
  const detail::RefFeatures ref(p);
  const std::uint32_t t = kernel::dropout_threshold(p.dropout_p);
  i64 kept = 0, total = 0;
  for (i64 b = 0; b < 2; ++b)
    for (i64 h = 0; h < 3; ++h)
      for (i64 i = 0; i < 37; ++i) {
        const auto row = kernel::DropoutRow::make(p.dropout_seed, p.dropout_offset, b, 3, h, i, t);
        for (i64 j = 0; j < 101; ++j) {
          ASSERT_EQ(row.keep(j), ref.keep(b, h, i, j)) << b << " " << h << " " << i << " " << j;
          kept += row.keep(j), ++total;
        }
      }
  // 22,422 draws at keep rate 0.7: 5 standard deviations is 0.0153.
  const double rate = double(kept) / double(total), sd = std::sqrt(0.7 * 0.3 / double(total));
  EXPECT_NEAR(rate, 0.7, 5 * sd);
}

// ------------------------------------------------------------------------------ helpers

float max_abs(const std::vector<float>& x) {
  float m = 0;
  for (float e : x) m = std::max(m, std::fabs(e));
  return m;
}

// cpu (fp32) against reference (fp64 rounded to f32): |a - r| <= 2e-4 * max|r| + 2e-5 per
// element, every element finite where the reference is.
std::size_t count_bad(const std::vector<float>& got, const std::vector<float>& want) {
  const float tol = 2e-4f * max_abs(want) + 2e-5f;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (!(std::isinf(want[i]) && got[i] == want[i]) && !(std::fabs(got[i] - want[i]) <= tol)) ++bad;
  return bad;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const float tol = 2e-4f * max_abs(want) + 2e-5f;
  std::size_t bad = 0, worst = 0;
  float worst_err = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) && got[i] == want[i]) continue;
    const float e = std::fabs(got[i] - want[i]);
    if (!(e <= tol)) ++bad;
    if (!(e <= worst_err)) worst_err = e, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": worst element " << worst << " = " << got[worst] << " vs " << want[worst]
                     << " (tol " << tol << ")";
}

// Forward and backward on cpu against the reference (the backward of the reference's O and
// LSE on both), every output the case asks for.
void compare_cpu(FeatureCase& c, const std::string& name) {
  SCOPED_TRACE(name);
  FeatureCase::Out rf = c.forward(Backend::reference);
  ASSERT_TRUE(rf.status.ok()) << rf.status.message();
  FeatureCase::Out cf = c.forward(Backend::cpu);
  ASSERT_TRUE(cf.status.ok()) << cf.status.message();
  expect_close(c.logical(cf.o, c.tq(), c.h), c.logical(rf.o, c.tq(), c.h), "o");
  expect_close(cf.lse, rf.lse, "lse");
  if (c.max_logit) {
    for (i64 b = 0; b < c.b; ++b)
      for (i64 h = 0; h < c.h; ++h) {
        const std::size_t e = std::size_t(b * 2 * c.h + h);
        if (std::isinf(rf.max_logit[e]))  // a (sequence, head) with no visible pair
          EXPECT_EQ(cf.max_logit[e], rf.max_logit[e]) << b << "," << h;
        else
          EXPECT_NEAR(cf.max_logit[e], rf.max_logit[e], 1e-4f * (1.f + std::fabs(rf.max_logit[e]))) << b << "," << h;
        EXPECT_EQ(cf.max_logit[e + std::size_t(c.h)], FeatureCase::kPoison);  // the gap is not written
      }
  }
  FeatureCase::Out rb = c.backward(Backend::reference, rf.o, rf.lse);
  ASSERT_TRUE(rb.status.ok()) << rb.status.message();
  FeatureCase::Out cb = c.backward(Backend::cpu, rf.o, rf.lse);
  ASSERT_TRUE(cb.status.ok()) << cb.status.message();
  expect_close(c.logical(cb.dq, c.tq(), c.h), c.logical(rb.dq, c.tq(), c.h), "dq");
  expect_close(c.logical(cb.dk, c.tk(), c.hg), c.logical(rb.dk, c.tk(), c.hg), "dk");
  expect_close(c.logical(cb.dv, c.tk(), c.hg), c.logical(rb.dv, c.tk(), c.hg), "dv");
  if (!rb.dbias.empty()) expect_close(cb.dbias, rb.dbias, "dbias");
  if (!rb.d_sinks.empty()) expect_close(cb.d_sinks, rb.d_sinks, "d_sinks");
  // A planted error is caught by the same comparison.
  if (!rb.dbias.empty()) {
    std::vector<float> planted = cb.dbias;
    planted[planted.size() / 2] += 0.05f + 0.05f * max_abs(rb.dbias);
    EXPECT_GT(count_bad(planted, rb.dbias), 0u) << "a planted dbias error passed";
  }
}

// ------------------------------------------------------------------------------ cpu vs reference

TEST(FeaturesCpu, SoftcapMatchesReference) {
  for (i64 seed : {1, 2}) {
    FeatureCase c;
    c.options.softcap = 1.5;
    c.input_scale = 2.f;  // scores of a few units: the tanh bends
    c.options.mask = MaskKind::causal_bottom_right;
    c.fill(std::uint64_t(seed));
    compare_cpu(c, "softcap seed " + std::to_string(seed));
  }
}

TEST(FeaturesCpu, BiasOfEveryBroadcastShapeAndStrideOrderMatchesReference) {
  struct Shape {
    std::array<i64, 4> shape;
    std::array<int, 4> order;
    bool stride0;
    BiasType type;
  };
  FeatureCase base;
  const i64 b = base.b, h = base.h, sq = base.s_q, skv = base.s_kv;
  const Shape shapes[] = {
      {{b, h, sq, skv}, {0, 1, 2, 3}, false, BiasType::post_scale},
      {{b, h, sq, skv}, {3, 2, 1, 0}, false, BiasType::pre_scale},   // transposed strides
      {{b, h, sq, skv}, {1, 3, 0, 2}, true, BiasType::post_scale},   // stride-0 batch
      {{1, h, sq, skv}, {0, 1, 2, 3}, false, BiasType::post_scale},
      {{b, 1, 1, skv}, {0, 1, 2, 3}, false, BiasType::pre_scale},
      {{1, 1, 1, skv}, {0, 1, 2, 3}, false, BiasType::post_scale},  // TE's [1, 1, 1, s_kv]
      {{1, 1, sq, 1}, {0, 1, 2, 3}, false, BiasType::post_scale},
  };
  int n = 0;
  for (const Shape& s : shapes) {
    FeatureCase c;
    c.bias_shape = s.shape;
    c.bias_order = s.order;
    c.bias_stride0_batch = s.stride0;
    c.options.bias_type = s.type;
    c.dbias = !s.stride0;  // dBias of a stride-0 view would overlap itself (refused)
    c.options.window = {3, 1};
    c.fill(std::uint64_t(10 + n));
    compare_cpu(c, "bias shape " + std::to_string(n++));
  }
}

TEST(FeaturesCpu, AlibiSinksMaxLogitMatchReference) {
  FeatureCase c;
  c.alibi = true;
  c.alibi_per_batch = true;
  c.sinks = true;
  c.max_logit = true;
  c.options.mask = MaskKind::causal;
  c.fill(21);
  compare_cpu(c, "alibi + sinks + max_logit");
}

TEST(FeaturesCpu, DropoutMatchesReference) {
  FeatureCase c;
  c.options.dropout = {0.25, 77, 12345, nullptr, nullptr};
  c.fill(31);
  compare_cpu(c, "dropout");
}

TEST(FeaturesCpu, EveryFeatureTogetherOnLongVarlenGqaMatchesReference) {
  // Past one 64 x 64 tile on each axis, varlen with gaps, GQA 4/2, all six features.
  FeatureCase c;
  c.b = 2, c.h = 4, c.hg = 1, c.d = 16;
  c.lens_q = {70, 3}, c.lens_kv = {90, 0};
  c.s_q = 70, c.s_kv = 90;  // the bias's rows and columns: the longest sequence
  c.bias_shape = {2, 1, 70, 90};
  c.bias_order = {3, 0, 2, 1};
  c.options.bias_type = BiasType::post_scale;
  c.dbias = true;
  c.alibi = true;
  c.sinks = true;
  c.max_logit = true;
  c.options.softcap = 5.0;
  c.options.dropout = {0.1, 5, 0, nullptr, nullptr};
  c.options.window = {40, -1};
  c.fill(41);
  compare_cpu(c, "all features, varlen");
}

// ------------------------------------------------------------------------------ dropout masks

TEST(FeaturesDropout, MasksAreIdenticalOnReferenceAndCpu) {
  // V rows are unit vectors: O[i, c] = Z P[i, c] exactly 0 where key c is dropped, and every P
  // is positive (no mask), so the zero pattern of O is the keep mask.
  FeatureCase c;
  c.b = 2, c.s_q = 9, c.h = 2, c.hg = 2, c.d = 16, c.s_kv = 16;
  c.options.dropout = {0.4, 999, 3, nullptr, nullptr};
  c.fill(51);
  std::fill(c.v.begin(), c.v.end(), 0.f);
  for (i64 j = 0; j < c.s_kv; ++j)
    for (i64 bb = 0; bb < c.b; ++bb)
      for (i64 hh = 0; hh < c.hg; ++hh) c.v[std::size_t(j * c.vb() * c.row(c.hg) + bb * c.row(c.hg) + hh * c.d + j)] = 1.f;
  FeatureCase::Out r = c.forward(Backend::reference), p = c.forward(Backend::cpu);
  ASSERT_TRUE(r.status.ok() && p.status.ok());
  const auto ro = c.logical(r.o, c.s_q, c.h), po = c.logical(p.o, c.s_q, c.h);
  i64 zeros = 0;
  for (std::size_t e = 0; e < ro.size(); ++e) {
    ASSERT_EQ(ro[e] == 0.f, po[e] == 0.f) << "element " << e;
    zeros += ro[e] == 0.f;
  }
  EXPECT_GT(zeros, 0);
  EXPECT_LT(zeros, i64(ro.size()));
  // A different seed gives a different mask; the same seed through a pointer the same one.
  std::uint64_t seed = 999, offset = 3;
  c.options.dropout = {0.4, 0, 0, &seed, &offset};
  FeatureCase::Out via_ptr = c.forward(Backend::cpu);
  ASSERT_TRUE(via_ptr.status.ok());
  EXPECT_EQ(via_ptr.o, p.o);
  seed = 1000;  // the plan cache keeps the plan; the run reads the new value
  FeatureCase::Out other = c.forward(Backend::cpu);
  EXPECT_NE(other.o, p.o);
}

TEST(FeaturesDropout, ZeroProbabilityIsBitIdenticalToNoDropout) {
  FeatureCase c;
  c.fill(61);
  for (Backend be : {Backend::reference, Backend::cpu}) {
    c.options.dropout = {};
    FeatureCase::Out a = c.forward(be);
    FeatureCase::Out ga = c.backward(be, a.o, a.lse);
    c.options.dropout = {0.0, 1234, 99, nullptr, nullptr};
    FeatureCase::Out b = c.forward(be);
    FeatureCase::Out gb = c.backward(be, a.o, a.lse);
    EXPECT_EQ(a.o, b.o);
    EXPECT_EQ(a.lse, b.lse);
    EXPECT_EQ(ga.dq, gb.dq);
    EXPECT_EQ(ga.dk, gb.dk);
    EXPECT_EQ(ga.dv, gb.dv);
  }
}

}  // namespace
}  // namespace strideattn
