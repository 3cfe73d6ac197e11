// The `cpu` backend against the fp64 reference under the correctness rule, through the
// harness runner (fresh random inputs, poisoned outputs, guard bands, written checks):
// named edge cases (every mask, windows, s_q != s_kv both ways, s = 1, s not a multiple of
// the 64-row/64-key tiles, GQA/MQA, d_qk != d_v, head dims 8..256, every dtype, varlen with
// empty sequences and gaps, the seed case, transposed and padded views), forward and
// backward, then a seeded random sweep; plus bitwise determinism across thread counts and
// the support rule.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_common.hpp"
#include "backends/cpu/cpu_pack.hpp"
#include "dispatch/backend.hpp"
#include "harness/runner.hpp"
#include "harness/views.hpp"
#include "support/backend_case.hpp"

namespace {

using strideattn::Backend;
using strideattn::DType;
using strideattn::MaskKind;
using strideattn::harness::CaseSpec;

// The cpu backend runs `spec` and passes (see test_support::expect_backend_ok).
void expect_cpu_ok(const CaseSpec& spec) { strideattn::test_support::expect_backend_ok(Backend::cpu, spec); }

constexpr strideattn::test_support::DenseCaseBuilder dense{.seed_offset = 0};
constexpr strideattn::test_support::VarlenCaseBuilder varlen{
    .seed_base = 4242, .head_dim = 32, .head_dim_in_seed = false};

const MaskKind kMasks[] = {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right};

// ------------------------------------------------------------------ masks and shapes

// Every mask with s_q == s_kv, s_q < s_kv and s_q > s_kv, none a multiple of the tile.
TEST(CpuBackend, EveryMaskBothSequenceOrders) {
  const std::int64_t shapes[][2] = {{77, 77}, {50, 131}, {131, 50}};
  for (MaskKind m : kMasks)
    for (const auto& sh : shapes) {
      SCOPED_TRACE(::testing::Message() << "mask " << int(m) << " sq " << sh[0] << " skv " << sh[1]);
      expect_cpu_ok(dense(DType::bf16, 2, sh[0], sh[1], 2, 1, 32, 32, m));
    }
}

// Sliding windows: asymmetric, left only, right only, zero-width, with each mask, and with
// s_q != s_kv so the bottom-right alignment matters.
TEST(CpuBackend, SlidingWindows) {
  const std::int64_t windows[][2] = {{16, 0}, {0, 16}, {5, 40}, {40, 5}, {-1, 8}, {8, -1}, {0, 0}};
  for (MaskKind m : kMasks)
    for (const auto& w : windows) {
      SCOPED_TRACE(::testing::Message() << "mask " << int(m) << " window " << w[0] << "," << w[1]);
      expect_cpu_ok(dense(DType::f16, 1, 90, 150, 2, 2, 16, 16, m, w[0], w[1]));
    }
  // A window that leaves some rows with no key at all (O = 0, LSE = -inf, dQ = 0).
  expect_cpu_ok(dense(DType::f32, 1, 150, 40, 1, 1, 16, 16, MaskKind::none, 3, 3));
}

// s = 1 on either side (decode and single-key), and tiny problems.
TEST(CpuBackend, SingleTokenSequences) {
  expect_cpu_ok(dense(DType::bf16, 2, 1, 1, 2, 1, 64, 64, MaskKind::none));
  expect_cpu_ok(dense(DType::bf16, 2, 1, 200, 4, 2, 64, 64, MaskKind::causal_bottom_right));
  expect_cpu_ok(dense(DType::bf16, 2, 1, 200, 4, 2, 64, 64, MaskKind::causal));
  expect_cpu_ok(dense(DType::f16, 1, 200, 1, 2, 1, 32, 32, MaskKind::none));
  expect_cpu_ok(dense(DType::f16, 1, 200, 1, 2, 1, 32, 32, MaskKind::causal_bottom_right));
  expect_cpu_ok(dense(DType::f32, 1, 64, 65, 1, 1, 8, 8, MaskKind::causal));
  expect_cpu_ok(dense(DType::f32, 1, 129, 128, 1, 1, 8, 8, MaskKind::causal));
}

TEST(CpuBackend, GroupedAndMultiQuery) {
  expect_cpu_ok(dense(DType::bf16, 2, 70, 70, 8, 2, 32, 32, MaskKind::causal));  // GQA 4
  expect_cpu_ok(dense(DType::bf16, 1, 100, 80, 6, 1, 32, 32, MaskKind::none));   // MQA
  expect_cpu_ok(dense(DType::f16, 1, 80, 100, 6, 3, 40, 24, MaskKind::causal_bottom_right));
}

// MLA-style 192/128 and other d_qk != d_v pairs.
TEST(CpuBackend, DifferentQkAndVHeadDims) {
  expect_cpu_ok(dense(DType::bf16, 1, 70, 70, 2, 1, 192, 128, MaskKind::causal));
  expect_cpu_ok(dense(DType::f16, 1, 40, 90, 2, 2, 128, 192, MaskKind::none));
  expect_cpu_ok(dense(DType::f32, 1, 33, 33, 1, 1, 8, 72, MaskKind::causal_bottom_right));
}

TEST(CpuBackend, HeadDims8To256) {
  for (std::int64_t d : {8, 40, 72, 96, 160, 256}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    expect_cpu_ok(dense(DType::bf16, 1, 70, 90, 2, 1, d, d, MaskKind::causal_bottom_right));
  }
}

TEST(CpuBackend, EveryDtype) {
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(::testing::Message() << "dtype " << strideattn::to_string(t));
    expect_cpu_ok(dense(t, 2, 100, 100, 4, 2, 64, 64, MaskKind::causal));
  }
}

// Head dims past the field's 256 just work (no support rule).
TEST(CpuBackend, HeadDim512) {
  expect_cpu_ok(dense(DType::bf16, 1, 40, 70, 1, 1, 512, 512, MaskKind::causal, -1, -1, true));
}

// ------------------------------------------------------------------ layouts and views

// The seed case (fused [s, b, h + 2hg, d] buffer split into Q, K, V) at CI size.
TEST(CpuBackend, SeedCaseFusedSplit) {
  expect_cpu_ok(dense(DType::f16, 2, 256, 256, 16, 1, 64, 64, MaskKind::causal, -1, -1, true, "sb(h+2hg)d"));
  expect_cpu_ok(dense(DType::f16, 2, 256, 256, 16, 1, 64, 64, MaskKind::none, -1, -1, false, "sb(h+2hg)d"));
}

TEST(CpuBackend, NamedLayouts) {
  for (const char* l :
       {"sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd", "sb3hd", "bsh3d", "sbhd_sbh2d", "bshd_bs2hd", "bs(h+2hg)d"}) {
    SCOPED_TRACE(l);
    const bool packed_qkv = std::string(l).find('3') != std::string::npos;
    const bool fused = std::string(l).find("(h") != std::string::npos;
    const std::int64_t hg = packed_qkv ? 4 : 2;
    expect_cpu_ok(
        dense(DType::bf16, 2, 70, packed_qkv || fused ? 70 : 90, 4, hg, 32, 32, MaskKind::causal, -1, -1, true, l));
  }
}

// Explicit odd views (docs/design.md "Why"): transposed sbhd memory passed as bshd (sequence stride
// b*h*d, batch stride h*d), bhsd.transpose(1,2), and x[..., :d] of a buffer padded to d+64.
TEST(CpuBackend, TransposedAndPaddedViews) {
  const std::int64_t b = 2, s = 70, h = 2, d = 32;
  const CaseSpec base = dense(DType::bf16, b, s, s, h, h, d, d, MaskKind::causal);
  using strideattn::harness::ViewSpec;
  using strideattn::test_support::with_views;
  // sbhd memory, logical [b, s, h, d]: batch stride h*d, seq stride b*h*d.
  expect_cpu_ok(with_views(base, [&](const char* name, std::int64_t hh) {
    return ViewSpec{name, 0, {b, s, hh, d}, {hh * d, b * hh * d, d, 1}};
  }));
  // bhsd memory: batch stride h*s*d, seq stride d, head stride s*d.
  expect_cpu_ok(with_views(base, [&](const char* name, std::int64_t hh) {
    return ViewSpec{name, 0, {b, s, hh, d}, {hh * s * d, d, s * d, 1}};
  }));
  // bshd rows padded to d + 64 with a 5-element offset: x[..., :d].
  const std::int64_t dp = d + 64;
  expect_cpu_ok(with_views(base, [&](const char* name, std::int64_t hh) {
    return ViewSpec{name, 5, {b, s, hh, d}, {s * hh * dp, hh * dp, dp, 1}};
  }));
}

// ------------------------------------------------------------------ varlen

// Empty sequences (on either side), gaps between sequences (padding that must be written
// as 0 / LSE -inf), s_q != s_kv per sequence, lengths around the tile size.
TEST(CpuBackend, VarlenEmptySequencesAndGaps) {
  for (MaskKind m : kMasks) {
    SCOPED_TRACE(::testing::Message() << "mask " << int(m));
    expect_cpu_ok(varlen(DType::bf16, {0, 37, 70, 1, 0, 65}, {5, 37, 100, 0, 3, 64}, {0, 3, 45, 120, 121, 125},
                         {0, 9, 50, 152, 153, 160}, m));
  }
  expect_cpu_ok(varlen(DType::f16, {20, 0, 90}, {20, 7, 60}, {}, {}, MaskKind::none, 8, 4));
  expect_cpu_ok(varlen(DType::f32, {33, 64, 2}, {33, 64, 2}, {}, {}, MaskKind::causal, -1, -1, 32, "t(h+2hg)d"));
}

// ------------------------------------------------------------------ seeded sweep

// Random problems from a fixed seed: sizes around the tiles, every mask and window kind,
// GQA ratios, head dims 8..256 in steps of 8, every dtype, dense layouts and varlen.
TEST(CpuBackend, SeededSweep) {
  std::mt19937_64 rng(20240611);
  const strideattn::test_support::SweepRanges ranges{.max_seq = 160,
                                                     .max_varlen_seq = 140,
                                                     .max_window = 80,
                                                     .dtypes = {DType::f32, DType::f16, DType::bf16},
                                                     .seed_base = 1000};
  for (int c = 0; c < 80; ++c) {
    SCOPED_TRACE(::testing::Message() << "sweep case " << c);
    expect_cpu_ok(strideattn::test_support::sweep_case(c, rng, ranges, dense, varlen));
  }
}

// Over the pack budget the passes convert K/V and Q/dO tile by tile instead of using the
// fp32 pack: the same cases must pass on that path (budget 0 forces it everywhere).
TEST(CpuBackend, PerTilePathWithoutPack) {
  auto& budget = strideattn::detail::cpu::pack_budget();
  const std::int64_t saved = budget.load();
  budget = 0;
  expect_cpu_ok(dense(DType::bf16, 2, 150, 131, 4, 2, 40, 40, MaskKind::causal));
  expect_cpu_ok(dense(DType::f16, 1, 90, 200, 2, 1, 64, 32, MaskKind::causal_bottom_right, 70, 5));
  expect_cpu_ok(varlen(DType::f32, {0, 100, 70}, {5, 130, 64}, {0, 3, 110}, {0, 9, 150}, MaskKind::none, -1, 20));
  budget = saved;
}

// The portable inner loops (used where AVX2+FMA is missing) on a machine that has AVX2.
TEST(CpuBackend, PortableKernels) {
  auto& force = strideattn::detail::cpu::force_portable_kernels();
  force = true;
  expect_cpu_ok(dense(DType::bf16, 2, 150, 131, 4, 2, 40, 40, MaskKind::causal));
  expect_cpu_ok(dense(DType::f32, 1, 70, 90, 2, 1, 72, 24, MaskKind::none, 30, 10));
  force = false;
}

// ------------------------------------------------------------------ determinism, support

// The backward owns every output element in exactly one work item, so gradients are
// bitwise identical for any thread count (and run to run).
TEST(CpuBackend, BackwardBitwiseDeterministicAcrossThreadCounts) {
  const std::int64_t b = 1, s = 150, h = 4, hg = 2, d = 40;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> dist(0.f, 1.f);
  auto tensor = [&](std::int64_t heads, bool fill) {
    std::vector<float> x(static_cast<std::size_t>(b * s * heads * d));
    for (auto& e : x) e = fill ? dist(rng) : 0.f;
    return x;
  };
  auto view = [&](std::vector<float>& x, std::int64_t heads) {
    strideattn::TensorView t;
    t.data = x.data(), t.dtype = DType::f32, t.shape = {b, s, heads, d};
    t.stride = {s * heads * d, heads * d, d, 1};
    return t;
  };
  auto q = tensor(h, true), k = tensor(hg, true), v = tensor(hg, true), d_o = tensor(h, true);
  auto o = tensor(h, false);
  std::vector<float> lse(static_cast<std::size_t>(b * h * s));
  strideattn::ForwardArgs fa;
  fa.q = view(q, h), fa.k = view(k, hg), fa.v = view(v, hg), fa.o = view(o, h);
  fa.lse = {lse.data(), {b, h, s}, {h * s, s, 1}};
  fa.options.mask = MaskKind::causal;
  fa.backend = Backend::cpu;
  ASSERT_TRUE(strideattn::forward(fa).ok());

  std::vector<std::vector<float>> runs;
  for (const char* threads : {"1", "3", "2"}) {
    ASSERT_EQ(setenv("STRIDEATTN_CPU_THREADS", threads, 1), 0);
    auto dq = tensor(h, false), dk = tensor(hg, false), dv = tensor(hg, false);
    strideattn::BackwardArgs ba;
    ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.o = fa.o, ba.d_o = view(d_o, h), ba.lse = fa.lse;
    ba.dq = view(dq, h), ba.dk = view(dk, hg), ba.dv = view(dv, hg);
    ba.options = fa.options;
    ba.backend = Backend::cpu;
    ba.options.deterministic = true;
    const strideattn::Status st = strideattn::backward(ba);
    ASSERT_TRUE(st.ok()) << st.message();
    std::vector<float> all = dq;
    all.insert(all.end(), dk.begin(), dk.end());
    all.insert(all.end(), dv.begin(), dv.end());
    runs.push_back(std::move(all));
  }
  unsetenv("STRIDEATTN_CPU_THREADS");
  for (std::size_t r = 1; r < runs.size(); ++r)
    EXPECT_TRUE(runs[r] == runs[0]) << "gradients differ between thread counts (run " << r << ")";
}

TEST(CpuBackend, ThreadCountFromEnvironment) {
  ASSERT_EQ(setenv("STRIDEATTN_CPU_THREADS", "3", 1), 0);
  EXPECT_EQ(strideattn::detail::cpu::thread_count(), 3);
  ASSERT_EQ(setenv("STRIDEATTN_CPU_THREADS", "zero", 1), 0);  // ignored, logged
  EXPECT_GE(strideattn::detail::cpu::thread_count(), 1);
  unsetenv("STRIDEATTN_CPU_THREADS");
  EXPECT_GE(strideattn::detail::cpu::thread_count(), 1);
}

// Device tensors are refused with the memory rule, naming where the tensors are.
TEST(CpuBackend, SupportRuleRefusesDeviceMemory) {
  strideattn::detail::Problem p;
  p.memory = strideattn::Memory::device;
  const strideattn::Verdict v = strideattn::detail::cpu_backend()->supports(p);
  EXPECT_FALSE(v.supported);
  EXPECT_EQ(v.rule, "memory");
  EXPECT_NE(v.reason.find("device"), std::string::npos) << v.reason;
  p.memory = strideattn::Memory::host;
  p.d_qk = p.d_v = 512;
  EXPECT_TRUE(strideattn::detail::cpu_backend()->supports(p).supported);
}

}  // namespace

namespace {

// A valid but absurd problem: K and V are stride-0 views of one row, 2^50 keys long. The host
// backends refuse it by its size (rule "work") at once instead of running for years.
TEST(HostBackends, AbsurdlyLargeValidProblemIsRefusedBySize) {
  const std::int64_t s_q = 4, s_kv = std::int64_t{1} << 50, d = 8;
  std::vector<float> q(static_cast<std::size_t>(s_q * d), 0.5f), kv(static_cast<std::size_t>(d), 0.25f);
  std::vector<float> o(static_cast<std::size_t>(s_q * d), 0.f);
  strideattn::ForwardArgs fa;
  fa.q = {q.data(), DType::f32, {1, s_q, 1, d}, {s_q * d, d, d, 1}};
  fa.k = {kv.data(), DType::f32, {1, s_kv, 1, d}, {0, 0, 0, 1}};
  fa.v = fa.k;
  fa.o = {o.data(), DType::f32, {1, s_q, 1, d}, {s_q * d, d, d, 1}};
  for (Backend b : {Backend::cpu, Backend::reference}) {
    fa.backend = b;
    const strideattn::Status st = strideattn::forward(fa);
    EXPECT_EQ(st.code(), strideattn::StatusCode::unsupported) << st.message();
    EXPECT_NE(st.message().find("work: the problem needs up to"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("use a GPU backend"), std::string::npos) << st.message();
  }
  for (float x : o) EXPECT_EQ(x, 0.f) << "a refused call writes nothing";
  // The same shape with a short K runs: the rule measures the work, not the view.
  fa.k.shape[1] = fa.v.shape[1] = 16;
  fa.backend = Backend::cpu;
  EXPECT_TRUE(strideattn::forward(fa).ok());
}

}  // namespace
