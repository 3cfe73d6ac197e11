// The `cpu` backend's persistent thread pool and cancellation: every work item runs exactly
// once whatever the slot count, a throwing body is reported, concurrent calls from several
// threads give the same bits as one call alone, small calls stay on the calling thread, and
// a cancel flag set from another thread stops a huge `cpu` or `reference` call quickly with
// StatusCode::cancelled.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_common.hpp"
#include "host_problem.hpp"

namespace {

using strideattn::Backend;
using strideattn::DType;
using strideattn::StatusCode;
using strideattn::test_support::HostProblem;
namespace cpu = strideattn::detail::cpu;

TEST(CpuPool, EveryItemRunsOnceForAnySlotCount) {
  for (int slots : {1, 2, 3, 8, 2, 1}) {
    std::vector<std::atomic<int>> hits(1000);
    std::atomic<std::size_t> next{0};
    std::atomic<int> bad_slot{0};
    const bool ok = cpu::run_threads(slots, [&](int slot) {
      if (slot < 0 || slot >= slots) bad_slot = 1;
      for (std::size_t i = next++; i < hits.size(); i = next++) hits[i]++;
    });
    EXPECT_TRUE(ok);
    EXPECT_EQ(bad_slot.load(), 0);
    for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "slots " << slots;
  }
}

TEST(CpuPool, ThrowingBodyIsReportedAndThePoolStillWorks) {
  EXPECT_FALSE(cpu::run_threads(3, [](int slot) {
    if (slot == 0) throw std::runtime_error("out of scratch");
  }));
  std::atomic<int> runs{0};
  EXPECT_TRUE(cpu::run_threads(3, [&](int) { runs++; }));
  EXPECT_GE(runs.load(), 1);
}

TEST(CpuPool, SmallWorkStaysOnTheCallingThread) {
  ASSERT_EQ(setenv("STRIDEATTN_CPU_THREADS", "4", 1), 0);
  EXPECT_EQ(cpu::threads_for(cpu::kSmallWorkFlops / 2, 100), 1);
  EXPECT_EQ(cpu::threads_for(cpu::kSmallWorkFlops * 10, 100), 4);
  EXPECT_EQ(cpu::threads_for(cpu::kSmallWorkFlops * 10, 2), 2);
  unsetenv("STRIDEATTN_CPU_THREADS");
}

// Four threads call forward and backward at once (sharing the pool); each result must be
// bitwise the result of the same call made alone.
TEST(CpuPool, ConcurrentCallsGiveTheSameBits) {
  std::vector<HostProblem> problems(4);
  std::vector<HostProblem::Forward> alone(4);
  std::vector<HostProblem::Backward> alone_b(4);
  for (int t = 0; t < 4; ++t) {
    HostProblem& p = problems[t];
    p.s_q = 150 + 10 * t, p.s_kv = 130, p.h = 4, p.hg = 2, p.d = 32;
    p.options.mask = strideattn::MaskKind::causal;
    p.fill(100 + t);
    alone[t] = p.forward(Backend::cpu);
    ASSERT_TRUE(alone[t].status.ok());
    alone_b[t] = p.backward(Backend::cpu, alone[t].o, alone[t].lse);
    ASSERT_TRUE(alone_b[t].status.ok());
  }
  std::vector<HostProblem::Forward> together(4);
  std::vector<HostProblem::Backward> together_b(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) {
        together[t] = problems[t].forward(Backend::cpu);
        together_b[t] = problems[t].backward(Backend::cpu, alone[t].o, alone[t].lse);
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_TRUE(together[t].status.ok() && together_b[t].status.ok());
    EXPECT_TRUE(together[t].o == alone[t].o && together[t].lse == alone[t].lse) << t;
    EXPECT_TRUE(together_b[t].dq == alone_b[t].dq && together_b[t].dk == alone_b[t].dk &&
                together_b[t].dv == alone_b[t].dv)
        << t;
  }
}

// ------------------------------------------------------------------ cancellation

// Runs `call` on another thread, sets the flag after 200 ms and returns the call's status
// and how long it took to return after the flag was set.
template <class Call>
std::pair<strideattn::Status, double> cancel_after_200ms(std::atomic<bool>& flag, Call&& call) {
  strideattn::Status st;
  std::atomic<bool> done{false};
  std::thread worker([&] {
    st = call();
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const bool finished_early = done.load();
  const auto t0 = std::chrono::steady_clock::now();
  flag = true;
  worker.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(finished_early) << "the call must still be running when cancelled";
  return {st, s};
}

// 4 queries against 2^36 stride-0 keys: 9e12 FLOP, minutes of work (under the work cap).
TEST(CpuCancel, FlagFromAnotherThreadStopsAHugeForward) {
  const std::int64_t s_q = 4, n = std::int64_t{1} << 36, d = 8;
  std::vector<float> q(s_q * d, 0.5f), kv(d, 0.25f), o(s_q * d, 0.f);
  std::atomic<bool> flag{false};
  strideattn::ForwardArgs a;
  a.q = {q.data(), DType::f32, {1, s_q, 1, d}, {s_q * d, d, d, 1}};
  a.k = {kv.data(), DType::f32, {1, n, 1, d}, {0, 0, 0, 1}};
  a.v = a.k;
  a.o = {o.data(), DType::f32, {1, s_q, 1, d}, {s_q * d, d, d, 1}};
  a.options.cancel = &flag;
  a.backend = Backend::cpu;
  const auto [st, seconds] = cancel_after_200ms(flag, [&] { return strideattn::forward(a); });
  EXPECT_EQ(st.code(), StatusCode::cancelled) << st.message();
  EXPECT_NE(st.message().find("cancelled"), std::string::npos) << st.message();
  EXPECT_LT(seconds, 2.0);
  // A flag already set stops the call before any work.
  EXPECT_EQ(strideattn::forward(a).code(), StatusCode::cancelled);
}

// Backward: 2^16 x 2^16 stride-0 rows, 3e11 FLOP (seconds to minutes on this machine).
TEST(CpuCancel, FlagFromAnotherThreadStopsALongBackward) {
  const std::int64_t s = std::int64_t{1} << 16, d = 8;
  std::vector<float> row(d, 0.5f), lse(s, 3.f);
  std::vector<float> dq(s * d), dk(s * d), dv(s * d);
  std::atomic<bool> flag{false};
  strideattn::BackwardArgs a;
  const strideattn::TensorView rep{row.data(), DType::f32, {1, s, 1, d}, {0, 0, 0, 1}};
  a.q = a.k = a.v = a.o = a.d_o = rep;
  a.lse = {lse.data(), {1, 1, s}, {s, s, 1}};
  a.dq = {dq.data(), DType::f32, {1, s, 1, d}, {s * d, d, d, 1}};
  a.dk = {dk.data(), DType::f32, {1, s, 1, d}, {s * d, d, d, 1}};
  a.dv = {dv.data(), DType::f32, {1, s, 1, d}, {s * d, d, d, 1}};
  a.options.cancel = &flag;
  a.backend = Backend::cpu;
  const auto [st, seconds] = cancel_after_200ms(flag, [&] { return strideattn::backward(a); });
  EXPECT_EQ(st.code(), StatusCode::cancelled) << st.message();
  EXPECT_LT(seconds, 2.0);
}

// The reference checks the flag once per query row: 2^20 rows against 2^14 keys (5e11
// FLOP in fp64, about a minute).
TEST(ReferenceCancel, FlagFromAnotherThreadStopsALongForward) {
  const std::int64_t s_q = std::int64_t{1} << 20, n = std::int64_t{1} << 14, d = 8;
  std::vector<float> row(d, 0.5f), o(s_q * d, 0.f);
  std::atomic<bool> flag{false};
  strideattn::ForwardArgs a;
  a.q = {row.data(), DType::f32, {1, s_q, 1, d}, {0, 0, 0, 1}};
  a.k = {row.data(), DType::f32, {1, n, 1, d}, {0, 0, 0, 1}};
  a.v = a.k;
  a.o = {o.data(), DType::f32, {1, s_q, 1, d}, {s_q * d, d, d, 1}};
  a.options.cancel = &flag;
  a.backend = Backend::reference;
  const auto [st, seconds] = cancel_after_200ms(flag, [&] { return strideattn::forward(a); });
  EXPECT_EQ(st.code(), StatusCode::cancelled) << st.message();
  EXPECT_LT(seconds, 2.0);
  for (float x : o) ASSERT_EQ(x, 0.f) << "a cancelled reference call writes nothing";
}

}  // namespace
