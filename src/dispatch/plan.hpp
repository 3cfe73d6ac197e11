// A plan's state (strideattn.hpp, "plans"): the validated problem, the chosen backend with its
// reason, the backend's prepared call, the workspace size and the per-run checks, made once;
// and the run, which binds one run's pointers into a copy of the problem, checks them and
// hands it to the prepared call. PlanAccess is how the public plan classes and the plan cache
// reach it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "dispatch/backend.hpp"
#include "problem/problem.hpp"
#include "problem/run_check.hpp"

namespace strideattn::detail {

struct PlanState {
  Problem problem;  // validated; its pointers are the make-time ones (null: given at run time)
  Backend backend = Backend::reference;
  std::string why;                               // the selection's line, logged at info on every run
  std::unique_ptr<const PreparedCall> prepared;  // null when there is nothing to run (no heads)
  std::size_t workspace = 0;
  RunChecks checks;
  int device = -1;  // device-memory plans: the CUDA device current when the plan was made
  // The pointers of the last run whose memory kind was checked, per slot (run_plan): a run
  // with the same pointer is not asked of the CUDA runtime again.
  mutable std::array<std::atomic<std::uintptr_t>, 16> memory_seen{};
};

struct PlanAccess {
  // Makes a plan; `mode` bound: the arguments' pointers are a call's (forward(), the caches).
  // `memory_kinds` false: the pointers are not asked where they live (workspace_size, whose
  // caller may pass stand-in addresses that only place the views: JAX's trace-time query);
  // every run still checks its own (check_run_memory).
  static Status make(const ForwardArgs& args, Pointers mode, std::shared_ptr<const PlanState>* out,
                     bool memory_kinds = true);
  static Status make(const BackwardArgs& args, Pointers mode, std::shared_ptr<const PlanState>* out,
                     bool memory_kinds = true);
  static const std::shared_ptr<const PlanState>& state(const PlanInfo& plan) { return plan.state_; }
  static void set(PlanInfo* plan, std::shared_ptr<const PlanState> state) { plan->state_ = std::move(state); }
};

// The plan cache's plans for a size query (workspace_size): as PlanCache::get, but a plan made
// on a miss does not ask where the pointers live (they may be stand-ins that only place the
// views: strideattn.jax asks at trace time); its runs check them.
struct PlanCacheAccess {
  static Status get_for_size(PlanCache& cache, const ForwardArgs& args, std::shared_ptr<const PlanState>* out);
  static Status get_for_size(PlanCache& cache, const BackwardArgs& args, std::shared_ptr<const PlanState>* out);
};

[[nodiscard]] Status run_plan(const PlanState& plan, const ForwardRun& run);
[[nodiscard]] Status run_plan(const PlanState& plan, const BackwardRun& run);

// The run of a call's arguments (their pointers, stream, workspace, arrays, cancel flag).
[[nodiscard]] ForwardRun run_of(const ForwardArgs& args);
[[nodiscard]] BackwardRun run_of(const BackwardArgs& args);

// cudaGetDevice through the GPU module; -1 without one.
[[nodiscard]] int current_device();

}  // namespace strideattn::detail
