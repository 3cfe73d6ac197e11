// Running a plan (plan.hpp) on a stream: the kernel parameters from the problem's pointers and
// the workspace, the varlen tables, and the launch sequence of each direction. Only enqueues
// work: no synchronisation, no allocation (the caller brings a workspace of
// plan.workspace.total bytes, 16-byte aligned).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/plan.hpp"
#include "problem/problem.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::cuda_impl {

[[nodiscard]] Status launch(const CudaPlan& plan, const detail::Problem& problem, cudaStream_t stream,
                            unsigned char* workspace);

// The varlen tables at the start of the workspace, in the layout the kernels read
// (kernel::SequenceTable): 4 x batch int64, seqlens_q, offsets_q, seqlens_kv, offsets_kv. The
// one place they are written: today a copy of the problem's host tables.
[[nodiscard]] Status fill_varlen_tables(const detail::Problem& problem, std::int64_t* tables, cudaStream_t stream);

}  // namespace strideattn::cuda_impl
