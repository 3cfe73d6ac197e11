// Dropout in the kernels' feature variant (docs/semantics.md "Dropout"): the keep mask of a
// warp's register fragment, drawn from Philox4x32-10 (common/philox.hpp, the code `cpu`
// runs), and Z = keep / (1 - p) applied to a fragment.
//
// One Philox call gives the words of 4 consecutive keys of one (head, query row). In the
// m16n8 accumulator layout a thread holds 2 consecutive keys (columns 8 n + 2 t, + 1) of
// rows g and g + 8, or, where rows are keys (the dK/dV passes), one key of each of 2
// consecutive queries; computing its own words each thread would draw every call 2 (rows
// are queries) or 4 (rows are keys) times. Instead each thread draws exactly one call per
// (m-tile, n-tile), a different (row, key quad) from its neighbours', turns the 4 words into
// 4 keep bits, and the threads exchange the bits by shuffles: 2 (rows are queries) or 4
// shuffles per 8 (m-tile, n-tile) pairs. So a fragment costs one Philox call per 4 of its
// entries, the least the definition allows.
//
// The mask is a function of (seed, offset, batch, query head, query, key) alone: the tiles,
// warps and passes that compute an entry draw the same bit, forward and backward.
#pragma once

#include <cstdint>

#include "backends/cuda/common/kernel_params.hpp"
#include "common/philox.hpp"

namespace strideattn::cuda_impl {

// The dropout of one call, as a kernel sees it: the seed and offset read once (from the
// pointers when the call gave them, so a replayed CUDA graph draws what was written there
// before the replay), and the counter words of one (sequence, query head) from it.
struct Dropout {
  std::uint32_t k0 = 0, k1 = 0;  // the seed (Philox key)
  std::uint64_t offset = 0;
  std::uint32_t threshold = 0;  // keep iff the word >= threshold
  float scale = 0.f;            // 1 / (1 - p); 0: no dropout

  __device__ __forceinline__ static Dropout of(const FeatureParams& f) {
    Dropout d;
    if (f.dropout_scale == 0.f) return d;
    const std::uint64_t seed = f.dropout_seed_ptr != nullptr ? *f.dropout_seed_ptr : f.dropout_seed;
    d.k0 = std::uint32_t(seed), d.k1 = std::uint32_t(seed >> 32);
    d.offset = f.dropout_offset_ptr != nullptr ? *f.dropout_offset_ptr : f.dropout_offset;
    d.threshold = f.dropout_threshold, d.scale = f.dropout_scale;
    return d;
  }
  [[nodiscard]] __device__ __forceinline__ bool on() const { return scale != 0.f; }
};

// Counter words 2 and 3 of one (sequence `batch`, query head `head`): offset + batch * heads +
// head (mod 2^64).
struct DropoutHead {
  std::uint32_t k0, k1, n0, n1, threshold;
  __device__ __forceinline__ DropoutHead(const Dropout& d, std::int64_t batch, std::int64_t heads, std::int64_t head)
      : k0(d.k0), k1(d.k1), threshold(d.threshold) {
    const std::uint64_t n = d.offset + std::uint64_t(batch) * std::uint64_t(heads) + std::uint64_t(head);
    n0 = std::uint32_t(n), n1 = std::uint32_t(n >> 32);
  }
  // Keep bits of keys 4 quad .. 4 quad + 3 of query `row` (bit w: key 4 quad + w).
  [[nodiscard]] __device__ __forceinline__ std::uint32_t keep4(std::uint32_t quad, std::uint32_t row) const {
    const kernel::Philox4 r = kernel::philox4x32_10(kernel::Philox4{{quad, row, n0, n1}}, k0, k1);
    return std::uint32_t(r.w[0] >= threshold) | std::uint32_t(r.w[1] >= threshold) << 1 |
           std::uint32_t(r.w[2] >= threshold) << 2 | std::uint32_t(r.w[3] >= threshold) << 3;
  }
};

// The keep bits of a warp's C[MT][NT][4] fragment: entry (mt, n, i) is bit 4 s + i of word
// s / 8, s = mt NT + n.
template <int MT, int NT>
struct KeepMask {
  static constexpr int kWords = (MT * NT + 7) / 8;
  std::uint32_t w[kWords];
  [[nodiscard]] __device__ __forceinline__ bool kept(int mt, int n, int i) const {
    const int s = mt * NT + n;
    return (w[s >> 3] >> (4 * (s & 7) + i)) & 1u;
  }
};

// Rows are queries row0 + 16 mt + g (+8), columns keys col0 + 8 n + 2 t (+1) (the forward and
// the dQ pass; col0 a multiple of 4). Thread (g, t) draws, per (mt, n), query row
// row0 + 16 mt + g + 8 (t >> 1) and key quad (col0 + 8 n) / 4 + (t & 1); entry (h, e) of
// thread (g, t) is then bit 2 (t & 1) + e of the draw of thread (g, 2 h + (t >> 1)).
template <int MT, int NT>
__device__ __forceinline__ KeepMask<MT, NT> keep_mask_rows(const DropoutHead& d, std::int64_t row0, std::int64_t col0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  KeepMask<MT, NT> k;
#pragma unroll
  for (int wi = 0; wi < KeepMask<MT, NT>::kWords; ++wi) {
    std::uint32_t mine = 0;
#pragma unroll
    for (int s = wi * 8; s < wi * 8 + 8 && s < MT * NT; ++s) {
      const int mt = s / NT, n = s % NT;
      const auto row = std::uint32_t(row0 + mt * 16 + g + 8 * (t >> 1));
      const auto quad = std::uint32_t((col0 + n * 8) >> 2) + std::uint32_t(t & 1);
      mine |= d.keep4(quad, row) << (4 * (s & 7));
    }
    const std::uint32_t s0 = __shfl_sync(0xffffffffu, mine, (lane & ~3) | (t >> 1));
    const std::uint32_t s1 = __shfl_sync(0xffffffffu, mine, (lane & ~3) | 2 | (t >> 1));
    const int sh = 2 * (t & 1);
    k.w[wi] = ((s0 >> sh) & 0x33333333u) | (((s1 >> sh) & 0x33333333u) << 2);
  }
  return k;
}

// Rows are keys row0 + 16 mt + g (+8), columns queries col0 + 8 n + 2 t (+1) (the dK/dV
// passes; row0 a multiple of 4). Thread (g, t) draws, per (mt, n), query col0 + 8 n + 2 t +
// (g & 1) and key quad (row0 + 16 mt) / 4 + (g >> 1); entry (h, e) of thread (g, t) is then
// bit g & 3 of the draw of thread (4 h + 2 (g >> 2) + e, t).
template <int MT, int NT>
__device__ __forceinline__ KeepMask<MT, NT> keep_mask_cols(const DropoutHead& d, std::int64_t row0, std::int64_t col0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  KeepMask<MT, NT> k;
#pragma unroll
  for (int wi = 0; wi < KeepMask<MT, NT>::kWords; ++wi) {
    std::uint32_t mine = 0;
#pragma unroll
    for (int s = wi * 8; s < wi * 8 + 8 && s < MT * NT; ++s) {
      const int mt = s / NT, n = s % NT;
      const auto query = std::uint32_t(col0 + n * 8 + 2 * t + (g & 1));
      const auto quad = std::uint32_t((row0 + mt * 16) >> 2) + std::uint32_t(g >> 1);
      mine |= d.keep4(quad, query) << (4 * (s & 7));
    }
    std::uint32_t bits = 0;
#pragma unroll
    for (int he = 0; he < 4; ++he) {  // he = 2 h + e
      const int src = (4 * (he >> 1) + 2 * (g >> 2) + (he & 1)) * 4 + t;
      const std::uint32_t x = __shfl_sync(0xffffffffu, mine, src);
      bits |= ((x >> (g & 3)) & 0x11111111u) << he;
    }
    k.w[wi] = bits;
  }
  return k;
}

// c *= Z: the kept entries times 1 / (1 - p), the dropped ones times 0 (0 * NaN stays NaN, as
// the definition's product; a masked P's -0 stays a zero).
template <int MT, int NT>
__device__ __forceinline__ void apply_keep(float (&c)[MT][NT][4], const KeepMask<MT, NT>& k, float scale) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) c[mt][n][i] *= k.kept(mt, n, i) ? scale : 0.f;
}

// out = Z c, c unchanged (the backward keeps P itself for dS and the softcap).
template <int MT, int NT>
__device__ __forceinline__ void keep_copy(float (&out)[MT][NT][4], const float (&c)[MT][NT][4],
                                          const KeepMask<MT, NT>& k, float scale) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) out[mt][n][i] = c[mt][n][i] * (k.kept(mt, n, i) ? scale : 0.f);
}

// The forward's P, or the dQ pass's dP, of a warp's rows row0 + ... (queries) and columns
// col0 + ... (keys) of (sequence `batch`, query head `head`) times Z.
template <int MT, int NT>
__device__ __forceinline__ void dropout_rows(float (&c)[MT][NT][4], const KernelParams& kp, std::int64_t batch,
                                             std::int64_t head, std::int64_t row0, std::int64_t col0) {
  const Dropout d = Dropout::of(kp.f);
  apply_keep(c, keep_mask_rows<MT, NT>(DropoutHead(d, batch, kp.p.heads, head), row0, col0), d.scale);
}

// The keep mask of a fragment whose rows are queries row0 + ... and columns keys col0 + ...
// of (sequence `batch`, query head `head`) (the wgmma forward draws it while its S GEMM runs).
template <int MT, int NT>
__device__ __forceinline__ KeepMask<MT, NT> dropout_mask_rows(const KernelParams& kp, std::int64_t batch,
                                                              std::int64_t head, std::int64_t row0, std::int64_t col0) {
  return keep_mask_rows<MT, NT>(DropoutHead(Dropout::of(kp.f), batch, kp.p.heads, head), row0, col0);
}

// The keep mask of a dK/dV pass's fragment (rows keys key0 + ..., columns queries q0 + ...)
// of (sequence `batch`, query head `head`).
template <int MT, int NT>
__device__ __forceinline__ KeepMask<MT, NT> dropout_mask_cols(const KernelParams& kp, std::int64_t batch,
                                                              std::int64_t head, std::int64_t key0, std::int64_t q0) {
  return keep_mask_cols<MT, NT>(DropoutHead(Dropout::of(kp.f), batch, kp.p.heads, head), key0, q0);
}

}  // namespace strideattn::cuda_impl
