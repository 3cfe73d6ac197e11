// Tile sizes of every kernel, in one place, with the reason for each choice: constexpr
// functions of (architecture, head-dim bucket) that the kernels call with their template
// arguments and the host calls with the values it chose, so both read the same numbers (no
// __CUDA_ARCH__ here: an architecture is a value, common/arch.hpp). Plain C++: a CPU test
// (tests/backends/cuda/tiles_test.cpp) checks the shapes' invariants and shared memory.
//
// The mma.sync kernels use 4 warps (128 threads, kThreads); a warp owns 16 * MT rows of the
// "row side" of its tile and the full width of the "column side", so softmax rows never
// cross warps. The exceptions are the 8-warp dK/dV pass (kKvWarps, kv8_tile), whose warps
// split both sides and share S^T / dP^T through shared memory, and the sm_90a kernels (two
// warpgroups of 4 warps).
#pragma once

#include "backends/cuda/common/arch.hpp"
#include "backends/cuda/common/feature_set.hpp"

namespace strideattn::cuda_impl {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kKvWarps = 8;
inline constexpr int kKvThreads = kKvWarps * 32;

// Head-dim buckets: the padded tile width. 64 / 128 / 256 cover every multiple of 8 <= 256
// (smaller dims run in the bucket above with zero-filled columns).
inline constexpr int kBuckets[] = {64, 128, 256};
SA_CONSTEXPR_HD int head_dim_bucket(long long d_qk, long long d_v) {
  const long long d = d_qk > d_v ? d_qk : d_v;
  return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

// ------------------------------------------------------------------ forward (mma.sync)

// Forward: rows = queries (br), columns = keys. K and V stream through shared memory in
// stages of `stage` keys, double-buffered (stage n+1 loads while stage n computes: one
// barrier and one cp.async wait per stage); inside a stage the warps walk bc keys at a time,
// the width of the register tiles S and P. stage > bc halves the barriers without the
// registers a wider S would cost. prefetch_pv: whether O += P V requests the next V
// fragments before this tile's MMAs (two fragment buffers of bc/16 x 4 registers); where
// registers are short each tile loads its own fragments first (one buffer).
struct ForwardTile {
  int mt, br, bc, stage;
  bool prefetch_pv;
  int smem_bytes;  // Q and two stages of K and V, 16-bit elements
};
SA_CONSTEXPR_HD ForwardTile make_forward_tile(int d, int mt, int bc, int stage, bool prefetch_pv) {
  return {mt, 64 * mt, bc, stage, prefetch_pv, (64 * mt + 4 * stage) * d * 2};
}
SA_CONSTEXPR_HD ForwardTile forward_tile(Arch a, int d) {
  // d <= 64: two m16 tiles per warp (Br 128) double the reuse of every K/V fragment loaded
  // from shared memory. sm_90a: 128 x 128 register tiles (O 2 x 32 floats, S 2 x 64), the
  // shape FlashAttention-2 uses at this width: fewer K fragment loads per MMA and the softmax
  // bookkeeping once per 128 keys. It fits in 255 registers only with the single-buffered
  // P V; sm_80's ptxas spills at Bc 128, so sm_80 keeps Bc 64 (bench/cuda-notes.md, step 8).
  // smem Q 16K + 2 x (K 16K + V 16K) = 80 KiB (two CTAs per SM).
  if (d == 64)
    return a == Arch::sm80 ? make_forward_tile(d, 2, 64, 128, true) : make_forward_tile(d, 2, 128, 128, false);
  // d <= 128: O accumulators 2 x 64 floats per thread. sm_90a: 128 x 64 register tiles (S 2 x
  // 32 floats), FlashAttention-2's shape: per 16 head-dim columns of S = Q K^T a warp loads 2
  // Q and 4 K fragments for 16 MMAs (2 + 2 for 8 at Bc 32), and the softmax's max/sum
  // shuffles and rescale decision run once per 64 keys. It fits in 255 registers with no
  // spill only with the single-buffered P V; sm_80's ptxas spills even then, so sm_80 keeps
  // 128 x 32 with the prefetch (bench/cuda-notes.md, step 8).
  // smem Q 32K + 2 x (K 16K + V 16K) = 96 KiB (two CTAs per SM).
  if (d == 128) return a == Arch::sm80 ? make_forward_tile(d, 2, 32, 64, true) : make_forward_tile(d, 2, 64, 64, false);
  // d <= 256: O alone is 128 floats per thread per m-tile, so one m-tile per warp (Br 64).
  // Bc 32 (S 16 floats): Bc 64 spilled on sm_80. Stage 32 keeps smem at
  // Q 32K + 2 x (K 16K + V 16K) = 96 KiB, two CTAs per SM.
  return make_forward_tile(d, 1, 32, 32, true);
}

// ------------------------------------------------------------------ forward (sm_90a, wgmma)

// Forward on sm_90a (sm90/forward.cuh), d <= 128 and d <= 256 buckets: two warpgroups of 64
// query rows each (Br 128), S = Q K^T and O += P V as warpgroup MMAs (P from registers, the
// FA2 register reuse), K and V double-buffered as the mma.sync forward's. One CTA of 8 warps
// per SM. Faster than the mma.sync forward at d 128 (bench/cuda-notes.md, step 17).
//   d <= 128: 128 keys per block: O 64 and S 64 floats per thread (186 registers, no spill).
//     Shared memory: Q 128 x 128, two stages of K and V 128 x 128, 1 KiB to align: 164,864
//     bytes.
//   d <= 256: O is 128 floats per thread, so 64 keys per block (S 32 floats); O += P V is
//     two m64n128 products per k-step. Shared memory: Q 128 x 256, two stages of K and V
//     64 x 256, 1 KiB: 197,632 bytes.
// At d 64 the same kernel is correct but slower than the mma.sync forward's 128 x 128 tiles:
// each S = Q K^T is only 4 k-steps, and the synchronous wgmma waits and softmax between
// them are not hidden. So the d <= 64 bucket keeps the mma.sync forward (has_forward_wgmma).
struct ForwardWgmmaTile {
  int br;  // queries per CTA: one m64 row block per warpgroup
  int bc;  // keys per block (and per shared-memory stage)
  int smem_bytes;
};
SA_CONSTEXPR_HD bool has_forward_wgmma(int bucket) { return bucket == 128 || bucket == 256; }
SA_CONSTEXPR_HD ForwardWgmmaTile forward_wgmma_tile(int d) {
  const int bc = d == 256 ? 64 : 128;
  return {128, bc, 1024 + (128 + 4 * bc) * d * 2};
}
// The wgmma forward's single-feature instantiations (common/feature_set.hpp) per bucket: each,
// but ALiBi at d 128, where ptxas (nvcc 13.0) spilled 72 bytes and reloaded 108 with it alone
// against 20 / 28 with every feature; that runs the every-feature one.
SA_CONSTEXPR_HD bool wgmma_forward_single_feature(int bucket, int feature) {
  return !(bucket == 128 && feature == kFeatAlibi);
}

// ------------------------------------------------------------------ forward (sm_90a, warp-specialized)

// The warp-specialized forward on sm_90a (sm90/ws_forward.cuh; the plan runs it wherever it
// covers the problem, plan.cpp). Three warpgroups per CTA:
//   producer (warpgroup 0; one thread issues): Q once, then K and V of each key block by TMA
//     into a ring of `stages` stages guarded by mbarriers. It needs a few registers for
//     coordinates and phases: setmaxnreg gives it producer_regs.
//   two consumers (warpgroups 1, 2): 64 query rows each, S = Q K^T and O += P V as in the
//     wgmma forward (forward_wgmma_tile). Their O (64) + S (64) + P (32) registers plus
//     the softmax's are about 190 (the wgmma forward's ptxas count); consumer_regs leaves room
//     for the overlapped consumers, which hold the next block's S next to this block's P.
//   producer_regs x 128 + consumer_regs x 256 = 64,512, the CTA's whole launch pool
//   (launch_register_pool), the split CUTLASS's and FlashAttention-3's Hopper kernels use for
//   two consumer warpgroups.
// d <= 128: Br 128 (two m64 row blocks), Bc 128 (S 64 floats per thread), 2 stages: the
//   producer runs a whole block ahead of the consumers (one block of 128 keys is 16
//   m64n128k16 wgmmas per consumer, 8.4 MFLOP per CTA, about 1.4 us at an SM's share of the
//   dense bf16 rate, against about 0.9 us for 64 KiB of K and V at its share of L2).
//   Shared memory: Q 128 x 128, 2 stages of K and V 128 x 128 (each tile two TMA boxes of
//   128 rows x 64 columns in the 128-byte swizzle, which is the Sw128Blocks layout the wgmma
//   descriptors read), the mbarriers, 1 KiB to align the tiles: 164,936 bytes, one CTA per
//   SM.
// d <= 64: the same shape (FlashAttention-3 runs Br 192 with three consumers here; this
//   kernel keeps two consumers of 64 rows, so Br 128).
//   Bc 128: S 64 floats per thread, next to O 32 and P 32 (the overlapped consumers also hold
//     the next block's S: about 130 live floats of the 232 registers). Bc 192 (FA3's) would
//     need m64n192 instructions and a fold cadence that kFoldKeys / Bc does not divide; 128
//     keeps S = Q K^T the d 128 bucket's m64n128 and O += P V one m64n64k16 per k-step.
//   4 stages: a block is half the d 128 bucket's work (4 m64n128k16 + 8 m64n64k16 wgmmas per
//     consumer, 4.2 MFLOP per CTA, about 0.7 us) while a TMA load's latency is not halved, so
//     the producer keeps three blocks (about 2 us of the consumers' work) in flight; with one
//     CTA per SM (the registers) the shared memory is there to take.
//   Each tile is one TMA box of 64 columns; head dims below 64 are read as the real columns
//   with the box's out-of-bounds columns zero-filled (as d 72..128 in the 128 bucket).
//   Shared memory: Q 128 x 64 (16 KiB), 4 stages of K and V 128 x 64 (16 KiB each), the
//   mbarriers, 1 KiB to align: 148,616 bytes.
// d <= 256: O is 128 floats per thread, so Bc 64 (S 32 floats, S = Q K^T m64n64), as the
//   wgmma forward at this width (and the same block order: the same sums); O += P V two
//   m64n128k16 per k-step. The overlapped features variant spilled 20 bytes at 232
//   registers, so the consumers take 240 and the producer 24 (FlashAttention-3's split for
//   two consumers: 24 x 128 + 240 x 256 = 64,512). 2 stages: Q 128 x 256 (64 KiB) and 2 x
//   (K + V 64 x 256, 64 KiB) leave no room for a third. Head dims 136..248 are the real
//   columns with TMA's zero fill, whole 64-column boxes past d included (as d_qk 64 in the
//   128 bucket). Shared memory: 197,704 bytes.
struct WsForwardTile {
  int d;
  int br = 128;                  // queries per CTA: one m64 row block per consumer warpgroup
  int bc = d == 256 ? 64 : 128;  // keys per block and per ring stage
  int stages = d == 64 ? 4 : 2;
  int consumers = 2;  // consumer warpgroups
  int threads = 128 * (1 + consumers);
  int producer_regs = d == 256 ? 24 : 40;
  int consumer_regs = d == 256 ? 240 : 232;
  int box_cols = 64;              // columns of one TMA box: 128 bytes, the 128-byte swizzle's row
  int barriers = 1 + 4 * stages;  // Q full; K full / empty and V full / empty per stage
  int smem_bytes = 1024 + (br + 2 * stages * bc) * d * 2 + barriers * 8;
};
SA_CONSTEXPR_HD bool has_ws_forward(int bucket) { return bucket == 64 || bucket == 128 || bucket == 256; }
inline constexpr std::int64_t kWsPingPongMaxKeys = 2048;
SA_CONSTEXPR_HD WsForwardTile ws_forward_tile(int d) { return WsForwardTile{d}; }
// The overlapped forward's single-feature instantiations (common/feature_set.hpp) per bucket:
// each, but where ptxas (nvcc 13.0, consumers at the registers above) spilled with the
// feature alone while the every-feature instantiation spills nothing: the sinks at d 128 (48
// bytes), ALiBi at d 256 (12), the bias at d 64 (16). Those run the every-feature one.
SA_CONSTEXPR_HD bool ws_forward_single_feature(int bucket, int feature) {
  return !((bucket == 128 && feature == kFeatSinks) || (bucket == 256 && feature == kFeatAlibi) ||
           (bucket == 64 && feature == kFeatBias));
}

// Whether a FullD instantiation (head dims equal to the bucket, compile-time dims) really
// compiles the unguarded code on this architecture. At d = 128 sm_80's ptxas spills in the
// unguarded forward and 8-warp pass and not (or less) in the guarded ones, so the sm_80
// kernels compile the guarded code in both instantiations there (chosen by ptxas -v alone,
// untimed).
SA_CONSTEXPR_HD bool unguarded_full_d(Arch a, int d) { return a != Arch::sm80 || d != 128; }

// Fragment prefetch in the backward passes' GEMMs (sm80/mma.cuh): on wherever ptxas fits it
// without a spill inside the loop, which is sm_90a at d <= 128; sm_80 at d = 128 and sm_90a's
// d = 256 dK/dV loop spill with it, so they keep the plain GEMMs.
SA_CONSTEXPR_HD bool backward_prefetch(Arch a, int d) { return a == Arch::sm90a && d <= 128; }

// ------------------------------------------------------------------ dK/dV pass, 4 warps

// Group splits (plan.cpp): the dK/dV pass runs one CTA per (key block, KV head, sequence),
// each looping over every query head of its GQA group. With few KV heads that grid is too
// small: the seed case (MQA 16/1, 8 sequences of 2k keys, d 64) has 128 CTAs for 132 SMs.
// Splitting the group over CTAs brings the grid to about split_target x SMs CTAs, at the
// price of fp32 partials and one reduction pass: several waves, so that the causal imbalance
// between key blocks evens out. 4-warp kernel: 4 CTAs per SM (two waves of the two
// resident). 8-warp kernel (one resident per SM): 16, the fastest of 1-16 forced splits on
// the seed's fwd+bwd. sm_90a wgmma pass (also one per SM, each about 1.5x faster): 8, faster
// than 16 on the same case (bench/cuda-notes.md, steps 15 and 16).

// Backward, dK/dV pass: rows = keys (Bc), columns = queries (Br). dK and dV stay in
// registers across the whole loop over query blocks and GQA heads; d_acc is the number of
// head-dim columns of dK/dV one CTA accumulates (the CTA recomputes S and dP for each
// split), so that 2 x (16 x d_acc) accumulators fit in registers.
struct KvPassTile {
  int mt, bc, br, d_acc;
  int dim_splits;  // d / d_acc: CTAs per key block
  int smem_bytes;  // K, V; two stages of Q and dO; two of LSE and delta (fp32)
  int split_target = 4;
};
SA_CONSTEXPR_HD KvPassTile make_kv_tile(int d, int mt, int bc, int br, int d_acc) {
  return {mt, bc, br, d_acc, d / d_acc, (2 * bc + 4 * br) * d * 2 + 4 * br * 4};
}
SA_CONSTEXPR_HD KvPassTile kv_tile(Arch, int d) {
  // d <= 64: two m16 tiles per warp (Bc 128) double the reuse of each Q / dO fragment;
  // dK + dV 2 x 2 x 32 floats, S^T and dP^T 2 x 16 floats each with Br 32.
  if (d == 64) return make_kv_tile(d, 2, 128, 32, 64);
  // d <= 128: dK + dV accumulators 2 x 64 floats, S^T and dP^T 32 floats each (Br 64).
  if (d == 128) return make_kv_tile(d, 1, 64, 64, 128);
  // d <= 256: two column splits of 128; Br 32 keeps S^T / dP^T small and smem at
  // K 32K + V 32K + 2 stages x (Q 16K + dO 16K) = 128 KiB.
  return make_kv_tile(d, 1, 64, 32, 128);
}

// ------------------------------------------------------------------ dK/dV pass, 8 warps

// dK/dV pass, d <= 64 and d <= 128 buckets, 8 warps (sm80/backward_kv8.cuh).
// FA2's layout: Bc = 128 keys per CTA, Br = 64 queries per iteration.
//   S^T, dP^T [128 x 64]: warps 4 (keys, 32 = 2 m-tiles each) x 2 (queries, 32 each), so
//     each warp computes a 32 x 32 block (32 floats each) once, and P^T / dS^T go to shared
//     memory for every warp of the key slice. The 4-warp kernel has each warp recompute
//     against all 64 queries and re-read all of Q and dO from shared memory in each of its
//     four GEMMs (bench/cuda-notes.md, step 6); here a Q / dO fragment feeds two m-tiles.
//   dV += P^T dO, dK += dS^T Q [128 x D]: warps 4 (keys, 32 each) x 2 (head-dim halves,
//     D/2 each): dV + dK 2 x (2 x D/16 x 4) fp32 accumulators per thread (128 at D = 128).
// That is 0.44 ldmatrix.x4 per MMA instead of the 4-warp kernel's 0.56, Q and dO loaded once
// per 128 keys instead of per 64, and the barriers, LSE / delta loads and loop overhead paid
// once per 128 keys.
// Registers: at D = 128 the 128 accumulators that live across the whole loop plus S^T and
// dP^T (64) leave no way to 128 registers per thread (two CTAs of 8 warps), so this is one
// CTA of 8 warps per SM (__launch_bounds__(256, 1), up to 255 registers): the same 8 warps
// per SM as the 4-warp kernel's two CTAs. (D = 64 needs about 170.)
// Shared memory: with one CTA per SM there is no reason to squeeze, so Q / dO (and LSE /
// delta) stay double-buffered (the next query block loads during this one):
// K + V 2 x 128 x D + 2 x (Q + dO) 2 x 64 x D + P^T 16K + dS^T 16K + 1K, 16-bit elements:
// 161 KiB at D = 128, 97 KiB at D = 64.
struct Kv8Tile {
  int d;                         // head-dim bucket
  int bc = 128;                  // keys per CTA
  int br = 64;                   // queries per iteration
  int key_warps = 4;             // warps along the keys (both phases)
  int side_warps = 2;            // along the queries (S^T, dP^T) / head dim (dK, dV)
  int mt = bc / key_warps / 16;  // m16 tiles of keys per warp: 2
  int warp_q = br / side_warps;  // queries per warp in S^T / dP^T: 32
  int warp_d = d / side_warps;   // dK / dV columns per warp: D / 2
  // Single pass (dq_accum set): dQ_partial = dS K [64 x D] over the 128 keys, warps 2
  // (queries, 32 = 2 m-tiles each) x 4 (head-dim quarters, D/4 each): 2 x D/4 fp32
  // accumulators, live only in that phase; each dS^T / K fragment feeds two MMAs. 64 x D
  // floats per CTA and query block go out (2-float atomics), half as many per FLOP as with
  // 64-key CTAs.
  int dq_query_warps = 2;
  int dq_warp_q = br / dq_query_warps;              // 32
  int dq_warp_d = d / (kKvWarps / dq_query_warps);  // D / 4
  // Dynamic shared memory: K, V; two stages of Q, dO; P^T, dS^T (16-bit); two stages of LSE
  // and delta (fp32). D = 128: 164,864 bytes, within sm_80's and sm_90's opt-in limits
  // (163 / 227 KiB) but not sm_86's or sm_89's (99 KiB), where the plan picks the 4-warp kernel
  // instead. D = 64: 99,328 bytes, within all of them.
  int smem_bytes = (2 * bc * d + 4 * br * d + 2 * bc * br) * 2 + 4 * br * 4;
  int split_target = 16;
  // Fragment prefetch in the GEMMs (as backward_prefetch above), phase 1 (S^T, dP^T:
  // gemm_nt) and phase 2 (dV, dK, and the single pass's dQ: gemm_sn). Phase 2 only, and only
  // on sm_90a: gemm_sn waits on a B fragment before every 4 MMAs without prefetch, gemm_nt
  // only before every 8; with phase 1 prefetch too sm_90a's ptxas spills and the pass is no
  // faster, and sm_80's spills with any prefetch (ptxas -v; the loop counters are 32-bit
  // because with int64 ones every variant spilled).
  bool prefetch_scores = false;
  bool prefetch_update = false;
};
// Whether a head-dim bucket has the 8-warp pass.
SA_CONSTEXPR_HD bool has_kv8_pass(int bucket) { return bucket == 64 || bucket == 128; }
SA_CONSTEXPR_HD Kv8Tile kv8_tile(Arch a, int d) {
  Kv8Tile t{d};
  t.prefetch_update = a == Arch::sm90a;
  return t;
}

// ------------------------------------------------------------------ dK/dV pass (sm_90a, wgmma)

// dK/dV pass on sm_90a (sm90/backward.cuh): the 8-warp pass's loop over query blocks and GQA
// heads (Q / dO double-buffered, same group splits) with every GEMM a warpgroup MMA that
// reads both operands from shared memory. Two warpgroups of 4 warps (m64 is the
// instruction's row count). Why: the mma.sync pass is latency-bound on dependent ldmatrix ->
// HMMA chains with 8 warps per SM (bench/cuda-notes.md, steps 11-16), and a wgmma issues a
// 64 x N x 16 product from one instruction with no operand fragments in registers. One CTA
// of 256 threads per SM.
// How the two groups share a block:
//   d <= 64 / d <= 128 (groups_split_keys): 128 keys per CTA, group wg owns keys [64 wg,
//     64 wg + 64) in S^T, dP^T, dK and dV, and half of dQ (below). Registers at D = 128:
//     dK + dV 2 x 64, S^T + dP^T 2 x 32, dQ 32 (only after S^T and dP^T are dead): 192 at
//     most; at D = 64 (Br 128) 2 x 32 + 2 x 64, dQ 32.
//   d <= 256: dK + dV of 64 keys x 256 columns are 256 floats per thread for one group, so
//     both groups take the same 64 keys, and split the queries of S^T and dP^T (Br / 2 = 32
//     each: m64n32) and the head-dim columns of dK, dV and dQ (128 each): dK + dV 2 x 64,
//     S^T + dP^T 2 x 16, dQ 64. The 4-warp mma.sync pass it replaces needed two head-dim
//     splits (recomputing S^T and dP^T in each) and a separate dQ pass (a third time):
//     9 GEMMs' worth per block against these 5.
// Shared memory: K, V (Bc x D), two stages of Q and dO (Br x D), P^T and dS^T (Bc x Br), LSE
// and delta, tiles in the 128-byte swizzle (Sw128Blocks), plus 1 KiB to align the tiles to
// 1024 bytes: 165,888 bytes at D = 128, 166,912 at D = 64 (Br 128), 215,040 at D = 256.
struct KvWgmmaTile {
  int d;
  bool groups_split_keys = d != 256;
  int bc = groups_split_keys ? 128 : 64;  // keys per CTA (at D <= 128 the 8-warp pass's)
  // Queries per iteration. D = 64: 128, FlashAttention-2's choice at this width: S^T and dP^T
  // are 64 x 128 per group (64 floats each) next to dK + dV 2 x 32, and every barrier, wgmma
  // wait and LSE / delta load serves twice the FLOPs of Br 64. D = 128 and 256: 64, as dK + dV
  // alone are 2 x 64 floats.
  int br = d == 64 ? 128 : 64;
  int key_rows_per_group = 64;                          // m64
  int group_queries = groups_split_keys ? br : br / 2;  // columns of a group's S^T
  int group_cols = groups_split_keys ? d : d / 2;       // columns of a group's dK / dV
  // dQ = dS K [Br x D] per iteration: at Br 128 each group takes 64 queries (m64) and all D
  // columns, at Br 64 all 64 queries and D / 2 columns.
  bool dq_splits_queries = br == 128;
  int dq_cols = dq_splits_queries ? d : d / 2;
  int smem_bytes = 1024 + (2 * bc * d + 4 * br * d + 2 * bc * br) * 2 + 4 * br * 4;
  int split_target = 8;
};
SA_CONSTEXPR_HD KvWgmmaTile kv_wgmma_tile(int d) { return KvWgmmaTile{d}; }

// ------------------------------------------------------------------ dK/dV pass (sm_90a, warp-specialized)

// The warp-specialized dK/dV pass on sm_90a (sm90/ws_backward.cuh; the plan runs it wherever
// it covers the problem, plan.cpp): the wgmma pass's CTA (kv_wgmma_tile(d): 128 keys, blocks
// of 64 queries at d <= 128, of 128 at d <= 64; the same math) with its loads moved to a
// producer warpgroup.
//   producer (warpgroup 0): one thread loads K and V once, then each query block's Q and dO
//     tiles by TMA into a ring of `stages` stages; its warp 1 copies the block's LSE and
//     delta rows (plain loads: LSE is a strided user view) into the stage. It needs a few
//     registers for coordinates and phases: producer_regs.
//   two consumers (warpgroups 1, 2): the wgmma pass's warpgroups, S^T, dP^T, P^T, dS^T, dV,
//     dK and dQ's atomics (sm90/kv_wgmma_block.cuh). ptxas puts the wgmma pass at its
//     255-register cap (dK + dV 128, S^T + dP^T 64, dQ 32, addresses), so the consumers take
//     as many as the split allows: consumer_regs 232 (producer_regs 40: 40 x 128 + 232 x 256
//     = 64,512 <= 65,536). At d <= 64 (S^T and dP^T 64 x 128 per group: 128 floats) ptxas
//     spilled 36 bytes at 232; at 240 (producer_regs 24: 24 x 128 + 240 x 256 = 64,512) one
//     word, stored before the loop and reloaded once per query block. The producer cannot
//     take 32: the pool is the launch's 168 x 384, not the SM's 65,536 (launch_register_pool).
// stages 2: a block is 5 GEMMs of 64 x 128 x 128 per consumer (about 10.5 MFLOP per CTA,
//   some 1.7 us at an SM's share of the dense bf16 rate) against 32 KiB of Q and dO (about
//   0.5 us at its share of L2), so one block in flight ahead hides the loads; a third stage
//   would cost 33 KiB for nothing.
// Shared memory: K, V 128 x 128; P^T, dS^T 128 x 64; per stage Q, dO 64 x 128 (TMA boxes of
// 64 rows x 64 columns, 128-byte swizzle: the Sw128Blocks layout) and LSE, delta 64 floats;
// the mbarriers (K/V full; per stage full and empty); 1 KiB to align the tiles: 165,928
// bytes, one CTA per SM. At d <= 64: K, V 128 x 64; P^T, dS^T 128 x 128; per stage Q, dO
// 128 x 64 (one box wide) and 128 LSE and delta floats: 166,952 bytes.
struct WsBackwardTile {
  int d;
  // keys per CTA and queries per block and ring stage: the wgmma pass's (kv_wgmma_tile; a
  // static_assert below checks they agree, as a member initialiser cannot call it here)
  int bc = 128;
  int br = d == 64 ? 128 : 64;
  int stages = 2;
  int consumers = 2;  // consumer warpgroups
  int threads = 128 * (1 + consumers);
  int producer_regs = d == 64 ? 24 : 40;
  int consumer_regs = d == 64 ? 240 : 232;
  int box_cols = 64;              // columns of one TMA box: 128 bytes, the 128-byte swizzle's row
  int row_loaders = 32;           // producer lanes that copy LSE and delta (warp 1 of warpgroup 0)
  int barriers = 1 + 2 * stages;  // K and V full; per stage Q / dO / LSE / delta full and empty
  int smem_bytes = 1024 + (2 * bc * d + 2 * bc * br + 2 * stages * br * d) * 2 + 2 * stages * br * 4 + barriers * 8;
  int split_target = 8;  // group splits: as the wgmma pass's (one CTA per SM)
};
// The buckets that have the pass (its kernel entries) and those the plan runs it on by
// default; the 64 bucket's runs only where a test forces it (PlanForcing::ws_backward) until
// a GPU run has checked and timed it (bench/cuda-notes.md, step 47).
SA_CONSTEXPR_HD bool has_ws_backward(int bucket) { return bucket == 64 || bucket == 128; }
SA_CONSTEXPR_HD bool ws_backward_by_default(int bucket) { return bucket == 128; }
SA_CONSTEXPR_HD WsBackwardTile ws_backward_tile(int d) { return WsBackwardTile{d}; }
// The buckets whose pass has the training features' instantiations (every feature, and each
// alone: common/feature_set.hpp): the one it runs on by default. ptxas keeps them within the
// consumers' 232 registers but for ~100 bytes of spills with every feature compiled in.
SA_CONSTEXPR_HD bool ws_backward_features(int bucket) { return bucket == 128; }

// ------------------------------------------------------------------ dQ pass

// Backward, dQ pass: rows = queries (Br), columns = keys (Bc). dQ accumulates in fp32
// registers over the key blocks in a fixed order: no atomics, bitwise deterministic.
struct QPassTile {
  int mt, br, bc;
  int smem_bytes;  // Q, dO; two stages of K and V
};
SA_CONSTEXPR_HD QPassTile make_q_tile(int d, int mt, int bc) {
  return {mt, 64 * mt, bc, (2 * 64 * mt + 4 * bc) * d * 2};
}
SA_CONSTEXPR_HD QPassTile q_tile(Arch, int d) {
  // d <= 64: two m16 tiles per warp (Br 128): each K / V fragment feeds two MMAs. Bc 32: with
  // Bc 64, S, dP and dQ (3 x 64 floats) plus the pipelined GEMMs' fragments spilled.
  if (d == 64) return make_q_tile(d, 2, 32);
  // d <= 128: two m16 tiles per warp (Br 128), Bc 32: dQ 2 x 64 floats + S and dP 2 x 16
  // floats each; smem Q 32K + dO 32K + 2 x (K 8K + V 8K) = 96 KiB.
  if (d == 128) return make_q_tile(d, 2, 32);
  // d <= 256: dQ 128 floats; Bc 32 keeps S and dP at 16 floats; smem 64K + 2 x 32K = 128 KiB.
  return make_q_tile(d, 1, 32);
}

// ------------------------------------------------------------------ limits

// The registers a CTA of `threads` threads holds under __launch_bounds__(threads, 1): each
// thread's share of the SM's 65,536, rounded down to the allocation unit of 8 (ptxas reports
// 168 for 384 threads: a pool of 64,512). setmaxnreg only moves registers between the
// warpgroups inside this pool: an increase the decreases have not freed waits for ever (a d 64
// dK/dV producer at 32 with consumers at 240 asked 65,536 and hung every CTA).
SA_CONSTEXPR_HD int launch_register_pool(int threads) { return (65536 / threads) / 8 * 8 * threads; }
template <class Tile>
constexpr bool fits_register_pool(const Tile& t) {
  return t.producer_regs * 128 + t.consumer_regs * 128 * t.consumers <= launch_register_pool(t.threads);
}

// The sm_90a kernels' shared memory against the opt-in maximum per block of a 9.0 GPU
// (227 KiB; the plan also checks the GPU's own value before choosing them).
inline constexpr int kSm90SmemOptin = 227 * 1024;
static_assert(kv_wgmma_tile(64).smem_bytes <= kSm90SmemOptin && kv_wgmma_tile(128).smem_bytes <= kSm90SmemOptin &&
                  kv_wgmma_tile(256).smem_bytes <= kSm90SmemOptin,
              "a wgmma dK/dV pass needs more shared memory than a 9.0 GPU grants");
static_assert(forward_wgmma_tile(128).smem_bytes <= kSm90SmemOptin &&
                  forward_wgmma_tile(256).smem_bytes <= kSm90SmemOptin,
              "a wgmma forward needs more shared memory than a 9.0 GPU grants");
static_assert(ws_forward_tile(64).smem_bytes <= kSm90SmemOptin && ws_forward_tile(128).smem_bytes <= kSm90SmemOptin &&
                  ws_forward_tile(256).smem_bytes <= kSm90SmemOptin,
              "the warp-specialized forward needs more shared memory than a 9.0 GPU grants");
static_assert(fits_register_pool(ws_forward_tile(64)) && fits_register_pool(ws_forward_tile(128)) &&
                  fits_register_pool(ws_forward_tile(256)),
              "setmaxnreg: the warpgroups ask more registers than the CTA's launch pool holds");
static_assert(ws_backward_tile(64).smem_bytes <= kSm90SmemOptin && ws_backward_tile(128).smem_bytes <= kSm90SmemOptin,
              "the warp-specialized dK/dV pass needs more shared memory than a 9.0 GPU grants");
static_assert(fits_register_pool(ws_backward_tile(64)) && fits_register_pool(ws_backward_tile(128)),
              "setmaxnreg: the dK/dV pass's warpgroups ask more registers than the CTA's launch pool holds");
static_assert(ws_backward_tile(64).bc == kv_wgmma_tile(64).bc && ws_backward_tile(64).br == kv_wgmma_tile(64).br &&
                  ws_backward_tile(128).bc == kv_wgmma_tile(128).bc &&
                  ws_backward_tile(128).br == kv_wgmma_tile(128).br,
              "the warp-specialized dK/dV pass runs the wgmma pass's block math (sm90/kv_wgmma_block.cuh)");

}  // namespace strideattn::cuda_impl
