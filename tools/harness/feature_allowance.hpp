// Private to strideattn_harness: the part of the correctness rule for dBias that the
// conditioning allowances (conditioning.hpp, which model the plain scores) do not cover. A
// dBias element of a broadcast bias is one fp32 sum of dL over every (batch, head, row, key)
// that reads it, up to b h s_q s_kv terms that mostly cancel; the naive model's error, from
// one summation order, does not bound another order's, and the worst-case bound
// gamma(n) sum |term| is far above what any order reaches (it would make the check vacuous).
// The allowance is statistical instead: the rounding of each addition and of each term taken
// as independent and uniform (the usual model of long fp32 sums), 8 standard deviations.
#pragma once

#include <vector>

#include "backends/reference/reference.hpp"

namespace strideattn::harness::internal {

// Per dBias element (logical row-major in the bias's shape), with x its n exact terms, w = 2^-23:
//   8 w (sqrt(n) (||x||_2 + |sum x|) + sqrt(d_qk + d_v + 16) ||x||_2)
// (the partial sums of a sum of n terms hold about sqrt(n) ||x||_2 of random walk and up to
// |sum x| of drift; each term carries the rounding of its dot products of d_qk and d_v). The
// terms are the reference's dBias of the same bias viewed at full extent with stride 0 on its
// broadcast dimensions. Empty when the bias broadcasts on no dimension (one term per element:
// the tolerance covers it) or the per-pair array would exceed 2^26 elements.
[[nodiscard]] std::vector<double> dbias_allowance(const detail::Problem& backward, detail::RefBackwardInputs inputs);

}  // namespace strideattn::harness::internal
