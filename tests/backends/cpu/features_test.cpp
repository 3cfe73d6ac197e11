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
  EXPECT_EQ(bad, 0u) << what << ": worst element " << worst << " = " << got[worst] << " vs " << want[worst] << " (tol "
                     << tol << ")";
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
      {{b, h, sq, skv}, {3, 2, 1, 0}, false, BiasType::pre_scale},  // transposed strides
      {{b, h, sq, skv}, {1, 3, 0, 2}, true, BiasType::post_scale},  // stride-0 batch
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
      for (i64 hh = 0; hh < c.hg; ++hh)
        c.v[std::size_t(j * c.vb() * c.row(c.hg) + bb * c.row(c.hg) + hh * c.d + j)] = 1.f;
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

namespace strideattn {
namespace {

using test_support::FeatureCase;
using i64 = std::int64_t;

// ------------------------------------------------------------------------------ reference

// Sum over the logical O of O * dO: the loss whose gradients the backward returns.
double loss(FeatureCase& c) {
  FeatureCase::Out f = c.forward(Backend::reference);
  EXPECT_TRUE(f.status.ok()) << f.status.message();
  const auto o = c.logical(f.o, c.tq(), c.h), d_o = c.logical(c.d_o, c.tq(), c.h);
  double s = 0;
  for (std::size_t e = 0; e < o.size(); ++e) s += double(o[e]) * double(d_o[e]);
  return s;
}

// Central difference of the loss in *x (a float of the case's inputs); the step actually
// taken is what the floats hold.
double finite_difference(FeatureCase& c, float* x, float step) {
  const float x0 = *x;
  *x = x0 + step;
  const float hi = *x;
  const double up = loss(c);
  *x = x0 - step;
  const float lo = *x;
  const double down = loss(c);
  *x = x0;
  return (up - down) / (double(hi) - double(lo));
}

TEST(FeaturesReference, ClosedFormsOfSinkAlibiBiasAndMaxLogit) {
  // Q = 0: every q.k is 0, so L = bias + ALiBi exactly; one sequence, one head, s_q 2, s_kv 3.
  FeatureCase c;
  c.b = 1, c.s_q = 2, c.s_kv = 3, c.h = 1, c.hg = 1, c.d = 8;
  c.bias_shape = {1, 1, 2, 3};
  c.alibi = true, c.sinks = true, c.max_logit = true;
  c.fill(71);
  std::fill(c.q.begin(), c.q.end(), 0.f);
  const float slope = c.slopes[0], sink = c.sink[0];
  FeatureCase::Out f = c.forward(Backend::reference);
  ASSERT_TRUE(f.status.ok()) << f.status.message();
  double max_l = -INFINITY;
  for (i64 i = 0; i < 2; ++i) {
    double l[3], den = std::exp(double(sink));
    for (i64 j = 0; j < 3; ++j) {
      l[j] = double(c.bias[std::size_t(i * 3 + j)]) - double(slope) * double(std::llabs(i + 3 - 2 - j));
      den += std::exp(l[j]);
      max_l = std::max(max_l, l[j]);
    }
    EXPECT_NEAR(f.lse[std::size_t(i)], std::log(den), 1e-6);
    for (i64 col = 0; col < c.d; ++col) {
      double o = 0;
      for (i64 j = 0; j < 3; ++j) o += std::exp(l[j]) / den * double(c.v[std::size_t(j * c.row(1) + col)]);
      EXPECT_NEAR(f.o[std::size_t(i * c.row(1) + col)], o, 1e-6) << i << "," << col;
    }
  }
  EXPECT_NEAR(f.max_logit[0], max_l, 1e-6);
}

TEST(FeaturesReference, SoftcapClosedForm) {
  FeatureCase c;
  c.b = 1, c.s_q = 1, c.s_kv = 2, c.h = 1, c.hg = 1, c.d = 8;
  c.options.softcap = 2.0;
  c.input_scale = 3.f;
  c.fill(72);
  FeatureCase::Out f = c.forward(Backend::reference);
  ASSERT_TRUE(f.status.ok());
  double den = 0;
  for (i64 j = 0; j < 2; ++j) {
    double qk = 0;
    for (i64 x = 0; x < c.d; ++x) qk += double(c.q[std::size_t(x)]) * double(c.k[std::size_t(j * c.row(1) + x)]);
    den += std::exp(2.0 * std::tanh(qk / std::sqrt(8.0) / 2.0));
  }
  EXPECT_NEAR(f.lse[0], std::log(den), 1e-6);
}

TEST(FeaturesReference, GradientsMatchFiniteDifferencesOfItsForward) {
  // dBias (pre- and post-scale, broadcast over batch), d_sink, and dQ through the softcap and
  // dropout, against central differences of the reference's own forward.
  for (BiasType type : {BiasType::post_scale, BiasType::pre_scale}) {
    FeatureCase c;
    c.b = 2, c.s_q = 3, c.s_kv = 4, c.h = 2, c.hg = 1, c.d = 8;
    c.bias_shape = {1, 2, 3, 4};
    c.options.bias_type = type;
    c.dbias = true;
    c.sinks = true;
    c.alibi = true;
    c.options.softcap = 1.0;
    c.options.dropout = {0.3, 17, 4, nullptr, nullptr};
    c.options.mask = MaskKind::causal_bottom_right;
    c.input_scale = 1.5f;
    c.fill(81);
    FeatureCase::Out f = c.forward(Backend::reference);
    FeatureCase::Out g = c.backward(Backend::reference, f.o, f.lse);
    ASSERT_TRUE(g.status.ok()) << g.status.message();
    const float step = 1e-2f;
    for (std::size_t e : {std::size_t(0), std::size_t(5), std::size_t(11), std::size_t(23)}) {
      const double fd = finite_difference(c, &c.bias[e], step);
      EXPECT_NEAR(g.dbias[e], fd, 2e-4 * (1 + std::fabs(fd))) << "dbias " << e;
    }
    for (std::size_t h = 0; h < 2; ++h) {
      const double fd = finite_difference(c, &c.sink[h], step);
      EXPECT_NEAR(g.d_sinks[h], fd, 2e-4 * (1 + std::fabs(fd))) << "d_sink " << h;
    }
    for (std::size_t e : {std::size_t(0), std::size_t(3), std::size_t(c.row(2) + 9)}) {
      const double fd = finite_difference(c, &c.q[e], step);
      EXPECT_NEAR(g.dq[e], fd, 2e-4 * (1 + std::fabs(fd))) << "dq " << e;
    }
  }
}

// ------------------------------------------------------------------------------ validation

std::string forward_error(FeatureCase& c, void (*change)(ForwardArgs&)) {
  std::vector<float> o(c.size(c.tq(), c.h)), ml(std::size_t(c.b * c.h));
  ForwardArgs a;
  c.set_common(a, Backend::reference);
  a.o = c.view(o, c.tq(), c.h);
  change(a);
  const Status s = strideattn::forward(a);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.message();
  return s.message();
}

TEST(FeaturesValidation, SpecificErrors) {
  FeatureCase c;
  c.fill(91);
  EXPECT_NE(forward_error(c, [](ForwardArgs& a) { a.options.dropout.p = 1.0; }).find("dropout: p = 1"),
            std::string::npos);
  EXPECT_NE(forward_error(c, [](ForwardArgs& a) { a.options.dropout.p = -0.1; }).find("0 <= p < 1"), std::string::npos);
  EXPECT_NE(forward_error(c, [](ForwardArgs& a) { a.options.softcap = -1; }).find("softcap: -1"), std::string::npos);
  EXPECT_NE(forward_error(c, [](ForwardArgs& a) { a.options.softcap = INFINITY; }).find("softcap"), std::string::npos);
  EXPECT_NE(forward_error(c, [](ForwardArgs& a) { a.options.bias_type = BiasType::post_scale; }).find("no bias view"),
            std::string::npos);
  FeatureCase bad = c;
  bad.bias_shape = {2, 3, 5, 7};  // 3 heads of 4
  bad.fill(92);
  EXPECT_NE(forward_error(bad, [](ForwardArgs&) {}).find("bias: head extent 3"), std::string::npos);
  bad.bias_shape = {2, 4, 5, 7};
  bad.bias_dtype = DType::f32;
  bad.fill(93);
  EXPECT_NE(forward_error(bad, [](ForwardArgs& a) { a.options.bias_type = BiasType::none; }).find("bias_type is none"),
            std::string::npos);
  EXPECT_NE(forward_error(bad, [](ForwardArgs& a) { a.bias.dtype = static_cast<DType>(7); }).find("bias: dtype 7"),
            std::string::npos);
  static float table[16];
  EXPECT_NE(forward_error(c,
                          [](ForwardArgs& a) {
                            a.sinks = {table, {2, 4}, {4, 1}};
                          })
                .find("sinks: shape [2, 4]"),
            std::string::npos);
  EXPECT_NE(forward_error(c,
                          [](ForwardArgs& a) {
                            a.alibi_slopes = {table, {1, 3}, {3, 1}};
                          })
                .find("alibi_slopes: shape [1, 3]"),
            std::string::npos);
  EXPECT_NE(forward_error(c,
                          [](ForwardArgs& a) {
                            a.max_logit = {table, {1, 4}, {4, 1}};
                          })
                .find("max_logit: shape [1, 4]"),
            std::string::npos);
  EXPECT_NE(forward_error(c,
                          [](ForwardArgs& a) {
                            a.max_logit = {table, {2, 4}, {4, 1}};
                            a.sinks = {table + 4, {1, 4}, {4, 1}};
                          })
                .find("max_logit overlaps sinks"),
            std::string::npos);
}

TEST(FeaturesValidation, DbiasAndDsinksNeedTheirInputs) {
  FeatureCase c;
  c.fill(94);
  std::vector<float> o(c.size(c.tq(), c.h)), lse(std::size_t(c.b * c.h * c.s_q)), g(c.size(c.tq(), c.h)),
      gk(c.size(c.tk(), c.hg)), gv(c.size(c.tk(), c.hg)), db(std::size_t(2 * 4 * 5 * 7));
  BackwardArgs a;
  c.set_common(a, Backend::cpu);
  a.o = c.view(o, c.tq(), c.h), a.d_o = c.view(c.d_o, c.tq(), c.h);
  a.lse = {lse.data(), {c.b, c.h, c.s_q}, {c.h * c.s_q, c.s_q, 1}};
  a.dq = c.view(g, c.tq(), c.h), a.dk = c.view(gk, c.tk(), c.hg), a.dv = c.view(gv, c.tk(), c.hg);
  a.dbias = {db.data(), DType::f32, {2, 4, 5, 7}, {140, 35, 7, 1}};
  Status s = strideattn::backward(a);
  EXPECT_NE(s.message().find("dbias: a dbias view is given but there is no bias"), std::string::npos) << s.message();
  a.dbias = {};
  float ds[4];
  a.d_sinks = {ds, {1, 4}, {4, 1}};
  s = strideattn::backward(a);
  EXPECT_NE(s.message().find("d_sinks: a d_sinks view is given but there are no sinks"), std::string::npos)
      << s.message();
}

// ------------------------------------------------------------------------------ refusals

// cudnn refuses every feature but the bias and sinks by name (alibi, dropout, softcap and the
// max logit saying why cuDNN cannot; its bias and sinks rules are its own,
// tests/backends/cudnn/rules_test.cpp);
// no rule of cuda's stands in the way of any (its kernels run softcap, dropout, bias, ALiBi,
// sinks and the max logit).
TEST(FeaturesRules, CudaAndCudnnRefuseEachFeatureTheyDoNotRunByName) {
  FeatureCase c;
  c.fill(95);
  std::vector<float> o(c.size(c.tq(), c.h)), ml(std::size_t(c.b * c.h));
  struct Want {
    const char* rule;
    void (*set)(FeatureCase&, ForwardArgs&, std::vector<float>&);
    bool cuda_runs;
  };
  const Want wants[] = {
      {"softcap", [](FeatureCase&, ForwardArgs& a, std::vector<float>&) { a.options.softcap = 30; }, true},
      {"dropout", [](FeatureCase&, ForwardArgs& a, std::vector<float>&) { a.options.dropout.p = 0.1; }, true},
      {"alibi",
       [](FeatureCase& fc, ForwardArgs& a, std::vector<float>&) {
         a.alibi_slopes = {fc.slopes.data(), {1, fc.h}, {fc.h, 1}};
       },
       true},
      {"sinks",
       [](FeatureCase& fc, ForwardArgs& a, std::vector<float>&) {
         a.sinks = {fc.sink.data(), {1, fc.h}, {fc.h, 1}};
       },
       true},
      {"max_logit",
       [](FeatureCase& fc, ForwardArgs& a, std::vector<float>& m) {
         a.max_logit = {m.data(), {fc.b, fc.h}, {fc.h, 1}};
       },
       true},
  };
  for (Backend be : {Backend::cuda, Backend::cudnn}) {
    const std::vector<detail::SupportRule> rules = detail::feature_rules(be);
    for (const Want& w : wants) {
      ForwardArgs a;
      c.set_common(a, Backend::reference);
      a.o = c.view(o, c.tq(), c.h);
      w.set(c, a, ml);
      detail::Problem p;
      ASSERT_TRUE(detail::make_problem(a, &p).ok());
      const Verdict v = detail::evaluate_rules(be, rules, p);
      if ((be == Backend::cuda && w.cuda_runs) || (be == Backend::cudnn && std::string(w.rule) == "sinks")) {
        // (cudnn's own `sinks` rule, backends/cudnn/rules.cpp, decides what of sinks it runs)
        EXPECT_TRUE(v.supported) << w.rule << ": " << v.rule << ": " << v.reason;
        continue;
      }
      EXPECT_FALSE(v.supported);
      EXPECT_EQ(v.rule, w.rule);
      EXPECT_NE(v.reason.find("reference and cpu"), std::string::npos) << v.reason;
      // the reason names the backends that run it
      EXPECT_EQ(v.reason.find("and cuda") != std::string::npos, w.cuda_runs) << v.reason;
      EXPECT_NE(v.reason.find(std::string(to_string(be))), std::string::npos) << v.reason;
      // what cuDNN cannot express is said so, not "not yet"
      const bool definitive = be == Backend::cudnn;
      EXPECT_EQ(v.reason.find("not yet") == std::string::npos, definitive) << v.reason;
    }
    // Bias, with its shape in the reason.
    FeatureCase bc = c;
    bc.bias_shape = {1, 4, 5, 7};
    bc.fill(96);
    ForwardArgs a;
    bc.set_common(a, Backend::reference);
    a.o = bc.view(o, bc.tq(), bc.h);
    detail::Problem p;
    ASSERT_TRUE(detail::make_problem(a, &p).ok());
    const Verdict v = detail::evaluate_rules(be, rules, p);
    if (be == Backend::cuda || be == Backend::cudnn) {
      // cudnn: no generic rule; its own `bias` rule (backends/cudnn/rules.cpp) decides
      EXPECT_TRUE(v.supported) << v.rule << ": " << v.reason;
    } else {
      EXPECT_EQ(v.rule, "bias");
      EXPECT_NE(v.reason.find("post_scale bias [1, 4, 5, 7]"), std::string::npos) << v.reason;
      EXPECT_NE(v.reason.find("and cuda"), std::string::npos) << v.reason;
    }
    // Nothing asked: every feature rule passes.
    ForwardArgs plain;
    c.set_common(plain, Backend::reference);
    plain.o = c.view(o, c.tq(), c.h);
    ASSERT_TRUE(detail::make_problem(plain, &p).ok());
    EXPECT_TRUE(detail::evaluate_rules(be, rules, p).supported);
  }
}

}  // namespace
}  // namespace strideattn
