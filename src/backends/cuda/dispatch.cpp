// The kernel table (dispatch.hpp): the entries of the kernels' translation units, gathered
// once, and the lookup by (dtype, architecture, bucket, pass) that make_cuda_plan uses.
#include "backends/cuda/dispatch.hpp"

#include <vector>

namespace strideattn::cuda_impl {

std::span<const KernelEntry> kernel_table() {
  static const std::vector<KernelEntry> table = [] {
    std::vector<KernelEntry> all;
    for (std::span<const KernelEntry> part :
         {sm80_forward_entries_f16(), sm80_forward_entries_bf16(), sm90_forward_entries_f16(),
          sm90_forward_entries_bf16(), sm80_backward_entries_f16(), sm80_backward_entries_bf16(),
          sm90_backward_entries_f16(), sm90_backward_entries_bf16(), sm90_ws_forward_entries_f16(),
          sm90_ws_forward_entries_bf16(), sm90_ws_backward_entries_f16(), sm90_ws_backward_entries_bf16()})
      all.insert(all.end(), part.begin(), part.end());
    return all;
  }();
  return table;
}

const KernelEntry* find_kernel(DType dtype, Arch arch, int bucket, Pass pass, int smem_limit, int* smem_needed) {
  int least = 0;
  for (const KernelEntry& e : kernel_table()) {
    if (e.tma || e.dtype != dtype || e.arch != arch || e.bucket != bucket || e.pass != pass) continue;
    if (e.smem_bytes <= smem_limit) return &e;
    if (least == 0 || e.smem_bytes < least) least = e.smem_bytes;
  }
  if (smem_needed != nullptr) *smem_needed = least;
  return nullptr;
}

const KernelEntry* find_ws_forward(DType dtype, int bucket, WsSchedule schedule) {
  for (const KernelEntry& e : kernel_table())
    if (e.tma && e.pass == Pass::forward && e.dtype == dtype && e.bucket == bucket && e.ws_schedule == schedule)
      return &e;
  return nullptr;
}

const KernelEntry* find_ws_backward(DType dtype, int bucket) {
  for (const KernelEntry& e : kernel_table())
    if (e.tma && e.pass == Pass::dkdv && e.dtype == dtype && e.bucket == bucket) return &e;
  return nullptr;
}

}  // namespace strideattn::cuda_impl
