// The `cudnn` backend's training features on a GPU (docs/backends.md, "cudnn"): the post-scale
// bias and the attention sinks against the fp64 reference under the correctness rule, through
// the harness runner (device buffers, fresh random inputs, NaN-poisoned outputs, guard bands,
// written checks): every batch/head broadcast cuDNN takes forward, dBias of [1, h, s_q, s_kv]
// backward, masks none and causal, GQA and MQA, head dims 64/128/192-128, f16 and bf16, padded
// bias rows and a stride-0 batch; sinks with d_sinks under every mask, with a window and with a
// bias; what cuDNN does not take comes back "unsupported" naming the rule (`bias`, `sinks`);
// planted errors in O, dQ, dBias and d_sinks must be caught. Skips when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "harness/runner.hpp"
#include "harness/views.hpp"
#include "support/backend_case.hpp"

namespace {

using strideattn::Backend;
using strideattn::BiasType;
using strideattn::Dims4;
using strideattn::DType;
using strideattn::MaskKind;
using strideattn::harness::CaseReport;
using strideattn::harness::CaseSpec;
using strideattn::harness::ViewSpec;

#define SKIP_WITHOUT_GPU()                    \
  if (!strideattn::harness::gpu_available())  \
  GTEST_SKIP() << "no CUDA GPU present: the " \
                  "cudnn feature tests need one"

constexpr strideattn::test_support::DenseCaseBuilder dense{.seed_offset = 1919};

// A post-scale bias of logical shape `shape` in its own buffer, in the case's dtype, rows of
// `row` elements (>= shape[3]: padded rows), heads and batches packed above them; with
// stride0_batch the batch dimension reads one slab (stride 0).
CaseSpec with_bias(CaseSpec s, Dims4 shape, std::int64_t row = 0, bool stride0_batch = false) {
  row = std::max(row, shape[3]);
  ViewSpec v{"bias", 0, shape, {0, 0, 0, 0}};
  v.stride[3] = 1;
  v.stride[2] = row;
  v.stride[1] = shape[2] * row;
  v.stride[0] = stride0_batch ? 0 : shape[1] * shape[2] * row;
  s.options.bias_type = BiasType::post_scale;
  s.features.bias = v;
  s.features.bias_dtype = s.dtype;
  s.input_scale = 1.5;  // logits of a few units: the bias matters
  return s;
}

strideattn::Status run_on_cudnn(CaseSpec spec, CaseReport* report) {
  if (!spec.layout_name.empty())
    if (strideattn::Status s = strideattn::harness::make_layout_views(spec.layout_name, spec.sizes, &spec.views);
        !s.ok())
      return s;
  return strideattn::harness::run_case(spec, {Backend::cudnn}, report);
}

// cudnn runs `spec` and passes: status ok, every output written, guards intact, and exactly
// the expected outputs checked (o, lse; with grad dq, dk, dv, dbias with a bias, d_sinks with
// sinks), never vacuously.
void expect_cudnn_ok(const CaseSpec& spec) {
  CaseReport report;
  const strideattn::Status s = run_on_cudnn(spec, &report);
  const std::string repro = strideattn::harness::reproducer(spec, {Backend::cudnn});
  ASSERT_TRUE(s.ok()) << s.message() << "\n  " << repro;
  ASSERT_EQ(report.backends.size(), 1u);
  const auto& r = report.backends[0];
  EXPECT_EQ(r.status, "ok") << r.reason << "\n  " << repro;
  EXPECT_TRUE(r.guard_ok) << repro;
  EXPECT_TRUE(r.written_ok) << repro;
  std::vector<std::string> checked, want{"o", "lse"};
  if (spec.grad) want.insert(want.end(), {"dq", "dk", "dv"});
  if (spec.grad && spec.features.bias) want.push_back("dbias");
  if (spec.grad && spec.features.sinks) want.push_back("d_sinks");
  for (const auto& c : r.checks) checked.push_back(c.name);
  std::sort(checked.begin(), checked.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(checked, want) << repro;
}

CaseSpec with_sinks(CaseSpec s) {
  s.features.sinks = true;
  s.input_scale = 1.5;  // logits of a few units: the sinks matter
  return s;
}

// cudnn refuses `spec` by its rule `rule`, the reason containing `text` and what is supported.
void expect_cudnn_refuses(const CaseSpec& spec, const std::string& text, const std::string& rule = "bias") {
  CaseReport report;
  const strideattn::Status s = run_on_cudnn(spec, &report);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(report.backends.size(), 1u);
  const auto& r = report.backends[0];
  EXPECT_EQ(r.status, "unsupported") << r.reason;
  EXPECT_NE(r.reason.find(rule), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find(text), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("supported"), std::string::npos) << r.reason;
}

// ------------------------------------------------------------------ forward: every broadcast

TEST(CudnnFeatures, BiasForwardEveryBroadcastBothDtypes) {
  SKIP_WITHOUT_GPU();
  const std::int64_t b = 2, h = 4, hg = 2, sq = 136, skv = 200;
  for (DType t : {DType::f16, DType::bf16})
    for (MaskKind m : {MaskKind::none, MaskKind::causal})
      for (Dims4 shape : {Dims4{b, h, sq, skv}, Dims4{1, h, sq, skv}, Dims4{b, 1, sq, skv}, Dims4{1, 1, sq, skv}}) {
        SCOPED_TRACE(::testing::Message()
                     << strideattn::to_string(t) << " mask " << int(m) << " bias " << shape[0] << "," << shape[1]);
        expect_cudnn_ok(with_bias(dense(t, b, sq, skv, h, hg, 64, 64, m, -1, -1, /*grad=*/false), shape));
      }
}

TEST(CudnnFeatures, BiasForwardHeadDimsStridesAndQueryLongerThanKeys) {
  SKIP_WITHOUT_GPU();
  for (std::int64_t d : {64, 128}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    expect_cudnn_ok(with_bias(dense(DType::bf16, 2, 128, 128, 8, 1, d, d, MaskKind::causal, -1, -1, false),
                              {2, 8, 128, 128}));  // MQA
  }
  expect_cudnn_ok(with_bias(dense(DType::f16, 1, 150, 150, 2, 1, 192, 128, MaskKind::causal, -1, -1, false),
                            {1, 2, 150, 150}, 152));  // 192/128, rows of 152 elements (304 bytes)
  // Rows padded to 72 elements; a stride-0 batch (one slab for both batches).
  expect_cudnn_ok(
      with_bias(dense(DType::bf16, 2, 64, 64, 4, 4, 64, 64, MaskKind::none, -1, -1, false), {2, 4, 64, 64}, 72));
  expect_cudnn_ok(with_bias(dense(DType::bf16, 2, 96, 128, 4, 2, 64, 64, MaskKind::none, -1, -1, false),
                            {2, 4, 96, 128}, 0, /*stride0_batch=*/true));
  // Top-left causal with more queries than keys: every row still sees key 0.
  expect_cudnn_ok(
      with_bias(dense(DType::f16, 1, 200, 120, 4, 2, 64, 64, MaskKind::causal, -1, -1, false), {1, 4, 200, 120}));
}

// ------------------------------------------------------------------ backward with dBias

TEST(CudnnFeatures, BiasBackwardWithDBiasMasksAndGroups) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::f16, DType::bf16})
    for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
      SCOPED_TRACE(::testing::Message() << strideattn::to_string(t) << " mask " << int(m));
      expect_cudnn_ok(with_bias(dense(t, 2, 128, 192, 4, 2, 64, 64, m), {1, 4, 128, 192}));    // GQA 2
      expect_cudnn_ok(with_bias(dense(t, 3, 136, 136, 8, 1, 128, 128, m), {1, 8, 136, 136}));  // MQA
    }
  // Keys no query sees (top-left causal, s_q < s_kv): their dBias columns are 0.
  expect_cudnn_ok(with_bias(dense(DType::bf16, 2, 64, 256, 4, 4, 64, 64, MaskKind::causal), {1, 4, 64, 256}));
  // Padded bias rows with a packed dBias (without a view of its own the harness's dBias is
  // contiguous); padded dBias rows are refused by rule (WhatCudnnCannotTakeIsRefusedByRule).
  expect_cudnn_ok(with_bias(dense(DType::f16, 2, 128, 128, 4, 4, 64, 64, MaskKind::causal), {1, 4, 128, 128}, 136));
  // Deterministic backward.
  CaseSpec det = with_bias(dense(DType::bf16, 2, 128, 128, 4, 2, 64, 64, MaskKind::causal), {1, 4, 128, 128});
  det.options.deterministic = true;
  expect_cudnn_ok(det);
}

// ------------------------------------------------------------------ refusals by name

TEST(CudnnFeatures, WhatCudnnCannotTakeIsRefusedByRule) {
  SKIP_WITHOUT_GPU();
  const CaseSpec base = dense(DType::bf16, 2, 64, 64, 4, 2, 64, 64, MaskKind::none);
  CaseSpec pre = with_bias(base, {1, 4, 64, 64});
  pre.options.bias_type = BiasType::pre_scale;
  expect_cudnn_refuses(pre, "pre_scale bias");
  expect_cudnn_refuses(with_bias(base, {2, 4, 64, 64}), "cuDNN writes dBias of shape [1, h, s_q, s_kv] only");
  expect_cudnn_refuses(with_bias(base, {1, 4, 1, 64}), "broadcasts over query rows");
  CaseSpec padded = with_bias(base, {1, 4, 64, 64}, 72);
  padded.features.dbias = ViewSpec{"dbias", 0, {1, 4, 64, 64}, {4 * 64 * 72, 64 * 72, 72, 1}};
  expect_cudnn_refuses(padded, "cuDNN writes dBias in packed rows");
  CaseSpec f32 = with_bias(base, {1, 4, 64, 64});
  f32.features.bias_dtype = DType::f32;
  expect_cudnn_refuses(f32, "supported: the tensors' dtype");
  expect_cudnn_refuses(
      with_bias(dense(DType::bf16, 2, 64, 64, 4, 2, 64, 64, MaskKind::causal_bottom_right), {1, 4, 64, 64}),
      "bottom-right");
  expect_cudnn_refuses(with_bias(dense(DType::bf16, 2, 64, 64, 4, 2, 64, 64, MaskKind::none, 8, 0), {1, 4, 64, 64}),
                       "window 8,0");
}

// ------------------------------------------------------------------ sinks and d_sinks

TEST(CudnnFeatures, SinksForwardAndBackwardEveryMask) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::f16, DType::bf16})
    for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right}) {
      SCOPED_TRACE(::testing::Message() << strideattn::to_string(t) << " mask " << int(m));
      expect_cudnn_ok(with_sinks(dense(t, 2, 130, 200, 4, 2, 64, 64, m, -1, -1, /*grad=*/false)));
      expect_cudnn_ok(with_sinks(dense(t, 2, 128, 192, 4, 2, 64, 64, m)));    // GQA 2, d_sinks
      expect_cudnn_ok(with_sinks(dense(t, 1, 136, 136, 8, 1, 128, 128, m)));  // MQA
    }
  // A window, more queries than keys (top-left causal), and the bias together with sinks.
  expect_cudnn_ok(with_sinks(dense(DType::bf16, 2, 128, 128, 4, 2, 64, 64, MaskKind::causal_bottom_right, 16, 0)));
  expect_cudnn_ok(with_sinks(dense(DType::f16, 1, 200, 120, 4, 2, 64, 64, MaskKind::causal)));
  expect_cudnn_ok(
      with_sinks(with_bias(dense(DType::bf16, 2, 128, 128, 4, 2, 64, 64, MaskKind::causal), {1, 4, 128, 128})));
}

TEST(CudnnFeatures, SinksCudnnCannotTakeAreRefusedByRule) {
  SKIP_WITHOUT_GPU();
  // One query row: cuDNN's decode path takes no sink.
  expect_cudnn_refuses(with_sinks(dense(DType::bf16, 2, 1, 128, 4, 2, 64, 64, MaskKind::none, -1, -1, false)),
                       "with s_q 1", "sinks");
}

// ------------------------------------------------------------------ the checks catch errors

TEST(CudnnFeatures, PlantedErrorsAreCaught) {
  SKIP_WITHOUT_GPU();
  const CaseSpec base =
      with_sinks(with_bias(dense(DType::bf16, 2, 100, 120, 4, 2, 64, 64, MaskKind::causal), {1, 4, 100, 120}));
  expect_cudnn_ok(base);  // unplanted, the same case passes
  struct P {
    const char* kind;
    const char* tensor;
    double delta;
  };
  const P plants[] = {{"value", "o", 0.5},       {"value", "dq", 1.0},      {"value", "dbias", 1.0},
                      {"unwritten", "dbias", 0}, {"value", "d_sinks", 5.0}, {"unwritten", "d_sinks", 0}};
  for (const P& p : plants) {
    SCOPED_TRACE(::testing::Message() << p.kind << " " << p.tensor);
    CaseSpec c = base;
    c.plant = CaseSpec::Plant{p.kind, p.tensor, 7, p.delta};
    CaseReport report;
    const strideattn::Status st = run_on_cudnn(c, &report);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(report.backends.size(), 1u);
    const auto& r = report.backends[0];
    EXPECT_TRUE(r.status == "mismatch" || !r.written_ok) << r.status << ": " << r.reason;
  }
}

}  // namespace
