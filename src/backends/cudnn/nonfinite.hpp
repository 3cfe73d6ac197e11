// The non-finite fix-ups of the `cudnn` backend (docs/semantics.md, "Non-finite values,
// overflow and the scale"): cuDNN gives a row whose scores are NaN the "no key" answer
// (O = 0, LSE = -inf) and its backward turns such rows into inf or finite gradients. These
// kernels run on the caller's stream after the graph and put the definition's NaN back:
//   forward   every row that sees a key (MaskRule) and whose stats are not finite gets NaN
//             in its O row and its stats (the LSE the caller receives);
//   backward  a row that sees a key is bad when its LSE is not finite, its dO holds a
//             non-finite value, or D = rowsum(dO * O) is not finite. A bad row gets NaN in
//             its dQ row; every key a bad row of its GQA group sees gets NaN in dK, and in dV
//             too unless the row is bad only through D (O alone non-finite: P and dO are
//             finite, so the definition's dV stays finite).
// On finite inputs nothing is written beyond cuDNN's stats and a flag byte per row.
//
// cuDNN's backward is not exact at large logits (docs/backends.md, "Numerical envelope"): the
// row pass also marks the (sequence, KV head) groups with a row whose LSE, or largest |O|
// times largest |dO|, lies outside ExactRecomputeLimits, and for those groups exact_backward.cuh recomputes dQ, dK and
// dV from Q, K, V, O and dO in fp64 before the NaN of bad rows and keys goes in. On problems inside the envelope that
// costs one more launch whose blocks read one int and stop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/attention_math.hpp"

namespace strideattn::detail::cudnn {

// Finite rows whose LSE (cuDNN's stats) is above `lse_above` or below `lse_below`, or whose
// largest |O| times largest |dO| exceeds `od_above`, make the backward recompute their group
// exactly. LSE above: cuDNN's dV is measured off by 0.5-20 % once typical logits reach about
// 2e4 (the LSE, about the row's max logit, a few times that); 1024 keeps a margin of more
// than an order of magnitude. Below: cuDNN scores padded tile entries 0 and forms
// exp(0 - LSE), which overflows fp32 once LSE < -88. |O| |dO|: f16 inputs of 3e3 with logits
// of 1 (a tiny scale) fail the rule on dK while the LSE stays small; 1024 is inputs of about
// 32, where the capped fuzz found no mismatch, and far above unit-scale activations and
// loss-scaled gradients.
struct ExactRecomputeLimits {
  float lse_above = 1024.f;
  float lse_below = -64.f;
  float od_above = 1024.f;
};

// The limits in force: the defaults, or those of the innermost live
// ScopedExactRecomputeLimits (tests only: {-inf, -inf, -inf} recomputes every group,
// {inf, -inf, inf} none; not thread-safe against concurrent calls).
[[nodiscard]] ExactRecomputeLimits exact_recompute_limits();

class ScopedExactRecomputeLimits {
 public:
  explicit ScopedExactRecomputeLimits(ExactRecomputeLimits limits);
  ~ScopedExactRecomputeLimits();
  ScopedExactRecomputeLimits(const ScopedExactRecomputeLimits&) = delete;
  ScopedExactRecomputeLimits& operator=(const ScopedExactRecomputeLimits&) = delete;

 private:
  ExactRecomputeLimits limits_;
  const ExactRecomputeLimits* previous_;
};

// What the fix-ups read and write. `a` is make_params() of the problem with the varlen
// tables (q_seq, kv_seq seqlens and offsets) replaced by device copies; dense problems keep
// them null. q_seq.max_len is the packed stats' row count per (sequence, head).
struct NonFiniteFix {
  kernel::AttentionParams a;
  bool bf16 = true;            // the tensors' dtype: bf16, else f16 (cuDNN takes no other)
  float* stats = nullptr;      // packed [batch, heads, q_seq.max_len]: cuDNN's stats
  ExactRecomputeLimits exact;  // backward: which groups are recomputed exactly
};

// Workspace bytes nonfinite_backward needs (a multiple of 256).
[[nodiscard]] std::size_t nonfinite_backward_scratch(const kernel::AttentionParams& a);

// Forward fix-up (after the graph wrote O and the stats; before the stats go to the caller).
[[nodiscard]] std::string nonfinite_forward(const NonFiniteFix& f, void* stream);

// Backward fix-up (after the graph wrote dQ, dK, dV). `scratch`: nonfinite_backward_scratch
// bytes of device memory, 4-byte aligned (its parts start at multiples of 256 bytes from
// it); its contents on entry do not matter.
[[nodiscard]] std::string nonfinite_backward(const NonFiniteFix& f, void* scratch, void* stream);

}  // namespace strideattn::detail::cudnn
