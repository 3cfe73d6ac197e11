// The reference's own definition of the training features (docs/semantics.md "Training
// features"): bias and ALiBi lookups, sinks, the dropout keep decision with its own plain
// Philox4x32-10, and the index maps of dBias. Nothing here is shared with another backend:
// the reference is the independent specification they are tested against.
#pragma once

#include <array>
#include <cstdint>

#include "problem/problem.hpp"

namespace strideattn::detail {

// Random123's Philox4x32-10 of a 128-bit counter (word 0 first) and a 64-bit key.
[[nodiscard]] std::array<std::uint32_t, 4> ref_philox4x32_10(std::array<std::uint32_t, 4> counter,
                                                             std::array<std::uint32_t, 2> key);

// The features of one problem, resolved for a call (seed and offset read once).
class RefFeatures {
 public:
  explicit RefFeatures(const Problem& p);

  [[nodiscard]] bool pre_bias() const { return p_.bias_type == BiasType::pre_scale; }
  [[nodiscard]] bool post_bias() const { return p_.bias_type == BiasType::post_scale; }
  [[nodiscard]] bool softcap() const { return p_.softcap > 0.0; }
  [[nodiscard]] double cap() const { return p_.softcap; }
  [[nodiscard]] bool alibi() const { return p_.alibi_on; }
  [[nodiscard]] bool sinks() const { return p_.sinks_on; }
  [[nodiscard]] bool dropout() const { return p_.dropout_p > 0.0; }

  // Bias element [b, h, i, j] (extent-1 dimensions broadcast), as double.
  [[nodiscard]] double bias(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const;
  // -slope[b, h] * |i + s_kv - s_q - j| for a sequence of s_q rows and s_kv keys.
  [[nodiscard]] double alibi_term(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j, std::int64_t s_q,
                                  std::int64_t s_kv) const;
  [[nodiscard]] double sink(std::int64_t h) const;
  // Whether P[b, h, i, j] is kept, and the weight 1 / (1 - p) of a kept one.
  [[nodiscard]] bool keep(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const;
  [[nodiscard]] double keep_scale() const { return 1.0 / (1.0 - p_.dropout_p); }

  // dBias, held as a logical row-major array of the bias's shape: the element (b, h, i, j)
  // adds to, and its size.
  [[nodiscard]] std::int64_t dbias_size() const;
  [[nodiscard]] std::int64_t dbias_row(std::int64_t i, std::int64_t j) const;   // within one [b, h] slab
  [[nodiscard]] std::int64_t dbias_slab(std::int64_t b, std::int64_t h) const;  // slab index of [b, h]
  [[nodiscard]] std::int64_t slab_size() const { return p_.bias.shape[2] * p_.bias.shape[3]; }

 private:
  const Problem& p_;
  std::uint64_t seed_ = 0, offset_ = 0;
  std::uint32_t threshold_ = 0;
};

}  // namespace strideattn::detail
