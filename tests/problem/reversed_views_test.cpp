// Reversed views (negative strides, numpy's x[:, ::-1]) and zero-head problems through the
// public API on the host backends: forward and backward over views with a reversed batch,
// seq, head or head-dim dimension (inputs and outputs, one at a time and all together) give
// what the same backend gives on contiguous copies, and write every output element; an
// empty problem (zero heads) succeeds and writes nothing.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_pack.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn {
namespace {

namespace cpu = detail::cpu;

constexpr std::int64_t B = 2, SQ = 5, SKV = 7, H = 4, HG = 2, D = 8;

// A logical [b, s, h, d] f32 tensor held contiguously in bshd order with some of b, s, h, d
// stored reversed; view() addresses it so that logical (b, s, h, d) is always the same value.
struct Held {
  std::array<std::int64_t, 4> shape;
  std::array<bool, 4> flip{};
  std::vector<float> buf;

  Held(std::int64_t b, std::int64_t s, std::int64_t h, std::array<bool, 4> f)
      : shape{b, s, h, D}, flip(f), buf(static_cast<std::size_t>(b * s * h * D), NAN) {}
  std::array<std::int64_t, 4> contiguous() const { return {shape[1] * shape[2] * D, shape[2] * D, D, 1}; }
  std::size_t index(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    const std::array<std::int64_t, 4> i{b, s, h, d};
    const auto st = contiguous();
    std::int64_t off = 0;
    for (int k = 0; k < 4; ++k) off += (flip[k] ? shape[k] - 1 - i[k] : i[k]) * st[k];
    return static_cast<std::size_t>(off);
  }
  float& at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) { return buf[index(b, s, h, d)]; }
  TensorView view() {
    TensorView v;
    v.dtype = DType::f32;
    v.shape = shape;
    v.stride = contiguous();
    std::int64_t base = 0;
    for (int k = 0; k < 4; ++k) {
      if (!flip[k]) continue;
      base += (shape[k] - 1) * v.stride[k];
      v.stride[k] = -v.stride[k];
    }
    v.data = buf.data() + base;
    return v;
  }
};

struct Result {
  std::vector<float> o, lse, dq, dk, dv;  // logical bshd order ([b, h, s] for lse)
};

// Runs forward then backward on `backend` with the given flips for inputs (q, k, v, dO) and
// outputs (o, dq, dk, dv); returns the outputs in logical order.
Result run(Backend backend, std::array<bool, 4> in_flip, std::array<bool, 4> out_flip, std::uint32_t seed) {
  Held q(B, SQ, H, in_flip), k(B, SKV, HG, in_flip), v(B, SKV, HG, in_flip), d_o(B, SQ, H, in_flip);
  Held o(B, SQ, H, out_flip), dq(B, SQ, H, out_flip), dk(B, SKV, HG, out_flip), dv(B, SKV, HG, out_flip);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (Held* t : {&q, &k, &v, &d_o})
    for (std::int64_t b = 0; b < t->shape[0]; ++b)
      for (std::int64_t s = 0; s < t->shape[1]; ++s)
        for (std::int64_t h = 0; h < t->shape[2]; ++h)
          for (std::int64_t d = 0; d < D; ++d) t->at(b, s, h, d) = normal(rng);
  // LSE [b, h, s_q], its seq dimension reversed when outputs are.
  std::vector<float> lse_buf(static_cast<std::size_t>(B * H * SQ), NAN);
  LseView lse;
  lse.shape = {B, H, SQ};
  lse.stride = {H * SQ, SQ, out_flip[1] ? -1 : 1};
  lse.data = lse_buf.data() + (out_flip[1] ? SQ - 1 : 0);

  ForwardArgs f;
  f.q = q.view(), f.k = k.view(), f.v = v.view(), f.o = o.view(), f.lse = lse;
  f.options.mask = MaskKind::causal_bottom_right;
  f.backend = backend;
  Status s = forward(f);
  EXPECT_TRUE(s.ok()) << s.message();
  BackwardArgs g;
  g.q = q.view(), g.k = k.view(), g.v = v.view(), g.o = o.view(), g.d_o = d_o.view(), g.lse = lse;
  g.dq = dq.view(), g.dk = dk.view(), g.dv = dv.view();
  g.options = f.options;
  g.backend = backend;
  s = backward(g);
  EXPECT_TRUE(s.ok()) << s.message();

  Result r;
  auto logical = [](Held& t, std::vector<float>* out) {
    for (std::int64_t b = 0; b < t.shape[0]; ++b)
      for (std::int64_t s = 0; s < t.shape[1]; ++s)
        for (std::int64_t h = 0; h < t.shape[2]; ++h)
          for (std::int64_t d = 0; d < D; ++d) out->push_back(t.at(b, s, h, d));
  };
  logical(o, &r.o), logical(dq, &r.dq), logical(dk, &r.dk), logical(dv, &r.dv);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < SQ; ++i)
        r.lse.push_back(lse.data[b * lse.stride[0] + h * lse.stride[1] + i * lse.stride[2]]);
  return r;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << "[" << i << "] not written: " << got[i];
    ASSERT_NEAR(got[i], want[i], 1e-5f * (1.f + std::fabs(want[i]))) << what << "[" << i << "]";
  }
}

void match_contiguous_copies(Backend backend);

class ReversedViews : public ::testing::TestWithParam<Backend> {};

TEST_P(ReversedViews, MatchContiguousCopies) {
  const Backend backend = GetParam();
  // cpu: both the packed fp32 copies and, with no pack budget, the per-tile loads.
  for (std::int64_t budget : {cpu::kPackBudgetBytes, std::int64_t{0}}) {
    if (budget == 0 && backend != Backend::cpu) continue;
    cpu::pack_budget() = budget;
    match_contiguous_copies(backend);
  }
  cpu::pack_budget() = cpu::kPackBudgetBytes;
}

void match_contiguous_copies(Backend backend) {
  SCOPED_TRACE("pack budget " + std::to_string(cpu::pack_budget().load()));
  const Result want = run(backend, {}, {}, 7);
  const std::array<std::array<bool, 4>, 5> flips = {{{true, false, false, false},
                                                     {false, true, false, false},
                                                     {false, false, true, false},
                                                     {false, false, false, true},
                                                     {true, true, true, true}}};
  for (const auto& f : flips) {
    for (bool inputs : {true, false}) {
      const std::string what = std::string(to_string(backend)) + (inputs ? " inputs" : " outputs") + " flipped " +
                               std::to_string(f[0]) + std::to_string(f[1]) + std::to_string(f[2]) +
                               std::to_string(f[3]) + ": ";
      const Result got = inputs ? run(backend, f, {}, 7) : run(backend, {}, f, 7);
      expect_close(got.o, want.o, what + "o");
      expect_close(got.lse, want.lse, what + "lse");
      expect_close(got.dq, want.dq, what + "dq");
      expect_close(got.dk, want.dk, what + "dk");
      expect_close(got.dv, want.dv, what + "dv");
    }
  }
}

TEST_P(ReversedViews, ZeroHeadsIsAnEmptyProblem) {
  std::vector<float> poison(64, 42.f);
  auto empty = [&](std::int64_t s) {
    TensorView v;
    v.data = poison.data();
    v.dtype = DType::f32;
    v.shape = {B, s, 0, D};
    v.stride = {0, 0, 0, 1};  // never used: the view has no element
    return v;
  };
  ForwardArgs f;
  f.q = empty(SQ), f.k = empty(SKV), f.v = empty(SKV), f.o = empty(SQ);
  f.backend = GetParam();
  Status s = forward(f);
  EXPECT_TRUE(s.ok()) << s.message();
  BackwardArgs g;
  g.q = empty(SQ), g.k = empty(SKV), g.v = empty(SKV), g.o = empty(SQ), g.d_o = empty(SQ);
  g.dq = empty(SQ), g.dk = empty(SKV), g.dv = empty(SKV);
  g.lse.data = reinterpret_cast<float*>(poison.data());
  g.lse.shape = {B, 0, SQ};
  g.backend = GetParam();
  s = backward(g);
  EXPECT_TRUE(s.ok()) << s.message();
  for (float x : poison) ASSERT_EQ(x, 42.f);
}

INSTANTIATE_TEST_SUITE_P(Host, ReversedViews, ::testing::Values(Backend::reference, Backend::cpu),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace strideattn
