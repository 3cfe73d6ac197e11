// The test hook's state (test_hook.hpp): a pointer to the innermost live forcing.
#include "backends/cuda/test_hook.hpp"

#include <atomic>

#include "dispatch/registry.hpp"

namespace strideattn::cuda_impl {

namespace {

const PlanForcing kNone{};
std::atomic<const PlanForcing*> g_forcing{&kNone};

}  // namespace

const PlanForcing& plan_forcing() { return *g_forcing.load(std::memory_order_acquire); }

// A plan keeps the forcing it was made with: the plan caches drop theirs when the forcing
// changes, so the calls of the scope (and after it) make plans with the forcing in force.
ScopedCudaPlanForcing::ScopedCudaPlanForcing(const PlanForcing& forcing)
    : forcing_(forcing), previous_(g_forcing.exchange(&forcing_, std::memory_order_acq_rel)) {
  detail::invalidate_cached_plans();
}

ScopedCudaPlanForcing::~ScopedCudaPlanForcing() {
  g_forcing.store(previous_, std::memory_order_release);
  detail::invalidate_cached_plans();
}

}  // namespace strideattn::cuda_impl
