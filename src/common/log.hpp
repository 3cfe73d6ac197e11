// Opt-in logging: the library prints nothing unless STRIDEATTN_LOG=info|debug is set.
// Lines go to stderr, prefixed "[strideattn] ".
#pragma once

#include <string_view>

namespace strideattn::detail {

enum class LogLevel { off = 0, info = 1, debug = 2 };

// Level read from STRIDEATTN_LOG (cached after the first call; set_log_level overrides).
[[nodiscard]] LogLevel log_level();
void set_log_level_for_testing(LogLevel level);
// Redirects log lines (tests capture them); nullptr restores stderr.
using LogSink = void (*)(std::string_view line);
void set_log_sink_for_testing(LogSink sink);

void log_line(LogLevel level, std::string_view message);

}  // namespace strideattn::detail
