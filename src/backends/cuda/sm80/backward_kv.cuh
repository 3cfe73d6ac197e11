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
//     S^T = K Q^T * scale, P^T = 2^(S^T - LSE) (masked -> 0)
//     dV += P^T dO;  dP^T = V dO^T;  dS^T = P^T * (dP^T - delta);  dK += dS^T Q
// Deterministic: every sum runs in a fixed order in one thread's registers.
#pragma once

#include "backends/cuda/common/epilogue.cuh"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/mask.cuh"
#include "backends/cuda/common/softmax.cuh"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/sm80/mma.cuh"

namespace strideattn::cuda_impl {

template <Arch A, class T, int D>
__device__ __forceinline__ void kv_pass_mainloop(const KernelParams& kp) {
  constexpr KvPassTile kTile = kv_tile(A, D);
  constexpr int MT = kTile.mt, Bc = kTile.bc, Br = kTile.br, DAcc = kTile.d_acc;
  constexpr int kSplits = D / DAcc;
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
  float* sLse = reinterpret_cast<float*>(q_base + 4 * QTile::kElems);  // [2][Br], base-2 LSE
  float* sDelta = sLse + 2 * Br;                                       // [2][Br]

  const kernel::AttentionParams& p = kp.p;
  const int64_t batch = blockIdx.z;
  const int64_t kv_head = blockIdx.y / kp.group_splits;
  const int gsplit = int(blockIdx.y % kp.group_splits);
  const int split = int(blockIdx.x % kSplits);
  const int col0 = split * DAcc;  // head-dim columns of dK / dV this CTA owns
  const int64_t c0 = int64_t(blockIdx.x / kSplits) * Bc;
  const int64_t s_q = p.q_seq.length(batch), s_kv = p.kv_seq.length(batch);
  if (c0 >= s_kv) return;
  const int64_t c1 = kernel::min64(c0 + Bc, s_kv);
  const MaskRule mask = p.mask(batch);
  const TileRange queries = kernel::query_range_for_keys(mask, c0, c1);
  const int64_t first_qblock = queries.begin / Br;
  const int64_t n_qblocks = queries.end > queries.begin ? kernel::ceil_div(queries.end, Br) - first_qblock : 0;
  // This CTA's share of the query-head group: heads [head_begin, head_end) of it.
  const int64_t group = p.heads / p.kv_heads;
  const int64_t per_split = kernel::ceil_div(group, kp.group_splits);
  const int64_t head_begin = kernel::min64(group, gsplit * per_split);
  const int64_t head_end = kernel::min64(group, head_begin + per_split);
  const int64_t n_iters = n_qblocks * (head_end - head_begin);

  const SequenceSpan q_span = p.q_seq.span(p.q_st, batch);
  const SequenceSpan do_span = p.q_seq.span(p.do_st, batch);
  const SequenceSpan k_span = p.kv_seq.span(p.k_st, batch);
  const SequenceSpan v_span = p.kv_seq.span(p.v_st, batch);
  const int d_qk = int(p.d_qk), d_v = int(p.d_v);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = lane & 3;
  const int warp_row0 = warp * 16 * MT;

  // Iteration `it` covers query head kv_head * group + head_begin + it / n_qblocks, query
  // block first_qblock + it % n_qblocks.
  auto load_queries = [&](int64_t it, int buf) {
    const int64_t head = kv_head * group + head_begin + it / n_qblocks;
    const int64_t r0 = (first_qblock + it % n_qblocks) * Br;
    const int rows = int(kernel::min64(Br, s_q - r0));
    load_tile<kThreads>(
        sQ(buf), GlobalRows{static_cast<const uint16_t*>(p.q) + kernel::row_offset(q_span, p.q_st, r0, head), p.q_st.s,
                            rows, d_qk, (kp.aligned & kVecQ) != 0});
    load_tile<kThreads>(sDO(buf),
                        GlobalRows{static_cast<const uint16_t*>(p.d_o) + kernel::row_offset(do_span, p.do_st, r0, head),
                                   p.do_st.s, rows, d_v, (kp.aligned & kVecDO) != 0});
    for (int i = threadIdx.x; i < Br; i += kThreads) {
      const bool valid = i < rows;
      sLse[buf * Br + i] =
          valid ? lse_log2(p.lse[kernel::lse_offset(p.q_seq, p.lse_st, batch, head, r0 + i)]) : INFINITY;
      sDelta[buf * Br + i] = valid ? kp.delta[delta_index(kp, batch, head, r0 + i)] : 0.f;
    }
  };

  float dk[MT][DAcc / 8][4], dv[MT][DAcc / 8][4];
  zero<MT, DAcc>(dk);
  zero<MT, DAcc>(dv);

  // K, V: loaded once (with the first query block, when any query sees these keys).
  if (n_iters > 0) {
    load_tile<kThreads>(
        sK, GlobalRows{static_cast<const uint16_t*>(p.k) + kernel::row_offset(k_span, p.k_st, c0, kv_head), p.k_st.s,
                       int(c1 - c0), d_qk, (kp.aligned & kVecK) != 0});
    load_tile<kThreads>(
        sV, GlobalRows{static_cast<const uint16_t*>(p.v) + kernel::row_offset(v_span, p.v_st, c0, kv_head), p.v_st.s,
                       int(c1 - c0), d_v, (kp.aligned & kVecV) != 0});
    load_queries(0, 0);
  }
  cp_async_commit();

  for (int64_t it = 0; it < n_iters; ++it) {
    const int buf = int(it & 1);
    if (it + 1 < n_iters) {
      load_queries(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t r0 = (first_qblock + it % n_qblocks) * Br;
    const int64_t r1 = kernel::min64(r0 + Br, s_q);
    const float* lse2 = sLse + buf * Br;
    const float* delta = sDelta + buf * Br;

    // S^T = K Q^T; P^T = 2^(S^T * scale_log2 - LSE), masked -> 0
    float st[MT][Br / 8][4];
    zero<MT, Br>(st);
    gemm_nt<T, MT, Br, D, backward_prefetch(A, D)>(st, sK, warp_row0, sQ(buf), 0, d_qk);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < Br / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[mt][n][e] = exp2f(st[mt][n][e] * kp.scale_log2 - lse2[n * 8 + 2 * t + (e & 1)]);
    if (!kernel::tile_fully_visible(mask, r0, r1, c0, c1)) apply_mask<MT, Br>(st, mask, c0 + warp_row0, r0, false, 0.f);

    // dV += P^T dO
    {
      uint32_t pt_frag[MT][Br / 16][4];
      accum_to_a<T, MT, Br>(pt_frag, st);
      gemm_rn<T, MT, Br, DAcc, backward_prefetch(A, D)>(dv, pt_frag, sDO(buf), col0, d_v - col0);
    }
    // dP^T = V dO^T; dS^T = P^T * (dP^T - delta)
    float dpt[MT][Br / 8][4];
    zero<MT, Br>(dpt);
    gemm_nt<T, MT, Br, D, backward_prefetch(A, D)>(dpt, sV, warp_row0, sDO(buf), 0, d_v);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < Br / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) dpt[mt][n][e] = st[mt][n][e] * (dpt[mt][n][e] - delta[n * 8 + 2 * t + (e & 1)]);
    // dK += dS^T Q
    {
      uint32_t ds_frag[MT][Br / 16][4];
      accum_to_a<T, MT, Br>(ds_frag, dpt);
      gemm_rn<T, MT, Br, DAcc, backward_prefetch(A, D)>(dk, ds_frag, sQ(buf), col0, d_qk - col0);
    }
    __syncthreads();  // buffers of this iteration may be refilled
  }

  // epilogue: this warp's rows of the CTA's valid keys
  store_dk_dv<T, MT, DAcc>(kp, batch, kv_head, gsplit, c0 + warp_row0, c1, col0, dk, dv);
}

template <Arch A, class T, int D>
__global__ void __launch_bounds__(kThreads) backward_kv_kernel(const KernelParams kp) {
  if constexpr (builds_body<A>) kv_pass_mainloop<A, T, D>(kp);
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
  e.split_target = kTile.split_target;
  e.guarded = reinterpret_cast<const void*>(&backward_kv_kernel<A, T, D>);
  return e;
}

}  // namespace strideattn::cuda_impl
