// Host side of the `cuda` backend's KV-cache attention (docs/semantics.md "KV cache"): the
// support rule of the decode kernels, the plan of a call (head-dim bucket, row tiles, the split
// count from the problem and the device's cached caps, the workspace) and its run on a stream.
// Nothing here reads the lengths or the block table: they stay in device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "backends/cuda/decode/decode_params.hpp"
#include "backends/cuda/device_caps.hpp"
#include "backends/cuda/plan.hpp"
#include "problem/kv_cache.hpp"

namespace strideattn::cuda_impl {

// Query rows per sequence and query head from which a KV-cache call runs the dense forward
// (sm90/forward.cuh wgmma on sm_90a, sm80/forward.cuh elsewhere) instead of the decode
// kernels. The decode kernel packs the GQA group's rows into 16-row mma.sync tiles and
// spreads each sequence's keys over CTAs: right for decode (group x s_q of 1..few rows),
// but every one of its row tiles re-reads the sequence's K and V and it has no wgmma path,
// so chunked prefill runs at a fraction of the dense forward's rate. The dense forward runs
// one query head per CTA in blocks of 128 query rows (the wgmma forward; 64 or 128 on the
// mma.sync one) and does not pack the group, so what decides its efficiency is s_q itself,
// not group x s_q: from 64 rows at least half of each 128-row block does work. (Group 8 at
// s_q 8 is 64 rows per KV head but 8 of each block's 128: the decode kernel's.)
inline constexpr std::int64_t kDenseMinQueryRows = 64;

struct DecodePlan {
  int bucket = 64;            // head-dim bucket of the split kernel
  int row_tiles = 0;          // ceil(group * s_q / kDecodeRows)
  int splits = 1;             // of each sequence's keys (decode_splits)
  int per_sm = 1;             // split-kernel CTAs resident per multiprocessor (shared memory)
  std::size_t workspace = 0;  // bytes: the partial rows when splits > 1 (dense: the forward's)
  // The dense forward instead (kv_cache_dense): its plan for selection_problem(p), with the
  // paged instantiation for a paged cache; `why` says which kernels run and why.
  bool dense = false;
  CudaPlan forward;
  std::string why;
};

// Whether a KV-cache call runs the dense forward: the forcing's choice, else s_q >=
// kDenseMinQueryRows (and a problem with heads and sequences).
[[nodiscard]] bool kv_cache_dense(const detail::KvCacheProblem& p, const PlanForcing& forcing);

// Why the decode kernels cannot run `p` on this GPU (the value found and what is supported),
// or nullopt. The dense rules (dtype, head dims, head-dim strides of Q, the caches and O, grid,
// device) are the backend's own and run before this one.
[[nodiscard]] std::optional<std::string> decode_refusal(const detail::KvCacheProblem& p, const DeviceCaps& caps);

// The support rule of the kernels the call runs: decode_refusal, or the dense forward's plan
// refusal (cuda_plan_refusal) where kv_cache_dense picks it.
[[nodiscard]] std::optional<std::string> kv_cache_refusal(const detail::KvCacheProblem& p, const DeviceCaps& caps,
                                                          const PlanForcing& forcing);

[[nodiscard]] DecodePlan make_decode_plan(const detail::KvCacheProblem& p, const DeviceCaps& caps,
                                          const PlanForcing& forcing = {});

// The kernels' parameters of `p` that do not depend on a plan: pointers, strides, sizes, mask.
[[nodiscard]] DecodeParams decode_params(const detail::KvCacheProblem& p);

// The append of p's new tokens into its caches alone (nothing without an append), on `stream`:
// the `cudnn` backend's first step (its graph then reads the caches). Launch errors only.
[[nodiscard]] Status run_append(const detail::KvCacheProblem& p, cudaStream_t stream);

// Launches the plan's kernels on `stream` with `workspace` (at least plan.workspace bytes,
// 16-byte aligned, or null when it needs none): the append, then the decode kernels or the
// dense forward (run_prefill). Asynchronous: returns launch errors only.
[[nodiscard]] Status run_decode(const detail::KvCacheProblem& p, const DecodePlan& plan, int device,
                                cudaStream_t stream, unsigned char* workspace);

// The dense forward of a plan with `dense` (decode/prefill_host.cpp), after the append.
[[nodiscard]] Status run_prefill(const detail::KvCacheProblem& p, const DecodePlan& plan, cudaStream_t stream,
                                 unsigned char* workspace);

}  // namespace strideattn::cuda_impl
