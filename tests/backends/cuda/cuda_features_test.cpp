// The `cuda` backend's training features (docs/semantics.md "Training features": softcap,
// post- and pre-scale bias with dBias, ALiBi, attention sinks, the max logit) against the
// fp64 reference under the correctness
// rule, through the harness runner (device buffers, fresh random inputs, NaN-poisoned
// outputs, guard bands, written checks), forward and backward: each feature alone and all
// together, every mask and windows, GQA/MQA, varlen with gaps between sequences, head dims
// 64, 128, 256 and 192/128, f16 and bf16, strided feature views, every dK/dV kernel and both
// backward forms (the plan's test hook), long key ranges (the forward's fold) and planted
// errors that the checks must catch; bias views of every broadcast shape, f32/f16/bf16, with
// stride 0 and transposed strides, odd offsets and row strides (each way the kernels read a
// bias), dBias stored or summed over broadcasts. What cuda does not
// run (a broadcast dBias in deterministic mode) is refused by name; dropout has its own file
// (cuda_dropout_test.cpp). Skips when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/test_hook.hpp"
#include "harness/runner.hpp"
#include "harness/views.hpp"
#include "support/backend_case.hpp"

namespace {

using strideattn::Backend;
using strideattn::BiasType;
using strideattn::Dims4;
using strideattn::DType;
using strideattn::MaskKind;
using strideattn::cuda_impl::Arch;
using strideattn::cuda_impl::PlanForcing;
using strideattn::cuda_impl::ScopedCudaPlanForcing;
using strideattn::harness::CaseReport;
using strideattn::harness::CaseSpec;
using strideattn::harness::ViewSpec;

#define SKIP_WITHOUT_GPU()                    \
  if (!strideattn::harness::gpu_available())  \
  GTEST_SKIP() << "no CUDA GPU present: the " \
                  "cuda feature tests need one"

constexpr strideattn::test_support::DenseCaseBuilder dense{.seed_offset = 91};
constexpr strideattn::test_support::VarlenCaseBuilder varlen{
    .seed_base = 9191, .head_dim = 64, .head_dim_in_seed = true};

// Which features a case asks for.
struct Feat {
  double softcap = 0;
  std::int64_t alibi_rows = 0;  // 0, 1 or b
  bool sinks = false, max_logit = false;
};
const Feat kSoftcap{.softcap = 2.5}, kAlibi{.alibi_rows = 1}, kSinks{.sinks = true}, kMaxLogit{.max_logit = true};
const Feat kAll{.softcap = 5.0, .alibi_rows = 1, .sinks = true, .max_logit = true};

CaseSpec with(CaseSpec s, const Feat& f) {
  s.options.softcap = f.softcap;
  s.features.alibi_rows = f.alibi_rows < 0 ? s.sizes.batch : f.alibi_rows;
  s.features.sinks = f.sinks;
  s.features.max_logit = f.max_logit;
  // Logits of a few units (the softcap bends, the sinks matter) and no larger: the rule's
  // conditioning allowances model the plain scores (harness::features_change_scores).
  s.input_scale = 1.5;
  return s;
}

// A bias of logical shape `shape` in a buffer of its own, contiguous in the dimension order
// `order` (slowest first); stride0_batch: the batch dimension a stride-0 view of one slab.
CaseSpec with_bias(CaseSpec s, BiasType type, Dims4 shape, std::array<int, 4> order = {0, 1, 2, 3},
                   DType dtype = DType::f32, bool stride0_batch = false) {
  ViewSpec v{"bias", 0, shape, {0, 0, 0, 0}};
  std::int64_t step = 1;
  for (int k = 3; k >= 0; --k) {
    const int d = order[std::size_t(k)];
    v.stride[std::size_t(d)] = step;
    if (!(stride0_batch && d == 0)) step *= shape[std::size_t(d)];
  }
  if (stride0_batch) v.stride[0] = 0;
  s.options.bias_type = type;
  s.features.bias = v;
  s.features.bias_dtype = dtype;
  s.input_scale = 1.5;
  return s;
}

// The outputs a case checks: O and LSE, max_logit; with grad dQ, dK, dV, dBias, d_sinks.
std::vector<std::string> expected_checks(const CaseSpec& s) {
  std::vector<std::string> names{"o", "lse"};
  if (s.features.max_logit) names.push_back("max_logit");
  if (s.grad) {
    names.insert(names.end(), {"dq", "dk", "dv"});
    if (s.features.bias) names.push_back("dbias");
    if (s.features.sinks) names.push_back("d_sinks");
  }
  return names;
}

// Runs `spec` on cuda into `report`, its views first built from spec.layout_name when that
// is set (a case without views is refused before any backend runs).
strideattn::Status run_on_cuda(CaseSpec spec, CaseReport* report) {
  if (!spec.layout_name.empty())
    if (strideattn::Status s = strideattn::harness::make_layout_views(spec.layout_name, spec.sizes, &spec.views);
        !s.ok())
      return s;
  return strideattn::harness::run_case(spec, {Backend::cuda}, report);
}

// cuda runs `spec` and passes: status ok, every output written, guards intact, and each
// expected output checked (never vacuously: the list of checks is the one expected).
void expect_cuda_ok(CaseSpec spec) {
  CaseReport report;
  const strideattn::Status s = run_on_cuda(spec, &report);
  const std::string repro = strideattn::harness::reproducer(spec, {Backend::cuda});
  ASSERT_TRUE(s.ok()) << s.message() << "\n  " << repro;
  ASSERT_EQ(report.backends.size(), 1u);
  const auto& r = report.backends[0];
  EXPECT_EQ(r.status, "ok") << r.reason << "\n  " << repro;
  EXPECT_TRUE(r.guard_ok) << repro;
  EXPECT_TRUE(r.written_ok) << repro;
  std::vector<std::string> checked;
  for (const auto& c : r.checks) checked.push_back(c.name);
  std::vector<std::string> want = expected_checks(spec);
  std::sort(checked.begin(), checked.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(checked, want) << repro;
}

// ------------------------------------------------------------------ each feature alone

TEST(CudaFeatures, EachFeatureAloneEveryBucketBothDtypes) {
  SKIP_WITHOUT_GPU();
  const std::pair<const char*, Feat> feats[] = {{"softcap", kSoftcap},
                                                {"alibi", kAlibi},
                                                {"alibi per batch", {.alibi_rows = -1}},
                                                {"sinks", kSinks},
                                                {"max logit", kMaxLogit}};
  for (std::int64_t d : {64, 128, 256})
    for (DType t : {DType::f16, DType::bf16})
      for (const auto& [name, f] : feats) {
        SCOPED_TRACE(::testing::Message() << name << " d " << d << " " << strideattn::to_string(t));
        expect_cuda_ok(with(dense(t, 2, 150, 170, 4, 2, d, d, MaskKind::causal_bottom_right), f));
      }
}

// ------------------------------------------------------------------ combinations, masks

TEST(CudaFeatures, AllTogetherEveryMaskAndWindows) {
  SKIP_WITHOUT_GPU();
  const std::int64_t windows[][2] = {{-1, -1}, {16, 0}, {5, 40}, {40, 5}, {0, 0}};
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right})
    for (const auto& w : windows) {
      SCOPED_TRACE(::testing::Message() << "mask " << int(m) << " window " << w[0] << "," << w[1]);
      expect_cuda_ok(with(dense(DType::bf16, 2, 130, 200, 4, 2, 64, 64, m, w[0], w[1]), kAll));
      expect_cuda_ok(with(dense(DType::f16, 1, 200, 130, 2, 1, 128, 128, m, w[0], w[1]), kAll));
    }
  // Pairs of features.
  expect_cuda_ok(
      with(dense(DType::bf16, 2, 100, 100, 4, 4, 64, 64, MaskKind::causal), {.softcap = 1.0, .sinks = true}));
  expect_cuda_ok(with(dense(DType::f16, 2, 100, 140, 4, 2, 128, 128, MaskKind::none),
                      {.softcap = 3.0, .alibi_rows = -1, .max_logit = true}));
  // Rows that see no key (O = 0, LSE = -inf, no gradient, the sink not joined) and keys no
  // query sees, with every feature.
  expect_cuda_ok(with(dense(DType::bf16, 1, 250, 40, 2, 1, 64, 64, MaskKind::none, 3, 3), kAll));
  expect_cuda_ok(with(dense(DType::bf16, 1, 40, 250, 2, 1, 128, 128, MaskKind::causal, 2, 0), kAll));
}

// An infinite Q element saturates its row's capped scores exactly (tanh = +-1), so the
// softcap's factor is 0 and dK = 0 x inf = NaN, as the definition says: with ALiBi over long
// distances (or a bias) the tanh taken back from P carries their rounding too, and a factor
// left just above 0 gave -inf instead (a fuzz case: causal, small cap, far keys).
TEST(CudaFeatures, SaturatedSoftcapWithTakenBackTerms) {
  SKIP_WITHOUT_GPU();
  for (std::int64_t d : {64, 128}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    CaseSpec alibi = with(dense(DType::bf16, 1, 64, 300, 2, 1, d, d, MaskKind::causal_bottom_right),
                          {.softcap = 0.95, .alibi_rows = 1, .sinks = true});
    alibi.input_plants.push_back({"q", 40 * 2 * d + 5, INFINITY});  // (row 40, head 0, dim 5)
    expect_cuda_ok(alibi);
    CaseSpec bias =
        with_bias(with(dense(DType::bf16, 1, 64, 300, 2, 1, d, d, MaskKind::causal_bottom_right), {.softcap = 0.95}),
                  BiasType::post_scale, {1, 2, 64, 300});
    bias.input_plants.push_back({"q", 40 * 2 * d + 5, INFINITY});
    expect_cuda_ok(bias);
  }
}

TEST(CudaFeatures, GroupedMultiQueryAndOddHeadDims) {
  SKIP_WITHOUT_GPU();
  expect_cuda_ok(with(dense(DType::bf16, 2, 150, 150, 8, 2, 64, 64, MaskKind::causal), kAll));  // GQA 4
  expect_cuda_ok(with(dense(DType::bf16, 1, 100, 180, 6, 1, 128, 128, MaskKind::none), kAll));  // MQA
  expect_cuda_ok(with(dense(DType::f16, 1, 180, 100, 6, 3, 40, 24, MaskKind::causal_bottom_right), kAll));
  expect_cuda_ok(with(dense(DType::bf16, 1, 150, 150, 2, 1, 192, 128, MaskKind::causal), kAll));  // 192/128
  expect_cuda_ok(with(dense(DType::f16, 1, 129, 128, 1, 1, 8, 8, MaskKind::causal), kAll));
  expect_cuda_ok(with(dense(DType::bf16, 2, 1, 300, 4, 2, 128, 128, MaskKind::causal_bottom_right), kAll));
}

// Varlen (thd) with empty sequences and gaps between them (padding tokens zeroed, not
// touched by the features), ALiBi per sequence and every feature; the max logit of an empty
// sequence is -inf.
TEST(CudaFeatures, VarlenWithPadding) {
  SKIP_WITHOUT_GPU();
  Feat f = kAll;
  f.alibi_rows = -1;
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right}) {
    SCOPED_TRACE(::testing::Message() << "mask " << int(m));
    expect_cuda_ok(
        with(varlen(DType::bf16, {40, 0, 75, 130}, {50, 9, 70, 140}, {0, 45, 50, 130}, {0, 55, 70, 150}, m), f));
    expect_cuda_ok(with(varlen(DType::f16, {90, 20}, {30, 160}, {3, 100}, {0, 40}, m, 12, 0, std::int64_t(128)), f));
  }
}

// Feature views with strides: ALiBi slopes, sinks and the max logit are fp32 views the
// harness lays out in buffers of their own; O and dQ transposed ([s, b, h, d] memory).
TEST(CudaFeatures, TransposedViews) {
  SKIP_WITHOUT_GPU();
  const std::int64_t b = 2, s = 120, h = 4, hg = 2, d = 64;
  const CaseSpec base = with(dense(DType::bf16, b, s, s, h, hg, d, d, MaskKind::causal), kAll);
  expect_cuda_ok(strideattn::test_support::with_views(base, [&](const char* n, std::int64_t hh) {
    return ViewSpec{n, 0, {b, s, hh, d}, {hh * d, b * hh * d, d, 1}};
  }));
}

// ------------------------------------------------------------------ every kernel

// Every dK/dV kernel with the features (sm_90a wgmma by default on an H200; the sm80 8-warp
// pass at d <= 128, the 4-warp pass where shared memory is short and at d 256), the
// single-pass and the two-pass backward (whose dQ pass recomputes P too), group splits and
// the backward's folds, on the same inputs.
TEST(CudaFeatures, EveryBackwardKernelAndForm) {
  SKIP_WITHOUT_GPU();
  const CaseSpec cases[] = {
      with(dense(DType::bf16, 2, 150, 170, 8, 2, 64, 64, MaskKind::causal), kAll),
      with(dense(DType::f16, 1, 170, 150, 4, 1, 128, 128, MaskKind::causal_bottom_right, 30, 10), kAll),
      with(dense(DType::bf16, 1, 130, 130, 2, 1, 256, 256, MaskKind::none), kAll),
  };
  std::vector<PlanForcing> forcings;
  for (std::optional<Arch> arch : {std::optional<Arch>{}, std::optional<Arch>{Arch::sm80}})
    for (bool single : {true, false}) {
      forcings.push_back(PlanForcing{.arch = arch, .single_pass = single});
      forcings.push_back(PlanForcing{.arch = arch, .group_splits = 2, .single_pass = single, .fold_blocks = 1});
    }
  int n = 0;
  for (const PlanForcing& f : forcings) {
    SCOPED_TRACE(::testing::Message() << "forcing " << n++);
    const ScopedCudaPlanForcing forced(f);
    for (const CaseSpec& c : cases) expect_cuda_ok(c);
  }
  // the 4-warp pass at d 128, as on GPUs with less shared memory (no d 256 backward there)
  const ScopedCudaPlanForcing forced(PlanForcing{.arch = Arch::sm80, .smem_optin = 99 * 1024});
  expect_cuda_ok(cases[0]);
  expect_cuda_ok(cases[1]);
}

// Deterministic mode (the two-pass backward) with the features, and d_sinks summed over
// many rows and sequences.
TEST(CudaFeatures, DeterministicBackward) {
  SKIP_WITHOUT_GPU();
  CaseSpec c = with(dense(DType::bf16, 3, 400, 400, 4, 2, 128, 128, MaskKind::causal), kAll);
  c.options.deterministic = true;
  expect_cuda_ok(c);
}

// Rows over more than kFoldKeys keys fold the forward's accumulator (the feature variant
// carries the fold): the max logit and the sink join after the merge.
TEST(CudaFeatures, LongKeyRangesFold) {
  SKIP_WITHOUT_GPU();
  for (std::int64_t d : {64, 128}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    expect_cuda_ok(
        with(dense(DType::bf16, 1, 40, 17000, 2, 1, d, d, MaskKind::causal_bottom_right, -1, -1, false), kAll));
  }
}

// ------------------------------------------------------------------ the checks catch errors

// A result changed after the run (each feature output, and O of a softcapped case) or an
// element left unwritten must fail the case: the comparison is not vacuous.
TEST(CudaFeatures, PlantedErrorsAreCaught) {
  SKIP_WITHOUT_GPU();
  const CaseSpec base = with_bias(with(dense(DType::bf16, 2, 100, 120, 4, 2, 64, 64, MaskKind::causal), kAll),
                                  BiasType::post_scale, {1, 4, 100, 120});
  struct P {
    const char* kind;
    const char* tensor;
    double delta;
  };
  const P plants[] = {{"value", "max_logit", 2.0}, {"value", "d_sinks", 5.0}, {"unwritten", "max_logit", 0},
                      {"unwritten", "d_sinks", 0}, {"value", "o", 0.5},       {"value", "dq", 1.0},
                      {"value", "dbias", 1.0},     {"unwritten", "dbias", 0}};
  for (const P& p : plants) {
    SCOPED_TRACE(::testing::Message() << p.kind << " " << p.tensor);
    CaseSpec c = base;
    c.plant = CaseSpec::Plant{p.kind, p.tensor, 7, p.delta};
    CaseReport report;
    {
      const strideattn::Status st = run_on_cuda(c, &report);
      ASSERT_TRUE(st.ok()) << st.message();
    }
    ASSERT_EQ(report.backends.size(), 1u);
    const auto& r = report.backends[0];
    EXPECT_TRUE(r.status == "mismatch" || !r.written_ok) << r.status << ": " << r.reason;
  }
}

// ------------------------------------------------------------------ bias and dBias

// Every broadcast shape (each dimension full or 1), post- and pre-scale, f32/f16/bf16 bias
// (the harness asks dBias of the bias's dtype with every backward): full shapes store dBias
// in the pass, broadcast ones sum it by atomics; stride-0 and transposed views.
TEST(CudaFeatures, BiasOfEveryBroadcastShapeAndStrideOrder) {
  SKIP_WITHOUT_GPU();
  const std::int64_t b = 2, h = 4, sq = 130, skv = 170;
  struct Shape {
    Dims4 shape;
    std::array<int, 4> order;
    bool stride0;
    BiasType type;
    DType dtype;
  };
  const Shape shapes[] = {
      {{b, h, sq, skv}, {0, 1, 2, 3}, false, BiasType::post_scale, DType::f32},
      {{b, h, sq, skv}, {3, 2, 1, 0}, false, BiasType::pre_scale, DType::bf16},  // transposed strides
      {{b, h, sq, skv}, {1, 3, 0, 2}, true, BiasType::post_scale, DType::f16},   // stride-0 batch
      {{1, h, sq, skv}, {0, 1, 2, 3}, false, BiasType::post_scale, DType::bf16},
      {{b, 1, 1, skv}, {0, 1, 2, 3}, false, BiasType::pre_scale, DType::f32},
      {{1, 1, 1, skv}, {0, 1, 2, 3}, false, BiasType::post_scale, DType::f16},  // TE's [1, 1, 1, s_kv]
      {{1, 1, sq, 1}, {0, 1, 2, 3}, false, BiasType::pre_scale, DType::f32},
      {{b, h, 1, skv}, {2, 3, 0, 1}, false, BiasType::post_scale, DType::f32},
  };
  int n = 0;
  for (const Shape& s : shapes)
    for (DType t : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(::testing::Message() << "bias shape " << n << " " << strideattn::to_string(t));
      expect_cuda_ok(with_bias(dense(t, b, sq, skv, h, 2, 64, 64, MaskKind::causal_bottom_right), s.type, s.shape,
                               s.order, s.dtype, s.stride0));
      ++n;
    }
}

// The bias with every other feature, masks and windows, GQA, each head-dim bucket, every
// backward kernel and form (dBias is written by each dK/dV pass), and varlen (the bias
// longer than the sequences: each reads its rows and keys from the top-left corner).
TEST(CudaFeatures, BiasWithEveryFeatureKernelAndLayout) {
  SKIP_WITHOUT_GPU();
  for (std::int64_t d : {64, 128, 256}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    expect_cuda_ok(with_bias(with(dense(DType::bf16, 2, 150, 170, 8, 2, d, d, MaskKind::causal, 40, 10), kAll),
                             BiasType::post_scale, {2, 8, 150, 170}));
    expect_cuda_ok(with_bias(with(dense(DType::f16, 2, 170, 150, 4, 1, d, d, MaskKind::none), kAll),
                             BiasType::pre_scale, {1, 4, 1, 150}, {0, 1, 2, 3}, DType::bf16));
  }
  const CaseSpec full = with_bias(with(dense(DType::bf16, 2, 140, 160, 8, 2, 128, 128, MaskKind::causal), kAll),
                                  BiasType::pre_scale, {2, 8, 140, 160}, {3, 2, 1, 0}, DType::f16);
  const CaseSpec bcast = with_bias(with(dense(DType::bf16, 2, 140, 160, 8, 2, 64, 64, MaskKind::causal), kAll),
                                   BiasType::post_scale, {1, 8, 140, 1});
  for (std::optional<Arch> arch : {std::optional<Arch>{}, std::optional<Arch>{Arch::sm80}})
    for (bool single : {true, false}) {
      SCOPED_TRACE(::testing::Message() << (arch ? "sm80" : "default") << (single ? " single" : " two-pass"));
      const ScopedCudaPlanForcing forced(PlanForcing{.arch = arch, .group_splits = 2, .single_pass = single});
      expect_cuda_ok(full);
      expect_cuda_ok(bcast);
    }
  {  // the 4-warp pass at d 128 (less shared memory) and d 256 (head-dim splits: dBias
     // written by the first split only, summed once)
    const ScopedCudaPlanForcing forced(PlanForcing{.arch = Arch::sm80, .smem_optin = 99 * 1024});
    expect_cuda_ok(full);
  }
  {
    const ScopedCudaPlanForcing forced(PlanForcing{.arch = Arch::sm80});
    expect_cuda_ok(with_bias(with(dense(DType::f16, 1, 100, 120, 2, 1, 256, 256, MaskKind::none), kAll),
                             BiasType::post_scale, {1, 2, 1, 120}));
    expect_cuda_ok(with_bias(with(dense(DType::bf16, 2, 100, 120, 2, 1, 256, 256, MaskKind::causal), kAll),
                             BiasType::pre_scale, {2, 2, 100, 120}, {3, 2, 1, 0}, DType::bf16));
  }
  for (MaskKind m : {MaskKind::none, MaskKind::causal_bottom_right}) {
    SCOPED_TRACE(::testing::Message() << "varlen mask " << int(m));
    Feat f = kAll;
    f.alibi_rows = -1;
    expect_cuda_ok(with_bias(with(varlen(DType::bf16, {40, 0, 75}, {50, 9, 70}, {0, 45, 50}, {0, 55, 70}, m), f),
                             BiasType::post_scale, {3, 4, 80, 72}, {0, 1, 2, 3}, DType::f32));
    expect_cuda_ok(with_bias(with(varlen(DType::f16, {40, 0, 75}, {50, 9, 70}, {0, 45, 50}, {0, 55, 70}, m), f),
                             BiasType::pre_scale, {1, 1, 75, 70}, {0, 1, 2, 3}, DType::bf16));
  }
  // Deterministic with a full-shape dBias: stored by the pass, no atomics.
  CaseSpec det = full;
  det.options.deterministic = true;
  expect_cuda_ok(det);
}

// The bias's read paths (src/backends/cuda/common/bias_read.cuh) in every forward, dK/dV
// and dQ kernel: a contiguous bias [1, 2, 260, 300] (even row stride, offset 0) reads its
// tiles inside the sequence by pairs (rows = queries: one 32-bit or 64-bit load per column
// pair; rows = keys: a 16-bit bias by transposed pairs, f32 by key rows) and its edge tiles
// element by element; the same bias at an odd element offset, or with rows padded to an odd
// stride, fails the pairs' alignment and reads its inner tiles by the fallbacks (elements;
// key rows for 16-bit). f32, f16 and bf16, each head-dim bucket, the single-pass backward
// and the two-pass one (whose dQ pass reads rows as queries again).
TEST(CudaFeatures, BiasReadPathsAlignedAndUnaligned) {
  SKIP_WITHOUT_GPU();
  const std::int64_t h = 2, sq = 260, skv = 300;
  struct View {
    const char* name;
    std::int64_t offset, row_stride;
  };
  const View views[] = {{"contiguous", 0, skv}, {"odd offset", 1, skv}, {"odd row stride", 0, skv + 1}};
  for (std::int64_t d : {64, 128, 256})
    for (DType bias_dtype : {DType::bf16, DType::f16, DType::f32})
      for (const View& v : views)
        for (bool single : {true, false}) {
          SCOPED_TRACE(::testing::Message() << "d " << d << " bias " << strideattn::to_string(bias_dtype) << " "
                                            << v.name << (single ? " single" : " two-pass"));
          CaseSpec c = with_bias(dense(d == 128 ? DType::f16 : DType::bf16, 1, sq, skv, h, 1, d, d, MaskKind::causal),
                                 BiasType::post_scale, {1, h, sq, skv}, {0, 1, 2, 3}, bias_dtype);
          c.features.bias->offset = v.offset;
          c.features.bias->stride = {h * sq * v.row_stride, sq * v.row_stride, v.row_stride, 1};
          if (d == 64) c.options.bias_type = BiasType::pre_scale;
          const ScopedCudaPlanForcing forced(PlanForcing{.single_pass = single});
          expect_cuda_ok(c);
        }
}

// ------------------------------------------------------------------ what cuda refuses

// A dBias summed over a broadcast dimension (fp32 atomics) is not bitwise reproducible: the
// cuda backend refuses it by its rule in deterministic mode (a GPU is needed: the device
// mirror).
TEST(CudaFeatures, DeterministicBroadcastDbiasIsRefusedByName) {
  SKIP_WITHOUT_GPU();
  CaseSpec c =
      with_bias(dense(DType::bf16, 2, 64, 64, 2, 1, 64, 64, MaskKind::none), BiasType::post_scale, {1, 2, 64, 64});
  c.options.deterministic = true;
  CaseReport report;
  {
    const strideattn::Status st = run_on_cuda(c, &report);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  EXPECT_EQ(report.backends.at(0).status, "unsupported");
  EXPECT_NE(report.backends.at(0).reason.find("dbias_deterministic"), std::string::npos)
      << report.backends.at(0).reason;
}

}  // namespace
