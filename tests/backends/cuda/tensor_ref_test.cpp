// The sequence-relative addressing every cuda kernel loads and stores through
// (src/backends/cuda/common/tensor_ref.hpp), on the host: a TensorRef of sequence `batch`
// puts element (token, head, 0) where the tensor's own strides put it, for dense and varlen
// sequence tables, padded rows, transposed memory and reversed (negative) strides.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backends/cuda/common/tensor_ref.hpp"

namespace {

using strideattn::cuda_impl::sequence_ref;
using strideattn::kernel::SequenceTable;
using strideattn::kernel::Strides;

// Element offset of (b, s, h, 0) by the strides alone: what every row must equal.
std::int64_t by_strides(const Strides& st, std::int64_t b, std::int64_t s, std::int64_t h) {
  return b * st.b + s * st.s + h * st.h;
}

TEST(CudaTensorRef, DenseViewsFollowTheirStrides) {
  // (addresses are compared, never read; every one stays inside the buffer, reversed
  // strides included)
  const std::vector<std::uint16_t> buffer(200000);
  const std::uint16_t* const origin = buffer.data() + 100000;
  const std::int64_t b = 3, s = 50, h = 4, d = 64;
  const SequenceTable dense{nullptr, nullptr, s};
  const Strides layouts[] = {
      {s * h * d, h * d, d, 1},                     // bshd
      {h * d, b * h * d, d, 1},                     // sbhd memory passed as bshd
      {h * s * d, d, s * d, 1},                     // bhsd.transpose(1, 2)
      {s * h * (d + 64), h * (d + 64), d + 64, 1},  // rows padded to d + 64
      {-s * h * d, -h * d, -d, 1},                  // every dim but d reversed
  };
  for (const Strides& st : layouts)
    for (std::int64_t batch = 0; batch < b; ++batch) {
      const auto ref = sequence_ref(origin, st, dense, batch);
      for (std::int64_t token : {0, 1, 49})
        for (std::int64_t head : {0, 3})
          EXPECT_EQ(ref.row(token, head) - origin, by_strides(st, batch, token, head))
              << "batch " << batch << " token " << token << " head " << head << " strides " << st.b << "," << st.s
              << "," << st.h;
    }
}

TEST(CudaTensorRef, VarlenSequencesStartAtTheirOffsets) {
  std::vector<std::uint16_t> buffer(200 * 8 * 64);
  std::uint16_t* const origin = buffer.data();
  const std::vector<std::int64_t> lengths{30, 0, 90}, offsets{0, 30, 35};  // a gap before sequence 2
  const SequenceTable packed{lengths.data(), offsets.data(), 90};
  const Strides st{0, 8 * 64, 64, 1};  // [1, tokens, 8 heads, 64]
  for (std::int64_t batch = 0; batch < 3; ++batch) {
    const auto ref = sequence_ref(origin, st, packed, batch);  // (the writable overload: outputs)
    EXPECT_EQ(ref.row(0, 0) - origin, offsets[batch] * st.s);
    EXPECT_EQ(ref.row(7, 5) - origin, (offsets[batch] + 7) * st.s + 5 * st.h);
  }
}

}  // namespace
