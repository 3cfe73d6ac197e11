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
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/attention_math.hpp"

namespace strideattn::detail::cudnn {

// What the fix-ups read and write. `a` is make_params() of the problem with the varlen
// tables (q_seq, kv_seq seqlens and offsets) replaced by device copies; dense problems keep
// them null. q_seq.max_len is the packed stats' row count per (sequence, head).
struct NonFiniteFix {
  kernel::AttentionParams a;
  bool bf16 = true;        // the tensors' dtype: bf16, else f16 (cuDNN takes no other)
  float* stats = nullptr;  // packed [batch, heads, q_seq.max_len]: cuDNN's stats
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
