// The warp-specialized sm_90a forward (sm90/ws_forward.cuh; the default forward of the d <= 64,
// d <= 128 and d <= 256 buckets, each instantiation forced here with PlanForcing::ws_forward /
// ws_schedule) against the fp64 reference under the correctness rule, through the harness
// runner (fresh random inputs, poisoned outputs, guard bands, written checks), in the three
// buckets (d 128, 64 and 256): s_q != s_kv both ways, sizes off the 128-row tiles, every mask
// kind, bottom-right windows, GQA 8:1, MQA (the seed's 16/1 at d 64), batch > 1, f16 and
// bf16, head dims of each bucket below it (d 8 to 56 in the 64 bucket, 136 to 248 in the
// 256 one), every dense named layout (the splits of packed and fused QKV buffers among them),
// each with every consumer schedule (plain, overlapped, ping-pong). Every case also asserts
// from the debug log that the forced instantiation really ran (no silent fallback), and
// planted errors must be caught. Views TMA cannot read fall back to the bucket's other
// forward (mma.sync at d 64, wgmma above) with the reason logged. At d 128 and 256 the new
// kernel's O and LSE equal the wgmma forward's bit for bit (same MMA order, same softmax
// code); at d 64, where no wgmma forward exists, the three schedules equal each other bit for
// bit. The training features (softcap, post- and pre-scale bias, ALiBi, sinks, max logit,
// dropout), each alone and all together, run in the overlapped schedule's features
// instantiation (the plan's choice for them), checked the same way, and at d 128 and 256
// equal the wgmma forward's features variant bit for bit (O, LSE, max logit).
// DISABLED_Timing times them against the bucket's other forward (run it with
// --gtest_also_run_disabled_tests).
// Skips, saying why, without a GPU, without sm_90a code in the build, or on a GPU that is not
// compute capability 9.0.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "backends/cuda/test_hook.hpp"
#include "common/log.hpp"
#include "harness/runner.hpp"
#include "harness/views.hpp"
#include "support/backend_case.hpp"
#include "support/debug_log.hpp"
#include "support/device_buffer.hpp"
#include "support/event_timer.hpp"
#include "support/sm90a_device.hpp"

namespace {

using strideattn::Backend;
using strideattn::BiasType;
using strideattn::DType;
using strideattn::MaskKind;
using strideattn::cuda_impl::PlanForcing;
using strideattn::cuda_impl::ScopedCudaPlanForcing;
using strideattn::cuda_impl::WsSchedule;
using strideattn::harness::CaseReport;
using strideattn::harness::CaseSpec;
using strideattn::harness::ViewSpec;
using strideattn::test_support::with_views;

// What the debug log line says when each instantiation ran: one per consumer schedule
// (PlanForcing::ws_schedule): plain, overlapping consecutive key blocks, and ping-pong.
constexpr WsSchedule kSchedules[] = {WsSchedule::plain, WsSchedule::overlapped, WsSchedule::ping_pong};
std::string ran_marker(WsSchedule s) {
  return s == WsSchedule::plain        ? "; forward: sm90a warp-specialized forward"
         : s == WsSchedule::overlapped ? "; forward: sm90a warp-specialized overlapped forward"
                                       : "; forward: sm90a warp-specialized ping-pong forward";
}
PlanForcing forcing(WsSchedule s) { return PlanForcing{.ws_forward = true, .ws_schedule = s}; }
// The head-dim buckets the kernel covers, each at its full width, and what the log says when
// the bucket's other forward (its fallback) ran.
constexpr std::int64_t kBucketDims[] = {128, 64, 256};
std::string fallback_marker(std::int64_t d) {
  return d <= 64 ? "; forward: sm90a mma.sync forward" : "; forward: sm90a wgmma forward";
}
constexpr strideattn::test_support::DenseCaseBuilder dense{.seed_offset = 9090};

#define SKIP_UNLESS_SM90A()                                                                                      \
  if (const std::string why = strideattn::test_support::sm90a_unavailable("the warp-specialized forward tests"); \
      !why.empty())                                                                                              \
  GTEST_SKIP() << why

using strideattn::test_support::debug_log_of;

// `spec` (forward only) with each instantiation of the new kernel forced: passes the
// correctness rule, and the log shows that instantiation ran (`expect_ran`) or that the plan
// fell back to the bucket's other forward, naming why.
void expect_ws(CaseSpec spec, bool expect_ran = true) {
  spec.grad = false;
  for (WsSchedule schedule : kSchedules) {
    SCOPED_TRACE(::testing::Message() << to_string(schedule) << " consumers");
    const ScopedCudaPlanForcing forced(forcing(schedule));
    const std::string log = debug_log_of([&] { strideattn::test_support::expect_backend_ok(Backend::cuda, spec); });
    if (expect_ran) {
      EXPECT_NE(log.find(ran_marker(schedule)), std::string::npos) << "the forced kernel did not run:\n" << log;
    } else {
      EXPECT_EQ(log.find("; forward: sm90a warp-specialized"), std::string::npos) << log;
      EXPECT_NE(log.find(fallback_marker(std::max(spec.sizes.d_qk, spec.sizes.d_v))), std::string::npos) << log;
      EXPECT_NE(log.find("warp-specialized forward not run: tma:"), std::string::npos) << log;
    }
  }
}

const MaskKind kMasks[] = {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right};

TEST(CudaWsForward, ShapesMasksAndDtypes) {
  SKIP_UNLESS_SM90A();
  const std::int64_t shapes[][2] = {{128, 128}, {77, 77}, {50, 300}, {300, 50}, {257, 513}, {1000, 1000}, {1, 129}};
  for (std::int64_t d : kBucketDims)
    for (DType t : {DType::bf16, DType::f16})
      for (MaskKind m : kMasks)
        for (const auto& sh : shapes) {
          if (d == 256 && t == DType::f16 && sh[0] > 300) continue;  // (the reference's time)
          SCOPED_TRACE(::testing::Message() << "d " << d << " " << strideattn::to_string(t) << " mask " << int(m) << " "
                                            << sh[0] << "x" << sh[1]);
          expect_ws(dense(t, 2, sh[0], sh[1], 4, 2, d, d, m));
        }
}

// Bottom-right windows (docs/semantics.md): some rows see nothing (O = 0, LSE = -inf), CTAs
// whose rows see no key at all (no key block), and windows narrower than a block.
TEST(CudaWsForward, Windows) {
  SKIP_UNLESS_SM90A();
  const std::int64_t windows[][2] = {{0, 0}, {7, 3}, {100, -1}, {-1, 50}, {200, 0}, {3, 400}};
  for (std::int64_t d : kBucketDims)
    for (MaskKind m : {MaskKind::none, MaskKind::causal_bottom_right})
      for (const auto& w : windows)
        for (const auto& sh : {std::pair<std::int64_t, std::int64_t>{300, 500}, {500, 300}}) {
          SCOPED_TRACE(::testing::Message() << "d " << d << " mask " << int(m) << " window " << w[0] << "," << w[1]
                                            << " " << sh.first << "x" << sh.second);
          expect_ws(dense(DType::bf16, 2, sh.first, sh.second, 4, 4, d, d, m, w[0], w[1]));
        }
}

TEST(CudaWsForward, GroupedAndMultiQueryBatches) {
  SKIP_UNLESS_SM90A();
  expect_ws(dense(DType::bf16, 3, 333, 400, 8, 1, 128, 128, MaskKind::causal_bottom_right));  // GQA 8:1
  expect_ws(dense(DType::f16, 2, 200, 200, 16, 1, 128, 128, MaskKind::none));                 // MQA
  expect_ws(dense(DType::bf16, 4, 130, 260, 8, 2, 128, 128, MaskKind::causal));               // 4:1
  // the 64 bucket: the seed's MQA 16/1 (shorter), GQA 8:1
  expect_ws(dense(DType::bf16, 2, 640, 640, 16, 1, 64, 64, MaskKind::causal));
  expect_ws(dense(DType::f16, 2, 640, 640, 16, 1, 64, 64, MaskKind::none));
  expect_ws(dense(DType::bf16, 3, 333, 400, 8, 1, 64, 64, MaskKind::causal_bottom_right));
}

// Head dims of each bucket below its width (and d_qk != d_v): TMA zero-fills the columns past
// d (in the 64 bucket down to d 8, where the 64-column box is mostly past d).
TEST(CudaWsForward, HeadDimsOfTheBucket) {
  SKIP_UNLESS_SM90A();
  for (const auto& d : {std::pair<std::int64_t, std::int64_t>{72, 72},
                        {96, 96},
                        {120, 120},
                        {64, 128},
                        {128, 80},
                        {32, 32},
                        {40, 40},
                        {48, 48},
                        {8, 8},
                        {56, 56},
                        {64, 32},
                        {48, 64},
                        {136, 136},
                        {160, 160},
                        {192, 128},
                        {200, 256},
                        {256, 192}}) {
    SCOPED_TRACE(::testing::Message() << "d_qk " << d.first << " d_v " << d.second);
    expect_ws(dense(DType::bf16, 2, 150, 190, 4, 2, d.first, d.second, MaskKind::causal));
  }
}

// Every dense named layout: transposed buffers, the splits of packed QKV / KV buffers and of
// the fused [s, b, h + 2 hg, d] projection (the seed case's layout, at d = 128).
TEST(CudaWsForward, EveryDenseLayout) {
  SKIP_UNLESS_SM90A();
  for (const std::string& l : strideattn::harness::layout_names()) {
    if (l[0] == 't') continue;  // varlen layouts: not covered (the plan says so)
    SCOPED_TRACE(l);
    const bool packed_qkv = l.find('3') != std::string::npos;
    const bool fused = l.find("(h") != std::string::npos;
    const std::int64_t hg = packed_qkv ? 4 : 2;
    for (std::int64_t d : kBucketDims)
      expect_ws(dense(DType::bf16, 2, 190, packed_qkv || fused ? 190 : 260, 4, hg, d, d, MaskKind::causal, -1, -1,
                      false, l.c_str()));
  }
}

// Views TMA cannot read (a base 10 bytes past a 16-byte boundary, a head stride of d + 1
// elements): the plan falls back to the bucket's other forward, says why, and the answer is
// right.
TEST(CudaWsForward, UnalignedViewsFallBack) {
  SKIP_UNLESS_SM90A();
  for (const std::int64_t d : kBucketDims) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    const std::int64_t b = 2, s = 150, h = 4;
    const CaseSpec base = dense(DType::bf16, b, s, s, h, h, d, d, MaskKind::causal);
    expect_ws(with_views(base,
                         [&](const char* n, std::int64_t hh) {
                           return ViewSpec{n, 5, {b, s, hh, d}, {s * hh * d, hh * d, d, 1}};
                         }),
              false);
    expect_ws(with_views(base,
                         [&](const char* n, std::int64_t hh) {
                           return ViewSpec{n, 0, {b, s, hh, d}, {s * hh * (d + 1), hh * (d + 1), d + 1, 1}};
                         }),
              false);
  }
}

// The checks catch a wrong element, an unwritten one (the poison put back) and a write past
// the end, on the new kernel's outputs.
TEST(CudaWsForward, PlantedErrorsAreCaught) {
  SKIP_UNLESS_SM90A();
  struct P {
    const char* kind;
    const char* tensor;
    double delta;
  };
  for (std::int64_t d : kBucketDims)
    for (WsSchedule schedule : kSchedules)
      for (const P& p : {P{"value", "o", 0.25}, P{"unwritten", "o", 0}, P{"value", "lse", 0.25}, P{"guard", "o", 0}}) {
        SCOPED_TRACE(::testing::Message() << p.kind << " " << p.tensor << ", " << to_string(schedule) << ", d " << d);
        CaseSpec c = dense(DType::bf16, 2, 200, 300, 4, 2, d, d, MaskKind::causal, -1, -1, false);
        c.plant = CaseSpec::Plant{p.kind, p.tensor, 7, p.delta};
        ASSERT_TRUE(strideattn::harness::make_layout_views(c.layout_name, c.sizes, &c.views).ok());
        const ScopedCudaPlanForcing forced(forcing(schedule));
        CaseReport report;
        const std::string log = debug_log_of([&] {
          const strideattn::Status st = strideattn::harness::run_case(c, {Backend::cuda}, &report);
          ASSERT_TRUE(st.ok()) << st.message();
        });
        EXPECT_NE(log.find(ran_marker(schedule)), std::string::npos) << log;
        ASSERT_EQ(report.backends.size(), 1u);
        const auto& r = report.backends[0];
        EXPECT_TRUE(r.status == "mismatch" || !r.written_ok || !r.guard_ok) << r.status << ": " << r.reason;
      }
}

// ------------------------------------------------------------------ public API, device buffers

using strideattn::test_support::DeviceBuffer;

// A bf16 forward [b, s, h, d] / [b, s, hg, d], contiguous bshd, on device buffers.
struct ForwardCase {
  std::int64_t b, s, h, hg, d;
  std::mt19937_64 rng{12345};
  DeviceBuffer q, k, v, o;
  float* lse = nullptr;
  strideattn::ForwardArgs args;
  ForwardCase(std::int64_t b_, std::int64_t s_, std::int64_t h_, std::int64_t hg_, std::int64_t d_, MaskKind m)
      : b(b_),
        s(s_),
        h(h_),
        hg(hg_),
        d(d_),
        q(std::size_t(b * s * h * d), &rng),
        k(std::size_t(b * s * hg * d), &rng),
        v(std::size_t(b * s * hg * d), &rng),
        o(std::size_t(b * s * h * d)) {
    EXPECT_EQ(cudaMalloc(&lse, std::size_t(b * h * s) * sizeof(float)), cudaSuccess);
    auto view = [&](void* ptr, std::int64_t heads) {
      strideattn::TensorView t;
      t.data = ptr, t.dtype = DType::bf16;
      t.shape = {b, s, heads, d};
      t.stride = {s * heads * d, heads * d, d, 1};
      return t;
    };
    args.q = view(q.ptr, h), args.k = view(k.ptr, hg), args.v = view(v.ptr, hg), args.o = view(o.ptr, h);
    args.lse.data = lse;
    args.lse.shape = {b, h, s};
    args.lse.stride = {h * s, s, 1};
    args.options.mask = m;
    args.backend = Backend::cuda;
    args.memory = strideattn::Memory::device;
  }
  ~ForwardCase() { cudaFree(lse); }
  void run() {
    const strideattn::Status st = strideattn::forward(args);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  [[nodiscard]] std::vector<float> lse_values() const {
    std::vector<float> host(std::size_t(b * h * s));
    EXPECT_EQ(cudaMemcpy(host.data(), lse, host.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  [[nodiscard]] double flops() const {  // 4 d per visible (query, key) pair
    const double pairs = args.options.mask == MaskKind::none ? double(s) * double(s) : double(s) * double(s + 1) / 2;
    return 4.0 * double(d) * pairs * double(b * h);
  }
};

// Rows over more than kFoldKeys keys (the overlapped schedule's fold instantiation, the plan's
// default there): O and l go to the warp's global slot every kFoldKeys keys and are merged at
// the end (common/outer_accumulator.cuh). Random inputs over 17,000-20,000 keys, masks whose
// rows see from a few keys to all of them, a 9,000-key window, GQA, a head dim under the
// bucket's, both buckets, against the fp64 reference; the log shows the fold ran in the
// warp-specialized kernel. The other schedules refuse such problems (long_keys) and the
// bucket's other forward runs.
TEST(CudaWsForward, LongKeyRangesFold) {
  SKIP_UNLESS_SM90A();
  const CaseSpec cases[] = {
      dense(DType::bf16, 1, 70, 20000, 4, 2, 128, 128, MaskKind::causal_bottom_right),
      dense(DType::f16, 2, 40, 17000, 2, 1, 128, 128, MaskKind::none),
      dense(DType::bf16, 1, 300, 16500, 8, 2, 96, 96, MaskKind::none),
      dense(DType::bf16, 1, 40, 20000, 2, 1, 128, 128, MaskKind::none, 9000, 0),
      dense(DType::bf16, 1, 70, 20000, 4, 1, 64, 64, MaskKind::causal_bottom_right),
      dense(DType::f16, 1, 300, 16500, 8, 2, 48, 48, MaskKind::none),
      dense(DType::bf16, 1, 40, 17000, 2, 1, 256, 256, MaskKind::causal_bottom_right),
  };
  for (const CaseSpec& spec : cases) {
    CaseSpec c = spec;
    c.grad = false;
    SCOPED_TRACE(::testing::Message() << strideattn::to_string(c.dtype) << " " << c.sizes.s_q << "x" << c.sizes.s_kv
                                      << " d " << c.sizes.d_qk);
    {
      const std::string log = debug_log_of([&] { strideattn::test_support::expect_backend_ok(Backend::cuda, c); });
      EXPECT_NE(log.find(ran_marker(WsSchedule::overlapped)), std::string::npos) << log;
      EXPECT_NE(log.find("(folding every 8192 keys)"), std::string::npos) << log;
    }
    const ScopedCudaPlanForcing forced(forcing(WsSchedule::ping_pong));
    const std::string log = debug_log_of([&] { strideattn::test_support::expect_backend_ok(Backend::cuda, c); });
    EXPECT_NE(log.find(fallback_marker(c.sizes.d_qk)), std::string::npos) << log;
    EXPECT_NE(log.find("warp-specialized forward not run: long_keys"), std::string::npos) << log;
  }
}

// The same math in the same order as the wgmma forward (S = Q K^T k-steps, the softmax code,
// O += P V k-steps; only the loads differ): O and LSE equal bit for bit.
TEST(CudaWsForward, EqualsTheWgmmaForwardBitForBit) {
  SKIP_UNLESS_SM90A();
  for (std::int64_t d : {128, 256})
    for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
      SCOPED_TRACE(::testing::Message() << "d " << d);
      ForwardCase c(2, 777, 8, 2, d, m);
      const std::string def_log = debug_log_of([&] {
        const ScopedCudaPlanForcing wgmma(PlanForcing{.ws_forward = false});
        c.run();
      });
      EXPECT_NE(def_log.find("; forward: sm90a wgmma forward"), std::string::npos) << def_log;
      EXPECT_NE(def_log.find("warp-specialized forward not run: forced_off"), std::string::npos) << def_log;
      const std::vector<std::uint16_t> o_ref = c.o.bytes();
      const std::vector<float> lse_ref = c.lse_values();
      for (WsSchedule schedule : kSchedules) {
        SCOPED_TRACE(::testing::Message() << to_string(schedule) << " consumers");
        ASSERT_EQ(cudaMemset(c.o.ptr, 0xff, c.o.elems * 2), cudaSuccess);  // poison (NaN)
        ASSERT_EQ(cudaMemset(c.lse, 0xff, lse_ref.size() * sizeof(float)), cudaSuccess);
        {
          const ScopedCudaPlanForcing forced(forcing(schedule));
          const std::string log = debug_log_of([&] { c.run(); });
          EXPECT_NE(log.find(ran_marker(schedule)), std::string::npos) << log;
        }
        const std::vector<std::uint16_t> o_ws = c.o.bytes();
        const std::vector<float> lse_ws = c.lse_values();
        std::size_t differ = 0;
        for (std::size_t i = 0; i < o_ws.size(); ++i) differ += o_ws[i] != o_ref[i];
        EXPECT_EQ(differ, 0u) << "O elements that differ from the wgmma forward's (mask " << int(m) << ")";
        EXPECT_EQ(std::memcmp(lse_ws.data(), lse_ref.data(), lse_ws.size() * sizeof(float)), 0) << "LSE differs";
        bool nonzero = false;
        for (std::uint16_t x : o_ws) nonzero |= (x & 0x7fff) != 0;
        EXPECT_TRUE(nonzero) << "O is all zero: the comparison would pass vacuously";
      }
    }
}

// The 64 bucket has no wgmma forward to compare with (its other forward is the mma.sync one,
// whose MMAs and tiles sum in another order: it is checked against the reference above, not
// bit for bit). Its three schedules run the same math in the same order (plain: the sums
// O = (O alpha_j + P_j V_j) one block after another; overlapped and ping-pong only move the
// issues): O and LSE equal the plain schedule's bit for bit, at d 64 and at d 40.
TEST(CudaWsForward, D64SchedulesAgreeBitForBit) {
  SKIP_UNLESS_SM90A();
  for (std::int64_t d : {64, 40})
    for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
      SCOPED_TRACE(::testing::Message() << "d " << d << " mask " << int(m));
      ForwardCase c(2, 777, 8, 2, d, m);
      {
        const ScopedCudaPlanForcing forced(forcing(WsSchedule::plain));
        const std::string log = debug_log_of([&] { c.run(); });
        EXPECT_NE(log.find(ran_marker(WsSchedule::plain)), std::string::npos) << log;
      }
      const std::vector<std::uint16_t> o_ref = c.o.bytes();
      const std::vector<float> lse_ref = c.lse_values();
      bool nonzero = false;
      for (std::uint16_t x : o_ref) nonzero |= (x & 0x7fff) != 0;
      EXPECT_TRUE(nonzero) << "O is all zero: the comparison would pass vacuously";
      for (WsSchedule schedule : {WsSchedule::overlapped, WsSchedule::ping_pong}) {
        SCOPED_TRACE(::testing::Message() << to_string(schedule) << " consumers");
        ASSERT_EQ(cudaMemset(c.o.ptr, 0xff, c.o.elems * 2), cudaSuccess);  // poison (NaN)
        ASSERT_EQ(cudaMemset(c.lse, 0xff, lse_ref.size() * sizeof(float)), cudaSuccess);
        {
          const ScopedCudaPlanForcing forced(forcing(schedule));
          const std::string log = debug_log_of([&] { c.run(); });
          EXPECT_NE(log.find(ran_marker(schedule)), std::string::npos) << log;
        }
        const std::vector<std::uint16_t> o_ws = c.o.bytes();
        const std::vector<float> lse_ws = c.lse_values();
        std::size_t differ = 0;
        for (std::size_t i = 0; i < o_ws.size(); ++i) differ += o_ws[i] != o_ref[i];
        EXPECT_EQ(differ, 0u) << "O elements that differ from the plain schedule's";
        EXPECT_EQ(std::memcmp(lse_ws.data(), lse_ref.data(), lse_ws.size() * sizeof(float)), 0) << "LSE differs";
      }
    }
}

// ------------------------------------------------------------------ training features

// What the log line says when a forward ran a features variant (Variant::mods).
constexpr const char* kModsMarker = "; the training features' kernel variant";

// Which features a case asks for (cuda_features_test.cpp's, with the bias and dropout).
struct Feat {
  const char* name = "";
  double softcap = 0;
  std::int64_t alibi_rows = 0;  // 0, 1, or -1: b
  bool sinks = false, max_logit = false;
  BiasType bias = BiasType::none;
  double dropout = 0;
};
const Feat kEachFeature[] = {{.name = "softcap", .softcap = 2.5},
                             {.name = "alibi", .alibi_rows = 1},
                             {.name = "alibi per batch", .alibi_rows = -1},
                             {.name = "sinks", .sinks = true},
                             {.name = "max logit", .max_logit = true},
                             {.name = "post-scale bias", .bias = BiasType::post_scale},
                             {.name = "pre-scale bias", .bias = BiasType::pre_scale},
                             {.name = "dropout 0.1", .dropout = 0.1},
                             {.name = "dropout 0.5", .dropout = 0.5}};
const Feat kAllFeatures{.name = "all",
                        .softcap = 5.0,
                        .alibi_rows = 1,
                        .sinks = true,
                        .max_logit = true,
                        .bias = BiasType::post_scale,
                        .dropout = 0.1};

// `s` (forward only) with the features of `f`: the bias [1, h, s_q, s_kv] bf16 (broadcast
// over the batch), dropout with a seed and an offset whose b * h + head carries.
CaseSpec with_features(CaseSpec s, const Feat& f) {
  s.grad = false;
  s.options.softcap = f.softcap;
  s.features.alibi_rows = f.alibi_rows < 0 ? s.sizes.batch : f.alibi_rows;
  s.features.sinks = f.sinks;
  s.features.max_logit = f.max_logit;
  if (f.bias != BiasType::none) {
    const auto& z = s.sizes;
    s.features.bias =
        ViewSpec{"bias", 0, {1, z.heads, z.s_q, z.s_kv}, {z.heads * z.s_q * z.s_kv, z.s_q * z.s_kv, z.s_kv, 1}};
    s.features.bias_dtype = DType::bf16;
    s.options.bias_type = f.bias;
  }
  if (f.dropout > 0) s.options.dropout = {f.dropout, 0x0123456789abcdefull, 0xfffffffffffffffdull, nullptr, nullptr};
  // logits of a few units (the softcap bends, the sinks matter), as cuda_features_test.cpp's
  s.input_scale = 1.5;
  return s;
}

// `spec` (with features) on cuda as the plan chooses, or under `forced`: passes the
// correctness rule with every expected output checked (O, LSE, the max logit where asked),
// and the log shows which forward ran: the overlapped schedule's features instantiation
// (`ws` true) or the wgmma forward's features variant with the `features` rule named.
void expect_features_ok(CaseSpec spec, bool ws = true, PlanForcing forced = {}) {
  ASSERT_TRUE(strideattn::harness::make_layout_views(spec.layout_name, spec.sizes, &spec.views).ok());
  CaseReport report;
  const ScopedCudaPlanForcing forcing_scope(forced);
  const std::string log = debug_log_of([&] {
    const strideattn::Status st = strideattn::harness::run_case(spec, {Backend::cuda}, &report);
    ASSERT_TRUE(st.ok()) << st.message();
  });
  const std::string repro = strideattn::harness::reproducer(spec, {Backend::cuda});
  ASSERT_EQ(report.backends.size(), 1u);
  const auto& r = report.backends[0];
  EXPECT_EQ(r.status, "ok") << r.reason << "\n  " << repro;
  EXPECT_TRUE(r.guard_ok) << repro;
  EXPECT_TRUE(r.written_ok) << repro;
  std::vector<std::string> checked, want{"lse", "o"};
  for (const auto& c : r.checks) checked.push_back(c.name);
  if (spec.features.max_logit) want.push_back("max_logit");
  std::sort(checked.begin(), checked.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(checked, want) << repro;
  EXPECT_NE(log.find(kModsMarker), std::string::npos) << log;
  if (ws) {
    EXPECT_NE(log.find(ran_marker(WsSchedule::overlapped)), std::string::npos) << log;
  } else {
    EXPECT_NE(log.find(fallback_marker(std::max(spec.sizes.d_qk, spec.sizes.d_v))), std::string::npos) << log;
    EXPECT_NE(log.find("warp-specialized forward not run: features"), std::string::npos) << log;
  }
}

TEST(CudaWsForward, FeaturesEachAloneAndAllTogether) {
  SKIP_UNLESS_SM90A();
  std::vector<Feat> feats(std::begin(kEachFeature), std::end(kEachFeature));
  feats.push_back(kAllFeatures);
  for (std::int64_t d : kBucketDims)
    for (DType t : {DType::bf16, DType::f16})
      for (const Feat& f : feats)
        for (const auto& [sq, skv, m] :
             {std::tuple{257, 513, MaskKind::causal}, std::tuple{300, 200, MaskKind::none}}) {
          SCOPED_TRACE(::testing::Message()
                       << f.name << " " << strideattn::to_string(t) << " " << sq << "x" << skv << " d " << d);
          expect_features_ok(with_features(dense(t, 2, sq, skv, 4, 2, d, d, m), f));
        }
}

// Every feature at once over masks, windows (rows that see no key keep O = 0, LSE = -inf
// with a sink), sizes off the tiles, GQA 8:1, MQA, head dims of the bucket below 128.
TEST(CudaWsForward, FeaturesMasksWindowsGqaAndHeadDims) {
  SKIP_UNLESS_SM90A();
  const std::int64_t shapes[][2] = {{77, 77}, {50, 300}, {300, 50}, {1, 129}, {1000, 1000}};
  for (MaskKind m : kMasks)
    for (const auto& sh : shapes) {
      SCOPED_TRACE(::testing::Message() << "mask " << int(m) << " " << sh[0] << "x" << sh[1]);
      expect_features_ok(with_features(dense(DType::bf16, 2, sh[0], sh[1], 4, 2, 128, 128, m), kAllFeatures));
    }
  const std::int64_t windows[][2] = {{0, 0}, {7, 3}, {-1, 50}, {200, 0}, {3, 400}};
  for (MaskKind m : {MaskKind::none, MaskKind::causal_bottom_right})
    for (const auto& w : windows) {
      SCOPED_TRACE(::testing::Message() << "mask " << int(m) << " window " << w[0] << "," << w[1]);
      expect_features_ok(
          with_features(dense(DType::f16, 2, 300, 500, 4, 4, 128, 128, m, w[0], w[1], false), kAllFeatures));
    }
  expect_features_ok(with_features(dense(DType::bf16, 3, 333, 400, 8, 1, 128, 128, MaskKind::causal_bottom_right),
                                   kAllFeatures));  // GQA 8:1
  expect_features_ok(
      with_features(dense(DType::f16, 2, 200, 200, 16, 1, 128, 128, MaskKind::none), kAllFeatures));  // MQA
  for (const auto& d :
       {std::pair<std::int64_t, std::int64_t>{96, 96}, {64, 128}, {128, 80}, {64, 64}, {40, 40}, {32, 64}}) {
    SCOPED_TRACE(::testing::Message() << "d_qk " << d.first << " d_v " << d.second);
    expect_features_ok(
        with_features(dense(DType::bf16, 2, 150, 190, 4, 2, d.first, d.second, MaskKind::causal), kAllFeatures));
  }
  // the 64 bucket: every feature over the masks and the seed's MQA 16/1
  for (MaskKind m : kMasks)
    expect_features_ok(with_features(dense(DType::bf16, 2, 300, 500, 4, 2, 64, 64, m), kAllFeatures));
  expect_features_ok(
      with_features(dense(DType::f16, 2, 400, 400, 16, 1, 64, 64, MaskKind::causal), kAllFeatures));  // MQA
  // a forced ping-pong or plain schedule has no features instantiation: the bucket's other
  // forward's features variant runs, the log naming the rule
  for (std::int64_t d : kBucketDims)
    for (WsSchedule other : {WsSchedule::ping_pong, WsSchedule::plain})
      expect_features_ok(with_features(dense(DType::bf16, 2, 257, 513, 4, 2, d, d, MaskKind::causal), kAllFeatures),
                         false, PlanForcing{.ws_schedule = other});
}

// The checks catch a wrong element, an unwritten one and a write past the end on the
// features instantiation's outputs, the max logit among them.
TEST(CudaWsForward, FeaturesPlantedErrorsAreCaught) {
  SKIP_UNLESS_SM90A();
  struct P {
    const char* kind;
    const char* tensor;
    double delta;
  };
  for (std::int64_t d : kBucketDims)
    for (const P& p : {P{"value", "o", 0.25}, P{"unwritten", "o", 0}, P{"value", "lse", 0.25},
                       P{"value", "max_logit", 0.25}, P{"guard", "o", 0}}) {
      SCOPED_TRACE(::testing::Message() << p.kind << " " << p.tensor << ", d " << d);
      CaseSpec c = with_features(dense(DType::bf16, 2, 200, 300, 4, 2, d, d, MaskKind::causal), kAllFeatures);
      c.plant = CaseSpec::Plant{p.kind, p.tensor, 7, p.delta};
      ASSERT_TRUE(strideattn::harness::make_layout_views(c.layout_name, c.sizes, &c.views).ok());
      CaseReport report;
      const std::string log = debug_log_of([&] {
        const strideattn::Status st = strideattn::harness::run_case(c, {Backend::cuda}, &report);
        ASSERT_TRUE(st.ok()) << st.message();
      });
      EXPECT_NE(log.find(ran_marker(WsSchedule::overlapped)), std::string::npos) << log;
      EXPECT_NE(log.find(kModsMarker), std::string::npos) << log;
      ASSERT_EQ(report.backends.size(), 1u);
      const auto& r = report.backends[0];
      EXPECT_TRUE(r.status == "mismatch" || !r.written_ok || !r.guard_ok) << r.status << ": " << r.reason;
    }
}

// fp32 device buffer of `n` values (from `fill`).
struct DeviceFloats {
  float* ptr = nullptr;
  std::size_t n = 0;
  DeviceFloats(std::size_t n_, const std::vector<float>& fill) : n(n_) {
    EXPECT_EQ(cudaMalloc(&ptr, n * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, fill.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(ptr); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  [[nodiscard]] std::vector<float> values() const {
    std::vector<float> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

// The features instantiation applies the wgmma forward's functions to the same fragments in
// the same order (score_mod, mask, softmax, dropout's keep, the sink, the max logit): O, LSE
// and the max logit equal its features variant's bit for bit, with dropout on (same seed and
// offset) and every other feature at once, then with the pre-scale bias and dropout 0.5.
TEST(CudaWsForward, FeaturesEqualTheWgmmaForwardBitForBit) {
  SKIP_UNLESS_SM90A();
  for (std::int64_t d : {128, 256})
    for (const bool all : {true, false})
      for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
        SCOPED_TRACE(::testing::Message()
                     << (all ? "every feature" : "pre-scale bias, dropout 0.5") << ", mask " << int(m) << ", d " << d);
        ForwardCase c(2, 777, 8, 2, d, m);
        const std::int64_t b = c.b, h = c.h, s = c.s;
        const auto nh = static_cast<std::size_t>(h);
        std::vector<float> slopes(nh), sinks(nh);
        std::normal_distribution<float> normal(0.f, 1.f);
        for (std::size_t i = 0; i < slopes.size(); ++i) slopes[i] = 0.5f / float(i + 1), sinks[i] = normal(c.rng);
        DeviceFloats alibi(nh, slopes), sink(nh, sinks);
        DeviceFloats max_logit(std::size_t(b * h), std::vector<float>(std::size_t(b * h), 0.f));
        DeviceBuffer bias(std::size_t(h * s * s), &c.rng);
        c.args.bias = {bias.ptr, DType::bf16, {1, h, s, s}, {h * s * s, s * s, s, 1}};
        c.args.options.bias_type = all ? BiasType::post_scale : BiasType::pre_scale;
        c.args.options.dropout = {all ? 0.1 : 0.5, 0x0123456789abcdefull, 0xfffffffffffffffdull, nullptr, nullptr};
        if (all) {
          c.args.options.softcap = 5.0;
          c.args.alibi_slopes = {alibi.ptr, {1, h}, {h, 1}};
          c.args.sinks = {sink.ptr, {1, h}, {h, 1}};
          c.args.max_logit = {max_logit.ptr, {b, h}, {h, 1}};
        }
        const std::string def_log = debug_log_of([&] {
          const ScopedCudaPlanForcing wgmma(PlanForcing{.ws_forward = false});
          c.run();
        });
        EXPECT_NE(def_log.find("; forward: sm90a wgmma forward"), std::string::npos) << def_log;
        EXPECT_NE(def_log.find(kModsMarker), std::string::npos) << def_log;
        const std::vector<std::uint16_t> o_ref = c.o.bytes();
        const std::vector<float> lse_ref = c.lse_values(), max_ref = max_logit.values();
        ASSERT_EQ(cudaMemset(c.o.ptr, 0xff, c.o.elems * 2), cudaSuccess);  // poison (NaN)
        ASSERT_EQ(cudaMemset(c.lse, 0xff, lse_ref.size() * sizeof(float)), cudaSuccess);
        ASSERT_EQ(cudaMemset(max_logit.ptr, 0xff, max_ref.size() * sizeof(float)), cudaSuccess);
        const std::string log = debug_log_of([&] { c.run(); });  // (the plan's choice)
        EXPECT_NE(log.find(ran_marker(WsSchedule::overlapped)), std::string::npos) << log;
        EXPECT_NE(log.find(kModsMarker), std::string::npos) << log;
        const std::vector<std::uint16_t> o_ws = c.o.bytes();
        const std::vector<float> lse_ws = c.lse_values();
        std::size_t differ = 0;
        for (std::size_t i = 0; i < o_ws.size(); ++i) differ += o_ws[i] != o_ref[i];
        EXPECT_EQ(differ, 0u) << "O elements that differ from the wgmma forward's";
        EXPECT_EQ(std::memcmp(lse_ws.data(), lse_ref.data(), lse_ws.size() * sizeof(float)), 0) << "LSE differs";
        bool nonzero = false;
        for (std::uint16_t x : o_ws) nonzero |= (x & 0x7fff) != 0;
        EXPECT_TRUE(nonzero) << "O is all zero: the comparison would pass vacuously";
        if (all) {
          const std::vector<float> max_ws = max_logit.values();
          EXPECT_EQ(std::memcmp(max_ws.data(), max_ref.data(), max_ws.size() * sizeof(float)), 0)
              << "max logit differs";
          for (float x : max_ref) EXPECT_TRUE(std::isfinite(x)) << "max logit " << x;  // (written: not the poison)
        }
      }
}

// Time the bucket's other forward (forced: wgmma at d 128, mma.sync at d 64) against the
// warp-specialized instantiations, bf16, no mask and causal, on the benchmark's shapes (s 1k
// to 8k, MHA 16 heads and GQA 64/8; at d 64 also the seed's MQA 16/1, s 2048). Prints TFLOP/s; asserts nothing about
// speed (a diagnostic; bench/compare_sdpa.py makes the claims). Run with --gtest_also_run_disabled_tests
// --gtest_filter='*Timing*'.
TEST(CudaWsForward, DISABLED_Timing) {
  SKIP_UNLESS_SM90A();
  struct Shape {
    std::int64_t b, s, h, hg, d;
  };
  for (const Shape sh : {Shape{16, 1024, 16, 16, 128}, Shape{8, 2048, 16, 16, 128}, Shape{4, 4096, 16, 16, 128},
                         Shape{2, 8192, 16, 16, 128}, Shape{2, 8192, 64, 8, 128}, Shape{8, 2048, 16, 1, 64},
                         Shape{16, 1024, 16, 16, 64}, Shape{8, 2048, 16, 16, 64}, Shape{4, 4096, 16, 16, 64},
                         Shape{2, 8192, 16, 16, 64}, Shape{8, 2048, 16, 16, 256}, Shape{4, 4096, 16, 16, 256}})
    for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
      ForwardCase c(sh.b, sh.s, sh.h, sh.hg, sh.d, m);
      auto time_ms = [&] {
        c.run();  // (checked)
        return strideattn::test_support::event_ms_per_call([&] { (void)strideattn::forward(c.args); }, 4, 30);
      };
      double other = 0;
      {
        const ScopedCudaPlanForcing off(PlanForcing{.ws_forward = false});
        other = time_ms();
      }
      double ws[3] = {0, 0, 0};
      for (WsSchedule schedule : kSchedules) {
        const ScopedCudaPlanForcing forced(forcing(schedule));
        const std::string log = debug_log_of([&] { c.run(); });
        EXPECT_NE(log.find(ran_marker(schedule)), std::string::npos) << log;
        ws[int(schedule)] = time_ms();
      }
      const double gflop = c.flops() * 1e-9;
      std::printf("bf16 b %lld h %lld/%lld s %lld d %lld %s: %s forward %.3f ms %.1f TFLOP/s", (long long)sh.b,
                  (long long)sh.h, (long long)sh.hg, (long long)sh.s, (long long)sh.d,
                  m == MaskKind::none ? "none  " : "causal", sh.d <= 64 ? "mma.sync" : "wgmma", other, gflop / other);
      for (WsSchedule schedule : kSchedules)
        std::printf("; %s %.3f ms %.1f TFLOP/s (%.2fx)", to_string(schedule), ws[int(schedule)],
                    gflop / ws[int(schedule)], other / ws[int(schedule)]);
      std::printf("\n");
    }
}

}  // namespace
