// Library-internal side of logging (the public level/sink API is in strideattn.hpp):
// log_line() filters by level, folds repeated messages into counts and hands records to the sink.
#pragma once

#include <string_view>

#include "strideattn/strideattn.hpp"

namespace strideattn::detail {

using LogLevel = ::strideattn::LogLevel;

// Records with level <= log_level() are emitted (log_level() reads STRIDEATTN_LOG once).
using ::strideattn::log_level;
void log_line(LogLevel level, std::string_view message);

// Test hooks: the level without the environment, and a sink receiving whole
// "[strideattn] <message>" lines (nullptr restores the public sink). Both reset repeat counts.
void set_log_level_for_testing(LogLevel level);
using LineSink = void (*)(std::string_view line);
void set_log_sink_for_testing(LineSink sink);

}  // namespace strideattn::detail
