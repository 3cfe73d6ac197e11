// Entry point of the GPU backend module (libstrideattn_gpu.so): hands the core library its
// `cuda` and `cudnn` backends and the CUDA device query `auto` classifies problems by
// (dispatch/gpu_module.hpp). The only file of the module the core calls into by name.
#include <cuda_runtime_api.h>

#include "common/memory_check.hpp"
#include "dispatch/gpu_module.hpp"

namespace strideattn::detail {

namespace {

Platform query_platform() {
  Platform p;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the error so later CUDA calls are not confused by it
    return p;
  }
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return p;
  }
  p.gpu = true;
  p.sm = prop.major * 10 + prop.minor;
  p.gpu_name = prop.name;
  return p;
}

int current_device() {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return dev;
}

}  // namespace

#if !defined(STRIDEATTN_WITH_CUDNN)
// Built without cuDNN: the core reports the configure step's reason (build_config.hpp).
BackendImpl* cudnn_backend() { return nullptr; }
#endif

}  // namespace strideattn::detail

extern "C" __attribute__((visibility("default"))) void strideattn_gpu_module_v1(strideattn::detail::GpuModule* out) {
  using namespace strideattn::detail;
  // abi and size sit at the same offsets in every version: answer them first, and fill in
  // the rest only for the interface this module implements.
  const bool match = out->abi == kGpuModuleAbi;
  out->abi = kGpuModuleAbi;
  out->size = sizeof(GpuModule);
  if (!match) return;
  out->cuda = cuda_backend();
  out->cudnn = cudnn_backend();
  out->query_platform = &query_platform;
  out->classify_pointer = &classify_pointer;
  out->current_device = &current_device;
}
