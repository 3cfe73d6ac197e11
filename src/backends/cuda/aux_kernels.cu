// Small memory-bound kernels around the attention passes: the backward pre-pass
// delta = rowsum(dO * O), the sum of split dK/dV partials (GQA/MQA), the conversion of the
// single-pass backward's fp32 dQ accumulator into dQ, and, for varlen
// problems, zeroing the output tokens that belong to no sequence (padding) so every element
// of an output view is written. Also the dtype dispatch of the main launches.
#include <cmath>

#include "backends/cuda/device_primitives.cuh"
#include "backends/cuda/kernel_params.hpp"

namespace strideattn::cuda_impl {

namespace {

constexpr int kAuxThreads = 128;

// One warp per (sequence, head, token) row: delta = sum_d dO[d] * O[d] in fp32.
template <class T>
__global__ void __launch_bounds__(kAuxThreads) delta_kernel(const KernelParams kp) {
  const kernel::AttentionParams& p = kp.p;
  const int64_t batch = blockIdx.z, head = blockIdx.y;
  const int64_t row = int64_t(blockIdx.x) * (kAuxThreads / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= p.q_seq.length(batch)) return;
  const auto* o = static_cast<const uint16_t*>(p.o) +
                  kernel::row_offset(p.q_seq.span(p.o_st, batch), p.o_st, row, head);
  const auto* d_o = static_cast<const uint16_t*>(p.d_o) +
                    kernel::row_offset(p.q_seq.span(p.do_st, batch), p.do_st, row, head);
  float sum = 0.f;
  for (int64_t d = lane; d < p.d_v; d += 32)
    sum += ElementTraits<T>::to_float(o[d]) * ElementTraits<T>::to_float(d_o[d]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) kp.delta[delta_index(kp, batch, head, row)] = sum;
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
  auto* dk = static_cast<uint16_t*>(p.dk) +
             kernel::row_offset(p.kv_seq.span(p.dk_st, batch), p.dk_st, key, kv_head);
  auto* dv = static_cast<uint16_t*>(p.dv) +
             kernel::row_offset(p.kv_seq.span(p.dv_st, batch), p.dv_st, key, kv_head);
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

// One block per (query token, head, sequence): dQ = scale * dq_accum row, stored through the
// dQ strides; only tokens of the sequence are touched.
template <class T>
__global__ void __launch_bounds__(kAuxThreads) convert_dq_kernel(const KernelParams kp) {
  const kernel::AttentionParams& p = kp.p;
  const int64_t batch = blockIdx.z, head = blockIdx.y, token = blockIdx.x;
  if (token >= p.q_seq.length(batch)) return;
  const float* acc = kp.dq_accum + delta_index(kp, batch, head, token) * p.d_qk;
  auto* dq = static_cast<uint16_t*>(p.dq) +
             kernel::row_offset(p.q_seq.span(p.dq_st, batch), p.dq_st, token, head);
  for (int64_t c = threadIdx.x; c < p.d_qk; c += blockDim.x)
    dq[c] = ElementTraits<T>::from_float(acc[c] * p.scale);
}

// Zero every (token, head, dim) of a [1, tokens, heads, d] view whose token lies in no
// sequence of `seq`; LSE (optional, [1, heads, tokens]) gets -inf there.
__global__ void __launch_bounds__(kAuxThreads)
    zero_padding_kernel(uint16_t* base, kernel::Strides st, kernel::SequenceTable seq,
                        int64_t batch, int64_t tokens, int64_t heads, int64_t d, float* lse,
                        kernel::LseStrides lse_st) {
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

cudaError_t zero_padding(void* base, const kernel::Strides& st, const kernel::SequenceTable& seq,
                         int64_t batch, int64_t tokens, int64_t heads, int64_t d, float* lse,
                         const kernel::LseStrides& lse_st, cudaStream_t stream) {
  if (tokens <= 0 || base == nullptr) return cudaSuccess;
  const unsigned blocks = unsigned(tokens < 65536 ? tokens : 65536);
  zero_padding_kernel<<<blocks, kAuxThreads, 0, stream>>>(static_cast<uint16_t*>(base), st, seq,
                                                          batch, tokens, heads, d, lse, lse_st);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_delta(ElemType t, const KernelParams& kp, cudaStream_t stream) {
  const dim3 grid(unsigned(kernel::ceil_div(kp.p.q_seq.max_len, kAuxThreads / 32)),
                  unsigned(kp.p.heads), unsigned(kp.p.batch));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  if (t == ElemType::f16)
    delta_kernel<__half><<<grid, kAuxThreads, 0, stream>>>(kp);
  else
    delta_kernel<__nv_bfloat16><<<grid, kAuxThreads, 0, stream>>>(kp);
  return cudaGetLastError();
}

cudaError_t launch_reduce_dkv(ElemType t, const KernelParams& kp, cudaStream_t stream) {
  const dim3 grid(unsigned(kp.p.kv_seq.max_len), unsigned(kp.p.kv_heads), unsigned(kp.p.batch));
  if (kp.dkv_partial == nullptr || grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  if (t == ElemType::f16)
    reduce_dkv_kernel<__half><<<grid, kAuxThreads, 0, stream>>>(kp);
  else
    reduce_dkv_kernel<__nv_bfloat16><<<grid, kAuxThreads, 0, stream>>>(kp);
  return cudaGetLastError();
}

cudaError_t launch_convert_dq(ElemType t, const KernelParams& kp, cudaStream_t stream) {
  const dim3 grid(unsigned(kp.p.q_seq.max_len), unsigned(kp.p.heads), unsigned(kp.p.batch));
  if (kp.dq_accum == nullptr || grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  if (t == ElemType::f16)
    convert_dq_kernel<__half><<<grid, kAuxThreads, 0, stream>>>(kp);
  else
    convert_dq_kernel<__nv_bfloat16><<<grid, kAuxThreads, 0, stream>>>(kp);
  return cudaGetLastError();
}

cudaError_t launch_zero_padding(const KernelParams& kp, int which, int64_t q_tokens,
                                int64_t kv_tokens, cudaStream_t stream) {
  const kernel::AttentionParams& p = kp.p;
  if (which == 0)
    return zero_padding(p.o, p.o_st, p.q_seq, p.batch, q_tokens, p.heads, p.d_v, p.lse, p.lse_st,
                        stream);
  if (cudaError_t e = zero_padding(p.dq, p.dq_st, p.q_seq, p.batch, q_tokens, p.heads, p.d_qk,
                                   nullptr, {}, stream);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = zero_padding(p.dk, p.dk_st, p.kv_seq, p.batch, kv_tokens, p.kv_heads, p.d_qk,
                                   nullptr, {}, stream);
      e != cudaSuccess)
    return e;
  return zero_padding(p.dv, p.dv_st, p.kv_seq, p.batch, kv_tokens, p.kv_heads, p.d_v, nullptr, {},
                      stream);
}

cudaError_t launch_forward(ElemType t, int bucket, const KernelParams& kp, cudaStream_t stream) {
  return t == ElemType::f16 ? launch_forward_f16(bucket, kp, stream)
                            : launch_forward_bf16(bucket, kp, stream);
}

cudaError_t launch_backward(ElemType t, int bucket, const KernelParams& kp, cudaStream_t stream) {
  return t == ElemType::f16 ? launch_backward_f16(bucket, kp, stream)
                            : launch_backward_bf16(bucket, kp, stream);
}

}  // namespace strideattn::cuda_impl
