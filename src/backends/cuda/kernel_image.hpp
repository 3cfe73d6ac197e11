// Does this build of the `cuda` backend carry code the current GPU can run (kernel_image.cu)?
// The support rule "gpu" asks before `cuda` is chosen, so a GPU the kernels were not built
// for gets a verdict with the reason instead of a "no kernel image" error at launch.
#pragma once

#include <cuda_runtime_api.h>

namespace strideattn::cuda_impl {

// cudaSuccess when the kernels have an image (SASS or PTX to JIT-compile) for the current
// device `device`; the driver's error otherwise (cudaErrorNoKernelImageForDevice). Cached
// per device after the first query.
[[nodiscard]] cudaError_t kernel_image_status(int device);

// The CUDA architectures the kernels were built for, as CMake was given them
// (e.g. "80-real;80-virtual;90a-real").
[[nodiscard]] const char* built_architectures();

}  // namespace strideattn::cuda_impl
