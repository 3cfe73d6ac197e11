// Pairwise accumulation of per-tile partial results for the `cpu` backend. Long reductions
// (the online softmax over key tiles, dQ over key tiles, dK/dV over query tiles) would
// otherwise add each tile's contribution into one running fp32 accumulator, whose rounding
// error grows linearly with the number of tiles (O error 7e-3 at 1e6 keys, 1.0 at 1e8).
// Instead each tile's contribution is computed on its own (a 64-term chain) and pushed onto a
// binary-counter stack that merges equal-sized partials, so every result is a balanced tree
// of tile partials: error O((64 + log2(tiles)) eps) instead of O(tiles * 64 eps), for about
// the cost of the old per-tile rescale (one merge per tile on average).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace strideattn::detail::cpu {

// A binary counter of partials, each `n` floats. Level k holds the merge of 2^k consecutive
// partials. merge(older, newer) combines two partials into `newer`; it is always called with
// the earlier partial first, so the result is deterministic.
class PartialStack {
 public:
  // Starts a new reduction of partials of n floats (buffers are kept across reductions).
  void reset(std::size_t n) {
    n_ = n;
    count_ = 0;
    if (cur_.size() < n) cur_.resize(n);
  }

  // The buffer the next partial is to be written into (n floats, contents unspecified).
  [[nodiscard]] float* next() { return cur_.data(); }

  // Pushes the partial in next() and merges it with equal-level partials.
  template <class Merge>
  void push(Merge&& merge) {
    int k = 0;
    for (; (count_ >> k) & 1u; ++k) merge(level(k), cur_.data());
    (void)level(k);  // allocates level k
    std::swap(levels_[static_cast<std::size_t>(k)], cur_);
    if (cur_.size() < n_) cur_.resize(n_);
    ++count_;
  }

  // Merges every partial pushed since reset() into one and returns it (nullptr when none
  // was pushed). The stack must be reset() before the next push.
  template <class Merge>
  [[nodiscard]] const float* finish(Merge&& merge) {
    float* result = nullptr;
    for (int k = 0; (count_ >> k) != 0; ++k) {
      if (!((count_ >> k) & 1u)) continue;
      if (result == nullptr) {
        result = level(k);
      } else {
        merge(level(k), result);  // the higher level holds the earlier partials
      }
    }
    return result;
  }

 private:
  float* level(int k) {
    if (levels_.size() <= static_cast<std::size_t>(k)) levels_.resize(static_cast<std::size_t>(k) + 1);
    auto& l = levels_[static_cast<std::size_t>(k)];
    if (l.size() < n_) l.resize(n_);
    return l.data();
  }

  std::size_t n_ = 0;
  std::uint64_t count_ = 0;
  std::vector<float> cur_;
  std::vector<std::vector<float>> levels_;
};

// merge for plain sums: newer[i] = older[i] + newer[i].
struct AddMerge {
  std::size_t n;
  void operator()(const float* older, float* newer) const {
    for (std::size_t i = 0; i < n; ++i) newer[i] = older[i] + newer[i];
  }
};

// merge for online-softmax partials of `rows` rows laid out [m: rows][l: rows][O: rows x dv]
// (running max, sum of exp(s - m), unnormalized output). A partial whose max is -inf has
// seen no finite or +inf score (l and O are 0, or NaN from a NaN score); when both are so,
// they are added unscaled, which keeps the NaN and avoids exp(-inf - -inf).
struct SoftmaxMerge {
  std::int64_t rows, dv;
  void operator()(const float* older, float* newer) const {
    const float* m1 = older;
    const float* l1 = older + rows;
    const float* o1 = older + 2 * rows;
    float* m2 = newer;
    float* l2 = newer + rows;
    float* o2 = newer + 2 * rows;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float m = m1[r] > m2[r] ? m1[r] : m2[r];
      float f1 = 1.f, f2 = 1.f;
      if (m != -std::numeric_limits<float>::infinity()) {
        f1 = std::exp(m1[r] - m);  // NaN when both are +inf (overflow): stays non-finite
        f2 = std::exp(m2[r] - m);
      }
      m2[r] = m;
      l2[r] = f1 * l1[r] + f2 * l2[r];
      const float* a = o1 + r * dv;
      float* b = o2 + r * dv;
      for (std::int64_t k = 0; k < dv; ++k) b[k] = f1 * a[k] + f2 * b[k];
    }
  }
};

}  // namespace strideattn::detail::cpu
