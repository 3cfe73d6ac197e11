// Test helper for the training features (docs/semantics.md "Training features"): one f32
// problem in host memory with strided Q/K/V/O/dO views (seq-major [s, b, h, d] with padding),
// a bias of any broadcast shape and stride order, ALiBi slopes, sinks, max logit, dBias and
// d_sink, run through the public API on one backend. Outputs are poisoned before each call
// and read back into logical row-major arrays.
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "strideattn/strideattn.hpp"

namespace strideattn::test_support {

struct FeatureCase {
  using i64 = std::int64_t;
  i64 b = 2, s_q = 5, s_kv = 7, h = 4, hg = 2, d = 8;
  AttentionOptions options{};
  // varlen: lengths of each sequence (b of them); views are [1, tokens, ...] with a one-token
  // gap after each sequence.
  std::vector<i64> lens_q, lens_kv;
  // bias of logical shape bias_shape ({0,...}: none) stored in the order `bias_order` (a
  // permutation of the 4 logical dims, slowest first); bias_stride0_batch: the batch dim is a
  // stride-0 view of one slab.
  std::array<i64, 4> bias_shape{0, 0, 0, 0};
  std::array<int, 4> bias_order{0, 1, 2, 3};
  bool bias_stride0_batch = false;
  DType bias_dtype = DType::f32;
  bool alibi = false, alibi_per_batch = false, sinks = false, max_logit = false, dbias = false;
  float input_scale = 1.f;

  std::vector<float> q, k, v, d_o, bias, slopes, sink;

  static constexpr float kPoison = 12345.f;
  static constexpr i64 kPad = 3;  // extra elements per row of every view

  [[nodiscard]] bool varlen() const { return !lens_q.empty(); }
  [[nodiscard]] i64 tokens(const std::vector<i64>& lens, i64 dense) const {
    if (!varlen()) return dense;
    i64 t = 0;
    for (i64 x : lens) t += x + 1;
    return t;
  }
  [[nodiscard]] i64 vb() const { return varlen() ? 1 : b; }  // batch extent of the views
  [[nodiscard]] i64 tq() const { return tokens(lens_q, s_q); }
  [[nodiscard]] i64 tk() const { return tokens(lens_kv, s_kv); }
  [[nodiscard]] i64 row(i64 heads) const { return heads * d + kPad; }
  [[nodiscard]] std::size_t size(i64 s, i64 heads) const { return std::size_t(s * vb() * row(heads)); }
  // [s, b, h, d] storage of a logical [b, s, h, d] view.
  [[nodiscard]] TensorView view(std::vector<float>& x, i64 s, i64 heads) const {
    return {x.data(), DType::f32, {vb(), s, heads, d}, {row(heads), vb() * row(heads), d, 1}};
  }
  [[nodiscard]] std::vector<i64> offsets(const std::vector<i64>& lens) const {
    std::vector<i64> o;
    i64 t = 0;
    for (i64 x : lens) o.push_back(t), t += x + 1;
    return o;
  }

  // Contiguous element strides of the bias storage in `bias_order`.
  [[nodiscard]] std::array<i64, 4> bias_strides() const {
    std::array<i64, 4> st{};
    i64 step = 1;
    for (int k = 3; k >= 0; --k) {
      const int dim = bias_order[std::size_t(k)];
      st[std::size_t(dim)] = step;
      if (!(bias_stride0_batch && dim == 0)) step *= bias_shape[std::size_t(dim)];
    }
    if (bias_stride0_batch) st[0] = 0;
    return st;
  }
  [[nodiscard]] i64 bias_elems() const {
    return bias_shape[0] * bias_shape[1] * bias_shape[2] * bias_shape[3] / (bias_stride0_batch ? bias_shape[0] : 1);
  }

  void fill(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    auto make = [&](std::vector<float>& x, std::size_t count, float mul) {
      x.resize(count);
      for (auto& e : x) e = mul * n(rng);
    };
    make(q, size(tq(), h), input_scale), make(k, size(tk(), hg), input_scale);
    make(v, size(tk(), hg), 1.f), make(d_o, size(tq(), h), 1.f);
    if (bias_shape[0] > 0) make(bias, std::size_t(bias_elems()), 1.f);
    std::uniform_real_distribution<float> u(0.05f, 0.8f);
    slopes.resize(std::size_t((alibi_per_batch ? b : 1) * h));
    for (auto& e : slopes) e = u(rng);
    make(sink, std::size_t(h), 1.f);
  }

  struct Out {
    Status status;
    std::vector<float> o, lse, max_logit, dq, dk, dv, dbias, d_sinks;  // o, dq.. in storage layout
  };

  template <class Args>
  void set_common(Args& a, Backend backend) {
    a.q = view(q, tq(), h), a.k = view(k, tk(), hg), a.v = view(v, tk(), hg);
    a.options = options;
    a.backend = backend;
    if (varlen()) {
      a.varlen.seqlens_q = lens_q, a.varlen.seqlens_kv = lens_kv;
      a.varlen.offsets_q = offsets(lens_q), a.varlen.offsets_kv = offsets(lens_kv);
    }
    if (bias_shape[0] > 0) {
      a.bias = {bias.data(), DType::f32, bias_shape, bias_strides()};
      if (a.options.bias_type == BiasType::none) a.options.bias_type = BiasType::post_scale;
    }
    if (alibi) a.alibi_slopes = {slopes.data(), {alibi_per_batch ? b : 1, h}, {h, 1}};
    if (sinks) a.sinks = {sink.data(), {1, h}, {h, 1}};
  }

  Out forward(Backend backend) {
    Out r;
    r.o.assign(size(tq(), h), kPoison);
    r.lse.assign(std::size_t(vb() * h * tq()), kPoison);
    ForwardArgs a;
    set_common(a, backend);
    a.o = view(r.o, tq(), h);
    a.lse = {r.lse.data(), {vb(), h, tq()}, {h * tq(), tq(), 1}};
    if (max_logit) {
      r.max_logit.assign(std::size_t(b * h * 2), kPoison);  // [b, h] with row stride 2h
      a.max_logit = {r.max_logit.data(), {b, h}, {2 * h, 1}};
    }
    r.status = strideattn::forward(a);
    return r;
  }

  // The backward of the given O and LSE.
  Out backward(Backend backend, std::vector<float>& o, std::vector<float>& lse) {
    Out r;
    r.dq.assign(size(tq(), h), kPoison), r.dk.assign(size(tk(), hg), kPoison), r.dv.assign(size(tk(), hg), kPoison);
    BackwardArgs a;
    set_common(a, backend);
    a.o = view(o, tq(), h), a.d_o = view(d_o, tq(), h);
    a.lse = {lse.data(), {vb(), h, tq()}, {h * tq(), tq(), 1}};
    a.dq = view(r.dq, tq(), h), a.dk = view(r.dk, tk(), hg), a.dv = view(r.dv, tk(), hg);
    if (dbias && bias_shape[0] > 0) {
      const auto& s = bias_shape;
      r.dbias.assign(std::size_t(s[0] * s[1] * s[2] * s[3]), kPoison);  // contiguous, logical order
      a.dbias = {r.dbias.data(), DType::f32, s, {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1}};
    }
    if (sinks) {
      r.d_sinks.assign(std::size_t(h), kPoison);
      a.d_sinks = {r.d_sinks.data(), {1, h}, {h, 1}};
    }
    r.status = strideattn::backward(a);
    return r;
  }

  // Elements of a storage-layout output that belong to the logical view (the padding is not
  // written by anyone): for comparisons.
  [[nodiscard]] std::vector<float> logical(const std::vector<float>& x, i64 s, i64 heads) const {
    std::vector<float> out;
    for (i64 t = 0; t < s; ++t)
      for (i64 bb = 0; bb < vb(); ++bb)
        for (i64 hh = 0; hh < heads; ++hh)
          for (i64 c = 0; c < d; ++c)
            out.push_back(x[std::size_t(t * vb() * row(heads) + bb * row(heads) + hh * d + c)]);
    return out;
  }
};

}  // namespace strideattn::test_support
