// Forward kernel instantiations for bf16: one per head-dim bucket (64, 128, 256), plus the
// sm_90a wgmma kernel at d <= 128 and d <= 256. Kept in their own translation unit so the
// two build cores compile them in parallel.
#include "backends/cuda/sm90/forward.cuh"

namespace strideattn::cuda_impl {

// Arch A's kernels of bucket `bucket`.
template <Arch A>
cudaError_t forward_bf16_of(int bucket, const KernelParams& kp, cudaStream_t stream) {
  switch (bucket) {
    case 64:
      return forward_pass<A, __nv_bfloat16, 64>(kp, stream);
    case 128:
      return forward_pass<A, __nv_bfloat16, 128>(kp, stream);
    case 256:
      return forward_pass<A, __nv_bfloat16, 256>(kp, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launch_forward_bf16(Arch arch, int bucket, const KernelParams& kp, cudaStream_t stream) {
  return arch == Arch::sm90a ? forward_bf16_of<Arch::sm90a>(bucket, kp, stream)
                             : forward_bf16_of<Arch::sm80>(bucket, kp, stream);
}

}  // namespace strideattn::cuda_impl
