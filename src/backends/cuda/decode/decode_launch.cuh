// launch_decode<T> (decode_launch.hpp): the kernels of a KV-cache call in stream order, the
// append first (its writes are what the attention reads), then the split kernel, then the
// combine when the keys are split. Included by the per-dtype translation units.
#pragma once

#include <atomic>
#include <cstdint>

#include "backends/cuda/decode/append.cuh"
#include "backends/cuda/decode/combine.cuh"
#include "backends/cuda/decode/decode_launch.hpp"
#include "backends/cuda/decode/split_kernel.cuh"

namespace strideattn::cuda_impl {

// Grid-stride CTAs of the append and combine: enough to fill any current GPU several times.
inline constexpr unsigned kDecodeAuxBlocks = 4096;

// The split kernel of bucket D with its dynamic shared memory granted once per device
// (cudaFuncSetAttribute is a driver call every launch would otherwise repeat).
template <class T, int D, bool Vec, bool Paged>
cudaError_t launch_split_as(const DecodeParams& p, int device, cudaStream_t stream) {
  static std::atomic<std::uint64_t> granted{0};
  constexpr DecodeTile kTile = decode_tile(D);
  const std::uint64_t bit = device >= 0 && device < 64 ? std::uint64_t(1) << device : 0;
  if (bit == 0 || (granted.load(std::memory_order_acquire) & bit) == 0) {
    if (cudaError_t e = cudaFuncSetAttribute(&decode_split_kernel<T, D, Vec, Paged>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, kTile.smem_bytes);
        e != cudaSuccess) {
      (void)cudaGetLastError();
      return e;
    }
    granted.fetch_or(bit, std::memory_order_acq_rel);
  }
  const std::int64_t x = p.kv_heads * p.row_tiles * p.splits;
  if (x == 0 || p.batch == 0) return cudaSuccess;
  decode_split_kernel<T, D, Vec, Paged>
      <<<dim3(unsigned(x), unsigned(p.batch)), kDecodeThreads, kTile.smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

// The instantiation for the caches: K and V both 16-byte loadable (cp.async) or not (element
// loads), contiguous or paged.
template <class T, int D>
cudaError_t launch_split(const DecodeParams& p, int device, cudaStream_t stream) {
  constexpr std::uint32_t kVecKv = kVecK | kVecV;
  const bool vec = (p.aligned & kVecKv) == kVecKv, paged = p.block_table != nullptr;
  if (paged)
    return vec ? launch_split_as<T, D, true, true>(p, device, stream)
               : launch_split_as<T, D, false, true>(p, device, stream);
  return vec ? launch_split_as<T, D, true, false>(p, device, stream)
             : launch_split_as<T, D, false, false>(p, device, stream);
}

inline unsigned aux_blocks(std::int64_t work) {
  return unsigned(work < std::int64_t(kDecodeAuxBlocks) ? work : std::int64_t(kDecodeAuxBlocks));
}

// The append alone (nothing without new tokens): also what the cudnn backend runs before its graph.
template <class T>
cudaError_t launch_append(const DecodeParams& p, cudaStream_t stream) {
  if (p.s_new <= 0 || p.kv_heads <= 0 || p.batch <= 0) return cudaSuccess;
  append_kernel<T><<<aux_blocks(p.batch * p.s_new), 128, 0, stream>>>(p);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_decode(const DecodeParams& p, int bucket, int device, cudaStream_t stream) {
  if (cudaError_t e = launch_append<T>(p, stream); e != cudaSuccess) return e;
  const cudaError_t e = bucket == 64    ? launch_split<T, 64>(p, device, stream)
                        : bucket == 128 ? launch_split<T, 128>(p, device, stream)
                                        : launch_split<T, 256>(p, device, stream);
  if (e != cudaSuccess || p.splits <= 1) return e;
  const std::int64_t rows = p.batch * p.heads * p.s_q;
  if (rows == 0) return cudaSuccess;
  decode_combine_kernel<T><<<aux_blocks((rows + kDecodeWarps - 1) / kDecodeWarps), kDecodeThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace strideattn::cuda_impl
