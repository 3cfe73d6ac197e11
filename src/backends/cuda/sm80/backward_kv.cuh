// The 4-warp dK/dV pass of the sm80 kernels (FlashAttention-2 recomputation): the d <= 256
// bucket's, and the d <= 128 bucket's on GPUs whose shared memory per block is too small for
// the 8-warp pass (sm_86, sm_89; sm80/backward_kv8.cuh). Same math and same dK/dV sums as
// the 8-warp pass, no atomics: it runs the two-pass backward (the delta pre-pass,
// common/aux_kernels.cu, before it; the dQ pass, sm80/backward_q.cuh, after it).
//   One CTA per (key block, KV head, sequence[, head-dim split][, group split]); dK and dV
//   stay in fp32 registers while the CTA loops over the query blocks of every query head of
//   its share of the GQA group that see its keys (query_range_for_keys). With one group
//   split it stores dK/dV; with several (MQA/GQA with few KV heads, to fill the GPU) each
//   writes fp32 partials that aux_kernels.cu sums in split order:
//     S^T = K Q^T, P^T = exp(round(S^T * scale) - LSE) (masked -> -0)
//     dV += P^T dO;  dP^T = V dO^T;  dS^T = P^T * (dP^T - delta);  dK += dS^T Q
// Deterministic: every sum runs in a fixed order in one thread's registers.
// Mods: the feature variant (common/score_mod.cuh): S^T becomes the logit L before P is
// recomputed (with scale 1), dropout's mask Z (common/dropout.cuh) multiplies P^T for dV
// and dP^T before dS^T, and dS^T is scaled by the softcap's derivative.
#pragma once

#include "backends/cuda/common/dropout.cuh"
#include "backends/cuda/common/epilogue.cuh"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/kv_pass.cuh"
#include "backends/cuda/common/mask.cuh"
#include "backends/cuda/common/score_mod.cuh"
#include "backends/cuda/common/softmax.cuh"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/sm80/mma.cuh"

namespace strideattn::cuda_impl {

template <Arch A, class T, int D, bool Fold, bool Mods>
__device__ __forceinline__ void kv_pass_mainloop(const KernelParams& kp) {
  constexpr KvPassTile kTile = kv_tile(A, D);
  constexpr int MT = kTile.mt, Bc = kTile.bc, Br = kTile.br, DAcc = kTile.d_acc;
  static_assert(Bc == kWarps * 16 * MT, "one warp per 16*MT keys");
  using KvTile = SmemTile<Bc, D>;
  using QTile = SmemTile<Br, D>;
  static_assert((2 * KvTile::kElems + 4 * QTile::kElems) * 2 + 4 * Br * 4 == kTile.smem_bytes,
                "the shared memory the host grants");
  extern __shared__ __align__(128) unsigned char smem[];
  const KvTile sK{reinterpret_cast<uint16_t*>(smem)};
  const KvTile sV{sK.base + KvTile::kElems};
  // Two stages of Q and dO: stage b at q_base + b * 2 * kElems (Q), + kElems (dO).
  uint16_t* const q_base = sV.base + KvTile::kElems;
  auto sQ = [&](int b) { return QTile{q_base + b * 2 * QTile::kElems}; };
  auto sDO = [&](int b) { return QTile{q_base + b * 2 * QTile::kElems + QTile::kElems}; };
  float* const sLse = reinterpret_cast<float*>(q_base + 4 * QTile::kElems);  // [2][Br], natural log
  float* const sDelta = sLse + 2 * Br;                                       // [2][Br]

  const kernel::AttentionParams& p = kp.p;
  const KvBlockWork w = kv_block_work<Bc, Br, kTile.dim_splits>(kp);
  if (w.empty) return;
  const int col0 = w.dim_split * DAcc;  // head-dim columns of dK / dV this CTA owns
  const auto q_ref = sequence_ref(p.q, p.q_st, p.q_seq, w.batch);
  const auto do_ref = sequence_ref(p.d_o, p.do_st, p.q_seq, w.batch);
  const int d_qk = int(p.d_qk), d_v = int(p.d_v);

  const int warp = threadIdx.x >> 5;
  const int warp_row0 = warp * 16 * MT;

  // Iteration `it` covers query head w.head(it / n_qblocks), query block first_qblock +
  // it % n_qblocks (KvBlockWork). (32-bit division: the running (h, b) pair of the 8-warp
  // pass made ptxas spill 44 bytes here on sm_80 at d = 128.)
  auto load_queries = [&](int it, int buf) {
    load_query_block<Br, kThreads>(kp, w, q_ref, do_ref, it / w.n_qblocks, it % w.n_qblocks, sQ(buf), sDO(buf),
                                   sLse + buf * Br, sDelta + buf * Br, d_qk, d_v);
  };

  float dk[MT][DAcc / 8][4], dv[MT][DAcc / 8][4];
  zero<MT, DAcc>(dk);
  zero<MT, DAcc>(dv);

  // K, V: loaded once (with the first query block, when any query sees these keys).
  if (w.n_iters > 0) {
    load_key_block<kThreads>(kp, w, sK, sV, d_qk, d_v);
    load_queries(0, 0);
  }
  cp_async_commit();

  int fold_left = kp.kv_fold_blocks;  // Fold: iterations to the next fold
  for (int it = 0; it < w.n_iters; ++it) {
    const int buf = it & 1;
    if (it + 1 < w.n_iters) {
      load_queries(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t r0 = int64_t(w.first_qblock + it % w.n_qblocks) * Br;
    const int64_t r1 = kernel::min64(r0 + Br, w.s_q);

    // S^T = K Q^T; P^T = exp(round(S^T * scale) - LSE), masked -> -0
    float st[MT][Br / 8][4];
    zero<MT, Br>(st);
    gemm_nt<T, MT, Br, D, backward_prefetch(A, D)>(st, sK, warp_row0, sQ(buf), 0, d_qk);
    ScoreMod mod;
    KeepMask<MT, Br / 8> keep{};  // dropout's (dropping)
    const bool dropping = Mods && kp.f.dropout_scale != 0.f;
    if constexpr (Mods) {
      mod = ScoreMod::of(kp, w.mask, w.batch, w.head(it / w.n_qblocks));
      if (w.dim_split != 0) mod.dbias = nullptr, mod.dbias_acc = nullptr;  // (the first head-dim split's)
      score_mod<MT, Br>(st, mod, w.c0 + warp_row0, r0, false);
      if (dropping) keep = dropout_mask_cols<MT, Br / 8>(kp, w.batch, w.head(it / w.n_qblocks), w.c0 + warp_row0, r0);
    }
    recompute_p_cols(st, sLse + buf * Br, Mods ? 1.f : kp.p.scale);
    if (r0 < w.unmasked.begin || r1 > w.unmasked.end)
      apply_mask<MT, Br>(st, w.mask, w.c0 + warp_row0, r0, false, kMaskedP);

    // dV += P^T dO (dropout: (Z P)^T dO)
    {
      uint32_t pt_frag[MT][Br / 16][4];
      if (dropping) {
        float zpt[MT][Br / 8][4];
        keep_copy(zpt, st, keep, kp.f.dropout_scale);
        accum_to_a<T, MT, Br>(pt_frag, zpt);
      } else {
        accum_to_a<T, MT, Br>(pt_frag, st);
      }
      gemm_rn<T, MT, Br, DAcc, backward_prefetch(A, D)>(dv, pt_frag, sDO(buf), col0, d_v - col0);
    }
    // dP^T = V dO^T; dS^T = P^T * (dP^T - delta)
    float dpt[MT][Br / 8][4];
    zero<MT, Br>(dpt);
    gemm_nt<T, MT, Br, D, backward_prefetch(A, D)>(dpt, sV, warp_row0, sDO(buf), 0, d_v);
    if (dropping) apply_keep(dpt, keep, kp.f.dropout_scale);  // dS^T = P^T (Z dP^T - delta)
    ds_cols(dpt, st, sDelta + buf * Br);
    if constexpr (Mods)
      if (mod.cap > 0.f || mod.writes_dbias()) score_grad_cols(dpt, st, sLse + buf * Br, mod, w.c0 + warp_row0, r0);
    // dK += dS^T Q
    {
      uint32_t ds_frag[MT][Br / 16][4];
      accum_to_a<T, MT, Br>(ds_frag, dpt);
      gemm_rn<T, MT, Br, DAcc, backward_prefetch(A, D)>(dk, ds_frag, sQ(buf), col0, d_qk - col0);
    }
    if constexpr (Fold)  // long query ranges: fold dK, dV (kernel_params.hpp)
      if (--fold_left == 0) {
        fold_dk_dv<MT, DAcc>(kp, w.batch, w.kv_head, w.gsplit, w.c0 + warp_row0, w.c1, col0, dk, dv);
        fold_left = kp.kv_fold_blocks;
      }
    __syncthreads();  // buffers of this iteration may be refilled
  }

  // epilogue: this warp's rows of the CTA's valid keys (the feature variant folds only where
  // the plan says so)
  if (!Mods || kp.kv_fold_blocks > 0)
    store_dk_dv<T, MT, DAcc, Fold>(kp, w.batch, w.kv_head, w.gsplit, w.c0 + warp_row0, w.c1, col0, dk, dv);
  else
    store_dk_dv<T, MT, DAcc, false>(kp, w.batch, w.kv_head, w.gsplit, w.c0 + warp_row0, w.c1, col0, dk, dv);
}

template <Arch A, class T, int D, bool Fold, bool Mods = false>
__global__ void __launch_bounds__(kThreads) backward_kv_kernel(const KernelParams kp) {
  if constexpr (builds_body<A>) kv_pass_mainloop<A, T, D, Fold, Mods>(kp);
}

// The kernel table's entry of this pass for (A, T, D) (dispatch.hpp).
template <Arch A, class T, int D>
KernelEntry kv_entry() {
  constexpr KvPassTile kTile = kv_tile(A, D);
  KernelEntry e;
  e.name = "sm80 4-warp dK/dV pass";
  e.dtype = dtype_of<T>(), e.arch = A, e.bucket = D, e.pass = Pass::dkdv;
  e.threads = kThreads, e.smem_bytes = kTile.smem_bytes;
  e.grid = GridShape::key_blocks, e.block_rows = kTile.bc, e.dim_splits = kTile.dim_splits;
  e.loop_rows = kTile.br;
  e.split_target = kTile.split_target;
  e.guarded = reinterpret_cast<const void*>(&backward_kv_kernel<A, T, D, false>);
  e.fold = reinterpret_cast<const void*>(&backward_kv_kernel<A, T, D, true>);
  e.mods = reinterpret_cast<const void*>(&backward_kv_kernel<A, T, D, true, true>);
  return e;
}

}  // namespace strideattn::cuda_impl
