// Logging: level names and aliases (case-insensitive), STRIDEATTN_LOG parsing with a warning
// for unknown values, the public level and sink API, folding of repeated messages into
// power-of-two "... repeated N times" summaries plus a final count on flush, no folding at
// debug, nothing emitted when off, sinks called without a library lock, and many threads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn {
namespace {

struct Rec {
  LogLevel level;
  std::string message;
};

std::mutex g_mutex;
std::vector<Rec> g_recs;

void capture(LogLevel level, std::string_view message, void* user) {
  std::lock_guard lock(g_mutex);
  g_recs.push_back({level, std::string(message)});
  if (user) ++*static_cast<int*>(user);
}

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_log_sink(&capture, nullptr);
    set_log_level(LogLevel::info);
    g_recs.clear();
  }
  void TearDown() override {
    set_log_level(LogLevel::off);
    set_log_sink(nullptr);
    g_recs.clear();
  }
  static std::vector<std::string> messages() {
    std::vector<std::string> out;
    for (const Rec& r : g_recs) out.push_back(r.message);
    return out;
  }
};

TEST(LogLevelNames, CaseInsensitiveWithAliases) {
  const std::pair<const char*, LogLevel> cases[] = {
      {"off", LogLevel::off},     {"OFF", LogLevel::off},      {"0", LogLevel::off},         {"false", LogLevel::off},
      {"None", LogLevel::off},    {"no", LogLevel::off},       {"error", LogLevel::error},   {"ERROR", LogLevel::error},
      {"warn", LogLevel::warn},   {"Warning", LogLevel::warn}, {"info", LogLevel::info},     {"INFO", LogLevel::info},
      {"1", LogLevel::info},      {"true", LogLevel::info},    {"On", LogLevel::info},       {"yes", LogLevel::info},
      {"debug", LogLevel::debug}, {"DeBuG", LogLevel::debug},  {"verbose", LogLevel::debug}, {"2", LogLevel::debug}};
  for (const auto& [text, level] : cases) {
    SCOPED_TRACE(text);
    ASSERT_TRUE(log_level_from_string(text).has_value());
    EXPECT_EQ(*log_level_from_string(text), level);
  }
  for (const char* bad : {"", "3", "infoo", "trace ", "loud", "-1"})
    EXPECT_FALSE(log_level_from_string(bad).has_value()) << bad;
  for (LogLevel l : {LogLevel::off, LogLevel::error, LogLevel::warn, LogLevel::info, LogLevel::debug})
    EXPECT_EQ(log_level_from_string(to_string(l)), l);
}

// The environment is read once per process: each case runs in a fresh child process.
class LogEnvDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

[[noreturn]] void exit_with_env_level(const char* value, LogLevel want) {
  setenv("STRIDEATTN_LOG", value, 1);
  std::exit(log_level() == want ? 0 : 1);
}

TEST_F(LogEnvDeathTest, ValuesAndAliasesFromTheEnvironment) {
  EXPECT_EXIT(exit_with_env_level("INFO", LogLevel::info), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(exit_with_env_level("1", LogLevel::info), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(exit_with_env_level("Debug", LogLevel::debug), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(exit_with_env_level("off", LogLevel::off), ::testing::ExitedWithCode(0), "");
}

TEST_F(LogEnvDeathTest, UnknownValueWarnsNamingItAndTheAcceptedOnes) {
  EXPECT_EXIT(exit_with_env_level("loud", LogLevel::warn), ::testing::ExitedWithCode(0),
              "\\[strideattn\\] warning: STRIDEATTN_LOG='loud' is not a log level; accepted "
              "\\(any case\\): off, error, warn, info, debug.*using 'warn'");
}

TEST_F(LogEnvDeathTest, SetLogLevelOverridesTheEnvironment) {
  EXPECT_EXIT(
      {
        setenv("STRIDEATTN_LOG", "debug", 1);
        set_log_level(LogLevel::error);
        std::exit(log_level() == LogLevel::error ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(LogEnvDeathTest, PendingRepeatsReachStderrAtExit) {
  EXPECT_EXIT(
      {
        set_log_level(LogLevel::info);
        for (int i = 0; i < 6; ++i) detail::log_line(LogLevel::info, "same line");
        std::exit(0);
      },
      ::testing::ExitedWithCode(0),
      "\\[strideattn\\] same line\n.*repeated 4 times: same line\n"
      "\\[strideattn\\] \\.\\.\\. repeated 5 times: same line\n");
}

TEST_F(LogTest, RepeatsFoldIntoPowerOfTwoCountsAndAFinalFlush) {
  for (int i = 0; i < 100; ++i) detail::log_line(LogLevel::info, "forward runs on cpu (x)");
  const std::vector<std::string> want = {"forward runs on cpu (x)",
                                         "... repeated 1 time: forward runs on cpu (x)",
                                         "... repeated 2 times: forward runs on cpu (x)",
                                         "... repeated 4 times: forward runs on cpu (x)",
                                         "... repeated 8 times: forward runs on cpu (x)",
                                         "... repeated 16 times: forward runs on cpu (x)",
                                         "... repeated 32 times: forward runs on cpu (x)",
                                         "... repeated 64 times: forward runs on cpu (x)"};
  EXPECT_EQ(messages(), want);
  flush_log();
  ASSERT_EQ(g_recs.size(), want.size() + 1);
  EXPECT_EQ(g_recs.back().message, "... repeated 99 times: forward runs on cpu (x)");
  EXPECT_EQ(g_recs.back().level, LogLevel::info);
  flush_log();  // nothing new to report
  EXPECT_EQ(g_recs.size(), want.size() + 1);
}

TEST_F(LogTest, DistinctMessagesAndLevelsAreCountedApart) {
  detail::log_line(LogLevel::info, "a");
  detail::log_line(LogLevel::info, "b");
  detail::log_line(LogLevel::warn, "a");
  detail::log_line(LogLevel::info, "b");
  ASSERT_EQ(g_recs.size(), 4u);
  EXPECT_EQ(g_recs[2].level, LogLevel::warn);
  EXPECT_EQ(g_recs[2].message, "a");
  EXPECT_EQ(g_recs[3].message, "... repeated 1 time: b");
}

TEST_F(LogTest, DebugLogsEveryMessage) {
  set_log_level(LogLevel::debug);
  for (int i = 0; i < 5; ++i) detail::log_line(LogLevel::info, "x");
  EXPECT_EQ(messages(), std::vector<std::string>(5, "x"));
}

TEST_F(LogTest, NothingBelowTheLevel) {
  set_log_level(LogLevel::off);
  for (LogLevel l : {LogLevel::error, LogLevel::warn, LogLevel::info, LogLevel::debug}) detail::log_line(l, "m");
  flush_log();
  EXPECT_TRUE(g_recs.empty());
  set_log_level(LogLevel::warn);
  detail::log_line(LogLevel::info, "i");
  detail::log_line(LogLevel::debug, "d");
  detail::log_line(LogLevel::error, "e");
  detail::log_line(LogLevel::warn, "w");
  EXPECT_EQ(messages(), (std::vector<std::string>{"e", "w"}));
}

TEST_F(LogTest, SettingTheLevelFlushesThenForgetsCounts) {
  for (int i = 0; i < 3; ++i) detail::log_line(LogLevel::info, "m");  // first, 1, 2
  set_log_level(LogLevel::info);
  detail::log_line(LogLevel::info, "m");  // a fresh first occurrence
  EXPECT_EQ(messages(), (std::vector<std::string>{"m", "... repeated 1 time: m", "... repeated 2 times: m", "m"}));
}

TEST_F(LogTest, SinkGetsUserDataAndMayCallTheLibrary) {
  int calls = 0;
  static int reentered = 0;
  set_log_sink(
      [](LogLevel level, std::string_view message, void* user) {
        capture(level, message, user);
        // A sink under a library lock would deadlock here.
        flush_log();
        if (log_level() == LogLevel::info) ++reentered;
      },
      &calls);
  detail::log_line(LogLevel::info, "r");
  detail::log_line(LogLevel::info, "r");
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(reentered, 2);
}

TEST_F(LogTest, ManyThreadsOneFirstLineAndAnExactTotal) {
  constexpr int kThreads = 8, kEach = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < kEach; ++i) detail::log_line(LogLevel::info, "threaded");
    });
  for (auto& t : threads) t.join();
  flush_log();
  int firsts = 0;
  for (const Rec& r : g_recs) firsts += r.message == "threaded";
  EXPECT_EQ(firsts, 1);
  EXPECT_EQ(g_recs.back().message, "... repeated " + std::to_string(kThreads * kEach - 1) + " times: threaded");
  EXPECT_EQ(g_recs.size(), 1u + 13u + 1u);  // first, 1..4096, final 7999
}

// Through the library: 100 identical forward calls log the choice once, plus counts.
TEST_F(LogTest, IdenticalCallsLogTheirBackendOnce) {
  const std::int64_t s = 5, h = 2, d = 8;
  std::vector<float> q(s * h * d, 0.25f), o(s * h * d);
  ForwardArgs a;
  for (TensorView* t : {&a.q, &a.k, &a.v, &a.o}) {
    t->dtype = DType::f32;
    t->shape = {1, s, h, d};
    t->stride = {s * h * d, h * d, d, 1};
    t->data = q.data();
  }
  a.o.data = o.data();
  a.backend = Backend::cpu;
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(forward(a).ok());
  flush_log();
  ASSERT_FALSE(g_recs.empty());
  const std::string first = g_recs.front().message;
  EXPECT_NE(first.find("forward runs on cpu"), std::string::npos) << first;
  int firsts = 0;
  for (const Rec& r : g_recs) firsts += r.message == first;
  EXPECT_EQ(firsts, 1);
  EXPECT_EQ(g_recs.size(), 1u + 7u + 1u);  // first, 1..64, final 99
  EXPECT_EQ(g_recs.back().message, "... repeated 99 times: " + first);
}

}  // namespace
}  // namespace strideattn
