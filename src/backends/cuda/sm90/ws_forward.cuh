// The warp-specialized forward on sm_90a (the plan runs it wherever it covers the problem,
// plan.cpp), d <= 64, 128 and 256 buckets, fixed-length batches whose Q, K and V views TMA can read
// (tma_maps.hpp says when): the plain variant; in the overlapped schedule also the fold over
// more than kFoldKeys keys and the training features' variant (Variant::mods, up to kFoldKeys
// keys), which applies them as sm90/forward.cuh's does (common/score_mod.cuh, dropout.cuh).
//
// One CTA of three warpgroups per (block of 128 queries, head, sequence), heaviest blocks
// first (common/query_block.cuh):
//   producer, warpgroup 0 (setmaxnreg down to WsForwardTile::producer_regs; one thread
//     issues): Q once, then K and V of each key block by TMA (cp.async.bulk.tensor, boxes of
//     64 columns in the 128-byte swizzle) into a ring of shared-memory stages. Each stage has
//     a `full` mbarrier per tensor, armed with its bytes and completed by the TMA, and an
//     `empty` one on which every consumer warp arrives when its wgmmas are done reading.
//   consumers, warpgroups 1 and 2 (setmaxnreg up to consumer_regs): 64 query rows each, per
//     key block the wgmma forward's steps (sm90/forward.cuh): S = Q K^T from shared memory,
//     the mask and the online softmax (common/mask.cuh, common/softmax.cuh), O += P V with P
//     from registers, then O and LSE through the common epilogue (common/epilogue.cuh).
// K and V have separate barriers, so S of a block starts as soon as its K has landed.
// Consumer schedules (dispatch.hpp WsSchedule, one instantiation each): plain; overlapped
// (ws_consume_overlapped): inside each consumer, block j+1's S = Q K^T is issued before block
// j's O += P V and its softmax runs under that GEMM; ping-pong: overlapped, and the two
// consumers take turns to issue their GEMMs (two hardware barriers), so that one's softmax
// runs while the other's GEMMs hold the tensor cores (FlashAttention-3's warp scheduler
// barriers). Not done yet (bench/cuda-notes.md, steps 27 and 28): a persistent scheduler, O
// through shared memory and a TMA store.
#pragma once

#include "backends/cuda/common/dropout.cuh"
#include "backends/cuda/common/epilogue.cuh"
#include "backends/cuda/common/fragment.cuh"
#include "backends/cuda/common/mask.cuh"
#include "backends/cuda/common/outer_accumulator.cuh"
#include "backends/cuda/common/query_block.cuh"
#include "backends/cuda/common/score_mod.cuh"
#include "backends/cuda/common/softmax.cuh"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/sm90/tma.cuh"
#include "backends/cuda/sm90/wgmma.cuh"
#include "backends/cuda/sm90/ws_params.hpp"

namespace strideattn::cuda_impl {

// The shared memory of the kernel: Q, the K stages, the V stages (each tile 1024-byte
// aligned, Sw128Blocks), then the mbarriers.
template <int D>
struct WsForwardSmem {
  static constexpr WsForwardTile kTile = ws_forward_tile(D);
  static constexpr int Br = kTile.br, Bc = kTile.bc, kStages = kTile.stages;
  // columns of O one O += P V wgmma covers: all of them at d <= 64 (m64n64), 128 beyond
  static constexpr int kPvCols = D < 128 ? D : 128;
  using QTile = Sw128Tile<Br, D>;
  using KvTile = Sw128Tile<Bc, D>;
  static_assert(1024 + (QTile::kElems + 2 * kStages * KvTile::kElems) * 2 + kTile.barriers * 8 == kTile.smem_bytes,
                "the shared memory the host grants");
  static_assert(D % kTile.box_cols == 0 && KvTile::kBlockBytes == Bc * 128u && QTile::kBlockBytes == Br * 128u,
                "one TMA box per 64-column block of a tile");
  uint16_t* base;  // 1024-byte aligned
  __device__ __forceinline__ QTile q() const { return QTile{base}; }
  __device__ __forceinline__ KvTile k(int s) const { return KvTile{base + QTile::kElems + s * KvTile::kElems}; }
  __device__ __forceinline__ KvTile v(int s) const {
    return KvTile{base + QTile::kElems + (kStages + s) * KvTile::kElems};
  }
  // mbarrier i's shared address: 0 Q full; then per stage K full, K empty, V full, V empty
  __device__ __forceinline__ uint32_t bar(int i) const {
    return smem_addr(base + QTile::kElems + 2 * kStages * KvTile::kElems) + 8u * uint32_t(i);
  }
  __device__ __forceinline__ uint32_t q_full() const { return bar(0); }
  __device__ __forceinline__ uint32_t k_full(int s) const { return bar(1 + s); }
  __device__ __forceinline__ uint32_t k_empty(int s) const { return bar(1 + kStages + s); }
  __device__ __forceinline__ uint32_t v_full(int s) const { return bar(1 + 2 * kStages + s); }
  __device__ __forceinline__ uint32_t v_empty(int s) const { return bar(1 + 3 * kStages + s); }
};

// A whole tile (every 64-column block) from `map` at token `token` into `tile`, on `bar`.
template <class Tile>
__device__ __forceinline__ void tma_load_tile(const Tile& tile, const CUtensorMap* map, uint32_t bar, int token,
                                              int head, int batch) {
#pragma unroll
  for (int c = 0; c < Tile::kCols / 64; ++c)
    tma_load_4d(smem_addr(tile.base) + uint32_t(c) * Tile::kBlockBytes, map, bar, 64 * c, token, head, batch);
}

// The producer: one thread loads Q, then walks the ring (round r = it / stages of a stage
// waits for the consumers' r-th release of it; the first round passes at once).
template <int D>
__device__ __forceinline__ void ws_produce(const WsForwardParams& prm, const WsForwardSmem<D>& sm,
                                           const QueryBlockWork& w) {
  using S = WsForwardSmem<D>;
  tma_prefetch_map(&prm.maps.q);
  tma_prefetch_map(&prm.maps.k);
  tma_prefetch_map(&prm.maps.v);
  const int batch = int(w.batch), head = int(w.head), kv_head = int(w.kv_head);
  mbar_arrive_expect_tx(sm.q_full(), uint32_t(S::QTile::kElems) * 2u);
  tma_load_tile(sm.q(), &prm.maps.q, sm.q_full(), int(w.r0), head, batch);
  constexpr uint32_t kStageBytes = uint32_t(S::KvTile::kElems) * 2u;
  for (int it = 0; it < w.n_key_blocks; ++it) {
    const int stage = it % S::kStages;
    const uint32_t free_parity = ((it / S::kStages) & 1) ^ 1;
    const int c0 = int(w.first_key) + it * S::Bc;
    mbar_wait(sm.k_empty(stage), free_parity);
    mbar_arrive_expect_tx(sm.k_full(stage), kStageBytes);
    tma_load_tile(sm.k(stage), &prm.maps.k, sm.k_full(stage), c0, kv_head, batch);
    mbar_wait(sm.v_empty(stage), free_parity);
    mbar_arrive_expect_tx(sm.v_full(stage), kStageBytes);
    tma_load_tile(sm.v(stage), &prm.maps.v, sm.v_full(stage), c0, kv_head, batch);
  }
}

// A consumer warpgroup (cwg 0 or 1: query rows [64 cwg, 64 cwg + 64) of the block): the
// mainloop over the key blocks, then the epilogue.
template <class T, int D>
__device__ __forceinline__ void ws_consume(const KernelParams& kp, const WsForwardSmem<D>& sm, const QueryBlockWork& w,
                                           int cwg) {
  using S = WsForwardSmem<D>;
  constexpr int Bc = S::Bc;
  const kernel::AttentionParams& p = kp.p;
  const MaskRule& mask = w.mask;
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int warp_row0 = cwg * 64 + warp * 16;  // first row of this warp inside the block

  float o_acc[1][D / 8][4];
  zero<1, D>(o_acc);
  float row_max[1][2] = {{-INFINITY, -INFINITY}}, row_sum[1][2] = {{0.f, 0.f}};
  constexpr int kOn = S::kPvCols;
  auto o_slice = [&](int n0) -> float(&)[kOn / 8][4] {
    return *reinterpret_cast<float(*)[kOn / 8][4]>(&o_acc[0][n0 / 8]);
  };

  if (w.n_key_blocks > 0) mbar_wait(sm.q_full(), 0);
  const auto sQ = sm.q();
  for (int it = 0; it < w.n_key_blocks; ++it) {
    const int stage = it % S::kStages;
    const uint32_t parity = (it / S::kStages) & 1;
    const int64_t c0 = w.first_key + int64_t(it) * Bc;

    // S = Q K^T: this group's 64 rows x Bc keys; then K's stage goes back to the producer
    mbar_wait(sm.k_full(stage), parity);
    const auto sK = sm.k(stage);
    float s[1][Bc / 8][4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_m64k16<T, 0, 0>(s[0], sQ.k_major(cwg * 64, kk), sK.k_major(0, kk), kk);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s[0]);
    __syncwarp();
    if (lane == 0) mbar_arrive(sm.k_empty(stage));

    // masked entries -> -inf (keys past s_kv too), then the online softmax step
    if (!kernel::tile_fully_visible(mask, w.r0, w.r1, c0, c0 + Bc))
      apply_mask<1, Bc>(s, mask, w.r0 + warp_row0, c0, true, -INFINITY);
    online_softmax_step<1, Bc, D>(s, o_acc, row_max, row_sum, kp.scale_log2);

    // O += P V (P rounded to T, in registers), in column slices of O of kPvCols (m64n64 at
    // d <= 64, m64n128 beyond); then V's stage goes back to the producer
    uint32_t p_frag[1][Bc / 16][4];
    accum_to_a<T, 1, Bc>(p_frag, s);
    mbar_wait(sm.v_full(stage), parity);
    const auto sV = sm.v(stage);
    fence_operands(o_acc[0]);
    fence_operands(p_frag[0]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk)
#pragma unroll
      for (int n0 = 0; n0 < D; n0 += kOn) wgmma_rs_m64k16<T, 1>(o_slice(n0), p_frag[0][kk], sV.mn_major(n0, kk), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(o_acc[0]);
    __syncwarp();
    if (lane == 0) mbar_arrive(sm.v_empty(stage));
  }
  const auto o = sequence_ref(p.o, p.o_st, p.q_seq, w.batch);
  store_o_lse<T, 1, D>(kp, w.batch, w.head, w.r0 + warp_row0, w.r1, int(p.d_v), o, o_acc, row_max, row_sum);
}

// Hardware barriers of the ping-pong turns: consumer c waits on kTurnBarrier + c before it
// issues its GEMMs and then lets the other one go (arrives on the other's barrier).
inline constexpr int kTurnBarrier = 1;

// The same consumer with the GEMMs of consecutive blocks overlapped inside the warpgroup
// (FlashAttention-3's intra-warpgroup pipelining): block j + 1's S = Q K^T is issued before
// block j's O += P V, and block j + 1's mask and softmax scores (online_softmax_scores) run
// while that P V is in flight; O is rescaled (rescale_o) only once it has landed. The sums
// are the plain consumer's in the same order (O = (O alpha_j + P_j V_j) ...), so O and LSE are
// the same bits. Registers across the loop (d 128): S of the next block (64), P of this one (32), O
// (64). PingPong: each issue of GEMMs (the first S, then S and P V of each block, the last
// P V) is one turn; consumer 1 gives consumer 0 the first turn. Both consumers take n + 1
// turns (the same key blocks), so the turns alternate to the end; the last pass of a turn
// is left pending when the CTA exits.
// Fold (rows that see more than kFoldKeys keys, common/outer_accumulator.cuh): every
// kFoldKeys / Bc blocks, once block j's P V has landed and O is rescaled to block j + 1's
// max, O (blocks up to j) and l (up to j + 1, whose scores are already summed) go to the
// warp's slot against that max; both restart from 0, so the slot and the registers add up to
// the same O and l (only the blocks at which l is cut differ from O's).
// Feats (the training features compiled in, common/feature_set.hpp; 0: none; every one: as
// forward_wgmma_kernel's Mods; never with Fold): in `scores`,
// S becomes the logit L (score_mod, the ScoreMod made per block as the wgmma forward makes
// it) before the mask, the softmax runs on L with scale 1, and dropout's keep mask, drawn
// there while the previous block's P V runs, multiplies P after l is summed (O += (Z P) V);
// the max logit is recorded and the sink joined before the epilogue. Same functions on the
// same fragments in the same order as the wgmma forward: the same bits.
template <class T, int D, bool PingPong, bool Fold = false, int Feats = 0>
__device__ __forceinline__ void ws_consume_overlapped(const KernelParams& kp, const WsForwardSmem<D>& sm,
                                                      const QueryBlockWork& w, int cwg) {
  using S = WsForwardSmem<D>;
  constexpr int Bc = S::Bc;
  const kernel::AttentionParams& p = kp.p;
  const MaskRule& mask = w.mask;
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int warp_row0 = cwg * 64 + warp * 16;
  constexpr bool Mods = Feats != 0;
  static_assert(!(Fold && Mods), "the features' variant covers up to kFoldKeys keys (plan.cpp)");
  // the softmax's exponent scale: L is already scaled in the feature variant
  const float scale_log2 = Mods ? kLog2e : kp.scale_log2;

  float o_acc[1][D / 8][4];
  zero<1, D>(o_acc);
  float row_max[1][2] = {{-INFINITY, -INFINITY}}, row_sum[1][2] = {{0.f, 0.f}};
  constexpr int kOn = S::kPvCols;
  auto o_slice = [&](int n0) -> float(&)[kOn / 8][4] {
    return *reinterpret_cast<float(*)[kOn / 8][4]>(&o_acc[0][n0 / 8]);
  };
  const int n = w.n_key_blocks;
  const auto sQ = sm.q();
  constexpr int kFoldBlocks = int(kFoldKeys / Bc);
  OuterAccumulator<1, D> outer;
  if constexpr (Fold)
    outer.claim(kp, w.keys.end - w.keys.begin,
                int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) * 8 + cwg * 4 + warp);
  auto take_turn = [&] {
    if constexpr (PingPong) named_barrier_sync(kTurnBarrier + cwg, 256);
  };
  auto pass_turn = [&] {
    if constexpr (PingPong) named_barrier_arrive(kTurnBarrier + (cwg ^ 1), 256);
  };
  if (PingPong && cwg == 1 && n > 0) named_barrier_arrive(kTurnBarrier, 256);
  float s[1][Bc / 8][4];
  uint32_t p_frag[1][Bc / 16][4];
  // S of block `it` issued (one committed wgmma group), once its K has landed
  auto issue_s = [&](int it) {
    const int stage = it % S::kStages;
    mbar_wait(sm.k_full(stage), (it / S::kStages) & 1);
    const auto sK = sm.k(stage);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_m64k16<T, 0, 0>(s[0], sQ.k_major(cwg * 64, kk), sK.k_major(0, kk), kk);
    wgmma_commit();
  };
  // after S of block `it` has landed: K's stage back to the producer, (Mods: S -> L), the
  // mask, P and l (Mods: then P times dropout's Z, O += (Z P) V with l summed without Z; the
  // keep mask drawn first: drawn after the softmax, ptxas spilled 8 bytes)
  auto scores = [&](int it, float(&alpha)[1][2]) {
    fence_operands(s[0]);
    __syncwarp();
    if (lane == 0) mbar_arrive(sm.k_empty(it % S::kStages));
    const int64_t c0 = w.first_key + int64_t(it) * Bc;
    KeepMask<1, Bc / 8> keep{};
    const bool dropping = (Feats & kFeatDropout) != 0 && kp.f.dropout_scale != 0.f;
    if (dropping) keep = dropout_mask_rows<1, Bc / 8>(kp, w.batch, w.head, w.r0 + warp_row0, c0);
    if constexpr (Mods) score_mod<1, Bc>(s, ScoreMod::of<Feats>(kp, mask, w.batch, w.head), w.r0 + warp_row0, c0, true);
    if (!kernel::tile_fully_visible(mask, w.r0, w.r1, c0, c0 + Bc))
      apply_mask<1, Bc>(s, mask, w.r0 + warp_row0, c0, true, -INFINITY);
    const bool raised = online_softmax_scores<1, Bc>(s, row_max, row_sum, scale_log2, alpha);
    if (dropping) apply_keep(s, keep, kp.f.dropout_scale);
    return raised;
  };

  // O += P V of block `it` issued (one committed wgmma group), once its V has landed
  auto issue_pv = [&](int it) {
    const int stage = it % S::kStages;
    mbar_wait(sm.v_full(stage), (it / S::kStages) & 1);
    const auto sV = sm.v(stage);
    fence_operands(o_acc[0]);
    fence_operands(p_frag[0]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk)
#pragma unroll
      for (int n0 = 0; n0 < D; n0 += kOn) wgmma_rs_m64k16<T, 1>(o_slice(n0), p_frag[0][kk], sV.mn_major(n0, kk), 1);
    wgmma_commit();
  };
  // after P V of block `it` has landed: V's stage back to the producer
  auto pv_landed = [&](int it) {
    fence_operands(o_acc[0]);
    fence_operands(p_frag[0]);
    __syncwarp();
    if (lane == 0) mbar_arrive(sm.v_empty(it % S::kStages));
  };

  if (n > 0) {
    mbar_wait(sm.q_full(), 0);
    float alpha[1][2];
    take_turn();
    issue_s(0);
    pass_turn();
    wgmma_wait<0>();
    (void)scores(0, alpha);  // (O is still 0: nothing to rescale)
    accum_to_a<T, 1, Bc>(p_frag, s);
  }
  // Every block but the last: the next block's S is issued first, its scores computed while
  // this block's P V runs (S's group is the older one: wait_group 1 leaves only P V running).
  // (No branch between the issues and the waits: ptxas then sees which group each wait ends.)
  for (int it = 0; it + 1 < n; ++it) {
    take_turn();
    issue_s(it + 1);
    issue_pv(it);
    pass_turn();
    float alpha[1][2];
    wgmma_wait<1>();
    const bool raised = scores(it + 1, alpha);
    wgmma_wait<0>();
    pv_landed(it);
    rescale_o<1, D>(o_acc, alpha, raised);
    if constexpr (Fold)
      if (outer.slot != nullptr && (it + 1) % kFoldBlocks == 0) outer.fold(o_acc, row_max, row_sum, scale_log2);
    accum_to_a<T, 1, Bc>(p_frag, s);
  }
  if (n > 0) {
    take_turn();
    issue_pv(n - 1);
    pass_turn();
    wgmma_wait<0>();
    pv_landed(n - 1);
  }
  if constexpr (Fold) outer.merge_and_release(kp, o_acc, row_max, row_sum, scale_log2);
  if constexpr ((Feats & kFeatMaxLogit) != 0)
    if (kp.f.max_logit != nullptr) record_max_logit<1>(kp, w.batch, w.head, w.r0 + warp_row0, w.r1, row_max);
  if constexpr ((Feats & kFeatSinks) != 0)
    if (kp.f.sinks != nullptr) join_sink<1, D>(kp, mask, w.head, w.r0 + warp_row0, o_acc, row_max, row_sum);
  const auto o = sequence_ref(p.o, p.o_st, p.q_seq, w.batch);
  store_o_lse<T, 1, D, Mods>(kp, w.batch, w.head, w.r0 + warp_row0, w.r1, int(p.d_v), o, o_acc, row_max, row_sum);
}

template <class T, int D, WsSchedule Schedule, bool Fold = false, int Feats = 0>
__global__ void __launch_bounds__(ws_forward_tile(D).threads, 1)
    ws_forward_kernel(const __grid_constant__ WsForwardParams prm) {
#if SA_WGMMA
  constexpr WsForwardTile kTile = ws_forward_tile(D);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // the 128-byte swizzle is a function of the address: tiles start 1024-byte aligned
  const WsForwardSmem<D> sm{reinterpret_cast<uint16_t*>(smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u))};
  const QueryBlockWork w = query_block_work<kTile.br, kTile.bc>(prm.kp);
  if (w.empty) return;  // (every thread of the CTA, before any barrier)

  if (threadIdx.x == 0) {
    mbar_init(sm.q_full(), 1);
    for (int s = 0; s < kTile.stages; ++s) {
      mbar_init(sm.k_full(s), 1);
      mbar_init(sm.v_full(s), 1);
      mbar_init(sm.k_empty(s), 4 * kTile.consumers);  // one arrival per consumer warp
      mbar_init(sm.v_empty(s), 4 * kTile.consumers);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int wg = threadIdx.x >> 7;
  if (wg == 0) {
    setmaxnreg_dec<kTile.producer_regs>();
    if (threadIdx.x == 0 && w.n_key_blocks > 0) ws_produce<D>(prm, sm, w);
    return;
  }
  setmaxnreg_inc<kTile.consumer_regs>();
  if constexpr (Schedule == WsSchedule::plain)
    ws_consume<T, D>(prm.kp, sm, w, wg - 1);
  else
    ws_consume_overlapped<T, D, Schedule == WsSchedule::ping_pong, Fold, Feats>(prm.kp, sm, w, wg - 1);
#endif
}

// The kernel table's entry of this forward for (T, D) (dispatch.hpp): `tma` marks it as the
// entry find_kernel never returns (the plan asks for it by name: find_ws_forward). The
// overlapped schedule, which the plan picks past kWsPingPongMaxKeys and for the training
// features, also has the fold instantiation (Variant::fold) and the features' ones, up to
// kFoldKeys keys: every feature (Variant::mods) and each alone (Variant::mods_bias ...,
// common/feature_set.hpp); the others cover up to kFoldKeys keys, no features.
template <class T, int D, WsSchedule Schedule>
KernelEntry ws_forward_entry() {
  constexpr WsForwardTile kTile = ws_forward_tile(D);
  KernelEntry e;
  e.name = Schedule == WsSchedule::plain        ? "sm90a warp-specialized forward"
           : Schedule == WsSchedule::overlapped ? "sm90a warp-specialized overlapped forward"
                                                : "sm90a warp-specialized ping-pong forward";
  e.dtype = dtype_of<T>(), e.arch = Arch::sm90a, e.bucket = D, e.pass = Pass::forward;
  e.threads = kTile.threads, e.smem_bytes = kTile.smem_bytes;
  e.grid = GridShape::query_blocks, e.block_rows = kTile.br, e.warp_rows = 16;
  e.tma = true, e.ws_schedule = Schedule;
  e.guarded = reinterpret_cast<const void*>(&ws_forward_kernel<T, D, Schedule>);
  if constexpr (Schedule == WsSchedule::overlapped) {
    e.fold = reinterpret_cast<const void*>(&ws_forward_kernel<T, D, Schedule, true>);
    e.mods = reinterpret_cast<const void*>(&ws_forward_kernel<T, D, Schedule, false, kFeatAll>);
    // (each feature alone where the bucket has it: ws_forward_single_feature)
    set_single_features<kSingleFeatureCount>(&e, []<int F>() -> const void* {
      if constexpr (ws_forward_single_feature(D, F))
        return reinterpret_cast<const void*>(&ws_forward_kernel<T, D, Schedule, false, F>);
      else
        return nullptr;
    });
  }
  return e;
}

}  // namespace strideattn::cuda_impl
