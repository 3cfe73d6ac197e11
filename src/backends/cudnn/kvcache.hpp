// KV-cache attention on the `cudnn` backend (docs/backends.md, "cudnn", "KV-cache attention"):
// the graph key of a KvCacheProblem (a padded-batch SDPA forward with cuDNN's padding mask and
// per-sequence length tensors; paged caches through cuDNN's page tables), its workspace, and
// one call: the `cuda` backend's append kernel (when new tokens are given), the lengths and
// page table for cuDNN (kv_kernels.hpp), the cached graph, the rows' fix-up. Nothing here
// reads the lengths or the block table on the host; the graph is built once per key (the
// graph cache), and a call with the caller's workspace allocates nothing.
#pragma once

#include <cstddef>

#include "backends/cudnn/graph.hpp"
#include "problem/kv_cache.hpp"

namespace strideattn::detail::cudnn {

// Our [b, s, h, d] view as cuDNN's [b, h, s, d] (cudnn_backend.cpp).
[[nodiscard]] TensorLayout layout_of(const TensorView& t, std::int64_t batch, std::int64_t s, bool varlen);

// The graph key of a KV-cache problem whose mask maps onto `band`.
[[nodiscard]] GraphKey make_kv_key(const KvCacheProblem& p, const Band& band, int device);

// Bytes one call needs: cuDNN's workspace, the lengths, flags and packed page table, the stats.
[[nodiscard]] Status kv_workspace_size(const KvCacheProblem& p, std::size_t* bytes);

// The call (preconditions: the backend's support rules passed).
[[nodiscard]] Status kv_forward(const KvCacheProblem& p);

}  // namespace strideattn::detail::cudnn
