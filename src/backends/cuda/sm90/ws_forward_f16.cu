// The f16 entries of the warp-specialized sm_90a forward (sm90/ws_forward.cuh): the d <= 64,
// d <= 128 and d <= 256 buckets, one per consumer schedule (the plan picks one by the keys and the
// features, plan.cpp; a test may force another: PlanForcing::ws_schedule).
#include "backends/cuda/sm90/ws_forward.cuh"

namespace strideattn::cuda_impl {

std::span<const KernelEntry> sm90_ws_forward_entries_f16() {
  static const KernelEntry entries[] = {
      ws_forward_entry<__half, 64, WsSchedule::plain>(),       ws_forward_entry<__half, 64, WsSchedule::overlapped>(),
      ws_forward_entry<__half, 64, WsSchedule::ping_pong>(),   ws_forward_entry<__half, 128, WsSchedule::plain>(),
      ws_forward_entry<__half, 128, WsSchedule::overlapped>(), ws_forward_entry<__half, 128, WsSchedule::ping_pong>(),
      ws_forward_entry<__half, 256, WsSchedule::plain>(),      ws_forward_entry<__half, 256, WsSchedule::overlapped>(),
      ws_forward_entry<__half, 256, WsSchedule::ping_pong>()};
  return entries;
}

}  // namespace strideattn::cuda_impl
