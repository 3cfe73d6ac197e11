// Kernel of max_logit.hpp: a block per (batch, head) takes the max of its rows' maxima.
#include <cuda_runtime.h>

#include <cmath>

#include "backends/cudnn/max_logit.hpp"

namespace strideattn::detail::cudnn {

namespace {

constexpr int kThreads = 256;

__global__ void reduce_max_logit_kernel(const float* rows, std::int64_t heads, std::int64_t s_q, float* out,
                                        std::int64_t stride_b, std::int64_t stride_h) {
  __shared__ float partial[kThreads];
  const std::int64_t bh = blockIdx.x;  // b * heads + h
  const float* r = rows + bh * s_q;
  float m = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < s_q; i += kThreads) m = fmaxf(m, r[i]);  // fmaxf drops NaN
  partial[threadIdx.x] = m;
  __syncthreads();
  for (int step = kThreads / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + step]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[(bh / heads) * stride_b + (bh % heads) * stride_h] = partial[0];
}

}  // namespace

std::string reduce_max_logit(const float* rows, std::int64_t batch, std::int64_t heads, std::int64_t s_q, float* out,
                             std::int64_t stride_b, std::int64_t stride_h, void* stream) {
  if (batch * heads == 0) return {};
  // (grids up to 2^31 - 1 blocks in x: batch * heads is far below that)
  reduce_max_logit_kernel<<<static_cast<unsigned>(batch * heads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      rows, heads, s_q, out, stride_b, stride_h);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return std::string("reducing the max logit: ") + cudaGetErrorString(e);
}

}  // namespace strideattn::detail::cudnn
