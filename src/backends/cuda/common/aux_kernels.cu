// Small memory-bound kernels around the attention passes: the backward pre-pass
// delta = rowsum(dO * O), the sum of split dK/dV partials (GQA/MQA), the conversion of the
// single-pass backward's fp32 dQ accumulator into dQ, and, for varlen
// problems, zeroing the output tokens that belong to no sequence (padding) so every element
// of an output view is written; for the training features, the max logit's -inf start and
// the sinks' gradient.
#include <cmath>

#include "backends/cuda/common/aux_kernels.hpp"
#include "backends/cuda/common/element.cuh"
#include "backends/cuda/common/score_mod.cuh"
#include "backends/cuda/common/tensor_ref.hpp"

namespace strideattn::cuda_impl {

namespace {

constexpr int kAuxThreads = 128;

// delta = sum_d dO[d] * O[d] in fp32, kDeltaLanes lanes per (sequence, head, token) row,
// each over 8-element chunks lane, lane + kDeltaLanes, ... (d_v is a multiple of 8): 16-byte
// loads where both views allow them (kVecO, kVecDO), else element loads. (One warp per row
// with 2-byte loads ran at an eighth of the bandwidth: 114 us at b 4, h 32, s 4k, d 64.)
constexpr int kDeltaLanes = 8;
constexpr int kDeltaRows = kAuxThreads / kDeltaLanes;  // rows per block

template <class T>
__global__ void __launch_bounds__(kAuxThreads) delta_kernel(const KernelParams kp) {
  const kernel::AttentionParams& p = kp.p;
  const int64_t batch = blockIdx.z, head = blockIdx.y;
  const int64_t row = int64_t(blockIdx.x) * kDeltaRows + threadIdx.x / kDeltaLanes;
  const int lane = threadIdx.x % kDeltaLanes;
  const bool in_range = row < p.q_seq.length(batch);
  float sum = 0.f;
  if (in_range) {
    const uint16_t* o = sequence_ref(p.o, p.o_st, p.q_seq, batch).row(row, head);
    const uint16_t* d_o = sequence_ref(p.d_o, p.do_st, p.q_seq, batch).row(row, head);
    const bool vec = (kp.aligned & kVecO) && (kp.aligned & kVecDO);
    for (int c = lane * 8; c < int(p.d_v); c += kDeltaLanes * 8) {
      uint16_t a[8], b[8];
      if (vec) {
        *reinterpret_cast<uint4*>(a) = *reinterpret_cast<const uint4*>(o + c);
        *reinterpret_cast<uint4*>(b) = *reinterpret_cast<const uint4*>(d_o + c);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) a[e] = o[c + e], b[e] = d_o[c + e];
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += ElementTraits<T>::to_float(a[e]) * ElementTraits<T>::to_float(b[e]);
    }
  }
#pragma unroll
  for (int off = kDeltaLanes / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (in_range && lane == 0) kp.delta[delta_index(kp, batch, head, row)] = sum;
}

// One block per (key token, KV head, sequence): sum the partial planes in split order.
template <class T>
__global__ void __launch_bounds__(kAuxThreads) reduce_dkv_kernel(const KernelParams kp) {
  const kernel::AttentionParams& p = kp.p;
  const int64_t batch = blockIdx.z, kv_head = blockIdx.y, key = blockIdx.x;
  if (key >= p.kv_seq.length(batch)) return;
  const int64_t row = kv_row_index(kp, batch, kv_head, key);
  const int64_t plane_k = kp.partial_rows * p.d_qk, plane_v = kp.partial_rows * p.d_v;
  const float* pk = kp.dkv_partial + row * p.d_qk;
  const float* pv = kp.dkv_partial + kp.group_splits * plane_k + row * p.d_v;
  uint16_t* dk = sequence_ref(p.dk, p.dk_st, p.kv_seq, batch).row(key, kv_head);
  uint16_t* dv = sequence_ref(p.dv, p.dv_st, p.kv_seq, batch).row(key, kv_head);
  for (int64_t c = threadIdx.x; c < p.d_qk; c += blockDim.x) {
    float sum = 0.f;
    for (int i = 0; i < kp.group_splits; ++i) sum += pk[i * plane_k + c];
    dk[c] = ElementTraits<T>::from_float(sum * p.scale);
  }
  for (int64_t c = threadIdx.x; c < p.d_v; c += blockDim.x) {
    float sum = 0.f;
    for (int i = 0; i < kp.group_splits; ++i) sum += pv[i * plane_v + c];
    dv[c] = ElementTraits<T>::from_float(sum);
  }
}

// dQ = scale * dq_accum row, stored through the dQ strides; only tokens of the sequence are
// touched. Each thread converts 4 columns of one row (a 16-byte load: dq_accum rows are
// 16-byte aligned, d_qk a multiple of 8), a block 128 threads of consecutive (token, column
// group) of one (sequence, head). (One block per token, one column per thread, ran at a
// seventh of the bandwidth: 317 us at b 4, h 32, s 4k, d 64, 160 us on the seed.)
template <class T>
__global__ void __launch_bounds__(kAuxThreads) convert_dq_kernel(const KernelParams kp) {
  const kernel::AttentionParams& p = kp.p;
  const int64_t batch = blockIdx.z, head = blockIdx.y;
  const int groups = int(p.d_qk) / 4;  // column groups per row
  const int64_t idx = int64_t(blockIdx.x) * kAuxThreads + threadIdx.x;
  const int64_t token = idx / groups;
  const int c = int(idx % groups) * 4;
  if (token >= p.q_seq.length(batch)) return;
  const float4 acc = *reinterpret_cast<const float4*>(kp.dq_accum + delta_index(kp, batch, head, token) * p.d_qk + c);
  uint16_t* dq = sequence_ref(p.dq, p.dq_st, p.q_seq, batch).row(token, head);
  const bool pair = (kp.aligned & kPairDQ) != 0;
  store_pair<T>(dq, c, acc.x * p.scale, acc.y * p.scale, pair);
  store_pair<T>(dq, c + 2, acc.z * p.scale, acc.w * p.scale, pair);
}

// Zero every (token, head, dim) of a [1, tokens, heads, d] view whose token lies in no
// sequence of `seq`; LSE (optional, [1, heads, tokens]) gets -inf there.
__global__ void __launch_bounds__(kAuxThreads)
    zero_padding_kernel(uint16_t* base, kernel::Strides st, kernel::SequenceTable seq, int64_t batch, int64_t tokens,
                        int64_t heads, int64_t d, float* lse, kernel::LseStrides lse_st) {
  for (int64_t token = blockIdx.x; token < tokens; token += gridDim.x) {
    bool covered = false;
    for (int64_t b = 0; b < batch && !covered; ++b)
      covered = token >= seq.offsets[b] && token < seq.offsets[b] + seq.seqlens[b];
    if (covered) continue;
    for (int64_t i = threadIdx.x; i < heads * d; i += blockDim.x) {
      const int64_t h = i / d, c = i % d;
      base[token * st.s + h * st.h + c] = 0;
    }
    if (lse != nullptr)
      for (int64_t h = threadIdx.x; h < heads; h += blockDim.x) lse[h * lse_st.h + token * lse_st.s] = -INFINITY;
  }
}

cudaError_t zero_padding(void* base, const kernel::Strides& st, const kernel::SequenceTable& seq, int64_t batch,
                         int64_t tokens, int64_t heads, int64_t d, float* lse, const kernel::LseStrides& lse_st,
                         cudaStream_t stream) {
  if (tokens <= 0 || base == nullptr) return cudaSuccess;
  const unsigned blocks = unsigned(tokens < 65536 ? tokens : 65536);
  zero_padding_kernel<<<blocks, kAuxThreads, 0, stream>>>(static_cast<uint16_t*>(base), st, seq, batch, tokens, heads,
                                                          d, lse, lse_st);
  return cudaGetLastError();
}

// max_logit[b, h] = -inf for every (sequence, head), through its strides.
__global__ void __launch_bounds__(kAuxThreads) init_max_logit_kernel(const KernelParams kp) {
  const int64_t i = int64_t(blockIdx.x) * kAuxThreads + threadIdx.x;
  if (i >= kp.p.batch * kp.p.heads) return;
  const int64_t b = i / kp.p.heads, h = i % kp.p.heads;
  kp.f.max_logit[b * kp.f.max_logit_sb + h * kp.f.max_logit_sh] = -INFINITY;
}

// One block per query head: each thread sums -exp(sink - LSE) delta over its rows (rows
// threadIdx.x, + kAuxThreads, ... of each sequence in order), then a tree over the block in
// a fixed order. Rows the mask leaves no key, or with LSE = -inf, add nothing.
__global__ void __launch_bounds__(kAuxThreads) d_sinks_kernel(const KernelParams kp) {
  const kernel::AttentionParams& p = kp.p;
  const int64_t head = blockIdx.x;
  const float sink = kp.f.sinks[head * kp.f.sinks_sh];
  float sum = 0.f;
  for (int64_t b = 0; b < p.batch; ++b) {
    const kernel::MaskRule m = p.mask(b);
    for (int64_t i = threadIdx.x; i < m.s_q; i += kAuxThreads) {
      const float lse = p.lse[kernel::lse_offset(p.q_seq, p.lse_st, b, head, i)];
      if (lse == -INFINITY || m.key_end(i) <= m.key_begin(i)) continue;
      sum -= expf(sink - lse) * kp.delta[delta_index(kp, b, head, i)];
    }
  }
  __shared__ float part[kAuxThreads];
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int n = kAuxThreads / 2; n > 0; n >>= 1) {
    if (int(threadIdx.x) < n) part[threadIdx.x] += part[threadIdx.x + n];
    __syncthreads();
  }
  if (threadIdx.x == 0) kp.f.d_sinks[head * kp.f.d_sinks_sh] = part[0];
}

// Element n (row-major over the dBias view's logical shape) of the view: 0, or the
// accumulator's sum, stored in the view's dtype through its strides.
__global__ void __launch_bounds__(kAuxThreads) dbias_kernel(const KernelParams kp, int64_t count, bool from_accum) {
  const FeatureParams& f = kp.f;
  for (int64_t n = int64_t(blockIdx.x) * kAuxThreads + threadIdx.x; n < count; n += int64_t(gridDim.x) * kAuxThreads) {
    int64_t rest = n, off = 0, acc = 0;
    for (int d = 3; d >= 0; --d) {
      const int64_t idx = rest % f.dbias_shape[d];
      rest /= f.dbias_shape[d];
      off += idx * f.dbias_st[d];
      acc += idx * f.dbias_accum_st[d];
    }
    store_element(f.dbias, off, f.dbias_dtype, from_accum ? f.dbias_accum[acc] : 0.f);
  }
}

cudaError_t launch_dbias(const KernelParams& kp, bool from_accum, cudaStream_t stream) {
  const FeatureParams& f = kp.f;
  const int64_t count = f.dbias_shape[0] * f.dbias_shape[1] * f.dbias_shape[2] * f.dbias_shape[3];
  if (f.dbias == nullptr || count == 0 || (f.dbias_accum != nullptr) != from_accum) return cudaSuccess;
  const int64_t blocks = kernel::min64(kernel::ceil_div(count, kAuxThreads), 65536);
  dbias_kernel<<<unsigned(blocks), kAuxThreads, 0, stream>>>(kp, count, from_accum);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_zero_dbias(const KernelParams& kp, cudaStream_t stream) { return launch_dbias(kp, false, stream); }
cudaError_t launch_convert_dbias(const KernelParams& kp, cudaStream_t stream) { return launch_dbias(kp, true, stream); }

cudaError_t launch_init_max_logit(const KernelParams& kp, cudaStream_t stream) {
  const int64_t n = kp.p.batch * kp.p.heads;
  if (kp.f.max_logit == nullptr || n == 0) return cudaSuccess;
  init_max_logit_kernel<<<unsigned(kernel::ceil_div(n, kAuxThreads)), kAuxThreads, 0, stream>>>(kp);
  return cudaGetLastError();
}

cudaError_t launch_d_sinks(const KernelParams& kp, cudaStream_t stream) {
  if (kp.f.d_sinks == nullptr || kp.p.heads == 0) return cudaSuccess;
  d_sinks_kernel<<<unsigned(kp.p.heads), kAuxThreads, 0, stream>>>(kp);
  return cudaGetLastError();
}

cudaError_t launch_delta(DType t, const KernelParams& kp, cudaStream_t stream) {
  const dim3 grid(unsigned(kernel::ceil_div(kp.p.q_seq.max_len, kDeltaRows)), unsigned(kp.p.heads),
                  unsigned(kp.p.batch));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  if (t == DType::f16)
    delta_kernel<__half><<<grid, kAuxThreads, 0, stream>>>(kp);
  else
    delta_kernel<__nv_bfloat16><<<grid, kAuxThreads, 0, stream>>>(kp);
  return cudaGetLastError();
}

cudaError_t launch_reduce_dkv(DType t, const KernelParams& kp, cudaStream_t stream) {
  const dim3 grid(unsigned(kp.p.kv_seq.max_len), unsigned(kp.p.kv_heads), unsigned(kp.p.batch));
  if (kp.dkv_partial == nullptr || grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  if (t == DType::f16)
    reduce_dkv_kernel<__half><<<grid, kAuxThreads, 0, stream>>>(kp);
  else
    reduce_dkv_kernel<__nv_bfloat16><<<grid, kAuxThreads, 0, stream>>>(kp);
  return cudaGetLastError();
}

cudaError_t launch_convert_dq(DType t, const KernelParams& kp, cudaStream_t stream) {
  const dim3 grid(unsigned(kernel::ceil_div(kp.p.q_seq.max_len * (kp.p.d_qk / 4), kAuxThreads)), unsigned(kp.p.heads),
                  unsigned(kp.p.batch));
  if (kp.dq_accum == nullptr || grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  if (t == DType::f16)
    convert_dq_kernel<__half><<<grid, kAuxThreads, 0, stream>>>(kp);
  else
    convert_dq_kernel<__nv_bfloat16><<<grid, kAuxThreads, 0, stream>>>(kp);
  return cudaGetLastError();
}

cudaError_t launch_zero_padding(const KernelParams& kp, int which, int64_t q_tokens, int64_t kv_tokens,
                                cudaStream_t stream) {
  const kernel::AttentionParams& p = kp.p;
  if (which == 0) return zero_padding(p.o, p.o_st, p.q_seq, p.batch, q_tokens, p.heads, p.d_v, p.lse, p.lse_st, stream);
  if (cudaError_t e = zero_padding(p.dq, p.dq_st, p.q_seq, p.batch, q_tokens, p.heads, p.d_qk, nullptr, {}, stream);
      e != cudaSuccess)
    return e;
  if (cudaError_t e =
          zero_padding(p.dk, p.dk_st, p.kv_seq, p.batch, kv_tokens, p.kv_heads, p.d_qk, nullptr, {}, stream);
      e != cudaSuccess)
    return e;
  return zero_padding(p.dv, p.dv_st, p.kv_seq, p.batch, kv_tokens, p.kv_heads, p.d_v, nullptr, {}, stream);
}

}  // namespace strideattn::cuda_impl
