// The f16 entries of the sm_90a wgmma forward (sm90/forward.cuh): the d <= 128 and d <= 256
// buckets (the d <= 64 one runs the mma.sync forward: sm80/forward_f16.cu).
#include "backends/cuda/sm90/forward.cuh"

namespace strideattn::cuda_impl {

std::span<const KernelEntry> sm90_forward_entries_f16() {
  static const KernelEntry entries[] = {
      forward_wgmma_entry<__half, 128>(),
      forward_wgmma_entry<__half, 256>(),
  };
  return entries;
}

}  // namespace strideattn::cuda_impl
