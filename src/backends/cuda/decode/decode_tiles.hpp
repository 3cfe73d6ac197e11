// Tile sizes and the split count of the KV-cache (decode) kernels, in one place, each with its
// reason: plain constexpr C++ that the kernels call with their template arguments and the host
// with the values it chose (as common/tiles.hpp does for the dense kernels), and that a CPU
// test checks (tests/backends/cuda/tiles_test.cpp).
//
// The kernel (split_kernel.cuh) is flash-decoding: decode is memory-bound (each K and V byte
// is used by only group * s_q query rows), so the work is spread over the keys rather than the
// queries. A CTA owns one row tile (kDecodeRows rows of the GQA group's query heads times the
// query rows, packed query-major), one KV head of one sequence, and one split of that
// sequence's keys; its 4 warps share the row tile and take the 16-key slabs of each
// shared-memory stage in turn, each with its own online softmax, merged at the end.
#pragma once

#include <cstdint>

#include "backends/cuda/common/arch.hpp"

namespace strideattn::cuda_impl {

inline constexpr int kDecodeWarps = 4;
inline constexpr int kDecodeThreads = kDecodeWarps * 32;
// Rows of a tile: one m16n8k16 m-tile. A decode step has group * 1 rows (4 for GQA 32/8, 8
// for 64/8), so a larger tile would be rows of zeros; more rows loop over row tiles.
inline constexpr int kDecodeRows = 16;
// Keys a warp takes at a time: the n of S = Q K^T and the k of O += P V (gemm_nt / gemm_rn
// work in 16-column tiles).
inline constexpr int kDecodeSlab = 16;

struct DecodeTile {
  int d;           // head-dim bucket (the padded width of Q, K and V in shared memory)
  int stage_keys;  // keys per shared-memory stage (whole slabs)
  int stages;      // stages in the cp.async ring: stages - 1 in flight while one is used
  int smem_bytes;  // Q tile + the ring of K and V stages, 16-bit elements
};
SA_CONSTEXPR_HD DecodeTile make_decode_tile(int d, int stage_keys, int stages) {
  return {d, stage_keys, stages, (kDecodeRows * d + stages * stage_keys * 2 * d) * 2};
}
// Memory-bound: the ring must keep enough bytes in flight per SM to cover the latency of
// global memory (about 40 KB per SM at 4.8 TB/s and ~1 us), with two CTAs per SM.
//   d <= 64: 64 keys (one slab per warp) of 16 KB, 4 stages: 48 KB in flight, 66 KB in all.
//   d <= 128: 64 keys of 32 KB, 3 stages: 64 KB in flight; 100 KB, two CTAs per SM on a 9.0
//     GPU (228 KB per SM), one on an 8.0 (164 KB).
//   d <= 256: 32 keys of 32 KB (two slabs: warps 0-1 take the even stages, 2-3 the odd), 3
//     stages: 104 KB; 64-key stages would need 200 KB for 3 stages, past an 8.0 GPU's 163 KB.
SA_CONSTEXPR_HD DecodeTile decode_tile(int d) {
  if (d == 64) return make_decode_tile(64, 64, 4);
  if (d == 128) return make_decode_tile(128, 64, 3);
  return make_decode_tile(256, 32, 3);
}

// Splits of each sequence's key range. Limits:
//   kDecodeMaxSplits: the combine kernel keeps one weight per split in shared memory; past
//     256 splits the partial rows (fp32, d_v + 1 floats each) cost more traffic than they save.
//   kDecodeMinSplitKeys: a split shorter than a few stages spends more on its prologue, its
//     partial row and its warp merge than on its keys.
//   kDecodeWarpKeys: a warp's fp32 register sum runs over at most this many keys (the dense
//     forward folds its accumulator at kFoldKeys = 8192, common/kernel_params.hpp), so a
//     split has at most kDecodeWarps times as many; longer caches get more splits, whose
//     combine is the blocked sum.
inline constexpr int kDecodeMaxSplits = 256;
inline constexpr std::int64_t kDecodeMinSplitKeys = 256;
inline constexpr std::int64_t kDecodeWarpKeys = 8192;

// The split count for `ctas` CTAs of one split (sequences x KV heads x row tiles) over caches
// of `capacity` tokens, on `sms` multiprocessors running `per_sm` CTAs each: FlashAttention's
// flash-decoding heuristic. A grid of at least 80% of one wave keeps one split (splitting costs
// partial rows and a combine launch); otherwise the fewest splits whose last wave is at least
// 85% as full as the best count's (a 1.9-wave grid runs two waves at the speed of one). Then
// at least the splits that keep a warp's sum under kDecodeWarpKeys.
inline int decode_splits(std::int64_t ctas, std::int64_t capacity, int sms, int per_sm) {
  const std::int64_t slots = std::int64_t(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  const std::int64_t precision = (capacity + kDecodeWarps * kDecodeWarpKeys - 1) / (kDecodeWarps * kDecodeWarpKeys);
  const int least = int(precision < kDecodeMaxSplits ? (precision > 1 ? precision : 1) : kDecodeMaxSplits);
  if (ctas <= 0) return 1;
  std::int64_t most = (capacity + kDecodeMinSplitKeys - 1) / kDecodeMinSplitKeys;
  if (most > kDecodeMaxSplits) most = kDecodeMaxSplits;
  if (most < 1) most = 1;
  int splits = 1;
  if (ctas * 10 < slots * 8) {
    double best = 0;
    double eff[kDecodeMaxSplits + 1] = {};
    for (std::int64_t s = 1; s <= most; ++s) {
      const double waves = double(ctas * s) / double(slots);
      const double full = double((ctas * s + slots - 1) / slots);
      eff[s] = waves / full;
      if (eff[s] > best) best = eff[s];
    }
    for (std::int64_t s = 1; s <= most; ++s)
      if (eff[s] >= 0.85 * best) {
        splits = int(s);
        break;
      }
  }
  return splits > least ? splits : least;
}

}  // namespace strideattn::cuda_impl
