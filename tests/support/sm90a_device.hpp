// Whether this test process can run the library's sm_90a kernels: a GPU, a build with sm_90a
// code (the test target defines STRIDEATTN_CUDA_SM90A), and a 9.0 device. The tests of those
// kernels skip with the reason, so they never pass vacuously elsewhere.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "harness/runner.hpp"

namespace strideattn::test_support {

// Why this process cannot run sm_90a kernels ("" when it can); `tests` names them in the
// no-GPU reason.
inline std::string sm90a_unavailable(std::string_view tests) {
  if (!strideattn::harness::gpu_available()) return "no CUDA GPU present: " + std::string(tests) + " need one";
#if !defined(STRIDEATTN_CUDA_SM90A)
  return "this build carries no sm_90a code (CMAKE_CUDA_ARCHITECTURES without 90a)";
#else
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return "cannot query the current device";
  if (major != 9 || minor != 0)
    return "compute capability " + std::to_string(major) + "." + std::to_string(minor) + ", not 9.0";
  return "";
#endif
}

}  // namespace strideattn::test_support
