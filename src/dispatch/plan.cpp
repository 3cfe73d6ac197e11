// Plans (plan.hpp): made once (validation, memory kinds, selection, the backend's
// preparation), run many times (bind, per-run checks, the prepared call), and the public plan
// classes of strideattn.hpp over them.
#include "dispatch/plan.hpp"

#include <exception>
#include <new>

#include "common/log.hpp"
#include "common/memory_check.hpp"
#include "dispatch/gpu_module.hpp"
#include "dispatch/select.hpp"
#include "problem/cu_seqlens.hpp"
#include "problem/validate.hpp"

namespace strideattn::detail {

namespace {

Status invalid(const std::string& message) { return Status(StatusCode::invalid_argument, message); }

// Where a pointer lives, asked of the GPU module (its CUDA runtime); without a module (a
// CPU-only build, or one that failed to load) there are no device pointers to tell apart.
PointerKind pointer_kind(const void* ptr) {
  const GpuModuleLoad& m = gpu_module();
  if (m.module == nullptr || m.module->classify_pointer == nullptr) return PointerKind::unknown;
  return m.module->classify_pointer(ptr);
}

template <class Args>
Status make_state(const Args& args, Pointers mode, std::shared_ptr<const PlanState>* out, bool memory_kinds) {
  try {
    auto st = std::make_shared<PlanState>();
    Problem& p = st->problem;
    if (Status s = make_problem(args, &p, mode); !s.ok()) return s;
    if (memory_kinds)
      if (Status s = check_memory(args, &pointer_kind); !s.ok()) return s;
    Selection sel = select_backend(p, args.backend, VerdictScope::plan);
    if (!sel.chosen) return sel.status;
    st->backend = *sel.chosen;
    st->why = std::move(sel.why);
    st->checks.init(p);
    if (p.memory == Memory::device) st->device = current_device();
    if (p.heads > 0) {  // zero heads: every output is empty, nothing runs
      // A prepared problem carries no call's pointers beyond the make-time ones.
      Problem prep = p;
      prep.stream = nullptr;
      prep.workspace = nullptr;
      prep.workspace_bytes = 0;
      if (Status s = backend_impl(st->backend)->prepare_call(prep, &st->prepared); !s.ok()) return s;
      st->workspace = st->prepared->workspace_bytes();
    }
    *out = std::move(st);
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::backend_error, "out of host memory");
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, std::string("internal error: ") + e.what());
  }
}

struct Arrays {
  const std::int32_t *cu_q, *cu_kv, *off_q, *off_kv;
};

// The run's varlen arrays against the plan: required for a cu_seqlens plan, absent otherwise.
Status bind_arrays(const PlanState& st, const Arrays& a, Problem* p) {
  const Problem& base = st.problem;
  if (!base.cu_seqlens) {
    if (a.cu_q || a.cu_kv || a.off_q || a.off_kv)
      return invalid(
          "varlen: the run gives cu_seqlens arrays but the plan was made without them (count 0); supported: a "
          "plan made with Varlen::count > 0");
    return Status::Ok();
  }
  const std::pair<const char*, const std::int32_t*> named[] = {
      {"cu_seqlens_q", a.cu_q}, {"cu_seqlens_kv", a.cu_kv}, {"seq_offsets_q", a.off_q}, {"seq_offsets_kv", a.off_kv}};
  for (std::size_t i = 0; i < 4; ++i) {
    if (named[i].second == nullptr && i < 2)
      return invalid(std::string("varlen: ") + named[i].first + " is null but the plan is a cu_seqlens problem of " +
                     std::to_string(base.batch) + " sequences; supported: an int32 array of count + 1 entries");
    if (reinterpret_cast<std::uintptr_t>(named[i].second) % 4 != 0)
      return invalid(std::string("varlen: ") + named[i].first + " is " +
                     std::to_string(reinterpret_cast<std::uintptr_t>(named[i].second) % 4) +
                     " bytes past a 4-byte boundary; supported: an int32 array aligned to 4 bytes");
  }
  p->cu_seqlens_q = a.cu_q;
  p->cu_seqlens_kv = a.cu_kv;
  p->seq_offsets_q = a.off_q;
  p->seq_offsets_kv = a.off_kv;
  return Status::Ok();
}

// A feature tensor of the run against the plan: given iff the plan uses it (an empty view may
// stay null), aligned to its element size.
Status bind_feature(const char* name, bool on, bool empty, const void* ptr, std::size_t elem, void** dst) {
  if (!on && ptr != nullptr)
    return invalid(std::string(name) + ": the run gives a pointer but the plan was made without " + name +
                   "; supported: a plan made with it");
  if (!on) return Status::Ok();
  if (ptr == nullptr && !empty)
    return invalid(std::string(name) + " is null but the plan was made with " + name +
                   "; supported: the run gives every tensor the plan uses");
  if (reinterpret_cast<std::uintptr_t>(ptr) % elem != 0)
    return invalid(std::string(name) + ": data pointer is " +
                   std::to_string(reinterpret_cast<std::uintptr_t>(ptr) % elem) + " bytes past a " +
                   std::to_string(elem) + "-byte boundary; supported: aligned to the element size");
  *dst = const_cast<void*>(ptr);
  return Status::Ok();
}

bool empty_view(const BiasView& v) { return v.shape[0] * v.shape[1] * v.shape[2] * v.shape[3] == 0; }
bool empty_view(const HeadView& v) { return v.shape[0] * v.shape[1] == 0; }

struct FeatureRun {
  const void *bias, *alibi, *sinks;
  void *max_logit, *dbias, *d_sinks;
  std::uint64_t seed, offset;
  const std::uint64_t *seed_ptr, *offset_ptr;
};

Status bind_features(const FeatureRun& r, Problem* p) {
  void* slot = nullptr;
  if (Status s = bind_feature("bias", p->bias_on(), empty_view(p->bias), r.bias, size_of(p->bias.dtype), &slot);
      !s.ok())
    return s;
  p->bias.data = slot;
  slot = nullptr;
  if (Status s = bind_feature("alibi_slopes", p->alibi_on, empty_view(p->alibi), r.alibi, 4, &slot); !s.ok()) return s;
  p->alibi.data = static_cast<float*>(slot);
  slot = nullptr;
  if (Status s = bind_feature("sinks", p->sinks_on, empty_view(p->sinks), r.sinks, 4, &slot); !s.ok()) return s;
  p->sinks.data = static_cast<float*>(slot);
  slot = nullptr;
  if (Status s = bind_feature("max_logit", p->max_logit_on, empty_view(p->max_logit), r.max_logit, 4, &slot); !s.ok())
    return s;
  p->max_logit.data = static_cast<float*>(slot);
  slot = nullptr;
  if (Status s = bind_feature("dbias", p->dbias_on, empty_view(p->dbias), r.dbias, size_of(p->dbias.dtype), &slot);
      !s.ok())
    return s;
  p->dbias.data = slot;
  slot = nullptr;
  if (Status s = bind_feature("d_sinks", p->d_sinks_on, empty_view(p->d_sinks), r.d_sinks, 4, &slot); !s.ok()) return s;
  p->d_sinks.data = static_cast<float*>(slot);
  p->dropout_seed = r.seed;
  p->dropout_offset = r.offset;
  p->dropout_seed_ptr = r.seed_ptr;
  p->dropout_offset_ptr = r.offset_ptr;
  for (auto [name, ptr] : {std::pair{"dropout_seed_ptr", r.seed_ptr}, std::pair{"dropout_offset_ptr", r.offset_ptr}})
    if (reinterpret_cast<std::uintptr_t>(ptr) % 8 != 0)
      return invalid(std::string(name) + " is " + std::to_string(reinterpret_cast<std::uintptr_t>(ptr) % 8) +
                     " bytes past an 8-byte boundary; supported: a uint64 aligned to 8 bytes");
  // The features' own tensors are not among the per-run slots: their overlap is checked here.
  if (p->any_feature())
    if (Status s = check_overlap(*p); !s.ok()) return s;
  return Status::Ok();
}

// Memory kinds of every pointer of the run; a pointer seen in the last checked run of the same
// slot is not asked again.
Status check_run_memory(const PlanState& st, const Problem& p) {
  const GpuModuleLoad& m = gpu_module();
  if (m.module == nullptr || m.module->classify_pointer == nullptr) return Status::Ok();  // nothing to tell apart
  static constexpr const char* kNames[] = {"q", "k", "v", "o", "lse"};
  static constexpr const char* kBackwardNames[] = {"q", "k", "v", "o", "d_o", "lse", "dq", "dk", "dv"};
  const bool bwd = p.is_backward();
  const std::size_t n = bwd ? 9 : 5;
  const char* names[16];
  const void* ptrs[16];
  slot_pointers(p, ptrs);
  for (std::size_t i = 0; i < n; ++i) names[i] = bwd ? kBackwardNames[i] : kNames[i];
  std::size_t k = n;
  const std::pair<const char*, const void*> extra[] = {
      {"workspace", p.workspace},
      {"cu_seqlens_q", p.cu_seqlens_q},
      {"cu_seqlens_kv", p.cu_seqlens_kv},
      {"seq_offsets_q", p.seq_offsets_q},
      {"seq_offsets_kv", p.seq_offsets_kv},
      {"dropout_seed_ptr", p.dropout_on() ? p.dropout_seed_ptr : nullptr},
      {"dropout_offset_ptr", p.dropout_on() ? p.dropout_offset_ptr : nullptr}};
  for (const auto& [name, ptr] : extra) names[k] = name, ptrs[k++] = ptr;
  for (std::size_t i = 0; i < k; ++i) {
    const auto addr = reinterpret_cast<std::uintptr_t>(ptrs[i]);
    if (addr == 0 || st.memory_seen[i].load(std::memory_order_relaxed) == addr) continue;
    if (auto err = memory_mismatch(names[i], p.memory, m.module->classify_pointer(ptrs[i])))
      return Status(StatusCode::invalid_argument, *err);
    st.memory_seen[i].store(addr, std::memory_order_relaxed);
  }
  return Status::Ok();
}

// What both directions do once the run's tensor pointers are in `p`.
Status finish_run(const PlanState& st, Problem& p, void* stream, void* workspace, std::size_t workspace_bytes,
                  const std::atomic<bool>* cancel, const Arrays& arrays) {
  p.stream = stream;
  p.workspace = workspace;
  p.workspace_bytes = workspace_bytes;
  if (cancel) p.cancel = cancel;
  if (Status s = bind_arrays(st, arrays, &p); !s.ok()) return s;
  if (Status s = st.checks.check(p); !s.ok()) return s;
  if (workspace != nullptr) {
    if (reinterpret_cast<std::uintptr_t>(workspace) % kAssumedAlignment != 0)
      return invalid("workspace: address is " +
                     std::to_string(reinterpret_cast<std::uintptr_t>(workspace) % kAssumedAlignment) +
                     " bytes past a 16-byte boundary; supported: 16-byte aligned (cudaMalloc and PyTorch's "
                     "allocator give 256-byte aligned blocks)");
    if (workspace_bytes < st.workspace)
      return invalid("workspace: " + std::to_string(workspace_bytes) + " bytes; this plan (" +
                     std::string(to_string(st.backend)) + ") needs " + std::to_string(st.workspace) +
                     " (workspace_size())");
  }
  if (Status s = check_run_memory(st, p); !s.ok()) return s;
  if (st.device >= 0) {
    const int dev = current_device();
    if (dev != st.device)
      return invalid("the plan was made for CUDA device " + std::to_string(st.device) + " but device " +
                     std::to_string(dev) + " is current; supported: running a plan on its own device");
  }
  if (p.cu_seqlens && p.memory == Memory::host)
    if (Status s = read_cu_seqlens(&p); !s.ok()) return s;
  if (log_level() >= LogLevel::info) log_line(LogLevel::info, st.why);
  if (!st.prepared) return Status::Ok();
  return st.prepared->run(p);
}

template <class F>
Status guarded(F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::backend_error, "out of host memory");
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, std::string("internal error: ") + e.what());
  }
}

}  // namespace

int current_device() {
  const GpuModuleLoad& m = gpu_module();
  if (m.module == nullptr || m.module->current_device == nullptr) return -1;
  return m.module->current_device();
}

Status PlanAccess::make(const ForwardArgs& args, Pointers mode, std::shared_ptr<const PlanState>* out,
                        bool memory_kinds) {
  return make_state(args, mode, out, memory_kinds);
}
Status PlanAccess::make(const BackwardArgs& args, Pointers mode, std::shared_ptr<const PlanState>* out,
                        bool memory_kinds) {
  return make_state(args, mode, out, memory_kinds);
}

Status run_plan(const PlanState& st, const ForwardRun& r) {
  return guarded([&] {
    if (st.problem.is_backward())
      return invalid("a backward plan was run with forward pointers; supported: BackwardPlan::run(BackwardRun)");
    if (!st.problem.writes_lse() && r.lse != nullptr)
      return invalid(
          "lse: the run gives an LSE pointer but the plan writes no LSE; supported: a plan made with lse (data, or "
          "its shape and strides)");
    Problem p = st.problem;
    p.q.data = const_cast<void*>(r.q);
    p.k.data = const_cast<void*>(r.k);
    p.v.data = const_cast<void*>(r.v);
    p.o.data = r.o;
    p.lse.data = r.lse;
    if (Status s = bind_features({r.bias, r.alibi_slopes, r.sinks, r.max_logit, nullptr, nullptr, r.dropout_seed,
                                  r.dropout_offset, r.dropout_seed_ptr, r.dropout_offset_ptr},
                                 &p);
        !s.ok())
      return s;
    return finish_run(st, p, r.stream, r.workspace, r.workspace_bytes, r.cancel,
                      {r.cu_seqlens_q, r.cu_seqlens_kv, r.seq_offsets_q, r.seq_offsets_kv});
  });
}

Status run_plan(const PlanState& st, const BackwardRun& r) {
  return guarded([&] {
    if (!st.problem.is_backward())
      return invalid("a forward plan was run with backward pointers; supported: ForwardPlan::run(ForwardRun)");
    Problem p = st.problem;
    p.q.data = const_cast<void*>(r.q);
    p.k.data = const_cast<void*>(r.k);
    p.v.data = const_cast<void*>(r.v);
    p.o.data = const_cast<void*>(r.o);
    p.d_o.data = const_cast<void*>(r.d_o);
    p.lse.data = const_cast<float*>(r.lse);
    p.dq.data = r.dq;
    p.dk.data = r.dk;
    p.dv.data = r.dv;
    if (Status s = bind_features({r.bias, r.alibi_slopes, r.sinks, nullptr, r.dbias, r.d_sinks, r.dropout_seed,
                                  r.dropout_offset, r.dropout_seed_ptr, r.dropout_offset_ptr},
                                 &p);
        !s.ok())
      return s;
    return finish_run(st, p, r.stream, r.workspace, r.workspace_bytes, r.cancel,
                      {r.cu_seqlens_q, r.cu_seqlens_kv, r.seq_offsets_q, r.seq_offsets_kv});
  });
}

ForwardRun run_of(const ForwardArgs& a) {
  ForwardRun r;
  r.q = a.q.data, r.k = a.k.data, r.v = a.v.data, r.o = a.o.data, r.lse = a.lse.data;
  r.stream = a.stream, r.workspace = a.workspace, r.workspace_bytes = a.workspace_bytes;
  r.cu_seqlens_q = a.varlen.cu_seqlens_q, r.cu_seqlens_kv = a.varlen.cu_seqlens_kv;
  r.seq_offsets_q = a.varlen.seq_offsets_q, r.seq_offsets_kv = a.varlen.seq_offsets_kv;
  r.cancel = a.options.cancel;
  r.bias = a.bias.data, r.alibi_slopes = a.alibi_slopes.data, r.sinks = a.sinks.data;
  r.max_logit = a.max_logit.data;
  r.dropout_seed = a.options.dropout.seed, r.dropout_offset = a.options.dropout.offset;
  r.dropout_seed_ptr = a.options.dropout.seed_ptr, r.dropout_offset_ptr = a.options.dropout.offset_ptr;
  return r;
}

BackwardRun run_of(const BackwardArgs& a) {
  BackwardRun r;
  r.q = a.q.data, r.k = a.k.data, r.v = a.v.data, r.o = a.o.data, r.d_o = a.d_o.data, r.lse = a.lse.data;
  r.dq = a.dq.data, r.dk = a.dk.data, r.dv = a.dv.data;
  r.stream = a.stream, r.workspace = a.workspace, r.workspace_bytes = a.workspace_bytes;
  r.cu_seqlens_q = a.varlen.cu_seqlens_q, r.cu_seqlens_kv = a.varlen.cu_seqlens_kv;
  r.seq_offsets_q = a.varlen.seq_offsets_q, r.seq_offsets_kv = a.varlen.seq_offsets_kv;
  r.cancel = a.options.cancel;
  r.bias = a.bias.data, r.alibi_slopes = a.alibi_slopes.data, r.sinks = a.sinks.data;
  r.dbias = a.dbias.data, r.d_sinks = a.d_sinks.data;
  r.dropout_seed = a.options.dropout.seed, r.dropout_offset = a.options.dropout.offset;
  r.dropout_seed_ptr = a.options.dropout.seed_ptr, r.dropout_offset_ptr = a.options.dropout.offset_ptr;
  return r;
}

}  // namespace strideattn::detail

namespace strideattn {

using detail::PlanAccess;

Backend PlanInfo::backend() const { return state_ ? state_->backend : Backend::automatic; }
std::size_t PlanInfo::workspace_size() const { return state_ ? state_->workspace : 0; }
const std::string& PlanInfo::reason() const {
  static const std::string none = "empty plan";
  return state_ ? state_->why : none;
}
bool PlanInfo::writes_lse() const { return state_ && state_->problem.writes_lse(); }

Status ForwardPlan::run(const ForwardRun& run) const {
  if (!state_) return Status(StatusCode::invalid_argument, "the plan is empty (make_plan did not succeed)");
  return detail::run_plan(*state_, run);
}

Status BackwardPlan::run(const BackwardRun& run) const {
  if (!state_) return Status(StatusCode::invalid_argument, "the plan is empty (make_plan did not succeed)");
  return detail::run_plan(*state_, run);
}

Status make_plan(const ForwardArgs& args, ForwardPlan* plan) {
  if (!plan) return Status(StatusCode::invalid_argument, "make_plan: plan is null");
  std::shared_ptr<const detail::PlanState> st;
  PlanAccess::set(plan, nullptr);
  if (Status s = PlanAccess::make(args, detail::Pointers::deferred, &st); !s.ok()) return s;
  PlanAccess::set(plan, std::move(st));
  return Status::Ok();
}

Status make_plan(const BackwardArgs& args, BackwardPlan* plan) {
  if (!plan) return Status(StatusCode::invalid_argument, "make_plan: plan is null");
  std::shared_ptr<const detail::PlanState> st;
  PlanAccess::set(plan, nullptr);
  if (Status s = PlanAccess::make(args, detail::Pointers::deferred, &st); !s.ok()) return s;
  PlanAccess::set(plan, std::move(st));
  return Status::Ok();
}

}  // namespace strideattn
