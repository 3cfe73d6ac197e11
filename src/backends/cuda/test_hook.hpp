// The test hook of the `cuda` backend: while a ScopedCudaPlanForcing lives, every plan the
// backend makes takes its PlanForcing (plan.hpp), so that a test runs the kernels the
// automatic choice would not take on this GPU (the sm80 kernels on an H200, the 4-warp dK/dV
// pass, the two-pass or single-pass backward, forced group splits) on the same inputs as the
// default ones. A plan keeps the forcing it was made with, so the hook makes the plan caches
// drop their plans when it starts and ends (plans a test holds itself keep theirs). Tests only:
// the library reads no environment variable for these, and the hook is not thread-safe
// against concurrent calls (like ScopedBackendOverride, dispatch/registry.hpp).
#pragma once

#include "backends/cuda/plan.hpp"

namespace strideattn::cuda_impl {

// The forcing of the innermost live ScopedCudaPlanForcing; none (the automatic choice) when
// there is none.
[[nodiscard]] const PlanForcing& plan_forcing();

class ScopedCudaPlanForcing {
 public:
  explicit ScopedCudaPlanForcing(const PlanForcing& forcing);
  ~ScopedCudaPlanForcing();
  ScopedCudaPlanForcing(const ScopedCudaPlanForcing&) = delete;
  ScopedCudaPlanForcing& operator=(const ScopedCudaPlanForcing&) = delete;

 private:
  PlanForcing forcing_;
  const PlanForcing* previous_;
};

}  // namespace strideattn::cuda_impl
