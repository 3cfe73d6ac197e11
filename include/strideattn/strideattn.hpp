// strideattn public C++ API: strided tensor views, forward/backward argument structs,
// backend choice, workspace query and `explain`. No CUDA or cuDNN header is included here;
// streams are passed as opaque `void*` (a cudaStream_t).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strideattn {

// ---------------------------------------------------------------- status

enum class StatusCode {
  ok = 0,
  invalid_argument,  // the input breaks a rule of the contract (exit code 2 in the CLI)
  unsupported,       // valid input that the chosen backend cannot run (reason says why)
  backend_error,     // a backend failed at run time (CUDA / cuDNN error, out of memory)
  internal,
  cancelled,  // the caller's AttentionOptions::cancel flag stopped the call
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }
  [[nodiscard]] bool ok() const { return code_ == StatusCode::ok; }
  [[nodiscard]] StatusCode code() const { return code_; }
  [[nodiscard]] const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

[[nodiscard]] std::string_view to_string(StatusCode code);

// ---------------------------------------------------------------- tensors

enum class DType { f16, bf16, f32 };
[[nodiscard]] std::string_view to_string(DType dtype);
[[nodiscard]] std::size_t size_of(DType dtype);

// Logical dimension order of every Q/K/V/O-like tensor: [batch, seq, head, dim].
// For a varlen (THD) problem the batch extent is 1 and `seq` counts tokens.
enum Dim : int { kBatch = 0, kSeq = 1, kHead = 2, kHeadDim = 3 };
using Dims4 = std::array<std::int64_t, 4>;

// A pointer plus 64-bit element strides for each logical dimension. Strides are the truth:
// nothing in the library derives a stride from a layout name.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f16;
  Dims4 shape{0, 0, 0, 0};   // b, s, h, d
  Dims4 stride{0, 0, 0, 0};  // in elements
};

// Log-sum-exp of each attention row, natural log, fp32. Logical order [batch, head, seq]
// (THD: batch extent 1, seq counts tokens).
struct LseView {
  float* data = nullptr;
  std::array<std::int64_t, 3> shape{0, 0, 0};   // b, h, s_q
  std::array<std::int64_t, 3> stride{0, 0, 0};  // in elements
};

// Varlen (THD) description, in one of two forms (docs/semantics.md, "Tensors"):
//  - host lists: sequence i has `seqlens[i]` tokens starting at token `offsets[i]` of the
//    tensor's seq dimension. Empty `offsets` means packed back to back (the prefix sum of
//    seqlens). The lists are part of the problem (a plan is made for these lengths).
//  - cu_seqlens arrays (FlashAttention's and TransformerEngine's form), `count > 0`: int32
//    arrays in the tensors' memory (device memory for GPU backends), read by the backend when
//    the call runs, never copied to the host. cu_seqlens_q has count + 1 entries and sequence i
//    has cu_seqlens_q[i + 1] - cu_seqlens_q[i] query tokens; seq_offsets_q (optional, count
//    entries are read: TransformerEngine's cu_seqlens_q_padded) gives its first token, else
//    cu_seqlens_q[i]. max_seqlen_q/kv is the caller's bound on every length: a plan is made
//    for the count and the bounds, not for the lengths. Lengths that break the bound, or
//    sequences outside the views, are refused where the backend reads them on the host, and
//    on the device give unspecified outputs without a read or write outside the views.
// Sequences may be empty; gaps between sequences are padding.
struct Varlen {
  std::vector<std::int64_t> seqlens_q, seqlens_kv;
  std::vector<std::int64_t> offsets_q, offsets_kv;
  std::int64_t count = 0;  // > 0: the cu_seqlens form, with this many sequences
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_kv = nullptr;
  const std::int32_t* seq_offsets_q = nullptr;   // optional
  const std::int32_t* seq_offsets_kv = nullptr;  // optional
  std::int64_t max_seqlen_q = 0, max_seqlen_kv = 0;
  [[nodiscard]] bool enabled() const { return !seqlens_q.empty() || !seqlens_kv.empty() || count > 0; }
  [[nodiscard]] bool cu_seqlens() const { return count > 0; }
};

// ---------------------------------------------------------------- options

enum class MaskKind {
  none,
  causal,               // top-left aligned: key j visible from query i iff j <= i
  causal_bottom_right,  // j <= i + s_kv - s_q
};
// Mask names, one vocabulary for every entry point (C++, CLI, Python). Canonical names, which
// to_string returns: "none", "causal" (top-left), "causal_bottom_right". Aliases accepted by
// mask_from_string: "no_mask" (none), "top_left" and "causal_top_left" (causal),
// "bottom_right" and the older "causal-bottom-right" (causal_bottom_right). nullopt: unknown.
[[nodiscard]] std::string_view to_string(MaskKind mask);
[[nodiscard]] std::optional<MaskKind> mask_from_string(std::string_view name);

// Sliding window around the bottom-right diagonal: query i sees key j iff
// i + s_kv - s_q - left <= j <= i + s_kv - s_q + right; -1 means unbounded on that side.
struct Window {
  std::int64_t left = -1;
  std::int64_t right = -1;
  [[nodiscard]] bool unbounded() const { return left < 0 && right < 0; }
};

// ---------------------------------------------------------------- training features
// docs/semantics.md "Training features": softcap, additive bias, ALiBi, sinks, dropout, max logit.

// Where an additive bias joins the logits: after the scale (TransformerEngine's
// post_scale_bias: L = scale * Q K^T + bias) or before it (pre_scale_bias).
enum class BiasType { none, post_scale, pre_scale };
[[nodiscard]] std::string_view to_string(BiasType type);
[[nodiscard]] std::optional<BiasType> bias_type_from_string(std::string_view name);

// A bias (or its gradient) of logical shape [b or 1, h or 1, s_q or 1, s_kv or 1], any strides
// (stride 0 broadcasts too), f32 / f16 / bf16.
struct BiasView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::array<std::int64_t, 4> shape{0, 0, 0, 0};   // b, h, s_q, s_kv
  std::array<std::int64_t, 4> stride{0, 0, 0, 0};  // in elements
};

// An fp32 table of logical shape [rows, h]: ALiBi slopes (rows b or 1), sinks and their
// gradient (rows 1), the max logit (rows b). data == nullptr: not used.
struct HeadView {
  float* data = nullptr;
  std::array<std::int64_t, 2> shape{0, 0};   // rows, h
  std::array<std::int64_t, 2> stride{0, 0};  // in elements
};

// Dropout on the softmax probabilities; the mask is Philox4x32-10 of (seed, offset, batch,
// head, row, key). p == 0: no dropout. seed_ptr / offset_ptr, when set, are read when the call
// runs instead of seed / offset (in the tensors' memory), so a captured CUDA graph can replay
// with new values.
struct Dropout {
  double p = 0.0;
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  const std::uint64_t* seed_ptr = nullptr;
  const std::uint64_t* offset_ptr = nullptr;
};

struct AttentionOptions {
  MaskKind mask = MaskKind::none;
  Window window{};
  std::optional<double> scale{};  // default 1/sqrt(d_qk)
  bool deterministic = false;     // backward: bitwise reproducible run to run
  // Optional: set *cancel to true from another thread to stop a call on a host backend
  // (`reference`, `cpu`); it then returns StatusCode::cancelled within milliseconds and its
  // outputs are incomplete. GPU backends ignore it. The flag must outlive the call.
  const std::atomic<bool>* cancel = nullptr;
  double softcap = 0.0;  // > 0: logits become softcap * tanh(logit / softcap); 0: off
  Dropout dropout{};
  BiasType bias_type = BiasType::none;  // with ForwardArgs::bias / BackwardArgs::bias
};

enum class Backend { automatic, reference, cpu, cuda, cudnn };
[[nodiscard]] std::string_view to_string(Backend backend);
[[nodiscard]] std::optional<Backend> backend_from_string(std::string_view name);
inline constexpr std::array<Backend, 4> kConcreteBackends{Backend::reference, Backend::cpu, Backend::cuda,
                                                          Backend::cudnn};

// Where the tensors live; GPU backends need device memory, CPU backends host memory.
enum class Memory { host, device };

// ---------------------------------------------------------------- arguments

struct ForwardArgs {
  TensorView q, k, v;  // [b, s_q, h, d_qk], [b, s_kv, hg, d_qk], [b, s_kv, hg, d_v]
  TensorView o;        // [b, s_q, h, d_v], written
  LseView lse{};       // optional output (data == nullptr: not written)
  AttentionOptions options{};
  Varlen varlen{};
  Backend backend = Backend::automatic;  // STRIDEATTN_BACKEND overrides `automatic`
  Memory memory = Memory::host;
  void* stream = nullptr;     // cudaStream_t for GPU backends
  void* workspace = nullptr;  // optional: see workspace_size(); null = library allocates
  std::size_t workspace_bytes = 0;
  // Training features (docs/semantics.md); each unused when its data is null.
  BiasView bias{};          // with options.bias_type
  HeadView alibi_slopes{};  // [b or 1, h]
  HeadView sinks{};         // [1, h]
  HeadView max_logit{};     // [b, h], written
};

struct BackwardArgs {
  TensorView q, k, v, o, d_o;  // inputs (o and lse are the forward's outputs)
  LseView lse{};               // required input
  TensorView dq, dk, dv;       // written; dk/dv are summed over each GQA group
  AttentionOptions options{};
  Varlen varlen{};
  Backend backend = Backend::automatic;
  Memory memory = Memory::host;
  void* stream = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // Training features, as the forward had them; dbias and d_sinks are written when given.
  BiasView bias{};
  HeadView alibi_slopes{};
  HeadView sinks{};
  BiasView dbias{};    // the bias's logical shape; summed over its extent-1 dimensions
  HeadView d_sinks{};  // [1, h], summed over batches and rows
};

// ---------------------------------------------------------------- calls

[[nodiscard]] Status forward(const ForwardArgs& args);
[[nodiscard]] Status backward(const BackwardArgs& args);

// Bytes of scratch the backend that would run needs; pass that much as `workspace` to avoid
// an internal allocation. A workspace must start 16-byte aligned (cudaMalloc's are).
[[nodiscard]] Status workspace_size(const ForwardArgs& args, std::size_t* bytes);
[[nodiscard]] Status workspace_size(const BackwardArgs& args, std::size_t* bytes);

// One backend's answer to "can you run this problem?".
struct Verdict {
  Backend backend = Backend::reference;
  bool supported = false;
  std::string rule;    // name of the first failing rule, empty when supported
  std::string reason;  // the value found and the values supported, or why it was chosen
};

struct Explanation {
  Status validation;              // invalid input: the first rule broken
  std::string layout;             // e.g. "sbhd_sbhd_sbhd" or a description of the views
  std::vector<Verdict> verdicts;  // every backend, in `auto` preference order
  std::optional<Backend> chosen;  // what `automatic` would run
};

[[nodiscard]] Explanation explain(const ForwardArgs& args);
[[nodiscard]] Explanation explain(const BackwardArgs& args);

// ---------------------------------------------------------------- plans

// A plan is made once from a problem (ForwardArgs / BackwardArgs: validation, backend choice
// and its reason, the device query, the backend's preparation such as a cuDNN graph, and the
// workspace size) and run many times with new pointers and a stream. forward() and backward()
// are a plan made (or found in a cache of recent plans) and run.
//
// Pointers at make time are optional. A tensor whose `data` is null is given at run time and
// the plan assumes its data 16-byte aligned; a tensor given at make time is checked then and
// fixes the alignment the plan assumes (16 bytes, or what its address has). A forward plan
// writes LSE when `lse.data` is set or `lse.shape` is not all zero. Varlen cu_seqlens arrays
// are always given at run time (make-time pointers are checked and otherwise unused).
//
// Each run checks what depends on its pointers: null pointers, alignment against what the
// plan assumed (the error names the tensor), views that reach past the address space, outputs
// that overlap an input or each other (byte ranges first; the exact test only where ranges
// meet), and that every pointer lives where `memory` says. A plan is immutable and may run on
// several threads at once; copies share it.

// What changes from run to run; shapes, strides, dtype and options are the plan's.
struct ForwardRun {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;       // set iff the plan writes LSE
  void* stream = nullptr;     // cudaStream_t for GPU backends
  void* workspace = nullptr;  // at least workspace_size() bytes, 16-byte aligned; null: allocated
  std::size_t workspace_bytes = 0;
  // cu_seqlens varlen plans: the arrays of Varlen (in the tensors' memory); null otherwise.
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_kv = nullptr;
  const std::int32_t* seq_offsets_q = nullptr;   // optional
  const std::int32_t* seq_offsets_kv = nullptr;  // optional
  const std::atomic<bool>* cancel = nullptr;     // as AttentionOptions::cancel (host backends)
  // Training features: the tensors the plan was made with (set iff the plan uses them), and
  // the dropout seed and offset (a plan keeps neither; pointers as in Dropout).
  const void* bias = nullptr;
  const float* alibi_slopes = nullptr;
  const float* sinks = nullptr;
  float* max_logit = nullptr;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  const std::uint64_t* dropout_seed_ptr = nullptr;
  const std::uint64_t* dropout_offset_ptr = nullptr;
};

struct BackwardRun {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;
  const void* d_o = nullptr;
  const float* lse = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* stream = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_kv = nullptr;
  const std::int32_t* seq_offsets_q = nullptr;
  const std::int32_t* seq_offsets_kv = nullptr;
  const std::atomic<bool>* cancel = nullptr;
  const void* bias = nullptr;  // training features, as in ForwardRun
  const float* alibi_slopes = nullptr;
  const float* sinks = nullptr;
  void* dbias = nullptr;
  float* d_sinks = nullptr;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  const std::uint64_t* dropout_seed_ptr = nullptr;
  const std::uint64_t* dropout_offset_ptr = nullptr;
};

namespace detail {
struct PlanState;
struct PlanAccess;
struct PlanCacheAccess;
}  // namespace detail

// What both plan kinds report. An empty (default-constructed) plan refuses to run.
class PlanInfo {
 public:
  [[nodiscard]] bool valid() const { return state_ != nullptr; }
  [[nodiscard]] Backend backend() const;             // the backend that runs it
  [[nodiscard]] std::size_t workspace_size() const;  // bytes a run needs (0: none)
  // One line: the backend and why it was chosen, e.g. "forward runs on cudnn (auto, class
  // 'sm90 device', ...)". With STRIDEATTN_LOG=info every run logs it.
  [[nodiscard]] const std::string& reason() const;
  [[nodiscard]] bool writes_lse() const;

 protected:
  std::shared_ptr<const detail::PlanState> state_;
  friend struct detail::PlanAccess;
};

class ForwardPlan : public PlanInfo {
 public:
  [[nodiscard]] Status run(const ForwardRun& run) const;
};

class BackwardPlan : public PlanInfo {
 public:
  [[nodiscard]] Status run(const BackwardRun& run) const;
};

// Validates and prepares; on failure `*plan` is left empty and the status says why
// (invalid_argument: the input; unsupported: every backend's rule).
[[nodiscard]] Status make_plan(const ForwardArgs& args, ForwardPlan* plan);
[[nodiscard]] Status make_plan(const BackwardArgs& args, BackwardPlan* plan);

// Plans of recent problems, keyed by everything but the pointers (and the alignment class of
// each pointer), least recently used dropped first. Thread-safe. forward() and backward() use
// one of these (kDefaultPlanCacheCapacity plans); a framework binding may keep its own.
// STRIDEATTN_BACKEND is read when a plan is made: a problem with a plan keeps its backend.
class PlanCache {
 public:
  explicit PlanCache(std::size_t capacity = 64);
  ~PlanCache();
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;

  // The plan for `args` (made on a miss; failures are not kept).
  [[nodiscard]] Status get(const ForwardArgs& args, ForwardPlan* plan);
  [[nodiscard]] Status get(const BackwardArgs& args, BackwardPlan* plan);
  // get(), then run with `args`' pointers.
  [[nodiscard]] Status forward(const ForwardArgs& args);
  [[nodiscard]] Status backward(const BackwardArgs& args);

  struct Stats {
    std::size_t size = 0, capacity = 0;
    std::uint64_t hits = 0, misses = 0;
  };
  [[nodiscard]] Stats stats() const;
  void clear();  // drops every plan and zeroes the counts

 private:
  friend struct detail::PlanCacheAccess;
  struct Impl;
  Impl* impl_;
};
inline constexpr std::size_t kDefaultPlanCacheCapacity = 256;

// The cache forward(), backward() and workspace_size() use (stats, clear).
[[nodiscard]] PlanCache& default_plan_cache();

// The library's version string, and which backends this build contains.
[[nodiscard]] std::string_view version();
[[nodiscard]] bool backend_compiled(Backend backend);

}  // namespace strideattn

// ---------------------------------------------------------------- logging

namespace strideattn {

// Nothing is logged unless the level is above `off`. The level starts from the environment
// variable STRIDEATTN_LOG (read once; see log_level_from_string) and set_log_level overrides it.
// Below `debug`, a message repeated word for word (e.g. "forward runs on cpu (auto, class ...)",
// one per problem class and backend) is logged the first time, then as "... repeated N times:
// <message>" when N reaches a power of two, and once more with the final count on flush_log()
// or at exit. At `debug` every message is logged as it comes.
enum class LogLevel { off = 0, error = 1, warn = 2, info = 3, debug = 4 };
[[nodiscard]] std::string_view to_string(LogLevel level);
// Case-insensitive: off, error, warn, info, debug; also "warning" (warn), "verbose" (debug),
// "0" / "false" / "no" / "none" (off), "1" / "true" / "yes" / "on" (info), "2" (debug).
// nullopt for anything else (STRIDEATTN_LOG set to it logs a warning naming the accepted values
// and uses `warn`).
[[nodiscard]] std::optional<LogLevel> log_level_from_string(std::string_view text);
[[nodiscard]] LogLevel log_level();
// Also resets the repeat counts (pending counts are flushed first), so lines seen before show again.
void set_log_level(LogLevel level);

// Receives every record that passes the level: its level and the message (no prefix, no
// newline). It may be called from any thread that calls the library, never under a library
// lock. nullptr restores the default sink, which writes "[strideattn] <message>" lines to stderr
// ("[strideattn] warning: ..." / "error: ..." for those levels). At exit, pending repeat counts
// go to the default sink only: a program with its own sink calls flush_log() before it ends.
using LogSink = void (*)(LogLevel level, std::string_view message, void* user_data);
void set_log_sink(LogSink sink, void* user_data = nullptr);
// Emits the pending "... repeated N times" summaries now.
void flush_log();

}  // namespace strideattn

// ---------------------------------------------------------------- fp16 / bf16 conversion

#include <bit>

namespace strideattn {

// IEEE binary16 and bfloat16 bit patterns <-> float. Float to 16-bit rounds to nearest, ties
// to even (overflow gives infinity, tiny values give subnormals or signed zero); infinities
// keep their sign and NaNs stay NaN (sign and top payload bits kept, made quiet). 16-bit to
// float is exact.
[[nodiscard]] constexpr std::uint16_t half_from_float(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  std::uint32_t r, rem, halfway;
  if (ax >= 0x38800000u) {  // normal half: rebias the exponent, keep 10 mantissa bits
    r = (ax >> 13) - 0x1c000u;
    rem = ax & 0x1fffu;
    halfway = 0x1000u;
  } else {  // subnormal half (units of 2^-24) or zero
    const std::uint32_t shift = 126u - (ax >> 23);
    if (shift > 24u) return sign;
    const std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    r = m >> shift;
    rem = m & ((1u << shift) - 1u);
    halfway = 1u << (shift - 1u);
  }
  if (rem > halfway || (rem == halfway && (r & 1u))) ++r;  // a carry moves up an exponent
  return static_cast<std::uint16_t>(sign | r);
}

[[nodiscard]] constexpr float float_from_half(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t e = (bits >> 10) & 0x1fu;
  const std::uint32_t m = bits & 0x3ffu;
  if (e == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

[[nodiscard]] constexpr std::uint16_t bf16_from_float(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

[[nodiscard]] constexpr float float_from_bf16(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

}  // namespace strideattn

// KV-cache attention (KvCacheArgs, forward_with_kvcache).
#include "strideattn/kv_cache.hpp"
