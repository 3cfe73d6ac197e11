// The executable specification (docs/semantics.md): plain loops over a validated problem,
// reading every tensor through its real strides. Two precisions:
//   exact      - fp64 everywhere (the truth every backend is compared with);
//   naive_lowp - docs/semantics.md's "naive implementation in the same low precision": inputs in
//                the dtype, S and softmax in fp32, P rounded to the dtype before P.V, outputs
//                rounded (backward likewise: dS rounded to the dtype before the dQ/dK GEMMs).
// The error of naive_lowp against exact sets each backend's tolerance.
#pragma once

#include <vector>

#include "problem/problem.hpp"

namespace strideattn::detail {

enum class RefPrecision { exact, naive_lowp };

// Results in contiguous row-major arrays with the *logical* shapes of the output views:
// o [B, S_q, H, Dv], lse [B, H, S_q], dq like q, dk like k, dv like v, where B and S are the
// views' extents (varlen: B = 1, S = tokens). Elements no sequence covers (varlen padding)
// hold what docs/semantics.md says the backends write there (0; LSE -inf).
// naive_lowp values are already rounded to the dtype (held in double).
struct ReferenceOutputs {
  std::vector<double> o, lse;
  std::vector<double> dq, dk, dv;  // backward only
  // Training features (docs/semantics.md), each empty unless the problem asks for it:
  // max_logit [B, H] (forward), dbias in the bias's logical shape [B', H', SQ', SKV'] and
  // d_sinks [H] (backward).
  std::vector<double> max_logit, dbias, d_sinks;
};

// Forward; for a backward problem also the gradients (using d_o from the problem; o and lse
// are recomputed, not read from the problem's o/lse views).
[[nodiscard]] ReferenceOutputs reference_compute(const Problem& problem, RefPrecision precision);

// Where the backward of a backward problem takes O (for D = rowsum(dO * O)) from:
//   recompute - this computation's own forward (the overload above);
//   given_o   - the problem's o view, as every backend does (docs/semantics.md "Backward"):
//               the backward of the given O, which the correctness rule compares with.
// P is always this computation's own softmax (a given LSE only reproduces it). The returned
// o and lse are always this computation's own forward.
enum class RefBackwardInputs { recompute, given_o };

// The backward targets docs/semantics.md "Correctness rule" compares a backend's dQ/dK/dV
// with (exact and naive alike): f16/bf16 given_o (the O handed to the backward carries a
// rounding to the dtype that no backend can undo), f32 recompute (the true gradient).
[[nodiscard]] RefBackwardInputs backward_targets(DType dtype);
[[nodiscard]] ReferenceOutputs reference_compute(const Problem& problem, RefPrecision precision,
                                                 RefBackwardInputs inputs);

}  // namespace strideattn::detail
