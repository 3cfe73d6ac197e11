// Loads the GPU backend module (gpu_module.hpp) at run time: from the directory the core
// library itself was loaded from (dladdr), else by file name through the loader's search
// path. Every failure becomes a sentence naming the file and dlerror's text, which the
// registry turns into the cuda and cudnn verdicts.
#include <dlfcn.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "dispatch/build_config.hpp"
#include "dispatch/gpu_module.hpp"

namespace strideattn::detail {

namespace {

std::string last_dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlerror";
}

// Directory of the shared object holding this function (the core), with a trailing '/';
// "" when dladdr cannot tell.
std::string core_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&core_directory), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string file = info.dli_fname;
  const auto slash = file.rfind('/');
  return slash == std::string::npos ? "" : file.substr(0, slash + 1);
}

GpuModuleLoad load_build_module() {
  GpuModuleLoad out;
  const std::string file = STRIDEATTN_GPU_MODULE_FILE;
  if (file.empty()) {
    out.error = std::string("this build has no GPU module (") + STRIDEATTN_CUDA_NOTE + ")";
    return out;
  }
  const std::string dir = core_directory();
  if (!dir.empty()) {
    out = load_gpu_module(dir + file);
    if (out.module != nullptr) return out;
  }
  // Not beside the core (a relocated install): the loader's search path, LD_LIBRARY_PATH
  // included. The first error is kept: it names the file where the module belongs.
  GpuModuleLoad searched = load_gpu_module(file);
  if (searched.module != nullptr || dir.empty()) return searched;
  if (searched.error != out.error) out.error += "; by name: " + searched.error;
  return out;
}

}  // namespace

GpuModuleLoad load_gpu_module(const std::string& path) {
  GpuModuleLoad out;
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    out.error = "the GPU backend module " + path + " could not be loaded: " + last_dl_error();
    return out;
  }
  dlerror();
  void* sym = dlsym(handle, STRIDEATTN_GPU_MODULE_ENTRY);
  if (sym == nullptr) {
    out.error = "the GPU backend module " + path + " has no entry point " + STRIDEATTN_GPU_MODULE_ENTRY + ": " +
                last_dl_error();
    dlclose(handle);
    return out;
  }
  auto mod = std::make_unique<GpuModule>();
  mod->abi = kGpuModuleAbi;
  reinterpret_cast<strideattn_gpu_module_fn>(sym)(mod.get());
  if (mod->abi != kGpuModuleAbi || mod->size != sizeof(GpuModule) || mod->cuda == nullptr ||
      mod->query_platform == nullptr) {
    out.error = "the GPU backend module " + path + " is from another build (interface " + std::to_string(mod->abi) +
                ", " + std::to_string(mod->size) + " bytes; this library expects " + std::to_string(kGpuModuleAbi) +
                ", " + std::to_string(sizeof(GpuModule)) + ")";
    return out;
  }
  // The module stays loaded for the life of the process (its backends hold GPU state and
  // caches), and so does its table.
  static std::mutex mu;
  static std::vector<std::unique_ptr<GpuModule>> kept;
  std::lock_guard<std::mutex> lock(mu);
  out.module = kept.emplace_back(std::move(mod)).get();
  return out;
}

const GpuModuleLoad& gpu_module() {
  static const GpuModuleLoad loaded = [] {
    GpuModuleLoad l = load_build_module();
    log_line(LogLevel::debug, l.module != nullptr ? std::string("GPU backend module loaded") : l.error);
    return l;
  }();
  return loaded;
}

}  // namespace strideattn::detail
