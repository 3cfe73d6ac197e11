// Forward kernel (FlashAttention-2 schedule): one CTA per (query block, head, sequence).
//   mainloop:  for each key block the mask leaves visible (key_range_for_rows):
//                S = Q K^T * scale (base 2), masked to -inf outside the rule,
//                online softmax: m_new = max(m, rowmax S), O and l rescaled by 2^(m - m_new);
//                P = 2^(S - m_new); l += rowsum P; O += P V
//   epilogue:  O /= l, LSE = round(m * scale) + log l; rows with no visible key: O = 0, LSE = -inf.
// Scheduler: which query block a CTA owns and the keys its rows see, common/query_block.cuh;
// K and V stream through shared memory in double-buffered stages of `stage` keys
// (common/tiles.hpp): stage n+1 loads with cp.async while the warps walk stage n bc keys at
// a time, so each stage costs one barrier. Every tensor is addressed through its own strides
// (common/tensor_ref.hpp); the mask, the softmax and the epilogue are common/mask.cuh,
// softmax.cuh and epilogue.cuh, which the sm_90a forward calls too.
// FullD: d_qk == d_v == D (the head dims fill the bucket), known at compile time, so the GEMMs
// run every k-step and column tile without the runtime guards that skip a smaller head dim's
// zero padding; those guards are branches between k-steps, across which ptxas does not move
// the next step's ldmatrix above this step's MMAs (bench/cuda-notes.md, step 13).
// Mods: the feature variant (common/score_mod.cuh): S becomes the logit L before the mask,
// the softmax runs on L with scale 1, the sink joins each row's sum at the end and the max
// logit is recorded, and with dropout P times the keep mask Z goes into O += P V (the row
// sums, so the LSE, without it); each feature a runtime switch of kp.f.
#pragma once

#include <cmath>

#include "backends/cuda/common/dropout.cuh"
#include "backends/cuda/common/epilogue.cuh"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/kv_fill.cuh"
#include "backends/cuda/common/mask.cuh"
#include "backends/cuda/common/outer_accumulator.cuh"
#include "backends/cuda/common/query_block.cuh"
#include "backends/cuda/common/score_mod.cuh"
#include "backends/cuda/common/softmax.cuh"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/sm80/mma.cuh"

namespace strideattn::cuda_impl {

template <Arch A, class T, int D, bool FullD, bool Fold, bool Mods, bool KvCache>
__device__ __forceinline__ void forward_mainloop(const KernelParams& kp) {
  constexpr ForwardTile kTile = forward_tile(A, D);
  constexpr int MT = kTile.mt, Br = kTile.br, Bc = kTile.bc, Stage = kTile.stage;
  static_assert(Stage % Bc == 0 && Bc % 8 == 0, "a stage is whole bc windows of 8-row groups");
  using QTile = SmemTile<Br, D>;
  using StageTile = SmemTile<Stage, D>;
  // A bc-key window of a stage: its base moves by a multiple of 8 rows, which keeps every
  // row's swizzle (row % 8), so it is a tile of its own for the warp GEMMs.
  using KvTile = SmemTile<Bc, D>;
  static_assert((QTile::kElems + 4 * StageTile::kElems) * 2 == kTile.smem_bytes, "the shared memory the host grants");
  extern __shared__ __align__(128) unsigned char smem[];
  const QTile sQ{reinterpret_cast<uint16_t*>(smem)};
  // Two stages of K and V: stage b at kv_base + b * 2 * kElems (K), + kElems (V).
  uint16_t* const kv_base = sQ.base + QTile::kElems;
  auto sK = [&](int b) { return StageTile{kv_base + b * 2 * StageTile::kElems}; };
  auto sV = [&](int b) { return StageTile{kv_base + b * 2 * StageTile::kElems + StageTile::kElems}; };

  const kernel::AttentionParams& p = kp.p;
  const QueryBlockWork w = query_block_work<Br, Stage, KvCache>(kp);
  if constexpr (KvCache)  // (rows past seqlens_q, or a broken sequence's)
    if (w.fill_end > w.fill_begin) fill_rows<T>(kp, w, w.head, sequence_ref(p.o, p.o_st, p.q_seq, w.batch));
  if (w.empty) return;
  const int64_t batch = w.batch, head = w.head, kv_head = w.kv_head, r0 = w.r0, r1 = w.r1, s_kv = w.s_kv;
  const MaskRule& mask = w.mask;
  const TileRange& keys = w.keys;

  const auto q = sequence_ref(p.q, p.q_st, p.q_seq, batch);
  const auto k = kv_rows<KvCache>(kp, p.k, p.k_st, batch, kMissingK),
             v = kv_rows<KvCache>(kp, p.v, p.v_st, batch, kMissingV);
  const auto o = sequence_ref(p.o, p.o_st, p.q_seq, batch);
  constexpr bool kFull = FullD && unguarded_full_d(A, D);
  const int d_qk = kFull ? D : int(p.d_qk), d_v = kFull ? D : int(p.d_v);

  const int warp = threadIdx.x >> 5;
  const int warp_row0 = warp * 16 * MT;  // first row of this warp inside the tile
  // the softmax's exponent scale: L is already scaled in the feature variant
  const float scale_log2 = Mods ? kLog2e : kp.scale_log2;

  // Stage loads: keys [c0, c0 + Stage) of K and V into buffer `buf` (rows past s_kv zeroed);
  // a paged cache's first table entry read a stage ahead (`page`, copy.cuh page_ahead).
  auto load_stage = [&](int64_t c0, int buf, int32_t page) {
    const int rows = int(kernel::min64(Stage, s_kv - c0));
    load_tile<kThreads>(sK(buf), with_first_page(rows_of(k, c0, kv_head, rows, d_qk, (kp.aligned & kVecK) != 0), page));
    load_tile<kThreads>(sV(buf), with_first_page(rows_of(v, c0, kv_head, rows, d_v, (kp.aligned & kVecV) != 0), page));
  };

  const int64_t first_key = w.first_key;
  const int n_stages = w.n_key_blocks;
  // the table entry of stage `it`'s tile for this thread, read while stage it - 1 computes
  auto read_ahead = [&](int it) -> int32_t {
    if constexpr (KvCache) {
      const int64_t c0 = first_key + int64_t(it) * Stage;
      if (it < n_stages) return page_ahead<kThreads, StageTile>(k, c0, int(kernel::min64(Stage, s_kv - c0)));
    }
    return kLookUpPage;
  };

  float o_acc[MT][D / 8][4];
  zero<MT, D>(o_acc);
  float row_max[MT][2], row_sum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) row_max[mt][h] = -INFINITY, row_sum[mt][h] = 0.f;

  // Fold: more than kFoldKeys keys, O is summed in blocks of them (outer_accumulator.cuh)
  constexpr int kFoldBlocks = int(kFoldKeys / Bc);
  OuterAccumulator<MT, D> outer;
  if constexpr (Fold)
    outer.claim(kp, keys.end - keys.begin,
                int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) * kWarps + warp);
  int blocks_done = 0;

  if (n_stages > 0) {
    load_tile<kThreads>(sQ, rows_of(q, r0, head, int(r1 - r0), d_qk, (kp.aligned & kVecQ) != 0));
    load_stage(first_key, 0, kLookUpPage);
  }
  cp_async_commit();
  int32_t next_page = read_ahead(1);  // (kLookUpPage but in a paged KV-cache call)

  for (int it = 0; it < n_stages; ++it) {
    const int buf = it & 1;
    const int64_t stage_c0 = first_key + int64_t(it) * Stage;
    // Stage `it` has landed and every warp is done with stage it - 1, whose buffer the next
    // load refills while this stage computes.
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < n_stages) load_stage(stage_c0 + Stage, buf ^ 1, next_page);
    cp_async_commit();
    next_page = read_ahead(it + 2);

#pragma unroll 1
    for (int sub = 0; sub < Stage / Bc; ++sub) {
      const int64_t c0 = stage_c0 + sub * Bc;
      if (c0 >= keys.end) break;            // the rest of the stage is masked for every row
      if (c0 + Bc <= keys.begin) continue;  // (sliding window) nothing visible yet
      const KvTile sKb{sK(buf).base + sub * Bc * D}, sVb{sV(buf).base + sub * Bc * D};

      // S = Q K^T
      float s[MT][Bc / 8][4];
      zero<MT, Bc>(s);
      gemm_nt<T, MT, Bc, D>(s, sQ, warp_row0, sKb, 0, d_qk);

      // (the modifiers made per block from the parameters rather than held across the loop)
      if constexpr (Mods) score_mod<MT, Bc>(s, ScoreMod::of(kp, mask, batch, head), r0 + warp_row0, c0, true);
      // masked entries of S -> -inf (the scale is applied inside the exponent below; the
      // validation guarantees scale > 0, so the max of S is the max of scale * S)
      if (!kernel::tile_fully_visible(mask, r0, r1, c0, c0 + Bc))
        apply_mask<MT, Bc>(s, mask, r0 + warp_row0, c0, true, -INFINITY);

      online_softmax_step<MT, Bc, D>(s, o_acc, row_max, row_sum, scale_log2);
      // dropout: O += (Z P) V, l summed without it
      if constexpr (Mods)
        if (kp.f.dropout_scale != 0.f) dropout_rows<MT, Bc / 8>(s, kp, batch, head, r0 + warp_row0, c0);

      // O += P V
      uint32_t p_frag[MT][Bc / 16][4];
      accum_to_a<T, MT, Bc>(p_frag, s);
      gemm_rn<T, MT, Bc, D, kTile.prefetch_pv>(o_acc, p_frag, sVb, 0, d_v);
      if constexpr (Fold)
        if (outer.slot != nullptr && ++blocks_done % kFoldBlocks == 0) outer.fold(o_acc, row_max, row_sum, scale_log2);
    }
  }
  if constexpr (Fold) outer.merge_and_release(kp, o_acc, row_max, row_sum, scale_log2);

  if constexpr (Mods) {
    if (kp.f.max_logit != nullptr) record_max_logit<MT>(kp, batch, head, r0 + warp_row0, r1, row_max);
    if (kp.f.sinks != nullptr) join_sink<MT, D>(kp, mask, head, r0 + warp_row0, o_acc, row_max, row_sum);
  }
  // epilogue: O /= l; LSE
  store_o_lse<T, MT, D, Mods, KvCache>(kp, batch, head, r0 + warp_row0, r1, d_v, o, o_acc, row_max, row_sum);
}

// KvCache: a KV-cache call (KernelParams::kv): lengths from device memory, K and V rows
// through the cache, contiguous or paged (common/kv_fill.cuh); the other instantiations
// compile none of it.
template <Arch A, class T, int D, bool FullD, bool Fold, bool Mods = false, bool KvCache = false>
__global__ void __launch_bounds__(kThreads) forward_kernel(const KernelParams kp) {
  if constexpr (builds_body<A>) forward_mainloop<A, T, D, FullD, Fold, Mods, KvCache>(kp);
}

// The kernel table's entry of this forward for (A, T, D) (dispatch.hpp). Long key ranges run
// the guarded instantiation with the outer accumulator (its registers would make the
// unguarded one spill); where unguarded_full_d is false a FullD instantiation would compile
// the guarded code again: there is none, the guarded one runs.
template <Arch A, class T, int D>
KernelEntry forward_entry() {
  constexpr ForwardTile kTile = forward_tile(A, D);
  KernelEntry e;
  e.name = A == Arch::sm80 ? "sm80 mma.sync forward" : "sm90a mma.sync forward";
  e.dtype = dtype_of<T>(), e.arch = A, e.bucket = D, e.pass = Pass::forward;
  e.threads = kThreads, e.smem_bytes = kTile.smem_bytes;
  e.grid = GridShape::query_blocks, e.block_rows = kTile.br, e.warp_rows = 16 * kTile.mt;
  e.guarded = reinterpret_cast<const void*>(&forward_kernel<A, T, D, false, false>);
  if constexpr (unguarded_full_d(A, D)) e.full_d = reinterpret_cast<const void*>(&forward_kernel<A, T, D, true, false>);
  e.fold = reinterpret_cast<const void*>(&forward_kernel<A, T, D, false, true>);
  // the feature variant: guarded, with the fold (which runs only where the plan gives slots)
  e.mods = reinterpret_cast<const void*>(&forward_kernel<A, T, D, false, true, true>);
  // KV-cache calls: guarded, without and with the fold (the fold's registers would make the
  // first spill, and only caches of more than kFoldKeys tokens need it)
  e.kv_cache = reinterpret_cast<const void*>(&forward_kernel<A, T, D, false, false, false, true>);
  e.kv_cache_fold = reinterpret_cast<const void*>(&forward_kernel<A, T, D, false, true, false, true>);
  return e;
}

}  // namespace strideattn::cuda_impl
