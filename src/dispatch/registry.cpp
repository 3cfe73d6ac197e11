// Backend registry: maps the public Backend enum to the implementations in this build (the
// GPU ones from the run-time loaded GPU module), the platform facts used by `auto`, and the
// ScopedBackendOverride test hook (registry.hpp).
#include "dispatch/registry.hpp"

#include <array>
#include <atomic>
#include <mutex>

#include "dispatch/build_config.hpp"
#include "dispatch/gpu_module.hpp"

namespace strideattn::detail {

namespace {

struct OverrideState {
  std::array<bool, 5> overridden{};
  std::array<BackendImpl*, 5> impl{};
  std::optional<Platform> platform;
};

std::mutex g_mu;
OverrideState g_state;
std::atomic<std::uint64_t> g_generation{0};

std::size_t slot(Backend b) { return static_cast<std::size_t>(b); }

Platform query_platform() {
  // No GPU module (CPU-only build, or it failed to load): no GPU this library can use.
  const GpuModuleLoad& gpu = gpu_module();
  return gpu.module != nullptr ? gpu.module->query_platform() : Platform{};
}

}  // namespace

struct ScopedBackendOverride::Saved {
  OverrideState state;
};

ScopedBackendOverride::ScopedBackendOverride(std::vector<std::pair<Backend, BackendImpl*>> impls,
                                             std::optional<Platform> fake_platform)
    : saved_(new Saved) {
  std::lock_guard<std::mutex> lock(g_mu);
  saved_->state = g_state;
  for (auto [b, impl] : impls) {
    g_state.overridden[slot(b)] = true;
    g_state.impl[slot(b)] = impl;
  }
  if (fake_platform) g_state.platform = fake_platform;
  g_generation.fetch_add(1);
}

ScopedBackendOverride::~ScopedBackendOverride() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_state = saved_->state;
  g_generation.fetch_add(1);
  delete saved_;
}

std::uint64_t registry_generation() { return g_generation.load(std::memory_order_acquire); }
void invalidate_cached_plans() { g_generation.fetch_add(1); }

Platform platform() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_state.platform) return *g_state.platform;
  }
  static const Platform real = query_platform();
  return real;
}

BackendImpl* backend_impl(Backend backend) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_state.overridden[slot(backend)]) return g_state.impl[slot(backend)];
  }
  switch (backend) {
    case Backend::reference:
      return reference_backend();
    case Backend::cpu:
      return cpu_backend();
    case Backend::cuda:
      return gpu_module().module ? gpu_module().module->cuda : nullptr;
    case Backend::cudnn:
      return gpu_module().module ? gpu_module().module->cudnn : nullptr;
    case Backend::automatic:
      return nullptr;
  }
  return nullptr;
}

std::string missing_backend_reason(Backend backend) {
  const std::string name(to_string(backend));
  if (backend != Backend::cuda && backend != Backend::cudnn) return "backend '" + name + "' is not part of this build";
  const GpuModuleLoad& gpu = gpu_module();
  if (gpu.module == nullptr) {
    if (std::string(STRIDEATTN_GPU_MODULE_FILE).empty())
      return "backend '" + name + "' is not part of this build (built without CUDA: " + STRIDEATTN_CUDA_NOTE + ")";
    return "backend '" + name + "' is unavailable: " + gpu.error;
  }
  if (backend == Backend::cudnn && !std::string(STRIDEATTN_CUDNN_NOTE).empty())
    return "backend 'cudnn' is not part of this build (the GPU module was built without it: " +
           std::string(STRIDEATTN_CUDNN_NOTE) + ")";
  return "backend '" + name + "' is not part of this build";
}

}  // namespace strideattn::detail
