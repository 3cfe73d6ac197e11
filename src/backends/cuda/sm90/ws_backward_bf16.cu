// The bf16 entries of the warp-specialized sm_90a dK/dV pass (sm90/ws_backward.cuh): the d <= 64
// and d <= 128 buckets.
#include "backends/cuda/sm90/ws_backward.cuh"

namespace strideattn::cuda_impl {

std::span<const KernelEntry> sm90_ws_backward_entries_bf16() {
  static const KernelEntry entries[] = {ws_backward_entry<__nv_bfloat16, 64>(),
                                        ws_backward_entry<__nv_bfloat16, 128>()};
  return entries;
}

}  // namespace strideattn::cuda_impl
