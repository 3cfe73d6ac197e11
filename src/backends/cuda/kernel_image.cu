// Whether this binary carries code the current GPU can run: a compute-capability check alone
// would pick `cuda` on a GPU newer than the build's architectures (and, without PTX for it
// to compile, every launch would fail with "no kernel image"). A trivial kernel compiled
// with the same architectures as the attention kernels is asked for its attributes, which
// fails exactly when the driver finds no SASS for the device and no PTX it can JIT-compile.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <string>

#include "backends/cuda/kernel_image.hpp"

namespace strideattn::cuda_impl {

namespace {

__global__ void kernel_image_probe() {}

constexpr int kMaxDevices = 64;
// Per device: 0 unknown, 1 runs, otherwise 2 + the cudaError_t of the query.
std::array<std::atomic<int>, kMaxDevices> g_state{};

}  // namespace

const char* built_architectures() { return STRIDEATTN_CUDA_ARCH_LIST; }

cudaError_t kernel_image_status(int device) {
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    const int s = g_state[std::size_t(device)].load(std::memory_order_relaxed);
    if (s == 1) return cudaSuccess;
    if (s >= 2) return static_cast<cudaError_t>(s - 2);
  }
  cudaFuncAttributes attr{};
  cudaError_t e = cudaFuncGetAttributes(&attr, kernel_image_probe);
  if (e != cudaSuccess) cudaGetLastError();  // not sticky, but leave no error behind
  if (cached) g_state[std::size_t(device)].store(e == cudaSuccess ? 1 : 2 + int(e));
  return e;
}

}  // namespace strideattn::cuda_impl
