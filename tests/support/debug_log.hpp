// The library's debug log lines of one call, for tests that check which kernels ran (and the
// rule that kept another off): debug_log_of(fn) runs fn with the log at debug level into a
// buffer and returns the lines, one per line. Not thread-safe: one capture at a time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/log.hpp"

namespace strideattn::test_support {

inline std::vector<std::string>& captured_log_lines() {
  static std::vector<std::string> lines;
  return lines;
}

template <class F>
std::string debug_log_of(F&& fn) {
  namespace detail = strideattn::detail;
  captured_log_lines().clear();
  detail::set_log_sink_for_testing([](std::string_view line) { captured_log_lines().emplace_back(line); });
  detail::set_log_level_for_testing(detail::LogLevel::debug);
  fn();
  detail::set_log_sink_for_testing(nullptr);
  detail::set_log_level_for_testing(detail::LogLevel::off);
  std::string all;
  for (const auto& line : captured_log_lines()) all += line + "\n";
  return all;
}

}  // namespace strideattn::test_support
