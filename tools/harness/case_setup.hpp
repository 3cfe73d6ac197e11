// Private to strideattn_harness (not part of runner.hpp's API): the buffers and arguments of
// one case as run_case, bench_case and explain_case share them. The case's views, element
// pointers (host buffers or a device mirror), the forward/backward arguments on them, and
// prepare(): view bounds, host-memory and reference-work checks, fresh random inputs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/buffers.hpp"
#include "harness/runner.hpp"
#include "problem/problem.hpp"

namespace strideattn::harness::internal {

const char* const kLseBuffer = "#lse";  // not a legal CLI buffer name: never collides
// CaseSpec::cu_seqlens: int32 cu_seqlens_q [n + 1], cu_seqlens_kv [n + 1], seq_offsets_q [n],
// seq_offsets_kv [n] (4-byte elements; the offsets only when the case gives offsets).
const char* const kCuSeqlensBuffer = "#cu_seqlens";
// Training-feature buffers the harness owns (CaseSpec::Features).
const char* const kAlibiBuffer = "#alibi";
const char* const kSinksBuffer = "#sinks";
const char* const kMaxLogitBuffer = "#max_logit";
const char* const kDSinksBuffer = "#d_sinks";
const char* const kDBiasBuffer = "#dbias";

std::string fmt(double x);  // "%.4g"

// The views a case uses, and the LSE as a pseudo-view [b, h, s_q, 1] of its fp32 buffer.
struct CaseViews {
  const ViewSpec *q, *k, *v, *o, *d_o, *dq, *dk, *dv;
  ViewSpec lse;
  bool grad = false;
  // Training features: views of the bias [B, H, SQ, SKV] and dBias (bias dtype), and of the
  // fp32 head tables as [rows, h, 1, 1] (slopes, sinks, max logit, d_sinks). An empty buffer
  // name: not used.
  ViewSpec bias, dbias, alibi, sinks, max_logit, d_sinks;
  DType bias_dtype = DType::f32;
  [[nodiscard]] std::vector<const ViewSpec*> data_views() const {
    if (grad) return {q, k, v, o, d_o, dq, dk, dv};
    return {q, k, v, o};
  }
  // The feature views in use: inputs (bias, slopes, sinks) and each phase's outputs.
  [[nodiscard]] std::vector<const ViewSpec*> feature_inputs() const;
  [[nodiscard]] std::vector<const ViewSpec*> forward_feature_outputs() const;
  [[nodiscard]] std::vector<const ViewSpec*> backward_feature_outputs() const;
};

// Logical elements of a view; kInt64Max when that does not fit.
std::int64_t numel(const ViewSpec& v);

// Element pointers: buffer name -> element 0 (host buffer or its device mirror).
using Bases = std::map<std::string, std::byte*>;

ForwardArgs forward_args(const CaseSpec& spec, const CaseViews& cv, const Bases& bases, Backend backend, Memory memory);
BackwardArgs backward_args(const CaseSpec& spec, const CaseViews& cv, const Bases& bases, Backend backend,
                           Memory memory);
Bases host_bases(BufferSet& bufs);

// The case's varlen lists as cu_seqlens arrays in the kCuSeqlensBuffer of `bases` (the case
// must be varlen with CaseSpec::cu_seqlens); the arguments' lists are cleared.
void use_cu_seqlens(const CaseSpec& spec, const Bases& bases, Varlen* varlen);

// forward(args) / backward(args), or with CaseSpec::via_plan a plan made from the arguments
// without their pointers and run with them.
Status run_forward(const CaseSpec& spec, const ForwardArgs& args);
Status run_backward(const CaseSpec& spec, const BackwardArgs& args);

// Everything one case shares between its backends.
struct Prepared {
  BufferSet bufs;
  std::map<std::string, std::vector<std::byte>> pristine;
  CaseViews cv;
  double flops = 0;  // forward, plus backward with grad
};

// Checks the case (view bounds, host memory, and with `with_reference` the fp64 reference's
// work), allocates its buffers with fresh random inputs (CaseSpec::input_scale and
// input_plants applied), keeps their pristine copy, and makes the forward problem (and with
// grad the backward problem) on the host buffers.
Status prepare(const CaseSpec& spec, Prepared* p, detail::Problem* fwd, detail::Problem* bwd, bool with_reference);

// Wall-clock time of a host-timed run (run_one, and bench_case on host memory).
using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace strideattn::harness::internal
