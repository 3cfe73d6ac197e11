// Runs one attention case end to end, the way `strideattn check`, `fuzz` and the tests do:
// allocate the named buffers (host, and a device mirror for GPU backends), fill them with
// fresh random values, poison the outputs, run each backend, check that every element of
// each output view was written and nothing outside the output views changed (guard
// bands), and compare with the fp64 reference under the correctness rule (docs/semantics.md).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harness/compare.hpp"
#include "harness/views.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::harness {

struct CaseSpec {
  DType dtype = DType::bf16;
  ProblemSizes sizes;       // varlen when sizes.seqlens_q is non-empty
  LayoutViews views;        // from make_layout_views() or given explicitly
  std::string layout_name;  // what the views came from ("" for explicit views)
  AttentionOptions options;
  bool grad = false;       // also run and check the backward
  std::uint64_t seed = 1;  // random inputs are drawn from this seed
  // Every input buffer's normal(0, 1) draws are multiplied by this before rounding to the
  // dtype (large values reach fp32 overflow; docs/semantics.md, "Non-finite values").
  double input_scale = 1.0;
  // Non-finite values planted in the inputs after the draw: logical element `index` (row-
  // major over the view's shape, clamped to it) of `tensor` (q, k, v or do) set to `value`
  // (NaN or +-inf: what the CLI's --plant-input reproduces).
  struct InputPlant {
    std::string tensor;
    std::int64_t index = 0;
    double value = 0;
  };
  std::vector<InputPlant> input_plants;
  // Varlen lengths given to the library as cu_seqlens arrays (Varlen::count, int32, in the
  // tensors' memory: the device mirror for GPU backends) instead of host lists (--cu-seqlens).
  bool cu_seqlens = false;
  // Each backend runs through plans made without pointers (make_plan, then run with the
  // case's pointers) instead of the per-call functions (--via-plan).
  bool via_plan = false;
  // Training features (docs/semantics.md "Training features"): softcap, dropout and the bias
  // type are `options`' fields; these are the tensors. Feature buffers the harness owns are
  // named "#alibi", "#sinks", "#max_logit", "#d_sinks" (fp32) and "#dbias" (bias_dtype), and
  // hold fresh random values like every input (slopes |normal| / 4: positive, as ALiBi's).
  struct Features {
    // The bias view [B, H, SQ, SKV] in ViewSpec's four dimensions (with options.bias_type).
    // Its buffer has bias_dtype; a buffer it shares with Q/K/V/O/... must have the case's dtype.
    std::optional<ViewSpec> bias;
    DType bias_dtype = DType::f32;
    // dBias (with grad and a bias): this view, else contiguous [B, H, SQ, SKV] in "#dbias".
    std::optional<ViewSpec> dbias;
    std::int64_t alibi_rows = 0;  // ALiBi slopes [alibi_rows, h]: 0 (off), 1 or b
    bool sinks = false;           // sinks [1, h] (and d_sinks with grad)
    bool max_logit = false;       // the forward writes max_logit [b, h]
    [[nodiscard]] bool any() const { return bias || alibi_rows > 0 || sinks || max_logit; }
  };
  Features features;
  [[nodiscard]] bool any_feature() const {
    return features.any() || options.softcap > 0 || options.dropout.p > 0 || options.bias_type != BiasType::none;
  }

  // Test hook (tests only; the CLI never sets it): corrupt one result of every backend run
  // after the run and before the checks, to prove the checks catch it. kind "value" adds
  // `delta` to logical element `index` of output `tensor` (o, lse, dq, dk, dv, max_logit,
  // dbias, d_sinks), "ulps" adds
  // `delta` units in the last place of the element's stored value (an LSE the backward then
  // reads, a few ulps off); "unwritten"
  // puts the poison back into that element; "guard" changes the element just past the end of
  // the tensor's buffer (its back guard band).
  struct Plant {
    std::string kind, tensor;
    std::int64_t index = 0;
    double delta = 0;
  };
  std::optional<Plant> plant;
};

// Whether a training feature of the case changes the logits or the weights of P (every one
// but the max logit): the rule's conditioning allowances (conditioning.hpp) model the plain
// scores, so such a case is judged by the tolerance from the naive model alone.
[[nodiscard]] inline bool features_change_scores(const CaseSpec& spec) {
  return spec.options.softcap > 0 || spec.options.dropout.p > 0 || spec.options.bias_type != BiasType::none ||
         spec.features.bias || spec.features.alibi_rows > 0 || spec.features.sinks;
}

// The one-line `strideattn check ...` command that reproduces `spec`.
[[nodiscard]] std::string reproducer(const CaseSpec& spec, const std::vector<Backend>& backends);

struct BackendResult {
  Backend backend = Backend::reference;
  std::string status;               // "ok" | "unsupported" | "error" | "mismatch"
  std::string reason;               // unsupported/error: the library's message; mismatch: worst element
  std::optional<Backend> chosen;    // Backend::automatic: the backend auto chose for the forward
  std::vector<TensorCheck> checks;  // o, lse, max_logit, and with grad dq, dk, dv, dbias, d_sinks
  bool guard_ok = true;             // nothing outside the output views changed
  bool written_ok = true;           // every element inside the output views was written
  double time_ms = 0;               // one timed run (use bench_backend for real timing)
  double tflops = 0;
};

struct CaseReport {
  std::string layout;  // the library's description of the views (explain)
  std::vector<BackendResult> backends;
  [[nodiscard]] bool all_ok() const;  // every backend ok or unsupported
};

// Called with what the harness starts next ("computing the fp64 reference", "running cpu
// (1/2)"), for a progress line; may be empty.
using Progress = std::function<void(const std::string&)>;

// Invalid specs (bad views, validation failures) return invalid_argument with the library's
// message; per-backend problems are reported in `report`.
[[nodiscard]] Status run_case(const CaseSpec& spec, const std::vector<Backend>& backends, CaseReport* report,
                              const Progress& progress = {});

struct BenchResult {
  Backend backend = Backend::reference;
  std::string status, reason;
  double median_ms = 0, tflops = 0;
  int runs = 0;
};
// The benchmark protocol (docs/design.md): warm up, then the median of at least `runs` timed
// runs (CUDA events on GPU backends); with spec.grad, forward + backward.
[[nodiscard]] Status bench_case(const CaseSpec& spec, const std::vector<Backend>& backends, int runs,
                                std::vector<BenchResult>* results, const Progress& progress = {});

// The library's explain() for the case's views on host buffers (the backward too when `bwd`
// is not null). Invalid views return invalid_argument with the library's message.
[[nodiscard]] Status explain_case(const CaseSpec& spec, Explanation* fwd, Explanation* bwd);

// Host memory a case takes, in bytes, as the runner checks it before allocating (a case
// past 75% of the machine's memory is refused). Buffers count their real extents (offset +
// the largest element a positive stride reaches + 1; stride 0 adds nothing) times the
// buffer, its pristine copy, its snapshot and its output mask. With the fp64 reference
// (run_case; not explain or bench): 64 bytes per logical output element, and the
// reference's per-thread fp64 copies of one head's K and V rows.
struct HostMemoryEstimate {
  double buffers = 0, reference = 0, scratch = 0;
  [[nodiscard]] double total() const { return buffers + reference + scratch; }
};
[[nodiscard]] HostMemoryEstimate estimate_host_memory(const CaseSpec& spec, bool with_reference);

// True when a CUDA device is usable in this process (false in CPU-only builds).
[[nodiscard]] bool gpu_available();

}  // namespace strideattn::harness
