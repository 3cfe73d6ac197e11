// Varlen cu_seqlens arrays (docs/semantics.md, "cu_seqlens arrays") -> the int64 tables the
// `cuda` kernels read (KernelParams: seqlens_q, offsets_q, seqlens_kv, offsets_kv, `count`
// entries each, in that order at the start of the workspace), computed on the device on the
// caller's stream, without a host read or a synchronisation. Every length is clamped to its
// bound and every sequence to its view, so arrays that break the caller's promise cannot make
// the kernels reach outside the views. Called by each run of a cu_seqlens plan
// (launch.cpp, fill_varlen_tables); tested on its own by tests/backends/cuda/varlen_tables_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strideattn::cuda_impl {

struct CuSeqlensInput {
  const std::int32_t* cu_q = nullptr;   // count + 1 entries (device memory)
  const std::int32_t* cu_kv = nullptr;  // count + 1 entries
  const std::int32_t* off_q = nullptr;  // count entries, or null: cu_q
  const std::int32_t* off_kv = nullptr;
  std::int64_t count = 0;
  std::int64_t max_q = 0, max_kv = 0;        // the caller's bounds
  std::int64_t q_tokens = 0, kv_tokens = 0;  // the views' seq extents
};

// Writes tables[0, 4 * count): lengths and first tokens of each side, clamped.
[[nodiscard]] cudaError_t launch_varlen_tables(const CuSeqlensInput& in, std::int64_t* tables, cudaStream_t stream);

}  // namespace strideattn::cuda_impl
