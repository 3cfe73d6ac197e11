// The `cpu` backend's training features (docs/semantics.md "Training features"): the score
// modifiers applied to a row segment of a tile (pre/post-scale bias, softcap, ALiBi), the
// dropout weights of a row segment (common/philox.hpp), and the sink of each head. Resolved
// once per call from the problem; any bias / slope / sink strides, stride 0 included.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "backends/cpu/cpu_common.hpp"
#include "common/philox.hpp"

namespace strideattn::detail::cpu {

struct Features {
  BiasType bias_type = BiasType::none;
  BiasView bias{};
  float cap = 0.f;  // softcap; 0: off
  HeadView alibi{};
  bool alibi_on = false;
  HeadView sinks{};
  bool sinks_on = false;
  bool dropout = false;
  std::uint64_t seed = 0, offset = 0;
  std::uint32_t threshold = 0;
  float keep_scale = 1.f;
  std::int64_t heads = 0;

  static Features of(const Problem& p) {
    Features f;
    f.bias_type = p.bias_type;
    f.bias = p.bias;
    f.cap = static_cast<float>(p.softcap);
    f.alibi = p.alibi;
    f.alibi_on = p.alibi_on;
    f.sinks = p.sinks;
    f.sinks_on = p.sinks_on;
    f.dropout = p.dropout_on();
    if (f.dropout) {
      f.seed = p.seed_value();
      f.offset = p.offset_value();
      f.threshold = kernel::dropout_threshold(p.dropout_p);
      f.keep_scale = static_cast<float>(1.0 / (1.0 - p.dropout_p));
    }
    f.heads = p.heads;
    return f;
  }

  [[nodiscard]] bool modifies_scores() const { return bias_type != BiasType::none || cap > 0.f || alibi_on; }
  [[nodiscard]] float sink(std::int64_t h) const { return sinks.data[h * sinks.stride[1]]; }

  // Element offset of bias row i of slab (b, h); extent-1 dimensions broadcast.
  [[nodiscard]] std::int64_t bias_row(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return (bias.shape[0] == 1 ? 0 : b * bias.stride[0]) + (bias.shape[1] == 1 ? 0 : h * bias.stride[1]) +
           (bias.shape[2] == 1 ? 0 : i * bias.stride[2]);
  }
  [[nodiscard]] float bias_at(std::int64_t row_off, std::int64_t j) const {
    return load_as_float(bias.data, bias.dtype, row_off + (bias.shape[3] == 1 ? 0 : j * bias.stride[3]));
  }

  // s[c] for c in [j0, j1) holds the scaled score scale * q.k of key c0 + c of row i (sequence
  // b of s_q rows and s_kv keys, query head h); it becomes the logit L. th (may be null)
  // receives tanh(T / cap) for the softcap's derivative.
  void modify_row(float* s, std::int64_t j0, std::int64_t j1, std::int64_t c0, std::int64_t b, std::int64_t h,
                  std::int64_t i, std::int64_t s_q, std::int64_t s_kv, float scale, float* th) const {
    const std::int64_t boff = bias_type != BiasType::none ? bias_row(b, h, i) : 0;
    const float slope =
        alibi_on ? alibi.data[(alibi.shape[0] == 1 ? 0 : b * alibi.stride[0]) + h * alibi.stride[1]] : 0.f;
    const std::int64_t diag = i + s_kv - s_q;
    for (std::int64_t c = j0; c < j1; ++c) {
      const std::int64_t j = c0 + c;
      float t = s[c];
      if (bias_type == BiasType::pre_scale) t += scale * bias_at(boff, j);
      if (cap > 0.f) {
        const float v = std::tanh(t / cap);
        if (th) th[c] = v;
        t = cap * v;
      }
      if (bias_type == BiasType::post_scale) t += bias_at(boff, j);
      if (alibi_on) t -= slope * static_cast<float>(std::llabs(diag - j));
      s[c] = t;
    }
  }

  // p[c] *= Z (1 / (1 - p) kept, 0 dropped) for keys c0 + c, c in [j0, j1), of row i.
  void drop_row(float* p, std::int64_t j0, std::int64_t j1, std::int64_t c0, std::int64_t b, std::int64_t h,
                std::int64_t i) const {
    const kernel::DropoutRow row = kernel::DropoutRow::make(seed, offset, b, heads, h, i, threshold);
    std::int64_t quad = -1;
    kernel::Philox4 words{};
    for (std::int64_t c = j0; c < j1; ++c) {
      const std::int64_t j = c0 + c;
      if ((j >> 2) != quad) {
        quad = j >> 2;
        words = row.words(quad);
      }
      p[c] *= words.w[j & 3] >= threshold ? keep_scale : 0.f;  // 0 * NaN stays NaN, as defined
    }
  }
};

}  // namespace strideattn::detail::cpu
