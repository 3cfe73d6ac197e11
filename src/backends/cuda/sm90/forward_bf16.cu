// The bf16 entries of the sm_90a wgmma forward (sm90/forward.cuh): the d <= 128 and d <= 256
// buckets (the d <= 64 one runs the mma.sync forward: sm80/forward_bf16.cu).
#include "backends/cuda/sm90/forward.cuh"

namespace strideattn::cuda_impl {

std::span<const KernelEntry> sm90_forward_entries_bf16() {
  static const KernelEntry entries[] = {
      forward_wgmma_entry<__nv_bfloat16, 128>(),
      forward_wgmma_entry<__nv_bfloat16, 256>(),
  };
  return entries;
}

}  // namespace strideattn::cuda_impl
