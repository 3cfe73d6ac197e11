// Philox4x32-10 (Salmon et al., SC'11; Random123's constants) and the dropout keep decision of
// docs/semantics.md "Dropout", for the `cpu` backend and the CUDA kernels: plain C++ that
// compiles under nvcc (host and device) and any host compiler. The `reference` backend has its
// own implementation (backends/reference/reference_features.cpp); tests hold both to the
// published known-answer vectors and to each other.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define STRIDEATTN_HD __host__ __device__ __forceinline__
#else
#define STRIDEATTN_HD inline
#endif

namespace strideattn::kernel {

struct Philox4 {
  std::uint32_t w[4];
};

STRIDEATTN_HD Philox4 philox4x32_10(Philox4 c, std::uint32_t k0, std::uint32_t k1) {
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c.w[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c.w[2];
    const Philox4 n{{static_cast<std::uint32_t>(p1 >> 32) ^ c.w[1] ^ k0, static_cast<std::uint32_t>(p1),
                     static_cast<std::uint32_t>(p0 >> 32) ^ c.w[3] ^ k1, static_cast<std::uint32_t>(p0)}};
    c = n;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// The dropout stream of one (batch, query head, query row): key words of 4 consecutive keys
// come from one Philox call (counter word 0 = key >> 2).
struct DropoutRow {
  std::uint32_t k0 = 0, k1 = 0;  // the seed
  std::uint32_t row = 0;         // counter word 1: the query row
  std::uint32_t n0 = 0, n1 = 0;  // counter words 2, 3: offset + batch * heads + head
  std::uint32_t threshold = 0;   // keep iff the word >= threshold

  STRIDEATTN_HD static DropoutRow make(std::uint64_t seed, std::uint64_t offset, std::int64_t batch, std::int64_t heads,
                                       std::int64_t head, std::int64_t row, std::uint32_t threshold) {
    const std::uint64_t n = offset + static_cast<std::uint64_t>(batch) * static_cast<std::uint64_t>(heads) +
                            static_cast<std::uint64_t>(head);
    DropoutRow r;
    r.k0 = static_cast<std::uint32_t>(seed);
    r.k1 = static_cast<std::uint32_t>(seed >> 32);
    r.row = static_cast<std::uint32_t>(row);
    r.n0 = static_cast<std::uint32_t>(n);
    r.n1 = static_cast<std::uint32_t>(n >> 32);
    r.threshold = threshold;
    return r;
  }
  // The four words of keys 4 * quad .. 4 * quad + 3.
  STRIDEATTN_HD Philox4 words(std::int64_t quad) const {
    return philox4x32_10(Philox4{{static_cast<std::uint32_t>(quad), row, n0, n1}}, k0, k1);
  }
  STRIDEATTN_HD bool keep(std::int64_t key) const { return words(key >> 2).w[key & 3] >= threshold; }
};

// floor(p * 2^32) as the keep threshold (0 <= p < 1).
STRIDEATTN_HD std::uint32_t dropout_threshold(double p) {
  const double t = p * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(t);
}

}  // namespace strideattn::kernel
