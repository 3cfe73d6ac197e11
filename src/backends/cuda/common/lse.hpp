// The roundings the backward's P depends on, written once for the kernels and a CPU test
// (tests/backends/cuda/lse_test.cpp): the forward's LSE from its row max and sum, and the
// backward's base-2 exponent of P from a score and that LSE (docs/semantics.md, "Backward";
// common/softmax.cuh says why these roundings and not others). Every product is rounded to
// fp32 on its own (never contracted into an FMA), on the device by the _rn intrinsics, on the
// host through a volatile store.
#pragma once

#include "common/attention_math.hpp"

namespace strideattn::cuda_impl {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

SA_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  volatile float r = a * b;
  return r;
#endif
}
SA_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  volatile float r = a - b;
  return r;
#endif
}
SA_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  volatile float r = a + b;
  return r;
#endif
}

// The natural-log LSE of a row from its raw max score m (scale not applied) and log2 of its
// sum l of 2^(round(S c) - round(m c)): round(m scale) + ln l. A row with l = 1 stores exactly
// round(m scale), the rounded score of its max.
SA_HD float lse_of_row(float row_max, float log2_l, float scale) {
  return add_rn(mul_rn(row_max, scale), mul_rn(log2_l, kLn2));
}

// The base-2 exponent of the backward's P = exp(round(s scale) - lse) for a raw score s:
// (round(s scale) - lse) log2 e, the difference taken before the change of base, so the max
// of a row with l = 1 gets exactly 0 (P = 1) at any magnitude and any scale. lse is +inf for
// rows that see no key (the exponent is then -inf, P = 0).
SA_HD float p_exponent_log2(float s, float lse, float scale) { return mul_rn(sub_rn(mul_rn(s, scale), lse), kLog2e); }

}  // namespace strideattn::cuda_impl
