// The tile functions of the cuda kernels (src/backends/cuda/common/tiles.hpp), on the host:
// the shapes and shared memory each (architecture, bucket) gets are the ones the comments
// there give their reasons for, and the invariants the kernels' layouts rely on hold for
// every one. The kernels call the same constexpr functions with their template arguments and
// static_assert that the shared memory they lay out is the smem_bytes the host grants (so
// host and device cannot disagree); the values are checked here at compile time too, and a
// CPU-only build runs this test.
#include <gtest/gtest.h>

#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/decode/decode_tiles.hpp"

namespace {

using namespace strideattn::cuda_impl;

// The forward of each architecture (sm_90a: the d <= 64 bucket's mma.sync tile).
static_assert(forward_tile(Arch::sm80, 64).bc == 64 && forward_tile(Arch::sm80, 64).prefetch_pv);
static_assert(forward_tile(Arch::sm90a, 64).bc == 128 && !forward_tile(Arch::sm90a, 64).prefetch_pv);
static_assert(forward_tile(Arch::sm80, 128).bc == 32 && forward_tile(Arch::sm90a, 128).bc == 64);
static_assert(forward_tile(Arch::sm80, 64).smem_bytes == 80 * 1024);
static_assert(forward_tile(Arch::sm80, 128).smem_bytes == 96 * 1024 &&
              forward_tile(Arch::sm80, 256).smem_bytes == 96 * 1024);
static_assert(forward_wgmma_tile(128).smem_bytes == 164864 && forward_wgmma_tile(256).smem_bytes == 197632);
// The warp-specialized forward: d 128: Q + 2 stages of K and V (32 KiB each) + 9 mbarriers +
// 1 KiB; d 64: Q + 4 stages of K and V (16 KiB each) + 17 mbarriers + 1 KiB.
static_assert(ws_forward_tile(128).smem_bytes == 164936 && ws_forward_tile(128).threads == 384);
static_assert(ws_forward_tile(64).smem_bytes == 148616 && ws_forward_tile(64).threads == 384 &&
              ws_forward_tile(64).stages == 4 && ws_forward_tile(64).bc == 128);
// d 256: Q 64 KiB + 2 stages of K and V (32 KiB each) + 9 mbarriers + 1 KiB; 24 / 240 registers.
static_assert(ws_forward_tile(256).smem_bytes == 197704 && ws_forward_tile(256).bc == 64 &&
              ws_forward_tile(256).consumer_regs == 240 && ws_forward_tile(256).producer_regs == 24);
// The dK/dV passes.
static_assert(kv8_tile(Arch::sm80, 128).smem_bytes == 164864 && kv8_tile(Arch::sm80, 64).smem_bytes == 99328);
static_assert(kv_tile(Arch::sm80, 256).smem_bytes == 131584 && kv_tile(Arch::sm80, 256).dim_splits == 2);
static_assert(kv_wgmma_tile(64).smem_bytes == 166912 && kv_wgmma_tile(128).smem_bytes == 165888 &&
              kv_wgmma_tile(256).smem_bytes == 215040);
// The warp-specialized dK/dV pass: K, V (32 KiB each), P^T, dS^T (16 KiB each), 2 stages of
// Q and dO (16 KiB each) and of LSE and delta (256 bytes each), 5 mbarriers, 1 KiB.
static_assert(ws_backward_tile(128).smem_bytes == 165928 && ws_backward_tile(128).threads == 384);
static_assert(q_tile(Arch::sm80, 128).smem_bytes == 96 * 1024 && q_tile(Arch::sm80, 256).smem_bytes == 128 * 1024);
// Only the sm80 kernels at d = 128 compile no unguarded FullD code; only sm_90a prefetches.
static_assert(!unguarded_full_d(Arch::sm80, 128) && unguarded_full_d(Arch::sm80, 64) &&
              unguarded_full_d(Arch::sm90a, 128));
static_assert(!backward_prefetch(Arch::sm80, 64) && backward_prefetch(Arch::sm90a, 128) &&
              !backward_prefetch(Arch::sm90a, 256));

// Opt-in shared memory per block: an A100 (sm_80) 163 KiB, an sm_86 / sm_89 GPU 99 KiB.
constexpr int kSm80Optin = 163 * 1024, kSm86Optin = 99 * 1024;

TEST(CudaTiles, ForwardShapesFitTheirWarpsAndStages) {
  for (Arch a : kArchs)
    for (int d : kBuckets) {
      SCOPED_TRACE(::testing::Message() << to_string(a) << " d " << d);
      const ForwardTile t = forward_tile(a, d);
      EXPECT_EQ(t.br, kWarps * 16 * t.mt) << "one warp per 16 * mt query rows";
      EXPECT_EQ(t.stage % t.bc, 0) << "a stage is whole bc windows";
      EXPECT_EQ(t.bc % 16, 0);
      EXPECT_EQ(t.smem_bytes, (t.br + 4 * t.stage) * d * 2) << "Q and two stages of K and V";
      EXPECT_LE(t.smem_bytes, kSm86Optin) << "the forward runs on every GPU of compute capability 8.0+";
    }
  for (int d : {128, 256}) {
    const ForwardWgmmaTile t = forward_wgmma_tile(d);
    EXPECT_EQ(t.br, 128) << "two warpgroups of 64 rows";
    EXPECT_LE(t.smem_bytes, kSm90SmemOptin);
  }
}

// The warp-specialized forward: one m64 row block per consumer warpgroup, whole TMA boxes
// per tile (128-byte rows: the 128-byte swizzle's), the warpgroups' registers within the SM's.
TEST(CudaTiles, WarpSpecializedForwardFitsItsWarpgroups) {
  EXPECT_TRUE(has_ws_forward(128));
  EXPECT_TRUE(has_ws_forward(64));
  EXPECT_TRUE(has_ws_forward(256));
  for (int d : {64, 128, 256}) {
    SCOPED_TRACE(d);
    const WsForwardTile t = ws_forward_tile(d);
    EXPECT_EQ(t.br, 64 * t.consumers);
    EXPECT_EQ(t.box_cols * 2, 128);
    EXPECT_EQ(t.d % t.box_cols, 0);
    EXPECT_LE(t.bc, 256) << "a TMA box has at most 256 rows";
    EXPECT_LE(t.br, 256);
    EXPECT_LE(t.producer_regs * 128 + t.consumer_regs * 128 * t.consumers, 65536);
    EXPECT_EQ(t.producer_regs % 8, 0);
    EXPECT_EQ(t.consumer_regs % 8, 0);
    EXPECT_LE(t.smem_bytes, kSm90SmemOptin);
    EXPECT_EQ(t.barriers, 1 + 4 * t.stages);
    EXPECT_EQ(t.bc % 16, 0) << "whole k16 steps of O += P V";
    EXPECT_EQ(int(kFoldKeys) % t.bc, 0) << "the fold every kFoldKeys / Bc blocks";
  }
}

TEST(CudaTiles, BackwardShapesFitTheirWarpsAndSharedMemory) {
  for (Arch a : kArchs)
    for (int d : kBuckets) {
      SCOPED_TRACE(::testing::Message() << to_string(a) << " d " << d);
      const KvPassTile kv = kv_tile(a, d);
      EXPECT_EQ(kv.bc, kWarps * 16 * kv.mt) << "one warp per 16 * mt keys";
      EXPECT_EQ(kv.dim_splits * kv.d_acc, d);
      EXPECT_LE(kv.smem_bytes, kSm80Optin);
      const QPassTile q = q_tile(a, d);
      EXPECT_EQ(q.br, kWarps * 16 * q.mt) << "one warp per 16 * mt queries";
      EXPECT_LE(q.smem_bytes, kSm80Optin);
      const KvWgmmaTile w = kv_wgmma_tile(d);
      EXPECT_EQ(w.groups_split_keys ? w.bc : 2 * w.bc, 2 * w.key_rows_per_group) << "two warpgroups of m64 keys";
      EXPECT_LE(w.smem_bytes, kSm90SmemOptin);
      if (!has_kv8_pass(d)) continue;
      const Kv8Tile k8 = kv8_tile(a, d);
      EXPECT_EQ(k8.key_warps * k8.side_warps, kKvWarps);
      EXPECT_EQ(k8.key_warps * 16 * k8.mt, k8.bc);
      EXPECT_EQ(k8.side_warps * k8.warp_q, k8.br);
      EXPECT_EQ(k8.dq_query_warps * k8.dq_warp_q, k8.br);
      EXPECT_LE(k8.smem_bytes, kSm80Optin) << "the 8-warp pass fits an A100";
    }
  // The reason the 4-warp pass stays at d <= 128: sm_86 / sm_89 cannot run the 8-warp one
  // there, and can at d <= 64 (so no 4-warp pass is kept for that bucket).
  EXPECT_GT(kv8_tile(Arch::sm80, 128).smem_bytes, kSm86Optin);
  EXPECT_LE(kv8_tile(Arch::sm80, 64).smem_bytes, kSm86Optin);
  EXPECT_LE(kv_tile(Arch::sm80, 128).smem_bytes, kSm86Optin);
}

TEST(CudaTiles, HeadDimBuckets) {
  EXPECT_EQ(head_dim_bucket(8, 8), 64);
  EXPECT_EQ(head_dim_bucket(64, 64), 64);
  EXPECT_EQ(head_dim_bucket(72, 8), 128);
  EXPECT_EQ(head_dim_bucket(64, 136), 256);
  EXPECT_EQ(head_dim_bucket(256, 256), 256);
}

// The KV-cache split kernel (decode/decode_tiles.hpp): the shared memory of its ring and Q
// tile, at least 3 stages, whole 16-key slabs, and within an 8.0 GPU's 163 KiB.
static_assert(decode_tile(64).smem_bytes == 67584 && decode_tile(128).smem_bytes == 102400 &&
              decode_tile(256).smem_bytes == 106496);
static_assert(decode_tile(64).stages >= 3 && decode_tile(128).stages >= 3 && decode_tile(256).stages >= 3);
static_assert(decode_tile(128).stage_keys % kDecodeSlab == 0 && decode_tile(256).stage_keys % kDecodeSlab == 0);
static_assert(decode_tile(256).smem_bytes <= 163 * 1024);

// The split count for an H200 (132 SMs, 2 CTAs each at d 128) on the benchmark's decode rows
// (GQA 32/8: b x 8 CTAs), and its limits.
TEST(DecodeTiles, SplitCount) {
  EXPECT_EQ(decode_splits(1 * 8, 32768, 132, 2), 29);  // 232 CTAs: 88% of one wave
  EXPECT_EQ(decode_splits(16 * 8, 8192, 132, 2), 2);
  EXPECT_EQ(decode_splits(8 * 8, 16384, 132, 2), 4);
  EXPECT_EQ(decode_splits(64 * 8, 4096, 132, 2), 1);  // a full grid: no split
  // never more than one split per 256 keys of capacity, never more than 256
  EXPECT_EQ(decode_splits(1, 300, 132, 2), 2);
  EXPECT_EQ(decode_splits(1, 100, 132, 2), 1);
  EXPECT_LE(decode_splits(1, 1 << 30, 132, 4), kDecodeMaxSplits);
  // at least one split per kDecodeWarps x kDecodeWarpKeys keys, even on a full grid
  EXPECT_EQ(decode_splits(100000, 4 * 32768, 132, 2), 4);
  EXPECT_EQ(decode_splits(0, 1000, 132, 2), 1);
}

}  // namespace
