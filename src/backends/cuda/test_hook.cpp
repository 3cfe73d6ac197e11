// The test hook's state (test_hook.hpp): a pointer to the innermost live forcing.
#include "backends/cuda/test_hook.hpp"

#include <atomic>

namespace strideattn::cuda_impl {

namespace {

const PlanForcing kNone{};
std::atomic<const PlanForcing*> g_forcing{&kNone};

}  // namespace

const PlanForcing& plan_forcing() { return *g_forcing.load(std::memory_order_acquire); }

ScopedCudaPlanForcing::ScopedCudaPlanForcing(const PlanForcing& forcing)
    : forcing_(forcing), previous_(g_forcing.exchange(&forcing_, std::memory_order_acq_rel)) {}

ScopedCudaPlanForcing::~ScopedCudaPlanForcing() { g_forcing.store(previous_, std::memory_order_release); }

}  // namespace strideattn::cuda_impl
