// The bf16 entries of the mma.sync forward (sm80/forward.cuh): the sm80 kernels of every
// head-dim bucket, and the sm90a one of the d <= 64 bucket (sm90/forward_bf16.cu has the other
// sm90a buckets). One translation unit per dtype and direction, so that the two build cores
// compile them in parallel.
#include "backends/cuda/sm80/forward.cuh"

namespace strideattn::cuda_impl {

std::span<const KernelEntry> sm80_forward_entries_bf16() {
  static const KernelEntry entries[] = {
      forward_entry<Arch::sm80, __nv_bfloat16, 64>(),
      forward_entry<Arch::sm80, __nv_bfloat16, 128>(),
      forward_entry<Arch::sm80, __nv_bfloat16, 256>(),
      forward_entry<Arch::sm90a, __nv_bfloat16, 64>(),
  };
  return entries;
}

}  // namespace strideattn::cuda_impl
