// Private to strideattn_harness: checking one backend's outputs against the fp64 reference
// under the correctness rule (docs/semantics.md): the targets of a case, the comparison of
// each output, the written/guard verdicts, the non-finite policy, and
// the test hook that plants errors the checks must catch.
#pragma once

#include <string>
#include <vector>

#include "backends/reference/reference.hpp"
#include "harness/buffers.hpp"
#include "harness/case_setup.hpp"
#include "harness/compare.hpp"
#include "harness/conditioning.hpp"
#include "harness/runner.hpp"

namespace strideattn::harness::internal {

struct Expected {
  std::string name;
  const ViewSpec* view;
  const std::vector<double>* exact;
  const std::vector<double>* naive;  // the naive low-precision model: sets the tolerance
  double magnitude = -1.0;           // scale of the relative term (compare.hpp check_tensor)
  ElementTerms terms;                // conditioning allowances and overflow flags
};

// Compares the written outputs with the reference; appends to r.checks and r.reason.
// `inputs_non_finite`: compare.hpp NonFinitePolicy.
void check_outputs(const BufferSet& bufs, const std::vector<Expected>& expected, bool varlen, bool inputs_non_finite,
                   BackendResult* r, std::vector<std::string>* failures);

// The written/guard verdicts of one phase ("forward", "backward") into `r` and `failures`.
void apply_run_check(const BufferSet::CheckResult& ck, const char* phase, BackendResult* r,
                     std::vector<std::string>* failures);

// Whether CaseSpec::input_plants put a non-finite value into the inputs.
bool inputs_non_finite(const CaseSpec& spec);

// The test hook of CaseSpec::plant, for the outputs of the phase that just ran.
void apply_plant(const CaseSpec& spec, Prepared& p, const std::vector<std::string>& phase);

// The fp64 answer key and the naive model of one case (see docs/semantics.md
// "Correctness rule"). Backward targets are either fixed per case (f32: the true gradient)
// or computed from the O each backend's forward produced (f16/bf16: backward_targets()).
// They are computed per backend too when the forward writes into dO's buffer (dO aliasing
// O): the targets must read the dO the backend's backward reads, after that forward.
struct Targets {
  detail::ReferenceOutputs exact, naive;      // forward; and backward when fixed per case
  Conditioning cond;                          // their allowances (conditioning.hpp)
  const detail::Problem* backward = nullptr;  // on the host buffers (reads the current O, dO)
  bool per_backend = false;                   // backward targets after each backend's forward
  detail::RefBackwardInputs inputs = detail::RefBackwardInputs::recompute;
  // The conditioning allowances model the scores Q K^T alone: with a training feature that
  // changes the logits or P (features_change_scores) the rule is the tolerance from the naive
  // model (compare.hpp) without allowances.
  bool use_conditioning = true;
  // The max logit (a forward output) when `exact` / `naive` come from the backward problem.
  std::vector<double> exact_max_logit, naive_max_logit;
};

}  // namespace strideattn::harness::internal
