// The host backends (`cpu`, `reference`) through plans and with varlen lengths given as
// cu_seqlens arrays, against the fp64 reference through the harness (fresh random inputs,
// poisoned outputs, guard bands): plans made without the run's pointers (CaseSpec::via_plan)
// on a seeded sweep with odd views, cu_seqlens arrays with and without seq_offsets (empty
// sequences, gaps, padding), and the host's full check of the arrays when a run reads them
// (a broken promise is one clear error). A backend that ran on its make-time pointers is
// planted and must be caught.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dispatch/registry.hpp"
#include "harness/runner.hpp"
#include "support/backend_case.hpp"

namespace strideattn {
namespace {

using harness::CaseSpec;
using test_support::expect_backend_ok;

constexpr test_support::DenseCaseBuilder dense{.seed_offset = 77};
constexpr test_support::VarlenCaseBuilder varlen{.seed_base = 9191, .head_dim = 24, .head_dim_in_seed = false};

TEST(HostPlans, SeededSweepThroughPlansAndCuSeqlens) {
  std::mt19937_64 rng(777);
  const test_support::SweepRanges ranges{
      .max_seq = 90, .max_varlen_seq = 70, .max_window = 40, .dtypes = {DType::f32, DType::bf16}, .seed_base = 5000};
  for (int c = 0; c < 24; ++c) {
    CaseSpec s = test_support::sweep_case(c, rng, ranges, dense, varlen);
    s.via_plan = true;
    s.cu_seqlens = s.sizes.varlen();
    for (Backend b : {Backend::cpu, Backend::reference}) {
      SCOPED_TRACE(::testing::Message() << "sweep case " << c << " on " << to_string(b));
      expect_backend_ok(b, s);
    }
  }
}

TEST(HostPlans, CuSeqlensWithEmptySequencesGapsAndOffsets) {
  const MaskKind masks[] = {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right};
  for (MaskKind m : masks) {
    // seq_offsets given (gaps and a tail of padding), then packed (cu_seqlens only).
    CaseSpec gaps =
        varlen(DType::bf16, {0, 17, 40, 1, 9}, {5, 17, 50, 0, 3}, {0, 2, 21, 64, 66}, {0, 7, 30, 81, 82}, m);
    CaseSpec packed = varlen(DType::f16, {12, 0, 33}, {12, 9, 20}, {}, {}, m, 6, 2);
    for (CaseSpec* s : {&gaps, &packed}) {
      s->cu_seqlens = true;
      for (bool plan : {false, true}) {
        s->via_plan = plan;
        for (Backend b : {Backend::cpu, Backend::reference}) {
          SCOPED_TRACE(::testing::Message() << "mask " << int(m) << " via_plan " << plan << " " << to_string(b));
          expect_backend_ok(b, *s);
        }
      }
    }
  }
}

// Host buffers of a varlen problem: 3 sequences over 24 query and 24 key tokens.
struct VarlenCall {
  static constexpr std::int64_t tokens = 24, h = 2, d = 8;
  std::vector<std::uint16_t> q, k, v, o;
  std::vector<float> lse;
  std::vector<std::int32_t> cu_q{0, 5, 12, 20}, cu_kv{0, 5, 12, 20}, off_q, off_kv;
  ForwardArgs args;
  VarlenCall() : q(tokens * h * d, 0x3c00), k(q), v(q), o(q), lse(h * tokens) {
    auto view = [](std::vector<std::uint16_t>& x) {
      TensorView t;
      t.data = x.data();
      t.dtype = DType::f16;
      t.shape = {1, tokens, h, d};
      t.stride = {tokens * h * d, h * d, d, 1};
      return t;
    };
    args.q = view(q), args.k = view(k), args.v = view(v), args.o = view(o);
    args.lse = {lse.data(), {1, h, tokens}, {h * tokens, tokens, 1}};
    args.varlen.count = 3;
    args.varlen.max_seqlen_q = args.varlen.max_seqlen_kv = 8;
    args.varlen.cu_seqlens_q = cu_q.data();
    args.varlen.cu_seqlens_kv = cu_kv.data();
    args.backend = Backend::cpu;
  }
};

#define EXPECT_INVALID_WITH(status, needle)                                                  \
  do {                                                                                       \
    const Status st_ = (status);                                                             \
    EXPECT_EQ(st_.code(), StatusCode::invalid_argument) << st_.message();                    \
    EXPECT_NE(st_.message().find(needle), std::string::npos) << st_.message();               \
    EXPECT_EQ(st_.message().find('\n'), std::string::npos) << "one line: " << st_.message(); \
  } while (0)

TEST(HostPlans, TheHostChecksCuSeqlensArraysWhenARunReadsThem) {
  for (Backend b : {Backend::cpu, Backend::reference}) {
    SCOPED_TRACE(to_string(b));
    VarlenCall c;
    c.args.backend = b;
    ASSERT_TRUE(forward(c.args).ok());
    c.cu_q = {0, 5, 14, 20};  // sequence 1 has 9 > max_seqlen_q 8 tokens
    EXPECT_INVALID_WITH(forward(c.args),
                        "sequence 1 has 9 tokens (cu_seqlens_q[2] - cu_seqlens_q[1]) but max_seqlen_q is 8");
    c.cu_q = {0, 5, 4, 20};  // decreasing
    EXPECT_INVALID_WITH(forward(c.args), "cu_seqlens_q[2] = 4 is below cu_seqlens_q[1] = 5");
    c.cu_q = {0, 5, 12, 20};
    c.cu_kv = {18, 20, 24, 26};  // sequence 2 runs to token 26 of 24
    EXPECT_INVALID_WITH(forward(c.args), "k: sequence 2 runs to token 26 but k has 24 tokens");
    c.cu_kv = {0, 5, 12, 20};
    c.off_q = {0, 3, 12};  // sequences 0 [0, 5) and 1 [3, 10) overlap
    c.args.varlen.seq_offsets_q = c.off_q.data();
    EXPECT_INVALID_WITH(forward(c.args), "q sequences 0 and 1 overlap");
    c.off_q = {0, 5, -1};
    EXPECT_INVALID_WITH(forward(c.args), "seq_offsets_q[2] is -1");
    c.off_q = {16, 0, 7};  // any order, disjoint: fine
    EXPECT_TRUE(forward(c.args).ok());
  }
}

TEST(HostPlans, CuSeqlensRulesAtMakeTime) {
  VarlenCall c;
  ForwardArgs a = c.args;
  a.varlen.max_seqlen_q = 25;
  EXPECT_INVALID_WITH(forward(a), "max_seqlen_q is 25; supported: 0 to the 24 tokens of q");
  a = c.args;
  a.varlen.cu_seqlens_kv = nullptr;
  EXPECT_INVALID_WITH(forward(a), "cu_seqlens_kv is null");
  a = c.args;
  a.varlen.seqlens_q = {5, 7, 8};
  a.varlen.seqlens_kv = {5, 7, 8};
  EXPECT_INVALID_WITH(forward(a), "both forms are given");
  a = c.args;
  a.varlen.count = 0;
  EXPECT_INVALID_WITH(forward(a), "but count is 0");
  a = c.args;
  a.varlen.cu_seqlens_q = reinterpret_cast<const std::int32_t*>(reinterpret_cast<const char*>(c.cu_q.data()) + 2);
  EXPECT_INVALID_WITH(forward(a), "cu_seqlens_q is 2 bytes past a 4-byte boundary");
  a = c.args;
  a.q.shape[kBatch] = 2;
  a.k.shape[kBatch] = a.v.shape[kBatch] = a.o.shape[kBatch] = 2;
  EXPECT_INVALID_WITH(forward(a), "batch extent is 2 in a varlen problem");
  // A plan's arrays come with each run.
  a = c.args;
  a.varlen.cu_seqlens_q = a.varlen.cu_seqlens_kv = nullptr;
  ForwardPlan plan;
  ASSERT_TRUE(make_plan(a, &plan).ok());
  ForwardRun r;
  r.q = c.q.data(), r.k = c.k.data(), r.v = c.v.data(), r.o = c.o.data(), r.lse = c.lse.data();
  EXPECT_INVALID_WITH(plan.run(r), "cu_seqlens_q is null but the plan is a cu_seqlens problem of 3 sequences");
}

// A planted bug: a backend that runs on the pointers its plan was made with instead of the
// run's. Through via_plan (make-time pointers shifted from the run's on views that are not
// 16-byte aligned), the harness must report it.
class StalePointers final : public detail::BackendImpl {
 public:
  Backend id() const override { return Backend::cpu; }
  Verdict supports(const detail::Problem& p) const override { return detail::cpu_backend()->supports(p); }
  Status forward(const detail::Problem& p) override { return detail::cpu_backend()->forward(p); }
  Status backward(const detail::Problem& p) override { return detail::cpu_backend()->backward(p); }
  Status prepare_call(const detail::Problem& p, std::unique_ptr<const detail::PreparedCall>* out) override {
    struct Stale final : detail::PreparedCall {
      detail::Problem made;
      std::size_t workspace_bytes() const override { return 0; }
      Status run(const detail::Problem& p) const override {
        detail::Problem q = p;
        for (auto [mine, theirs] : {std::pair{&q.q, &made.q}, {&q.k, &made.k}, {&q.v, &made.v}, {&q.o, &made.o}})
          if (theirs->data) mine->data = theirs->data;
        return q.is_backward() ? detail::cpu_backend()->backward(q) : detail::cpu_backend()->forward(q);
      }
    };
    auto s = std::make_unique<Stale>();
    s->made = p;
    *out = std::move(s);
    return Status::Ok();
  }
};

TEST(HostPlans, ARunOnMakeTimePointersIsCaught) {
  StalePointers stale;
  detail::ScopedBackendOverride o({{Backend::cpu, &stale}});
  CaseSpec s = dense(DType::bf16, 1, 20, 20, 2, 2, 16, 16, MaskKind::causal, -1, -1, false);
  s.layout_name.clear();
  s = test_support::with_views(s, [](const char* name, std::int64_t heads) {
    harness::ViewSpec v;  // odd element offset: 2-byte aligned, so via_plan makes the plan with a shifted pointer
    v.buffer = name;
    v.offset = 3;
    v.shape = {1, 20, heads, 16};
    v.stride = {20 * heads * 16, heads * 16, 16, 1};
    return v;
  });
  s.via_plan = true;
  harness::CaseReport report;
  ASSERT_TRUE(harness::run_case(s, {Backend::cpu}, &report).ok());
  ASSERT_EQ(report.backends.size(), 1u);
  EXPECT_EQ(report.backends[0].status, "mismatch") << test_support::describe(report);
  s.via_plan = false;  // the per-call path makes its plan on the call's own pointers
  ASSERT_TRUE(harness::run_case(s, {Backend::cpu}, &report).ok());
  EXPECT_EQ(report.backends[0].status, "ok") << test_support::describe(report);
}

}  // namespace
}  // namespace strideattn
