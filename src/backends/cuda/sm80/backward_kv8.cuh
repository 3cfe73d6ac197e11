// The 8-warp dK/dV pass of the backward for the d <= 64 and d <= 128 head-dim buckets
// (FlashAttention-2's layout), which also computes dQ in the single-pass backward.
// The 8-warp kernel is the sm80 kernels' dK/dV pass in those buckets (on sm_90a the wgmma
// kernel of sm90/backward.cuh runs); at d <= 128 on GPUs whose shared memory per block is
// too small for it (sm_86, sm_89) the 4-warp kernel of sm80/backward_kv.cuh runs instead,
// as it does at d <= 256.
//
// One CTA of 256 threads per (128-key block, KV head, sequence[, group split]), looping over
// the query blocks of its share of the GQA group exactly as the 4-warp kernel does (same
// query_range_for_keys, same double-buffered Q / dO / LSE / delta, same outputs: dK and dV
// stored directly, or fp32 partials when kp.dkv_partial is set). Per block of 64 queries
// (tile shapes and their reasons: common/tiles.hpp, kv8_tile):
//   phase 1, warps 4 (keys, 32 each) x 2 (queries, 32 each):
//     S^T = K Q^T;  P^T = exp(round(S^T * scale) - LSE), masked -> -0
//     dP^T = V dO^T;  dS^T = P^T (dP^T - delta)
//     P^T and dS^T, rounded to T, to shared memory [128 keys x 64 queries]
//   barrier
//   phase 2, warps 4 (keys, 32 each) x 2 (head-dim halves, D/2 each):
//     dV += P^T dO;  dK += dS^T Q   (A operands from the shared P^T / dS^T tiles)
//   phase 3, single pass only (kp.dq_accum set), warps 2 (queries) x 4 (head-dim quarters):
//     dq_accum += dS K by fp32 atomics (the two-pass backward's dQ pass does this instead)
// dK and dV are deterministic, no atomics: every dK / dV element sums over the query blocks
// in loop order and over a block's queries in increasing k-steps, in one thread's registers.
// The values and the order are those of the 4-warp kernel, so with the same group splits the
// two give the same bits (the GPU test checks it).
// FullD: d_qk == d_v == D, known at compile time, so no GEMM carries the runtime guards that
// skip a smaller head dim's zero padding (sm80/forward.cuh says why that matters).
// Mods: the feature variant (common/score_mod.cuh): S^T becomes the logit L before P is
// recomputed (with scale 1), dropout's mask Z (common/dropout.cuh) multiplies the P^T
// stored for dV and dP^T before dS^T, and dS^T is scaled by the softcap's derivative.
#pragma once

#include "backends/cuda/common/dropout.cuh"
#include "backends/cuda/common/epilogue.cuh"
#include "backends/cuda/common/kv_pass.cuh"
#include "backends/cuda/common/mask.cuh"
#include "backends/cuda/common/score_mod.cuh"
#include "backends/cuda/common/softmax.cuh"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/sm80/mma.cuh"

namespace strideattn::cuda_impl {

// Phase 3 of the single pass: this warp's 32 queries x D/4 head-dim columns of dS K over the
// CTA's 128 keys (dS^T in `sds`, keys x queries; K in `sk`, keys x head dim), added into
// kp.dq_accum (unscaled; launch_convert_dq applies the scale) for query rows below r1 and
// columns below d_qk. Rows of dS past s_q are 0 (P^T is), keys past s_kv are masked to 0 and
// K is zero there.
template <Arch A, class T, int D, bool FullD, class DsTile, class KTile>
__device__ __forceinline__ void accumulate_dq(const KernelParams& kp, const DsTile& sds, const KTile& sk, int64_t batch,
                                              int64_t head, int64_t r0, int64_t r1) {
  constexpr Kv8Tile kTile = kv8_tile(A, D);
  constexpr int WQ = kTile.dq_warp_q, WD = kTile.dq_warp_d, MT = WQ / 16;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int q0 = (warp % kTile.dq_query_warps) * WQ, d0 = (warp / kTile.dq_query_warps) * WD;
  const int d_qk = FullD ? D : int(kp.p.d_qk);
  if (r0 + q0 >= r1 || d0 >= d_qk) return;
  // dQ_partial = dS K (FullD: all WD columns, which ptxas cannot see in d_qk - d0)
  float dq[MT][WD / 8][4];
  zero<MT, WD>(dq);
  gemm_sn<T, MT, kTile.bc, WD, kTile.prefetch_update, /*TransA=*/true>(dq, sds, q0, sk, d0, FullD ? WD : d_qk - d0);
  // rows r0 .. r0 + 63 of this head are consecutive rows of the accumulator
  float* const block = kp.dq_accum + delta_index(kp, batch, head, r0) * d_qk + d0;
  const int rows = int(r1 - r0);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + mt * 16 + g + 8 * h;
      if (row >= rows) continue;
      float* dst = block + row * d_qk;
#pragma unroll
      for (int n = 0; n < WD / 8; ++n) {
        const int col = n * 8 + 2 * t;
        if (FullD || d0 + col < d_qk) atomic_add_pair(dst + col, dq[mt][n][2 * h], dq[mt][n][2 * h + 1]);
      }
    }
}

template <Arch A, class T, int D, bool FullD, bool Fold, bool Mods>
__device__ __forceinline__ void kv8_mainloop(const KernelParams& kp) {
  static_assert(has_kv8_pass(D), "the 8-warp pass serves the d <= 64 and d <= 128 buckets");
  constexpr Kv8Tile kTile = kv8_tile(A, D);
  constexpr int Bc = kTile.bc, Br = kTile.br, MT = kTile.mt;
  constexpr int WQ = kTile.warp_q, WD = kTile.warp_d;
  static_assert(kTile.key_warps * kTile.side_warps == kKvWarps, "one warp per (key slice, side half)");
  using KvTile = SmemTile<Bc, D>;
  using QTile = SmemTile<Br, D>;
  using PTile = SmemTile<Bc, Br>;  // P^T and dS^T: rows = keys, columns = queries
  static_assert((2 * KvTile::kElems + 2 * PTile::kElems + 4 * QTile::kElems) * 2 + 4 * Br * 4 == kTile.smem_bytes,
                "the shared memory the host grants (KvPassSmem)");
  extern __shared__ __align__(128) unsigned char smem[];
  const KvPassSmem<KvTile, PTile, QTile, Br> sm(reinterpret_cast<uint16_t*>(smem));
  const KvTile &sK = sm.k, &sV = sm.v;
  const PTile &sP = sm.p, &sDS = sm.ds;
  auto sQ = [&](int b) { return sm.q(b); };
  auto sDO = [&](int b) { return sm.d_o(b); };
  float *const sLse = sm.lse, *const sDelta = sm.delta;

  const kernel::AttentionParams& p = kp.p;
  const KvBlockWork w = kv_block_work<Bc, Br>(kp);
  if (w.empty) return;
  const int64_t batch = w.batch, kv_head = w.kv_head, c0 = w.c0, c1 = w.c1, s_q = w.s_q;
  const MaskRule& mask = w.mask;
  const TileRange& unmasked = w.unmasked;
  const int first_qblock = w.first_qblock, n_qblocks = w.n_qblocks, n_iters = w.n_iters;
  const auto q_ref = sequence_ref(p.q, p.q_st, p.q_seq, batch);
  const auto do_ref = sequence_ref(p.d_o, p.do_st, p.q_seq, batch);
  constexpr bool kFull = FullD && unguarded_full_d(A, D);
  const int d_qk = kFull ? D : int(p.d_qk), d_v = kFull ? D : int(p.d_v);

  // Warp i: key slice i / 2 in both phases; its other side is query half i % 2 in phase 1
  // and head-dim half i % 2 in phase 2.
  const int warp = threadIdx.x >> 5;
  const int key0 = (warp >> 1) * 16 * MT;  // first key of this warp inside the block
  const int q0 = (warp & 1) * WQ;          // phase 1: first query of this warp in the block
  const int d0 = (warp & 1) * WD;          // phase 2: first dK / dV column of this warp

  // Iteration (h, b): query head w.head(h), query block first_qblock + b (KvBlockWork).
  auto load_queries = [&](int h, int b, int buf) {
    load_query_block<Br, kKvThreads>(kp, w, q_ref, do_ref, h, b, sQ(buf), sDO(buf), sLse + buf * Br, sDelta + buf * Br,
                                     d_qk, d_v);
  };

  // This warp's 32 keys x D/2 head-dim columns of dK and dV, over the whole loop.
  float dk[MT][WD / 8][4], dv[MT][WD / 8][4];
  zero<MT, WD>(dk);
  zero<MT, WD>(dv);

  // K, V: loaded once (with the first query block, when any query sees these keys).
  if (n_iters > 0) {
    load_key_block<kKvThreads>(kp, w, sK, sV, d_qk, d_v);
    load_queries(0, 0, 0);
  }
  cp_async_commit();

  // (h, b): this iteration's head in the share and query block; (next_h, next_b): the next's
  int h = 0, b = 0;
  int fold_left = kp.kv_fold_blocks;  // Fold: iterations to the next fold
  for (int it = 0; it < n_iters; ++it) {
    const int buf = int(it & 1);
    const bool last_block = b + 1 == n_qblocks;
    const int next_h = last_block ? h + 1 : h, next_b = last_block ? 0 : b + 1;
    // Query block `it` has landed, and every warp is done with block it - 1: with its Q / dO
    // buffer, which the next load refills while this block computes, and with the P^T / dS^T
    // tiles, which this block rewrites.
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < n_iters) load_queries(next_h, next_b, buf ^ 1);
    cp_async_commit();
    const int64_t r0 = int64_t(first_qblock + b) * Br;
    const int64_t r1 = kernel::min64(r0 + Br, s_q);
    const float* lse = sLse + buf * Br + q0;
    const float* delta = sDelta + buf * Br + q0;

    // ---- phase 1: this warp's 32 keys x 32 queries of P^T and dS^T
    // S^T = K Q^T; P^T = exp(round(S^T * scale) - LSE), masked -> -0
    float st[MT][WQ / 8][4];
    zero<MT, WQ>(st);
    gemm_nt<T, MT, WQ, D, kTile.prefetch_scores>(st, sK, key0, sQ(buf), q0, d_qk);
    ScoreMod mod;
    KeepMask<MT, WQ / 8> keep{};  // dropout's (dropping)
    const bool dropping = Mods && kp.f.dropout_scale != 0.f;
    if constexpr (Mods) {
      mod = ScoreMod::of(kp, mask, batch, w.head(h));
      score_mod<MT, WQ>(st, mod, c0 + key0, r0 + q0, false);
      if (dropping) keep = dropout_mask_cols<MT, WQ / 8>(kp, batch, w.head(h), c0 + key0, r0 + q0);
    }
    recompute_p_cols(st, lse, Mods ? 1.f : kp.p.scale);
    // (keys past s_kv in a partial block are masked too: K is zero there, so S^T = 0 and
    // 2^(-LSE) need not be 0, and the single pass multiplies dS by those zero K rows)
    if (r0 < unmasked.begin || r1 > unmasked.end) apply_mask<MT, WQ>(st, mask, c0 + key0, r0 + q0, false, kMaskedP);
    if (dropping) {  // dV takes (Z P)^T; dS^T takes P^T itself
      float zpt[MT][WQ / 8][4];
      keep_copy(zpt, st, keep, kp.f.dropout_scale);
      store_accum<T, MT, WQ>(sP, key0, q0, zpt);
    } else {
      store_accum<T, MT, WQ>(sP, key0, q0, st);
    }

    // dP^T = V dO^T; dS^T = P^T * (dP^T - delta)
    float dpt[MT][WQ / 8][4];
    zero<MT, WQ>(dpt);
    gemm_nt<T, MT, WQ, D, kTile.prefetch_scores>(dpt, sV, key0, sDO(buf), q0, d_v);
    if (dropping) apply_keep(dpt, keep, kp.f.dropout_scale);  // dS^T = P^T (Z dP^T - delta)
    ds_cols(dpt, st, delta);
    if constexpr (Mods)
      if (mod.cap > 0.f || mod.writes_dbias()) score_grad_cols(dpt, st, lse, mod, c0 + key0, r0 + q0);
    store_accum<T, MT, WQ>(sDS, key0, q0, dpt);
    __syncthreads();  // P^T and dS^T of all 64 queries are in shared memory

    // ---- phase 2: this warp's 32 keys x D/2 head-dim columns of dV and dK
    // dV += P^T dO
    // (FullD: all WD columns, which ptxas cannot see in d_v - d0)
    gemm_sn<T, MT, Br, WD, kTile.prefetch_update>(dv, sP, key0, sDO(buf), d0, kFull ? WD : d_v - d0);
    // dK += dS^T Q
    gemm_sn<T, MT, Br, WD, kTile.prefetch_update>(dk, sDS, key0, sQ(buf), d0, kFull ? WD : d_qk - d0);

    // ---- phase 3 (single pass only): dq_accum += dS K for this block's 64 queries, warps
    // 2 (queries, 32 each) x 4 (head-dim quarters, D/4 each); dS^T and K stay in shared
    // memory until the next iteration's barrier.
    if (kp.dq_accum != nullptr) {
      const int64_t head = w.head(h);
      accumulate_dq<A, T, D, kFull>(kp, sDS, sK, batch, head, r0, r1);
    }
    if constexpr (Fold)  // long query ranges: fold dK, dV (kernel_params.hpp)
      if (--fold_left == 0) {
        fold_dk_dv<MT, WD>(kp, batch, kv_head, w.gsplit, c0 + key0, c1, d0, dk, dv);
        fold_left = kp.kv_fold_blocks;
      }
    h = next_h, b = next_b;
  }
  // epilogue: this warp's rows of the CTA's valid keys, its half of the head dim (the
  // feature variant folds only where the plan says so)
  if (!Mods || kp.kv_fold_blocks > 0)
    store_dk_dv<T, MT, WD, Fold>(kp, batch, kv_head, w.gsplit, c0 + key0, c1, d0, dk, dv);
  else
    store_dk_dv<T, MT, WD, false>(kp, batch, kv_head, w.gsplit, c0 + key0, c1, d0, dk, dv);
}

template <Arch A, class T, int D, bool FullD, bool Fold, bool Mods = false>
__global__ void __launch_bounds__(kKvThreads, 1) backward_kv8_kernel(const KernelParams kp) {
  if constexpr (builds_body<A>) kv8_mainloop<A, T, D, FullD, Fold, Mods>(kp);
}

// The kernel table's entry of this pass for (A, T, D) (dispatch.hpp). Where unguarded_full_d
// is false a FullD instantiation would compile the guarded code again: there is none, the
// guarded one runs.
template <Arch A, class T, int D>
KernelEntry kv8_entry() {
  constexpr Kv8Tile kTile = kv8_tile(A, D);
  KernelEntry e;
  e.name = "sm80 8-warp dK/dV pass";
  e.dtype = dtype_of<T>(), e.arch = A, e.bucket = D, e.pass = Pass::dkdv;
  e.threads = kKvThreads, e.smem_bytes = kTile.smem_bytes;
  e.grid = GridShape::key_blocks, e.block_rows = kTile.bc, e.loop_rows = kTile.br;
  e.adds_dq = true, e.split_target = kTile.split_target;
  e.guarded = reinterpret_cast<const void*>(&backward_kv8_kernel<A, T, D, false, false>);
  if constexpr (unguarded_full_d(A, D))
    e.full_d = reinterpret_cast<const void*>(&backward_kv8_kernel<A, T, D, true, false>);
  e.fold = reinterpret_cast<const void*>(&backward_kv8_kernel<A, T, D, false, true>);
  e.mods = reinterpret_cast<const void*>(&backward_kv8_kernel<A, T, D, false, true, true>);
  return e;
}

}  // namespace strideattn::cuda_impl
