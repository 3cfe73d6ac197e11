// `strideattn fuzz`: random problems and random views, each checked on the chosen backends
// against the fp64 reference; failures print a one-line reproducer.
#pragma once

#include <cstdint>
#include <vector>

#include "cli_args.hpp"
#include "harness/runner.hpp"

namespace strideattn::cli {

// Case `index` of the stream drawn from `seed` (deterministic).
// `plant_non_finite`: some cases get NaN/Inf planted in their inputs (fuzz --finite-inputs: none).
// `features` (fuzz --features): the training features are drawn too, from a stream of their
// own, so the rest of the case is the one drawn without them; of those only the ones every
// backend of `backends` runs (detail::runs_feature; all when it is empty), so a GPU fuzz
// spends its cases on what the backend runs.
[[nodiscard]] harness::CaseSpec random_case(std::uint64_t seed, std::int64_t index, bool grad,
                                            bool plant_non_finite = true, bool features = false,
                                            const std::vector<Backend>& backends = {});

// Caps the case's numerical-edge draw at `logit_limit` (fuzz --logit-limit): a typical scaled
// logit, input_scale^2 * scale * sqrt(d_qk) for the standard-normal draw, stays at most
// logit_limit. A drawn scale that alone exceeds it is replaced by the default; then the input
// scale is lowered as needed, also to input_scale^2 <= logit_limit (a tiny scale buys no
// input range). Planted non-finite inputs are kept.
void cap_logits(double logit_limit, harness::CaseSpec* spec);

// Runs inv.cases cases; returns the exit code (0 none failed, 1 some failed, 77 skipped
// because --require-gpu found no GPU).
[[nodiscard]] int run_fuzz(const Invocation& inv, const std::vector<Backend>& backends);

}  // namespace strideattn::cli
