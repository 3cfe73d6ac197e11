// The interface between the core library (libstrideattn.so) and the GPU backend module
// (libstrideattn_gpu.so, CUDA builds): the module exports one C entry point that fills a
// GpuModule; the core loads the module with dlopen (gpu_loader.cpp) so that the core itself
// needs no CUDA library. Both are built from the same sources in the same build; `abi` and
// `size` catch a module left over from another build.
#pragma once

#include <cstddef>
#include <string>

#include "common/memory_check.hpp"
#include "dispatch/backend.hpp"
#include "dispatch/registry.hpp"

namespace strideattn::detail {

inline constexpr int kGpuModuleAbi = 3;  // changes with BackendImpl's virtual functions

struct GpuModule {
  int abi = 0;
  std::size_t size = 0;  // sizeof(GpuModule) as the module was built
  BackendImpl* cuda = nullptr;
  BackendImpl* cudnn = nullptr;  // nullptr: the module was built without cuDNN
  Platform (*query_platform)() = nullptr;
  // Where a pointer lives (cudaPointerGetAttributes): the memory check of every call.
  PointerKind (*classify_pointer)(const void* ptr) = nullptr;
  // cudaGetDevice (-1 when it fails): the device a plan of device memory is made for.
  int (*current_device)() = nullptr;
};

// Result of one attempt to load a module file: `module` on success, else `error` says which
// file, what failed and dlerror's text.
struct GpuModuleLoad {
  const GpuModule* module = nullptr;
  std::string error;
};

// Loads the module at `path` (a path, or a bare file name for the loader's search). Never
// unloads it again. Tests use this directly; the registry goes through gpu_module().
[[nodiscard]] GpuModuleLoad load_gpu_module(const std::string& path);

// The build's own module, loaded once from the core library's directory (then the loader's
// search path). In CPU-only builds: no module, and the error says so.
[[nodiscard]] const GpuModuleLoad& gpu_module();

}  // namespace strideattn::detail

// The module's entry point: fills *out (whose abi field the caller set to the abi it expects).
#define STRIDEATTN_GPU_MODULE_ENTRY "strideattn_gpu_module_v1"
extern "C" {
using strideattn_gpu_module_fn = void (*)(strideattn::detail::GpuModule* out);
}
