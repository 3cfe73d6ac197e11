// Running a plan (plan.hpp) on a stream. prepare_launch, once per plan: the kernel parameters
// that do not depend on the run's pointers, and a host-list varlen problem's tables. launch,
// per run: the pointers bound (tensors, their alignment, the workspace pieces), the varlen
// tables written, and the launch sequence of each direction. launch only enqueues work: no
// synchronisation, no allocation, no device query (the caller brings a workspace of
// plan.workspace.total bytes, 16-byte aligned).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/plan.hpp"
#include "backends/cuda/sm90/ws_params.hpp"
#include "problem/problem.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::cuda_impl {

struct PreparedLaunch {
  CudaPlan plan;
  KernelParams params;  // everything but the pointers: sizes, strides, mask, scales, splits
  // Varlen lists (host memory): the tables in the kernels' layout (below), uploaded by each
  // run; empty for dense and cu_seqlens problems.
  std::vector<std::int64_t> host_tables;
  // The warp-specialized forward (plan.main.entry->tma): the TMA maps of Q, K and V, made
  // once here from the views' strides with placeholder addresses; each run patches its
  // pointers into a copy.
  TmaForwardMaps maps{};
  // The warp-specialized dK/dV pass (a backward plan's main.entry->tma): Q, K, V and dO's.
  TmaBackwardMaps backward_maps{};
};

// `problem` is the plan's (its pointers, if any, are not kept).
[[nodiscard]] PreparedLaunch prepare_launch(CudaPlan plan, const detail::Problem& problem);

// One run of `prepared` with the pointers of `run` (the plan's problem with this run's
// pointers bound) on the current device, which must be the plan's.
[[nodiscard]] Status launch(const PreparedLaunch& prepared, const detail::Problem& run, cudaStream_t stream,
                            unsigned char* workspace);

// The varlen tables at the start of the workspace, in the layout the kernels read
// (kernel::SequenceTable): 4 x batch int64, seqlens_q, offsets_q, seqlens_kv, offsets_kv. The
// one place they are written: for cu_seqlens arrays, computed from them on the device
// (varlen_tables.hpp: every length clamped to its bound and every sequence to its view);
// otherwise a copy of `host_tables` (PreparedLaunch).
[[nodiscard]] Status fill_varlen_tables(const detail::Problem& run, const std::vector<std::int64_t>& host_tables,
                                        std::int64_t* tables, cudaStream_t stream);

}  // namespace strideattn::cuda_impl
