// A validated attention problem: the user's views plus the sizes, mask and varlen tables
// resolved once, so that backends and support checks read named fields instead of
// re-deriving them. Built only by make_problem(), which applies every validation rule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strideattn/strideattn.hpp"

namespace strideattn::detail {

enum class Direction { forward, backward };
struct KvCacheProblem;  // problem/kv_cache.hpp
[[nodiscard]] std::string_view to_string(Direction d);

struct Problem {
  Direction direction = Direction::forward;
  DType dtype = DType::f16;
  Memory memory = Memory::host;

  // sizes
  std::int64_t batch = 0;          // number of sequences
  std::int64_t s_q = 0, s_kv = 0;  // dense: extents; varlen: longest sequence
  std::int64_t heads = 0, kv_heads = 0;
  std::int64_t d_qk = 0, d_v = 0;

  // options, resolved
  MaskKind mask = MaskKind::none;
  Window window{};
  double scale = 0.0;  // never 0 after make_problem: the default 1/sqrt(d_qk) is filled in
  bool deterministic = false;
  const std::atomic<bool>* cancel = nullptr;  // AttentionOptions::cancel (host backends)

  // varlen: lengths and first-token offsets (offsets filled in when packed); empty if dense
  bool varlen = false;
  std::vector<std::int64_t> seqlens_q, seqlens_kv, offsets_q, offsets_kv;
  // varlen in the cu_seqlens form (Varlen::count > 0): batch is the count and s_q / s_kv the
  // caller's max_seqlen bounds. The arrays are the run's (null in a plan's problem); the lists
  // above stay empty unless a host backend's run read the arrays (read_cu_seqlens).
  bool cu_seqlens = false;
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_kv = nullptr;
  const std::int32_t* seq_offsets_q = nullptr;
  const std::int32_t* seq_offsets_kv = nullptr;
  // The lists hold every sequence (dense problems have none): false only for a cu_seqlens
  // problem whose arrays have not been read on the host.
  [[nodiscard]] bool lengths_known() const { return !cu_seqlens || std::int64_t(seqlens_q.size()) == batch; }

  // forward: LSE is written (set at make time; the data pointer may come with the run)
  bool lse_out = false;

  // the caller's views (unchanged)
  TensorView q, k, v, o;
  LseView lse;                 // forward: optional output; backward: required input
  TensorView d_o, dq, dk, dv;  // backward only

  void* stream = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;

  // training features (docs/semantics.md "Training features"), as the caller gave them; each
  // *_on flag says the feature is used (a plan's tensors may come with the run).
  double softcap = 0.0;  // 0: off
  BiasType bias_type = BiasType::none;
  BiasView bias{}, dbias{};
  HeadView alibi{}, sinks{}, max_logit{}, d_sinks{};
  bool alibi_on = false, sinks_on = false, max_logit_on = false, dbias_on = false, d_sinks_on = false;
  double dropout_p = 0.0;  // 0: off
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  const std::uint64_t* dropout_seed_ptr = nullptr;  // read at run time when set
  const std::uint64_t* dropout_offset_ptr = nullptr;

  [[nodiscard]] bool bias_on() const { return bias_type != BiasType::none; }
  [[nodiscard]] bool dropout_on() const { return dropout_p > 0.0; }
  [[nodiscard]] bool softcap_on() const { return softcap > 0.0; }
  [[nodiscard]] bool any_feature() const {
    return softcap_on() || bias_on() || alibi_on || sinks_on || max_logit_on || dropout_on() || dbias_on || d_sinks_on;
  }
  // A feature that changes a pair's logit or probability (bias, ALiBi, softcap, dropout). The
  // others leave the backward's P = exp(scale S - LSE) as it is without them: the sinks are in
  // the LSE the forward stored (their gradient is a reduction of their own), the max logit is
  // an output of the forward.
  [[nodiscard]] bool score_feature() const { return softcap_on() || bias_on() || alibi_on || dropout_on() || dbias_on; }
  // The call's dropout seed and offset (host backends: the pointers are host memory).
  [[nodiscard]] std::uint64_t seed_value() const { return dropout_seed_ptr ? *dropout_seed_ptr : dropout_seed; }
  [[nodiscard]] std::uint64_t offset_value() const { return dropout_offset_ptr ? *dropout_offset_ptr : dropout_offset; }

  // KV-cache attention (problem/kv_cache.hpp): the problem selection is asked with; null otherwise.
  const KvCacheProblem* kv_cache = nullptr;

  [[nodiscard]] bool is_backward() const { return direction == Direction::backward; }
  [[nodiscard]] bool writes_lse() const { return lse_out; }
  [[nodiscard]] std::int64_t group_size() const { return heads / kv_heads; }
  // Tokens in the seq dimension of the views (dense: s_q / s_kv).
  [[nodiscard]] std::int64_t q_tokens() const { return q.shape[kSeq]; }
  [[nodiscard]] std::int64_t kv_tokens() const { return k.shape[kSeq]; }
  // (query, key) pairs the mask leaves visible, summed over sequences and query heads.
  [[nodiscard]] double visible_pairs() const;
  // FLOPs by docs/design.md's convention: forward 2 * pairs * (d_qk + d_v); backward 2.5x that.
  [[nodiscard]] double flops() const;
};

// How make_problem treats the pointers of the arguments:
//   bound     - a call: every non-empty view needs its data, LSE is written iff lse.data is
//               set, and the overlap rules are checked on the pointers;
//   deferred  - a plan: a null pointer is given at run time (it is then unchecked here; the
//               run checks it), a forward writes LSE when lse.data or lse.shape is set.
enum class Pointers { bound, deferred };

// Validate arguments and build the problem. On error, `out` is unspecified and the status
// names the tensor, the value found and what is supported.
[[nodiscard]] Status make_problem(const ForwardArgs& args, Problem* out, Pointers mode = Pointers::bound);
[[nodiscard]] Status make_problem(const BackwardArgs& args, Problem* out, Pointers mode = Pointers::bound);

}  // namespace strideattn::detail
