// `cudnn` at large logits (docs/backends.md, "Numerical envelope"), through the harness against
// the fp64 reference with gradients: inputs scaled so that the logits run from 1 to 1e7 (f16)
// or 1e30 (bf16), large and tiny scales, on dense, GQA, MQA, causal, bottom-right, windowed
// and varlen problems and head dims 64, 96 and 128. Three ways, through the test hook of the
// exact recompute (src/backends/cudnn/nonfinite.hpp):
//   - the default limits: every case passes;
//   - no recompute (cuDNN's own backward): up to typical logits of 1e3 (LSEs of a few
//     thousand, past the 1024 that starts the recompute) every case still passes, and past the envelope the rule
//     catches cuDNN's answer on some case, so the recompute is needed and the test of it can fail;
//   - the recompute on every group: every case passes (the recompute itself, on every shape).
// Skips when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/cudnn/nonfinite.hpp"
#include "harness/runner.hpp"
#include "harness/views.hpp"
#include "support/backend_case.hpp"

namespace {

using strideattn::Backend;
using strideattn::DType;
using strideattn::MaskKind;
using strideattn::detail::cudnn::ExactRecomputeLimits;
using strideattn::detail::cudnn::ScopedExactRecomputeLimits;
using strideattn::harness::CaseReport;
using strideattn::harness::CaseSpec;

#define SKIP_WITHOUT_GPU()                    \
  if (!strideattn::harness::gpu_available())  \
  GTEST_SKIP() << "no CUDA GPU present: the " \
                  "cudnn large-logit tests need one"

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Shape {
  const char* name;
  std::int64_t s_q, s_kv, heads, kv_heads;
  MaskKind mask;
  strideattn::Window window{};
  bool varlen = false;
};
// Every row sees a key (cuDNN refuses problems with rows that see none: empty_rows).
// (One query on one key has no cuDNN backward: single_token_backward.)
const Shape kShapes[] = {{"one query", 1, 5, 2, 1, MaskKind::none},
                         {"bottom-right mqa", 7, 33, 2, 1, MaskKind::causal_bottom_right},
                         {"causal gqa", 150, 150, 4, 2, MaskKind::causal},
                         {"window mqa", 150, 220, 4, 1, MaskKind::none, {24, 8}},
                         {"varlen gqa", 0, 0, 4, 2, MaskKind::none, {12, 3}, true}};

struct Magnitude {
  double input_scale;
  double scale;  // 0: the default 1 / sqrt(d_qk)
};

// Typical scaled logits of x^2 with the default scale, then a large scale on unit inputs, and
// tiny scales on large inputs: small logits beside large values of V and dP (f16 3e3, bf16
// 1e10) and, for bf16, logits of about 1e4 from inputs of 1e6.
std::vector<Magnitude> magnitudes(DType dtype, double max_logits) {
  std::vector<Magnitude> m;
  const std::vector<double> logits = dtype == DType::f16 ? std::vector<double>{1, 1e2, 1e3, 1e5, 1e7}
                                                         : std::vector<double>{1, 1e2, 1e3, 1e5, 1e7, 1e20, 1e30};
  for (double l : logits)
    if (l <= max_logits) m.push_back({std::sqrt(l), 0});
  if (max_logits >= 1e4) {
    m.push_back({1, 1e4});
    m.push_back({dtype == DType::f16 ? 3e3 : 1e6, 1e-8});
    if (dtype == DType::bf16) m.push_back({1e10, 1e-20});
  }
  return m;
}

CaseSpec large_case(DType dtype, const Shape& sh, std::int64_t d, const Magnitude& mag, std::uint64_t seed) {
  CaseSpec spec;
  spec.dtype = dtype;
  auto& z = spec.sizes;
  z.heads = sh.heads, z.kv_heads = sh.kv_heads, z.d_qk = d, z.d_v = d;
  if (sh.varlen) {
    z.batch = 3;
    z.seqlens_q = {40, 9, 60};
    z.seqlens_kv = {50, 17, 60};
    z.s_q = 60, z.s_kv = 60;
    spec.layout_name = "thd_thd_thd";
  } else {
    z.batch = 1, z.s_q = sh.s_q, z.s_kv = sh.s_kv;
    spec.layout_name = "bshd_bshd_bshd";
  }
  spec.options.mask = sh.mask;
  spec.options.window = sh.window;
  if (mag.scale > 0) spec.options.scale = mag.scale;
  spec.grad = true;
  spec.seed = seed;
  spec.input_scale = mag.input_scale;
  return spec;
}

// Runs the matrix up to `max_logits` under the hook's `limits`; returns how many cases the
// rule failed, with each failure described in `failures`.
int run_matrix(ExactRecomputeLimits limits, double max_logits, std::string* failures) {
  const ScopedExactRecomputeLimits hook(limits);
  std::uint64_t seed = 1;
  int failed = 0;
  for (DType dtype : {DType::f16, DType::bf16})
    for (std::int64_t d : {64, 96, 128})
      for (const Magnitude& mag : magnitudes(dtype, max_logits))
        for (const Shape& sh : kShapes) {
          CaseSpec spec = large_case(dtype, sh, d, mag, seed++);
          EXPECT_TRUE(strideattn::harness::make_layout_views(spec.layout_name, spec.sizes, &spec.views).ok());
          CaseReport rep;
          EXPECT_TRUE(strideattn::harness::run_case(spec, {Backend::cudnn}, &rep).ok());
          if (rep.backends.size() != 1) continue;
          const auto& r = rep.backends[0];
          EXPECT_NE(r.status, "unsupported") << sh.name << ": " << r.reason;
          if (r.status == "ok" && r.guard_ok && r.written_ok) continue;
          ++failed;
          *failures += std::string(to_string(dtype)) + " d " + std::to_string(d) + " " + sh.name + " input x" +
                       std::to_string(mag.input_scale) + " scale " + std::to_string(mag.scale) + "\n" +
                       strideattn::test_support::describe(rep) + "  " +
                       strideattn::harness::reproducer(spec, {Backend::cudnn}) + "\n";
        }
  return failed;
}

TEST(CudnnLargeLogits, ExactAtEveryMagnitude) {
  SKIP_WITHOUT_GPU();
  std::string failures;
  EXPECT_EQ(run_matrix(ExactRecomputeLimits{}, 1e30, &failures), 0) << failures;
}

TEST(CudnnLargeLogits, CudnnAloneHoldsInsideTheLimitsAndFailsBeyond) {
  SKIP_WITHOUT_GPU();
  const ExactRecomputeLimits never{kInf, -kInf, kInf};
  std::string inside, beyond;
  EXPECT_EQ(run_matrix(never, 1e3, &inside), 0) << inside;
  EXPECT_GT(run_matrix(never, 1e30, &beyond), 0) << "cuDNN's own backward passed at every magnitude: the exact "
                                                    "recompute is no longer needed (docs/backends.md)";
}

TEST(CudnnLargeLogits, RecomputeOnEveryGroupIsExact) {
  SKIP_WITHOUT_GPU();
  std::string failures;
  EXPECT_EQ(run_matrix(ExactRecomputeLimits{-kInf, -kInf, -kInf}, 1e30, &failures), 0) << failures;
}

}  // namespace
