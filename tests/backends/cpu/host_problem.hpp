// Test helper for the cpu edge tests: one f32 problem in host memory (contiguous bshd
// buffers, or stride-0 views of single rows), run through the public API on any backend,
// forward and backward, with outputs poisoned before each call.
#pragma once

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "strideattn/strideattn.hpp"

namespace strideattn::test_support {

struct HostProblem {
  std::int64_t b = 1, s_q = 1, s_kv = 1, h = 1, hg = 1, d = 8;
  AttentionOptions options{};
  std::vector<float> q, k, v, d_o;  // inputs, contiguous [b, s, heads, d]

  static constexpr float kPoison = 12345.f;

  // Standard normal inputs.
  void fill(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.f, 1.f);
    auto make = [&](std::vector<float>& x, std::int64_t s, std::int64_t heads) {
      x.resize(static_cast<std::size_t>(b * s * heads * d));
      for (auto& e : x) e = dist(rng);
    };
    make(q, s_q, h), make(k, s_kv, hg), make(v, s_kv, hg), make(d_o, s_q, h);
  }
  [[nodiscard]] std::size_t at(std::int64_t bi, std::int64_t s, std::int64_t heads, std::int64_t si, std::int64_t hi,
                               std::int64_t c) const {
    return static_cast<std::size_t>(((bi * s + si) * heads + hi) * d + c);
  }
  [[nodiscard]] TensorView view(std::vector<float>& x, std::int64_t s, std::int64_t heads) const {
    return {x.data(), DType::f32, {b, s, heads, d}, {s * heads * d, heads * d, d, 1}};
  }

  struct Forward {
    Status status;
    std::vector<float> o, lse;  // o [b, s_q, h, d], lse [b, h, s_q]
  };
  Forward forward(Backend backend) {
    Forward r;
    r.o.assign(q.size(), kPoison);
    r.lse.assign(static_cast<std::size_t>(b * h * s_q), kPoison);
    ForwardArgs a;
    a.q = view(q, s_q, h), a.k = view(k, s_kv, hg), a.v = view(v, s_kv, hg);
    a.o = view(r.o, s_q, h);
    a.lse = {r.lse.data(), {b, h, s_q}, {h * s_q, s_q, 1}};
    a.options = options;
    a.backend = backend;
    r.status = strideattn::forward(a);
    return r;
  }

  struct Backward {
    Status status;
    std::vector<float> dq, dk, dv;
  };
  // The backward of the given O and LSE (the same inputs for every backend compared).
  Backward backward(Backend backend, std::vector<float>& o, std::vector<float>& lse) {
    Backward r;
    r.dq.assign(q.size(), kPoison), r.dk.assign(k.size(), kPoison), r.dv.assign(v.size(), kPoison);
    BackwardArgs a;
    a.q = view(q, s_q, h), a.k = view(k, s_kv, hg), a.v = view(v, s_kv, hg);
    a.o = view(o, s_q, h), a.d_o = view(d_o, s_q, h);
    a.lse = {lse.data(), {b, h, s_q}, {h * s_q, s_q, 1}};
    a.dq = view(r.dq, s_q, h), a.dk = view(r.dk, s_kv, hg), a.dv = view(r.dv, s_kv, hg);
    a.options = options;
    a.backend = backend;
    r.status = strideattn::backward(a);
    return r;
  }
};

}  // namespace strideattn::test_support
