// Backend selection for `auto` and explicit requests; see select.hpp.
#include "dispatch/select.hpp"

#include <cstdlib>
#include <sstream>

#include "common/log.hpp"

namespace strideattn::detail {

std::vector<Backend> preference_order(const Problem& problem) {
  // Host tensors: the tiled cpu backend is many times faster than the fp64 reference.
  // Device tensors: cuDNN first (FIELD.md: 450-640 TFLOP/s on H200 vs ~300-350 for FA2-class
  // kernels), then our own kernels, which accept every stride and head dim cuDNN refuses.
  if (problem.memory == Memory::host)
    return {Backend::cpu, Backend::reference, Backend::cudnn, Backend::cuda};
  return {Backend::cudnn, Backend::cuda, Backend::cpu, Backend::reference};
}

SupportRule memory_rule(Memory required) {
  return {"memory", [required](const Problem& p) -> std::optional<std::string> {
            if (p.memory == required) return std::nullopt;
            return std::string("tensors are in ") + (p.memory == Memory::host ? "host" : "device") +
                   " memory; this backend runs on " + (required == Memory::host ? "host" : "device") +
                   " memory";
          }};
}

Verdict evaluate_rules(Backend backend, const std::vector<SupportRule>& rules,
                       const Problem& problem) {
  Verdict v;
  v.backend = backend;
  for (const auto& rule : rules) {
    if (auto reason = rule.check(problem)) {
      v.supported = false;
      v.rule = rule.name;
      v.reason = *reason;
      return v;
    }
  }
  v.supported = true;
  return v;
}

namespace {

Verdict verdict_for(Backend b, const Problem& problem) {
  if (BackendImpl* impl = backend_impl(b)) return impl->supports(problem);
  Verdict v;
  v.backend = b;
  v.rule = "compiled";
  v.reason = std::string("backend '") + std::string(to_string(b)) +
             "' is not part of this build (built without CUDA" +
             (b == Backend::cudnn ? " or without cuDNN and its frontend headers)" : ")");
  return v;
}

std::string verdict_line(const Verdict& v) {
  std::string s(to_string(v.backend));
  if (v.supported) return s + ": supported";
  return s + ": " + v.rule + ": " + v.reason;
}

}  // namespace

Selection select_backend(const Problem& problem, Backend requested) {
  Selection sel;
  std::string why = "requested";
  if (requested == Backend::automatic) {
    why = "auto";
    if (const char* env = std::getenv("STRIDEATTN_BACKEND"); env && *env) {
      auto b = backend_from_string(env);
      if (!b) {
        sel.status = Status(StatusCode::invalid_argument,
                            std::string("STRIDEATTN_BACKEND='") + env +
                                "' is not a backend; supported: auto, reference, cpu, cuda, cudnn");
        return sel;
      }
      requested = *b;
      why = std::string("STRIDEATTN_BACKEND=") + env;
    }
  }
  for (Backend b : preference_order(problem)) sel.verdicts.push_back(verdict_for(b, problem));

  if (log_level() >= LogLevel::debug)
    for (const auto& v : sel.verdicts) log_line(LogLevel::debug, "verdict " + verdict_line(v));

  if (requested != Backend::automatic) {
    for (const auto& v : sel.verdicts) {
      if (v.backend != requested) continue;
      if (v.supported) {
        sel.chosen = requested;
        log_line(LogLevel::info, std::string(to_string(problem.direction)) + " runs on " +
                                     std::string(to_string(requested)) + " (" + why + ")");
      } else {
        sel.status = Status(StatusCode::unsupported,
                            std::string("backend '") + std::string(to_string(requested)) +
                                "' (" + why + ") cannot run this problem: " + v.rule + ": " +
                                v.reason);
      }
      return sel;
    }
  }

  std::ostringstream skipped;
  for (const auto& v : sel.verdicts) {
    if (v.supported) {
      sel.chosen = v.backend;
      std::string line = std::string(to_string(problem.direction)) + " runs on " +
                         std::string(to_string(v.backend)) + " (auto";
      const std::string s = skipped.str();
      line += s.empty() ? ": first in preference order)" : "; skipped " + s + ")";
      log_line(LogLevel::info, line);
      return sel;
    }
    if (!skipped.str().empty()) skipped << "; ";
    skipped << verdict_line(v);
  }
  sel.status = Status(StatusCode::unsupported,
                      "no backend can run this problem: " + skipped.str());
  return sel;
}

}  // namespace strideattn::detail
