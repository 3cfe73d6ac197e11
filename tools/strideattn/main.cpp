// The `strideattn` CLI (docs/design.md "CLI"): the demo, check, explain, bench and fuzz,
// text or --json output, and the exit codes 0 (agree) / 1 (disagree) / 2 (invalid input).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_args.hpp"
#include "cli_json.hpp"
#include "fuzz.hpp"
#include "kv_check.hpp"
#include "harness/runner.hpp"
#include "progress.hpp"

namespace strideattn::cli {
namespace {

constexpr int kExitOk = 0, kExitMismatch = 1, kExitInvalid = 2, kExitSkip = 77;

// --json was given: every error is also one JSON object on stdout, so that a caller that
// parses stdout always gets valid JSON ({"error": {"code", "message"}, "exit_code"}).
bool g_json = false;

// The one error path: one line on stderr, and the JSON object under --json.
int error_exit(StatusCode code, const std::string& msg, int exit_code) {
  std::string line = msg;
  for (char& c : line)
    if (c == '\n') c = ' ';
  std::fprintf(stderr, "strideattn: error: %s\n", line.c_str());
  if (g_json) print_error_json(code, line, exit_code);
  std::fflush(stdout);
  return exit_code;
}

// Invalid input or environment: exit 2.
int invalid(const std::string& msg) { return error_exit(StatusCode::invalid_argument, msg, kExitInvalid); }

// Any Status that is not ok: invalid_argument exits 2, everything else 1.
int status_exit(const Status& s) {
  if (s.code() == StatusCode::invalid_argument) return invalid(s.message());
  return error_exit(s.code(), s.message(), kExitMismatch);
}

std::string num(double x, const char* f = "%.3g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

json problem_json(const harness::CaseSpec& s) {
  const harness::ProblemSizes& z = s.sizes;
  json p = {{"dtype", std::string(to_string(s.dtype))},
            {"batch", z.batch},
            {"seqlen_q", z.s_q},
            {"seqlen_kv", z.s_kv},
            {"heads", z.heads},
            {"kv_heads", z.kv_heads},
            {"head_dim", z.d_qk},
            {"head_dim_v", z.d_v},
            {"mask", std::string(to_string(s.options.mask))},
            {"window", {s.options.window.left, s.options.window.right}},
            {"scale", s.options.scale ? json(*s.options.scale) : json(nullptr)},
            {"deterministic", s.options.deterministic},
            {"grad", s.grad},
            {"seed", s.seed},
            {"layout_name", s.layout_name}};
  if (z.varlen())
    p["varlen"] = {{"seqlens_q", z.seqlens_q},
                   {"seqlens_kv", z.seqlens_kv},
                   {"offsets_q", z.offsets_q},
                   {"offsets_kv", z.offsets_kv}};
  json views = {{"q", format_view(s.views.q)},
                {"k", format_view(s.views.k)},
                {"v", format_view(s.views.v)},
                {"o", format_view(s.views.o)}};
  if (s.grad) {
    views["do"] = format_view(s.views.d_o);
    views["dq"] = format_view(s.views.dq);
    views["dk"] = format_view(s.views.dk);
    views["dv"] = format_view(s.views.dv);
  }
  p["views"] = views;
  const harness::CaseSpec::Features& f = s.features;
  json feat = {
      {"softcap", s.options.softcap},
      {"dropout", {{"p", s.options.dropout.p}, {"seed", s.options.dropout.seed}, {"offset", s.options.dropout.offset}}},
      {"bias_type", std::string(to_string(s.options.bias_type))},
      {"bias", f.bias ? json(format_view(*f.bias)) : json(nullptr)},
      {"bias_dtype", f.bias ? json(std::string(to_string(f.bias_dtype))) : json(nullptr)},
      {"dbias", f.dbias ? json(format_view(*f.dbias)) : json(nullptr)},
      {"alibi_rows", f.alibi_rows},
      {"sinks", f.sinks},
      {"max_logit", f.max_logit}};
  p["features"] = feat;
  return p;
}

json backend_json(const harness::BackendResult& r, bool grad) {
  const harness::TensorCheck* o = nullptr;
  for (const auto& c : r.checks)
    if (c.name == "o") o = &c;
  const bool ran = r.status == "ok" || r.status == "mismatch";
  json j = {{"backend", std::string(to_string(r.backend))},
            {"chosen", r.chosen ? json(std::string(to_string(*r.chosen))) : json(nullptr)},
            {"status", r.status},
            {"reason", r.reason},
            {"max_abs_err", num_or_null(o ? o->err.max_abs_err : 0, o != nullptr)},
            {"max_rel_err", num_or_null(o ? o->err.max_rel_err : 0, o != nullptr)},
            {"tolerance", num_or_null(o ? o->tol : 0, o != nullptr)},
            {"time_ms", num_or_null(r.time_ms, ran)},
            {"tflops", num_or_null(r.tflops, ran)},
            {"written_ok", r.written_ok},
            {"guard_ok", r.guard_ok}};
  for (const auto& c : r.checks)
    if (c.name == "lse" || c.name == "max_logit") j[c.name] = check_json(c);
  if (grad) {
    json g = json::object();
    for (const auto& c : r.checks)
      if (c.name == "dq" || c.name == "dk" || c.name == "dv" || c.name == "dbias" || c.name == "d_sinks")
        g[c.name] = check_json(c);
    j["grad"] = g;
  }
  return j;
}

void print_check_table(const harness::CaseReport& rep) {
  std::printf("%-10s %-12s %-9s %12s %12s %12s %10s %9s\n", "backend", "status", "tensor", "max_abs_err", "max_rel_err",
              "tolerance", "time_ms", "TFLOP/s");
  for (const harness::BackendResult& r : rep.backends) {
    // `auto` names what it ran: "auto:cpu".
    const std::string name =
        std::string(to_string(r.backend)) + (r.chosen ? ":" + std::string(to_string(*r.chosen)) : "");
    if (r.checks.empty()) {
      std::printf("%-10s %-12s %s\n", name.c_str(), r.status.c_str(), r.reason.c_str());
      continue;
    }
    bool first = true;
    for (const harness::TensorCheck& c : r.checks) {
      std::string tail;
      if (first) tail = " " + num(r.time_ms, "%10.2f") + " " + num(r.tflops, "%9.3f");
      // elements whose conditioning allowance exceeds the tensor's tolerance (docs/semantics.md)
      const std::string cond = c.allowed > 0
                                   ? "  (" + std::to_string(c.allowed) + " elements conditioned, allowance up to " +
                                         num(c.max_allowance) + ")"
                                   : "";
      std::printf("%-10s %-12s %-9s %12s %12s %12s%s%s%s\n", first ? name.c_str() : "", first ? r.status.c_str() : "",
                  c.name.c_str(), num(c.err.max_abs_err).c_str(), num(c.err.max_rel_err).c_str(), num(c.tol).c_str(),
                  tail.c_str(), cond.c_str(), c.pass() ? "" : "  <- exceeds tolerance");
      first = false;
    }
    if (r.status != "ok") std::printf("%-10s %-12s %s\n", "", "", r.reason.c_str());
  }
}

// check and the demo share this.
int run_check(const Invocation& inv, const std::vector<Backend>& backends, bool demo) {
  harness::CaseReport rep;
  Status s = Status::Ok();
  {
    ProgressLine line(inv.json, 1.0);
    s = harness::run_case(inv.spec, backends, &rep, [&](const std::string& w) { line.show(w); });
  }
  if (!s.ok()) return status_exit(s);
  std::vector<std::string> bad;
  for (const auto& r : rep.backends)
    if (r.status == "mismatch" || r.status == "error")
      bad.push_back(std::string(to_string(r.backend)) + " " + r.status + ": " + r.reason);
  const int code = bad.empty() ? kExitOk : kExitMismatch;
  if (inv.json) {
    json j = {{"problem", problem_json(inv.spec)},
              {"layout", rep.layout},
              {"exit_code", code},
              {"reproducer", harness::reproducer(inv.spec, backends)}};
    json arr = json::array();
    for (const auto& r : rep.backends) arr.push_back(backend_json(r, inv.spec.grad));
    j["backends"] = arr;
    std::printf("%s\n", j.dump(2).c_str());
    return code;
  }
  if (demo)
    std::printf(
        "strideattn %s demo: the seed case (split views of one fused buffer) on "
        "every available backend\n",
        std::string(version()).c_str());
  std::printf("problem: %s%s\n", describe_problem(inv.spec).c_str(), inv.spec.grad ? " (forward + backward)" : "");
  std::printf("layout:  %s\n", rep.layout.c_str());
  std::printf(
      "errors against the fp64 reference; tolerance = 2 x naive low-precision error "
      "+ floor + rounding terms, or an element's conditioning allowance where larger "
      "(docs/semantics.md); time of one run\n\n");
  print_check_table(rep);
  std::printf("\n");
  if (bad.empty()) {
    std::printf("strideattn: every compared backend agrees with the fp64 reference\n");
  } else {
    for (const std::string& b : bad) std::printf("strideattn: DISAGREES: %s\n", b.c_str());
    std::printf("reproduce: %s\n", harness::reproducer(inv.spec, backends).c_str());
  }
  return code;
}

void print_verdicts(const char* title, const Explanation& ex) {
  std::printf("%s:\n", title);
  for (const Verdict& v : ex.verdicts)
    std::printf("  %-10s %-12s %s%s\n", std::string(to_string(v.backend)).c_str(),
                v.supported ? "supported" : "unsupported", v.rule.empty() ? "" : ("[" + v.rule + "] ").c_str(),
                v.reason.c_str());
  std::printf("  auto chooses: %s\n", ex.chosen ? std::string(to_string(*ex.chosen)).c_str() : "nothing (see above)");
}

int run_explain(const Invocation& inv) {
  Explanation fwd, bwd;
  Status s = harness::explain_case(inv.spec, &fwd, inv.grad ? &bwd : nullptr);
  if (s.ok() && !fwd.validation.ok()) s = fwd.validation;
  if (s.ok() && inv.grad && !bwd.validation.ok()) s = bwd.validation;
  if (!s.ok()) return status_exit(s);
  if (inv.json) {
    json j = {{"problem", problem_json(inv.spec)}, {"layout", fwd.layout}, {"forward", verdicts_json(fwd)}};
    if (inv.grad) j["backward"] = verdicts_json(bwd);
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("problem: %s\n", describe_problem(inv.spec).c_str());
  std::printf("layout:  %s\n", fwd.layout.c_str());
  if (inv.spec.layout_name.empty()) {
    std::printf("views:   q %s  k %s  v %s  o %s\n", format_view(inv.spec.views.q).c_str(),
                format_view(inv.spec.views.k).c_str(), format_view(inv.spec.views.v).c_str(),
                format_view(inv.spec.views.o).c_str());
  }
  print_verdicts("forward", fwd);
  if (inv.grad) print_verdicts("backward", bwd);
  return kExitOk;
}

int run_bench(const Invocation& inv, const std::vector<Backend>& backends) {
  Explanation fwd;
  Status s = harness::explain_case(inv.spec, &fwd, nullptr);
  if (s.ok() && !fwd.validation.ok()) s = fwd.validation;
  if (!s.ok()) return status_exit(s);
  std::vector<harness::BenchResult> res;
  {
    ProgressLine line(inv.json, 1.0);
    s = harness::bench_case(inv.spec, backends, inv.bench_runs, &res, [&](const std::string& w) { line.show(w); });
  }
  if (!s.ok()) return status_exit(s);
  int code = kExitOk;
  for (const auto& r : res)
    if (r.status == "error") code = kExitMismatch;
  if (inv.json) {
    json arr = json::array();
    for (const auto& r : res) {
      const bool ran = r.status == "ok";
      arr.push_back({{"backend", std::string(to_string(r.backend))},
                     {"status", r.status},
                     {"reason", r.reason},
                     {"time_ms", num_or_null(r.median_ms, ran)},
                     {"tflops", num_or_null(r.tflops, ran)},
                     {"runs", r.runs}});
    }
    json j = {{"problem", problem_json(inv.spec)}, {"layout", fwd.layout}, {"backends", arr}, {"exit_code", code}};
    std::printf("%s\n", j.dump(2).c_str());
    return code;
  }
  std::printf("problem: %s%s\n", describe_problem(inv.spec).c_str(), inv.spec.grad ? " (forward + backward)" : "");
  std::printf("layout:  %s\n", fwd.layout.c_str());
  std::printf("median of >= %d runs after warm-up (CUDA events on GPU backends)\n\n", inv.bench_runs);
  std::printf("%-10s %-12s %12s %10s %6s\n", "backend", "status", "median_ms", "TFLOP/s", "runs");
  for (const auto& r : res) {
    if (r.status != "ok") {
      std::printf("%-10s %-12s %s\n", std::string(to_string(r.backend)).c_str(), r.status.c_str(), r.reason.c_str());
      continue;
    }
    std::printf("%-10s %-12s %12.3f %10.3f %6d\n", std::string(to_string(r.backend)).c_str(), r.status.c_str(),
                r.median_ms, r.tflops, r.runs);
  }
  return code;
}

int main_impl(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (is_kvcache_command(args)) return run_kvcache_cli(args);
  g_json = std::find(args.begin(), args.end(), "--json") != args.end();
  Invocation inv;
  if (Status s = parse_command_line(args, &inv); !s.ok()) return invalid(s.message());
  g_json = inv.json;
  // STRIDEATTN_BACKEND steers every `auto` call: a value that names no backend is a usage
  // error of the whole run, not a disagreement of the `auto` row.
  if (inv.command != Command::help && inv.command != Command::version)
    if (Status s = check_environment(); !s.ok()) return invalid(s.message());
  const std::vector<Backend> backends = inv.backends_given ? inv.backends : default_backends();
  switch (inv.command) {
    case Command::help:
      std::printf("%s", usage().c_str());
      return kExitOk;
    case Command::version:
      std::printf("strideattn %s\n", std::string(version()).c_str());
      return kExitOk;
    case Command::gpu_available: {
      const bool g = harness::gpu_available();
      std::printf("%s\n", g ? "gpu: available" : "gpu: not available");
      return g ? kExitOk : kExitSkip;
    }
    case Command::demo: {
      Invocation demo;
      Status s = parse_command_line({"check", "--preset", "seed"}, &demo);
      if (!s.ok()) return invalid(s.message());
      // every backend, then `auto` on tensors where a caller would have them (device memory
      // when a GPU is present): STRIDEATTN_LOG=info shows its choice and why
      std::vector<Backend> all = available_backends();
      all.push_back(Backend::automatic);
      return run_check(demo, all, true);
    }
    case Command::check:
      return run_check(inv, backends, false);
    case Command::explain:
      return run_explain(inv);
    case Command::bench:
      return run_bench(inv, backends);
    case Command::fuzz:
      return run_fuzz(inv, backends);
  }
  return kExitInvalid;
}

}  // namespace
}  // namespace strideattn::cli

int main(int argc, char** argv) {
  try {
    return strideattn::cli::main_impl(argc, argv);
  } catch (const std::exception& e) {
    return strideattn::cli::error_exit(strideattn::StatusCode::internal, std::string("internal error: ") + e.what(), 1);
  } catch (...) {
    return strideattn::cli::error_exit(strideattn::StatusCode::internal, "internal error", 1);
  }
}
