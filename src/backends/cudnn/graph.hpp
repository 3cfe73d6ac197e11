// cuDNN graph description and cache interface of the `cudnn` backend. The key holds every
// tensor's real logical dims and strides in cuDNN's [b, h, s, d] order (permuted from our
// [b, s, h, d] views by the caller, never rebuilt from a layout name), the mask as cuDNN's
// diagonal band, the options, the post-scale bias (with its dBias) and the sink token; graph.cpp (the one translation
// unit that includes the cuDNN frontend) builds, caches and executes the graph for a key.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "strideattn/strideattn.hpp"

namespace strideattn::detail::cudnn {

// One tensor as cuDNN sees it: logical [b, h, s, d] dims and element strides.
struct TensorLayout {
  std::array<std::int64_t, 4> dim{0, 0, 0, 0};
  std::array<std::int64_t, 4> stride{0, 0, 0, 0};
  bool operator==(const TensorLayout&) const = default;
};

// cuDNN's diagonal band mask (see docs/backends.md): with `bottom_right` the diagonal of
// each sequence is shifted by s_kv - s_q; cuDNN keeps key j for query i iff
//   j <= i + shift + right_bound            (when has_right)
//   j >  i + shift - left_bound             (when has_left; left_bound >= 1)
struct Band {
  bool bottom_right = false;
  bool has_left = false, has_right = false;
  std::int64_t left_bound = 0, right_bound = 0;
  bool operator==(const Band&) const = default;
};

struct GraphKey {
  int device = 0;
  bool backward = false;
  DType dtype = DType::bf16;
  TensorLayout q, k, v, o;       // o: output (forward) or input (backward)
  TensorLayout d_o, dq, dk, dv;  // backward only
  bool stats = false;            // forward: write packed [b, h, s_q, 1] fp32 stats; backward: always read
  bool varlen = false;           // padding mask with seq-len tensors + ragged offsets on every tensor
  // KV-cache forward: padding mask with seq-len tensors, no ragged offsets (Q and O padded to
  // s_q, the caches to their capacity). Paged: k / v are the page containers [num_pages, hg,
  // page_size, d] read through int32 page tables [b, 1, table_pages, 1] (packed), and
  // max_seq_kv = table_pages * page_size.
  bool kv = false;
  bool paged = false;
  std::int64_t table_pages = 0, max_seq_kv = 0;
  Band band;
  double scale = 1.0;
  bool deterministic = false;
  // Post-scale bias [1 or b, 1 or h, s_q, s_kv] (rules.hpp bias_layout_of) in `bias_dtype`;
  // backward: dBias [1, h, s_q, s_kv] in the same dtype when `dbias`.
  bool bias = false, dbias = false;
  DType bias_dtype = DType::bf16;
  TensorLayout bias_layout, dbias_layout;
  // Sink token: fp32 [1, h, 1, 1], contiguous; backward: its gradient when `d_sinks`.
  bool sinks = false, d_sinks = false;
  bool operator==(const GraphKey&) const = default;
};

struct GraphKeyHash {
  std::size_t operator()(const GraphKey& key) const;
};

// Device pointers for one execution. Varlen: int32 tables of length b (seq lens) and b + 1
// (ragged element offsets, one table per tensor).
struct GraphPointers {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* stats = nullptr;  // packed [b, h, s_q, 1]
  const void* d_o = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  const std::int32_t* seq_len_q = nullptr;
  const std::int32_t* seq_len_kv = nullptr;
  // ragged offsets, indexed by RaggedSlot
  std::array<const std::int32_t*, 8> ragged{};
  const std::int32_t* page_table_k = nullptr;  // paged KV cache: [b, table_pages]
  const std::int32_t* page_table_v = nullptr;
  const void* bias = nullptr;    // with GraphKey::bias
  void* dbias = nullptr;         // with GraphKey::dbias
  const float* sinks = nullptr;  // with GraphKey::sinks
  float* d_sinks = nullptr;      // with GraphKey::d_sinks
  void* workspace = nullptr;     // at least prepare()'s workspace bytes
};
enum RaggedSlot : int { kRagQ = 0, kRagK, kRagV, kRagO, kRagDO, kRagDQ, kRagDK, kRagDV };

// Result of building (or finding) the graph for a key. `ok == false`: `stage` names the
// frontend step that failed and `message` is cuDNN's own text.
struct PrepareResult {
  bool ok = false;
  std::int64_t workspace_bytes = 0;
  std::string stage, message;
};

// Builds the graph for `key` on the current device (cached; failures are cached too, so a
// refused problem is not rebuilt). Never prints, never throws.
[[nodiscard]] PrepareResult prepare(const GraphKey& key);

// Runs the cached graph of `key` (prepare() must have succeeded) on `stream`.
// Returns an empty string on success, otherwise cuDNN's message.
[[nodiscard]] std::string execute(const GraphKey& key, const GraphPointers& ptrs, void* stream);

// A built graph as a plan holds it: found once, then run without a cache lookup (no key
// hashing, no map); it stays alive while held, also after the cache evicted its entry.
struct GraphHandle;
// The graph of `key`, built or found in the cache; null when cuDNN refused it (`*result` says
// why, as prepare() does).
[[nodiscard]] std::shared_ptr<const GraphHandle> prepare_handle(const GraphKey& key, PrepareResult* result);
[[nodiscard]] std::string execute(const GraphHandle& graph, const GraphPointers& ptrs, void* stream);

// cudnnGetVersion() of the loaded library, e.g. 91900 for 9.19.0 (0 if it cannot load).
[[nodiscard]] std::int64_t runtime_version();

// Entries in the cache now (tests) and its bound.
[[nodiscard]] std::size_t cache_entries();
inline constexpr std::size_t kCacheCapacity = 256;

}  // namespace strideattn::detail::cudnn
