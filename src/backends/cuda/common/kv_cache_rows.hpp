// KV-cache rows for the kernels of the `cuda` backend (docs/semantics.md "KV cache"): a
// sequence's lengths as read from device memory (kv_seq_lengths, the one rule the decode
// kernels and the dense forward share), the addressing of a contiguous or paged cache
// (CacheRef: the same row(token, head) as TensorRef, through the block table when paged) and
// the 32-bit fast divide it uses for the page of a token. Plain host-device C++ (a CPU test
// checks it).
#pragma once

#include <cstdint>

#include "common/attention_math.hpp"

namespace strideattn::cuda_impl {

// n / d and n % d for 0 <= n < 2^31 and 1 <= d < 2^31 without a division: q = (n m) >> p with
// p = 31 + ceil(log2 d) and m = ceil(2^p / d) (< 2^32). m d - 2^p = e < d <= 2^(p - 31), so
// n e < 2^p and the floor is exact (Granlund & Montgomery). A paged cache holds at most
// 2^31 - 1 tokens per sequence (validated), so every token index is in range; a 64-bit
// division per row would cost several times as many instructions.
struct FastDivmod {
  std::uint32_t d = 1, m = 0x80000000u, p = 31;
  FastDivmod() = default;
  explicit FastDivmod(std::uint32_t divisor) : d(divisor) {
    std::uint32_t l = 0;
    while ((std::uint64_t(1) << l) < divisor) ++l;
    p = 31 + l;
    m = std::uint32_t(((std::uint64_t(1) << p) + divisor - 1) / divisor);
  }
  SA_HD std::uint32_t div(std::uint32_t n) const { return std::uint32_t((std::uint64_t(n) * m) >> p); }
  SA_HD std::uint32_t mod(std::uint32_t n, std::uint32_t q) const { return n - q * d; }
};

// What the dense forward needs of a KV-cache call beyond kernel::AttentionParams (whose Q,
// K, V, O and LSE are the call's views, K and V the caches): the lengths in device memory and,
// for a paged cache, the block table. cache_seqlens null: not a KV-cache call.
struct KvCacheParams {
  const std::int32_t* cache_seqlens = nullptr;  // int32 [b]
  const std::int32_t* seqlens_q = nullptr;      // int32 [b], or null: every sequence has s_q rows
  std::int64_t s_q = 0, s_new = 0, capacity = 0;
  // Paged caches: the int32 block table [b, max_pages] with any strides (null: contiguous),
  // the pages 0 .. num_pages - 1 it may name, and the page size as a fast divisor.
  const std::int32_t* block_table = nullptr;
  std::int64_t bt_b = 0, bt_p = 0, num_pages = 0;
  FastDivmod page;
};

// One sequence's lengths: the attended length L = cache_seqlens + s_new and the query rows
// used. `broken`: cache_seqlens or seqlens_q outside what the caller promised; the kernels
// then read no key, append nothing and write NaN to every O and LSE row of the sequence, so a
// broken promise is loud, never an out-of-bounds access.
struct SeqLengths {
  std::int64_t attended = 0, q_rows = 0;
  bool broken = false;
};
SA_HD SeqLengths kv_seq_lengths(const std::int32_t* cache_seqlens, const std::int32_t* seqlens_q, std::int64_t s_q,
                                std::int64_t s_new, std::int64_t capacity, std::int64_t n) {
  const std::int64_t cached = cache_seqlens[n];
  const std::int64_t rows = seqlens_q != nullptr ? std::int64_t(seqlens_q[n]) : s_q;
  SeqLengths s;
  s.broken = cached < 0 || cached + s_new > capacity || rows < 0 || rows > s_q;
  s.attended = s.broken ? 0 : cached + s_new;
  s.q_rows = s.broken ? 0 : rows;
  return s;
}
SA_HD SeqLengths kv_seq_lengths(const KvCacheParams& kv, std::int64_t n) {
  return kv_seq_lengths(kv.cache_seqlens, kv.seqlens_q, kv.s_q, kv.s_new, kv.capacity, n);
}

// The mask of a sequence: its query rows against its attended keys, so that every
// bottom-right diagonal and window is measured from the attended end.
SA_HD kernel::MaskRule kv_seq_mask(const SeqLengths& s, int kind, std::int64_t left, std::int64_t right) {
  kernel::MaskRule m;
  m.s_q = s.q_rows;
  m.s_kv = s.attended;
  m.kind = kind;
  m.left = left;
  m.right = right;
  return m;
}

// Sequence `batch` of a cache, as the dense forward's KV-cache instantiation reads it:
// contiguous (table null: the sequence's row of the cache, element (token, head) at base +
// token * st.s + head * st.h, as TensorRef) or paged (token t is slot t % page_size of page
// block_table[batch, t / page_size]). row(token, head) is the address of element (token, head,
// 0), or null when the block-table entry is outside 0 .. num_pages - 1 (a broken promise:
// nothing is read there). The strides are the cache's: b the sequence's or the page's, s the
// token's or the slot's, h the head's.
// (It keeps pointers to the parameters, not their values: a kernel reads them from its
// parameter space where used, so two refs cost no more registers than two TensorRefs.)
template <class E>
struct CacheRef {
  E* data = nullptr;
  const kernel::Strides* strides = nullptr;
  const KvCacheParams* kv = nullptr;
  std::int64_t batch = 0;
  std::uint16_t missing = 0;  // what a loader puts in a row it may not read (kv_fill.cuh)
  SA_HD E* row(std::int64_t token, std::int64_t head) const {
    const kernel::Strides& st = *strides;
    if (kv->block_table == nullptr) return data + (batch * st.b + token * st.s + head * st.h);
    const std::uint32_t t = std::uint32_t(token), j = kv->page.div(t);
    const std::int64_t pg = kv->block_table[batch * kv->bt_b + std::int64_t(j) * kv->bt_p];
    if (pg < 0 || pg >= kv->num_pages) return nullptr;
    return data + (pg * st.b + std::int64_t(kv->page.mod(t, j)) * st.s + head * st.h);
  }
};

SA_HD CacheRef<const std::uint16_t> cache_ref(const void* data, const kernel::Strides& st, const KvCacheParams& kv,
                                              std::int64_t batch, std::uint16_t missing) {
  return {static_cast<const std::uint16_t*>(data), &st, &kv, batch, missing};
}

}  // namespace strideattn::cuda_impl
