// The f16 entries of the sm_90a wgmma dK/dV pass (sm90/backward.cuh), every head-dim bucket.
#include "backends/cuda/sm90/backward.cuh"

namespace strideattn::cuda_impl {

std::span<const KernelEntry> sm90_backward_entries_f16() {
  static const KernelEntry entries[] = {
      kv_wgmma_entry<__half, 64>(),
      kv_wgmma_entry<__half, 128>(),
      kv_wgmma_entry<__half, 256>(),
  };
  return entries;
}

}  // namespace strideattn::cuda_impl
