// The dK/dV pass of the backward on sm_90a for every head-dim bucket: the loop of the 8-warp
// pass of sm80/backward_kv8.cuh (over the query blocks and GQA heads; same outputs, same
// single-pass dQ accumulator) with every GEMM a warpgroup MMA (wgmma.cuh) reading both
// operands from shared memory. Tile shapes and their reasons: common/tiles.hpp,
// kv_wgmma_tile.
//
// One CTA of 2 warpgroups per (Bc-key block, KV head, sequence[, group split]). d <= 128:
// Bc 128, warpgroup wg owns keys [64 wg, 64 wg + 64) and all queries of the block in S^T /
// dP^T, all D columns in dK / dV; d <= 256: Bc 64, both groups own the 64 keys, group wg
// the queries [32 wg, 32 wg + 32) in S^T / dP^T and the columns [128 wg, 128 wg + 128) in
// dK / dV. Per block of Br queries (128 at D = 64, else 64):
//   S^T = K Q^T, dP^T = V dO^T                  (each group: its keys x its queries)
//   P^T = exp(round(S^T * scale) - LSE), masked -> -0;  dS^T = P^T (dP^T - delta)
//   P^T, dS^T rounded to T -> shared memory [Bc keys x Br queries];  barrier
//   dV += P^T dO, dK += dS^T Q                  (each group: its keys x its columns)
//   single pass (kp.dq_accum): dq_accum += dS K (each group: 64 queries x all D columns at
//   Br 128, all 64 queries x D/2 columns at Br 64, over all Bc keys), by fp32 atomics
// dK and dV sum over the query blocks in loop order in one thread's registers (deterministic);
// the products inside a wgmma sum in the hardware's order, so the bytes differ from the
// mma.sync kernels' (both pass the fp64 reference; the GPU tests run both).
// Shared-memory operands written by cp.async or st.shared are made visible to the wgmma
// (async proxy) by fence.proxy.async before the barrier that publishes them. The per-block
// steps live in sm90/kv_wgmma_block.cuh, which the warp-specialized pass calls too.
// Feats: the training features compiled in (common/feature_set.hpp: all of them, the
// feature variant Variant::mods, or one alone; 0: none; common/score_mod.cuh): S^T becomes
// the logit L before P is
// recomputed (with scale 1), dropout's mask Z (common/dropout.cuh) multiplies the P^T
// stored for dV and dP^T before dS^T, and dS^T is scaled by the softcap's derivative.
#pragma once

#include "backends/cuda/common/kv_pass.cuh"
#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/sm90/kv_wgmma_block.cuh"
#include "backends/cuda/sm90/wgmma.cuh"

namespace strideattn::cuda_impl {

template <class T, int D, bool Fold, int Feats = 0>
__global__ void __launch_bounds__(kKvThreads, 1) backward_wgmma_kernel(const KernelParams kp) {
#if SA_WGMMA
  constexpr bool Mods = Feats != 0;
  constexpr KvWgmmaTile kTile = kv_wgmma_tile(D);
  constexpr int Bc = kTile.bc, Br = kTile.br, GD = kTile.group_cols;
  using KvTile = Sw128Tile<Bc, D>;
  using QTile = Sw128Tile<Br, D>;
  using PTile = Sw128Tile<Bc, Br>;  // P^T and dS^T: rows = keys, columns = queries
  static_assert(
      1024 + (2 * KvTile::kElems + 2 * PTile::kElems + 4 * QTile::kElems) * 2 + 4 * Br * 4 == kTile.smem_bytes,
      "the shared memory the host grants (KvPassSmem and 1 KiB to align)");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // the 128-byte swizzle is a function of the address: tiles start 1024-byte aligned
  uint16_t* const smem = reinterpret_cast<uint16_t*>(smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u));
  const KvPassSmem<KvTile, PTile, QTile, Br> sm(smem);
  const KvTile &sK = sm.k, &sV = sm.v;
  const PTile &sP = sm.p, &sDS = sm.ds;
  auto sQ = [&](int b) { return sm.q(b); };
  auto sDO = [&](int b) { return sm.d_o(b); };
  float *const sLse = sm.lse, *const sDelta = sm.delta;

  const kernel::AttentionParams& p = kp.p;
  const KvBlockWork w = kv_block_work<Bc, Br>(kp);
  if (w.empty) return;
  const int n_iters = w.n_iters;
  const auto q_ref = sequence_ref(p.q, p.q_st, p.q_seq, w.batch);
  const auto do_ref = sequence_ref(p.d_o, p.do_st, p.q_seq, w.batch);
  const int d_qk = int(p.d_qk), d_v = int(p.d_v);

  const KvWgmmaLane<D> ln(threadIdx.x);

  // Iteration (h, b): query head w.head(h), query block w.first_qblock + b (KvBlockWork).
  auto load_queries = [&](int h, int b, int buf) {
    load_query_block<Br, kKvThreads>(kp, w, q_ref, do_ref, h, b, sQ(buf), sDO(buf), sLse + buf * Br, sDelta + buf * Br,
                                     d_qk, d_v);
  };

  // This warp's 16 keys x GD columns of dK and dV (the group's m64 x GD accumulators).
  float dk[1][GD / 8][4], dv[1][GD / 8][4];
  zero<1, GD>(dk);
  zero<1, GD>(dv);

  if (n_iters > 0) {
    load_key_block<kKvThreads>(kp, w, sK, sV, d_qk, d_v);
    load_queries(0, 0, 0);
  }
  cp_async_commit();

  int h = 0, b = 0;
  int fold_left = kp.kv_fold_blocks;  // Fold: iterations to the next fold
  for (int it = 0; it < n_iters; ++it) {
    const int buf = int(it & 1);
    const bool last_block = b + 1 == w.n_qblocks;
    const int next_h = last_block ? h + 1 : h, next_b = last_block ? 0 : b + 1;
    // Query block `it` has landed (and is visible to the async proxy); every warpgroup is
    // done with block it - 1 (its wgmmas waited for), so the other buffer and P^T / dS^T
    // may be rewritten.
    cp_async_wait<0>();
    fence_async_shared();
    __syncthreads();
    if (it + 1 < n_iters) load_queries(next_h, next_b, buf ^ 1);
    cp_async_commit();
    kv_wgmma_block<T, D, Fold, Feats>(kp, w, ln, sK, sV, sP, sDS, sQ(buf), sDO(buf), sLse + buf * Br, sDelta + buf * Br,
                                      h, b, d_qk, dk, dv, fold_left, [] { __syncthreads(); });
    h = next_h, b = next_b;
  }

  // epilogue: this warp's 16 keys (those below c1), the group's GD columns (the feature
  // variant folds only where the plan says so)
  if (!Mods || kp.kv_fold_blocks > 0)
    store_dk_dv<T, 1, GD, Fold>(kp, w.batch, w.kv_head, w.gsplit, w.c0 + ln.key0, w.c1, ln.g_d0, dk, dv);
  else
    store_dk_dv<T, 1, GD, false>(kp, w.batch, w.kv_head, w.gsplit, w.c0 + ln.key0, w.c1, ln.g_d0, dk, dv);
#endif
}

// The kernel table's entry of this pass for (T, D) (dispatch.hpp).
template <class T, int D>
KernelEntry kv_wgmma_entry() {
  constexpr KvWgmmaTile kTile = kv_wgmma_tile(D);
  KernelEntry e;
  e.name = "sm90a wgmma dK/dV pass";
  e.dtype = dtype_of<T>(), e.arch = Arch::sm90a, e.bucket = D, e.pass = Pass::dkdv;
  e.threads = kKvThreads, e.smem_bytes = kTile.smem_bytes;
  e.grid = GridShape::key_blocks, e.block_rows = kTile.bc, e.loop_rows = kTile.br;
  e.adds_dq = true, e.split_target = kTile.split_target;
  e.guarded = reinterpret_cast<const void*>(&backward_wgmma_kernel<T, D, false>);
  e.fold = reinterpret_cast<const void*>(&backward_wgmma_kernel<T, D, true>);
  e.mods = reinterpret_cast<const void*>(&backward_wgmma_kernel<T, D, true, kFeatAll>);
  set_single_features<kScoreFeatureCount>(
      &e, []<int F>() { return reinterpret_cast<const void*>(&backward_wgmma_kernel<T, D, true, F>); });
  return e;
}

}  // namespace strideattn::cuda_impl
