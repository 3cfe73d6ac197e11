// `cudnn` on a GPU: every case of the option matrix runs through harness::run_case (fresh
// random inputs, poisoned outputs, guard bands, fp64 reference, the tolerance of
// docs/semantics.md) and must come back "ok"; cases cuDNN cannot run must come back
// "unsupported" naming the rule. cuda and cudnn also run on the same inputs where the cuda
// backend is built.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "harness/runner.hpp"
#include "harness/views.hpp"
#include "strideattn/strideattn.hpp"
#include "support/backend_case.hpp"

namespace strideattn {
namespace {

using harness::CaseReport;
using harness::CaseSpec;
using harness::ProblemSizes;
using harness::ViewSpec;

struct Case {
  std::string name;
  CaseSpec spec;
  std::string refuse_rule;  // empty: must run and pass; else must be refused by this rule
};

// gtest prints parameters in test listings (ctest shows them); a name beats a byte dump.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

ProblemSizes dense(std::int64_t b, std::int64_t sq, std::int64_t skv, std::int64_t h, std::int64_t hg, std::int64_t dqk,
                   std::int64_t dv) {
  ProblemSizes s;
  s.batch = b;
  s.s_q = sq;
  s.s_kv = skv;
  s.heads = h;
  s.kv_heads = hg;
  s.d_qk = dqk;
  s.d_v = dv;
  return s;
}

ProblemSizes varlen(std::vector<std::int64_t> lq, std::vector<std::int64_t> lkv, std::vector<std::int64_t> oq,
                    std::vector<std::int64_t> okv, std::int64_t h, std::int64_t hg, std::int64_t d) {
  ProblemSizes s = dense(std::int64_t(lq.size()), 0, 0, h, hg, d, d);
  s.seqlens_q = std::move(lq);
  s.seqlens_kv = std::move(lkv);
  s.offsets_q = std::move(oq);
  s.offsets_kv = std::move(okv);
  for (auto x : s.seqlens_q) s.s_q = std::max(s.s_q, x);
  for (auto x : s.seqlens_kv) s.s_kv = std::max(s.s_kv, x);
  return s;
}

Case layout_case(std::string name, std::string layout, ProblemSizes sizes, MaskKind mask, Window window = {},
                 DType dtype = DType::bf16, std::string refuse = {}) {
  Case c;
  c.name = std::move(name);
  c.spec.dtype = dtype;
  c.spec.sizes = std::move(sizes);
  c.spec.layout_name = layout;
  c.spec.options.mask = mask;
  c.spec.options.window = window;
  c.spec.grad = true;
  c.refuse_rule = std::move(refuse);
  Status s = harness::make_layout_views(layout, c.spec.sizes, &c.spec.views);
  EXPECT_TRUE(s.ok()) << c.name << ": " << s.message();
  return c;
}

// Views with gaps: each tensor its own buffer, [b, s, h, d] order but rows padded to
// `d + pad` elements and heads placed `head_gap` rows apart (x[..., :d] of a wider buffer).
ViewSpec padded(const std::string& buf, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d,
                std::int64_t pad, std::int64_t offset) {
  ViewSpec v;
  v.buffer = buf;
  v.offset = offset;
  v.shape = {b, s, h, d};
  const std::int64_t row = d + pad;
  v.stride = {s * h * row, h * row, row, 1};
  return v;
}

Case padded_case(std::string name, std::int64_t pad, std::int64_t offset, std::string refuse) {
  Case c;
  c.name = std::move(name);
  c.spec.dtype = DType::f16;
  c.spec.sizes = dense(2, 96, 160, 4, 2, 64, 64);
  c.spec.options.mask = MaskKind::causal_bottom_right;
  c.spec.grad = true;
  c.refuse_rule = std::move(refuse);
  auto& v = c.spec.views;
  v.q = padded("q", 2, 96, 4, 64, pad, offset);
  v.k = padded("k", 2, 160, 2, 64, pad, offset);
  v.v = padded("v", 2, 160, 2, 64, pad, offset);
  v.o = padded("o", 2, 96, 4, 64, pad, offset);
  v.d_o = padded("do", 2, 96, 4, 64, pad, offset);
  v.dq = padded("dq", 2, 96, 4, 64, pad, offset);
  v.dk = padded("dk", 2, 160, 2, 64, pad, offset);
  v.dv = padded("dv", 2, 160, 2, 64, pad, offset);
  return c;
}

// sbhd memory described as bshd strides (a transposed view), and a bhsd buffer permuted.
Case transposed_case() {
  Case c;
  c.name = "sbhd_memory_seen_as_bshd_views";
  c.spec.dtype = DType::bf16;
  const std::int64_t b = 3, s = 80, h = 4, d = 128;
  c.spec.sizes = dense(b, s, s, h, h, d, d);
  c.spec.options.mask = MaskKind::causal;
  c.spec.grad = true;
  auto sbhd = [&](const std::string& buf) { return ViewSpec{buf, 0, {b, s, h, d}, {h * d, b * h * d, d, 1}}; };
  auto bhsd = [&](const std::string& buf) { return ViewSpec{buf, 0, {b, s, h, d}, {h * s * d, d, s * d, 1}}; };
  auto& v = c.spec.views;
  v.q = sbhd("q");
  v.k = bhsd("k");
  v.v = sbhd("v");
  v.o = bhsd("o");
  v.d_o = sbhd("do");
  v.dq = bhsd("dq");
  v.dk = sbhd("dk");
  v.dv = bhsd("dv");
  return c;
}

std::vector<Case> matrix() {
  using M = MaskKind;
  std::vector<Case> cs;
  // The seed case (docs/design.md): split views of one fused [s, b, h + 2hg, d] fp16
  // buffer (MQA 16/1, d 64).
  cs.push_back(
      layout_case("seed_layout_mqa", "sb(h+2hg)d", dense(2, 256, 256, 16, 1, 64, 64), M::causal, {}, DType::f16));
  cs.push_back(layout_case("fused_bs_gqa", "bs(h+2hg)d", dense(2, 128, 128, 8, 2, 128, 128), M::none));
  cs.push_back(layout_case("bshd_plain", "bshd_bshd_bshd", dense(2, 128, 128, 4, 4, 64, 64), M::none));
  cs.push_back(
      layout_case("sbhd_causal_f16", "sbhd_sbhd_sbhd", dense(2, 100, 100, 4, 4, 128, 128), M::causal, {}, DType::f16));
  cs.push_back(layout_case("bhsd_causal_br_sq_lt_skv", "bhsd_bhsd_bhsd", dense(2, 64, 200, 4, 2, 64, 64),
                           M::causal_bottom_right));
  cs.push_back(layout_case("causal_top_left_sq_lt_skv", "bshd_bshd_bshd", dense(1, 77, 133, 4, 1, 64, 64), M::causal));
  cs.push_back(layout_case("causal_top_left_sq_gt_skv", "bshd_bshd_bshd", dense(1, 150, 96, 2, 2, 64, 64), M::causal));
  cs.push_back(layout_case("sb3hd_packed", "sb3hd", dense(2, 96, 96, 4, 4, 64, 64), M::causal));
  cs.push_back(layout_case("bsh3d_packed", "bsh3d", dense(2, 96, 96, 4, 4, 64, 64), M::none));
  cs.push_back(layout_case("sbhd_sb2hd_gqa", "sbhd_sb2hd", dense(2, 96, 160, 8, 2, 64, 64), M::none));
  cs.push_back(layout_case("bshd_bsh2d", "bshd_bsh2d", dense(2, 64, 64, 4, 4, 128, 128), M::causal));
  cs.push_back(layout_case("head_dim_256", "bshd_bshd_bshd", dense(1, 128, 128, 2, 2, 256, 256), M::causal));
  cs.push_back(layout_case("head_dim_40", "bshd_bshd_bshd", dense(2, 64, 64, 2, 2, 40, 40), M::none));
  cs.push_back(
      layout_case("head_dim_72_window", "bshd_bshd_bshd", dense(2, 128, 128, 2, 2, 72, 72), M::none, Window{32, 0}));
  cs.push_back(layout_case("mla_dqk_192_dv_128", "bshd_bshd_bshd", dense(1, 128, 128, 4, 4, 192, 128), M::causal));
  cs.push_back(
      layout_case("window_both_sides", "bshd_bshd_bshd", dense(2, 128, 192, 4, 2, 64, 64), M::none, Window{16, 8}));
  cs.push_back(
      layout_case("window_left_only", "bshd_bshd_bshd", dense(1, 100, 100, 2, 2, 64, 64), M::none, Window{10, -1}));
  cs.push_back(
      layout_case("window_right_only", "bshd_bshd_bshd", dense(1, 100, 120, 2, 2, 64, 64), M::none, Window{-1, 5}));
  cs.push_back(layout_case("causal_br_with_window", "bshd_bshd_bshd", dense(2, 64, 128, 2, 2, 64, 64),
                           M::causal_bottom_right, Window{20, -1}));
  cs.push_back(layout_case("decode_sq_1", "bshd_bshd_bshd", dense(4, 1, 257, 8, 1, 128, 128), M::causal_bottom_right));
  // Varlen: packed, padding between sequences, empty sequences on either side.
  cs.push_back(layout_case("thd_packed", "thd_thd_thd", varlen({37, 64, 5}, {37, 64, 5}, {}, {}, 4, 4, 64), M::causal));
  cs.push_back(layout_case("thd_gaps_gqa", "thd_thd_thd",
                           varlen({20, 33, 7}, {40, 33, 17}, {3, 40, 90}, {0, 50, 100}, 8, 2, 64),
                           M::causal_bottom_right));
  cs.push_back(layout_case("thd_empty_sequences", "thd_thd_thd",
                           varlen({16, 0, 24, 9}, {16, 12, 0, 9}, {}, {}, 4, 4, 64), M::none));
  cs.push_back(layout_case("t3hd_packed", "t3hd", varlen({30, 50}, {30, 50}, {}, {}, 4, 4, 64), M::causal));
  cs.push_back(
      layout_case("t_fused_mqa_gaps", "t(h+2hg)d", varlen({32, 17}, {32, 17}, {2, 40}, {2, 40}, 8, 1, 64), M::none));
  cs.push_back(layout_case("thd_t2hd_window", "thd_t2hd", varlen({40, 60}, {50, 60}, {}, {}, 4, 2, 128), M::none,
                           Window{12, 3}));
  // Odd views.
  cs.push_back(transposed_case());
  cs.push_back(padded_case("padded_head_dim_plus_64", 64, 0, ""));
  // Refusals, each by its named rule.
  cs.push_back(padded_case("misaligned_offset_refused", 64, 3, "alignment"));
  cs.push_back(padded_case("odd_row_stride_refused", 3, 0, "alignment"));
  cs.push_back(layout_case("head_dim_264_refused", "bshd_bshd_bshd", dense(1, 32, 32, 2, 2, 264, 264), M::none, {},
                           DType::bf16, "head_dim"));
  cs.push_back(layout_case("head_dim_36_refused", "bshd_bshd_bshd", dense(1, 32, 32, 2, 2, 36, 36), M::none, {},
                           DType::bf16, "head_dim"));
  cs.push_back(layout_case("causal_br_sq_gt_skv_refused", "bshd_bshd_bshd", dense(1, 64, 32, 2, 2, 64, 64),
                           M::causal_bottom_right, {}, DType::bf16, "empty_rows"));
  cs.push_back(layout_case("causal_tl_window_unequal_refused", "bshd_bshd_bshd", dense(1, 64, 96, 2, 2, 64, 64),
                           M::causal, Window{8, -1}, DType::bf16, "mask_alignment"));
  cs.push_back(
      layout_case("f32_refused", "bshd_bshd_bshd", dense(1, 32, 32, 2, 2, 64, 64), M::none, {}, DType::f32, "dtype"));
  return cs;
}

using test_support::describe;

class CudnnMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(CudnnMatrix, MatchesReferenceOrRefusesByRule) {
  if (!harness::gpu_available()) GTEST_SKIP() << "no GPU present: cudnn tests need one";
  const Case& c = GetParam();
  if (c.refuse_rule.empty()) {
    ASSERT_TRUE(c.spec.grad) << "the matrix checks o, lse, dq, dk and dv";
    test_support::expect_backend_ok(Backend::cudnn, c.spec);
    return;
  }
  CaseReport report;
  Status s = harness::run_case(c.spec, {Backend::cudnn}, &report);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(report.backends.size(), 1u);
  const auto& r = report.backends[0];
  const std::string repro = harness::reproducer(c.spec, {Backend::cudnn});
  EXPECT_EQ(r.status, "unsupported") << describe(report) << repro;
  EXPECT_NE(r.reason.find(c.refuse_rule), std::string::npos)
      << "reason must name rule '" << c.refuse_rule << "': " << r.reason;
  EXPECT_NE(r.reason.find("supported"), std::string::npos) << r.reason;
}

TEST_P(CudnnMatrix, CudaAndCudnnAgreeWithReferenceOnSameInputs) {
  if (!harness::gpu_available()) GTEST_SKIP() << "no GPU present";
  if (!backend_compiled(Backend::cuda)) GTEST_SKIP() << "cuda backend not in this build";
  const Case& c = GetParam();
  if (!c.refuse_rule.empty()) GTEST_SKIP() << "cudnn refuses this case by design";
  CaseReport report;
  Status s = harness::run_case(c.spec, {Backend::cuda, Backend::cudnn}, &report);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(report.backends.size(), 2u);
  EXPECT_EQ(report.backends[1].status, "ok") << describe(report);
  // cuda may refuse what it does not support, but must not disagree with the reference.
  EXPECT_TRUE(report.backends[0].status == "ok" || report.backends[0].status == "unsupported") << describe(report);
}

INSTANTIATE_TEST_SUITE_P(Matrix, CudnnMatrix, ::testing::ValuesIn(matrix()),
                         [](const auto& info) { return info.param.name; });

TEST(CudnnGpu, SeedAtFullSizePasses) {
  if (!harness::gpu_available()) GTEST_SKIP() << "no GPU present";
  // The real seed size: s = 2048, b = 2, 16 query heads, 1 KV head, d = 64, fp16, causal.
  Case c =
      layout_case("seed_full", "sb(h+2hg)d", dense(2, 2048, 2048, 16, 1, 64, 64), MaskKind::causal, {}, DType::f16);
  c.spec.grad = false;
  CaseReport report;
  Status s = harness::run_case(c.spec, {Backend::cudnn}, &report);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(report.backends.at(0).status, "ok") << describe(report);
}

TEST(CudnnGpu, RepeatedRunsReuseTheCachedGraphAndStayCorrect) {
  if (!harness::gpu_available()) GTEST_SKIP() << "no GPU present";
  Case c = layout_case("repeat", "bshd_bshd_bshd", dense(2, 64, 64, 2, 2, 64, 64), MaskKind::causal);
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    c.spec.seed = seed;  // fresh random inputs each time, same graph
    CaseReport report;
    Status s = harness::run_case(c.spec, {Backend::cudnn}, &report);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(report.backends.at(0).status, "ok") << describe(report);
  }
}

std::vector<std::string> g_log;
void capture(std::string_view line) { g_log.emplace_back(line); }

// docs/design.md "Explain every decision": with STRIDEATTN_LOG=info the seed case says which
// backend auto chose and why. explain() on the seed's split views (device memory) must choose
// cudnn on an sm90 GPU and log one line naming it.
TEST(CudnnGpu, AutoChoosesCudnnForTheSeedAndSaysSo) {
  if (!harness::gpu_available()) GTEST_SKIP() << "no GPU present";
  unsetenv("STRIDEATTN_BACKEND");
  const std::int64_t s = 2048, b = 2, h = 16, hg = 1, d = 64, row = (h + 2 * hg) * d;
  std::unique_ptr<void, decltype(&std::free)> fused(std::aligned_alloc(256, std::size_t(s * b * row * 2)), &std::free);
  std::unique_ptr<void, decltype(&std::free)> out(std::aligned_alloc(256, std::size_t(s * b * h * d * 2)), &std::free);
  auto split = [&](std::int64_t head0, std::int64_t heads) {
    TensorView t;
    t.data = static_cast<std::uint16_t*>(fused.get()) + head0 * d;
    t.dtype = DType::f16;
    t.shape = {b, s, heads, d};
    t.stride = {row, b * row, d, 1};  // [s, b, h + 2hg, d] memory
    return t;
  };
  ForwardArgs a;
  a.q = split(0, h);
  a.k = split(h, hg);
  a.v = split(h + hg, hg);
  a.o.data = out.get();
  a.o.dtype = DType::f16;
  a.o.shape = {b, s, h, d};
  a.o.stride = {s * h * d, h * d, d, 1};
  a.options.mask = MaskKind::causal;
  a.memory = Memory::device;  // explain never touches the data
  g_log.clear();
  detail::set_log_sink_for_testing(&capture);
  // explain() runs nothing, so it says what *would* run, at debug (a running call says
  // "runs on" at info; the CLI test cli_demo_logs_auto_choice covers that line).
  detail::set_log_level_for_testing(detail::LogLevel::debug);
  Explanation ex = explain(a);
  detail::set_log_sink_for_testing(nullptr);
  detail::set_log_level_for_testing(detail::LogLevel::off);
  ASSERT_TRUE(ex.validation.ok()) << ex.validation.message();
  ASSERT_TRUE(ex.chosen.has_value());
  EXPECT_EQ(*ex.chosen, Backend::cudnn) << (ex.verdicts.empty() ? "" : ex.verdicts[0].reason);
  // Debug also lists the class and each verdict; exactly one line states the choice.
  std::string all;
  int choice_lines = 0;
  for (const auto& line : g_log) {
    all += line + "\n";
    if (line.find("would run on") != std::string::npos) ++choice_lines;
    EXPECT_EQ(line.find("forward runs on "), std::string::npos) << "explain claimed a run: " << line;
  }
  EXPECT_EQ(choice_lines, 1) << all;
  EXPECT_NE(all.find("explain: forward would run on cudnn (auto"), std::string::npos) << all;
}

}  // namespace
}  // namespace strideattn
