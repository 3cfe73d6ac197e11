// Tile sizes of every kernel, in one place, with the reason for each choice. All kernels use
// 4 warps (128 threads); a warp owns 16 * MT rows of the "row side" of its tile and the full
// width of the "column side", so softmax rows never cross warps.
#pragma once

namespace strideattn::cuda_impl {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;

// Forward: rows = queries (Br), columns = keys. K and V stream through shared memory in
// stages of kStage keys, double-buffered (stage n+1 loads while stage n computes: one barrier
// and one cp.async wait per stage); inside a stage the warps walk kBc keys at a time, the
// width of the register tiles S and P. kStage > kBc halves the barriers without the
// registers a wider S would cost. kPrefetchPV: whether O += P V requests the next V fragments
// before this tile's MMAs (two fragment buffers of kBc/16 x 4 registers); where registers are
// short each tile loads its own fragments first (one buffer).
template <int D> struct ForwardTile;
// d <= 64: two m16 tiles per warp (Br 128) double the reuse of every K/V fragment loaded
// from shared memory. sm_90a: 128 x 128 register tiles (O 2 x 32 floats, S 2 x 64), the
// shape FlashAttention-2 uses at this width: per 16 columns of S = Q K^T a warp loads 2 Q and
// 8 K fragments for 32 MMAs, and the softmax bookkeeping runs once per 128 keys; 255
// registers, no spill with the single-buffered P V (492 bytes spilled with the prefetch).
// Measured against Bc 64 (H200, same device call): 265 -> 300 TFLOP/s (no mask), 235 -> 267
// (causal). sm_80's ptxas spills 188 bytes at Bc 128, so sm_80 keeps Bc 64.
// smem Q 16K + 2 x (K 16K + V 16K) = 80 KiB (two CTAs per SM).
template <> struct ForwardTile<64> {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static constexpr int kMT = 2, kBr = 128, kBc = 64, kStage = 128;
  static constexpr bool kPrefetchPV = true;
#else
  static constexpr int kMT = 2, kBr = 128, kBc = 128, kStage = 128;
  static constexpr bool kPrefetchPV = false;
#endif
};
// d <= 128: O accumulators 2 x 64 floats per thread. sm_90a: 128 x 64 register tiles (S 2 x 32
// floats), FlashAttention-2's shape: per 16 head-dim columns of S = Q K^T a warp loads 2 Q and
// 4 K fragments for 16 MMAs (2 + 2 for 8 at Bc 32), and the softmax's max/sum shuffles and
// rescale decision run once per 64 keys. It fits in 255 registers with no spill only with
// the single-buffered P V (ptxas -v, CUDA 13.0: 104 bytes spilled with the prefetch). sm_80's
// ptxas spills 128 bytes even then, so sm_80 keeps 128 x 32 with the prefetch. Measured
// against Bc 32 (H200): 271 -> 294-310 TFLOP/s (no mask), 243 -> 271 (causal).
// smem Q 32K + 2 x (K 16K + V 16K) = 96 KiB (two CTAs per SM).
template <> struct ForwardTile<128> {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static constexpr int kMT = 2, kBr = 128, kBc = 32, kStage = 64;
  static constexpr bool kPrefetchPV = true;
#else
  static constexpr int kMT = 2, kBr = 128, kBc = 64, kStage = 64;
  static constexpr bool kPrefetchPV = false;
#endif
};
// d <= 256: O alone is 128 floats per thread per m-tile, so one m-tile per warp (Br 64).
// Bc 32 (S 16 floats): Bc 64 spilled on sm_80. Stage 32 keeps smem at
// Q 32K + 2 x (K 16K + V 16K) = 96 KiB, two CTAs per SM.
template <> struct ForwardTile<256> {
  static constexpr int kMT = 1, kBr = 64, kBc = 32, kStage = 32;
  static constexpr bool kPrefetchPV = true;
};

// Fragment prefetch in the backward passes' GEMMs (device_primitives.cuh). sm_90a's ptxas
// fits it with no spill inside the d <= 128 loops; sm_80's spilled 68-120 bytes inside the
// d = 128 loops, and sm_90a's 16 bytes inside the d = 256 dK/dV loop (ptxas -v and SASS,
// CUDA 13.0), so those keep the plain GEMMs. Remaining (ptxas -v and SASS, CUDA 13.0, since
// the check-free load_tile path): the sm_80 d = 128 dK/dV pass reloads one 4-byte value per
// query block (256 MMAs per warp), and the sm_90a f16 d = 128 dQ pass spills 4 bytes outside
// its loop.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
template <int D> inline constexpr bool kBackwardPrefetch = false;
#else
template <int D> inline constexpr bool kBackwardPrefetch = D <= 128;
#endif

// Backward, dK/dV pass: rows = keys (Bc), columns = queries (Br). dK and dV stay in
// registers across the whole loop over query blocks and GQA heads; DAcc is the number of
// head-dim columns of dK/dV one CTA accumulates (the CTA recomputes S and dP for each
// split), so that 2 x (16 x DAcc) accumulators fit in registers.
template <int D> struct BackwardKvTile;
// d <= 64: two m16 tiles per warp (Bc 128) double the reuse of each Q / dO fragment;
// dK + dV 2 x 2 x 32 floats, S^T and dP^T 2 x 16 floats each with Br 32.
template <> struct BackwardKvTile<64> { static constexpr int kMT = 2, kBc = 128, kBr = 32, kDAcc = 64; };
// d <= 128: dK + dV accumulators 2 x 64 floats, S^T and dP^T 32 floats each (Br 64).
template <> struct BackwardKvTile<128> { static constexpr int kMT = 1, kBc = 64, kBr = 64, kDAcc = 128; };
// d <= 256: two column splits of 128; Br 32 keeps S^T / dP^T small and smem at
// K 32K + V 32K + 2 stages x (Q 16K + dO 16K) = 128 KiB.
template <> struct BackwardKvTile<256> { static constexpr int kMT = 1, kBc = 64, kBr = 32, kDAcc = 128; };

// Host-side view of the dK/dV pass grid (cuda_backend.cu sizes its group splits from it):
// keys per CTA and head-dim splits per key block for a head-dim bucket.
inline constexpr int kv_pass_keys(int bucket) {
  return bucket == 64 ? BackwardKvTile<64>::kBc : bucket == 128 ? BackwardKvTile<128>::kBc : BackwardKvTile<256>::kBc;
}
inline constexpr int kv_pass_dim_splits(int bucket) {
  return bucket == 64 ? 64 / BackwardKvTile<64>::kDAcc
                      : bucket == 128 ? 128 / BackwardKvTile<128>::kDAcc : 256 / BackwardKvTile<256>::kDAcc;
}

// Backward, dQ pass: rows = queries (Br), columns = keys (Bc). dQ accumulates in fp32
// registers over the key blocks in a fixed order: no atomics, bitwise deterministic.
template <int D> struct BackwardQTile;
// d <= 64: two m16 tiles per warp (Br 128): each K / V fragment feeds two MMAs. Bc 32: with
// Bc 64, S, dP and dQ (3 x 64 floats) plus the pipelined GEMMs' fragments spilled.
template <> struct BackwardQTile<64> { static constexpr int kMT = 2, kBr = 128, kBc = 32; };
// d <= 128: two m16 tiles per warp (Br 128), Bc 32: dQ 2 x 64 floats + S and dP 2 x 16
// floats each; smem Q 32K + dO 32K + 2 x (K 8K + V 8K) = 96 KiB.
template <> struct BackwardQTile<128> { static constexpr int kMT = 2, kBr = 128, kBc = 32; };
// d <= 256: dQ 128 floats; Bc 32 keeps S and dP at 16 floats; smem 64K + 2 x 32K = 128 KiB.
template <> struct BackwardQTile<256> { static constexpr int kMT = 1, kBr = 64, kBc = 32; };

}  // namespace strideattn::cuda_impl
