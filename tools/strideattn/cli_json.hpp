// The pieces of the CLI's --json output that the attention commands (main.cpp) and the
// KV-cache commands (kv_check.cpp) share, so both print one shape: a tensor's check, the
// verdicts of explain, numbers that are null where nothing ran, and the error object that
// every failure under --json prints on stdout ({"error": {"code", "message"}, "exit_code"}).
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/compare.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::cli {

using json = nlohmann::ordered_json;

inline json num_or_null(double x, bool have) { return have ? json(x) : json(nullptr); }

inline json check_json(const harness::TensorCheck& c) {
  return {{"max_abs_err", c.err.max_abs_err},
          {"max_rel_err", c.err.max_rel_err},
          {"tolerance", c.tol},
          {"non_finite", c.err.non_finite},
          {"excess", c.excess},
          {"conditioned", c.allowed},
          {"max_allowance", c.max_allowance},
          {"pass", c.pass()}};
}

inline json verdicts_json(const Explanation& ex) {
  json arr = json::array();
  for (const Verdict& v : ex.verdicts)
    arr.push_back({{"backend", std::string(to_string(v.backend))},
                   {"supported", v.supported},
                   {"rule", v.rule},
                   {"reason", v.reason}});
  return {{"verdicts", arr}, {"chosen", ex.chosen ? json(std::string(to_string(*ex.chosen))) : json(nullptr)}};
}

// The error object of --json, printed on stdout (the message on one line).
inline void print_error_json(StatusCode code, const std::string& one_line_message, int exit_code) {
  const json j = {{"error", {{"code", std::string(to_string(code))}, {"message", one_line_message}}},
                  {"exit_code", exit_code}};
  std::printf("%s\n", j.dump(2).c_str());
}

}  // namespace strideattn::cli
