// The `cuda` backend against the fp64 reference under the correctness rule, through the
// harness runner (device buffers, fresh random inputs, poisoned outputs, guard bands,
// written checks), forward and backward: every mask, windows, s_q != s_kv both ways, s = 1,
// sizes off the tiles, GQA/MQA, d_qk != d_v (192/128), head dims 8..256, f16 and bf16,
// the seed case, every layout name, odd views (transposed, padded rows, odd offsets and a
// head stride of 65 -> element-wise load path), varlen with empty sequences and gaps, a
// seeded sweep, bitwise determinism of the backward, every dK/dV kernel (sm_90a wgmma, the
// default on H100/H200; the sm80 kernels, elsewhere and forced on any GPU by the plan's test
// hook: at d <= 64 / 128 8-warp, 4-warp at d <= 128 where shared memory is short and at
// d <= 256), their single-pass and two-pass backward on the same inputs, which kernels run on
// sm_90a, and reversed views (negative strides). Skips when no GPU is present.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/test_hook.hpp"
#include "common/log.hpp"
#include "harness/runner.hpp"
#include "harness/views.hpp"
#include "support/backend_case.hpp"
#include "support/debug_log.hpp"

namespace {

using strideattn::Backend;
using strideattn::DType;
using strideattn::MaskKind;
using strideattn::cuda_impl::Arch;
using strideattn::cuda_impl::PlanForcing;
using strideattn::cuda_impl::ScopedCudaPlanForcing;
using strideattn::harness::CaseSpec;
using strideattn::harness::ViewSpec;

#define SKIP_WITHOUT_GPU()                    \
  if (!strideattn::harness::gpu_available())  \
  GTEST_SKIP() << "no CUDA GPU present: the " \
                  "cuda backend tests need one"

// The cuda backend runs `spec` and passes (see test_support::expect_backend_ok).
void expect_cuda_ok(const CaseSpec& spec) { strideattn::test_support::expect_backend_ok(Backend::cuda, spec); }

constexpr strideattn::test_support::DenseCaseBuilder dense{.seed_offset = 17};
constexpr strideattn::test_support::VarlenCaseBuilder varlen{
    .seed_base = 4242, .head_dim = 64, .head_dim_in_seed = true};
using strideattn::test_support::with_views;

const MaskKind kMasks[] = {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right};

TEST(CudaBackend, EveryMaskBothSequenceOrders) {
  SKIP_WITHOUT_GPU();
  const std::int64_t shapes[][2] = {{77, 77}, {50, 200}, {200, 50}, {128, 128}, {300, 257}};
  for (MaskKind m : kMasks)
    for (const auto& sh : shapes) {
      SCOPED_TRACE(::testing::Message() << "mask " << int(m) << " sq " << sh[0] << " skv " << sh[1]);
      expect_cuda_ok(dense(DType::bf16, 2, sh[0], sh[1], 2, 1, 64, 64, m));
    }
}

TEST(CudaBackend, SlidingWindows) {
  SKIP_WITHOUT_GPU();
  const std::int64_t windows[][2] = {{16, 0}, {0, 16}, {5, 40}, {40, 5}, {-1, 8}, {8, -1}, {0, 0}, {100, 100}};
  for (MaskKind m : kMasks)
    for (const auto& w : windows) {
      SCOPED_TRACE(::testing::Message() << "mask " << int(m) << " window " << w[0] << "," << w[1]);
      expect_cuda_ok(dense(DType::f16, 1, 190, 250, 2, 2, 64, 64, m, w[0], w[1]));
    }
  // Rows with no key at all (O = 0, LSE = -inf, dQ = 0) and keys no query sees (dK = dV = 0).
  expect_cuda_ok(dense(DType::bf16, 1, 250, 40, 2, 1, 64, 64, MaskKind::none, 3, 3));
  expect_cuda_ok(dense(DType::bf16, 1, 40, 250, 2, 1, 128, 128, MaskKind::causal, 2, 0));
}

TEST(CudaBackend, SingleTokenSequences) {
  SKIP_WITHOUT_GPU();
  expect_cuda_ok(dense(DType::bf16, 2, 1, 1, 2, 1, 64, 64, MaskKind::none));
  expect_cuda_ok(dense(DType::bf16, 2, 1, 300, 4, 2, 128, 128, MaskKind::causal_bottom_right));
  expect_cuda_ok(dense(DType::bf16, 2, 1, 300, 4, 2, 64, 64, MaskKind::causal));
  expect_cuda_ok(dense(DType::f16, 1, 300, 1, 2, 1, 64, 64, MaskKind::none));
  expect_cuda_ok(dense(DType::f16, 1, 300, 1, 2, 1, 256, 256, MaskKind::causal_bottom_right));
  expect_cuda_ok(dense(DType::f16, 1, 129, 128, 1, 1, 8, 8, MaskKind::causal));
}

TEST(CudaBackend, GroupedAndMultiQuery) {
  SKIP_WITHOUT_GPU();
  expect_cuda_ok(dense(DType::bf16, 2, 150, 150, 8, 2, 64, 64, MaskKind::causal));  // GQA 4
  expect_cuda_ok(dense(DType::bf16, 1, 100, 180, 6, 1, 128, 128, MaskKind::none));  // MQA
  expect_cuda_ok(dense(DType::f16, 1, 180, 100, 6, 3, 40, 24, MaskKind::causal_bottom_right));
}

// The dK/dV pass splits a query-head group over CTAs only when the grid would be small, so a
// GPU test's problems are almost all split. The test hook forces the count (group_splits):
// unsplit (1), even and uneven splits (MQA 6/1 with 4 asked gives 3 splits of 2 heads), on
// split views of one fused sb(h+2hg)d buffer, against the fp64 reference.
TEST(CudaBackend, GroupSplitsOfTheDkDvPass) {
  SKIP_WITHOUT_GPU();
  const CaseSpec gqa = dense(DType::bf16, 2, 150, 150, 8, 2, 64, 64, MaskKind::causal, -1, -1, true, "sb(h+2hg)d");
  const CaseSpec mqa = dense(DType::f16, 1, 130, 130, 6, 1, 128, 128, MaskKind::none, -1, -1, true, "sb(h+2hg)d");
  for (int splits : {1, 2, 4, 6}) {
    SCOPED_TRACE(::testing::Message() << "group splits " << splits);
    const ScopedCudaPlanForcing forced(PlanForcing{.group_splits = splits});
    expect_cuda_ok(gqa);
    expect_cuda_ok(mqa);
  }
}

// Rows that see more than kFoldKeys keys fold their fp32 accumulator into a global slot
// (outer_accumulator.cuh): random inputs over 20,000 keys in every head-dim bucket and dtype,
// GQA, masks whose rows see from a few keys to all of them, a window that keeps every row
// short, varlen with one long and one short sequence, and split views of a fused buffer,
// against the fp64 reference.
TEST(CudaBackend, LongKeyRangesFoldTheirAccumulator) {
  SKIP_WITHOUT_GPU();
  for (std::int64_t d : {64, 128, 256}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    expect_cuda_ok(dense(DType::bf16, 1, 70, 20000, 4, 2, d, d, MaskKind::causal_bottom_right, -1, -1, false));
    expect_cuda_ok(dense(DType::f16, 1, 40, 17000, 2, 1, d, d, MaskKind::none, -1, -1, false));
  }
  expect_cuda_ok(dense(DType::bf16, 1, 40, 20000, 2, 1, 128, 128, MaskKind::none, 9000, 0, false));
  expect_cuda_ok(varlen(DType::bf16, {30, 50}, {12000, 300}, {}, {}, MaskKind::causal_bottom_right));
  // split views of one fused sb(h+2hg)d buffer (the seed layout); causal rows past 8192 fold
  expect_cuda_ok(dense(DType::f16, 1, 9000, 9000, 2, 1, 64, 64, MaskKind::causal, -1, -1, false, "sb(h+2hg)d"));
}

TEST(CudaBackend, DifferentQkAndVHeadDims) {
  SKIP_WITHOUT_GPU();
  expect_cuda_ok(dense(DType::bf16, 1, 150, 150, 2, 1, 192, 128, MaskKind::causal));
  expect_cuda_ok(dense(DType::bf16, 1, 150, 90, 2, 1, 192, 128, MaskKind::none));
  expect_cuda_ok(dense(DType::f16, 1, 40, 190, 2, 2, 128, 192, MaskKind::none));
  expect_cuda_ok(dense(DType::f16, 1, 70, 70, 1, 1, 8, 72, MaskKind::causal_bottom_right));
}

TEST(CudaBackend, HeadDims8To256) {
  SKIP_WITHOUT_GPU();
  for (std::int64_t d : {8, 16, 40, 64, 72, 96, 128, 136, 160, 192, 200, 256}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    expect_cuda_ok(dense(DType::bf16, 1, 140, 170, 2, 1, d, d, MaskKind::causal_bottom_right));
    expect_cuda_ok(dense(DType::f16, 1, 170, 140, 2, 2, d, d, MaskKind::none));
  }
}

TEST(CudaBackend, ScaleOption) {
  SKIP_WITHOUT_GPU();
  CaseSpec s = dense(DType::bf16, 1, 100, 100, 2, 1, 64, 64, MaskKind::causal);
  s.options.scale = 0.37;
  expect_cuda_ok(s);
  s.options.scale = 3.0;  // large logits: the online max must keep exp2 in range
  expect_cuda_ok(s);
  s.options.scale = 1e-3;
  expect_cuda_ok(s);
}

// The forward raises a row's softmax reference max only when a key block's max exceeds it
// by more than 2^8 (kRescaleSlack); below that P may reach 256 unrescaled. Many key blocks
// (1000 keys: ~31 blocks of 32 at d 128, 16 of 64 at d 64) and scales that put the jumps
// of the running max under the slack (0.3), across it (1.5) and far over it (8: raised
// with alpha ~ 0), in f16 and bf16, with s_q != s_kv, and once through transposed
// (sbhd-in-memory) views.
TEST(CudaBackend, LazyRescaleAcrossManyKeyBlocks) {
  SKIP_WITHOUT_GPU();
  for (double scale : {0.3, 1.5, 8.0}) {
    for (std::int64_t d : {64, 128}) {
      SCOPED_TRACE(::testing::Message() << "scale " << scale << " d " << d);
      CaseSpec c = dense(d == 64 ? DType::f16 : DType::bf16, 1, 70, 1000, 2, 1, d, d, MaskKind::none);
      c.options.scale = scale;
      expect_cuda_ok(c);
    }
  }
  CaseSpec c = dense(DType::bf16, 2, 90, 700, 4, 2, 128, 128, MaskKind::causal_bottom_right);
  c.options.scale = 2.0;
  expect_cuda_ok(with_views(c, [&](const char* n, std::int64_t hh) {
    const std::string name(n);  // q, o, do, dq: query side; k, v, dk, dv: key side
    const std::int64_t s = name == "q" || name == "o" || name == "do" || name == "dq" ? 90 : 700;
    return ViewSpec{n, 0, {2, s, hh, 128}, {hh * 128, 2 * hh * 128, 128, 1}};  // [s, b, h, d] memory
  }));
}

// ------------------------------------------------------------------ layouts and views

TEST(CudaBackend, SeedCaseFusedSplit) {
  SKIP_WITHOUT_GPU();
  expect_cuda_ok(dense(DType::f16, 2, 256, 256, 16, 1, 64, 64, MaskKind::causal, -1, -1, true, "sb(h+2hg)d"));
  expect_cuda_ok(dense(DType::f16, 2, 256, 256, 16, 1, 64, 64, MaskKind::none, -1, -1, true, "sb(h+2hg)d"));
}

TEST(CudaBackend, EveryNamedLayout) {
  SKIP_WITHOUT_GPU();
  for (const std::string& l : strideattn::harness::layout_names()) {
    SCOPED_TRACE(l);
    const bool packed_qkv = l.find('3') != std::string::npos;
    const bool fused = l.find("(h") != std::string::npos;
    const bool thd = l[0] == 't';
    const std::int64_t hg = packed_qkv ? 4 : 2;
    CaseSpec s = dense(DType::bf16, 2, 90, packed_qkv || fused ? 90 : 130, 4, hg, 64, 64, MaskKind::causal, -1, -1,
                       true, l.c_str());
    if (thd) {
      s.sizes.batch = 3;
      s.sizes.seqlens_q = {40, 0, 75};
      s.sizes.seqlens_kv = packed_qkv || fused ? s.sizes.seqlens_q : std::vector<std::int64_t>{50, 9, 70};
    }
    expect_cuda_ok(s);
  }
}

// The odd views of docs/design.md "Why": transposed sbhd memory passed as bshd,
// bhsd.transpose(1,2), x[..., :d] of rows padded to d + 64 at an odd offset (element-wise
// path), head stride 65.
TEST(CudaBackend, TransposedPaddedAndUnalignedViews) {
  SKIP_WITHOUT_GPU();
  const std::int64_t b = 2, s = 150, h = 4, hg = 2, d = 64;
  const CaseSpec base = dense(DType::bf16, b, s, s, h, hg, d, d, MaskKind::causal);
  expect_cuda_ok(with_views(base, [&](const char* n, std::int64_t hh) {
    return ViewSpec{n, 0, {b, s, hh, d}, {hh * d, b * hh * d, d, 1}};
  }));
  expect_cuda_ok(with_views(base, [&](const char* n, std::int64_t hh) {
    return ViewSpec{n, 0, {b, s, hh, d}, {hh * s * d, d, s * d, 1}};
  }));
  const std::int64_t dp = d + 64;
  expect_cuda_ok(with_views(base, [&](const char* n, std::int64_t hh) {
    return ViewSpec{n, 5, {b, s, hh, d}, {s * hh * dp, hh * dp, dp, 1}};
  }));
  // head stride 65: rows start at odd elements -> element-wise loads and 2-byte stores
  expect_cuda_ok(with_views(base, [&](const char* n, std::int64_t hh) {
    return ViewSpec{n, 0, {b, s, hh, d}, {s * hh * 65, hh * 65, 65, 1}};
  }));
  // d = 128 bucket and d = 256 bucket on the slow path too
  for (std::int64_t dd : {128, 200}) {
    const CaseSpec c = dense(DType::f16, 1, 130, 130, 2, 1, dd, dd, MaskKind::none);
    expect_cuda_ok(with_views(c, [&](const char* n, std::int64_t hh) {
      return ViewSpec{n, 3, {1, 130, hh, dd}, {130 * hh * (dd + 1), hh * (dd + 1), dd + 1, 1}};
    }));
  }
}

// Reversed views (negative strides, numpy's x[:, ::-1]) on batch, seq and heads, one at a
// time and together, for every tensor (inputs, outputs, gradients): aligned (vector loads,
// paired stores walking backwards) and with odd strides (element-wise path). A reversed
// head dim (stride -1) is refused by the head_dim_stride rule and not run here.
TEST(CudaBackend, ReversedViews) {
  SKIP_WITHOUT_GPU();
  const std::int64_t b = 2, s = 150, h = 4, hg = 2, d = 64;
  const CaseSpec base = dense(DType::bf16, b, s, s, h, hg, d, d, MaskKind::causal);
  for (std::int64_t row : {d, d + 1}) {  // head stride: aligned, then odd
    for (int flips : {1, 2, 4, 7}) {     // bit 0 batch, bit 1 seq, bit 2 heads
      SCOPED_TRACE(::testing::Message() << "head stride " << row << " reversed dims " << flips);
      expect_cuda_ok(with_views(base, [&](const char* n, std::int64_t hh) {
        ViewSpec v{n, 0, {b, s, hh, d}, {s * hh * row, hh * row, row, 1}};
        for (int i = 0; i < 3; ++i) {
          if (!(flips & (1 << i))) continue;
          v.offset += (v.shape[i] - 1) * v.stride[i];
          v.stride[i] = -v.stride[i];
        }
        return v;
      }));
    }
  }
}

// ------------------------------------------------------------------ varlen

TEST(CudaBackend, VarlenEmptySequencesAndGaps) {
  SKIP_WITHOUT_GPU();
  for (MaskKind m : kMasks) {
    SCOPED_TRACE(::testing::Message() << "mask " << int(m));
    expect_cuda_ok(varlen(DType::bf16, {0, 37, 170, 1, 0, 65}, {5, 37, 100, 0, 3, 164}, {0, 3, 45, 220, 221, 225},
                          {0, 9, 50, 152, 153, 160}, m));
  }
  expect_cuda_ok(varlen(DType::f16, {20, 0, 190}, {20, 7, 160}, {}, {}, MaskKind::none, 8, 4, 128));
  expect_cuda_ok(varlen(DType::bf16, {33, 129, 2}, {33, 129, 2}, {}, {}, MaskKind::causal, -1, -1, 256, "t(h+2hg)d"));
}

// ------------------------------------------------------------------ seeded sweep

TEST(CudaBackend, SeededSweep) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(20240612);
  const strideattn::test_support::SweepRanges ranges{
      .max_seq = 320, .max_varlen_seq = 300, .max_window = 150, .dtypes = {DType::f16, DType::bf16}, .seed_base = 7000};
  for (int c = 0; c < 60; ++c) {
    SCOPED_TRACE(::testing::Message() << "sweep case " << c);
    expect_cuda_ok(strideattn::test_support::sweep_case(c, rng, ranges, dense, varlen));
  }
}

// ------------------------------------------------------------------ determinism

// The plan's test hook: a GPU that grants less shared memory per block than the sm80 8-warp
// dK/dV pass needs at d <= 128 (164,864 bytes; sm_86 and sm_89 grant 101,376, and get the
// 4-warp pass there), but enough for every other sm80 kernel of these tests (the 4-warp and
// dQ passes at d <= 256, 131,584 and 131,072 bytes), so that the 4-warp pass runs at d <= 128
// on the same cases as the others.
constexpr int kSmemBelowEightWarpPass = 160 * 1024;
namespace tiles = strideattn::cuda_impl;
static_assert(tiles::kv8_tile(Arch::sm80, 128).smem_bytes > kSmemBelowEightWarpPass &&
                  tiles::kv_tile(Arch::sm80, 256).smem_bytes <= kSmemBelowEightWarpPass &&
                  tiles::q_tile(Arch::sm80, 256).smem_bytes <= kSmemBelowEightWarpPass,
              "the limit must leave out the 8-warp pass at d <= 128 alone");

// Fixed bf16 inputs on the device (b 2, s 333, h 8, hg 2, head dim d, 128 unless given:
// the d <= 128 bucket; causal, GQA, s a multiple of neither 64 nor 128), O and LSE from one
// forward; backward() runs one deterministic backward and returns its dQ, dK and dV bytes.
class FixedBackwardCase {
 public:
  static constexpr std::int64_t b = 2, s = 333, h = 8, hg = 2;
  const std::int64_t d;

  explicit FixedBackwardCase(std::int64_t head_dim = 128) : d(head_dim) {
    q_ = device_tensor(h, true), k_ = device_tensor(hg, true), v_ = device_tensor(hg, true);
    d_o_ = device_tensor(h, true), o_ = device_tensor(h, false);
    EXPECT_EQ(cudaMalloc(&lse_, b * h * s * 4), cudaSuccess);
    fa_.q = view(q_, h), fa_.k = view(k_, hg), fa_.v = view(v_, hg), fa_.o = view(o_, h);
    fa_.lse = {lse_, {b, h, s}, {h * s, s, 1}};
    fa_.options.mask = MaskKind::causal;
    fa_.backend = Backend::cuda;
    fa_.memory = strideattn::Memory::device;
    const strideattn::Status fs = strideattn::forward(fa_);
    EXPECT_TRUE(fs.ok()) << fs.message();
  }
  // Reruns the forward (O and LSE again, same values).
  void forward() {
    const strideattn::Status fs = strideattn::forward(fa_);
    EXPECT_TRUE(fs.ok()) << fs.message();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~FixedBackwardCase() {
    for (void* p : {q_, k_, v_, d_o_, o_, static_cast<void*>(lse_)}) cudaFree(p);
  }
  FixedBackwardCase(const FixedBackwardCase&) = delete;
  FixedBackwardCase& operator=(const FixedBackwardCase&) = delete;

  std::vector<std::uint16_t> backward() {
    void* dq = device_tensor(h, false);
    void* dk = device_tensor(hg, false);
    void* dv = device_tensor(hg, false);
    strideattn::BackwardArgs ba;
    ba.q = fa_.q, ba.k = fa_.k, ba.v = fa_.v, ba.o = fa_.o, ba.d_o = view(d_o_, h), ba.lse = fa_.lse;
    ba.dq = view(dq, h), ba.dk = view(dk, hg), ba.dv = view(dv, hg);
    ba.options = fa_.options;
    ba.options.deterministic = true;
    ba.backend = Backend::cuda;
    ba.memory = strideattn::Memory::device;
    const strideattn::Status st = strideattn::backward(ba);
    EXPECT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::uint16_t> all(elems(h) + 2 * elems(hg));
    EXPECT_EQ(cudaMemcpy(all.data(), dq, elems(h) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(all.data() + elems(h), dk, elems(hg) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(all.data() + elems(h) + elems(hg), dv, elems(hg) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dq), cudaFree(dk), cudaFree(dv);
    return all;
  }

 private:
  std::size_t elems(std::int64_t heads) const { return static_cast<std::size_t>(b * s * heads * d); }
  void* device_tensor(std::int64_t heads, bool fill) {
    std::normal_distribution<float> dist(0.f, 1.f);
    std::vector<std::uint16_t> host(elems(heads));
    for (auto& e : host) {
      const float f = fill ? dist(rng_) : 0.f;
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      e = static_cast<std::uint16_t>(u >> 16);  // bf16 by truncation: any finite value will do
    }
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, host.size() * 2), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    return p;
  }
  strideattn::TensorView view(void* p, std::int64_t heads) const {
    strideattn::TensorView t;
    t.data = p, t.dtype = DType::bf16, t.shape = {b, s, heads, d};
    t.stride = {s * heads * d, heads * d, d, 1};
    return t;
  }

  std::mt19937_64 rng_{11};
  void *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *d_o_ = nullptr, *o_ = nullptr;
  float* lse_ = nullptr;
  strideattn::ForwardArgs fa_;
};

bool any_nonzero(const std::vector<std::uint16_t>& bytes) {
  for (auto x : bytes)
    if ((x & 0x7fff) != 0) return true;
  return false;
}

// The deterministic backward (the two-pass one: every sum runs in a fixed order in one
// thread's registers, no atomics) gives the same bytes run to run on the same inputs.
TEST(CudaBackend, BackwardBitwiseDeterministic) {
  SKIP_WITHOUT_GPU();
  FixedBackwardCase c;
  std::vector<std::vector<std::uint16_t>> runs;
  for (int run = 0; run < 3; ++run) runs.push_back(c.backward());
  for (std::size_t r = 1; r < runs.size(); ++r)
    EXPECT_TRUE(runs[r] == runs[0]) << "gradients differ between runs (run " << r << ")";
  EXPECT_TRUE(any_nonzero(runs[0])) << "gradients are all zero: the test would pass vacuously";
}

// ------------------------------------------------------------------ dK/dV pass kernels

// The sm80 kernels' dK/dV pass at d <= 128 has two kernels: the 8-warp one and the 4-warp
// one, which GPUs with too little shared memory for the 8-warp one run (sm_86, sm_89; the
// hook's smem_optin forces it; it is the d <= 256 bucket's only sm80 one, and d <= 64 runs
// the 8-warp one in both rows); the hook's arch = sm80 runs the sm80 kernels on a 9.0 GPU,
// and the default rows below run the sm_90a wgmma pass in every bucket there (elsewhere the
// sm80 kernels again), two- and single-pass (the d <= 256 cases: d 192 / 256, d_qk != d_v).
// The 8-warp and wgmma passes also run the single-pass backward (dQ = dS K added into an
// fp32 accumulator by atomics, the default with deterministic = false; the hook's
// single_pass forces either way). All rows run
// the same cases (same seeds, so the same inputs) against the fp64 reference: GQA/MQA with forced group splits
// (unsplit, even, uneven), causal and windowed masks, d 40 / 64 / 72 / 96 / 120 / 128, d_qk !=
// d_v inside both buckets, s_kv a multiple of neither 64 nor 128, varlen with empty sequences.
TEST(CudaBackend, DkDvPassEightAndFourWarps) {
  SKIP_WITHOUT_GPU();
  const CaseSpec grouped[] = {
      dense(DType::bf16, 2, 300, 300, 8, 2, 128, 128, MaskKind::causal, -1, -1, true, "sb(h+2hg)d"),
      dense(DType::f16, 1, 200, 333, 6, 1, 96, 96, MaskKind::none),
      dense(DType::f16, 2, 260, 260, 6, 1, 64, 64, MaskKind::causal),  // the seed's shape of problem
      dense(DType::bf16, 1, 150, 200, 4, 1, 256, 256, MaskKind::causal_bottom_right),
  };
  const CaseSpec others[] = {
      dense(DType::bf16, 1, 257, 190, 4, 2, 72, 72, MaskKind::causal_bottom_right, 40, 5),
      dense(DType::f16, 1, 190, 257, 4, 4, 96, 96, MaskKind::none, 30, 60),
      dense(DType::bf16, 1, 300, 300, 2, 1, 128, 128, MaskKind::causal, 70, -1),
      dense(DType::bf16, 1, 170, 200, 4, 2, 128, 64, MaskKind::causal),
      dense(DType::f16, 1, 140, 170, 2, 1, 64, 128, MaskKind::causal_bottom_right),
      dense(DType::f16, 2, 129, 129, 2, 1, 120, 120, MaskKind::none),
      dense(DType::bf16, 1, 300, 200, 4, 2, 64, 64, MaskKind::causal_bottom_right),  // d <= 64 bucket
      dense(DType::f16, 1, 170, 140, 2, 1, 40, 40, MaskKind::causal, 20, 5),
      dense(DType::bf16, 1, 150, 150, 4, 4, 64, 32, MaskKind::none),
      dense(DType::bf16, 1, 200, 300, 4, 2, 256, 256, MaskKind::causal, 70, -1),
      dense(DType::f16, 1, 190, 130, 2, 1, 192, 128, MaskKind::none),
      dense(DType::f16, 2, 129, 65, 2, 2, 200, 200, MaskKind::causal_bottom_right, 30, 20),
      varlen(DType::bf16, {0, 37, 170, 1, 65}, {5, 37, 300, 3, 164}, {}, {}, MaskKind::causal, -1, -1, 64),
      varlen(DType::bf16, {70, 0, 200, 9}, {130, 5, 260, 1}, {}, {}, MaskKind::causal, -1, -1, 128),
      varlen(DType::f16, {0, 37, 170, 1, 65}, {5, 37, 300, 3, 164}, {0, 3, 45, 220, 225}, {0, 9, 50, 360, 370},
             MaskKind::causal_bottom_right, 20, 8, 96),
      varlen(DType::bf16, {70, 0, 200, 9}, {130, 5, 260, 1}, {}, {}, MaskKind::causal, -1, -1, 256),
  };
  // sm80 kernels: 4-warp (at d <= 128), 8-warp two-pass, 8-warp single pass (the default
  // when the caller does not ask for determinism); the device's own kernels (on sm_90a the
  // wgmma pass, elsewhere those rows rerun the 8-warp pass: Sm90aRunsTheWgmmaKernels checks
  // which one runs), two-pass and single pass; the sm_90a rows also run the wgmma forward
  // (d <= 128 and d <= 256 buckets), the others the mma.sync one
  struct Path {
    const char* name;
    PlanForcing forcing;
  };
  const Path paths[] = {
      {"sm80, 4-warp at d <= 128, two-pass",
       {.arch = Arch::sm80, .smem_optin = kSmemBelowEightWarpPass, .single_pass = false}},
      {"sm80, two-pass", {.arch = Arch::sm80, .single_pass = false}},
      {"sm80, single pass", {.arch = Arch::sm80, .single_pass = true}},
      {"the device's kernels, two-pass", {.single_pass = false}},
      {"the device's kernels, single pass", {.single_pass = true}},
  };
  for (const auto& [name, forcing] : paths) {
    SCOPED_TRACE(name);
    {
      const ScopedCudaPlanForcing forced(forcing);
      for (const CaseSpec& c : others) expect_cuda_ok(c);
    }
    for (int splits : {1, 2, 4, 6}) {
      SCOPED_TRACE(::testing::Message() << "group splits " << splits);
      PlanForcing split = forcing;
      split.group_splits = splits;
      const ScopedCudaPlanForcing forced(split);
      for (const CaseSpec& c : grouped) expect_cuda_ok(c);
    }
  }
}

// The 8-warp kernel is deterministic run to run, and gives the 4-warp kernel's bytes: both
// form the same P^T and dS^T values and sum every dK / dV element over the same query
// blocks in the same order, 16 queries per MMA in increasing order (with the same group
// splits, forced here: the automatic choice depends on each kernel's keys per CTA).
TEST(CudaBackend, DkDvPassEightWarpsDeterministicAndEqualToFourWarps) {
  SKIP_WITHOUT_GPU();
  FixedBackwardCase c;
  for (int splits : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << "group splits " << splits);
    std::vector<std::uint16_t> eight[2], four;
    {
      // (the sm80 kernels: the wgmma pass sums in its own order)
      const ScopedCudaPlanForcing forced(PlanForcing{.arch = Arch::sm80, .group_splits = splits});
      eight[0] = c.backward();
      eight[1] = c.backward();
    }
    {
      const ScopedCudaPlanForcing forced(
          PlanForcing{.arch = Arch::sm80, .smem_optin = kSmemBelowEightWarpPass, .group_splits = splits});
      four = c.backward();
    }
    EXPECT_TRUE(eight[1] == eight[0]) << "8-warp kernel: gradients differ between runs";
    EXPECT_TRUE(any_nonzero(eight[0])) << "gradients are all zero: the test would pass vacuously";
    std::size_t differ = 0;
    for (std::size_t i = 0; i < four.size(); ++i) differ += four[i] != eight[0][i];
    EXPECT_EQ(differ, 0u) << "elements of dQ|dK|dV that differ between the 8-warp and 4-warp "
                             "dK/dV kernels (both pass the reference in DkDvPassEightAndFourWarps)";
  }
}

using strideattn::test_support::debug_log_of;

// On a 9.0 GPU, in a build with sm_90a code, the forward of every bucket runs the
// warp-specialized kernel (at d <= 128 and d <= 256 the wgmma one where the test hook keeps
// it off, at d <= 64 the mma.sync one); the dK/dV pass is the warp-specialized one in the
// single-pass backward of the d <= 128 bucket (cuda_ws_backward_test) and the wgmma one
// everywhere else, the deterministic backward of every bucket among them (so the default runs
// of every test here, and the default rows of DkDvPassEightAndFourWarps, test those); the
// test hook's arch = sm80 runs the mma.sync ones; the wgmma dK/dV pass is deterministic run to
// run.
TEST(CudaBackend, Sm90aRunsTheWgmmaKernels) {
  SKIP_WITHOUT_GPU();
#if !defined(STRIDEATTN_CUDA_SM90A)
  GTEST_SKIP() << "this build carries no sm_90a code (CMAKE_CUDA_ARCHITECTURES without 90a)";
#else
  int dev = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), cudaSuccess);
  if (major != 9 || minor != 0) GTEST_SKIP() << "compute capability " << major << "." << minor << ", not 9.0";
  FixedBackwardCase c;
  const std::string fwd = debug_log_of([&] { c.forward(); });
  EXPECT_NE(fwd.find("; forward: sm90a warp-specialized ping-pong forward"), std::string::npos) << fwd;
  {
    const ScopedCudaPlanForcing wgmma(PlanForcing{.ws_forward = false});
    const std::string kept = debug_log_of([&] { c.forward(); });
    EXPECT_NE(kept.find("; forward: sm90a wgmma forward"), std::string::npos) << kept;
  }
  const std::string bwd = debug_log_of([&] { EXPECT_TRUE(any_nonzero(c.backward())); });
  EXPECT_NE(bwd.find("; dK/dV pass: sm90a wgmma dK/dV pass"), std::string::npos) << bwd;
  {
    const ScopedCudaPlanForcing off(PlanForcing{.arch = Arch::sm80});
    const std::string mma = debug_log_of([&] {
      c.forward();
      EXPECT_TRUE(any_nonzero(c.backward()));
    });
    EXPECT_NE(mma.find("; forward: sm80 mma.sync forward"), std::string::npos) << mma;
    EXPECT_NE(mma.find("; dK/dV pass: sm80 8-warp dK/dV pass"), std::string::npos) << mma;
    EXPECT_EQ(mma.find("wgmma"), std::string::npos) << mma;
  }
  const std::vector<std::uint16_t> first = c.backward(), second = c.backward();
  EXPECT_TRUE(first == second) << "wgmma pass: gradients differ between runs";

  FixedBackwardCase c256(256);  // the d <= 256 bucket
  const std::string fwd256 = debug_log_of([&] { c256.forward(); });
  EXPECT_NE(fwd256.find("; forward: sm90a warp-specialized ping-pong forward"), std::string::npos) << fwd256;
  {
    const ScopedCudaPlanForcing wgmma(PlanForcing{.ws_forward = false});
    const std::string kept = debug_log_of([&] { c256.forward(); });
    EXPECT_NE(kept.find("; forward: sm90a wgmma forward"), std::string::npos) << kept;
  }
  FixedBackwardCase c64(64);  // the d <= 64 bucket: the mma.sync forward where it is kept off
  const std::string fwd64 = debug_log_of([&] { c64.forward(); });
  EXPECT_NE(fwd64.find("; forward: sm90a warp-specialized ping-pong forward"), std::string::npos) << fwd64;
  {
    const ScopedCudaPlanForcing kept_off(PlanForcing{.ws_forward = false});
    const std::string kept = debug_log_of([&] { c64.forward(); });
    EXPECT_NE(kept.find("; forward: sm90a mma.sync forward"), std::string::npos) << kept;
  }
  const std::string bwd256 = debug_log_of([&] { EXPECT_TRUE(any_nonzero(c256.backward())); });
  EXPECT_NE(bwd256.find("; dK/dV pass: sm90a wgmma dK/dV pass"), std::string::npos) << bwd256;
  {
    const ScopedCudaPlanForcing off(PlanForcing{.arch = Arch::sm80});
    const std::string mma = debug_log_of([&] { EXPECT_TRUE(any_nonzero(c256.backward())); });
    EXPECT_NE(mma.find("; dK/dV pass: sm80 4-warp dK/dV pass"), std::string::npos) << mma;
  }
  const std::vector<std::uint16_t> first256 = c256.backward(), second256 = c256.backward();
  EXPECT_TRUE(first256 == second256) << "wgmma pass, d = 256: gradients differ between runs";
#endif
}

// ------------------------------------------------------------------ workspace

// Random bf16 device tensor [1, tokens, heads, d], contiguous; freed by the owner.
struct DeviceTensor {
  void* ptr = nullptr;
  std::size_t elems = 0;
  DeviceTensor(std::int64_t tokens, std::int64_t heads, std::int64_t d, std::mt19937_64* rng)
      : elems(static_cast<std::size_t>(tokens * heads * d)) {
    std::normal_distribution<float> dist(0.f, 1.f);
    std::vector<std::uint16_t> host(elems);
    for (auto& e : host) {
      const float f = rng ? dist(*rng) : 0.f;
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      e = static_cast<std::uint16_t>(u >> 16);
    }
    EXPECT_EQ(cudaMalloc(&ptr, elems * 2), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), elems * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceTensor() { cudaFree(ptr); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  [[nodiscard]] std::vector<std::uint16_t> bytes() const {
    std::vector<std::uint16_t> host(elems);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr, elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

// Whether this GPU runs a d <= 128 dK/dV pass that adds dQ (and so the single pass): the
// sm90a wgmma pass, or the 8-warp pass, which needs 161 KiB of shared memory per block
// (plan.cpp picks the 4-warp pass below that).
bool kv8_enabled() {
  int dev = 0, smem = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
         smem >= strideattn::cuda_impl::kv8_tile(strideattn::cuda_impl::Arch::sm80, 128).smem_bytes;
}

// A caller-provided workspace of workspace_size() bytes gives the same bytes as the
// library's own allocation (varlen tables and the backward's delta rows live there); one
// byte less, or a start that is not 16-byte aligned, is refused with invalid_argument.
TEST(CudaBackend, CallerWorkspaceMatchesInternalAllocation) {
  SKIP_WITHOUT_GPU();
  // d 128: the single pass (deterministic = false) keeps its fp32 dQ accumulator in the
  // workspace too. Every sequence's keys fit one 128-key block and each query head is in one
  // group split, so each dQ element gets exactly one add: bitwise reproducible here.
  const std::int64_t h = 4, hg = 2, d = 128, tq = 104, tkv = 125;
  const std::vector<std::int64_t> lq{30, 0, 70}, lk{50, 9, 60};
  std::mt19937_64 rng(5);
  DeviceTensor q(tq, h, d, &rng), k(tkv, hg, d, &rng), v(tkv, hg, d, &rng), d_o(tq, h, d, &rng);
  DeviceTensor o(tq, h, d, nullptr), dq(tq, h, d, nullptr), dk(tkv, hg, d, nullptr), dv(tkv, hg, d, nullptr);
  float* lse = nullptr;
  ASSERT_EQ(cudaMalloc(&lse, h * tq * 4), cudaSuccess);
  auto view = [&](const DeviceTensor& t, std::int64_t tokens, std::int64_t heads) {
    strideattn::TensorView tv;
    tv.data = t.ptr, tv.dtype = DType::bf16, tv.shape = {1, tokens, heads, d};
    tv.stride = {tokens * heads * d, heads * d, d, 1};
    return tv;
  };
  strideattn::ForwardArgs fa;
  fa.q = view(q, tq, h), fa.k = view(k, tkv, hg), fa.v = view(v, tkv, hg), fa.o = view(o, tq, h);
  fa.lse = {lse, {1, h, tq}, {h * tq, tq, 1}};
  fa.varlen.seqlens_q = lq, fa.varlen.seqlens_kv = lk;
  fa.varlen.offsets_q = {0, 33, 34}, fa.varlen.offsets_kv = {2, 55, 65};  // gaps
  fa.options.mask = MaskKind::causal_bottom_right;
  fa.backend = Backend::cuda;
  fa.memory = strideattn::Memory::device;
  strideattn::BackwardArgs ba;
  ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.o = fa.o, ba.d_o = view(d_o, tq, h), ba.lse = fa.lse;
  ba.dq = view(dq, tq, h), ba.dk = view(dk, tkv, hg), ba.dv = view(dv, tkv, hg);
  ba.options = fa.options, ba.varlen = fa.varlen, ba.backend = fa.backend, ba.memory = fa.memory;

  auto run_both = [&]() {
    strideattn::Status s = strideattn::forward(fa);
    EXPECT_TRUE(s.ok()) << s.message();
    s = strideattn::backward(ba);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::uint16_t> all = o.bytes();
    for (const DeviceTensor* t : {&dq, &dk, &dv}) {
      auto b = t->bytes();
      all.insert(all.end(), b.begin(), b.end());
    }
    return all;
  };
  std::size_t two_pass_bytes = 0;
  for (bool deterministic : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "deterministic " << deterministic);
    fa.workspace = nullptr, fa.workspace_bytes = 0;
    ba.workspace = nullptr, ba.workspace_bytes = 0;
    ba.options.deterministic = deterministic;
    const std::vector<std::uint16_t> internal = run_both();

    std::size_t fwd_bytes = 0, bwd_bytes = 0;
    ASSERT_TRUE(strideattn::workspace_size(fa, &fwd_bytes).ok());
    ASSERT_TRUE(strideattn::workspace_size(ba, &bwd_bytes).ok());
    EXPECT_GT(fwd_bytes, 0u);         // the varlen tables
    EXPECT_GT(bwd_bytes, fwd_bytes);  // plus delta rows
    if (deterministic)
      two_pass_bytes = bwd_bytes;
    else if (kv8_enabled())  // plus the dQ accumulator
      EXPECT_GE(bwd_bytes, two_pass_bytes + std::size_t(tq * h * d) * 4);
    void* ws = nullptr;
    ASSERT_EQ(cudaMalloc(&ws, bwd_bytes), cudaSuccess);
    for (const DeviceTensor* t : {&o, &dq, &dk, &dv})  // poison: the second run must write all
      ASSERT_EQ(cudaMemset(t->ptr, 0xff, t->elems * 2), cudaSuccess);
    ASSERT_EQ(cudaMemset(ws, 0xff, bwd_bytes), cudaSuccess);  // the accumulator must be zeroed
    fa.workspace = ws, fa.workspace_bytes = fwd_bytes;
    ba.workspace = ws, ba.workspace_bytes = bwd_bytes;
    EXPECT_TRUE(run_both() == internal) << "caller workspace changed the results";

    ba.workspace_bytes = bwd_bytes - 1;
    const strideattn::Status small = strideattn::backward(ba);
    EXPECT_EQ(small.code(), strideattn::StatusCode::invalid_argument) << small.message();
    // a workspace that does not start 16-byte aligned is refused, saying so
    ba.workspace = static_cast<char*>(ws) + 8, ba.workspace_bytes = bwd_bytes - 8;
    const strideattn::Status odd = strideattn::backward(ba);
    EXPECT_EQ(odd.code(), strideattn::StatusCode::invalid_argument) << odd.message();
    EXPECT_NE(odd.message().find("16-byte aligned"), std::string::npos) << odd.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(ws);
  }
  cudaFree(lse);
}

// A device pointer passed with memory = host (the default) is refused, naming the tensor,
// before anything reads it on the host; host buffers passed as device are refused the same
// way; the right memory runs.
TEST(CudaBackend, MemoryFieldMustMatchThePointers) {
  SKIP_WITHOUT_GPU();
  const std::int64_t s = 16, h = 2, d = 64, n = s * h * d;
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 4 * n * 2), cudaSuccess);
  std::vector<std::uint16_t> host(4 * n, 0x3c00);  // 1.0 in f16
  ASSERT_EQ(cudaMemcpy(dev, host.data(), 4 * n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  auto args_on = [&](void* base, strideattn::Memory memory) {
    strideattn::ForwardArgs a;
    strideattn::TensorView* views[] = {&a.q, &a.k, &a.v, &a.o};
    for (int i = 0; i < 4; ++i) {
      views[i]->dtype = DType::f16;
      views[i]->shape = {1, s, h, d};
      views[i]->stride = {n, h * d, d, 1};
      views[i]->data = static_cast<std::uint16_t*>(base) + i * n;
    }
    a.memory = memory;
    return a;
  };
  for (Backend b : {Backend::automatic, Backend::cpu, Backend::reference, Backend::cuda}) {
    SCOPED_TRACE(std::string(strideattn::to_string(b)));
    strideattn::ForwardArgs a = args_on(dev, strideattn::Memory::host);
    a.backend = b;
    const strideattn::Status st = strideattn::forward(a);
    EXPECT_EQ(st.code(), strideattn::StatusCode::invalid_argument) << st.message();
    EXPECT_EQ(st.message().rfind("q.data points to device memory but memory is host", 0), 0u) << st.message();
  }
  strideattn::ForwardArgs mixed = args_on(dev, strideattn::Memory::device);
  mixed.o.data = host.data();
  const strideattn::Status st = strideattn::forward(mixed);
  EXPECT_EQ(st.code(), strideattn::StatusCode::invalid_argument) << st.message();
  EXPECT_EQ(st.message().rfind("o.data points to host memory but memory is device", 0), 0u) << st.message();
  strideattn::ForwardArgs right = args_on(dev, strideattn::Memory::device);
  right.backend = Backend::cuda;
  const strideattn::Status ok = strideattn::forward(right);
  EXPECT_TRUE(ok.ok()) << ok.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(dev);
}

}  // namespace
