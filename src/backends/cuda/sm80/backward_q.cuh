// The dQ pass of the two-pass backward (the deterministic one): one CTA per (query block,
// head, sequence), dQ in fp32 registers over the key blocks in a fixed order, no atomics:
//   S = Q K^T, P = exp(round(S * scale) - LSE) (masked -> -0)
//   dP = dO V^T;  dS = P * (dP - delta);  dQ += dS K
// Over long key ranges (kp.q_fold_blocks) dQ folds into fp32 dq_accum rows every that many
// key blocks (kernel_params.hpp), and launch_convert_dq stores it.
// (sm80/backward_kv.cuh has the two-pass form's dK/dV pass.)
// Mods: the feature variant (common/score_mod.cuh): S becomes the logit L before P is
// recomputed (with scale 1), dP is multiplied by the dropout mask Z (common/dropout.cuh)
// and dS is scaled by the softcap's derivative.
#pragma once

#include "backends/cuda/common/dropout.cuh"
#include "backends/cuda/common/epilogue.cuh"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/mask.cuh"
#include "backends/cuda/common/query_block.cuh"
#include "backends/cuda/common/score_mod.cuh"
#include "backends/cuda/common/softmax.cuh"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/sm80/mma.cuh"

namespace strideattn::cuda_impl {

template <Arch A, class T, int D, bool Fold, bool Mods>
__device__ __forceinline__ void q_pass_mainloop(const KernelParams& kp) {
  constexpr QPassTile kTile = q_tile(A, D);
  constexpr int MT = kTile.mt, Br = kTile.br, Bc = kTile.bc;
  static_assert(Br == kWarps * 16 * MT, "one warp per 16*MT queries");
  using QTile = SmemTile<Br, D>;
  using KvTile = SmemTile<Bc, D>;
  static_assert((2 * QTile::kElems + 4 * KvTile::kElems) * 2 == kTile.smem_bytes, "the shared memory the host grants");
  extern __shared__ __align__(128) unsigned char smem[];
  const QTile sQ{reinterpret_cast<uint16_t*>(smem)};
  const QTile sDO{sQ.base + QTile::kElems};
  // Two stages of K and V: stage b at kv_base + b * 2 * kElems (K), + kElems (V).
  uint16_t* const kv_base = sDO.base + QTile::kElems;
  auto sK = [&](int b) { return KvTile{kv_base + b * 2 * KvTile::kElems}; };
  auto sV = [&](int b) { return KvTile{kv_base + b * 2 * KvTile::kElems + KvTile::kElems}; };

  const kernel::AttentionParams& p = kp.p;
  const QueryBlockWork w = query_block_work<Br, Bc>(kp);
  if (w.empty) return;
  const int64_t batch = w.batch, head = w.head, kv_head = w.kv_head, r0 = w.r0, r1 = w.r1, s_kv = w.s_kv;
  const MaskRule& mask = w.mask;
  const int64_t first_block = w.first_key;
  const int n_blocks = w.n_key_blocks;

  const auto q = sequence_ref(p.q, p.q_st, p.q_seq, batch), d_o = sequence_ref(p.d_o, p.do_st, p.q_seq, batch),
             k = sequence_ref(p.k, p.k_st, p.kv_seq, batch), v = sequence_ref(p.v, p.v_st, p.kv_seq, batch);
  const int d_qk = int(p.d_qk), d_v = int(p.d_v);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int warp_row0 = warp * 16 * MT;

  auto load_keys = [&](int64_t c0, int buf) {
    const int rows = int(kernel::min64(Bc, s_kv - c0));
    load_tile<kThreads>(sK(buf), rows_of(k, c0, kv_head, rows, d_qk, (kp.aligned & kVecK) != 0));
    load_tile<kThreads>(sV(buf), rows_of(v, c0, kv_head, rows, d_v, (kp.aligned & kVecV) != 0));
  };

  // per-row LSE (lse_for_p) and delta of this thread's rows
  float row_lse[MT][2], row_delta[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = r0 + warp_row0 + mt * 16 + g + 8 * h;
      const bool valid = row < r1;
      row_lse[mt][h] = valid ? lse_for_p(p.lse[kernel::lse_offset(p.q_seq, p.lse_st, batch, head, row)]) : INFINITY;
      row_delta[mt][h] = valid ? kp.delta[delta_index(kp, batch, head, row)] : 0.f;
    }

  float dq[MT][D / 8][4];
  zero<MT, D>(dq);

  if (n_blocks > 0) {
    const int rows = int(r1 - r0);
    load_tile<kThreads>(sQ, rows_of(q, r0, head, rows, d_qk, (kp.aligned & kVecQ) != 0));
    load_tile<kThreads>(sDO, rows_of(d_o, r0, head, rows, d_v, (kp.aligned & kVecDO) != 0));
    load_keys(first_block, 0);
  }
  cp_async_commit();

  int fold_left = kp.q_fold_blocks;  // Fold: key blocks to the next fold
  for (int it = 0; it < n_blocks; ++it) {
    const int buf = it & 1;
    const int64_t c0 = first_block + int64_t(it) * Bc;
    if (it + 1 < n_blocks) {
      load_keys(c0 + Bc, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    // S = Q K^T; P = exp(round(S * scale) - LSE), masked -> -0
    float s[MT][Bc / 8][4];
    zero<MT, Bc>(s);
    gemm_nt<T, MT, Bc, D, backward_prefetch(A, D)>(s, sQ, warp_row0, sK(buf), 0, d_qk);
    // (the modifiers made per block from the parameters, as in sm80/forward.cuh)
    ScoreMod mod;
    if constexpr (Mods) {
      mod = ScoreMod::of(kp, mask, batch, head);
      score_mod<MT, Bc>(s, mod, r0 + warp_row0, c0, true);
    }
    recompute_p_rows(s, row_lse, Mods ? 1.f : kp.p.scale);
    if (!kernel::tile_fully_visible(mask, r0, r1, c0, c0 + Bc))
      apply_mask<MT, Bc>(s, mask, r0 + warp_row0, c0, true, kMaskedP);

    // dP = dO V^T; dS = P * (dP - delta)
    float dp[MT][Bc / 8][4];
    zero<MT, Bc>(dp);
    gemm_nt<T, MT, Bc, D, backward_prefetch(A, D)>(dp, sDO, warp_row0, sV(buf), 0, d_v);
    // dropout: dS = P (Z dP - delta)
    if constexpr (Mods)
      if (kp.f.dropout_scale != 0.f) dropout_rows<MT, Bc / 8>(dp, kp, batch, head, r0 + warp_row0, c0);
    ds_rows(dp, s, row_delta);
    if constexpr (Mods)
      if (mod.cap > 0.f) score_grad_rows(dp, s, row_lse, mod, r0 + warp_row0, c0);
    // dQ += dS K
    uint32_t ds_frag[MT][Bc / 16][4];
    accum_to_a<T, MT, Bc>(ds_frag, dp);
    gemm_rn<T, MT, Bc, D, backward_prefetch(A, D)>(dq, ds_frag, sK(buf), 0, d_qk);
    if constexpr (Fold)  // long key ranges: fold dQ into dq_accum (kernel_params.hpp)
      if (--fold_left == 0) {
        fold_dq<MT, D>(kp, batch, head, r0 + warp_row0, r1, dq);
        fold_left = kp.q_fold_blocks;
      }
    __syncthreads();  // buffers of this iteration may be refilled
  }

  // epilogue: dQ = scale * dq, or with the fold on its last blocks into dq_accum (which
  // launch_convert_dq stores); the feature variant folds only where the plan says so
  if (Fold && (!Mods || kp.q_fold_blocks > 0))
    fold_dq<MT, D>(kp, batch, head, r0 + warp_row0, r1, dq);
  else
    store_dq<T, MT, D>(kp, batch, head, r0 + warp_row0, r1, dq);
}

template <Arch A, class T, int D, bool Fold, bool Mods = false>
__global__ void __launch_bounds__(kThreads) backward_q_kernel(const KernelParams kp) {
  if constexpr (builds_body<A>) q_pass_mainloop<A, T, D, Fold, Mods>(kp);
}

// The kernel table's entry of this pass for (A, T, D) (dispatch.hpp).
template <Arch A, class T, int D>
KernelEntry q_entry() {
  constexpr QPassTile kTile = q_tile(A, D);
  KernelEntry e;
  e.name = A == Arch::sm80 ? "sm80 dQ pass" : "sm90a dQ pass";
  e.dtype = dtype_of<T>(), e.arch = A, e.bucket = D, e.pass = Pass::dq;
  e.threads = kThreads, e.smem_bytes = kTile.smem_bytes;
  e.grid = GridShape::query_blocks, e.block_rows = kTile.br, e.loop_rows = kTile.bc;
  e.guarded = reinterpret_cast<const void*>(&backward_q_kernel<A, T, D, false>);
  e.fold = reinterpret_cast<const void*>(&backward_q_kernel<A, T, D, true>);
  e.mods = reinterpret_cast<const void*>(&backward_q_kernel<A, T, D, true, true>);
  return e;
}

}  // namespace strideattn::cuda_impl
