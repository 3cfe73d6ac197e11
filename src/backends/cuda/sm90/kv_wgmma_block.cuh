// The per-query-block math of the sm_90a dK/dV pass, written once for the two kernels that
// run it: backward_wgmma_kernel (sm90/backward.cuh: both warpgroups load and compute,
// __syncthreads between) and the warp-specialized ws_backward_kernel (sm90/ws_backward.cuh: a
// TMA producer warpgroup feeds two consumer warpgroups, which synchronise on a named barrier
// of their 256 threads). Each calls kv_wgmma_block once per query block with the block's Q,
// dO, LSE and delta in shared memory and its own barrier over the 256 computing threads
// (`sync_block`). The steps, their layout over the warpgroups and the reasons are
// backward.cuh's header.
#pragma once

#include "backends/cuda/common/dropout.cuh"
#include "backends/cuda/common/epilogue.cuh"
#include "backends/cuda/common/fragment.cuh"
#include "backends/cuda/common/kv_pass.cuh"
#include "backends/cuda/common/mask.cuh"
#include "backends/cuda/common/score_mod.cuh"
#include "backends/cuda/common/softmax.cuh"
#include "backends/cuda/sm90/wgmma.cuh"

namespace strideattn::cuda_impl {

// Where one of the 256 computing threads (`tid`: 0..255) works in a block of the pass
// (unsigned, as threadIdx.x: with int indices ptxas allocated the wgmma pass differently).
template <int D>
struct KvWgmmaLane {
  static constexpr KvWgmmaTile kTile = kv_wgmma_tile(D);
  int warp, t, g, wg;
  // this group's first key row, query column (of S^T, P^T) and dK / dV column in the block
  int g_key0, g_q0, g_d0;
  int key0;  // this warp's first key row in the block
  // this group's share of dQ = dS K: queries dq_q0.. (64 of them), columns dq_d0.. (DQ)
  int dq_q0, dq_d0;
  __device__ __forceinline__ explicit KvWgmmaLane(unsigned tid) {
    warp = int(tid >> 5), t = int(tid & 3), g = int((tid & 31) >> 2);
    wg = warp >> 2;
    g_key0 = kTile.groups_split_keys ? wg * kTile.key_rows_per_group : 0;
    g_q0 = kTile.groups_split_keys ? 0 : wg * kTile.group_queries;
    g_d0 = kTile.groups_split_keys ? 0 : wg * kTile.group_cols;
    key0 = g_key0 + (warp & 3) * 16;
    dq_q0 = kTile.dq_splits_queries ? wg * 64 : 0;
    dq_d0 = kTile.dq_splits_queries ? 0 : wg * kTile.dq_cols;
  }
};

// Query block b of GQA head h (KvBlockWork's iteration (h, b)) against the CTA's keys: S^T,
// dP^T, P^T, dS^T (to shared memory, then `sync_block()`), dV and dK added into this warp's
// accumulators, dS K added into kp.dq_accum (when set), the fold (Fold). Feats: the training
// features compiled in (common/feature_set.hpp; 0 for none). Every wgmma of the
// block has completed on return (Q, dO, LSE, delta, P^T and dS^T may be rewritten after the
// next barrier over the 256 threads). d_qk: kp.p.d_qk, which the caller holds.
template <class T, int D, bool Fold, int Feats, class KvTile, class PTile, class QTile, class SyncBlock>
__device__ __forceinline__ void kv_wgmma_block(const KernelParams& kp, const KvBlockWork& w, const KvWgmmaLane<D>& ln,
                                               const KvTile& sK, const KvTile& sV, const PTile& sP, const PTile& sDS,
                                               const QTile& q, const QTile& d_o, const float* block_lse,
                                               const float* block_delta, int h, int b, int d_qk,
                                               float (&dk)[1][kv_wgmma_tile(D).group_cols / 8][4],
                                               float (&dv)[1][kv_wgmma_tile(D).group_cols / 8][4], int& fold_left,
                                               SyncBlock&& sync_block) {
  constexpr KvWgmmaTile kTile = kv_wgmma_tile(D);
  constexpr int Bc = kTile.bc, Br = kTile.br, DQ = kTile.dq_cols, DQC = DQ < 64 ? DQ : 64;
  constexpr int GQ = kTile.group_queries, GD = kTile.group_cols;
  const int warp = ln.warp, t = ln.t, g = ln.g;
  const int g_key0 = ln.g_key0, g_q0 = ln.g_q0, g_d0 = ln.g_d0, key0 = ln.key0, dq_q0 = ln.dq_q0, dq_d0 = ln.dq_d0;
  const int64_t r0 = int64_t(w.first_qblock + b) * Br;
  const int64_t r1 = kernel::min64(r0 + Br, w.s_q);

  // ---- S^T = K Q^T and dP^T = V dO^T: this group's 64 keys x GQ queries
  float st[1][GQ / 8][4], dpt[1][GQ / 8][4];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) wgmma_m64k16<T, 0, 0>(st[0], sK.k_major(g_key0, kk), q.k_major(g_q0, kk), kk);
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) wgmma_m64k16<T, 0, 0>(dpt[0], sV.k_major(g_key0, kk), d_o.k_major(g_q0, kk), kk);
  wgmma_commit();
  // dropout: the keep mask, drawn while both GEMMs run
  KeepMask<1, GQ / 8> keep{};
  constexpr bool Mods = Feats != 0;
  const bool dropping = (Feats & kFeatDropout) != 0 && kp.f.dropout_scale != 0.f;
  if (dropping) keep = dropout_mask_cols<1, GQ / 8>(kp, w.batch, w.head(h), w.c0 + key0, r0 + g_q0);

  // P^T = exp(round(S^T * scale) - LSE), masked -> -0 (while dP^T is still running)
  wgmma_wait<1>();
  fence_operands(st[0]);
  const float* lse = block_lse + g_q0;
  const float* delta = block_delta + g_q0;
  ScoreMod mod;
  if constexpr (Mods) {
    mod = ScoreMod::of<Feats>(kp, w.mask, w.batch, w.head(h));
    score_mod<1, GQ>(st, mod, w.c0 + key0, r0 + g_q0, false);
  }
  recompute_p_cols(st, lse, Mods ? 1.f : kp.p.scale);
  // (keys past s_kv in a partial block too: K is zero there, S^T = 0, and dQ multiplies
  // dS by those zero rows, so P^T must be 0)
  if (r0 < w.unmasked.begin || r1 > w.unmasked.end) mask_key_rows(st[0], w.mask, w.c0 + key0, r0 + g_q0);
  if (dropping) {  // dV takes (Z P)^T; dS^T takes P^T itself
    float zpt[1][GQ / 8][4];
    keep_copy(zpt, st, keep, kp.f.dropout_scale);
    store_accum<T, 1, GQ>(sP, key0, g_q0, zpt);
  } else {
    store_accum<T, 1, GQ>(sP, key0, g_q0, st);
  }

  // dS^T = P^T (dP^T - delta)
  wgmma_wait<0>();
  fence_operands(dpt[0]);
  if (dropping) apply_keep(dpt, keep, kp.f.dropout_scale);  // dS^T = P^T (Z dP^T - delta)
  ds_cols(dpt, st, delta);
  if constexpr (Mods)
    if (mod.cap > 0.f || mod.writes_dbias()) score_grad_cols(dpt, st, lse, mod, w.c0 + key0, r0 + g_q0);
  store_accum<T, 1, GQ>(sDS, key0, g_q0, dpt);
  fence_async_shared();
  sync_block();  // P^T and dS^T of the whole block are in shared memory

  // ---- dV += P^T dO, dK += dS^T Q: this group's 64 keys x GD columns, over the Br queries
  wgmma_fence();
  fence_operands(dv[0]);
  fence_operands(dk[0]);
#pragma unroll
  for (int kk = 0; kk < Br / 16; ++kk) wgmma_m64k16<T, 0, 1>(dv[0], sP.k_major(g_key0, kk), d_o.mn_major(g_d0, kk), 1);
#pragma unroll
  for (int kk = 0; kk < Br / 16; ++kk) wgmma_m64k16<T, 0, 1>(dk[0], sDS.k_major(g_key0, kk), q.mn_major(g_d0, kk), 1);
  wgmma_commit();

  // ---- single pass: dq_accum += dS K, this group's 64 queries x DQ columns over all Bc keys,
  // at most 64 columns at a time (at D = 256, 128 dQ floats next to dK and dV spilled)
  if (kp.dq_accum != nullptr) {
#pragma unroll
    for (int chunk = 0; chunk < DQ / DQC; ++chunk) {
      const int c0 = dq_d0 + chunk * DQC;
      float dq[DQC / 8][4];
      wgmma_fence();  // (dq's registers: just read by the atomics, or not yet the wgmma's)
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) wgmma_m64k16<T, 1, 1>(dq, sDS.mn_major(dq_q0, kk), sK.mn_major(c0, kk), kk);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(dq);
      float* const block = kp.dq_accum + delta_index(kp, w.batch, w.head(h), r0) * d_qk;
      const int rows = int(r1 - r0);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = dq_q0 + (warp & 3) * 16 + g + 8 * hh;
        if (row >= rows) continue;
#pragma unroll
        for (int n = 0; n < DQC / 8; ++n) {
          const int col = c0 + n * 8 + 2 * t;
          if (col < d_qk) atomic_add_pair(block + int64_t(row) * d_qk + col, dq[n][2 * hh], dq[n][2 * hh + 1]);
        }
      }
    }
  }
  wgmma_wait<0>();
  fence_operands(dv[0]);
  fence_operands(dk[0]);
  if constexpr (Fold)  // long query ranges: fold dK, dV (kernel_params.hpp)
    if (--fold_left == 0) {
      fold_dk_dv<1, GD>(kp, w.batch, w.kv_head, w.gsplit, w.c0 + key0, w.c1, g_d0, dk, dv);
      fold_left = kp.kv_fold_blocks;
    }
}

}  // namespace strideattn::cuda_impl
