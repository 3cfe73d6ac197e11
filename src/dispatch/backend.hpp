// The interface every backend implements, and the flat support-rule list they use to
// answer "can you run this problem?" with the first failing rule, the value found and the
// values supported.
#pragma once

#include <cstddef>
#include <functional>
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
