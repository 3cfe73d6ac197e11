// A dense or varlen attention case for the reference tests: owns Q/K/V/O/dO/dQ/dK/dV test
// tensors and LSE, fills inputs with fresh random values, poisons outputs, and runs the
// public API on the `reference` backend (or builds the validated Problem for
// reference_compute).
#pragma once

#include <gtest/gtest.h>

#include "backends/reference/reference.hpp"
#include "problem/problem.hpp"
#include "ref_test_util.hpp"

namespace reftest {

struct CaseSpec {
  DType dtype = DType::f32;
  std::int64_t b = 1, sq = 4, skv = 4, h = 1, hg = 1, dqk = 8, dv = 8;
  strideattn::AttentionOptions options{};
  strideattn::Varlen varlen{};  // when enabled: b = 1 and sq/skv are token counts
  Order order = Order::bshd;    // memory order of every tensor
  std::int64_t pad = 0;         // row padding (elements) of every tensor
};

struct Case {
  CaseSpec spec;
  Tensor q, k, v, o, d_o, dq, dk, dv;
  LseBuffer lse;

  explicit Case(const CaseSpec& s, std::uint64_t seed = 1) : spec(s) {
    std::mt19937_64 rng(seed);
    const DType t = s.dtype;
    q = make_tensor(t, {s.b, s.sq, s.h, s.dqk}, s.order, s.pad);
    k = make_tensor(t, {s.b, s.skv, s.hg, s.dqk}, s.order, s.pad);
    v = make_tensor(t, {s.b, s.skv, s.hg, s.dv}, s.order, s.pad);
    o = make_tensor(t, {s.b, s.sq, s.h, s.dv}, s.order, s.pad);
    d_o = make_tensor(t, {s.b, s.sq, s.h, s.dv}, s.order, s.pad);
    dq = make_tensor(t, {s.b, s.sq, s.h, s.dqk}, s.order, s.pad);
    dk = make_tensor(t, {s.b, s.skv, s.hg, s.dqk}, s.order, s.pad);
    dv = make_tensor(t, {s.b, s.skv, s.hg, s.dv}, s.order, s.pad);
    lse = make_lse(s.b, s.h, s.sq);
    fill_random(q, rng);
    fill_random(k, rng);
    fill_random(v, rng);
    fill_random(d_o, rng);
    poison(o);
    poison(dq);
    poison(dk);
    poison(dv);
  }

  // What forward and backward share: q, k, v, the forward's o and lse, options, varlen, and
  // the reference backend.
  template <class Args>
  [[nodiscard]] Args shared_args() const {
    Args a;
    a.q = q.view;
    a.k = k.view;
    a.v = v.view;
    a.o = o.view;
    a.lse = lse.view;
    a.options = spec.options;
    a.varlen = spec.varlen;
    a.backend = strideattn::Backend::reference;
    return a;
  }
  [[nodiscard]] strideattn::ForwardArgs forward_args() const { return shared_args<strideattn::ForwardArgs>(); }
  [[nodiscard]] strideattn::BackwardArgs backward_args() const {
    auto a = shared_args<strideattn::BackwardArgs>();
    a.d_o = d_o.view;
    a.dq = dq.view;
    a.dk = dk.view;
    a.dv = dv.view;
    return a;
  }

  // Public API: forward then backward (which reads the forward's O and LSE).
  void run_forward() {
    const strideattn::Status st = strideattn::forward(forward_args());
    ASSERT_TRUE(st.ok()) << st.message();
  }
  void run_backward() {
    const strideattn::Status st = strideattn::backward(backward_args());
    ASSERT_TRUE(st.ok()) << st.message();
  }
  void run_both() {
    run_forward();
    run_backward();
  }

  [[nodiscard]] strideattn::detail::Problem problem(bool backward) const {
    strideattn::detail::Problem p;
    const strideattn::Status st = backward ? strideattn::detail::make_problem(backward_args(), &p)
                                           : strideattn::detail::make_problem(forward_args(), &p);
    EXPECT_TRUE(st.ok()) << st.message();
    return p;
  }
  [[nodiscard]] double lse_at(std::int64_t b, std::int64_t h, std::int64_t s) const {
    return lse.data[std::size_t((b * spec.h + h) * spec.sq + s)];
  }
  [[nodiscard]] double scale() const { return spec.options.scale.value_or(1.0 / std::sqrt(double(spec.dqk))); }
};

}  // namespace reftest
