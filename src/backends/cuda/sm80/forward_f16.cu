// The f16 entries of the mma.sync forward (sm80/forward.cuh): the sm80 kernels of every
// head-dim bucket, and the sm90a one of the d <= 64 bucket (sm90/forward_f16.cu has the other
// sm90a buckets). One translation unit per dtype and direction, so that the two build cores
// compile them in parallel.
#include "backends/cuda/sm80/forward.cuh"

namespace strideattn::cuda_impl {

std::span<const KernelEntry> sm80_forward_entries_f16() {
  static const KernelEntry entries[] = {
      forward_entry<Arch::sm80, __half, 64>(),
      forward_entry<Arch::sm80, __half, 128>(),
      forward_entry<Arch::sm80, __half, 256>(),
      forward_entry<Arch::sm90a, __half, 64>(),
  };
  return entries;
}

}  // namespace strideattn::cuda_impl
