// Public C++ entry points: the per-call functions (a plan from the default plan cache, run with
// the call's pointers: dispatch/plan_cache.cpp), and `explain`.
#include <exception>
#include <type_traits>

#include "common/log.hpp"
#include "dispatch/backend.hpp"
#include "dispatch/plan.hpp"
#include "dispatch/select.hpp"
#include "problem/layout.hpp"
#include "problem/problem.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn {

std::string_view to_string(StatusCode code) {
  switch (code) {
    case StatusCode::ok:
      return "ok";
    case StatusCode::invalid_argument:
      return "invalid_argument";
    case StatusCode::unsupported:
      return "unsupported";
    case StatusCode::backend_error:
      return "backend_error";
    case StatusCode::cancelled:
      return "cancelled";
    case StatusCode::internal:
      return "internal";
  }
  return "unknown";
}

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::f32:
      return "f32";
  }
  return "unknown";
}

std::size_t size_of(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

std::string_view to_string(MaskKind mask) {
  switch (mask) {
    case MaskKind::none:
      return "none";
    case MaskKind::causal:
      return "causal";
    case MaskKind::causal_bottom_right:
      return "causal_bottom_right";
  }
  return "unknown";
}

std::optional<MaskKind> mask_from_string(std::string_view name) {
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right})
    if (name == to_string(m)) return m;
  if (name == "no_mask") return MaskKind::none;
  if (name == "top_left" || name == "causal_top_left") return MaskKind::causal;
  if (name == "bottom_right" || name == "causal-bottom-right") return MaskKind::causal_bottom_right;
  return std::nullopt;
}

std::string_view to_string(BiasType type) {
  switch (type) {
    case BiasType::none:
      return "none";
    case BiasType::post_scale:
      return "post_scale";
    case BiasType::pre_scale:
      return "pre_scale";
  }
  return "unknown";
}

std::optional<BiasType> bias_type_from_string(std::string_view name) {
  for (BiasType t : {BiasType::none, BiasType::post_scale, BiasType::pre_scale})
    if (name == to_string(t)) return t;
  if (name == "no_bias") return BiasType::none;
  if (name == "post_scale_bias") return BiasType::post_scale;
  if (name == "pre_scale_bias") return BiasType::pre_scale;
  return std::nullopt;
}

std::string_view to_string(Backend backend) {
  switch (backend) {
    case Backend::automatic:
      return "auto";
    case Backend::reference:
      return "reference";
    case Backend::cpu:
      return "cpu";
    case Backend::cuda:
      return "cuda";
    case Backend::cudnn:
      return "cudnn";
  }
  return "unknown";
}

std::optional<Backend> backend_from_string(std::string_view name) {
  for (Backend b : {Backend::automatic, Backend::reference, Backend::cpu, Backend::cuda, Backend::cudnn})
    if (name == to_string(b)) return b;
  return std::nullopt;
}

std::string_view version() { return STRIDEATTN_VERSION_STRING; }

bool backend_compiled(Backend backend) { return detail::backend_impl(backend) != nullptr; }

namespace {

using detail::Problem;

// The size query ignores the args' workspace fields: a caller asking how much to allocate may
// still hold an earlier (possibly freed) buffer there, and the plan does not keep it.
template <class Args>
Status workspace(const Args& given, std::size_t* bytes) {
  if (!bytes) return Status(StatusCode::invalid_argument, "workspace_size: bytes is null");
  *bytes = 0;
  Args args = given;
  args.workspace = nullptr;
  args.workspace_bytes = 0;
  // From the cache (forward() then finds the plan), made without asking where the pointers
  // live: they may be stand-ins that only place the views (strideattn.jax at trace time).
  std::shared_ptr<const detail::PlanState> state;
  if (Status s = detail::PlanCacheAccess::get_for_size(default_plan_cache(), args, &state); !s.ok()) return s;
  std::conditional_t<std::is_same_v<Args, ForwardArgs>, ForwardPlan, BackwardPlan> plan;
  detail::PlanAccess::set(&plan, std::move(state));
  *bytes = plan.workspace_size();
  return Status::Ok();
}

template <class Args>
Explanation explain_impl(const Args& args) {
  Explanation ex;
  try {
    Problem problem;
    ex.validation = detail::make_problem(args, &problem);
    if (!ex.validation.ok()) return ex;
    ex.layout = detail::describe_layout(problem);
    detail::explain_selection(problem, &ex);
  } catch (const std::exception& e) {
    ex.validation = Status(StatusCode::internal, std::string("internal error: ") + e.what());
  }
  return ex;
}

}  // namespace

Status forward(const ForwardArgs& args) { return default_plan_cache().forward(args); }
Status backward(const BackwardArgs& args) { return default_plan_cache().backward(args); }
Status workspace_size(const ForwardArgs& args, std::size_t* bytes) { return workspace(args, bytes); }
Status workspace_size(const BackwardArgs& args, std::size_t* bytes) { return workspace(args, bytes); }
Explanation explain(const ForwardArgs& args) { return explain_impl(args); }
Explanation explain(const BackwardArgs& args) { return explain_impl(args); }

}  // namespace strideattn
