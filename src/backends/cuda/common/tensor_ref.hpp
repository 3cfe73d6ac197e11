// Sequence-relative addressing of a [b, s, h, d] tensor through its own strides: a
// TensorRef is one sequence of one tensor (dense: batch index `batch`; varlen: the tokens of
// sequence `batch` in the packed seq dimension), and row(token, head) the address of element
// (token, head, 0) of it. Every load and store of the kernels addresses a tensor this way,
// so no code derives a stride from a layout. Plain host-device C++ (a CPU test checks it).
#pragma once

#include <cstdint>

#include "common/attention_math.hpp"

namespace strideattn::cuda_impl {

template <class E>
struct TensorRef {
  E* data = nullptr;                         // the tensor's element (0, 0, 0, 0)
  std::int64_t base = 0;                     // offset of the sequence's element (token 0, head 0, dim 0)
  const kernel::Strides* strides = nullptr;  // the tensor's (read where used: in a kernel, the parameters)
  SA_HD E* row(std::int64_t token, std::int64_t head) const {
    return data + (base + token * strides->s + head * strides->h);
  }
  SA_HD std::int64_t token_stride() const { return strides->s; }
};

// Sequence `batch` of the 16-bit tensor at `data` with strides `st`, whose tokens the side's
// table `seq` (queries or keys) lays out.
SA_HD TensorRef<const std::uint16_t> sequence_ref(const void* data, const kernel::Strides& st,
                                                  const kernel::SequenceTable& seq, std::int64_t batch) {
  return {static_cast<const std::uint16_t*>(data), seq.span(st, batch).base, &st};
}
SA_HD TensorRef<std::uint16_t> sequence_ref(void* data, const kernel::Strides& st, const kernel::SequenceTable& seq,
                                            std::int64_t batch) {
  return {static_cast<std::uint16_t*>(data), seq.span(st, batch).base, &st};
}

}  // namespace strideattn::cuda_impl
