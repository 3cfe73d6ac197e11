// The conditioning part of the correctness rule (docs/semantics.md, "Correctness rule",
// "Conditioning"): for every output element, computed in fp64 from the case's inputs, the
// largest change of the exact value that the fp32 rounding of its intermediates can cause in
// any summation order - the scores S (bounded by the fp32 dot-product error bound), and in
// the backward dP = dO V^T, D = rowsum(dO * O) and the exponent S - LSE - and whether some
// fp32 intermediate of that element can exceed FLT_MAX. compare.hpp turns these into each
// element's tolerance and its "fp32 overflow allowed" flag.
#pragma once

#include <cstdint>
#include <vector>

#include "problem/problem.hpp"

namespace strideattn::harness {

// Per output element, logical row-major like detail::ReferenceOutputs (o [B, S_q, H, Dv],
// lse [B, H, S_q], dq like q, dk like k, dv like v).
struct Conditioning {
  // The allowance: the bound on how far any fp32 evaluation may move the element through the
  // rounding named above (>= 0; +inf where nothing bounds it). 0 where the element is 0 by
  // definition (rows that see no key, keys no row sees, varlen padding) or where the row's
  // scores are not all finite (the non-finite rules decide those elements).
  std::vector<double> o, lse, dq, dk, dv;
  // 1 where some fp32 intermediate of the element (a score, a partial sum of the softmax or
  // of a gradient, dP, D) can exceed FLT_MAX in some summation order: a non-finite value
  // agrees there (docs/semantics.md, "fp32 overflow is never a finite wrong answer").
  std::vector<std::uint8_t> o_overflow, lse_overflow, dq_overflow, dk_overflow, dv_overflow;
};

// The allowances of `problem`'s outputs: the forward's (o, lse) with `forward`, the
// gradients' with `backward` (a backward problem); the other vectors stay 0. `given_o`:
// D = rowsum(dO * O) from the problem's O view, as the backward targets do for 16-bit dtypes
// (else from the exact fp64 O).
[[nodiscard]] Conditioning conditioning(const detail::Problem& problem, bool forward, bool backward, bool given_o);

// The forward error bound of n fp32 roundings of relative size w: gamma(n) = n w / (1 - n w)
// (+inf when n w >= 1). w = 2^-24 (fp32's unit roundoff) for f32 problems, which only
// round-to-nearest FMA units accumulate; 2^-23 for f16/bf16, whose accumulators may truncate
// (tensor cores), with up to twice that error per operation. The default is the larger.
[[nodiscard]] double fp32_gamma(double n, double w = 0x1p-23);

}  // namespace strideattn::harness
