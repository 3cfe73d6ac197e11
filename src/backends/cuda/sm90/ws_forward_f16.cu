// The f16 entries of the warp-specialized sm_90a forward (sm90/ws_forward.cuh): the d <= 128
// bucket, one per consumer schedule (the plan's choice is overlapped; a test may force
// another: PlanForcing::ws_schedule).
#include "backends/cuda/sm90/ws_forward.cuh"

namespace strideattn::cuda_impl {

std::span<const KernelEntry> sm90_ws_forward_entries_f16() {
  static const KernelEntry entries[] = {ws_forward_entry<__half, 128, WsSchedule::plain>(),
                                        ws_forward_entry<__half, 128, WsSchedule::overlapped>(),
                                        ws_forward_entry<__half, 128, WsSchedule::ping_pong>()};
  return entries;
}

}  // namespace strideattn::cuda_impl
