// Backend selection for `auto` and explicit requests (select.hpp). The classes below are the
// ones documented in docs/backends.md (keep the two in step); on sm90+ devices the order of
// `cuda` and `cudnn` comes from the measured rows of speed_table.hpp.
#include "dispatch/select.hpp"

#include <cstdlib>
#include <algorithm>
#include <iterator>
#include <sstream>
#include <string_view>

#include "common/log.hpp"
#include "dispatch/registry.hpp"
#include "dispatch/speed_table.hpp"
#include "problem/kv_cache.hpp"

namespace strideattn::detail {

namespace {

constexpr const char* kHopperSource =
    "docs/design.md anchors, H200, bf16: SDPA cuDNN 443-639 TFLOP/s fwd and 430-537 fwd+bwd vs "
    "FlashAttention-2-class kernels 304-353 and 256-320; bench/README.md holds our own runs";
constexpr const char* kAmpereSource =
    "no sm80 measurement yet; same order as sm90 (docs/design.md: FlashAttention-2 about 225 "
    "TFLOP/s fwd on A100, cuDNN comparable)";

// A problem farther than this from every measured row (speed_row_distance: a factor of 8 in
// head dim, or of 64 in length) keeps the fixed order: the measurements say nothing about it.
constexpr double kFarFromEveryRow = 6.0;

// Host-bound problems: below this much work (dense bound, backward counted 2.5x) a call's GPU
// time is a few microseconds at either backend's speed (2 GFLOP: 5-7 us at the 300-600
// TFLOP/s of bench/README.md), under the difference of their per-call host cost, so the
// backend with the cheaper host path finishes first. Measured (bench/results/host/
// 2026-12-03-nvidia-h200-af4bc7d.json, a plan run of [1, 128, 4, 64] bf16 on an H200): cuda
// 15.0 us forward and 44.8 us forward+backward, cudnn 27.0 and 78.7.
constexpr double kHostBoundFlops = 2e9;
constexpr const char* kHostSource =
    "host-bound: per-call host cost of a plan run on an H200, cuda 15.0 us fwd / 44.8 us fwd+bwd vs cudnn 27.0 / "
    "78.7 (bench/results/host/2026-12-03-nvidia-h200-af4bc7d.json)";

// The work of a problem, dense bound (every query against every key of its sequence): cheap,
// and no loop over (possibly 2^62) rows.
double work_flops(const Problem& p) {
  double pairs = 0;
  const bool lists = p.varlen && p.lengths_known();  // else every sequence at its bounds
  for (std::int64_t b = 0; b < p.batch; ++b)
    pairs +=
        double(lists ? p.seqlens_q[std::size_t(b)] : p.s_q) * double(lists ? p.seqlens_kv[std::size_t(b)] : p.s_kv);
  return 2.0 * pairs * double(p.heads) * double(p.d_qk + p.d_v) * (p.is_backward() ? 2.5 : 1.0);
}

std::string order_text(const std::vector<Backend>& order) {
  std::string s;
  for (Backend b : order) {
    if (!s.empty()) s += " > ";
    s += to_string(b);
  }
  return s;
}

Verdict verdict_for(Backend b, const Problem& problem) {
  if (BackendImpl* impl = backend_impl(b)) {
    if (problem.cu_seqlens && !impl->reads_cu_seqlens()) {
      Verdict v;
      v.backend = b;
      v.rule = "cu_seqlens";
      v.reason =
          "varlen lengths given as cu_seqlens arrays (count " + std::to_string(problem.batch) +
          ") are not read by this backend yet; supported: seqlens lists (Varlen::seqlens_q/kv), or another backend";
      return v;
    }
    if (problem.kv_cache != nullptr && !impl->runs_kv_cache()) {
      Verdict v;
      v.backend = b;
      v.rule = "kv_cache";
      v.reason = "KV-cache attention (" + describe_kvcache(*problem.kv_cache) +
                 ") is not run by this backend (no KV-cache kernels); supported on: reference, cpu, cuda, cudnn";
      return v;
    }
    Verdict v = impl->supports(problem);
    v.backend = b;
    return v;
  }
  Verdict v;
  v.backend = b;
  v.rule = "compiled";
  v.reason = missing_backend_reason(b);
  return v;
}

std::string verdict_line(const Verdict& v) {
  std::string s(to_string(v.backend));
  if (v.supported) return s + ": supported";
  return s + ": " + v.rule + ": " + v.reason;
}

}  // namespace

SpeedClass speed_class(const Problem& problem) {
  const std::vector<Backend> gpu_first{Backend::cudnn, Backend::cuda, Backend::cpu, Backend::reference};
  if (problem.memory == Memory::host)
    return {"host memory",
            {Backend::cpu, Backend::reference, Backend::cudnn, Backend::cuda},
            "cpu is the tiled multi-threaded backend, reference the fp64 loops; GPU backends "
            "need device memory"};
  const Platform plat = platform();
  if (!plat.gpu) return {"device memory, no GPU visible", gpu_first, "no GPU to measure on"};
  if (problem.kv_cache != nullptr)
    return {"KV cache, device memory",
            {Backend::cuda, Backend::cudnn, Backend::cpu, Backend::reference},
            "cuda's decode kernels (split over the keys, every page size and stride, broken promises made NaN "
            "per row) first; cudnn's paged SDPA is not measured against them yet"};
  if (problem.any_feature())
    return {"training features, device memory",
            {Backend::cuda, Backend::cudnn, Backend::cpu, Backend::reference},
            "cuda runs every feature; cudnn's bias, sinks and max logit are not measured against cuda's (the "
            "measured rows have no features), so auto keeps the order it had while cudnn refused them"};
  if (plat.sm >= 90) {
    const std::string name = "sm" + std::to_string(plat.sm) + " device";
    if (const char* env = std::getenv("STRIDEATTN_AUTO"); env && std::string_view(env) == "fixed")
      return {name, gpu_first, std::string(kHopperSource) + " (STRIDEATTN_AUTO=fixed: the measured rows are not read)"};
    if (const double flops = problem.kv_cache == nullptr ? work_flops(problem) : kHostBoundFlops;
        flops < kHostBoundFlops) {
      std::ostringstream os;
      os.precision(3);
      os << kHostSource << "; this problem needs " << flops << " FLOP, under " << kHostBoundFlops;
      return {name + ", host-bound", {Backend::cuda, Backend::cudnn, Backend::cpu, Backend::reference}, os.str()};
    }
    const SpeedRow* row = nearest_speed_row(problem);
    if (!row || speed_row_distance(*row, problem) > kFarFromEveryRow)
      return {name, gpu_first,
              std::string(kHopperSource) + " (no measured row near this problem in " + speed_table_source() + ")"};
    const bool cuda_first = row->cuda_faster(problem.direction);
    return {
        name + ", measured like '" + row->shape + "'",
        cuda_first ? std::vector<Backend>{Backend::cuda, Backend::cudnn, Backend::cpu, Backend::reference} : gpu_first,
        "measured: " + row->describe(problem.direction) + "; " + speed_table_source()};
  }
  return {"sm" + std::to_string(plat.sm) + " device", gpu_first, kAmpereSource};
}

std::vector<Backend> preference_order(const Problem& problem) { return speed_class(problem).order; }

SupportRule memory_rule(Memory required) {
  return {"memory", [required](const Problem& p) -> std::optional<std::string> {
            if (p.memory == required) return std::nullopt;
            return std::string("tensors are in ") + (p.memory == Memory::host ? "host" : "device") +
                   " memory; this backend runs on " + (required == Memory::host ? "host" : "device") + " memory";
          }};
}

SupportRule work_rule(double max_flops, double typical_rate) {
  return {"work", [max_flops, typical_rate](const Problem& p) -> std::optional<std::string> {
            const double flops = work_flops(p);
            if (flops <= max_flops) return std::nullopt;
            std::ostringstream os;
            os.precision(3);
            os << "the problem needs up to " << flops << " FLOP (every query against every key); "
               << "this host backend takes at most " << max_flops << " FLOP per call (about "
               << max_flops / typical_rate / 3600.0 << " h on 2 cores); use a GPU backend or "
               << "split the problem";
            return os.str();
          }};
}

// The training features the `cuda` backend's kernels run (the feature variant,
// src/backends/cuda/common/score_mod.cuh); `reference` and `cpu` run all of them.
bool cuda_runs(std::string_view feature) {
  return feature == "softcap" || feature == "bias" || feature == "alibi" || feature == "sinks" ||
         feature == "max_logit" || feature == "dropout";
}

// The training features `cudnn` runs where cuDNN's SDPA has them; its own rule of that name
// (src/backends/cudnn/rules.cpp) refuses the shapes, strides and masks cuDNN does not take.
bool cudnn_runs(std::string_view feature) { return feature == "bias" || feature == "sinks"; }

// Why `cudnn` refuses a feature it does not run: what cuDNN has instead and why that is not
// the definition (docs/backends.md, "cudnn").
std::string cudnn_cannot(std::string_view feature) {
  if (feature == "alibi")
    return "; not on cudnn: cuDNN computes its own ALiBi slopes (its alibi_mask) and takes none from the caller";
  if (feature == "dropout")
    return "; not on cudnn: cuDNN's dropout draws its own random mask, not the Philox mask of the definition "
           "that the other backends and the backward regenerate";
  if (feature == "softcap")
    return "; not on cudnn: cuDNN has a softcap only as a custom score-modifier graph, which this backend does "
           "not build";
  if (feature == "max_logit")
    return "; not on cudnn: cuDNN 9.19 gives its per-row max only without the softmax stats that this "
           "backend's LSE needs";
  return ", not yet on cudnn";
}

std::vector<SupportRule> feature_rules(Backend backend) {
  const std::string not_yet = ", not yet on " + std::string(to_string(backend));
  const std::string host_only = "; supported on the reference and cpu backends (host memory)" + not_yet;
  const std::string with_cuda = "; supported on the reference and cpu backends (host memory) and cuda";
  auto num = [](double x) {
    std::ostringstream os;
    os << x;
    return os.str();
  };
  auto shape4 = [](const BiasView& v) {
    return "[" + std::to_string(v.shape[0]) + ", " + std::to_string(v.shape[1]) + ", " + std::to_string(v.shape[2]) +
           ", " + std::to_string(v.shape[3]) + "]";
  };
  auto where = [=](std::string_view feature) {
    if (!cuda_runs(feature)) return host_only;
    return with_cuda + (backend == Backend::cudnn ? cudnn_cannot(feature) : not_yet);
  };
  std::vector<SupportRule> rules = {
      {"softcap",
       [=](const Problem& p) -> std::optional<std::string> {
         if (!p.softcap_on()) return std::nullopt;
         return "softcap " + num(p.softcap) + " asked" + where("softcap");
       }},
      {"dropout",
       [=](const Problem& p) -> std::optional<std::string> {
         if (!p.dropout_on()) return std::nullopt;
         return "dropout p = " + num(p.dropout_p) + " asked" + where("dropout");
       }},
      {"bias",
       [=](const Problem& p) -> std::optional<std::string> {
         if (!p.bias_on()) return std::nullopt;
         return std::string(to_string(p.bias_type)) + " bias " + shape4(p.bias) + " (" +
                std::string(to_string(p.bias.dtype)) + (p.dbias_on ? ", with dbias" : "") + ") asked" + where("bias");
       }},
      {"alibi",
       [=](const Problem& p) -> std::optional<std::string> {
         if (!p.alibi_on) return std::nullopt;
         return "ALiBi slopes [" + std::to_string(p.alibi.shape[0]) + ", " + std::to_string(p.alibi.shape[1]) +
                "] asked" + where("alibi");
       }},
      {"sinks",
       [=](const Problem& p) -> std::optional<std::string> {
         if (!p.sinks_on) return std::nullopt;
         return std::string("attention sinks [1, ") + std::to_string(p.sinks.shape[1]) + "]" +
                (p.d_sinks_on ? " with d_sinks" : "") + " asked" + where("sinks");
       }},
      {"max_logit",
       [=](const Problem& p) -> std::optional<std::string> {
         if (!p.max_logit_on) return std::nullopt;
         return "the max-logit output asked" + where("max_logit");
       }},
  };
  // cuda: no rule for what its kernels run
  if (backend == Backend::cuda) std::erase_if(rules, [](const SupportRule& r) { return cuda_runs(r.name); });
  // cudnn: its own rules (rules.cpp) for what it runs
  if (backend == Backend::cudnn) std::erase_if(rules, [](const SupportRule& r) { return cudnn_runs(r.name); });
  return rules;
}

bool runs_feature(Backend backend, std::string_view feature) {
  switch (backend) {
    case Backend::cuda:
      return cuda_runs(feature);
    case Backend::cudnn:
      return cudnn_runs(feature);
    default:
      return true;
  }
}

std::vector<SupportRule> with_feature_rules(Backend backend, std::vector<SupportRule> rules) {
  std::vector<SupportRule> all = feature_rules(backend);
  all.insert(all.end(), std::make_move_iterator(rules.begin()), std::make_move_iterator(rules.end()));
  return all;
}

Verdict evaluate_rules(Backend backend, const std::vector<SupportRule>& rules, const Problem& problem) {
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

Selection select_backend(const Problem& problem, Backend requested, VerdictScope scope) {
  Selection sel;
  std::string why = "requested";
  if (to_string(requested) == "unknown") {
    sel.status = Status(StatusCode::invalid_argument, "backend " + std::to_string(static_cast<int>(requested)) +
                                                          " is unknown; supported: auto, reference, cpu, cuda, cudnn");
    return sel;
  }
  if (requested == Backend::automatic) {
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
  const SpeedClass cls = speed_class(problem);
  const bool all = scope == VerdictScope::all || log_level() >= LogLevel::debug;
  for (Backend b : cls.order) {
    if (!all && requested != Backend::automatic && b != requested) continue;
    sel.verdicts.push_back(verdict_for(b, problem));
    if (!all && sel.verdicts.back().supported) break;  // the first supported one runs
  }

  if (log_level() >= LogLevel::debug) {
    log_line(LogLevel::debug, std::string(to_string(problem.direction)) + ": class '" + cls.name + "', order " +
                                  order_text(cls.order) + " (" + cls.source + ")");
    for (std::size_t i = 0; i < sel.verdicts.size(); ++i)
      log_line(LogLevel::debug, "verdict " + std::to_string(i + 1) + "/" + std::to_string(sel.verdicts.size()) + " " +
                                    verdict_line(sel.verdicts[i]));
  }
  const std::string dir(to_string(problem.direction));
  // A call that runs reports its choice at info; explain's selection (every verdict, nothing
  // runs) says what would run, at debug, so a log never claims a run that did not happen. A
  // plan's selection reports a refusal at info and leaves the choice to each of its runs.
  const bool running = scope != VerdictScope::all;
  const std::string runs = running ? " runs on " : " would run on ";
  auto report_choice = [&](const std::string& line) {
    if (scope == VerdictScope::plan) return;
    log_line(running ? LogLevel::info : LogLevel::debug, running ? line : "explain: " + line);
  };
  auto report = [&](const std::string& line) {
    log_line(running ? LogLevel::info : LogLevel::debug, running ? line : "explain: " + line);
  };

  if (requested != Backend::automatic) {
    for (auto& v : sel.verdicts) {
      if (v.backend != requested) continue;
      if (v.supported) {
        sel.chosen = requested;
        v.reason = "chosen (" + why + ")";
        sel.why = dir + runs + std::string(to_string(requested)) + " (" + why + ")";
        report_choice(sel.why);
      } else {
        sel.status =
            Status(StatusCode::unsupported, std::string("backend '") + std::string(to_string(requested)) + "' (" + why +
                                                ") cannot run this problem: " + v.rule + ": " + v.reason);
        sel.why =
            dir + " cannot run on " + std::string(to_string(requested)) + " (" + why + "): " + v.rule + ": " + v.reason;
        report(sel.why);
      }
      return sel;
    }
  }

  std::string skipped;
  for (auto& v : sel.verdicts) {
    if (v.supported) {
      if (!sel.chosen) {
        sel.chosen = v.backend;
        v.reason = "chosen: fastest supported backend for class '" + cls.name + "'";
        sel.why = dir + runs + std::string(to_string(v.backend)) + " (auto, class '" + cls.name + "', order " +
                  order_text(cls.order) + "; " +
                  (skipped.empty() ? std::string("first in order") : "skipped " + skipped) + ")";
        report_choice(sel.why);
      } else {
        v.reason = "supported; ranks after " + std::string(to_string(*sel.chosen)) + " for class '" + cls.name + "'";
      }
      continue;
    }
    if (sel.chosen) continue;
    if (!skipped.empty()) skipped += "; ";
    skipped += verdict_line(v);
  }
  if (sel.chosen) return sel;
  sel.status = Status(StatusCode::unsupported, "no backend can run this problem: " + skipped);
  sel.why = dir + " has no backend (auto, class '" + cls.name + "'): " + skipped;
  report(sel.why);
  return sel;
}

void explain_selection(const Problem& problem, Explanation* ex) {
  Selection sel = select_backend(problem, Backend::automatic);
  if (sel.status.code() == StatusCode::invalid_argument) ex->validation = sel.status;
  ex->verdicts = std::move(sel.verdicts);
  ex->chosen = sel.chosen;
}

}  // namespace strideattn::detail
