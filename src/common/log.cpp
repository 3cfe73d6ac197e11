// Opt-in logging (see log.hpp). Reads STRIDEATTN_LOG once.
#include "common/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace strideattn::detail {

namespace {
std::atomic<int> g_level{-1};
std::atomic<LogSink> g_sink{nullptr};

int level_from_env() {
  const char* env = std::getenv("STRIDEATTN_LOG");
  if (!env) return 0;
  std::string v(env);
  if (v == "debug") return 2;
  if (v == "info") return 1;
  return 0;
}
}  // namespace

LogLevel log_level() {
  int l = g_level.load(std::memory_order_relaxed);
  if (l < 0) {
    l = level_from_env();
    g_level.store(l, std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(l);
}

void set_log_level_for_testing(LogLevel level) { g_level.store(static_cast<int>(level)); }
void set_log_sink_for_testing(LogSink sink) { g_sink.store(sink); }

void log_line(LogLevel level, std::string_view message) {
  if (level == LogLevel::off || log_level() < level) return;
  std::string line = "[strideattn] ";
  line += message;
  if (LogSink sink = g_sink.load()) {
    sink(line);
    return;
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace strideattn::detail
