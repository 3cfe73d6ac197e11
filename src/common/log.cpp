// Logging: the level (STRIDEATTN_LOG or set_log_level), the sink (stderr or a callback), and
// the folding of repeated messages into "... repeated N times" summaries (see strideattn.hpp).
#include "common/log.hpp"

#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strideattn {

namespace {

// Distinct messages whose repeats are counted; past this many, new messages are logged
// every time instead of growing the table.
constexpr std::size_t kMaxTracked = 4096;

struct Seen {
  std::uint64_t repeats = 0;   // occurrences after the first
  std::uint64_t reported = 0;  // repeats already announced
};

struct Record {
  LogLevel level;
  std::string message;
};

struct State {
  std::mutex mutex;
  std::unordered_map<std::string, Seen> seen;  // key: level digit + message
  LogSink sink = nullptr;
  void* user_data = nullptr;
  detail::LineSink line_sink = nullptr;
};

// Never destroyed: a log call from another static destructor still finds it.
State& state() {
  static State* s = new State;
  return *s;
}

std::atomic<int> g_level{-1};  // -1: not read from the environment yet
std::once_flag g_env_once;

std::string lower(std::string_view text) {
  std::string s(text);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string repeated_text(std::uint64_t n, std::string_view message) {
  return "... repeated " + std::to_string(n) + (n == 1 ? " time: " : " times: ") + std::string(message);
}

bool power_of_two(std::uint64_t n) { return n != 0 && (n & (n - 1)) == 0; }

// Summaries of every message with repeats not yet announced (caller holds the mutex).
std::vector<Record> take_pending(State& s) {
  std::vector<Record> out;
  for (auto& [key, seen] : s.seen) {
    if (seen.repeats == seen.reported) continue;
    seen.reported = seen.repeats;
    out.push_back({static_cast<LogLevel>(key[0] - '0'), repeated_text(seen.repeats, key.substr(1))});
  }
  return out;
}

void write_stderr(LogLevel level, std::string_view message) {
  std::string line = "[strideattn] ";
  if (level == LogLevel::error) line += "error: ";
  if (level == LogLevel::warn) line += "warning: ";
  line += message;
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

struct SinkSnapshot {
  LogSink sink;
  void* user_data;
  detail::LineSink line_sink;
};

SinkSnapshot snapshot(State& s) { return {s.sink, s.user_data, s.line_sink}; }

// Called without the mutex held: a sink may take other locks (Python's GIL) or log again.
void deliver(const SinkSnapshot& to, const std::vector<Record>& records) {
  for (const Record& r : records) {
    if (to.line_sink) {
      to.line_sink("[strideattn] " + r.message);
    } else if (to.sink) {
      to.sink(r.level, r.message, to.user_data);
    } else {
      write_stderr(r.level, r.message);
    }
  }
}

// Flushes pending summaries to the current sink, forgets every count, then applies `change`
// (under the mutex), so counts never straddle a level or sink change.
template <class Change>
void reset_then(Change change) {
  State& s = state();
  std::vector<Record> pending;
  SinkSnapshot to;
  {
    std::lock_guard lock(s.mutex);
    pending = take_pending(s);
    to = snapshot(s);
    s.seen.clear();
    change(s);
  }
  deliver(to, pending);
}

void warn_unknown_env(const std::string& value) {
  detail::log_line(LogLevel::warn, "STRIDEATTN_LOG='" + value +
                                       "' is not a log level; accepted (any case): off, error, warn, info, debug, "
                                       "warning, verbose, 0, 1, 2, true, false, yes, no, on, none; using 'warn'");
}

// At exit, pending counts go to stderr when no user sink is installed (a user sink may
// already be unusable then; its owner calls flush_log()).
struct ExitFlush {
  ~ExitFlush() {
    State& s = state();
    std::vector<Record> pending;
    {
      std::lock_guard lock(s.mutex);
      if (s.sink || s.line_sink) return;
      pending = take_pending(s);
    }
    deliver({nullptr, nullptr, nullptr}, pending);
  }
} g_exit_flush;

}  // namespace

std::string_view to_string(LogLevel level) {
  switch (level) {
    case LogLevel::off:
      return "off";
    case LogLevel::error:
      return "error";
    case LogLevel::warn:
      return "warn";
    case LogLevel::info:
      return "info";
    case LogLevel::debug:
      return "debug";
  }
  return "unknown";
}

std::optional<LogLevel> log_level_from_string(std::string_view text) {
  const std::string v = lower(text);
  if (v == "off" || v == "0" || v == "false" || v == "no" || v == "none") return LogLevel::off;
  if (v == "error") return LogLevel::error;
  if (v == "warn" || v == "warning") return LogLevel::warn;
  if (v == "info" || v == "1" || v == "true" || v == "yes" || v == "on") return LogLevel::info;
  if (v == "debug" || v == "verbose" || v == "2") return LogLevel::debug;
  return std::nullopt;
}

LogLevel log_level() {
  std::string unknown;  // set only in the thread that reads the environment
  std::call_once(g_env_once, [&] {
    const char* env = std::getenv("STRIDEATTN_LOG");
    std::optional<LogLevel> level = LogLevel::off;
    if (env && *env) level = log_level_from_string(env);
    int expected = -1;  // set_log_level before the first read wins over the environment
    g_level.compare_exchange_strong(expected, static_cast<int>(level.value_or(LogLevel::warn)));
    if (!level && expected == -1) unknown = env;
  });
  // Outside call_once: the warning goes through log_line, which calls log_level again.
  if (!unknown.empty()) warn_unknown_env(unknown);
  return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed));
}

void set_log_level(LogLevel level) {
  reset_then([&](State&) { g_level.store(static_cast<int>(level)); });
}

void set_log_sink(LogSink sink, void* user_data) {
  reset_then([&](State& s) {
    s.sink = sink;
    s.user_data = user_data;
  });
}

void flush_log() {
  State& s = state();
  std::vector<Record> pending;
  SinkSnapshot to;
  {
    std::lock_guard lock(s.mutex);
    pending = take_pending(s);
    to = snapshot(s);
  }
  deliver(to, pending);
}

namespace detail {

void set_log_level_for_testing(LogLevel level) { ::strideattn::set_log_level(level); }

void set_log_sink_for_testing(LineSink sink) {
  reset_then([&](State& s) { s.line_sink = sink; });
}

void log_line(LogLevel level, std::string_view message) {
  const LogLevel current = log_level();
  if (level == LogLevel::off || current < level) return;
  State& s = state();
  std::vector<Record> out;
  SinkSnapshot to;
  {
    std::lock_guard lock(s.mutex);
    to = snapshot(s);
    std::string key;
    if (current < LogLevel::debug) {
      key.assign(1, static_cast<char>('0' + static_cast<int>(level)));
      key += message;
    }
    auto it = key.empty() ? s.seen.end() : s.seen.find(key);
    if (it != s.seen.end()) {
      if (power_of_two(++it->second.repeats)) {
        it->second.reported = it->second.repeats;
        out.push_back({level, repeated_text(it->second.repeats, message)});
      }
    } else {
      if (!key.empty() && s.seen.size() < kMaxTracked) s.seen.emplace(std::move(key), Seen{});
      out.push_back({level, std::string(message)});
    }
  }
  deliver(to, out);
}

}  // namespace detail

}  // namespace strideattn
