// launch_varlen_tables (varlen_tables.hpp): one thread per sequence.
#include "backends/cuda/varlen_tables.hpp"

namespace strideattn::cuda_impl {

namespace {

__device__ std::int64_t clamp_to(std::int64_t x, std::int64_t lo, std::int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

__global__ void varlen_tables_kernel(CuSeqlensInput in, std::int64_t* tables) {
  const std::int64_t n = in.count;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t oq = clamp_to(in.off_q ? in.off_q[i] : in.cu_q[i], 0, in.q_tokens);
    std::int64_t lq = clamp_to(std::int64_t(in.cu_q[i + 1]) - in.cu_q[i], 0, in.max_q);
    lq = lq < in.q_tokens - oq ? lq : in.q_tokens - oq;
    const std::int64_t okv = clamp_to(in.off_kv ? in.off_kv[i] : in.cu_kv[i], 0, in.kv_tokens);
    std::int64_t lkv = clamp_to(std::int64_t(in.cu_kv[i + 1]) - in.cu_kv[i], 0, in.max_kv);
    lkv = lkv < in.kv_tokens - okv ? lkv : in.kv_tokens - okv;
    tables[i] = lq;
    tables[n + i] = oq;
    tables[2 * n + i] = lkv;
    tables[3 * n + i] = okv;
  }
}

}  // namespace

cudaError_t launch_varlen_tables(const CuSeqlensInput& in, std::int64_t* tables, cudaStream_t stream) {
  if (in.count <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const std::int64_t blocks = (in.count + kThreads - 1) / kThreads;
  varlen_tables_kernel<<<int(blocks < 4096 ? blocks : 4096), kThreads, 0, stream>>>(in, tables);
  return cudaGetLastError();
}

}  // namespace strideattn::cuda_impl
