// Backend selection: the `auto` preference order per problem class (measured speed on the
// platform at hand; table and sources in docs/backends.md), the STRIDEATTN_BACKEND override,
// and the verdict list that `explain` shows and the log prints.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dispatch/backend.hpp"

namespace strideattn::detail {

// One row of auto's speed table: which problems it covers and the backends fastest first.
struct SpeedClass {
  std::string name;            // e.g. "sm90 device"
  std::vector<Backend> order;  // fastest first; every concrete backend appears once
  std::string source;          // where the order comes from (measurement, docs/design.md anchor)
};

[[nodiscard]] SpeedClass speed_class(const Problem& problem);

// Preference order for `automatic` on this problem (fastest first).
[[nodiscard]] std::vector<Backend> preference_order(const Problem& problem);

struct Selection {
  std::vector<Verdict> verdicts;  // every backend, in preference order for this problem
  std::optional<Backend> chosen;  // nullopt: nothing can run it (status says why)
  Status status;                  // why nothing was chosen, naming each backend's rule
  std::string why;                // one line: what ran and why each faster one was skipped
};

// Resolve `requested` (honouring STRIDEATTN_BACKEND when it is `automatic`) to a backend
// that supports the problem. Logs `why` at info and every verdict at debug.
// How many verdicts to compute: `all` for explain() and debug logs; `until_chosen` for a
// call that will run (the backends after the chosen one are never asked: their support
// checks - a cuDNN graph lookup, say - are work on every call).
// `plan`: as until_chosen, for a plan being made: the choice is not logged (each run of the
// plan logs it), a refusal is.
enum class VerdictScope { all, until_chosen, plan };
[[nodiscard]] Selection select_backend(const Problem& problem, Backend requested,
                                       VerdictScope scope = VerdictScope::all);

// explain()'s selection part, shared by every explain entry point: auto's verdicts on every
// backend and its choice, into `ex` (whose validation and layout the caller has filled). An
// unknown STRIDEATTN_BACKEND makes every call fail, so it becomes ex's validation error.
void explain_selection(const Problem& problem, Explanation* ex);

// Common support rules every backend starts with.
[[nodiscard]] SupportRule memory_rule(Memory required);
// Host backends: refuse a problem whose dense work bound (every query against every key,
// docs/design.md's FLOP convention) exceeds `max_flops`, so that an absurd but valid problem (a
// stride-0 K of extent 2^62) is refused with its size instead of running for years.
// `typical_rate` (FLOP/s on the 2-core CI machine) only words the message.
[[nodiscard]] SupportRule work_rule(double max_flops, double typical_rate);

// The training features a backend does not run yet (docs/semantics.md "Training features"),
// one named rule each: softcap, dropout, bias (and dbias), alibi, sinks (and d_sinks),
// max_logit. Each reason says what was asked and which backends run it.
[[nodiscard]] std::vector<SupportRule> feature_rules(Backend backend);
// Whether `backend` runs the training feature named as its rule is (softcap, dropout, bias,
// alibi, sinks, max_logit): reference and cpu run every one, cuda those its kernels have,
// cudnn none yet; auto any (it picks among them). The fuzzer draws from these.
[[nodiscard]] bool runs_feature(Backend backend, std::string_view feature);
// `rules` with feature_rules(backend) in front.
[[nodiscard]] std::vector<SupportRule> with_feature_rules(Backend backend, std::vector<SupportRule> rules);

}  // namespace strideattn::detail
