// Command-line parsing for the `strideattn` CLI: the grammar of docs/design.md (subcommand, PROBLEM
// options, --backends/--grad/--seed/--json, fuzz options) into a harness::CaseSpec. Every
// error is one Status of code invalid_argument whose message says what and why (the CLI
// prints it as "strideattn: error: <message>" and exits 2).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "harness/runner.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::cli {

enum class Command { demo, check, explain, bench, fuzz, help, version, gpu_available };

struct Invocation {
  Command command = Command::demo;
  harness::CaseSpec spec;         // check / explain / bench / demo
  std::vector<Backend> backends;  // empty: the default set (see default_backends)
  bool backends_given = false;
  bool json = false;
  bool grad = false;
  std::uint64_t seed = 1;
  bool seed_given = false;
  // fuzz
  std::int64_t cases = 0;
  bool cases_given = false;
  bool require_gpu = false;    // hidden: skip (exit 77) when no GPU is present
  bool require_ran = false;    // hidden: fail if a backend never ran a case
  bool finite_inputs = false;  // fuzz --finite-inputs: plant no NaN/Inf in the inputs
  bool features = false;       // fuzz --features: draw the training features too
  bool cu_seqlens = false;     // --cu-seqlens: varlen lengths as cu_seqlens arrays (CaseSpec::cu_seqlens)
  bool via_plan = false;       // --via-plan: every run through a plan made without pointers
  // fuzz --min-ran N: draw past --cases until every listed backend ran N cases (compared with
  // the reference, not refused); at most --cases + 50 N draws, failing if still short.
  std::int64_t min_ran = 0;
  // fuzz --logit-limit L: scale down the drawn input scale (and drop a drawn extreme scale) so
  // that a typical scaled logit, input_scale^2 * scale * sqrt(d_qk), stays at most L; 0: no cap.
  double logit_limit = 0;
  int bench_runs = 20;
  std::optional<harness::CaseSpec::Plant> plant;  // hidden --test-plant (tests only)
};

// Parse argv[1..]. The PROBLEM is resolved fully (preset, sizes, layout views, explicit views).
[[nodiscard]] Status parse_command_line(const std::vector<std::string>& args, Invocation* out);

// The environment the CLI reads: an unknown STRIDEATTN_BACKEND is invalid_argument naming
// the value and the supported names.
[[nodiscard]] Status check_environment();

// Every backend this build has and this machine can run, except `reference` (the yardstick).
[[nodiscard]] std::vector<Backend> default_backends();
// Every backend compiled and available, reference included (the demo).
[[nodiscard]] std::vector<Backend> available_backends();

// Named problems for --preset.
struct Preset {
  std::string name, description;
  harness::ProblemSizes sizes;
  DType dtype = DType::f16;
  std::string layout;
  AttentionOptions options;
};
[[nodiscard]] const std::vector<Preset>& presets();

[[nodiscard]] std::string usage();

// "f16 b=2 s_q=2048 s_kv=2048 h=16 hg=1 d_qk=64 d_v=64 mask=causal ..." (one line).
[[nodiscard]] std::string describe_problem(const harness::CaseSpec& spec);

// Explicit view syntax BUF+OFFSET:SHAPE:STRIDES (both directions; the writer lives in the
// harness, whose reproducer line uses it too).
// `dims` names the four logical dimensions in the error message (bias views: b,h,s_q,s_kv).
[[nodiscard]] Status parse_view(const std::string& option, const std::string& text, harness::ViewSpec* out,
                                const char* dims = "b,s,h,d");

// The training-feature options of PROBLEM (cli_features.cpp): `values` the valued options
// given (softcap, dropout, rng-seed, rng-offset, bias, bias-type, bias-dtype, dbias), `flags`
// the flags given (alibi, alibi-per-batch, sinks, max-logit). Needs spec->dtype and sizes.
[[nodiscard]] Status resolve_features(const std::map<std::string, std::string>& values,
                                      const std::set<std::string>& flags, bool grad, harness::CaseSpec* spec);
// " softcap=30 dropout=0.1 rng=(1,0) bias=post_scale(f32 bias:1,4,1,128:0,128,0,1) ..." ("" without features).
[[nodiscard]] std::string describe_features(const harness::CaseSpec& spec);
using harness::format_view;

}  // namespace strideattn::cli
