// The interface every backend implements, and the flat support-rule list they use to
// answer "can you run this problem?" with the first failing rule, the value found and the
// values supported.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "problem/problem.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::detail {

// One named support check. `check` returns nullopt when the problem passes, otherwise the
// reason: the value found and the values supported, e.g. "head dim 264; supported: <= 256".
struct SupportRule {
  std::string name;
  std::function<std::optional<std::string>(const Problem&)> check;
};

// Runs the rules in order; the first failure becomes the verdict.
[[nodiscard]] Verdict evaluate_rules(Backend backend, const std::vector<SupportRule>& rules, const Problem& problem);

// A backend's preparation of one problem for many runs: what a plan holds (src/dispatch/plan.cpp).
// Everything that depends on the problem but not on its pointers belongs in it (a cuDNN graph,
// kernel and tile choices, the device's facts, the workspace layout), so a run does only the
// per-pointer work and the launches.
class PreparedCall {
 public:
  virtual ~PreparedCall() = default;
  // Scratch bytes each run needs (the plan's workspace_size()).
  [[nodiscard]] virtual std::size_t workspace_bytes() const = 0;
  // One run. `run` is the prepared problem with this run's pointers bound: data pointers,
  // stream, workspace (the caller's, at least workspace_bytes() and 16-byte aligned, or null:
  // allocate), cancel flag and, for a cu_seqlens problem, its arrays (host backends get the
  // lists already read from them). The plan checked the pointers. Must be safe to call from
  // several threads at once (a plan is shared); must never throw.
  [[nodiscard]] virtual Status run(const Problem& run) const = 0;
};

class BackendImpl {
 public:
  virtual ~BackendImpl() = default;
  [[nodiscard]] virtual Backend id() const = 0;
  // Verdict for a validated problem (direction included). Must never throw.
  [[nodiscard]] virtual Verdict supports(const Problem& problem) const = 0;
  [[nodiscard]] virtual Status workspace_size(const Problem& problem, std::size_t* bytes) const {
    (void)problem;
    *bytes = 0;
    return Status::Ok();
  }
  // Preconditions: supports(problem).supported. Writes O (and LSE if requested).
  [[nodiscard]] virtual Status forward(const Problem& problem) = 0;
  // Preconditions: supports(problem).supported. Writes dQ, dK, dV.
  [[nodiscard]] virtual Status backward(const Problem& problem) = 0;

  // Preconditions: supports(problem).supported. Prepares `problem` (pointers may be null:
  // given at run time, assumed 16-byte aligned) for PreparedCall::run. The default keeps
  // workspace_size() and calls forward() / backward() on each run, so a backend works with
  // plans before it has a preparation of its own: override it to move per-call work here.
  [[nodiscard]] virtual Status prepare_call(const Problem& problem, std::unique_ptr<const PreparedCall>* out);

  // Whether the backend reads varlen lengths given as cu_seqlens arrays (Varlen::count > 0):
  // host backends get the lists read on the host, device backends the arrays themselves.
  // Backends that do not are refused such problems by the rule `cu_seqlens` before their
  // supports() is asked (their rules may read the lists).
  [[nodiscard]] virtual bool reads_cu_seqlens() const { return false; }

  // KV-cache attention (problem/kv_cache.hpp, docs/semantics.md "KV cache"): whether the
  // backend runs it, and the run (appends, then attends). Backends that do not are refused such
  // problems by the rule `kv_cache` before their supports() is asked.
  [[nodiscard]] virtual bool runs_kv_cache() const { return false; }
  [[nodiscard]] virtual Status forward_kvcache(const KvCacheProblem& problem) {
    (void)problem;
    return Status(StatusCode::unsupported, "this backend does not run KV-cache attention");
  }
  // Scratch bytes forward_kvcache needs for `problem` (the caller's `workspace` of at least
  // that many bytes means the call allocates nothing). Preconditions as forward_kvcache.
  [[nodiscard]] virtual Status kvcache_workspace_size(const KvCacheProblem& problem, std::size_t* bytes) const {
    (void)problem;
    *bytes = 0;
    return Status::Ok();
  }
  // Which kernels forward_kvcache would run for `problem` and why, for explain (the chosen
  // backend's verdict); "" where the backend has nothing to say.
  [[nodiscard]] virtual std::string describe_kvcache_plan(const KvCacheProblem& problem) const {
    (void)problem;
    return "";
  }
};

// Registry: one instance per backend compiled into this build (nullptr otherwise).
// Defined by each backend's translation unit; the CUDA and cuDNN ones fall back to
// src/dispatch/missing_backends.cpp in CPU-only builds.
BackendImpl* reference_backend();
BackendImpl* cpu_backend();
BackendImpl* cuda_backend();
BackendImpl* cudnn_backend();
[[nodiscard]] BackendImpl* backend_impl(Backend backend);

}  // namespace strideattn::detail
