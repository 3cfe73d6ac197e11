// Scratch memory for a GPU call whose caller gave no workspace, shared by the cuda and cudnn
// backends: stream-ordered, from a memory pool of the library's own per device that keeps what
// it frees (release threshold: never). The device's default pool hands its free memory back to
// the driver at every synchronise, so a call after a synchronise allocated anew (measured on an
// H200: 160-170 us of GPU time per forward in bench/host_overhead.py's ext columns); from the
// own pool a repeated call reuses its blocks. The caller's default pool is left untouched.
// While the stream is being captured the allocation is cudaMallocAsync's, which a graph owns.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace strideattn::detail {

// `bytes` on `stream` (device: the current one); cudaFreeAsync releases it.
[[nodiscard]] cudaError_t stream_workspace_alloc(void** ptr, std::size_t bytes, cudaStream_t stream);

}  // namespace strideattn::detail
