// Kernels of fixup.hpp: grid-stride loops over the few elements cuDNN does not handle.
#include <cuda_runtime.h>

#include <cmath>

#include "backends/cudnn/fixup.hpp"

namespace strideattn::detail::cudnn {

namespace {

constexpr int kThreads = 256;

int blocks_for(std::int64_t n) {
  std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

std::string last_error(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return std::string(what) + ": " + cudaGetErrorString(e);
}

__global__ void zero_tokens_kernel(unsigned short* base, std::int64_t stride_s, std::int64_t stride_h,
                                   std::int64_t heads, std::int64_t d, const std::int64_t* tokens, std::int64_t n) {
  const std::int64_t total = n * heads * d;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t e = i % d;
    const std::int64_t h = (i / d) % heads;
    const std::int64_t t = tokens[i / (d * heads)];
    base[t * stride_s + h * stride_h + e] = 0;  // +0.0 in f16 and bf16
  }
}

__global__ void lse_fill_kernel(float* lse, std::int64_t stride_h, std::int64_t stride_s, std::int64_t heads,
                                const std::int64_t* tokens, std::int64_t n) {
  const std::int64_t total = n * heads;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t h = i % heads;
    const std::int64_t t = tokens[i / heads];
    lse[h * stride_h + t * stride_s] = -INFINITY;
  }
}

__global__ void lse_copy_kernel(LseCopy c, bool packed_to_user) {
  const std::int64_t total = c.batch * c.heads * c.s_max;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t row = i % c.s_max;
    const std::int64_t h = (i / c.s_max) % c.heads;
    const std::int64_t b = i / (c.s_max * c.heads);
    if (c.lens && row >= c.lens[b]) continue;
    const std::int64_t user = (c.offsets ? 0 : b) * c.user_stride_b + h * c.user_stride_h +
                              ((c.offsets ? c.offsets[b] : 0) + row) * c.user_stride_s;
    if (packed_to_user)
      c.user[user] = c.packed[i];
    else
      c.packed[i] = c.user[user];
  }
}

}  // namespace

std::string zero_tokens(void* base, std::int64_t stride_s, std::int64_t stride_h, std::int64_t heads, std::int64_t d,
                        const std::int64_t* tokens, std::int64_t n_tokens, void* stream) {
  if (n_tokens <= 0) return {};
  zero_tokens_kernel<<<blocks_for(n_tokens * heads * d), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<unsigned short*>(base), stride_s, stride_h, heads, d, tokens, n_tokens);
  return last_error("zero_tokens kernel");
}

std::string lse_fill_tokens(float* lse, std::int64_t stride_h, std::int64_t stride_s, std::int64_t heads,
                            const std::int64_t* tokens, std::int64_t n_tokens, void* stream) {
  if (n_tokens <= 0) return {};
  lse_fill_kernel<<<blocks_for(n_tokens * heads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      lse, stride_h, stride_s, heads, tokens, n_tokens);
  return last_error("lse_fill kernel");
}

std::string lse_copy(const LseCopy& c, bool packed_to_user, void* stream) {
  const std::int64_t total = c.batch * c.heads * c.s_max;
  if (total <= 0) return {};
  lse_copy_kernel<<<blocks_for(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(c, packed_to_user);
  return last_error("lse_copy kernel");
}

}  // namespace strideattn::detail::cudnn
