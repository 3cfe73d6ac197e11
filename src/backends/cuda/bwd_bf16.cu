// Backward kernel instantiations (dK/dV pass and dQ pass) for bf16, one per head-dim bucket
// (at d <= 64 and d <= 128 both mma.sync dK/dV kernels, the 8-warp default and the 4-warp
// one; in builds with 90a also the wgmma dK/dV pass of every bucket).
#include "backends/cuda/sm80/backward_kv8.cuh"

namespace strideattn::cuda_impl {

// Arch A's kernels of bucket `bucket`.
template <Arch A>
cudaError_t backward_bf16_of(int bucket, const KernelParams& kp, cudaStream_t stream) {
  switch (bucket) {
    case 64:
      return run_backward<A, __nv_bfloat16, 64>(kp, stream);
    case 128:
      return run_backward<A, __nv_bfloat16, 128>(kp, stream);
    case 256:
      return run_backward<A, __nv_bfloat16, 256>(kp, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launch_backward_bf16(Arch arch, int bucket, const KernelParams& kp, cudaStream_t stream) {
  return arch == Arch::sm90a ? backward_bf16_of<Arch::sm90a>(bucket, kp, stream)
                             : backward_bf16_of<Arch::sm80>(bucket, kp, stream);
}

}  // namespace strideattn::cuda_impl
