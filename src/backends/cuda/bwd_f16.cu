// Backward kernel instantiations (dK/dV pass and dQ pass) for f16, one per head-dim bucket
// (at d <= 64 and d <= 128 both mma.sync dK/dV kernels, the 8-warp default and the 4-warp
// one; in builds with 90a also the wgmma dK/dV pass of every bucket).
#include "backends/cuda/sm80/backward_kv8.cuh"

namespace strideattn::cuda_impl {

cudaError_t launch_backward_f16(int bucket, const KernelParams& kp, cudaStream_t stream) {
  switch (bucket) {
    case 64:
      return run_backward<__half, 64>(kp, stream);
    case 128:
      return run_backward<__half, 128>(kp, stream);
    case 256:
      return run_backward<__half, 256>(kp, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace strideattn::cuda_impl
