// Backend registry: maps the public Backend enum to the implementations in this build, the
// platform facts used by `auto`, and the ScopedBackendOverride test hook (registry.hpp).
#include "dispatch/registry.hpp"

#include <array>
#include <mutex>

#if defined(STRIDEATTN_REGISTRY_CUDART)
#include <cuda_runtime_api.h>
#endif

namespace strideattn::detail {

namespace {

struct OverrideState {
  std::array<bool, 5> overridden{};
  std::array<BackendImpl*, 5> impl{};
  std::optional<Platform> platform;
};

std::mutex g_mu;
OverrideState g_state;

std::size_t slot(Backend b) { return static_cast<std::size_t>(b); }

Platform query_platform() {
  Platform p;
#if defined(STRIDEATTN_REGISTRY_CUDART)
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
#endif
  return p;
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
}

ScopedBackendOverride::~ScopedBackendOverride() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_state = saved_->state;
  delete saved_;
}

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
    case Backend::reference: return reference_backend();
    case Backend::cpu: return cpu_backend();
    case Backend::cuda: return cuda_backend();
    case Backend::cudnn: return cudnn_backend();
    case Backend::automatic: return nullptr;
  }
  return nullptr;
}

}  // namespace strideattn::detail
