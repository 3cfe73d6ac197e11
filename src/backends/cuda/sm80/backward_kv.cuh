// Backward kernels (FlashAttention-2 recomputation) in the two-pass form, whose kernels use no
// atomics, and atomic_add_pair, with which the single-pass kernels add dQ:
//   pre-pass (aux_kernels.cu): delta_i = rowsum(dO_i * O_i)
//   dK/dV pass (the 4-warp kernel here: the d <= 256 bucket except on sm_90a, and d <= 64 /
//     d <= 128 with STRIDEATTN_CUDA_KV8=0 or too little shared memory; the default there is
//     the 8-warp kernel of backward_kv8_kernel.cuh, same math, same dK/dV, which with
//     deterministic = false also adds dQ by atomics, and on sm_90a, every bucket, the wgmma
//     kernel of backward_wgmma_kernel.cuh; run_backward is in backward_kv8_kernel.cuh):
//     one CTA per (key block, KV head, sequence[, head-dim split][, group split]);
//     dK and dV stay in fp32 registers while the CTA loops over the query blocks of every
//     query head of its share of the GQA group that see its keys (query_range_for_keys).
//     With one group split it stores dK/dV; with several (MQA/GQA with few KV heads, to fill
//     the GPU) each writes fp32 partials that aux_kernels.cu sums in split order:
//       S^T = K Q^T * scale, P^T = 2^(S^T - LSE) (masked -> 0)
//       dV += P^T dO;  dP^T = V dO^T;  dS^T = P^T * (dP^T - delta);  dK += dS^T Q
//   dQ pass: one CTA per (query block, head, sequence), dQ in fp32 registers over the key
//     blocks in a fixed order: S, P, dP as above, dQ += dS K.
// Both passes are deterministic: every sum runs in a fixed order in one thread's registers.
#pragma once

#include "backends/cuda/sm80/forward.cuh"

namespace strideattn::cuda_impl {

// Scaled log-sum-exp in base 2 as the kernels consume it: rows that saw no key (LSE = -inf)
// and rows past the sequence end give +inf, so P = 2^(S - LSE) is exactly 0 there.
__device__ __forceinline__ float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

// dq_accum[row][col], [col + 1] += (x0, x1); col even, the row 8-byte aligned (d_qk % 8 == 0).
__device__ __forceinline__ void atomic_add_pair(float* dst, float x0, float x1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x0, x1));
#else
  atomicAdd(dst, x0);
  atomicAdd(dst + 1, x1);
#endif
}

// ------------------------------------------------------------------ passes over query blocks of a key block

// The work of one CTA of a dK/dV pass that loops over query blocks of Br queries (the 8-warp
// kernel and the sm_90a wgmma kernel): key block [c0, c1) of (sequence batch, KV head
// kv_head), the query blocks that see any of its keys (query_range_for_keys), and its share
// [head_begin, head_begin + n_iters / n_qblocks) of the GQA group (group split gsplit).
// Iteration (h, b) covers query head head(h), query block first_qblock + b.
// Counts are 32-bit (fewer registers live across the loop than the 4-warp kernel's int64
// ones; with those every 8-warp variant spilled): query blocks times heads stays below 2^31
// unless Q holds over 2^37 rows (32 TiB at d = 128).
struct KvBlockWork {
  int64_t batch = 0, kv_head = 0, c0 = 0, c1 = 0, s_q = 0;
  bool empty = true;  // c0 >= s_kv: nothing to do, not even the epilogue
  int gsplit = 0;
  MaskRule mask;
  // Query blocks inside `unmasked` skip the mask (tile_fully_visible, hoisted out of the
  // loop: rows_seeing_all_keys); a partial key block never does.
  TileRange unmasked;
  int first_qblock = 0, n_qblocks = 0, group = 0, head_begin = 0, n_iters = 0;
  __device__ __forceinline__ int64_t head(int h) const { return kv_head * group + head_begin + h; }
};

template <int Bc, int Br>
__device__ __forceinline__ KvBlockWork kv_block_work(const KernelParams& kp) {
  const kernel::AttentionParams& p = kp.p;
  KvBlockWork w;
  w.batch = blockIdx.z;
  w.kv_head = blockIdx.y / kp.group_splits;
  w.gsplit = int(blockIdx.y % kp.group_splits);
  w.c0 = int64_t(blockIdx.x) * Bc;
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
template <class KvTile>
__device__ __forceinline__ void load_key_block(const KernelParams& kp, const KvBlockWork& w, const KvTile& sk,
                                               const KvTile& sv, int d_qk, int d_v) {
  const kernel::AttentionParams& p = kp.p;
  const SequenceSpan k_span = p.kv_seq.span(p.k_st, w.batch);
  const SequenceSpan v_span = p.kv_seq.span(p.v_st, w.batch);
  load_tile<kKvThreads>(
      sk, GlobalRows{static_cast<const uint16_t*>(p.k) + kernel::row_offset(k_span, p.k_st, w.c0, w.kv_head), p.k_st.s,
                     int(w.c1 - w.c0), d_qk, (kp.aligned & kVecK) != 0});
  load_tile<kKvThreads>(
      sv, GlobalRows{static_cast<const uint16_t*>(p.v) + kernel::row_offset(v_span, p.v_st, w.c0, w.kv_head), p.v_st.s,
                     int(w.c1 - w.c0), d_v, (kp.aligned & kVecV) != 0});
}

// Query block (h, b) of the CTA's work: Q and dO rows into their tiles, LSE (natural log,
// converted where it is used) and delta into lse[0..Br) and delta[0..Br), all by cp.async;
// rows past s_q get zero Q / dO, LSE = -inf (so P = 0) and delta = 0. q_span / do_span:
// the sequence's spans of Q and dO (computed once per CTA).
template <int Br, class QTile>
__device__ __forceinline__ void load_query_block(const KernelParams& kp, const KvBlockWork& w,
                                                 const SequenceSpan& q_span, const SequenceSpan& do_span, int h, int b,
                                                 const QTile& sq, const QTile& sdo, float* lse, float* delta, int d_qk,
                                                 int d_v) {
  const kernel::AttentionParams& p = kp.p;
  const int64_t head = w.head(h);
  const int64_t r0 = int64_t(w.first_qblock + b) * Br;
  const int rows = int(kernel::min64(Br, w.s_q - r0));
  load_tile<kKvThreads>(sq, GlobalRows{static_cast<const uint16_t*>(p.q) + kernel::row_offset(q_span, p.q_st, r0, head),
                                       p.q_st.s, rows, d_qk, (kp.aligned & kVecQ) != 0});
  load_tile<kKvThreads>(
      sdo, GlobalRows{static_cast<const uint16_t*>(p.d_o) + kernel::row_offset(do_span, p.do_st, r0, head), p.do_st.s,
                      rows, d_v, (kp.aligned & kVecDO) != 0});
  for (int i = threadIdx.x; i < Br; i += kKvThreads) {
    if (i < rows) {
      cp_async_4(smem_addr(lse + i), p.lse + kernel::lse_offset(p.q_seq, p.lse_st, w.batch, head, r0 + i));
      cp_async_4(smem_addr(delta + i), kp.delta + delta_index(kp, w.batch, head, r0 + i));
    } else {
      lse[i] = -INFINITY;
      delta[i] = 0.f;
    }
  }
}

// The dK/dV pass epilogue for one warp's accumulators dk, dv [MT][N/8][4]: rows (keys)
// key0 + 16 * mt + g (+8), those below c1 only; head-dim columns col0 + 8 * n + 2t (+1).
// One group split: dK * scale and dV, stored through their strides. Several: fp32 partial
// rows (unscaled dK, dV) in split gsplit's plane, which launch_reduce_dkv sums.
template <class T, int MT, int N>
__device__ __forceinline__ void store_dk_dv(const KernelParams& kp, int64_t batch, int64_t kv_head, int gsplit,
                                            int64_t key0, int64_t c1, int col0, const float (&dk)[MT][N / 8][4],
                                            const float (&dv)[MT][N / 8][4]) {
  const kernel::AttentionParams& p = kp.p;
  const int d_qk = int(p.d_qk), d_v = int(p.d_v);
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const bool partial = kp.dkv_partial != nullptr;
  float* const part_k = kp.dkv_partial + int64_t(gsplit) * kp.partial_rows * d_qk;
  float* const part_v =
      kp.dkv_partial + int64_t(kp.group_splits) * kp.partial_rows * d_qk + int64_t(gsplit) * kp.partial_rows * d_v;
  auto* dk_ptr = static_cast<uint16_t*>(p.dk);
  auto* dv_ptr = static_cast<uint16_t*>(p.dv);
  const SequenceSpan dk_span = p.kv_seq.span(p.dk_st, batch);
  const SequenceSpan dv_span = p.kv_seq.span(p.dv_st, batch);
  const bool dk_pair = (kp.aligned & kPairDK) != 0, dv_pair = (kp.aligned & kPairDV) != 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t key = key0 + mt * 16 + g + 8 * h;
      if (key >= c1) continue;
      if (partial) {
        const int64_t row = kv_row_index(kp, batch, kv_head, key);
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
          const int col = col0 + n * 8 + 2 * t;  // even; d_qk, d_v are multiples of 8
          if (col < d_qk)
            *reinterpret_cast<float2*>(part_k + row * d_qk + col) = make_float2(dk[mt][n][2 * h], dk[mt][n][2 * h + 1]);
          if (col < d_v)
            *reinterpret_cast<float2*>(part_v + row * d_v + col) = make_float2(dv[mt][n][2 * h], dv[mt][n][2 * h + 1]);
        }
        continue;
      }
      uint16_t* dk_row = dk_ptr + kernel::row_offset(dk_span, p.dk_st, key, kv_head);
      uint16_t* dv_row = dv_ptr + kernel::row_offset(dv_span, p.dv_st, key, kv_head);
#pragma unroll
      for (int n = 0; n < N / 8; ++n) {
        const int col = col0 + n * 8 + 2 * t;
        if (col < d_qk) store_pair<T>(dk_row, col, dk[mt][n][2 * h] * p.scale, dk[mt][n][2 * h + 1] * p.scale, dk_pair);
        if (col < d_v) store_pair<T>(dv_row, col, dv[mt][n][2 * h], dv[mt][n][2 * h + 1], dv_pair);
      }
    }
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads) backward_kv_kernel(const KernelParams kp) {
  using Tile = BackwardKvTile<D>;
  constexpr int MT = Tile::kMT, Bc = Tile::kBc, Br = Tile::kBr, DAcc = Tile::kDAcc;
  constexpr int kSplits = D / DAcc;
  static_assert(Bc == kWarps * 16 * MT, "one warp per 16*MT keys");
  using KvTile = SmemTile<Bc, D>;
  using QTile = SmemTile<Br, D>;
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
    gemm_nt<T, MT, Br, D, kBackwardPrefetch<D>>(st, sK, warp_row0, sQ(buf), 0, d_qk);
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
      gemm_rn<T, MT, Br, DAcc, kBackwardPrefetch<D>>(dv, pt_frag, sDO(buf), col0, d_v - col0);
    }
    // dP^T = V dO^T; dS^T = P^T * (dP^T - delta)
    float dpt[MT][Br / 8][4];
    zero<MT, Br>(dpt);
    gemm_nt<T, MT, Br, D, kBackwardPrefetch<D>>(dpt, sV, warp_row0, sDO(buf), 0, d_v);
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
      gemm_rn<T, MT, Br, DAcc, kBackwardPrefetch<D>>(dk, ds_frag, sQ(buf), col0, d_qk - col0);
    }
    __syncthreads();  // buffers of this iteration may be refilled
  }

  // epilogue: this warp's rows of the CTA's valid keys
  store_dk_dv<T, MT, DAcc>(kp, batch, kv_head, gsplit, c0 + warp_row0, c1, col0, dk, dv);
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads) backward_q_kernel(const KernelParams kp) {
  using Tile = BackwardQTile<D>;
  constexpr int MT = Tile::kMT, Br = Tile::kBr, Bc = Tile::kBc;
  static_assert(Br == kWarps * 16 * MT, "one warp per 16*MT queries");
  using QTile = SmemTile<Br, D>;
  using KvTile = SmemTile<Bc, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const QTile sQ{reinterpret_cast<uint16_t*>(smem)};
  const QTile sDO{sQ.base + QTile::kElems};
  // Two stages of K and V: stage b at kv_base + b * 2 * kElems (K), + kElems (V).
  uint16_t* const kv_base = sDO.base + QTile::kElems;
  auto sK = [&](int b) { return KvTile{kv_base + b * 2 * KvTile::kElems}; };
  auto sV = [&](int b) { return KvTile{kv_base + b * 2 * KvTile::kElems + KvTile::kElems}; };

  const kernel::AttentionParams& p = kp.p;
  const int64_t batch = blockIdx.z, head = blockIdx.y;
  const int64_t s_q = p.q_seq.length(batch), s_kv = p.kv_seq.length(batch);
  const int64_t n_qblocks_max = kernel::ceil_div(p.q_seq.max_len, Br);
  const int64_t r0 = (n_qblocks_max - 1 - int64_t(blockIdx.x)) * Br;
  if (r0 >= s_q) return;
  const int64_t r1 = kernel::min64(r0 + Br, s_q);
  const MaskRule mask = p.mask(batch);
  const TileRange keys = kernel::key_range_for_rows(mask, r0, r1);
  const int64_t kv_head = kernel::kv_head_of(head, p.heads, p.kv_heads);
  const int64_t first_block = (keys.begin / Bc) * Bc;
  const int n_blocks = keys.end > keys.begin ? int(kernel::ceil_div(keys.end - first_block, Bc)) : 0;

  const SequenceSpan q_span = p.q_seq.span(p.q_st, batch);
  const SequenceSpan do_span = p.q_seq.span(p.do_st, batch);
  const SequenceSpan k_span = p.kv_seq.span(p.k_st, batch);
  const SequenceSpan v_span = p.kv_seq.span(p.v_st, batch);
  const int d_qk = int(p.d_qk), d_v = int(p.d_v);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int warp_row0 = warp * 16 * MT;

  auto load_keys = [&](int64_t c0, int buf) {
    const int rows = int(kernel::min64(Bc, s_kv - c0));
    load_tile<kThreads>(sK(buf),
                        GlobalRows{static_cast<const uint16_t*>(p.k) + kernel::row_offset(k_span, p.k_st, c0, kv_head),
                                   p.k_st.s, rows, d_qk, (kp.aligned & kVecK) != 0});
    load_tile<kThreads>(sV(buf),
                        GlobalRows{static_cast<const uint16_t*>(p.v) + kernel::row_offset(v_span, p.v_st, c0, kv_head),
                                   p.v_st.s, rows, d_v, (kp.aligned & kVecV) != 0});
  };

  // per-row LSE (base 2) and delta of this thread's rows
  float row_lse2[MT][2], row_delta[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = r0 + warp_row0 + mt * 16 + g + 8 * h;
      const bool valid = row < r1;
      row_lse2[mt][h] = valid ? lse_log2(p.lse[kernel::lse_offset(p.q_seq, p.lse_st, batch, head, row)]) : INFINITY;
      row_delta[mt][h] = valid ? kp.delta[delta_index(kp, batch, head, row)] : 0.f;
    }

  float dq[MT][D / 8][4];
  zero<MT, D>(dq);

  if (n_blocks > 0) {
    const int rows = int(r1 - r0);
    load_tile<kThreads>(sQ, GlobalRows{static_cast<const uint16_t*>(p.q) + kernel::row_offset(q_span, p.q_st, r0, head),
                                       p.q_st.s, rows, d_qk, (kp.aligned & kVecQ) != 0});
    load_tile<kThreads>(
        sDO, GlobalRows{static_cast<const uint16_t*>(p.d_o) + kernel::row_offset(do_span, p.do_st, r0, head), p.do_st.s,
                        rows, d_v, (kp.aligned & kVecDO) != 0});
    load_keys(first_block, 0);
  }
  cp_async_commit();

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

    // S = Q K^T; P = 2^(S * scale_log2 - LSE), masked -> 0
    float s[MT][Bc / 8][4];
    zero<MT, Bc>(s);
    gemm_nt<T, MT, Bc, D, kBackwardPrefetch<D>>(s, sQ, warp_row0, sK(buf), 0, d_qk);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < Bc / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][n][e] = exp2f(s[mt][n][e] * kp.scale_log2 - row_lse2[mt][e >> 1]);
    if (!kernel::tile_fully_visible(mask, r0, r1, c0, c0 + Bc))
      apply_mask<MT, Bc>(s, mask, r0 + warp_row0, c0, true, 0.f);

    // dP = dO V^T; dS = P * (dP - delta)
    float dp[MT][Bc / 8][4];
    zero<MT, Bc>(dp);
    gemm_nt<T, MT, Bc, D, kBackwardPrefetch<D>>(dp, sDO, warp_row0, sV(buf), 0, d_v);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < Bc / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[mt][n][e] = s[mt][n][e] * (dp[mt][n][e] - row_delta[mt][e >> 1]);
    // dQ += dS K
    uint32_t ds_frag[MT][Bc / 16][4];
    accum_to_a<T, MT, Bc>(ds_frag, dp);
    gemm_rn<T, MT, Bc, D, kBackwardPrefetch<D>>(dq, ds_frag, sK(buf), 0, d_qk);
    __syncthreads();  // buffers of this iteration may be refilled
  }

  auto* dq_ptr = static_cast<uint16_t*>(p.dq);
  const SequenceSpan dq_span = p.q_seq.span(p.dq_st, batch);
  const bool dq_pair = (kp.aligned & kPairDQ) != 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = r0 + warp_row0 + mt * 16 + g + 8 * h;
      if (row >= r1) continue;
      uint16_t* out = dq_ptr + kernel::row_offset(dq_span, p.dq_st, row, head);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int col = n * 8 + 2 * t;
        if (col < d_qk) store_pair<T>(out, col, dq[mt][n][2 * h] * p.scale, dq[mt][n][2 * h + 1] * p.scale, dq_pair);
      }
    }
}

// Launches of the two passes (run_backward in backward_kv8_kernel.cuh picks the dK/dV pass).
template <class T, int D>
cudaError_t launch_kv_pass_4warps(const KernelParams& kp, cudaStream_t stream) {
  using Tile = BackwardKvTile<D>;
  constexpr int smem = (2 * Tile::kBc + 4 * Tile::kBr) * D * 2 + 4 * Tile::kBr * 4;
  return launch_kernel(backward_kv_kernel<T, D>, key_block_grid(kp, Tile::kBc, D / Tile::kDAcc), kThreads, smem, kp,
                       stream);
}

template <class T, int D>
cudaError_t launch_q_pass(const KernelParams& kp, cudaStream_t stream) {
  using Tile = BackwardQTile<D>;
  constexpr int smem = (2 * Tile::kBr + 4 * Tile::kBc) * D * 2;
  return launch_kernel(backward_q_kernel<T, D>, query_block_grid(kp, Tile::kBr), kThreads, smem, kp, stream);
}

}  // namespace strideattn::cuda_impl
