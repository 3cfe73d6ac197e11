// The reference's KV-cache attention (docs/semantics.md "KV cache"): its own plain gather of
// each sequence's attended keys (the cache's tokens, then the new ones), attended by the
// reference engine, in either precision; and the `reference` backend's run of it.
#pragma once

#include "backends/reference/reference.hpp"
#include "problem/kv_cache.hpp"

namespace strideattn::detail {

// o [b, s_q, h, d_v] and lse [b, h, s_q] in logical row-major order (rows past a sequence's
// query length hold 0 and -inf). Reads the lengths and block table on the host; their errors
// come back as the status. Writes nothing.
[[nodiscard]] Status reference_kvcache_compute(const KvCacheProblem& problem, RefPrecision precision,
                                               ReferenceOutputs* out);

// The backend's run: the exact result, then the appended tokens written into the caches and
// O / LSE into their views (nothing is written when a check fails).
[[nodiscard]] Status reference_kvcache_forward(const KvCacheProblem& problem);

}  // namespace strideattn::detail
