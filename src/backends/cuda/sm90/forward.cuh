// The forward on sm_90a for the d <= 128 and d <= 256 head-dim buckets: sm80/forward.cuh's
// schedule and math (same online softmax and epilogue, shared with it) with both GEMMs as
// warpgroup MMAs (wgmma.cuh). (The plan picks it, plan.cpp; the d <= 64 bucket keeps the
// mma.sync forward.)
//
// One CTA of 2 warpgroups per (block of 128 queries, head, sequence), heaviest blocks first;
// warpgroup wg owns query rows [64 wg, 64 wg + 64). Per block of Bc keys (128, at d <= 256
// 64; K and V in double-buffered shared-memory stages, as forward_kernel's):
//   S = Q K^T            (A = Q, B = K, both from shared memory)
//   masked -> -inf; online softmax step: S -> P, l, and O rescaled where m is raised
//   O += P V             (A = P from registers, rounded to T; B = V from shared memory)
// Tile shapes and their reasons: common/tiles.hpp, forward_wgmma_tile.
// Feats: the training features compiled in (common/feature_set.hpp; 0: none): the feature
// variant (all of them) as sm80/forward.cuh's Mods, or one alone (common/score_mod.cuh).
#pragma once

#include "backends/cuda/common/dropout.cuh"
#include "backends/cuda/common/epilogue.cuh"
#include "backends/cuda/common/fragment.cuh"
#include "backends/cuda/common/kv_fill.cuh"
#include "backends/cuda/common/mask.cuh"
#include "backends/cuda/common/outer_accumulator.cuh"
#include "backends/cuda/common/query_block.cuh"
#include "backends/cuda/common/score_mod.cuh"
#include "backends/cuda/common/softmax.cuh"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/sm90/wgmma.cuh"

namespace strideattn::cuda_impl {

// KvCache: as sm80/forward.cuh's (a KV-cache call, contiguous or paged cache).
template <class T, int D, bool Fold, int Feats = 0, bool KvCache = false>
__global__ void __launch_bounds__(kKvThreads, 1) forward_wgmma_kernel(const KernelParams kp) {
#if SA_WGMMA
  constexpr bool Mods = Feats != 0;
  constexpr ForwardWgmmaTile kTile = forward_wgmma_tile(D);
  constexpr int Br = kTile.br, Bc = kTile.bc;
  using QTile = Sw128Tile<Br, D>;
  using KvTile = Sw128Tile<Bc, D>;
  static_assert(1024 + (QTile::kElems + 4 * KvTile::kElems) * 2 == kTile.smem_bytes,
                "the shared memory the host grants");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // the 128-byte swizzle is a function of the address: tiles start 1024-byte aligned
  uint16_t* const smem = reinterpret_cast<uint16_t*>(smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u));
  const QTile sQ{smem};
  // Two stages of K and V: stage b at kv_base + b * 2 * kElems (K), + kElems (V).
  uint16_t* const kv_base = sQ.base + QTile::kElems;
  auto sK = [&](int b) { return KvTile{kv_base + b * 2 * KvTile::kElems}; };
  auto sV = [&](int b) { return KvTile{kv_base + b * 2 * KvTile::kElems + KvTile::kElems}; };

  const kernel::AttentionParams& p = kp.p;
  const QueryBlockWork w = query_block_work<Br, Bc, KvCache>(kp);
  if constexpr (KvCache)  // (rows past seqlens_q, or a broken sequence's)
    if (w.fill_end > w.fill_begin) fill_rows<T>(kp, w, w.head, sequence_ref(p.o, p.o_st, p.q_seq, w.batch));
  if (w.empty) return;
  const int64_t batch = w.batch, head = w.head, kv_head = w.kv_head, r0 = w.r0, r1 = w.r1, s_kv = w.s_kv;
  const MaskRule& mask = w.mask;

  const auto q = sequence_ref(p.q, p.q_st, p.q_seq, batch);
  const auto k = kv_rows<KvCache>(kp, p.k, p.k_st, batch, kMissingK),
             v = kv_rows<KvCache>(kp, p.v, p.v_st, batch, kMissingV);
  const auto o = sequence_ref(p.o, p.o_st, p.q_seq, batch);
  const int d_qk = int(p.d_qk), d_v = int(p.d_v);  // (smaller dims: zero columns in the tiles)

  const int warp = threadIdx.x >> 5, wg = warp >> 2;
  const int warp_row0 = wg * 64 + (warp & 3) * 16;  // first row of this warp inside the block
  // the softmax's exponent scale: L is already scaled in the feature variant
  const float scale_log2 = Mods ? kLog2e : kp.scale_log2;

  // Keys [c0, c0 + Bc) of K and V into stage `buf` (rows past s_kv zeroed); a paged cache's
  // first table entry read a block ahead (`page`, copy.cuh page_ahead).
  auto load_stage = [&](int64_t c0, int buf, int32_t page) {
    const int rows = int(kernel::min64(Bc, s_kv - c0));
    load_tile<kKvThreads>(sK(buf),
                          with_first_page(rows_of(k, c0, kv_head, rows, d_qk, (kp.aligned & kVecK) != 0), page));
    load_tile<kKvThreads>(sV(buf),
                          with_first_page(rows_of(v, c0, kv_head, rows, d_v, (kp.aligned & kVecV) != 0), page));
  };
  const int64_t first_key = w.first_key;
  const int n_blocks = w.n_key_blocks;
  // the table entry of block `it`'s tile for this thread, read while block it - 1 computes
  auto read_ahead = [&](int it) -> int32_t {
    if constexpr (KvCache) {
      const int64_t c0 = first_key + int64_t(it) * Bc;
      if (it < n_blocks) return page_ahead<kKvThreads, KvTile>(k, c0, int(kernel::min64(Bc, s_kv - c0)));
    }
    return kLookUpPage;
  };

  // This warp's 16 rows of O (the group's m64 x D accumulator), m and l of rows g, g + 8.
  float o_acc[1][D / 8][4];
  zero<1, D>(o_acc);
  float row_max[1][2] = {{-INFINITY, -INFINITY}}, row_sum[1][2] = {{0.f, 0.f}};
  // columns [n0, n0 + 128) of it, as one m64n128 accumulator
  auto o_slice = [&](int n0) -> float(&)[16][4] { return *reinterpret_cast<float(*)[16][4]>(&o_acc[0][n0 / 8]); };

  // Fold: more than kFoldKeys keys, O is summed in blocks of them (outer_accumulator.cuh)
  constexpr int kFoldBlocks = int(kFoldKeys / Bc);
  OuterAccumulator<1, D> outer;
  if constexpr (Fold)
    outer.claim(kp, w.keys.end - w.keys.begin,
                int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) * kKvWarps + warp);

  if (n_blocks > 0) {
    load_tile<kKvThreads>(sQ, rows_of(q, r0, head, int(r1 - r0), d_qk, (kp.aligned & kVecQ) != 0));
    load_stage(first_key, 0, kLookUpPage);
  }
  cp_async_commit();
  int32_t next_page = read_ahead(1);  // (kLookUpPage but in a paged KV-cache call)

  for (int it = 0; it < n_blocks; ++it) {
    const int buf = it & 1;
    const int64_t c0 = first_key + int64_t(it) * Bc;
    // Block `it` has landed (and is visible to the async proxy), and every warpgroup is done
    // with block it - 1 (its wgmmas waited for), whose stage the next load refills.
    cp_async_wait<0>();
    fence_async_shared();
    __syncthreads();
    if (it + 1 < n_blocks) load_stage(c0 + Bc, buf ^ 1, next_page);
    cp_async_commit();
    next_page = read_ahead(it + 2);

    // (the modifiers made per block from the parameters, as in sm80/forward.cuh)
    ScoreMod mod;
    if constexpr (Mods) mod = ScoreMod::of<Feats>(kp, mask, batch, head);

    // S = Q K^T: this group's 64 rows x Bc keys
    float s[1][Bc / 8][4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_m64k16<T, 0, 0>(s[0], sQ.k_major(wg * 64, kk), sK(buf).k_major(0, kk), kk);
    wgmma_commit();
    // dropout: the keep mask, drawn while the GEMM runs
    KeepMask<1, Bc / 8> keep{};
    const bool dropping = (Feats & kFeatDropout) != 0 && kp.f.dropout_scale != 0.f;
    if (dropping) keep = dropout_mask_rows<1, Bc / 8>(kp, batch, head, r0 + warp_row0, c0);
    wgmma_wait<0>();
    fence_operands(s[0]);

    if constexpr (Mods) score_mod<1, Bc>(s, mod, r0 + warp_row0, c0, true);
    // masked entries -> -inf (keys past s_kv too: the rule ends every row at s_kv)
    if (!kernel::tile_fully_visible(mask, r0, r1, c0, c0 + Bc))
      apply_mask<1, Bc>(s, mask, r0 + warp_row0, c0, true, -INFINITY);
    online_softmax_step<1, Bc, D>(s, o_acc, row_max, row_sum, scale_log2);
    if (dropping) apply_keep(s, keep, kp.f.dropout_scale);  // O += (Z P) V, l summed without Z

    // O += P V (P rounded to T, in registers: the accumulator layout is the A layout), in
    // m64n128 column slices of O
    uint32_t p_frag[1][Bc / 16][4];
    accum_to_a<T, 1, Bc>(p_frag, s);
    fence_operands(o_acc[0]);
    fence_operands(p_frag[0]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk)
#pragma unroll
      for (int n0 = 0; n0 < D; n0 += 128)
        wgmma_rs_m64k16<T, 1>(o_slice(n0), p_frag[0][kk], sV(buf).mn_major(n0, kk), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(o_acc[0]);
    if constexpr (Fold)
      if (outer.slot != nullptr && (it + 1) % kFoldBlocks == 0) outer.fold(o_acc, row_max, row_sum, scale_log2);
  }
  if constexpr (Fold) outer.merge_and_release(kp, o_acc, row_max, row_sum, scale_log2);

  if constexpr ((Feats & kFeatMaxLogit) != 0)
    if (kp.f.max_logit != nullptr) record_max_logit<1>(kp, batch, head, r0 + warp_row0, r1, row_max);
  if constexpr ((Feats & kFeatSinks) != 0)
    if (kp.f.sinks != nullptr) join_sink<1, D>(kp, mask, head, r0 + warp_row0, o_acc, row_max, row_sum);
  store_o_lse<T, 1, D, Mods, KvCache>(kp, batch, head, r0 + warp_row0, r1, d_v, o, o_acc, row_max, row_sum);
#endif
}

// The kernel table's entry of this forward for (T, D) (dispatch.hpp).
template <class T, int D>
KernelEntry forward_wgmma_entry() {
  constexpr ForwardWgmmaTile kTile = forward_wgmma_tile(D);
  KernelEntry e;
  e.name = "sm90a wgmma forward";
  e.dtype = dtype_of<T>(), e.arch = Arch::sm90a, e.bucket = D, e.pass = Pass::forward;
  e.threads = kKvThreads, e.smem_bytes = kTile.smem_bytes;
  e.grid = GridShape::query_blocks, e.block_rows = kTile.br, e.warp_rows = 16;
  e.guarded = reinterpret_cast<const void*>(&forward_wgmma_kernel<T, D, false>);
  e.fold = reinterpret_cast<const void*>(&forward_wgmma_kernel<T, D, true>);
  e.mods = reinterpret_cast<const void*>(&forward_wgmma_kernel<T, D, true, kFeatAll>);
  // (each feature alone where the bucket has it: wgmma_forward_single_feature)
  set_single_features<kSingleFeatureCount>(&e, []<int F>() -> const void* {
    if constexpr (wgmma_forward_single_feature(D, F))
      return reinterpret_cast<const void*>(&forward_wgmma_kernel<T, D, true, F>);
    else
      return nullptr;
  });
  e.kv_cache = reinterpret_cast<const void*>(&forward_wgmma_kernel<T, D, false, 0, true>);
  e.kv_cache_fold = reinterpret_cast<const void*>(&forward_wgmma_kernel<T, D, true, 0, true>);
  return e;
}

}  // namespace strideattn::cuda_impl
