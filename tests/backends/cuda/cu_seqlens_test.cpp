// The `cuda` backend with varlen lengths as cu_seqlens arrays in device memory, on a GPU
// (skips without one). Through the harness (fresh random inputs, poisoned outputs, guard
// bands, fp64 reference), per call and through plans made without the arrays, forward and
// backward: every mask kind and windows, bottom-right ones included (rows of some sequences
// see no key; cudnn refuses those masks with cu_seqlens), sequences without queries or keys,
// gaps and padding, seq_offsets, GQA on a fused buffer, head dims 64 / 128 / 256, the two-pass
// backward and the sm80 kernels (the test hook). Directly: the same inputs as host lists and
// as arrays with looser bounds give the same bytes; and arrays that break the caller's
// promise (lengths above the bound, negative, past the view; offsets past the view) read and
// write nothing outside the views, and the tokens no clamped sequence covers get 0 in O, dQ,
// dK, dV and -inf in LSE.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/test_hook.hpp"
#include "harness/runner.hpp"
#include "harness/views.hpp"
#include "strideattn/strideattn.hpp"
#include "support/backend_case.hpp"

namespace strideattn {
namespace {

using cuda_impl::Arch;
using cuda_impl::PlanForcing;
using cuda_impl::ScopedCudaPlanForcing;
using harness::CaseSpec;
using test_support::expect_backend_ok;

#define SKIP_WITHOUT_GPU() \
  if (!harness::gpu_available()) GTEST_SKIP() << "no CUDA GPU present: the cuda cu_seqlens tests need one"

constexpr test_support::VarlenCaseBuilder varlen{.seed_base = 9191, .head_dim = 64, .head_dim_in_seed = true};

struct MaskCase {
  MaskKind mask;
  std::int64_t left, right;
};
const MaskCase kMasks[] = {
    {MaskKind::none, -1, -1}, {MaskKind::causal, -1, -1}, {MaskKind::causal_bottom_right, -1, -1},
    {MaskKind::none, 16, 0},  {MaskKind::none, 0, 8},     {MaskKind::causal_bottom_right, 5, 3},
    {MaskKind::causal, 4, -1}};

// Sequences of every kind: equal lengths; gaps, an empty one and s_q != s_kv both ways with
// seq_offsets; no queries / no keys; more queries than keys (bottom-right rows with no key).
std::vector<CaseSpec> shapes(const MaskCase& m, std::int64_t d) {
  std::vector<CaseSpec> cs;
  cs.push_back(varlen(DType::bf16, {37, 64, 5}, {37, 64, 5}, {}, {}, m.mask, m.left, m.right, d));
  cs.push_back(varlen(DType::f16, {20, 33, 0, 7}, {40, 33, 12, 17}, {3, 40, 80, 90}, {0, 50, 90, 110}, m.mask, m.left,
                      m.right, d));
  cs.push_back(varlen(DType::bf16, {16, 0, 24, 9}, {16, 12, 0, 9}, {}, {}, m.mask, m.left, m.right, d));
  cs.push_back(varlen(DType::f16, {50, 130}, {12, 70}, {}, {}, m.mask, m.left, m.right, d));
  for (CaseSpec& s : cs) s.cu_seqlens = true;
  return cs;
}

void expect_all_ok(const std::vector<CaseSpec>& cases) {
  for (CaseSpec s : cases)
    for (bool plan : {false, true}) {
      s.via_plan = plan;
      SCOPED_TRACE(harness::reproducer(s, {Backend::cuda}));
      expect_backend_ok(Backend::cuda, s);
    }
}

TEST(CudaCuSeqlens, EveryMaskAndWindowPerCallAndThroughPlans) {
  SKIP_WITHOUT_GPU();
  for (const MaskCase& m : kMasks) {
    SCOPED_TRACE(::testing::Message() << "mask " << to_string(m.mask) << " window " << m.left << "," << m.right);
    expect_all_ok(shapes(m, 64));
  }
}

TEST(CudaCuSeqlens, HeadDimsFusedGqaAndKernelPaths) {
  SKIP_WITHOUT_GPU();
  std::vector<CaseSpec> cs;
  for (std::int64_t d : {128, 256})
    for (const MaskCase& m : {kMasks[1], kMasks[5]})
      for (const CaseSpec& s : shapes(m, d)) cs.push_back(s);
  CaseSpec fused = varlen(DType::bf16, {32, 17, 60}, {32, 17, 60}, {2, 40, 70}, {2, 40, 70},
                          MaskKind::causal_bottom_right, -1, -1, 64, "t(h+2hg)d");
  fused.sizes.heads = 8, fused.sizes.kv_heads = 1;
  fused.cu_seqlens = true;
  cs.push_back(fused);
  expect_all_ok(cs);
  // the deterministic two-pass backward, and the sm80 kernels (mma.sync everywhere)
  std::vector<CaseSpec> few = shapes(kMasks[5], 64);
  few.push_back(fused);
  for (const PlanForcing& f : {PlanForcing{.single_pass = false}, PlanForcing{.arch = Arch::sm80},
                               PlanForcing{.arch = Arch::sm80, .group_splits = 2}}) {
    const ScopedCudaPlanForcing forced(f);
    expect_all_ok(few);
  }
}

// ------------------------------------------------------------------ direct calls

constexpr std::uint8_t kGuardByte = 0x5a;
constexpr std::size_t kGuard = 4096;  // bytes of guard band on each side

// A device allocation with guard bands; data() is past the front band.
struct DeviceBuffer {
  std::size_t bytes = 0;
  unsigned char* raw = nullptr;
  explicit DeviceBuffer(std::size_t n) : bytes(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&raw), n + 2 * kGuard), cudaSuccess);
    fill(0);
  }
  ~DeviceBuffer() { cudaFree(raw); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  [[nodiscard]] void* data() const { return raw + kGuard; }
  [[nodiscard]] std::vector<unsigned char> download() const {
    std::vector<unsigned char> h(bytes + 2 * kGuard);
    EXPECT_EQ(cudaMemcpy(h.data(), raw, h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  [[nodiscard]] std::vector<unsigned char> inside() const {
    const std::vector<unsigned char> h = download();
    return {h.begin() + kGuard, h.begin() + std::ptrdiff_t(kGuard + bytes)};
  }
  void fill(unsigned char byte) const {
    EXPECT_EQ(cudaMemset(raw, kGuardByte, bytes + 2 * kGuard), cudaSuccess);
    EXPECT_EQ(cudaMemset(raw + kGuard, byte, bytes), cudaSuccess);
  }
  void upload(const void* host, std::size_t n) const {
    EXPECT_EQ(cudaMemcpy(data(), host, n, cudaMemcpyHostToDevice), cudaSuccess);
  }
  [[nodiscard]] bool guards_intact() const {
    const std::vector<unsigned char> h = download();
    for (std::size_t i = 0; i < kGuard; ++i)
      if (h[i] != kGuardByte || h[kGuard + bytes + i] != kGuardByte) return false;
    return true;
  }
};

float bf16_at(const std::vector<unsigned char>& h, std::size_t element) {
  std::uint16_t b;
  std::memcpy(&b, &h[element * 2], 2);
  return float_from_bf16(b);
}

// Buffers of one [1, T, H, D] bf16 problem (MHA) with every tensor packed.
struct Tensors {
  std::int64_t T, H, D;
  std::size_t elems;
  DeviceBuffer q, k, v, o, lse, d_o, dq, dk, dv;
  Tensors(std::int64_t t, std::int64_t h, std::int64_t d)
      : T(t),
        H(h),
        D(d),
        elems(std::size_t(t * h * d)),
        q(elems * 2),
        k(elems * 2),
        v(elems * 2),
        o(elems * 2),
        lse(std::size_t(h * t) * 4),
        d_o(elems * 2),
        dq(elems * 2),
        dk(elems * 2),
        dv(elems * 2) {}
  [[nodiscard]] TensorView view(const DeviceBuffer& b) const {
    TensorView t;
    t.data = b.data();
    t.dtype = DType::bf16;
    t.shape = {1, T, H, D};
    t.stride = {T * H * D, H * D, D, 1};
    return t;
  }
  [[nodiscard]] LseView lse_view() const { return {static_cast<float*>(lse.data()), {1, H, T}, {H * T, T, 1}}; }
  [[nodiscard]] ForwardArgs forward_args(const AttentionOptions& o_) const {
    ForwardArgs a;
    a.q = view(q), a.k = view(k), a.v = view(v), a.o = view(o), a.lse = lse_view();
    a.options = o_;
    a.backend = Backend::cuda;
    a.memory = Memory::device;
    return a;
  }
  [[nodiscard]] BackwardArgs backward_args(const AttentionOptions& o_) const {
    BackwardArgs a;
    a.q = view(q), a.k = view(k), a.v = view(v), a.o = view(o), a.d_o = view(d_o), a.lse = lse_view();
    a.dq = view(dq), a.dk = view(dk), a.dv = view(dv);
    a.options = o_;
    a.backend = Backend::cuda;
    a.memory = Memory::device;
    return a;
  }
};

void upload_random(const DeviceBuffer& b, std::size_t elems, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<std::uint16_t> h(elems);
  for (auto& x : h) x = bf16_from_float(n(rng));
  b.upload(h.data(), elems * 2);
}

// Host lists and cu_seqlens arrays of the same sequences (with bounds above the longest ones)
// run the same kernels on the same tables: the outputs are the same bytes. Deterministic
// backward, no group split (MHA), so every sum runs in the same order.
TEST(CudaCuSeqlens, ArraysGiveTheBytesOfTheSameHostLists) {
  SKIP_WITHOUT_GPU();
  const std::int64_t T = 300, H = 2, D = 64;
  Tensors t(T, H, D);
  upload_random(t.q, t.elems, 1), upload_random(t.k, t.elems, 2), upload_random(t.v, t.elems, 3);
  upload_random(t.d_o, t.elems, 4);
  const std::vector<std::int64_t> lq = {40, 0, 100, 7}, lkv = {70, 20, 30, 0};
  const std::vector<std::int64_t> oq = {5, 60, 60, 200}, okv = {0, 80, 110, 140};
  // cu_seqlens_q, cu_seqlens_kv, seq_offsets_q, seq_offsets_kv
  std::vector<std::int32_t> arrays = {0, 40, 40, 140, 147, 0, 70, 90, 120, 120};
  arrays.insert(arrays.end(), oq.begin(), oq.end());
  arrays.insert(arrays.end(), okv.begin(), okv.end());
  DeviceBuffer dev(arrays.size() * 4);
  dev.upload(arrays.data(), arrays.size() * 4);
  const auto* a = static_cast<const std::int32_t*>(dev.data());
  for (const MaskCase& m : kMasks) {
    SCOPED_TRACE(::testing::Message() << "mask " << to_string(m.mask) << " window " << m.left << "," << m.right);
    AttentionOptions opt;
    opt.mask = m.mask, opt.window = {m.left, m.right}, opt.deterministic = true;
    std::vector<unsigned char> outs[2][5];
    for (int form = 0; form < 2; ++form) {
      for (const DeviceBuffer* b : {&t.o, &t.lse, &t.dq, &t.dk, &t.dv}) b->fill(0xff);
      ForwardArgs f = t.forward_args(opt);
      BackwardArgs g = t.backward_args(opt);
      for (Varlen* vl : {&f.varlen, &g.varlen}) {
        if (form == 0) {
          vl->seqlens_q = lq, vl->seqlens_kv = lkv, vl->offsets_q = oq, vl->offsets_kv = okv;
        } else {
          vl->count = 4, vl->cu_seqlens_q = a, vl->cu_seqlens_kv = a + 5, vl->seq_offsets_q = a + 10;
          vl->seq_offsets_kv = a + 14, vl->max_seqlen_q = 150, vl->max_seqlen_kv = 90;
        }
      }
      const Status sf = forward(f);
      ASSERT_TRUE(sf.ok()) << sf.message();
      const Status sb = backward(g);
      ASSERT_TRUE(sb.ok()) << sb.message();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      int i = 0;
      for (const DeviceBuffer* b : {&t.o, &t.lse, &t.dq, &t.dk, &t.dv}) {
        EXPECT_TRUE(b->guards_intact());
        outs[form][i++] = b->inside();
      }
    }
    const char* names[] = {"o", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; ++i) EXPECT_TRUE(outs[0][i] == outs[1][i]) << names[i] << " differs";
    // and padding was written: q token 0 (before every sequence) and kv token 299 (after)
    EXPECT_EQ(bf16_at(outs[1][0], 0), 0.f);
    EXPECT_EQ(bf16_at(outs[1][3], std::size_t((T - 1) * H * D)), 0.f);
  }
}

// Arrays that break the promise: sequence 0 is 40 tokens (bound 16), sequence 1 is -10,
// sequence 2 runs 170 tokens past the view, sequence 3 starts past it. Clamped, q tokens
// [0, 16) and [30, 46) belong to sequences 0 and 2, and the four kv sequences of 16 cover
// every kv token. Forward and backward, with and without a bottom-right band.
TEST(CudaCuSeqlens, ArraysThatBreakThePromiseStayInsideTheViews) {
  SKIP_WITHOUT_GPU();
  const std::int64_t T = 64, H = 2, D = 64, kMax = 16;
  Tensors t(T, H, D);
  const std::int32_t host[] = {0, 40, 30, 200, 200, /* kv */ 0, 16, 32, 48, 64, /* q offsets */ 0, 40, 30, 1000};
  DeviceBuffer arrays(sizeof host);
  arrays.upload(host, sizeof host);
  const auto* dev = static_cast<const std::int32_t*>(arrays.data());
  for (const MaskCase& m : {kMasks[0], kMasks[5]}) {
    SCOPED_TRACE(::testing::Message() << "mask " << to_string(m.mask));
    for (const DeviceBuffer* b : {&t.q, &t.k, &t.v, &t.d_o}) b->fill(0x3c);           // bf16 0x3c3c = 0.0115
    for (const DeviceBuffer* b : {&t.o, &t.lse, &t.dq, &t.dk, &t.dv}) b->fill(0xff);  // NaN
    AttentionOptions opt;
    opt.mask = m.mask, opt.window = {m.left, m.right};
    ForwardArgs f = t.forward_args(opt);
    BackwardArgs g = t.backward_args(opt);
    for (Varlen* vl : {&f.varlen, &g.varlen}) {
      vl->count = 4, vl->cu_seqlens_q = dev, vl->cu_seqlens_kv = dev + 5, vl->seq_offsets_q = dev + 10;
      vl->max_seqlen_q = vl->max_seqlen_kv = kMax;
    }
    const Status sf = forward(f);
    ASSERT_TRUE(sf.ok()) << sf.message();  // nothing can be checked on the host
    const Status sb = backward(g);
    ASSERT_TRUE(sb.ok()) << sb.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (const DeviceBuffer* b : {&t.q, &t.k, &t.v, &t.o, &t.lse, &t.d_o, &t.dq, &t.dk, &t.dv, &arrays})
      EXPECT_TRUE(b->guards_intact());
    const std::vector<unsigned char> ho = t.o.inside(), hl = t.lse.inside(), hq = t.dq.inside();
    const std::vector<unsigned char> hk = t.dk.inside(), hv = t.dv.inside();
    for (std::int64_t tok = 0; tok < T; ++tok) {
      const bool covered = tok < 16 || (tok >= 30 && tok < 46);
      for (std::int64_t e = 0; e < H * D; ++e) {
        const auto at = std::size_t(tok * H * D + e);
        for (const auto* h : {&ho, &hq}) {
          const float x = bf16_at(*h, at);
          if (covered)
            EXPECT_TRUE(std::isfinite(x)) << (h == &ho ? "o" : "dq") << " token " << tok << " element " << e;
          else
            EXPECT_EQ(x, 0.f) << (h == &ho ? "o" : "dq") << " padding token " << tok << " element " << e;
        }
        EXPECT_TRUE(std::isfinite(bf16_at(hk, at)) && std::isfinite(bf16_at(hv, at))) << "kv token " << tok;
      }
      for (std::int64_t h = 0; h < H; ++h) {
        float l;
        std::memcpy(&l, &hl[std::size_t((h * T + tok) * 4)], 4);
        if (!covered)
          EXPECT_TRUE(std::isinf(l) && l < 0) << "LSE of padding token " << tok << " head " << h << ": " << l;
      }
    }
    for (const DeviceBuffer* b : {&t.q, &t.k, &t.v, &t.d_o}) {
      const std::vector<unsigned char> h = b->inside();
      for (std::size_t i = 0; i < h.size(); ++i) ASSERT_EQ(h[i], 0x3c) << "input byte " << i;
    }
  }
}

}  // namespace
}  // namespace strideattn
