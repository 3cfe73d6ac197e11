// How the attention kernels of the `cuda` backend are launched: a grid of one CTA per block of
// queries (forward, dQ pass) or per block of keys (dK/dV passes), times heads and sequences,
// and the dynamic shared-memory opt-in every kernel needs before its launch. Host code only.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/common/kernel_params.hpp"

namespace strideattn::cuda_impl {

// (query block, head, sequence): Br queries per CTA.
inline dim3 query_block_grid(const KernelParams& kp, int br) {
  return dim3(unsigned(kernel::ceil_div(kp.p.q_seq.max_len, br)), unsigned(kp.p.heads), unsigned(kp.p.batch));
}

// (key block [x head-dim split], KV head x group split, sequence): Bc keys per CTA.
inline dim3 key_block_grid(const KernelParams& kp, int bc, int dim_splits = 1) {
  return dim3(unsigned(kernel::ceil_div(kp.p.kv_seq.max_len, bc) * dim_splits),
              unsigned(kp.p.kv_heads * kp.group_splits), unsigned(kp.p.batch));
}

// Grants kernel `fn` `smem` bytes of dynamic shared memory and launches it with kp (nothing
// to launch when the grid is empty: a zero-length dimension).
template <class Kernel>
cudaError_t launch_kernel(Kernel* fn, dim3 grid, int threads, int smem, const KernelParams& kp, cudaStream_t stream) {
  if (cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); e != cudaSuccess)
    return e;
  if (grid.x && grid.y && grid.z) fn<<<grid, threads, smem, stream>>>(kp);
  return cudaGetLastError();
}

}  // namespace strideattn::cuda_impl
