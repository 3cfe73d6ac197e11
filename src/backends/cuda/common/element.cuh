// The 16-bit element types of the kernels (f16, bf16): packing fp32 pairs into the 32-bit
// registers the MMAs take, conversions, and the paired global store every epilogue uses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "strideattn/strideattn.hpp"

namespace strideattn::cuda_impl {

template <class T>
struct ElementTraits;
template <>
struct ElementTraits<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t u) {
    __half2 h = *reinterpret_cast<__half2*>(&u);
    return __half22float2(h);
  }
  static __device__ __forceinline__ uint16_t from_float(float x) { return __half_as_ushort(__float2half_rn(x)); }
  static __device__ __forceinline__ float to_float(uint16_t u) { return __half2float(__ushort_as_half(u)); }
};
template <>
struct ElementTraits<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t u) {
    __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&u);
    return __bfloat1622float2(h);
  }
  static __device__ __forceinline__ uint16_t from_float(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
  static __device__ __forceinline__ float to_float(uint16_t u) { return __bfloat162float(__ushort_as_bfloat16(u)); }
};

// The API's name of a 16-bit element type (the kernel table's key).
template <class T>
constexpr DType dtype_of() {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "f16 or bf16");
  return std::is_same_v<T, __half> ? DType::f16 : DType::bf16;
}

// Store two adjacent elements (cols col, col+1) of one row; 4-byte store when the target is
// 4-byte aligned (`pair_aligned`: base pointer and strides even), two 2-byte stores otherwise.
template <class T>
__device__ __forceinline__ void store_pair(uint16_t* row_ptr, int col, float x0, float x1, bool pair_aligned) {
  if (pair_aligned) {
    *reinterpret_cast<uint32_t*>(row_ptr + col) = ElementTraits<T>::pack(x0, x1);
  } else {
    row_ptr[col] = ElementTraits<T>::from_float(x0);
    row_ptr[col + 1] = ElementTraits<T>::from_float(x1);
  }
}

}  // namespace strideattn::cuda_impl
