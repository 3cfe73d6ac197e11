// The `cpu` backend against the fp64 reference under DESIGN's correctness rule, through the
// harness runner (fresh random inputs, poisoned outputs, guard bands, written checks):
// named edge cases (every mask, windows, s_q != s_kv both ways, s = 1, s not a multiple of
// the 64-row/64-key tiles, GQA/MQA, d_qk != d_v, head dims 8..256, every dtype, varlen with
// empty sequences and gaps, the seed case, transposed and padded views), forward and
// backward, then a seeded random sweep; plus bitwise determinism across thread counts and
// the support rule.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_common.hpp"
#include "backends/cpu/cpu_pack.hpp"
#include "dispatch/backend.hpp"
#include "harness/runner.hpp"
#include "harness/views.hpp"

namespace {

using strideattn::Backend;
using strideattn::DType;
using strideattn::MaskKind;
using strideattn::harness::CaseReport;
using strideattn::harness::CaseSpec;
using strideattn::harness::ProblemSizes;

// Runs `spec` on the cpu backend and expects "ok" (within tolerance, guards intact, every
// output element written). Failure messages carry the reproducer command line.
void expect_cpu_ok(CaseSpec spec) {
  if (!spec.layout_name.empty()) {
    const strideattn::Status s =
        strideattn::harness::make_layout_views(spec.layout_name, spec.sizes, &spec.views);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  CaseReport report;
  const strideattn::Status s = strideattn::harness::run_case(spec, {Backend::cpu}, &report);
  const std::string repro = strideattn::harness::reproducer(spec, {Backend::cpu});
  ASSERT_TRUE(s.ok()) << s.message() << "\n  " << repro;
  ASSERT_EQ(report.backends.size(), 1u);
  const auto& r = report.backends[0];
  std::ostringstream checks;
  for (const auto& c : r.checks)
    checks << " " << c.name << ": err " << c.err.max_abs_err << " tol " << c.tol << ";";
  EXPECT_EQ(r.status, "ok") << r.reason << "\n " << checks.str() << "\n  " << repro;
  EXPECT_TRUE(r.guard_ok) << repro;
  EXPECT_TRUE(r.written_ok) << repro;
  // Forward checks o and lse; backward adds dq, dk, dv. None may be missing.
  EXPECT_EQ(r.checks.size(), spec.grad ? 5u : 2u) << repro;
}

CaseSpec dense(DType dtype, std::int64_t b, std::int64_t sq, std::int64_t skv, std::int64_t h,
               std::int64_t hg, std::int64_t dqk, std::int64_t dv, MaskKind mask,
               std::int64_t left = -1, std::int64_t right = -1, bool grad = true,
               const char* layout = "bshd_bshd_bshd") {
  CaseSpec s;
  s.dtype = dtype;
  s.sizes.batch = b, s.sizes.s_q = sq, s.sizes.s_kv = skv;
  s.sizes.heads = h, s.sizes.kv_heads = hg, s.sizes.d_qk = dqk, s.sizes.d_v = dv;
  s.layout_name = layout;
  s.options.mask = mask;
  s.options.window = {left, right};
  s.grad = grad;
  s.seed = static_cast<std::uint64_t>(sq * 1000003 + skv * 101 + dqk * 7 + h + int(mask));
  return s;
}

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
  expect_cpu_ok(dense(DType::bf16, 2, 70, 70, 8, 2, 32, 32, MaskKind::causal));      // GQA 4
  expect_cpu_ok(dense(DType::bf16, 1, 100, 80, 6, 1, 32, 32, MaskKind::none));       // MQA
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
  expect_cpu_ok(dense(DType::f16, 2, 256, 256, 16, 1, 64, 64, MaskKind::causal, -1, -1, true,
                      "sb(h+2hg)d"));
  expect_cpu_ok(dense(DType::f16, 2, 256, 256, 16, 1, 64, 64, MaskKind::none, -1, -1, false,
                      "sb(h+2hg)d"));
}

TEST(CpuBackend, NamedLayouts) {
  for (const char* l : {"sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd", "sb3hd", "bsh3d", "sbhd_sbh2d",
                        "bshd_bs2hd", "bs(h+2hg)d"}) {
    SCOPED_TRACE(l);
    const bool packed_qkv = std::string(l).find('3') != std::string::npos;
    const bool fused = std::string(l).find("(h") != std::string::npos;
    const std::int64_t hg = packed_qkv ? 4 : 2;
    expect_cpu_ok(dense(DType::bf16, 2, 70, packed_qkv || fused ? 70 : 90, 4, hg, 32, 32,
                        MaskKind::causal,
                        -1, -1, true, l));
  }
}

// Explicit odd views from FIELD.md: transposed sbhd memory passed as bshd (sequence stride
// b*h*d, batch stride h*d), bhsd.transpose(1,2), and x[..., :d] of a buffer padded to d+64.
TEST(CpuBackend, TransposedAndPaddedViews) {
  const std::int64_t b = 2, s = 70, h = 2, d = 32;
  auto spec_with = [&](auto make_view) {
    CaseSpec c = dense(DType::bf16, b, s, s, h, h, d, d, MaskKind::causal);
    c.layout_name.clear();
    auto& v = c.views;
    v.q = make_view("q"), v.k = make_view("k"), v.v = make_view("v"), v.o = make_view("o");
    v.d_o = make_view("do"), v.dq = make_view("dq"), v.dk = make_view("dk"), v.dv = make_view("dv");
    return c;
  };
  using strideattn::harness::ViewSpec;
  // sbhd memory, logical [b, s, h, d]: batch stride h*d, seq stride b*h*d.
  expect_cpu_ok(spec_with([&](const char* name) {
    return ViewSpec{name, 0, {b, s, h, d}, {h * d, b * h * d, d, 1}};
  }));
  // bhsd memory: batch stride h*s*d, seq stride d, head stride s*d.
  expect_cpu_ok(spec_with([&](const char* name) {
    return ViewSpec{name, 0, {b, s, h, d}, {h * s * d, d, s * d, 1}};
  }));
  // bshd rows padded to d + 64 with a 5-element offset: x[..., :d].
  const std::int64_t dp = d + 64;
  expect_cpu_ok(spec_with([&](const char* name) {
    return ViewSpec{name, 5, {b, s, h, d}, {s * h * dp, h * dp, dp, 1}};
  }));
}

// ------------------------------------------------------------------ varlen

CaseSpec varlen(DType dtype, std::vector<std::int64_t> lq, std::vector<std::int64_t> lk,
                std::vector<std::int64_t> oq, std::vector<std::int64_t> ok, MaskKind mask,
                std::int64_t left = -1, std::int64_t right = -1, const char* layout = "thd_thd_thd") {
  CaseSpec s = dense(dtype, static_cast<std::int64_t>(lq.size()), 1, 1, 4, 2, 32, 32, mask, left,
                     right, true, layout);
  s.sizes.seqlens_q = std::move(lq), s.sizes.seqlens_kv = std::move(lk);
  s.sizes.offsets_q = std::move(oq), s.sizes.offsets_kv = std::move(ok);
  s.seed = 4242 + int(mask) + static_cast<std::uint64_t>(left + 2 * right);
  return s;
}

// Empty sequences (on either side), gaps between sequences (padding that must be written
// as 0 / LSE -inf), s_q != s_kv per sequence, lengths around the tile size.
TEST(CpuBackend, VarlenEmptySequencesAndGaps) {
  for (MaskKind m : kMasks) {
    SCOPED_TRACE(::testing::Message() << "mask " << int(m));
    expect_cpu_ok(varlen(DType::bf16, {0, 37, 70, 1, 0, 65}, {5, 37, 100, 0, 3, 64},
                         {0, 3, 45, 120, 121, 125}, {0, 9, 50, 152, 153, 160}, m));
  }
  expect_cpu_ok(varlen(DType::f16, {20, 0, 90}, {20, 7, 60}, {}, {}, MaskKind::none, 8, 4));
  expect_cpu_ok(varlen(DType::f32, {33, 64, 2}, {33, 64, 2}, {}, {}, MaskKind::causal, -1, -1,
                       "t(h+2hg)d"));
}

// ------------------------------------------------------------------ seeded sweep

// Random problems from a fixed seed: sizes around the tiles, every mask and window kind,
// GQA ratios, head dims 8..256 in steps of 8, every dtype, dense layouts and varlen.
TEST(CpuBackend, SeededSweep) {
  std::mt19937_64 rng(20240611);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  const char* dense_layouts[] = {"bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd",
                                 "sbhd_sb2hd", "bshd_bsh2d", "sb(h+2hg)d"};
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  for (int c = 0; c < 80; ++c) {
    const std::int64_t hg = pick(1, 2), h = hg * pick(1, 3);
    const std::int64_t dqk = 8 * pick(1, 32);
    const std::int64_t dv = (c % 4 == 0) ? 8 * pick(1, 32) : dqk;
    const MaskKind m = kMasks[c % 3];
    const std::int64_t left = pick(0, 3) == 0 ? pick(0, 80) : -1;
    const std::int64_t right = pick(0, 3) == 0 ? pick(0, 80) : -1;
    const DType t = dtypes[pick(0, 2)];
    CaseSpec s;
    if (c % 4 == 3) {
      const std::int64_t n = pick(1, 4);
      std::vector<std::int64_t> lq, lk, oq, ok;
      std::int64_t pq = 0, pk = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        pq += pick(0, 2), pk += pick(0, 2);  // gaps
        lq.push_back(pick(0, 4) == 0 ? 0 : pick(1, 140));
        lk.push_back(pick(0, 4) == 0 ? 0 : pick(1, 140));
        oq.push_back(pq), ok.push_back(pk);
        pq += lq.back(), pk += lk.back();
      }
      s = varlen(t, lq, lk, oq, ok, m, left, right);
      s.sizes.heads = h, s.sizes.kv_heads = hg, s.sizes.d_qk = dqk, s.sizes.d_v = dqk;
    } else {
      const std::int64_t sq = pick(1, 160), skv = pick(0, 1) ? sq : pick(1, 160);
      const char* layout = dense_layouts[pick(0, 5)];
      const bool needs_equal_dims = std::string(layout).find('2') != std::string::npos ||
                                    std::string(layout).find("(h") != std::string::npos;
      s = dense(t, pick(1, 2), sq, std::string(layout).find("(h") != std::string::npos ? sq : skv,
                h, hg, dqk, needs_equal_dims ? dqk : dv, m, left, right, c % 2 == 0, layout);
    }
    s.seed = 1000 + static_cast<std::uint64_t>(c);
    SCOPED_TRACE(::testing::Message() << "sweep case " << c);
    expect_cpu_ok(s);
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
  expect_cpu_ok(varlen(DType::f32, {0, 100, 70}, {5, 130, 64}, {0, 3, 110}, {0, 9, 150},
                       MaskKind::none, -1, 20));
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
