// A validated KV-cache attention problem (KvCacheArgs, docs/semantics.md "KV cache"): the
// caller's views plus the sizes resolved once, the checks of the lengths and block table that a
// host backend makes when it reads them, and the Problem that backend selection is asked with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem/problem.hpp"
#include "strideattn/kv_cache.hpp"

namespace strideattn::detail {

struct KvCacheProblem {
  KvCacheArgs args;  // the caller's views, options with the scale filled in
  DType dtype = DType::f16;
  std::int64_t batch = 0, s_q = 0, heads = 0, kv_heads = 0, d_qk = 0, d_v = 0;
  bool paged = false;
  std::int64_t num_pages = 0, page_size = 0, max_pages = 0;  // paged only
  std::int64_t capacity = 0;  // tokens one sequence's cache holds: s_max, or max_pages * page_size
  bool appends = false;       // k_new / v_new given
  std::int64_t s_new = 0;     // tokens appended to every sequence (0 without an append)
  double scale = 0.0;

  [[nodiscard]] std::int64_t group_size() const { return heads / kv_heads; }
};

// Validates and resolves. On error `out` is unspecified and the status names the tensor, the
// value found and what is supported. Nothing here reads the lengths or the block table.
[[nodiscard]] Status make_kvcache_problem(const KvCacheArgs& args, KvCacheProblem* out);

// The lengths of each sequence, read on the host: cache_seqlens, seqlens_q (s_q when absent).
struct KvCacheLengths {
  std::vector<std::int64_t> cache, q;
  [[nodiscard]] std::int64_t attended(std::int64_t n, std::int64_t s_new) const {
    return cache[std::size_t(n)] + s_new;
  }
};

// For backends that read the arrays on the host: every length in range (cache_seqlens >= 0 and
// cache_seqlens + s_new <= capacity, seqlens_q in 0 .. s_q), every block-table entry a sequence
// reads or writes (pages 0 .. ceil(attended / page_size) - 1) in 0 .. num_pages - 1, and no cache
// slot appended to by two sequences. invalid_argument names the array, the entry and the value.
[[nodiscard]] Status check_kvcache_lengths(const KvCacheProblem& p, KvCacheLengths* out);

// The Problem backend selection and support rules see: a dense forward problem of b sequences,
// s_q queries against at most `capacity` keys, q/o/lse as given and k/v the caches, with
// `kv_cache` pointing at `p` (which must outlive it).
[[nodiscard]] Problem selection_problem(const KvCacheProblem& p);

// One line describing the cache ("paged cache: 12 pages of 16 tokens, block table [3, 4], ...").
[[nodiscard]] std::string describe_kvcache(const KvCacheProblem& p);

}  // namespace strideattn::detail
