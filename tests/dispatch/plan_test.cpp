// Plans (strideattn.hpp "plans", src/dispatch/plan.cpp) and the plan cache on a CPU: a fake
// backend counts how often it is asked, prepared and run, so the make-once / run-many contract
// is checked directly; every per-run check is planted (null, misaligned, overlapping, too
// small a workspace, an LSE the plan does not write, arrays a dense plan does not take) and
// must come back as one clear error; the per-call functions reuse plans by problem and make a
// new one when anything but a pointer changes. The numbers of a plan's runs are checked
// against the fp64 reference in tests/backends/* through the harness (CaseSpec::via_plan).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/plan.hpp"
#include "dispatch/registry.hpp"
#include "problem/problem.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::detail {
namespace {

class CountingBackend final : public BackendImpl {
 public:
  explicit CountingBackend(std::size_t workspace = 0) : workspace_(workspace) {}
  Backend id() const override { return Backend::cpu; }
  Verdict supports(const Problem&) const override {
    ++supports_calls;
    Verdict v;
    v.backend = Backend::cpu;
    v.supported = true;
    return v;
  }
  Status workspace_size(const Problem&, std::size_t* bytes) const override {
    *bytes = workspace_;
    return Status::Ok();
  }
  Status prepare_call(const Problem& p, std::unique_ptr<const PreparedCall>* out) override {
    ++prepare_calls;
    prepared_lse = p.writes_lse();
    return BackendImpl::prepare_call(p, out);
  }
  Status forward(const Problem& p) override {
    ++forward_calls;
    last_q = p.q.data;
    last_workspace = p.workspace;
    return Status::Ok();
  }
  Status backward(const Problem& p) override {
    ++backward_calls;
    last_q = p.q.data;
    return Status::Ok();
  }
  mutable int supports_calls = 0;
  int prepare_calls = 0, forward_calls = 0, backward_calls = 0;
  bool prepared_lse = false;
  const void* last_q = nullptr;
  const void* last_workspace = nullptr;

 private:
  std::size_t workspace_;
};

// Host buffers of a small forward + backward problem, 256-byte aligned, one per tensor.
struct Buffers {
  static constexpr std::int64_t b = 2, s = 8, h = 2, d = 16;
  std::vector<std::uint16_t> q, k, v, o, d_o, dq, dk, dv, spare;
  std::vector<float> lse;
  Buffers() {
    const std::size_t n = b * s * h * d + 256;
    for (auto* x : {&q, &k, &v, &o, &d_o, &dq, &dk, &dv, &spare}) x->assign(n, 0x3c00);
    lse.assign(b * h * s + 64, 0.f);
  }
  static void* aligned(std::vector<std::uint16_t>& x) {
    auto a = reinterpret_cast<std::uintptr_t>(x.data());
    return reinterpret_cast<void*>((a + 255) / 256 * 256);
  }
  static float* aligned(std::vector<float>& x) {
    auto a = reinterpret_cast<std::uintptr_t>(x.data());
    return reinterpret_cast<float*>((a + 255) / 256 * 256);
  }
  static TensorView view(void* data) {
    TensorView t;
    t.data = data;
    t.dtype = DType::f16;
    t.shape = {b, s, h, d};
    t.stride = {s * h * d, h * d, d, 1};
    return t;
  }
  LseView lse_view(float* data) const { return {data, {b, h, s}, {h * s, s, 1}}; }
  // Arguments with every pointer null (given at run time), LSE requested by its shape.
  ForwardArgs forward_args() const {
    ForwardArgs a;
    a.q = a.k = a.v = a.o = view(nullptr);
    a.lse = lse_view(nullptr);
    a.backend = Backend::cpu;
    return a;
  }
  BackwardArgs backward_args() const {
    BackwardArgs a;
    a.q = a.k = a.v = a.o = a.d_o = a.dq = a.dk = a.dv = view(nullptr);
    a.lse = lse_view(nullptr);
    a.backend = Backend::cpu;
    return a;
  }
  ForwardRun forward_run() {
    ForwardRun r;
    r.q = aligned(q), r.k = aligned(k), r.v = aligned(v), r.o = aligned(o), r.lse = aligned(lse);
    return r;
  }
  BackwardRun backward_run() {
    BackwardRun r;
    r.q = aligned(q), r.k = aligned(k), r.v = aligned(v), r.o = aligned(o), r.d_o = aligned(d_o);
    r.lse = aligned(lse), r.dq = aligned(dq), r.dk = aligned(dk), r.dv = aligned(dv);
    return r;
  }
  // The same problem as a call's arguments, on the buffers.
  ForwardArgs call_args() {
    ForwardArgs a = forward_args();
    a.q = view(aligned(q)), a.k = view(aligned(k)), a.v = view(aligned(v)), a.o = view(aligned(o));
    a.lse = lse_view(aligned(lse));
    return a;
  }
};

#define EXPECT_INVALID_WITH(status, needle)                                                  \
  do {                                                                                       \
    const Status st_ = (status);                                                             \
    EXPECT_EQ(st_.code(), StatusCode::invalid_argument) << st_.message();                    \
    EXPECT_NE(st_.message().find(needle), std::string::npos) << st_.message();               \
    EXPECT_EQ(st_.message().find('\n'), std::string::npos) << "one line: " << st_.message(); \
  } while (0)

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override { default_plan_cache().clear(); }
};

TEST_F(PlanTest, MadeOnceRunManyTimesWithNewPointers) {
  CountingBackend fake;
  ScopedBackendOverride o({{Backend::cpu, &fake}});
  Buffers buf;
  ForwardPlan plan;
  ASSERT_TRUE(make_plan(buf.forward_args(), &plan).ok());
  EXPECT_TRUE(plan.valid());
  EXPECT_EQ(plan.backend(), Backend::cpu);
  EXPECT_TRUE(plan.writes_lse());
  EXPECT_TRUE(fake.prepared_lse) << "the backend prepares the LSE the plan writes";
  EXPECT_NE(plan.reason().find("forward runs on cpu"), std::string::npos) << plan.reason();
  EXPECT_EQ(fake.supports_calls, 1);
  EXPECT_EQ(fake.prepare_calls, 1);
  ForwardRun r = buf.forward_run();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(plan.run(r).ok());
    EXPECT_EQ(fake.last_q, r.q);
    std::swap(r.q, r.k);  // other pointers each run
  }
  EXPECT_EQ(fake.forward_calls, 5);
  EXPECT_EQ(fake.supports_calls, 1) << "a run asks nothing of the backend's rules";
  EXPECT_EQ(fake.prepare_calls, 1);
  ForwardPlan copy = plan;  // copies share the plan
  ASSERT_TRUE(copy.run(r).ok());
  EXPECT_EQ(fake.prepare_calls, 1);
}

TEST_F(PlanTest, EmptyPlanAndRefusalsAreErrors) {
  ForwardPlan empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_INVALID_WITH(empty.run(ForwardRun{}), "plan is empty");
  Buffers buf;
  ForwardArgs bad = buf.forward_args();
  bad.k.shape[kHead] = bad.v.shape[kHead] = 3;  // heads 2 % 3
  ForwardPlan p;
  EXPECT_INVALID_WITH(make_plan(bad, &p), "not a multiple of kv_heads");
  EXPECT_FALSE(p.valid());
  ForwardArgs dev = buf.forward_args();
  dev.memory = Memory::device;  // cpu refuses device memory: unsupported, naming the rule
  const Status s = make_plan(dev, &p);
  EXPECT_EQ(s.code(), StatusCode::unsupported) << s.message();
  EXPECT_NE(s.message().find("memory"), std::string::npos) << s.message();
}

TEST_F(PlanTest, EveryRunChecksItsPointers) {
  CountingBackend fake;
  ScopedBackendOverride o({{Backend::cpu, &fake}});
  Buffers buf;
  ForwardPlan plan;
  ASSERT_TRUE(make_plan(buf.forward_args(), &plan).ok());
  const ForwardRun good = buf.forward_run();
  ASSERT_TRUE(plan.run(good).ok());

  ForwardRun r = good;
  r.v = nullptr;
  EXPECT_INVALID_WITH(plan.run(r), "v: data is null but the plan's v has shape [2, 8, 2, 16]");
  r = good;
  r.k = static_cast<const std::uint16_t*>(good.k) + 1;  // 2-byte aligned; the plan assumed 16
  EXPECT_INVALID_WITH(plan.run(r), "k: data pointer is 2 bytes past a 16-byte boundary; this plan assumes k 16-byte");
  r = good;
  r.o = const_cast<void*>(good.q);  // the output is an input
  EXPECT_INVALID_WITH(plan.run(r), "o overlaps q in memory");
  r = good;
  r.lse = reinterpret_cast<float*>(static_cast<std::uint16_t*>(good.o) + 8);  // inside O
  EXPECT_INVALID_WITH(plan.run(r), "overlaps");
  r = good;
  r.lse = nullptr;
  EXPECT_INVALID_WITH(plan.run(r), "lse: data is null");
  r = good;
  std::int32_t cu[3] = {0, 8, 16};
  r.cu_seqlens_q = r.cu_seqlens_kv = cu;
  EXPECT_INVALID_WITH(plan.run(r), "the plan was made without them");
  EXPECT_EQ(fake.forward_calls, 1) << "no refused run reached the backend";

  ForwardArgs no_lse = buf.forward_args();
  no_lse.lse = {};
  ForwardPlan without;
  ASSERT_TRUE(make_plan(no_lse, &without).ok());
  EXPECT_FALSE(without.writes_lse());
  EXPECT_INVALID_WITH(without.run(good), "the plan writes no LSE");
  r = good;
  r.lse = nullptr;
  EXPECT_TRUE(without.run(r).ok());
}

TEST_F(PlanTest, APointerGivenAtMakeTimeFixesTheAlignmentThePlanAssumes) {
  CountingBackend fake;
  ScopedBackendOverride o({{Backend::cpu, &fake}});
  Buffers buf;
  ForwardArgs a = buf.forward_args();
  auto* q2 = static_cast<std::uint16_t*>(Buffers::aligned(buf.q)) + 1;  // 2-byte aligned
  a.q.data = q2;
  ForwardPlan plan;
  ASSERT_TRUE(make_plan(a, &plan).ok());
  ForwardRun r = buf.forward_run();
  r.q = static_cast<const std::uint16_t*>(Buffers::aligned(buf.spare)) + 3;  // 2-byte aligned too
  EXPECT_TRUE(plan.run(r).ok());
  r.q = reinterpret_cast<const char*>(Buffers::aligned(buf.spare)) + 1;  // odd: below the element size
  EXPECT_INVALID_WITH(plan.run(r), "1 bytes past a 2-byte boundary");
}

TEST_F(PlanTest, FusedGradientBuffersPassAndAnOverlapAmongThemIsCaught) {
  CountingBackend fake;
  ScopedBackendOverride o({{Backend::cpu, &fake}});
  Buffers buf;
  // dq, dk, dv: the split views of one [s, b, 3h, d] gradient buffer (byte ranges interleave).
  BackwardArgs a = buf.backward_args();
  const std::int64_t row = 3 * Buffers::h * Buffers::d;
  for (TensorView* t : {&a.dq, &a.dk, &a.dv}) t->stride = {row, Buffers::b * row, Buffers::d, 1};
  BackwardPlan plan;
  ASSERT_TRUE(make_plan(a, &plan).ok());
  std::vector<std::uint16_t> grad(std::size_t(Buffers::s * Buffers::b * row) + 256);
  auto* g = static_cast<std::uint16_t*>(Buffers::aligned(grad));
  BackwardRun r = buf.backward_run();
  r.dq = g, r.dk = g + Buffers::h * Buffers::d, r.dv = g + 2 * Buffers::h * Buffers::d;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(plan.run(r).ok());  // the exact test once, then remembered
  r.dk = g + Buffers::d;                                      // dk's heads now share dq's second head
  EXPECT_INVALID_WITH(plan.run(r), "dq overlaps dk in memory");
  r.dk = g + Buffers::h * Buffers::d;
  EXPECT_TRUE(plan.run(r).ok());
  EXPECT_EQ(fake.backward_calls, 4);
}

TEST_F(PlanTest, WorkspaceIsCheckedAgainstThePlansSize) {
  CountingBackend fake(1000);
  ScopedBackendOverride o({{Backend::cpu, &fake}});
  Buffers buf;
  ForwardPlan plan;
  ASSERT_TRUE(make_plan(buf.forward_args(), &plan).ok());
  EXPECT_EQ(plan.workspace_size(), 1000u);
  std::vector<float> ws(400);
  ForwardRun r = buf.forward_run();
  r.workspace = Buffers::aligned(ws);
  r.workspace_bytes = 999;
  EXPECT_INVALID_WITH(plan.run(r), "workspace: 999 bytes; this plan (cpu) needs 1000");
  r.workspace_bytes = 1000;
  ASSERT_TRUE(plan.run(r).ok());
  EXPECT_EQ(fake.last_workspace, r.workspace);
  r.workspace = reinterpret_cast<char*>(Buffers::aligned(ws)) + 8;
  EXPECT_INVALID_WITH(plan.run(r), "8 bytes past a 16-byte boundary");
  r.workspace = nullptr;  // none: the backend allocates
  EXPECT_TRUE(plan.run(r).ok());
  std::size_t bytes = 0;
  ASSERT_TRUE(workspace_size(buf.call_args(), &bytes).ok());
  EXPECT_EQ(bytes, 1000u);
}

TEST_F(PlanTest, PerCallFunctionsReuseAPlanPerProblem) {
  CountingBackend fake;
  ScopedBackendOverride o({{Backend::cpu, &fake}});
  Buffers buf;
  ForwardArgs a = buf.call_args();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(forward(a).ok());
    std::swap(a.q.data, a.k.data);  // new pointers, same problem
  }
  EXPECT_EQ(fake.forward_calls, 4);
  EXPECT_EQ(fake.prepare_calls, 1);
  EXPECT_EQ(fake.supports_calls, 1);
  const PlanCache::Stats st = default_plan_cache().stats();
  EXPECT_EQ(st.size, 1u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.hits, 3u);
  // workspace_size asks the same cache: a hit, no new plan (so a caller asking before every
  // call pays one lookup)
  std::size_t bytes = 0;
  ASSERT_TRUE(workspace_size(a, &bytes).ok());
  EXPECT_EQ(default_plan_cache().stats().hits, 4u);
  EXPECT_EQ(fake.prepare_calls, 1);

  // Anything but a pointer is part of the problem.
  ForwardArgs other = a;
  other.options.mask = MaskKind::causal;
  ASSERT_TRUE(forward(other).ok());
  other = a;
  std::vector<std::uint16_t> padded(4 * buf.q.size());
  other.o.stride[kHead] = 2 * Buffers::d;  // padded heads in o
  other.o.stride[kSeq] = 2 * Buffers::h * Buffers::d;
  other.o.stride[kBatch] = 2 * Buffers::s * Buffers::h * Buffers::d;
  other.o.data = Buffers::aligned(padded);
  ASSERT_TRUE(forward(other).ok());
  other = a;
  other.q.data = static_cast<std::uint16_t*>(a.q.data) + 1;  // another alignment class
  ASSERT_TRUE(forward(other).ok());
  other = a;
  other.lse = {};  // no LSE
  ASSERT_TRUE(forward(other).ok());
  EXPECT_EQ(fake.prepare_calls, 5);
  EXPECT_EQ(default_plan_cache().stats().size, 5u);
  ASSERT_TRUE(forward(a).ok());  // still there
  EXPECT_EQ(fake.prepare_calls, 5);
}

TEST_F(PlanTest, CacheDropsTheLeastRecentlyUsedAndForgetsSwappedBackends) {
  CountingBackend fake;
  Buffers buf;
  {
    ScopedBackendOverride o({{Backend::cpu, &fake}});
    PlanCache cache(2);
    ForwardArgs a = buf.call_args(), b = a, c = a;
    b.options.mask = MaskKind::causal;
    c.options.mask = MaskKind::causal_bottom_right;
    ASSERT_TRUE(cache.forward(a).ok());
    ASSERT_TRUE(cache.forward(b).ok());
    ASSERT_TRUE(cache.forward(a).ok());  // a is now the most recent
    ASSERT_TRUE(cache.forward(c).ok());  // drops b
    EXPECT_EQ(cache.stats().size, 2u);
    EXPECT_EQ(fake.prepare_calls, 3);
    ASSERT_TRUE(cache.forward(a).ok());
    EXPECT_EQ(fake.prepare_calls, 3);
    ASSERT_TRUE(cache.forward(b).ok());
    EXPECT_EQ(fake.prepare_calls, 4);
    ASSERT_TRUE(forward(a).ok());
    EXPECT_EQ(fake.forward_calls, 7);
  }
  // The fake is gone: the default cache must not run its plan.
  CountingBackend other;
  ScopedBackendOverride o({{Backend::cpu, &other}});
  ASSERT_TRUE(forward(buf.call_args()).ok());
  EXPECT_EQ(other.forward_calls, 1);
  EXPECT_EQ(fake.forward_calls, 7);
}

TEST_F(PlanTest, FailedMakesAreNotKeptAndRepeatTheirError) {
  CountingBackend fake;
  ScopedBackendOverride o({{Backend::cpu, &fake}});
  Buffers buf;
  ForwardArgs a = buf.call_args();
  a.o.data = a.q.data;  // o overlaps q
  for (int i = 0; i < 2; ++i) EXPECT_INVALID_WITH(forward(a), "o overlaps q in memory");
  EXPECT_EQ(default_plan_cache().stats().size, 0u);
  EXPECT_EQ(fake.forward_calls, 0);
}

TEST_F(PlanTest, BackwardPlanRunsWithItsOwnPointers) {
  CountingBackend fake;
  ScopedBackendOverride o({{Backend::cpu, &fake}});
  Buffers buf;
  BackwardPlan plan;
  ASSERT_TRUE(make_plan(buf.backward_args(), &plan).ok());
  BackwardRun r = buf.backward_run();
  ASSERT_TRUE(plan.run(r).ok());
  EXPECT_EQ(fake.backward_calls, 1);
  r.lse = nullptr;
  EXPECT_INVALID_WITH(plan.run(r), "lse: data is null");
  r = buf.backward_run();
  r.dv = r.dq;
  EXPECT_INVALID_WITH(plan.run(r), "dq overlaps dv in memory");
  BackwardArgs no_lse = buf.backward_args();
  no_lse.lse = {};
  BackwardPlan bad;
  EXPECT_INVALID_WITH(make_plan(no_lse, &bad), "lse: shape [0, 0, 0] differs from [b, h, s_q]");
}

}  // namespace
}  // namespace strideattn::detail
