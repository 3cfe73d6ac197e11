// Test helpers for the reference backend tests: host tensors of any dtype with chosen
// (non-canonical) strides, random fill, NaN poison, guard-band checks, and an independent
// brute-force attention written from the formulas of docs/semantics.md (it does not use the
// library's MaskRule, so the tests check the rule against the documented formula).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.hpp"
#include "strideattn/strideattn.hpp"

namespace reftest {

using strideattn::Dims4;
using strideattn::DType;
using strideattn::TensorView;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Memory order of a test tensor; the logical order is always [b, s, h, d].
enum class Order { bshd, sbhd, bhsd };

// A host tensor: a buffer of `dtype` with `guard` poisoned elements before and after the view,
// rows padded by `pad` elements (so the seq/head strides are not the packed ones).
struct Tensor {
  DType dtype = DType::f32;
  std::vector<unsigned char> bytes;
  std::int64_t elements = 0;
  std::int64_t guard = 0;
  TensorView view{};

  [[nodiscard]] std::int64_t offset(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return b * view.stride[0] + s * view.stride[1] + h * view.stride[2] + d * view.stride[3];
  }
  [[nodiscard]] double raw(std::int64_t i) const { return strideattn::detail::load_as_float(bytes.data(), dtype, i); }
  [[nodiscard]] double get(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return raw(guard + offset(b, s, h, d));
  }
  void set(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, double x) {
    strideattn::detail::store_from_float(bytes.data(), dtype, guard + offset(b, s, h, d), float(x));
  }
  // Logical row-major copy of the view's elements.
  [[nodiscard]] std::vector<double> logical() const {
    std::vector<double> out;
    const auto& n = view.shape;
    for (std::int64_t b = 0; b < n[0]; ++b)
      for (std::int64_t s = 0; s < n[1]; ++s)
        for (std::int64_t h = 0; h < n[2]; ++h)
          for (std::int64_t d = 0; d < n[3]; ++d) out.push_back(get(b, s, h, d));
    return out;
  }
  [[nodiscard]] bool in_view(std::int64_t i) const;  // element i of the buffer is in the view
};

inline Tensor make_tensor(DType dtype, Dims4 shape, Order order = Order::bshd, std::int64_t pad = 0,
                          std::int64_t guard = 16) {
  Tensor t;
  t.dtype = dtype;
  t.guard = guard;
  const std::int64_t B = shape[0], S = shape[1], H = shape[2], D = shape[3];
  const std::int64_t row = D + pad;
  Dims4 st{};
  st[3] = 1;
  switch (order) {
    case Order::bshd:
      st[2] = row;
      st[1] = H * row;
      st[0] = S * H * row;
      break;
    case Order::sbhd:
      st[2] = row;
      st[0] = H * row;
      st[1] = B * H * row;
      break;
    case Order::bhsd:
      st[1] = row;
      st[2] = S * row;
      st[0] = H * S * row;
      break;
  }
  t.elements = B * S * H * row + 2 * guard;
  t.bytes.assign(std::size_t(t.elements) * strideattn::size_of(dtype), 0);
  t.view.dtype = dtype;
  t.view.shape = shape;
  t.view.stride = st;
  t.view.data = t.bytes.data() + std::size_t(guard) * strideattn::size_of(dtype);
  return t;
}

inline bool Tensor::in_view(std::int64_t i) const {
  const auto& n = view.shape;
  for (std::int64_t b = 0; b < n[0]; ++b)
    for (std::int64_t s = 0; s < n[1]; ++s)
      for (std::int64_t h = 0; h < n[2]; ++h) {
        const std::int64_t o = guard + offset(b, s, h, 0);
        if (i >= o && i < o + n[3]) return true;
      }
  return false;
}

// Every buffer element gets NaN (outputs: every element in the view must be overwritten,
// every element outside it must stay NaN).
inline void poison(Tensor& t) {
  for (std::int64_t i = 0; i < t.elements; ++i)
    strideattn::detail::store_from_float(t.bytes.data(), t.dtype, i, std::nanf(""));
}

// Fresh random inputs in [-1, 1) (rounded to the dtype), padding/guard elements NaN so a
// read outside the view poisons the result.
inline void fill_random(Tensor& t, std::mt19937_64& rng, double amplitude = 1.0) {
  poison(t);
  std::uniform_real_distribution<double> u(-amplitude, amplitude);
  const auto& n = t.view.shape;
  for (std::int64_t b = 0; b < n[0]; ++b)
    for (std::int64_t s = 0; s < n[1]; ++s)
      for (std::int64_t h = 0; h < n[2]; ++h)
        for (std::int64_t d = 0; d < n[3]; ++d) t.set(b, s, h, d, u(rng));
}

// True when every element in the view is finite (or -inf allowed) and every element outside
// it is still NaN.
inline bool written_and_guarded(const Tensor& t) {
  for (std::int64_t i = 0; i < t.elements; ++i) {
    const bool in = t.in_view(i);
    const double x = t.raw(i);
    if (in && std::isnan(x)) return false;
    if (!in && !std::isnan(x)) return false;
  }
  return true;
}

struct LseBuffer {
  std::vector<float> data;
  strideattn::LseView view{};
};
inline LseBuffer make_lse(std::int64_t b, std::int64_t h, std::int64_t s) {
  LseBuffer l;
  l.data.assign(std::size_t(std::max<std::int64_t>(b * h * s, 1)), std::nanf(""));  // never null
  l.view.data = l.data.data();
  l.view.shape = {b, h, s};
  l.view.stride = {h * s, s, 1};
  return l;
}

// ----------------------------------------------------------------- brute force (docs formula)

// docs/semantics.md: query i sees key j iff every active condition holds:
//   causal top-left      j <= i
//   causal bottom-right  j <= i + s_kv - s_q
//   window left  (>= 0)  j >= i + s_kv - s_q - left
//   window right (>= 0)  j <= i + s_kv - s_q + right
inline bool doc_visible(std::int64_t i, std::int64_t j, std::int64_t sq, std::int64_t skv, strideattn::MaskKind mask,
                        std::int64_t left, std::int64_t right) {
  const std::int64_t diag = i + skv - sq;
  if (mask == strideattn::MaskKind::causal && j > i) return false;
  if (mask == strideattn::MaskKind::causal_bottom_right && j > diag) return false;
  if (left >= 0 && j < diag - left) return false;
  if (right >= 0 && j > diag + right) return false;
  return true;
}

// Dense single-sequence, single-head attention in double on plain arrays:
// q [sq][dqk], k [skv][dqk], v [skv][dv], d_o [sq][dv].
struct Brute {
  std::vector<std::vector<double>> o, dq, dk, dv;
  std::vector<double> lse;
};
inline Brute brute_force(const std::vector<std::vector<double>>& q, const std::vector<std::vector<double>>& k,
                         const std::vector<std::vector<double>>& v, const std::vector<std::vector<double>>& d_o,
                         double scale, strideattn::MaskKind mask, std::int64_t left, std::int64_t right) {
  const std::int64_t sq = std::int64_t(q.size()), skv = std::int64_t(k.size());
  const std::size_t dqk = q.empty() ? (k.empty() ? 0 : k[0].size()) : q[0].size();
  const std::size_t dvn = v.empty() ? (d_o.empty() ? 0 : d_o[0].size()) : v[0].size();
  Brute r;
  r.o.assign(std::size_t(sq), std::vector<double>(dvn, 0.0));
  r.dq.assign(std::size_t(sq), std::vector<double>(dqk, 0.0));
  r.dk.assign(std::size_t(skv), std::vector<double>(dqk, 0.0));
  r.dv.assign(std::size_t(skv), std::vector<double>(dvn, 0.0));
  r.lse.assign(std::size_t(sq), -kInf);
  for (std::int64_t i = 0; i < sq; ++i) {
    std::vector<double> p(std::size_t(skv), 0.0);
    double mx = -kInf;
    for (std::int64_t j = 0; j < skv; ++j) {
      if (!doc_visible(i, j, sq, skv, mask, left, right)) continue;
      double s = 0;
      for (std::size_t d = 0; d < dqk; ++d) s += q[i][d] * k[j][d];
      p[j] = scale * s;
      mx = std::max(mx, p[j]);
    }
    if (mx == -kInf) continue;  // no visible key
    double l = 0;
    for (std::int64_t j = 0; j < skv; ++j)
      if (doc_visible(i, j, sq, skv, mask, left, right)) l += std::exp(p[j] - mx);
    r.lse[i] = mx + std::log(l);
    for (std::int64_t j = 0; j < skv; ++j)
      p[j] = doc_visible(i, j, sq, skv, mask, left, right) ? std::exp(p[j] - r.lse[i]) : 0.0;
    for (std::int64_t j = 0; j < skv; ++j)
      for (std::size_t d = 0; d < dvn; ++d) r.o[i][d] += p[j] * v[j][d];
    if (d_o.empty()) continue;
    double delta = 0;
    for (std::size_t d = 0; d < dvn; ++d) delta += d_o[i][d] * r.o[i][d];
    for (std::int64_t j = 0; j < skv; ++j) {
      if (p[j] == 0.0) continue;
      double dp = 0;
      for (std::size_t d = 0; d < dvn; ++d) dp += d_o[i][d] * v[j][d];
      const double ds = p[j] * (dp - delta);
      for (std::size_t d = 0; d < dvn; ++d) r.dv[j][d] += p[j] * d_o[i][d];
      for (std::size_t d = 0; d < dqk; ++d) {
        r.dq[i][d] += scale * ds * k[j][d];
        r.dk[j][d] += scale * ds * q[i][d];
      }
    }
  }
  return r;
}

// Rows [s][d] of (batch b, head h) of a tensor, tokens [t0, t0 + n).
inline std::vector<std::vector<double>> rows_of(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t t0,
                                                std::int64_t n) {
  std::vector<std::vector<double>> r(std::size_t(n), std::vector<double>(std::size_t(t.view.shape[3])));
  for (std::int64_t s = 0; s < n; ++s)
    for (std::int64_t d = 0; d < t.view.shape[3]; ++d) r[s][d] = t.get(b, t0 + s, h, d);
  return r;
}

}  // namespace reftest
