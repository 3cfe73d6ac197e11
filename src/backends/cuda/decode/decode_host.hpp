// Host side of the `cuda` backend's KV-cache attention (docs/semantics.md "KV cache"): the
// support rule of the decode kernels, the plan of a call (head-dim bucket, row tiles, the split
// count from the problem and the device's cached caps, the workspace) and its run on a stream.
// Nothing here reads the lengths or the block table: they stay in device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <optional>
#include <string>

#include "backends/cuda/decode/decode_params.hpp"
#include "backends/cuda/device_caps.hpp"
#include "problem/kv_cache.hpp"

namespace strideattn::cuda_impl {

struct DecodePlan {
  int bucket = 64;            // head-dim bucket of the split kernel
  int row_tiles = 0;          // ceil(group * s_q / kDecodeRows)
  int splits = 1;             // of each sequence's keys (decode_splits)
  int per_sm = 1;             // split-kernel CTAs resident per multiprocessor (shared memory)
  std::size_t workspace = 0;  // bytes: the partial rows when splits > 1
};

// Why the decode kernels cannot run `p` on this GPU (the value found and what is supported),
// or nullopt. The dense rules (dtype, head dims, head-dim strides of Q, the caches and O, grid,
// device) are the backend's own and run before this one.
[[nodiscard]] std::optional<std::string> decode_refusal(const detail::KvCacheProblem& p, const DeviceCaps& caps);

[[nodiscard]] DecodePlan make_decode_plan(const detail::KvCacheProblem& p, const DeviceCaps& caps);

// The kernels' parameters of `p` that do not depend on a plan: pointers, strides, sizes, mask.
[[nodiscard]] DecodeParams decode_params(const detail::KvCacheProblem& p);

// The append of p's new tokens into its caches alone (nothing without an append), on `stream`:
// the `cudnn` backend's first step (its graph then reads the caches). Launch errors only.
[[nodiscard]] Status run_append(const detail::KvCacheProblem& p, cudaStream_t stream);

// Launches the plan's kernels on `stream` with `workspace` (at least plan.workspace bytes,
// 16-byte aligned, or null when it needs none). Asynchronous: returns launch errors only.
[[nodiscard]] Status run_decode(const detail::KvCacheProblem& p, const DecodePlan& plan, int device,
                                cudaStream_t stream, unsigned char* workspace);

}  // namespace strideattn::cuda_impl
