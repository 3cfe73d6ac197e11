// The reference's training features (reference_features.hpp), written out plainly from
// docs/semantics.md "Training features".
#include "backends/reference/reference_features.hpp"

#include <cmath>
#include <cstdlib>

#include "common/dtype.hpp"

namespace strideattn::detail {

std::array<std::uint32_t, 4> ref_philox4x32_10(std::array<std::uint32_t, 4> c, std::array<std::uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // the key schedule: Weyl increments between rounds
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    const std::uint64_t p0 = std::uint64_t{0xD2511F53u} * c[0];
    const std::uint64_t p1 = std::uint64_t{0xCD9E8D57u} * c[2];
    const std::uint32_t hi0 = std::uint32_t(p0 >> 32), lo0 = std::uint32_t(p0);
    const std::uint32_t hi1 = std::uint32_t(p1 >> 32), lo1 = std::uint32_t(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

RefFeatures::RefFeatures(const Problem& p) : p_(p) {
  if (p.dropout_p > 0.0) {
    seed_ = p.seed_value();
    offset_ = p.offset_value();
    const double t = std::floor(p.dropout_p * 4294967296.0);
    threshold_ = t >= 4294967295.0 ? 0xFFFFFFFFu : std::uint32_t(t);
  }
}

double RefFeatures::bias(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
  const BiasView& v = p_.bias;
  const std::int64_t idx[4] = {b, h, i, j};
  std::int64_t off = 0;
  for (int d = 0; d < 4; ++d)
    if (v.shape[std::size_t(d)] != 1) off += idx[d] * v.stride[std::size_t(d)];
  return double(load_as_float(v.data, v.dtype, off));
}

double RefFeatures::alibi_term(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j, std::int64_t s_q,
                               std::int64_t s_kv) const {
  const HeadView& v = p_.alibi;
  const std::int64_t row = v.shape[0] == 1 ? 0 : b;
  const double slope = double(v.data[row * v.stride[0] + h * v.stride[1]]);
  return -slope * double(std::llabs(i + s_kv - s_q - j));
}

double RefFeatures::sink(std::int64_t h) const { return double(p_.sinks.data[h * p_.sinks.stride[1]]); }

bool RefFeatures::keep(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
  const std::uint64_t n = offset_ + std::uint64_t(b) * std::uint64_t(p_.heads) + std::uint64_t(h);
  const std::array<std::uint32_t, 4> r = ref_philox4x32_10(
      {std::uint32_t(std::uint64_t(j) >> 2), std::uint32_t(i), std::uint32_t(n), std::uint32_t(n >> 32)},
      {std::uint32_t(seed_), std::uint32_t(seed_ >> 32)});
  return r[std::size_t(j & 3)] >= threshold_;
}

std::int64_t RefFeatures::dbias_size() const {
  const auto& s = p_.bias.shape;
  return s[0] * s[1] * s[2] * s[3];
}

std::int64_t RefFeatures::dbias_row(std::int64_t i, std::int64_t j) const {
  const auto& s = p_.bias.shape;
  return (s[2] == 1 ? 0 : i) * s[3] + (s[3] == 1 ? 0 : j);
}

std::int64_t RefFeatures::dbias_slab(std::int64_t b, std::int64_t h) const {
  const auto& s = p_.bias.shape;
  return (s[0] == 1 ? 0 : b) * s[1] + (s[1] == 1 ? 0 : h);
}

}  // namespace strideattn::detail
