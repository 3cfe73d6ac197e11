// Host-side conversions between float and the 16-bit storage types (IEEE binary16 and
// bfloat16), round-to-nearest-even, plus typed element load/store through a DType.
// Used by the CPU backends and the test harness; the CUDA kernels use cuda_fp16/bf16.
#pragma once

#include <cstdint>
#include <cstring>

#include "strideattn/strideattn.hpp"

namespace strideattn::detail {

inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(std::uint16_t h) { return bits_to_float(std::uint32_t(h) << 16); }
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    float f = float(man) * (1.0f / 16777216.0f);  // subnormal: man * 2^-24
    return sign ? -f : f;
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (man << 13));
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}
inline std::uint16_t float_to_f16(float f) {
  const std::uint32_t u = float_to_bits(f);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow -> inf
  if (abs < 0x38800000u) {                        // subnormal or zero
    const float a = bits_to_float(abs);
    // round(a * 2^24) with ties to even via float arithmetic
    const float scaled = a * 16777216.0f;
    std::uint32_t m = std::uint32_t(scaled);
    const float rem = scaled - float(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return std::uint16_t(sign | m);
  }
  std::uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);  // round mantissa to 10 bits
  r -= 112u << 23;
  return std::uint16_t(sign | (r >> 13));
}

// Load element `i` (element offset from base) of a tensor of `dtype` as float / double.
inline float load_as_float(const void* base, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::f32:
      return static_cast<const float*>(base)[i];
    case DType::f16:
      return f16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::bf16:
      return bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
  }
  return 0.f;
}
inline void store_from_float(void* base, DType dtype, std::int64_t i, float x) {
  switch (dtype) {
    case DType::f32:
      static_cast<float*>(base)[i] = x;
      return;
    case DType::f16:
      static_cast<std::uint16_t*>(base)[i] = float_to_f16(x);
      return;
    case DType::bf16:
      static_cast<std::uint16_t*>(base)[i] = float_to_bf16(x);
      return;
  }
}
// Round a float to the precision of `dtype` (identity for f32).
inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::f32:
      return x;
    case DType::f16:
      return f16_to_float(float_to_f16(x));
    case DType::bf16:
      return bf16_to_float(float_to_bf16(x));
  }
  return x;
}

}  // namespace strideattn::detail
