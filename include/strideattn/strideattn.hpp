// strideattn public C++ API: strided tensor views, forward/backward argument structs,
// backend choice, workspace query and `explain`. No CUDA or cuDNN header is included here;
// streams are passed as opaque `void*` (a cudaStream_t).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
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

// Varlen (THD) description, host memory. Sequence i has `seqlens[i]` tokens starting at
// token `offsets[i]` of the tensor's seq dimension. Empty `offsets` means packed back to back
// (the prefix sum of seqlens). Sequences may be empty; gaps between sequences are padding.
struct Varlen {
  std::vector<std::int64_t> seqlens_q, seqlens_kv;
  std::vector<std::int64_t> offsets_q, offsets_kv;
  [[nodiscard]] bool enabled() const { return !seqlens_q.empty() || !seqlens_kv.empty(); }
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

struct AttentionOptions {
  MaskKind mask = MaskKind::none;
  Window window{};
  std::optional<double> scale{};  // default 1/sqrt(d_qk)
  bool deterministic = false;     // backward: bitwise reproducible run to run
};

enum class Backend { automatic, reference, cpu, cuda, cudnn };
[[nodiscard]] std::string_view to_string(Backend backend);
[[nodiscard]] std::optional<Backend> backend_from_string(std::string_view name);
inline constexpr std::array<Backend, 4> kConcreteBackends{Backend::reference, Backend::cpu,
                                                          Backend::cuda, Backend::cudnn};

// Where the tensors live; GPU backends need device memory, CPU backends host memory.
enum class Memory { host, device };

// ---------------------------------------------------------------- arguments

struct ForwardArgs {
  TensorView q, k, v;    // [b, s_q, h, d_qk], [b, s_kv, hg, d_qk], [b, s_kv, hg, d_v]
  TensorView o;          // [b, s_q, h, d_v], written
  LseView lse{};         // optional output (data == nullptr: not written)
  AttentionOptions options{};
  Varlen varlen{};
  Backend backend = Backend::automatic;  // STRIDEATTN_BACKEND overrides `automatic`
  Memory memory = Memory::host;
  void* stream = nullptr;             // cudaStream_t for GPU backends
  void* workspace = nullptr;          // optional: see workspace_size(); null = library allocates
  std::size_t workspace_bytes = 0;
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
  Status validation;            // invalid input: the first rule broken
  std::string layout;           // e.g. "sbhd_sbhd_sbhd" or a description of the views
  std::vector<Verdict> verdicts;  // every backend, in `auto` preference order
  std::optional<Backend> chosen;  // what `automatic` would run
};

[[nodiscard]] Explanation explain(const ForwardArgs& args);
[[nodiscard]] Explanation explain(const BackwardArgs& args);

// The library's version string, and which backends this build contains.
[[nodiscard]] std::string_view version();
[[nodiscard]] bool backend_compiled(Backend backend);

}  // namespace strideattn
