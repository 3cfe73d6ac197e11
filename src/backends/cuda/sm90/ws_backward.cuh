// The warp-specialized dK/dV pass on sm_90a (the plan runs it wherever it covers the
// problem, plan.cpp): the d <= 64 and d <= 128 buckets (d <= 64 only where a test forces it,
// tiles.hpp: ws_backward_by_default), fixed-length batches whose Q, K, V and dO views TMA can
// read (tma_maps.hpp), the single-pass backward without the fold, with the training features
// in the 128 bucket (ws_backward_features). The wgmma pass (sm90/backward.cuh) with its loads
// taken off the computing warps.
//
// One CTA of three warpgroups per (block of 128 keys, KV head, sequence[, GQA group split]),
// backward_wgmma_kernel's grid and loop over query blocks and GQA heads (KvBlockWork):
//   producer, warpgroup 0 (setmaxnreg down to WsBackwardTile::producer_regs): thread 0 loads
//     K and V once (one `kv_full` mbarrier), then per query block Q and dO by TMA
//     (cp.async.bulk.tensor, boxes of 64 columns in the 128-byte swizzle) into a ring of
//     stages; the lanes of warp 1 copy the block's LSE and delta rows (LSE is a strided user
//     view, the last block partial: plain loads, LSE -inf and delta 0 past s_q) into the same
//     stage. A stage's `full` mbarrier completes on the TMA's bytes and the arrivals of
//     thread 0 and those 32 lanes; its `empty` one on the arrival of every consumer warp.
//   consumers, warpgroups 1 and 2 (setmaxnreg up to consumer_regs): per query block the wgmma
//     pass's math (sm90/kv_wgmma_block.cuh, the same function), with named barrier
//     kConsumerBarrier over their 256 threads where that pass has __syncthreads; the stage
//     goes back to the producer once the block's wgmmas, the last readers of its Q and dO,
//     have completed. Then dK and dV through the common epilogue (store_dk_dv).
#pragma once

#include "backends/cuda/common/epilogue.cuh"
#include "backends/cuda/common/kv_pass.cuh"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/sm90/kv_wgmma_block.cuh"
#include "backends/cuda/sm90/tma.cuh"
#include "backends/cuda/sm90/wgmma.cuh"
#include "backends/cuda/sm90/ws_params.hpp"

namespace strideattn::cuda_impl {

// The shared memory of the kernel: K, V; P^T, dS^T; the Q stages, the dO stages (each tile
// 1024-byte aligned, Sw128Blocks); the LSE stages, the delta stages [stages][Br] fp32; then
// the mbarriers.
template <int D>
struct WsBackwardSmem {
  static constexpr WsBackwardTile kTile = ws_backward_tile(D);
  static constexpr int Br = kTile.br, Bc = kTile.bc, kStages = kTile.stages;
  using KvTile = Sw128Tile<Bc, D>;
  using QTile = Sw128Tile<Br, D>;
  using PTile = Sw128Tile<Bc, Br>;  // P^T and dS^T: rows = keys, columns = queries
  static constexpr int kTileElems = 2 * KvTile::kElems + 2 * PTile::kElems + 2 * kStages * QTile::kElems;
  static_assert(1024 + kTileElems * 2 + 2 * kStages * Br * 4 + kTile.barriers * 8 == kTile.smem_bytes,
                "the shared memory the host grants");
  static_assert(D % kTile.box_cols == 0 && KvTile::kBlockBytes == Bc * 128u && QTile::kBlockBytes == Br * 128u,
                "one TMA box per 64-column block of a tile");
  uint16_t* base;  // 1024-byte aligned
  __device__ __forceinline__ KvTile k() const { return KvTile{base}; }
  __device__ __forceinline__ KvTile v() const { return KvTile{base + KvTile::kElems}; }
  __device__ __forceinline__ PTile p() const { return PTile{base + 2 * KvTile::kElems}; }
  __device__ __forceinline__ PTile ds() const { return PTile{base + 2 * KvTile::kElems + PTile::kElems}; }
  __device__ __forceinline__ QTile q(int s) const {
    return QTile{base + 2 * KvTile::kElems + 2 * PTile::kElems + s * QTile::kElems};
  }
  __device__ __forceinline__ QTile d_o(int s) const {
    return QTile{base + 2 * KvTile::kElems + 2 * PTile::kElems + (kStages + s) * QTile::kElems};
  }
  __device__ __forceinline__ float* lse(int s) const { return reinterpret_cast<float*>(base + kTileElems) + s * Br; }
  __device__ __forceinline__ float* delta(int s) const { return lse(kStages + s); }
  // mbarrier i's shared address: 0 K and V full; then per stage full, then per stage empty
  __device__ __forceinline__ uint32_t bar(int i) const {
    return smem_addr(base + kTileElems) + uint32_t(2 * kStages * Br * 4) + 8u * uint32_t(i);
  }
  __device__ __forceinline__ uint32_t kv_full() const { return bar(0); }
  __device__ __forceinline__ uint32_t full(int s) const { return bar(1 + s); }
  __device__ __forceinline__ uint32_t empty(int s) const { return bar(1 + kStages + s); }
};

// The consumers' own barrier (hardware barrier 1: 0 is __syncthreads'), over their 256 threads.
inline constexpr int kConsumerBarrier = 1;

// A whole tile (every 64-column block) from `map` at token `token` into `tile`, on `bar`.
template <class Tile>
__device__ __forceinline__ void tma_load_rows(const Tile& tile, const CUtensorMap* map, uint32_t bar, int token,
                                              int head, int batch) {
#pragma unroll
  for (int c = 0; c < Tile::kCols / 64; ++c)
    tma_load_4d(smem_addr(tile.base) + uint32_t(c) * Tile::kBlockBytes, map, bar, 64 * c, token, head, batch);
}

// Iteration `it`'s ring stage and the phase parity its `full` barrier completes in (round
// it / stages); the producer waits for the other parity on `empty`, which a fresh barrier
// satisfies at once (sm90/tma.cuh).
template <int Stages>
struct RingSlot {
  int stage;
  uint32_t parity;
  __device__ __forceinline__ explicit RingSlot(int it) : stage(it % Stages), parity(uint32_t(it / Stages) & 1u) {}
};

// The producer's thread 0: K and V once, then Q and dO of every query block through the ring.
template <int D>
__device__ __forceinline__ void ws_backward_produce_tiles(const WsBackwardParams& prm, const WsBackwardSmem<D>& sm,
                                                          const KvBlockWork& w) {
  using S = WsBackwardSmem<D>;
  tma_prefetch_map(&prm.maps.q);
  tma_prefetch_map(&prm.maps.k);
  tma_prefetch_map(&prm.maps.v);
  tma_prefetch_map(&prm.maps.d_o);
  const int batch = int(w.batch), kv_head = int(w.kv_head), c0 = int(w.c0);
  mbar_arrive_expect_tx(sm.kv_full(), 2u * uint32_t(S::KvTile::kElems) * 2u);
  tma_load_rows(sm.k(), &prm.maps.k, sm.kv_full(), c0, kv_head, batch);
  tma_load_rows(sm.v(), &prm.maps.v, sm.kv_full(), c0, kv_head, batch);
  constexpr uint32_t kStageBytes = 2u * uint32_t(S::QTile::kElems) * 2u;
  int h = 0, b = 0;
  for (int it = 0; it < w.n_iters; ++it) {
    const RingSlot<S::kStages> slot(it);
    const int head = int(w.head(h)), r0 = (w.first_qblock + b) * S::Br;
    mbar_wait(sm.empty(slot.stage), slot.parity ^ 1u);
    mbar_arrive_expect_tx(sm.full(slot.stage), kStageBytes);
    tma_load_rows(sm.q(slot.stage), &prm.maps.q, sm.full(slot.stage), r0, head, batch);
    tma_load_rows(sm.d_o(slot.stage), &prm.maps.d_o, sm.full(slot.stage), r0, head, batch);
    if (++b == w.n_qblocks) b = 0, ++h;
  }
}

// The producer's warp 1: LSE (natural log, as stored) and delta of every query block into
// the ring (rows past s_q: LSE -inf, so P = 0, and delta 0, as load_query_block's).
template <int D>
__device__ __forceinline__ void ws_backward_produce_rows(const KernelParams& kp, const WsBackwardSmem<D>& sm,
                                                         const KvBlockWork& w) {
  using S = WsBackwardSmem<D>;
  const kernel::AttentionParams& p = kp.p;
  const int lane = threadIdx.x & 31;
  int h = 0, b = 0;
  for (int it = 0; it < w.n_iters; ++it) {
    const RingSlot<S::kStages> slot(it);
    const int64_t head = w.head(h), r0 = int64_t(w.first_qblock + b) * S::Br;
    const int rows = int(kernel::min64(S::Br, w.s_q - r0));
    float *const lse = sm.lse(slot.stage), *const delta = sm.delta(slot.stage);
    mbar_wait(sm.empty(slot.stage), slot.parity ^ 1u);
#pragma unroll
    for (int i = lane; i < S::Br; i += 32) {
      const bool in = i < rows;
      lse[i] = in ? p.lse[kernel::lse_offset(p.q_seq, p.lse_st, w.batch, head, r0 + i)] : -INFINITY;
      delta[i] = in ? kp.delta[delta_index(kp, w.batch, head, r0 + i)] : 0.f;
    }
    mbar_arrive(sm.full(slot.stage));  // (each lane: its own stores, released)
    if (++b == w.n_qblocks) b = 0, ++h;
  }
}

template <class T, int D, int Feats>
__global__ void __launch_bounds__(ws_backward_tile(D).threads, 1)
    ws_backward_kernel(const __grid_constant__ WsBackwardParams prm) {
#if SA_WGMMA
  using S = WsBackwardSmem<D>;
  constexpr WsBackwardTile kTile = ws_backward_tile(D);
  constexpr int GD = kv_wgmma_tile(D).group_cols;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // the 128-byte swizzle is a function of the address: tiles start 1024-byte aligned
  const S sm{reinterpret_cast<uint16_t*>(smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u))};
  const KernelParams& kp = prm.kp;
  const KvBlockWork w = kv_block_work<kTile.bc, kTile.br>(kp);
  if (w.empty) return;  // (every thread of the CTA, before any barrier)

  if (threadIdx.x == 0) {
    mbar_init(sm.kv_full(), 1);
    for (int s = 0; s < kTile.stages; ++s) {
      mbar_init(sm.full(s), 1 + kTile.row_loaders);  // the TMA thread and the row loaders
      mbar_init(sm.empty(s), 4 * kTile.consumers);   // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int wg = threadIdx.x >> 7;
  if (wg == 0) {
    setmaxnreg_dec<kTile.producer_regs>();
    if (w.n_iters > 0) {
      if (threadIdx.x == 0) ws_backward_produce_tiles<D>(prm, sm, w);
      if ((threadIdx.x >> 5) == 1) ws_backward_produce_rows<D>(kp, sm, w);
    }
    return;
  }
  setmaxnreg_inc<kTile.consumer_regs>();
  const KvWgmmaLane<D> ln(threadIdx.x - 128u);
  const int lane = threadIdx.x & 31, d_qk = int(kp.p.d_qk);

  // This warp's 16 keys x GD columns of dK and dV (the group's m64 x GD accumulators).
  float dk[1][GD / 8][4], dv[1][GD / 8][4];
  zero<1, GD>(dk);
  zero<1, GD>(dv);
  if (w.n_iters > 0) mbar_wait(sm.kv_full(), 0);
  int h = 0, b = 0;
  int fold_left = 0;  // (no fold: ws_backward_refusal)
  for (int it = 0; it < w.n_iters; ++it) {
    const RingSlot<S::kStages> slot(it);
    // query block `it` has landed; every consumer is done with block it - 1 (its wgmmas
    // waited for), so P^T / dS^T may be rewritten
    mbar_wait(sm.full(slot.stage), slot.parity);
    named_barrier_sync(kConsumerBarrier, 256);
    kv_wgmma_block<T, D, false, Feats>(kp, w, ln, sm.k(), sm.v(), sm.p(), sm.ds(), sm.q(slot.stage), sm.d_o(slot.stage),
                                       sm.lse(slot.stage), sm.delta(slot.stage), h, b, d_qk, dk, dv, fold_left,
                                       [] { named_barrier_sync(kConsumerBarrier, 256); });
    // (every wgmma of the block has completed: Q, dO, LSE and delta of the stage are free)
    __syncwarp();
    if (lane == 0) mbar_arrive(sm.empty(slot.stage));
    if (++b == w.n_qblocks) b = 0, ++h;
  }
  // epilogue: this warp's 16 keys (those below c1), the group's GD columns
  store_dk_dv<T, 1, GD, false>(kp, w.batch, w.kv_head, w.gsplit, w.c0 + ln.key0, w.c1, ln.g_d0, dk, dv);
#endif
}

// The kernel table's entry of this pass for (T, D) (dispatch.hpp): `tma` marks it as an
// entry find_kernel never returns (the plan asks for it by name: find_ws_backward). No fold,
// single pass (ws_backward_refusal). In the 128 bucket, the training features that change
// the scores too: every one (mods) and each alone (mods_bias ... mods_dropout), which keep
// the others' code out of the consumers' registers. (Sinks alone run the plain pass.)
template <class T, int D>
KernelEntry ws_backward_entry() {
  constexpr WsBackwardTile kTile = ws_backward_tile(D);
  KernelEntry e;
  e.name = "sm90a warp-specialized dK/dV pass";
  e.dtype = dtype_of<T>(), e.arch = Arch::sm90a, e.bucket = D, e.pass = Pass::dkdv;
  e.threads = kTile.threads, e.smem_bytes = kTile.smem_bytes;
  e.grid = GridShape::key_blocks, e.block_rows = kTile.bc, e.loop_rows = kTile.br;
  e.adds_dq = true, e.split_target = kTile.split_target;
  e.tma = true;
  e.guarded = reinterpret_cast<const void*>(&ws_backward_kernel<T, D, 0>);
  if constexpr (ws_backward_features(D)) {
    e.mods = reinterpret_cast<const void*>(&ws_backward_kernel<T, D, kFeatAll>);
    set_single_features<kScoreFeatureCount>(
        &e, []<int F>() { return reinterpret_cast<const void*>(&ws_backward_kernel<T, D, F>); });
  }
  return e;
}

}  // namespace strideattn::cuda_impl
