// The launches of one KV-cache call on a stream (decode_launch.cuh), one entry per dtype
// (decode_f16.cu, decode_bf16.cu): the append (when new tokens are given), the split kernel of
// the head-dim bucket, and the combine when the keys are split. Host code calls these.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/decode/decode_params.hpp"

namespace strideattn::cuda_impl {

// `bucket`: 64, 128 or 256 (head_dim_bucket of d_qk, d_v); `device`: the current device, for
// the once-per-device grant of dynamic shared memory. Returns the first launch error.
cudaError_t launch_decode_f16(const DecodeParams& p, int bucket, int device, cudaStream_t stream);
cudaError_t launch_decode_bf16(const DecodeParams& p, int bucket, int device, cudaStream_t stream);
// The append of new tokens alone (nothing when p.s_new is 0): the first launch of the above.
cudaError_t launch_append_f16(const DecodeParams& p, cudaStream_t stream);
cudaError_t launch_append_bf16(const DecodeParams& p, cudaStream_t stream);

}  // namespace strideattn::cuda_impl
