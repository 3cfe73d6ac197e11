// The backend registry's seams: the platform facts `auto` classifies problems by (is there a
// GPU, which compute capability), and a test hook that installs fake backends and a fake
// platform so the selection rules and log lines can be tested on a CPU-only machine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/backend.hpp"

namespace strideattn::detail {

struct Platform {
  bool gpu = false;      // a CUDA device is usable
  int sm = 0;            // compute capability major*10 + minor of the current device
  std::string gpu_name;  // e.g. "NVIDIA H200"
};

// The current device's facts (queried once; CPU-only builds report no GPU), or the faked
// platform of a live ScopedBackendOverride.
[[nodiscard]] Platform platform();

// While alive, backend_impl() returns the given implementations for the listed backends
// (nullptr means "not part of this build") and platform() returns `fake_platform` when set.
// Overrides nest: destruction restores what was there before. Tests only; not thread-safe
// against concurrent API calls.
// Why backend_impl(backend) is nullptr: not built (the configure step's reason), or the GPU
// module failed to load (naming the file and dlerror's text).
[[nodiscard]] std::string missing_backend_reason(Backend backend);

// Changes with every ScopedBackendOverride made or undone: caches of plans (which point at
// backends) drop what they hold when it moves.
[[nodiscard]] std::uint64_t registry_generation();
// Moves registry_generation without swapping a backend: for a test hook that changes how a
// backend plans (ScopedCudaPlanForcing), so that no cache serves a plan made before it.
void invalidate_cached_plans();

class ScopedBackendOverride {
 public:
  explicit ScopedBackendOverride(std::vector<std::pair<Backend, BackendImpl*>> impls,
                                 std::optional<Platform> fake_platform = std::nullopt);
  ~ScopedBackendOverride();
  ScopedBackendOverride(const ScopedBackendOverride&) = delete;
  ScopedBackendOverride& operator=(const ScopedBackendOverride&) = delete;

 private:
  struct Saved;
  Saved* saved_;
};

}  // namespace strideattn::detail
