// The scheduling and loads of the dK/dV passes that loop over query blocks (the 8-warp
// mma.sync pass and the sm_90a wgmma pass): which key block, query blocks and GQA heads one
// CTA covers, the shared-memory layout they share, and the key and query block loads.
#pragma once

#include <cmath>

#include "backends/cuda/common/copy.cuh"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/tiles.hpp"

namespace strideattn::cuda_impl {

// The work of one CTA of a dK/dV pass, which loops over query blocks of Br queries: key block
// [c0, c1) of (sequence batch, KV head kv_head), the query blocks that see any of its keys
// (query_range_for_keys), and its share [head_begin, head_begin + n_iters / n_qblocks) of
// the GQA group (group split gsplit); with DimSplits > 1 (the 4-warp pass at d <= 256) also
// its share dim_split of the head dim. Iteration (h, b) covers query head head(h), query
// block first_qblock + b.
// Counts are 32-bit (with int64 ones every 8-warp variant spilled): query blocks times heads
// stays below 2^31 unless Q holds over 2^37 rows (32 TiB at d = 128).
struct KvBlockWork {
  int64_t batch = 0, kv_head = 0, c0 = 0, c1 = 0, s_q = 0;
  bool empty = true;  // c0 >= s_kv: nothing to do, not even the epilogue
  int gsplit = 0;
  int dim_split = 0;
  MaskRule mask;
  // Query blocks inside `unmasked` skip the mask (tile_fully_visible, hoisted out of the
  // loop: rows_seeing_all_keys); a partial key block never does.
  TileRange unmasked;
  int first_qblock = 0, n_qblocks = 0, group = 0, head_begin = 0, n_iters = 0;
  __device__ __forceinline__ int64_t head(int h) const { return kv_head * group + head_begin + h; }
};

template <int Bc, int Br, int DimSplits = 1>
__device__ __forceinline__ KvBlockWork kv_block_work(const KernelParams& kp) {
  const kernel::AttentionParams& p = kp.p;
  KvBlockWork w;
  w.batch = blockIdx.z;
  w.kv_head = blockIdx.y / kp.group_splits;
  w.gsplit = int(blockIdx.y % kp.group_splits);
  w.dim_split = int(blockIdx.x % DimSplits);
  w.c0 = int64_t(blockIdx.x / DimSplits) * Bc;
  w.s_q = p.q_seq.length(w.batch);
  const int64_t s_kv = p.kv_seq.length(w.batch);
  w.empty = w.c0 >= s_kv;  // (then c1 < c0 and the ranges below come out empty)
  w.c1 = kernel::min64(w.c0 + Bc, s_kv);
  w.mask = p.mask(w.batch);
  const TileRange queries = kernel::query_range_for_keys(w.mask, w.c0, w.c1);
  w.unmasked = w.c1 == w.c0 + Bc ? kernel::rows_seeing_all_keys(w.mask, w.c0, w.c1) : TileRange{0, 0};
  w.first_qblock = int(queries.begin / Br);
  w.n_qblocks = queries.end > queries.begin ? int(kernel::ceil_div(queries.end, Br)) - w.first_qblock : 0;
  w.group = int(p.heads / p.kv_heads);
  const int per_split = (w.group + kp.group_splits - 1) / kp.group_splits;
  w.head_begin = min(w.group, w.gsplit * per_split);
  const int head_end = min(w.group, w.head_begin + per_split);
  w.n_iters = w.n_qblocks * (head_end - w.head_begin);
  return w;
}

// The shared memory of those passes, in order: K, V; P^T, dS^T (keys x queries); two stages
// of Q and dO (stage b: Q at q_base + 2 b kElems, dO after it); two of LSE (natural log)
// and delta, [2][Br] fp32 each. `end()`: what a kernel adds after them.
template <class KvTile, class PTile, class QTile, int Br>
struct KvPassSmem {
  KvTile k, v;
  PTile p, ds;
  uint16_t* q_base;
  float *lse, *delta;
  __device__ __forceinline__ explicit KvPassSmem(uint16_t* base)
      : k{base},
        v{base + KvTile::kElems},
        p{base + 2 * KvTile::kElems},
        ds{base + 2 * KvTile::kElems + PTile::kElems},
        q_base(base + 2 * KvTile::kElems + 2 * PTile::kElems),
        lse(reinterpret_cast<float*>(q_base + 4 * QTile::kElems)),
        delta(lse + 2 * Br) {}
  __device__ __forceinline__ QTile q(int b) const { return QTile{q_base + b * 2 * QTile::kElems}; }
  __device__ __forceinline__ QTile d_o(int b) const { return QTile{q_base + b * 2 * QTile::kElems + QTile::kElems}; }
  __device__ __forceinline__ float* end() const { return delta + 2 * Br; }
};

// The CTA's keys: K and V rows [c0, c1) into their tiles (cp.async; rows and columns past
// the data zero-filled). d_qk, d_v: the head dims (compile-time ones in FullD kernels).
template <int NTHREADS, class KvTile>
__device__ __forceinline__ void load_key_block(const KernelParams& kp, const KvBlockWork& w, const KvTile& sk,
                                               const KvTile& sv, int d_qk, int d_v) {
  const kernel::AttentionParams& p = kp.p;
  const int rows = int(w.c1 - w.c0);
  load_tile<NTHREADS>(sk, rows_of(sequence_ref(p.k, p.k_st, p.kv_seq, w.batch), w.c0, w.kv_head, rows, d_qk,
                                  (kp.aligned & kVecK) != 0));
  load_tile<NTHREADS>(
      sv, rows_of(sequence_ref(p.v, p.v_st, p.kv_seq, w.batch), w.c0, w.kv_head, rows, d_v, (kp.aligned & kVecV) != 0));
}

// Query block (h, b) of the CTA's work: Q and dO rows into their tiles, LSE (natural log,
// as stored; softmax.cuh, lse_for_p) and delta into lse[0..Br) and delta[0..Br), all by
// cp.async, so that their latency hides behind the current block's work;
// rows past s_q get zero Q / dO, LSE = -inf (so P = 0) and delta = 0. q / d_o: the
// sequence's Q and dO (made once per CTA).
template <int Br, int NTHREADS, class QTile>
__device__ __forceinline__ void load_query_block(const KernelParams& kp, const KvBlockWork& w,
                                                 const TensorRef<const uint16_t>& q,
                                                 const TensorRef<const uint16_t>& d_o, int h, int b, const QTile& sq,
                                                 const QTile& sdo, float* lse, float* delta, int d_qk, int d_v) {
  const kernel::AttentionParams& p = kp.p;
  const int64_t head = w.head(h);
  const int64_t r0 = int64_t(w.first_qblock + b) * Br;
  const int rows = int(kernel::min64(Br, w.s_q - r0));
  load_tile<NTHREADS>(sq, rows_of(q, r0, head, rows, d_qk, (kp.aligned & kVecQ) != 0));
  load_tile<NTHREADS>(sdo, rows_of(d_o, r0, head, rows, d_v, (kp.aligned & kVecDO) != 0));
  for (int i = threadIdx.x; i < Br; i += NTHREADS) {
    if (i < rows) {
      cp_async_4(smem_addr(lse + i), p.lse + kernel::lse_offset(p.q_seq, p.lse_st, w.batch, head, r0 + i));
      cp_async_4(smem_addr(delta + i), kp.delta + delta_index(kp, w.batch, head, r0 + i));
    } else {
      lse[i] = -INFINITY;
      delta[i] = 0.f;
    }
  }
}

}  // namespace strideattn::cuda_impl
