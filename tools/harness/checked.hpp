// Overflow-checked 64-bit arithmetic for the sizes, offsets, strides and extents the harness
// takes from the command line or the fuzzer: a sum or product that does not fit in int64 is
// reported (nullopt) or saturated, never wrapped (signed overflow is undefined behaviour).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>

namespace strideattn::harness {

inline constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

[[nodiscard]] inline std::optional<std::int64_t> checked_add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

[[nodiscard]] inline std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of every factor; nullopt when it (or a partial product) does not fit.
[[nodiscard]] inline std::optional<std::int64_t> checked_product(std::initializer_list<std::int64_t> factors) {
  std::int64_t r = 1;
  for (std::int64_t f : factors)
    if (__builtin_mul_overflow(r, f, &r)) return std::nullopt;
  return r;
}

// a + b for non-negative operands, kInt64Max when the sum does not fit.
[[nodiscard]] inline std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  return checked_add(a, b).value_or(a < 0 ? std::numeric_limits<std::int64_t>::min() : kInt64Max);
}

}  // namespace strideattn::harness
