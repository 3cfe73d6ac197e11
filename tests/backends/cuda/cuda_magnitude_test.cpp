// The `cuda` forward and backward at large logits (docs/semantics.md, "Backward" and
// "Conditioning"), through the harness against the fp64 reference: inputs scaled so the
// logits run from 1 to 1e7 (f16, whose inputs end at 65504) or 1e30 (bf16), with gradients,
// on one-hot rows (the common case past logits of about 1e3), rows that see one key, and
// masked rows (also rows a window hides entirely); head dims 64 and 256 (default scales powers of two) and 128 and 96
// (not), and d_qk != d_v; on every kernel pairing: the plan's own choice, the two-pass backward, and through
// ScopedCudaPlanForcing the sm80 kernels (mma.sync forward, 8-warp and 4-warp dK/dV passes, single and two-pass). Each
// failure names the pairing, so a failure on one pairing alone points at the passes it combines (for example a forward
// and a backward whose MMAs sum a score's products in different orders). Skips when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/test_hook.hpp"
#include "harness/runner.hpp"
#include "harness/views.hpp"
#include "support/backend_case.hpp"

namespace {

using strideattn::Backend;
using strideattn::DType;
using strideattn::MaskKind;
using strideattn::cuda_impl::Arch;
using strideattn::cuda_impl::PlanForcing;
using strideattn::cuda_impl::ScopedCudaPlanForcing;
using strideattn::harness::CaseReport;
using strideattn::harness::CaseSpec;

#define SKIP_WITHOUT_GPU()                    \
  if (!strideattn::harness::gpu_available())  \
  GTEST_SKIP() << "no CUDA GPU present: the " \
                  "cuda magnitude tests need one"

struct Shape {
  std::int64_t s_q, s_kv;
  MaskKind mask;
  std::int64_t heads, kv_heads;
  strideattn::Window window{};
};
// one query on one key; a bottom-right band with rows that see no key; causal GQA over more
// than one key block; a top-left causal mask and a window that together hide every key (the
// backward's masked pairs, whose dP overflows fp32 at these magnitudes, must add nothing)
const Shape kShapes[] = {{1, 1, MaskKind::none, 2, 1},
                         {7, 33, MaskKind::causal_bottom_right, 2, 1},
                         {150, 150, MaskKind::causal, 4, 2},
                         {87, 246, MaskKind::causal, 2, 1, {147, 39}}};

CaseSpec magnitude_case(DType dtype, const Shape& sh, std::int64_t d_qk, std::int64_t d_v, double logits,
                        std::uint64_t seed) {
  CaseSpec spec;
  spec.dtype = dtype;
  spec.sizes.batch = 1, spec.sizes.s_q = sh.s_q, spec.sizes.s_kv = sh.s_kv;
  spec.sizes.heads = sh.heads, spec.sizes.kv_heads = sh.kv_heads, spec.sizes.d_qk = d_qk, spec.sizes.d_v = d_v;
  spec.layout_name = "bshd_bshd_bshd";
  spec.options.mask = sh.mask;
  spec.options.window = sh.window;
  spec.grad = true;
  spec.seed = seed;
  // scores of about `logits` with the default scale: |S| ~ x^2 sqrt(d) / sqrt(d)
  spec.input_scale = std::sqrt(logits);
  return spec;
}

std::vector<double> logits_for(DType dtype) {
  if (dtype == DType::f16) return {1, 1e3, 1e5, 1e7};
  return {1, 1e3, 1e5, 1e7, 1e20, 1e30};
}

struct Pairing {
  const char* name;
  PlanForcing forcing;
};

// Runs every magnitude case under `pairing` and reports each failure with its case.
void expect_every_magnitude_ok(const Pairing& pairing, const std::vector<std::pair<int, int>>& dims) {
  const ScopedCudaPlanForcing forced(pairing.forcing);
  std::uint64_t seed = 1;
  for (DType dtype : {DType::f16, DType::bf16})
    for (auto [d_qk, d_v] : dims)
      for (double logits : logits_for(dtype))
        for (const Shape& sh : kShapes) {
          CaseSpec spec = magnitude_case(dtype, sh, d_qk, d_v, logits, seed++);
          ASSERT_TRUE(strideattn::harness::make_layout_views(spec.layout_name, spec.sizes, &spec.views).ok());
          CaseReport rep;
          ASSERT_TRUE(strideattn::harness::run_case(spec, {Backend::cuda}, &rep).ok());
          const auto& r = rep.backends.at(0);
          EXPECT_EQ(r.status, "ok") << pairing.name << ": " << to_string(dtype) << " d " << d_qk << "/" << d_v
                                    << " logits " << logits << " " << sh.s_q << "x" << sh.s_kv << "\n"
                                    << strideattn::test_support::describe(rep) << "  "
                                    << strideattn::harness::reproducer(spec, {Backend::cuda});
        }
}

const std::vector<std::pair<int, int>> kDims = {{64, 64}, {128, 128}, {256, 256}, {96, 96}, {192, 128}};

TEST(CudaMagnitudes, PlanChoice) {
  SKIP_WITHOUT_GPU();
  expect_every_magnitude_ok({"plan choice", {}}, kDims);
}

TEST(CudaMagnitudes, TwoPassBackward) {
  SKIP_WITHOUT_GPU();
  expect_every_magnitude_ok({"two-pass backward", PlanForcing{.single_pass = false}}, kDims);
}

TEST(CudaMagnitudes, Sm80Kernels) {
  SKIP_WITHOUT_GPU();
  expect_every_magnitude_ok({"sm80 kernels", PlanForcing{.arch = Arch::sm80}}, kDims);
  expect_every_magnitude_ok({"sm80 kernels, two-pass", PlanForcing{.arch = Arch::sm80, .single_pass = false}},
                            {{64, 64}, {128, 128}});
  // the 4-warp dK/dV pass at d <= 128, where a GPU grants less than the 8-warp pass needs
  expect_every_magnitude_ok({"sm80 4-warp dK/dV pass", PlanForcing{.arch = Arch::sm80, .smem_optin = 99 * 1024}},
                            {{128, 128}});
}

}  // namespace
