// `cudnn` and `cuda` through plans, and `cudnn` with varlen lengths as cu_seqlens arrays in
// device memory, on a GPU (skips without one). Through the harness (fresh random inputs,
// poisoned outputs, guard bands, fp64 reference): plans made without the run's pointers on
// dense, fused, padded and varlen views; cu_seqlens arrays with and without seq_offsets (gaps,
// empty sequences, padding), forward and backward, per call and through plans; masks that need
// the lengths refused by rule (cuda runs them: tests/backends/cuda/cu_seqlens_test.cpp).
// Directly: arrays that break
// the caller's promise (lengths above the bound, negative, past the view, offsets past the
// view) still write nothing outside the views, and the tokens no clamped sequence covers get
// O = 0 and LSE = -inf.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "harness/runner.hpp"
#include "harness/views.hpp"
#include "strideattn/strideattn.hpp"
#include "support/backend_case.hpp"

namespace strideattn {
namespace {

using harness::CaseReport;
using harness::CaseSpec;
using test_support::describe;
using test_support::expect_backend_ok;

constexpr test_support::DenseCaseBuilder dense{.seed_offset = 313};
constexpr test_support::VarlenCaseBuilder varlen{.seed_base = 1717, .head_dim = 64, .head_dim_in_seed = false};

CaseSpec laid_out(CaseSpec s, const char* layout) {
  s.layout_name = layout;
  return s;
}

std::vector<CaseSpec> plan_cases() {
  return {
      laid_out(dense(DType::f16, 2, 128, 128, 16, 1, 64, 64, MaskKind::causal), "sb(h+2hg)d"),
      laid_out(dense(DType::bf16, 2, 96, 160, 8, 2, 128, 128, MaskKind::causal_bottom_right), "bshd_bshd_bshd"),
      laid_out(dense(DType::bf16, 1, 100, 100, 4, 4, 64, 64, MaskKind::none, 16, 4), "sbhd_sbhd_sbhd"),
      varlen(DType::bf16, {20, 33, 7}, {40, 33, 17}, {3, 40, 90}, {0, 50, 100}, MaskKind::causal_bottom_right),
  };
}

TEST(GpuPlans, CudnnAndCudaThroughPlansMadeWithoutPointers) {
  if (!harness::gpu_available()) GTEST_SKIP() << "no GPU present";
  for (CaseSpec s : plan_cases()) {
    s.via_plan = true;
    for (Backend b : {Backend::cudnn, Backend::cuda}) {
      if (!backend_compiled(b)) continue;
      SCOPED_TRACE(harness::reproducer(s, {b}));
      expect_backend_ok(b, s);
    }
  }
}

// cu_seqlens cases cuDNN runs: mask none and top-left causal, packed and with offsets.
std::vector<CaseSpec> cu_seqlens_cases() {
  std::vector<CaseSpec> cs;
  for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
    cs.push_back(varlen(DType::bf16, {37, 64, 5}, {37, 64, 5}, {}, {}, m));
    cs.push_back(varlen(DType::f16, {20, 33, 0, 7}, {40, 33, 12, 17}, {3, 40, 80, 90}, {0, 50, 90, 110}, m));
    cs.push_back(varlen(DType::bf16, {16, 0, 24, 9}, {16, 12, 0, 9}, {}, {}, m));
  }
  CaseSpec fused = varlen(DType::bf16, {32, 17}, {32, 17}, {2, 40}, {2, 40}, MaskKind::none, -1, -1, 64, "t(h+2hg)d");
  fused.sizes.heads = 8, fused.sizes.kv_heads = 1;
  cs.push_back(fused);
  for (CaseSpec& s : cs) s.cu_seqlens = true;
  return cs;
}

TEST(GpuPlans, CudnnReadsCuSeqlensArraysOnTheDevice) {
  if (!harness::gpu_available()) GTEST_SKIP() << "no GPU present";
  if (!backend_compiled(Backend::cudnn)) GTEST_SKIP() << "cudnn not in this build";
  for (CaseSpec s : cu_seqlens_cases()) {
    for (bool plan : {false, true}) {
      s.via_plan = plan;
      SCOPED_TRACE(harness::reproducer(s, {Backend::cudnn}));
      expect_backend_ok(Backend::cudnn, s);
    }
  }
}

TEST(GpuPlans, CuSeqlensRefusalsNameTheirRule) {
  if (!harness::gpu_available()) GTEST_SKIP() << "no GPU present";
  CaseSpec s = varlen(DType::bf16, {20, 33}, {40, 33}, {}, {}, MaskKind::causal_bottom_right);
  s.cu_seqlens = true;
  s.grad = false;
  ASSERT_TRUE(harness::make_layout_views(s.layout_name, s.sizes, &s.views).ok());
  struct Want {
    Backend backend;
    const char* rule;
  };
  for (Want w : {Want{Backend::cudnn, "cu_seqlens_mask"}}) {
    if (!backend_compiled(w.backend)) continue;
    CaseReport report;
    const Status st = harness::run_case(s, {w.backend}, &report);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(report.backends.at(0).status, "unsupported") << describe(report);
    EXPECT_NE(report.backends.at(0).reason.find(std::string(w.rule) + ":"), std::string::npos) << describe(report);
  }
}

// ------------------------------------------------------------------ broken promises

constexpr std::uint8_t kGuardByte = 0x5a;
constexpr std::size_t kGuard = 4096;  // bytes of guard band on each side

// A device allocation with guard bands; `data` is past the front band.
struct DeviceBuffer {
  std::size_t bytes = 0;
  unsigned char* raw = nullptr;
  explicit DeviceBuffer(std::size_t n) : bytes(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&raw), n + 2 * kGuard) != cudaSuccess) raw = nullptr;
  }
  ~DeviceBuffer() { cudaFree(raw); }
  void* data() const { return raw + kGuard; }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> h(bytes + 2 * kGuard);
    cudaMemcpy(h.data(), raw, h.size(), cudaMemcpyDeviceToHost);
    return h;
  }
  void fill(unsigned char inside) const {
    cudaMemset(raw, kGuardByte, bytes + 2 * kGuard);
    cudaMemset(raw + kGuard, inside, bytes);
  }
  bool guards_intact() const {
    const std::vector<unsigned char> h = download();
    for (std::size_t i = 0; i < kGuard; ++i)
      if (h[i] != kGuardByte || h[kGuard + bytes + i] != kGuardByte) return false;
    return true;
  }
};

float bf16_value(const unsigned char* p) {
  std::uint16_t b;
  std::memcpy(&b, p, 2);
  return float_from_bf16(b);
}

TEST(GpuPlans, CuSeqlensThatBreakThePromiseStayInsideTheViews) {
  if (!harness::gpu_available()) GTEST_SKIP() << "no GPU present";
  if (!backend_compiled(Backend::cudnn)) GTEST_SKIP() << "cudnn not in this build";
  const std::int64_t T = 64, H = 2, D = 64, kMax = 16;
  const std::size_t elems = std::size_t(T * H * D);
  DeviceBuffer q(elems * 2), k(elems * 2), v(elems * 2), o(elems * 2), lse(std::size_t(H * T) * 4), arrays(64);
  q.fill(0x3c), k.fill(0x3c), v.fill(0x3c), o.fill(0xff), lse.fill(0xff);  // inputs 1.2 (bf16 0x3c3c); outputs NaN
  // Sequence 0 is 40 tokens (bound 16), sequence 1 is -10, sequence 2 runs 170 tokens past the
  // view; sequence 3 starts past the view. Clamped: q tokens [0, 16) and [30, 46) are cuDNN's.
  const std::int32_t host[] = {0, 40, 30, 200, 200, /* kv */ 0, 16, 32, 48, 64, /* q offsets */ 0, 40, 30, 1000};
  cudaMemset(arrays.raw, kGuardByte, arrays.bytes + 2 * kGuard);
  cudaMemcpy(arrays.data(), host, sizeof host, cudaMemcpyHostToDevice);
  const auto* dev = static_cast<const std::int32_t*>(arrays.data());
  auto view = [&](const DeviceBuffer& b) {
    TensorView t;
    t.data = b.data();
    t.dtype = DType::bf16;
    t.shape = {1, T, H, D};
    t.stride = {T * H * D, H * D, D, 1};
    return t;
  };
  ForwardArgs a;
  a.q = view(q), a.k = view(k), a.v = view(v), a.o = view(o);
  a.lse = {static_cast<float*>(lse.data()), {1, H, T}, {H * T, T, 1}};
  a.varlen.count = 4;
  a.varlen.cu_seqlens_q = dev;
  a.varlen.cu_seqlens_kv = dev + 5;
  a.varlen.seq_offsets_q = dev + 10;
  a.varlen.max_seqlen_q = a.varlen.max_seqlen_kv = kMax;
  a.backend = Backend::cudnn;
  a.memory = Memory::device;
  const Status s = forward(a);
  ASSERT_TRUE(s.ok()) << s.message();  // nothing can be checked on the host
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (const DeviceBuffer* b : {&q, &k, &v, &o, &lse, &arrays}) EXPECT_TRUE(b->guards_intact());
  const std::vector<unsigned char> ho = o.download(), hl = lse.download();
  for (std::int64_t t = 0; t < T; ++t) {
    const bool covered = t < 16 || (t >= 30 && t < 46);
    for (std::int64_t e = 0; e < H * D; ++e) {
      const float x = bf16_value(&ho[kGuard + std::size_t((t * H * D + e) * 2)]);
      if (covered)
        EXPECT_TRUE(std::isfinite(x)) << "token " << t << " element " << e;
      else
        EXPECT_EQ(x, 0.f) << "padding token " << t << " element " << e;
    }
    for (std::int64_t h = 0; h < H; ++h) {
      float l;
      std::memcpy(&l, &hl[kGuard + std::size_t((h * T + t) * 4)], 4);
      if (!covered) EXPECT_TRUE(std::isinf(l) && l < 0) << "LSE of padding token " << t << " head " << h << ": " << l;
    }
  }
  // The inputs were not written.
  for (const DeviceBuffer* b : {&q, &k, &v}) {
    const std::vector<unsigned char> h = b->download();
    for (std::size_t i = 0; i < elems * 2; ++i) ASSERT_EQ(h[kGuard + i], 0x3c) << "input byte " << i;
  }
}

}  // namespace
}  // namespace strideattn
