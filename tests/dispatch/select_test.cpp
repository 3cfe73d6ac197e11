// `auto` selection on a CPU: fake backends with chosen verdicts and a faked GPU platform
// (ScopedBackendOverride) check the preference order, STRIDEATTN_BACKEND, refusals that name
// each backend's rule, the one-line info log and the debug verdict list, through both the
// internal select_backend() and the public forward()/explain().
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "dispatch/registry.hpp"
#include "dispatch/select.hpp"
#include "dispatch/speed_table.hpp"
#include "problem/problem.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::detail {
namespace {

// A backend whose verdict the test sets; counts its runs.
class FakeBackend final : public BackendImpl {
 public:
  FakeBackend(Backend id, std::string rule = {}, std::string reason = {})
      : id_(id), rule_(std::move(rule)), reason_(std::move(reason)) {}
  Backend id() const override { return id_; }
  Verdict supports(const Problem&) const override {
    ++supports_calls;
    Verdict v;
    v.backend = id_;
    v.supported = rule_.empty();
    v.rule = rule_;
    v.reason = reason_;
    return v;
  }
  Status forward(const Problem&) override {
    ++forward_calls;
    return Status::Ok();
  }
  Status backward(const Problem&) override {
    ++backward_calls;
    return Status::Ok();
  }
  int forward_calls = 0, backward_calls = 0;
  mutable int supports_calls = 0;

 private:
  Backend id_;
  std::string rule_, reason_;
};

std::vector<std::string> g_lines;
void capture(std::string_view line) { g_lines.emplace_back(line); }

// Real host buffers for a problem of few elements (validation reads shapes and pointers only).
struct SmallProblem {
  std::vector<std::uint16_t> q, k, v, o;
  ForwardArgs args;
  explicit SmallProblem(Memory memory) {
    // 8k tokens: 4.3 GFLOP forward, above the host-bound class's 2 GFLOP (select.cpp), so
    // that `auto` orders it as a GPU-speed problem; head dim 8, far from every measured row.
    const std::int64_t b = 1, s = 8192, h = 2, d = 8;
    q.assign(b * s * h * d, 0x3c00);  // 1.0 in f16
    k = v = o = q;
    auto view = [&](std::vector<std::uint16_t>& buf) {
      TensorView t;
      t.data = buf.data();
      t.dtype = DType::f16;
      t.shape = {b, s, h, d};
      t.stride = {s * h * d, h * d, d, 1};
      return t;
    };
    args.q = view(q);
    args.k = view(k);
    args.v = view(v);
    args.o = view(o);
    args.memory = memory;
  }
  Problem problem() const {
    Problem p;
    Status s = make_problem(args, &p);
    EXPECT_TRUE(s.ok()) << s.message();
    return p;
  }
};

class SelectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("STRIDEATTN_BACKEND");
    g_lines.clear();
    set_log_sink_for_testing(&capture);
    set_log_level_for_testing(LogLevel::info);
  }
  void TearDown() override {
    set_log_sink_for_testing(nullptr);
    set_log_level_for_testing(LogLevel::off);
    unsetenv("STRIDEATTN_BACKEND");
  }
  Platform hopper{true, 90, "Fake H200"};
};

TEST_F(SelectTest, HopperDeviceOrderPutsCudnnFirst) {
  FakeBackend cudnn(Backend::cudnn), cuda(Backend::cuda);
  FakeBackend cpu(Backend::cpu, "memory", "host only"), ref(Backend::reference, "memory", "host only");
  ScopedBackendOverride o(
      {{Backend::cudnn, &cudnn}, {Backend::cuda, &cuda}, {Backend::cpu, &cpu}, {Backend::reference, &ref}}, hopper);
  SmallProblem sp(Memory::device);
  // explain's selection: every verdict, and nothing logged at info (nothing runs)
  Selection sel = select_backend(sp.problem(), Backend::automatic);
  EXPECT_TRUE(g_lines.empty()) << g_lines.front();
  ASSERT_TRUE(sel.chosen.has_value());
  EXPECT_EQ(*sel.chosen, Backend::cudnn);
  EXPECT_EQ(sel.why.rfind("forward would run on cudnn", 0), 0u) << sel.why;
  ASSERT_EQ(sel.verdicts.size(), 4u);
  EXPECT_EQ(sel.verdicts[0].backend, Backend::cudnn);
  EXPECT_EQ(sel.verdicts[1].backend, Backend::cuda);
  EXPECT_NE(sel.verdicts[0].reason.find("chosen"), std::string::npos);
  EXPECT_NE(sel.verdicts[1].reason.find("ranks after cudnn"), std::string::npos);
  // a call that runs: one info line, and only the verdicts up to the chosen backend
  Selection run = select_backend(sp.problem(), Backend::automatic, VerdictScope::until_chosen);
  ASSERT_TRUE(run.chosen.has_value());
  EXPECT_EQ(*run.chosen, Backend::cudnn);
  EXPECT_EQ(run.verdicts.size(), 1u);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_NE(g_lines[0].find("forward runs on cudnn"), std::string::npos) << g_lines[0];
  EXPECT_NE(g_lines[0].find("first in order"), std::string::npos) << g_lines[0];
  EXPECT_NE(g_lines[0].find("sm90"), std::string::npos) << g_lines[0];
}

TEST_F(SelectTest, SkippedFasterBackendIsNamedWithItsRuleInOneInfoLine) {
  FakeBackend cudnn(Backend::cudnn, "head_dim", "head dim d_qk = 264; supported: <= 256");
  FakeBackend cuda(Backend::cuda);
  ScopedBackendOverride o({{Backend::cudnn, &cudnn}, {Backend::cuda, &cuda}}, hopper);
  SmallProblem sp(Memory::device);
  Selection sel = select_backend(sp.problem(), Backend::automatic, VerdictScope::until_chosen);
  ASSERT_TRUE(sel.chosen.has_value());
  EXPECT_EQ(*sel.chosen, Backend::cuda);
  ASSERT_EQ(g_lines.size(), 1u);
  const std::string& line = g_lines[0];
  EXPECT_NE(line.find("[strideattn] forward runs on cuda"), std::string::npos) << line;
  EXPECT_NE(line.find("skipped cudnn: head_dim: head dim d_qk = 264; supported: <= 256"), std::string::npos) << line;
  EXPECT_EQ(line.find("cpu:"), std::string::npos) << "slower backends are not listed: " << line;
  EXPECT_EQ(sel.why, line.substr(std::string("[strideattn] ").size()));
}

TEST_F(SelectTest, HostMemoryPrefersCpuThenReference) {
  FakeBackend cpu(Backend::cpu, "dtype", "f32 not supported"), ref(Backend::reference);
  FakeBackend cudnn(Backend::cudnn, "memory", "host"), cuda(Backend::cuda, "memory", "host");
  ScopedBackendOverride o(
      {{Backend::cudnn, &cudnn}, {Backend::cuda, &cuda}, {Backend::cpu, &cpu}, {Backend::reference, &ref}}, hopper);
  SmallProblem sp(Memory::host);
  Selection sel = select_backend(sp.problem(), Backend::automatic, VerdictScope::until_chosen);
  ASSERT_TRUE(sel.chosen.has_value());
  EXPECT_EQ(*sel.chosen, Backend::reference);
  EXPECT_EQ(sel.verdicts[0].backend, Backend::cpu);
  EXPECT_EQ(sel.verdicts[1].backend, Backend::reference);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_NE(g_lines[0].find("skipped cpu: dtype: f32 not supported"), std::string::npos) << g_lines[0];
}

TEST_F(SelectTest, EnvironmentOverrideWinsOverOrder) {
  FakeBackend cpu(Backend::cpu), ref(Backend::reference);
  ScopedBackendOverride o({{Backend::cpu, &cpu}, {Backend::reference, &ref}});
  setenv("STRIDEATTN_BACKEND", "reference", 1);
  SmallProblem sp(Memory::host);
  Selection sel = select_backend(sp.problem(), Backend::automatic, VerdictScope::until_chosen);
  ASSERT_TRUE(sel.chosen.has_value());
  EXPECT_EQ(*sel.chosen, Backend::reference);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_NE(g_lines[0].find("runs on reference (STRIDEATTN_BACKEND=reference)"), std::string::npos) << g_lines[0];
  // An explicit request in the arguments is not overridden by the environment.
  Selection explicit_sel = select_backend(sp.problem(), Backend::cpu, VerdictScope::until_chosen);
  ASSERT_TRUE(explicit_sel.chosen.has_value());
  EXPECT_EQ(*explicit_sel.chosen, Backend::cpu);
}

TEST_F(SelectTest, BadEnvironmentValueIsInvalidArgument) {
  setenv("STRIDEATTN_BACKEND", "flash", 1);
  SmallProblem sp(Memory::host);
  Selection sel = select_backend(sp.problem(), Backend::automatic, VerdictScope::until_chosen);
  EXPECT_FALSE(sel.chosen.has_value());
  EXPECT_EQ(sel.status.code(), StatusCode::invalid_argument);
  EXPECT_NE(sel.status.message().find("STRIDEATTN_BACKEND='flash'"), std::string::npos);
  EXPECT_NE(sel.status.message().find("supported: auto, reference, cpu, cuda, cudnn"), std::string::npos);
}

TEST_F(SelectTest, RequestedBackendThatRefusesGivesItsRule) {
  FakeBackend cudnn(Backend::cudnn, "empty_rows", "query row 0 of sequence 0 sees no key");
  ScopedBackendOverride o({{Backend::cudnn, &cudnn}}, hopper);
  SmallProblem sp(Memory::device);
  Selection sel = select_backend(sp.problem(), Backend::cudnn, VerdictScope::until_chosen);
  EXPECT_FALSE(sel.chosen.has_value());
  EXPECT_EQ(sel.status.code(), StatusCode::unsupported);
  EXPECT_EQ(sel.status.message(),
            "backend 'cudnn' (requested) cannot run this problem: empty_rows: query row 0 of "
            "sequence 0 sees no key");
}

TEST_F(SelectTest, NothingSupportedListsEveryBackendsRule) {
  FakeBackend cudnn(Backend::cudnn, "gpu", "no usable CUDA device");
  FakeBackend cpu(Backend::cpu, "memory", "tensors are in device memory");
  FakeBackend ref(Backend::reference, "memory", "tensors are in device memory");
  ScopedBackendOverride o(
      {{Backend::cudnn, &cudnn}, {Backend::cuda, nullptr}, {Backend::cpu, &cpu}, {Backend::reference, &ref}},
      Platform{});
  SmallProblem sp(Memory::device);
  Selection sel = select_backend(sp.problem(), Backend::automatic, VerdictScope::until_chosen);
  EXPECT_FALSE(sel.chosen.has_value());
  EXPECT_EQ(sel.status.code(), StatusCode::unsupported);
  const std::string& m = sel.status.message();
  EXPECT_NE(m.find("cudnn: gpu: no usable CUDA device"), std::string::npos) << m;
  EXPECT_NE(m.find("cuda: compiled: backend 'cuda' is not part of this build"), std::string::npos) << m;
  EXPECT_NE(m.find("cpu: memory:"), std::string::npos) << m;
  EXPECT_NE(m.find("reference: memory:"), std::string::npos) << m;
  EXPECT_NE(g_lines.at(0).find("no GPU visible"), std::string::npos) << "class named in the log";
}

TEST_F(SelectTest, DebugListsTheClassAndEveryVerdict) {
  set_log_level_for_testing(LogLevel::debug);
  FakeBackend cudnn(Backend::cudnn, "alignment", "q seq stride 1155 elements");
  FakeBackend cuda(Backend::cuda), cpu(Backend::cpu, "memory", "m"), ref(Backend::reference, "memory", "m");
  ScopedBackendOverride o(
      {{Backend::cudnn, &cudnn}, {Backend::cuda, &cuda}, {Backend::cpu, &cpu}, {Backend::reference, &ref}}, hopper);
  SmallProblem sp(Memory::device);
  Selection sel = select_backend(sp.problem(), Backend::automatic, VerdictScope::until_chosen);
  ASSERT_TRUE(sel.chosen.has_value());
  ASSERT_EQ(g_lines.size(), 6u);  // class line, four verdicts, the info line
  EXPECT_NE(g_lines[0].find("class 'sm90 device'"), std::string::npos) << g_lines[0];
  EXPECT_NE(g_lines[0].find("docs/design.md"), std::string::npos) << "source of the order: " << g_lines[0];
  EXPECT_NE(g_lines[1].find("verdict 1/4 cudnn: alignment: q seq stride 1155"), std::string::npos) << g_lines[1];
  EXPECT_NE(g_lines[2].find("verdict 2/4 cuda: supported"), std::string::npos) << g_lines[2];
  EXPECT_NE(g_lines[3].find("verdict 3/4 cpu: memory: m"), std::string::npos) << g_lines[3];
  EXPECT_NE(g_lines[5].find("forward runs on cuda"), std::string::npos) << g_lines[5];
}

TEST_F(SelectTest, LogOffPrintsNothing) {
  set_log_level_for_testing(LogLevel::off);
  FakeBackend cpu(Backend::cpu);
  ScopedBackendOverride o({{Backend::cpu, &cpu}});
  SmallProblem sp(Memory::host);
  Selection sel = select_backend(sp.problem(), Backend::automatic, VerdictScope::until_chosen);
  EXPECT_TRUE(sel.chosen.has_value());
  EXPECT_TRUE(g_lines.empty());
}

TEST_F(SelectTest, PublicForwardRunsTheChosenBackendAndExplainShowsEveryVerdict) {
  FakeBackend cudnn(Backend::cudnn, "window", "window (3,0) does not map");
  FakeBackend cuda(Backend::cuda);
  FakeBackend cpu(Backend::cpu, "memory", "m"), ref(Backend::reference, "memory", "m");
  ScopedBackendOverride o(
      {{Backend::cudnn, &cudnn}, {Backend::cuda, &cuda}, {Backend::cpu, &cpu}, {Backend::reference, &ref}}, hopper);
  SmallProblem sp(Memory::device);
  Status s = forward(sp.args);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(cuda.forward_calls, 1);
  EXPECT_EQ(cudnn.forward_calls, 0);

  Explanation ex = explain(sp.args);
  ASSERT_TRUE(ex.validation.ok());
  ASSERT_TRUE(ex.chosen.has_value());
  EXPECT_EQ(*ex.chosen, Backend::cuda);
  ASSERT_EQ(ex.verdicts.size(), 4u);
  EXPECT_EQ(ex.verdicts[0].backend, Backend::cudnn);
  EXPECT_EQ(ex.verdicts[0].rule, "window");
  EXPECT_TRUE(ex.verdicts[1].supported);
}

TEST_F(SelectTest, OverridesNestAndRestore) {
  FakeBackend a(Backend::cpu, "r1", "outer"), b(Backend::cpu, "r2", "inner");
  SmallProblem sp(Memory::host);
  {
    ScopedBackendOverride outer({{Backend::cpu, &a}});
    {
      ScopedBackendOverride inner({{Backend::cpu, &b}}, hopper);
      EXPECT_EQ(backend_impl(Backend::cpu), &b);
      EXPECT_EQ(platform().sm, 90);
    }
    EXPECT_EQ(backend_impl(Backend::cpu), &a);
  }
  EXPECT_NE(backend_impl(Backend::cpu), &a);
}

// A call that runs asks backends only until one supports the problem (their checks are
// per-call work); explain() and debug logging still see every verdict.
TEST_F(SelectTest, RunningCallStopsAskingAtTheChosenBackend) {
  FakeBackend cudnn(Backend::cudnn, "head_dim", "d_qk 264"), cuda(Backend::cuda);
  FakeBackend cpu(Backend::cpu, "memory", "host only"), ref(Backend::reference, "memory", "host only");
  ScopedBackendOverride o(
      {{Backend::cudnn, &cudnn}, {Backend::cuda, &cuda}, {Backend::cpu, &cpu}, {Backend::reference, &ref}}, hopper);
  SmallProblem sp(Memory::device);
  ASSERT_TRUE(strideattn::forward(sp.args).ok());
  EXPECT_EQ(cuda.forward_calls, 1);
  EXPECT_EQ(cudnn.supports_calls, 1);
  EXPECT_EQ(cuda.supports_calls, 1);
  EXPECT_EQ(cpu.supports_calls + ref.supports_calls, 0);
  ASSERT_EQ(g_lines.size(), 1u);  // the info line still names the skipped faster backend
  EXPECT_NE(g_lines[0].find("skipped cudnn: head_dim: d_qk 264"), std::string::npos) << g_lines[0];

  sp.args.backend = Backend::cuda;  // explicit: only that backend is asked
  ASSERT_TRUE(strideattn::forward(sp.args).ok());
  EXPECT_EQ(cudnn.supports_calls, 1);
  EXPECT_EQ(cuda.supports_calls, 2);

  const Explanation ex = strideattn::explain(sp.args);
  EXPECT_EQ(ex.verdicts.size(), 4u);
}

// ------------------------------------------------------------------ the measured rows

// A device problem of the benchmark's kind (no buffers: speed_class reads sizes only).
Problem bench_problem(Direction dir, std::int64_t s, std::int64_t d, std::int64_t h, std::int64_t hg, bool causal,
                      std::int64_t window) {
  Problem p;
  p.direction = dir;
  p.dtype = DType::bf16;
  p.memory = Memory::device;
  p.batch = 2, p.s_q = p.s_kv = s, p.heads = h, p.kv_heads = hg, p.d_qk = p.d_v = d;
  p.mask = causal ? MaskKind::causal : MaskKind::none;
  if (window >= 0) p.window = {window, 0};
  return p;
}

TEST(SpeedTable, EveryRowHasBothBackendsAndTheListHasWindows) {
  ASSERT_FALSE(speed_rows().empty());
  bool windows = false;
  for (const SpeedRow& r : speed_rows()) {
    EXPECT_GT(r.fwd_cuda, 0) << r.shape;
    EXPECT_GT(r.fwd_cudnn, 0) << r.shape;
    EXPECT_GT(r.both_cuda, 0) << r.shape;
    EXPECT_GT(r.both_cudnn, 0) << r.shape;
    windows |= r.window >= 0;
  }
  EXPECT_TRUE(windows) << "the table has no window rows: " << speed_table_source();
}

TEST(SpeedTable, EachRowIsItsOwnNearestAndDecidesTheOrder) {
  ScopedBackendOverride o({}, Platform{true, 90, "Fake H200"});
  for (const SpeedRow& r : speed_rows())
    for (Direction dir : {Direction::forward, Direction::backward}) {
      Problem p = bench_problem(dir, r.s, r.d, r.heads, r.kv_heads, r.causal, r.window);
      p.dtype = r.dtype;
      EXPECT_EQ(speed_row_distance(r, p), 0.0) << r.shape;
      const SpeedRow* near = nearest_speed_row(p);
      ASSERT_NE(near, nullptr);
      EXPECT_EQ(speed_row_distance(*near, p), 0.0) << r.shape << " -> " << near->shape;
      const SpeedClass cls = speed_class(p);
      ASSERT_GE(cls.order.size(), 2u);
      EXPECT_EQ(cls.order[0], near->cuda_faster(dir) ? Backend::cuda : Backend::cudnn) << cls.source;
      EXPECT_NE(cls.name.find(std::string("measured like '") + near->shape), std::string::npos) << cls.name;
      EXPECT_NE(cls.source.find("TFLOP/s"), std::string::npos) << cls.source;
      EXPECT_NE(cls.source.find("bench/results/"), std::string::npos) << cls.source;
    }
}

// A problem with a training feature keeps cuda first on a GPU, whatever its nearest row says:
// cudnn runs some features but they are not measured against cuda's.
TEST(SpeedTable, TrainingFeaturesKeepCudaFirst) {
  ScopedBackendOverride o({}, Platform{true, 90, "Fake H200"});
  for (const SpeedRow& r : speed_rows()) {
    Problem p = bench_problem(Direction::forward, r.s, r.d, r.heads, r.kv_heads, r.causal, r.window);
    p.dtype = r.dtype;
    p.max_logit_on = true;
    const SpeedClass cls = speed_class(p);
    ASSERT_GE(cls.order.size(), 2u);
    EXPECT_EQ(cls.order[0], Backend::cuda) << r.shape << ": " << cls.name;
    EXPECT_EQ(cls.name, "training features, device memory");
  }
}

TEST(SpeedTable, WindowsFollowTheWindowRows) {
  ScopedBackendOverride o({}, Platform{true, 90, "Fake H200"});
  // a window of 512 over 8k tokens at d 128: nearest to a window row, never to a full mask
  const Problem p = bench_problem(Direction::backward, 8192, 128, 16, 16, true, 512);
  const SpeedRow* near = nearest_speed_row(p);
  ASSERT_NE(near, nullptr);
  EXPECT_GE(near->window, 0) << near->shape;
  const Problem full = bench_problem(Direction::backward, 8192, 128, 16, 16, true, -1);
  EXPECT_LT(nearest_speed_row(full)->window, 0) << nearest_speed_row(full)->shape;
}

TEST(SpeedTable, FarProblemsAndStrideattnAutoFixedKeepTheFixedOrder) {
  ScopedBackendOverride o({}, Platform{true, 90, "Fake H200"});
  const std::vector<Backend> fixed{Backend::cudnn, Backend::cuda, Backend::cpu, Backend::reference};
  // head dim 8 and 4M tokens: a factor of 8 and of 64 or more from every row, and far from
  // host-bound
  Problem far = bench_problem(Direction::forward, std::int64_t(1) << 22, 8, 2, 2, false, -1);
  SpeedClass cls = speed_class(far);
  EXPECT_EQ(cls.order, fixed);
  EXPECT_NE(cls.source.find("no measured row near this problem"), std::string::npos) << cls.source;
  // A problem some row favours cuda for, when one exists, with the measurements turned off.
  for (const SpeedRow& r : speed_rows()) {
    if (!r.cuda_faster(Direction::forward)) continue;
    Problem p = bench_problem(Direction::forward, r.s, r.d, r.heads, r.kv_heads, r.causal, r.window);
    p.dtype = r.dtype;
    EXPECT_EQ(speed_class(p).order[0], Backend::cuda);
    ::setenv("STRIDEATTN_AUTO", "fixed", 1);
    cls = speed_class(p);
    ::unsetenv("STRIDEATTN_AUTO");
    EXPECT_EQ(cls.order, fixed);
    EXPECT_NE(cls.source.find("STRIDEATTN_AUTO=fixed"), std::string::npos) << cls.source;
    break;
  }
}

TEST(SpeedTable, HostBoundProblemsTakeTheCheaperHostPath) {
  ScopedBackendOverride o({}, Platform{true, 90, "Fake H200"});
  const std::vector<Backend> cuda_first{Backend::cuda, Backend::cudnn, Backend::cpu, Backend::reference};
  // [1, 128, 4, 64] bf16 (host_overhead.py's problem): 16.8 MFLOP forward
  Problem tiny = bench_problem(Direction::forward, 128, 64, 4, 4, false, -1);
  tiny.batch = 1;
  SpeedClass cls = speed_class(tiny);
  EXPECT_EQ(cls.order, cuda_first);
  EXPECT_NE(cls.name.find("host-bound"), std::string::npos) << cls.name;
  EXPECT_NE(cls.source.find("bench/results/host/"), std::string::npos) << cls.source;
  tiny.direction = Direction::backward;
  EXPECT_EQ(speed_class(tiny).order, cuda_first);
  // Just above the bound (2 GFLOP): b 2, h 16, s 1024, d 64 is 8.6 GFLOP forward; the table
  // decides, not the host rule.
  const Problem big = bench_problem(Direction::forward, 1024, 64, 16, 16, false, -1);
  EXPECT_EQ(speed_class(big).name.find("host-bound"), std::string::npos) << speed_class(big).name;
  // STRIDEATTN_AUTO=fixed turns the rule off as it does the table.
  ::setenv("STRIDEATTN_AUTO", "fixed", 1);
  cls = speed_class(tiny);
  ::unsetenv("STRIDEATTN_AUTO");
  EXPECT_EQ(cls.order[0], Backend::cudnn);
}

}  // namespace
}  // namespace strideattn::detail
