// Pairwise accumulation of per-tile partial results for the `cpu` backend. Long reductions
// (the online softmax over key tiles, dQ over key tiles, dK/dV over query tiles) would
// otherwise add each tile's contribution into one running fp32 accumulator, whose rounding
// error grows linearly with the number of tiles (O error 7e-3 at 1e6 keys, 1.0 at 1e8).
// Instead the contribution of each block of kTilesPerPartial tiles is accumulated on its own
// (a chain of 4 x 64 terms) and pushed onto a binary-counter stack that merges equal-sized
// partials, so every result is a balanced tree of block partials: error
// O((256 + log2(blocks)) eps) instead of O(tiles * 64 eps). One merge per tile cost 6-8%
// of the forward (bench_cpu); one per 4 tiles is within the run-to-run noise.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_kernels.hpp"

namespace strideattn::detail::cpu {

// Key (or query) tiles accumulated sequentially into one partial before it is pushed.
inline constexpr int kTilesPerPartial = 4;

// A binary counter of partials, each `n` floats. Level k holds the merge of 2^k consecutive
// partials. merge(older, newer) combines two partials into `newer`; it is always called with
// the earlier partial first, so the result is deterministic.
//
// Per tile: if starts_partial(), initialise next(); add the tile's contribution to next();
// then end_tile(merge), which pushes the partial every kTilesPerPartial tiles. finish()
// pushes a partly filled last one.
class PartialStack {
 public:
  // Starts a new reduction of partials of n floats (buffers are kept across reductions).
  void reset(std::size_t n) {
    n_ = n;
    count_ = 0;
    tiles_ = 0;
    if (cur_.size() < n) cur_.resize(n);
  }

  // Whether the next tile begins a new partial (next() holds stale values to overwrite).
  [[nodiscard]] bool starts_partial() const { return tiles_ == 0; }

  // One tile's contribution is in next(): push the partial once it holds kTilesPerPartial.
  template <class Merge>
  void end_tile(Merge&& merge) {
    if (++tiles_ == kTilesPerPartial) push(merge);
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
    tiles_ = 0;
  }

  // Merges every partial since reset() (a partly filled last one included) into one and
  // returns it (nullptr when there was none). The stack must be reset() before reuse.
  template <class Merge>
  [[nodiscard]] const float* finish(Merge&& merge) {
    if (tiles_ > 0) push(merge);
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

  // finish(), or n zeros when there was no partial (no tile reached these rows or keys).
  template <class Merge>
  [[nodiscard]] const float* finish_or_zeros(Merge&& merge) {
    if (const float* r = finish(merge)) return r;
    std::fill(cur_.begin(), cur_.begin() + static_cast<std::ptrdiff_t>(n_), 0.f);
    return cur_.data();
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
  int tiles_ = 0;  // tiles in the partial being filled (next())
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
// (running max, sum of exp(s - m), unnormalized output). The partial with the larger max
// keeps factor 1, the other gets exp(its max - the larger), computed for a block of rows
// at once by the vector exp. A partial whose max is -inf has seen no finite or +inf score
// (l and O are 0, or NaN from a NaN score) and gets factor 0, which keeps its NaN; two
// partials with max +inf (fp32 overflow) give exp(NaN) = NaN, a non-finite row.
struct SoftmaxMerge {
  std::int64_t rows, dv;
  void operator()(const float* older, float* newer) const {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    const float* m1 = older;
    const float* l1 = older + rows;
    const float* o1 = older + 2 * rows;
    float* m2 = newer;
    float* l2 = newer + rows;
    float* o2 = newer + 2 * rows;
    constexpr std::int64_t kChunk = 64;
    float f[kChunk];
    for (std::int64_t r0 = 0; r0 < rows; r0 += kChunk) {
      const std::int64_t n = rows - r0 < kChunk ? rows - r0 : kChunk;
      for (std::int64_t i = 0; i < n; ++i) {
        const float a = m1[r0 + i], b = m2[r0 + i];
        const float lo = a >= b ? b : a, hi = a >= b ? a : b;
        f[i] = lo == kNegInf ? kNegInf : lo - hi;  // exp(-inf) = 0
      }
      (void)exp_sub_sum(f, n, 0.f);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t r = r0 + i;
        const bool first_larger = m1[r] >= m2[r];
        const float f1 = first_larger ? 1.f : f[i], f2 = first_larger ? f[i] : 1.f;
        m2[r] = first_larger ? m1[r] : m2[r];
        l2[r] = f1 * l1[r] + f2 * l2[r];
        const float* x = o1 + r * dv;
        float* y = o2 + r * dv;
        for (std::int64_t k = 0; k < dv; ++k) y[k] = f1 * x[k] + f2 * y[k];
      }
    }
  }
};

}  // namespace strideattn::detail::cpu
