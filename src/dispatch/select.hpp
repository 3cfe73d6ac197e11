// Backend selection: the `auto` preference order per problem class, the STRIDEATTN_BACKEND
// override, and the verdict list that `explain` shows and the log prints.
#pragma once

#include <optional>
#include <vector>

#include "dispatch/backend.hpp"

namespace strideattn::detail {

struct Selection {
  std::vector<Verdict> verdicts;  // every backend, in preference order for this problem
  std::optional<Backend> chosen;  // nullopt: nothing can run it (status says why)
  Status status;                  // why nothing was chosen, naming each backend's rule
};

// Preference order for `automatic` on this problem (fastest first).
[[nodiscard]] std::vector<Backend> preference_order(const Problem& problem);

// Resolve `requested` (honouring STRIDEATTN_BACKEND when it is `automatic`) to a backend
// that supports the problem, logging the choice at info and all verdicts at debug.
[[nodiscard]] Selection select_backend(const Problem& problem, Backend requested);

// Common support rules every backend starts with.
[[nodiscard]] SupportRule memory_rule(Memory required);

}  // namespace strideattn::detail
