// The KV-cache kernels for f16 (decode_launch.cuh): one translation unit per dtype, so a
// 2-core build compiles them in parallel.
#include "backends/cuda/decode/decode_launch.cuh"

namespace strideattn::cuda_impl {

cudaError_t launch_decode_f16(const DecodeParams& p, int bucket, int device, cudaStream_t stream) {
  return launch_decode<__half>(p, bucket, device, stream);
}

cudaError_t launch_append_f16(const DecodeParams& p, cudaStream_t stream) { return launch_append<__half>(p, stream); }

}  // namespace strideattn::cuda_impl
