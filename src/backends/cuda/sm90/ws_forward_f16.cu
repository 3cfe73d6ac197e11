// The f16 entry of the warp-specialized sm_90a forward (sm90/ws_forward.cuh): the d <= 128
// bucket, plain and overlapped (the plan's choice; a test may force the plain one:
// PlanForcing::ws_overlap).
#include "backends/cuda/sm90/ws_forward.cuh"

namespace strideattn::cuda_impl {

std::span<const KernelEntry> sm90_ws_forward_entries_f16() {
  static const KernelEntry entries[] = {ws_forward_entry<__half, 128, false>(), ws_forward_entry<__half, 128, true>()};
  return entries;
}

}  // namespace strideattn::cuda_impl
