// The bf16 entries of the mma.sync backward passes: the sm80 dK/dV passes (the 8-warp one at
// d <= 64 and d <= 128, then the 4-warp one at d <= 128 for GPUs whose shared memory is too
// small for it, and at d <= 256), and the dQ pass of the two-pass backward for both
// architectures (sm90/backward_bf16.cu has the sm90a dK/dV pass).
#include "backends/cuda/sm80/backward_kv.cuh"
#include "backends/cuda/sm80/backward_kv8.cuh"
#include "backends/cuda/sm80/backward_q.cuh"

namespace strideattn::cuda_impl {

std::span<const KernelEntry> sm80_backward_entries_bf16() {
  static const KernelEntry entries[] = {
      kv8_entry<Arch::sm80, __nv_bfloat16, 64>(), kv8_entry<Arch::sm80, __nv_bfloat16, 128>(),
      kv_entry<Arch::sm80, __nv_bfloat16, 128>(), kv_entry<Arch::sm80, __nv_bfloat16, 256>(),
      q_entry<Arch::sm80, __nv_bfloat16, 64>(),   q_entry<Arch::sm80, __nv_bfloat16, 128>(),
      q_entry<Arch::sm80, __nv_bfloat16, 256>(),  q_entry<Arch::sm90a, __nv_bfloat16, 64>(),
      q_entry<Arch::sm90a, __nv_bfloat16, 128>(), q_entry<Arch::sm90a, __nv_bfloat16, 256>(),
  };
  return entries;
}

}  // namespace strideattn::cuda_impl
