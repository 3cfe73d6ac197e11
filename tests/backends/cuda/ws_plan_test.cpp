// The warp-specialized sm_90a forward's place in make_cuda_plan, without a GPU (part of
// cuda_plan_test): its kernel table entries per dtype, bucket (d <= 64, 128, 256) and consumer
// schedule, the default plan running it wherever it covers the problem with the bucket's other
// forward as fallback, the test hook keeping it off or picking a schedule, the fold and the
// training features' instantiations, and each rule that keeps it off named.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/device_presets.hpp"
#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/launch.hpp"
#include "backends/cuda/plan.hpp"
#include "backends/cuda/plan_problems.hpp"
#include "backends/cuda/test_hook.hpp"
#include "problem/problem.hpp"

namespace {

using strideattn::DType;
using strideattn::detail::Direction;
using strideattn::detail::Problem;
using namespace strideattn::cuda_impl;
using namespace strideattn::cuda_impl::test_devices;
using namespace strideattn::cuda_impl::test_problems;

// The warp-specialized TMA forward (sm90/ws_forward.cuh): one entry per dtype and schedule at
// d <= 128 (d <= 64 and d <= 256: the tests below), sm90a, which find_kernel
// never returns; the default plan runs its overlapped instantiation
// wherever it covers the problem, with the wgmma forward as its fallback, the test hook keeps
// it off or picks the plain one, and every problem it does not cover keeps the wgmma forward
// with the rule named.
TEST(CudaPlan, WarpSpecializedForwardWhereItCovers) {
  for (DType t : {DType::f16, DType::bf16}) {
    const KernelEntry* e = find_ws_forward(t, 128, WsSchedule::plain);
    ASSERT_NE(e, nullptr);
    EXPECT_TRUE(e->tma);
    EXPECT_EQ(e->arch, Arch::sm90a);
    EXPECT_EQ(e->pass, Pass::forward);
    EXPECT_EQ(e->threads, ws_forward_tile(128).threads);
    EXPECT_EQ(e->smem_bytes, ws_forward_tile(128).smem_bytes);
    EXPECT_NE(e->guarded, nullptr);
    const KernelEntry* overlapped = find_ws_forward(t, 128, WsSchedule::overlapped);
    const KernelEntry* ping_pong = find_ws_forward(t, 128, WsSchedule::ping_pong);
    ASSERT_NE(ping_pong, nullptr);
    EXPECT_TRUE(ping_pong->tma && ping_pong->ws_schedule == WsSchedule::ping_pong);
    EXPECT_NE(ping_pong->guarded, overlapped->guarded);
    ASSERT_NE(overlapped, nullptr);
    EXPECT_TRUE(overlapped->tma && overlapped->ws_schedule == WsSchedule::overlapped &&
                e->ws_schedule == WsSchedule::plain);
    EXPECT_NE(overlapped->guarded, e->guarded);
    EXPECT_EQ(overlapped->smem_bytes, e->smem_bytes);
    EXPECT_FALSE(find_kernel(t, Arch::sm90a, 128, Pass::forward, 1 << 30)->tma);
  }
  const PlanForcing on{.ws_forward = true, .ws_schedule = WsSchedule::plain};
  auto starts_with = [](const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; };

  // forced off: the wgmma forward, and the note says why not the new one
  const Problem base = fwd(DType::bf16, 2, 1000, 8, 1, 128);
  const CudaPlan def = make_cuda_plan(base, kH200, PlanForcing{.ws_forward = false});
  ASSERT_TRUE(def.ok()) << def.error;
  EXPECT_FALSE(def.main.entry->tma);
  EXPECT_TRUE(starts_with(def.ws_note, "forced_off")) << def.ws_note;

  // the default: ping-pong up to kWsPingPongMaxKeys keys, overlapped beyond
  const CudaPlan auto_plan = make_cuda_plan(base, kH200);
  ASSERT_TRUE(auto_plan.ok()) << auto_plan.error;
  EXPECT_TRUE(auto_plan.main.entry->tma && auto_plan.main.entry->ws_schedule == WsSchedule::ping_pong)
      << auto_plan.ws_note;
  EXPECT_EQ(auto_plan.ws_note, "");
  EXPECT_EQ(name_of(auto_plan.ws_fallback), name_of(def.main));
  for (std::int64_t s : {kWsPingPongMaxKeys, kWsPingPongMaxKeys + 1}) {
    const CudaPlan at = make_cuda_plan(fwd(DType::f16, 1, s, 4, 4, 128), kH200);
    EXPECT_EQ(at.main.entry->ws_schedule, s <= kWsPingPongMaxKeys ? WsSchedule::ping_pong : WsSchedule::overlapped)
        << s;
  }

  // forced plain: the new kernel, its grid, the wgmma forward as fallback
  const CudaPlan ws = make_cuda_plan(base, kH200, on);
  ASSERT_TRUE(ws.ok()) << ws.error;
  EXPECT_TRUE(ws.main.entry->tma) << ws.ws_note;
  EXPECT_EQ(ws.ws_note, "");
  EXPECT_EQ(ws.main.variant, Variant::guarded);
  EXPECT_EQ(ws.main.grid.x, 8u);  // ceil(1000 / 128)
  EXPECT_EQ(ws.main.grid.y, 8u);
  EXPECT_EQ(ws.main.grid.z, 2u);
  EXPECT_EQ(ws.main.entry->ws_schedule, WsSchedule::plain);
  EXPECT_EQ(name_of(ws.ws_fallback), name_of(def.main));
  const CudaPlan ping_pong = make_cuda_plan(base, kH200, PlanForcing{.ws_schedule = WsSchedule::ping_pong});
  EXPECT_TRUE(ping_pong.main.entry->tma && ping_pong.main.entry->ws_schedule == WsSchedule::ping_pong);
  EXPECT_FALSE(make_cuda_plan(base, kH200, PlanForcing{.ws_forward = false, .ws_schedule = WsSchedule::ping_pong})
                   .main.entry->tma)
      << "forced off";
  EXPECT_EQ(ws.workspace.total, def.workspace.total);
  // head dims of the bucket below it run too (TMA zero-fills the columns past d)
  EXPECT_TRUE(
      make_cuda_plan(problem(Direction::forward, DType::f16, 1, 100, 300, 4, 4, 96, 128), kH200, on).main.entry->tma);

  // what keeps it off, each with its rule
  auto note_of = [&](const Problem& p, const DeviceCaps& caps = kH200) {
    const CudaPlan plan = make_cuda_plan(p, caps, on);
    EXPECT_TRUE(plan.ok()) << plan.error;
    EXPECT_TRUE(plan.main.entry == nullptr || !plan.main.entry->tma);
    return plan.ws_note;
  };
  // other architectures: their kernels, no note
  const CudaPlan a100 = make_cuda_plan(fwd(DType::bf16, 1, 500, 4, 4, 128), kA100, on);
  EXPECT_FALSE(a100.main.entry->tma);
  EXPECT_EQ(a100.ws_note, "");
  Problem long_keys = fwd(DType::bf16, 1, 9000, 2, 2, 128);
  EXPECT_TRUE(starts_with(note_of(long_keys), "long_keys")) << note_of(long_keys);
  // ... which the overlapped schedule (the default past kWsPingPongMaxKeys) has: its fold
  // instantiation, with a slot pool that covers the resident warps of it and of its fallback
  const CudaPlan folding = make_cuda_plan(long_keys, kH200);
  ASSERT_TRUE(folding.ok()) << folding.error;
  EXPECT_TRUE(folding.main.entry->tma && folding.main.entry->ws_schedule == WsSchedule::overlapped) << folding.ws_note;
  EXPECT_EQ(folding.main.variant, Variant::fold);
  EXPECT_NE(folding.main.entry->fold, nullptr);
  EXPECT_NE(folding.main.entry->fold, folding.main.entry->guarded);
  EXPECT_EQ(folding.ws_fallback.variant, Variant::fold);
  EXPECT_GE(folding.outer_count, make_cuda_plan(long_keys, kH200, PlanForcing{.ws_forward = false}).outer_count);
  EXPECT_GE(folding.outer_count, kH200.sms * folding.main.entry->threads / 32);  // one CTA per SM
  EXPECT_GT(folding.workspace.total, 0u);
  EXPECT_EQ(make_cuda_plan(fwd(DType::bf16, 1, 8192, 2, 2, 128), kH200).main.variant, Variant::guarded);
  EXPECT_TRUE(starts_with(note_of(long_keys), "long_keys"));
  {
    const CudaPlan pp = make_cuda_plan(long_keys, kH200, PlanForcing{.ws_schedule = WsSchedule::ping_pong});
    EXPECT_FALSE(pp.main.entry->tma);
    EXPECT_TRUE(starts_with(pp.ws_note, "long_keys")) << pp.ws_note;
  }
  // training features: the overlapped schedule's features instantiations (one alone: its
  // own, Variant::mods_softcap / mods_dropout; several: Variant::mods), the plan's schedule for
  // them at any key count up to kFoldKeys (ping-pong would be the default at these 1,000
  // keys), the wgmma forward's instantiation of the same features as fallback
  Problem capped = base;
  capped.softcap = 30;
  Problem dropping = base;
  dropping.dropout_p = 0.1;
  Problem both = capped;
  both.dropout_p = 0.1;
  const std::pair<Problem, Variant> feature_cases[] = {
      {capped, Variant::mods_softcap}, {dropping, Variant::mods_dropout}, {both, Variant::mods}};
  for (const auto& [feat, variant] : feature_cases) {
    const CudaPlan mods = make_cuda_plan(feat, kH200);
    ASSERT_TRUE(mods.ok()) << mods.error;
    EXPECT_EQ(mods.ws_note, "");
    ASSERT_TRUE(mods.main.entry->tma);
    EXPECT_EQ(mods.main.entry->ws_schedule, WsSchedule::overlapped);
    EXPECT_EQ(mods.main.variant, variant);
    EXPECT_NE(mods.main.kernel(), nullptr);
    EXPECT_NE(mods.main.kernel(), mods.main.entry->guarded);
    EXPECT_NE(mods.main.kernel(), mods.main.entry->fold);
    if (variant != Variant::mods) EXPECT_NE(mods.main.kernel(), mods.main.entry->mods);
    EXPECT_EQ(mods.outer_count, 0);
    EXPECT_EQ(mods.ws_fallback.variant, variant);  // (the wgmma forward's instantiation of it)
    EXPECT_EQ(name_of(mods.ws_fallback), name_of(def.main));
    EXPECT_EQ(mods.main.grid.x, ws.main.grid.x);
    EXPECT_EQ(mods.workspace.total, make_cuda_plan(feat, kH200, PlanForcing{.ws_forward = false}).workspace.total);
  }
  EXPECT_EQ(find_ws_forward(DType::bf16, 128, WsSchedule::plain)->mods, nullptr);
  EXPECT_EQ(find_ws_forward(DType::f16, 128, WsSchedule::ping_pong)->mods, nullptr);
  EXPECT_NE(find_ws_forward(DType::f16, 128, WsSchedule::overlapped)->mods, nullptr);
  // ... not in the other schedules (forced): `features`, the wgmma forward's feature variant
  EXPECT_TRUE(starts_with(note_of(capped), "features")) << note_of(capped);
  for (WsSchedule other : {WsSchedule::plain, WsSchedule::ping_pong}) {
    const CudaPlan forced = make_cuda_plan(capped, kH200, PlanForcing{.ws_schedule = other});
    ASSERT_TRUE(forced.ok()) << forced.error;
    EXPECT_FALSE(forced.main.entry->tma);
    EXPECT_EQ(forced.main.variant, Variant::mods_softcap);
    EXPECT_TRUE(starts_with(forced.ws_note, "features")) << forced.ws_note;
    EXPECT_NE(forced.ws_note.find(to_string(other)), std::string::npos) << forced.ws_note;
  }
  // ... nor with the fold (past kFoldKeys keys): the wgmma forward's, which folds
  {
    Problem long_capped = long_keys;
    long_capped.softcap = 30;
    const CudaPlan lc = make_cuda_plan(long_capped, kH200);
    ASSERT_TRUE(lc.ok()) << lc.error;
    EXPECT_FALSE(lc.main.entry->tma);
    EXPECT_EQ(lc.main.variant, Variant::mods_softcap);
    EXPECT_GT(lc.outer_count, 0);
    EXPECT_TRUE(starts_with(lc.ws_note, "features")) << lc.ws_note;
    EXPECT_NE(lc.ws_note.find("8192"), std::string::npos) << lc.ws_note;
    Problem at_limit = fwd(DType::bf16, 1, kFoldKeys, 2, 2, 128);
    at_limit.softcap = 30;
    const CudaPlan al = make_cuda_plan(at_limit, kH200);
    EXPECT_TRUE(al.main.entry->tma && al.main.variant == Variant::mods_softcap) << al.ws_note;
  }
  Problem vl = base;
  vl.varlen = true, vl.batch = 2, vl.seqlens_q = vl.seqlens_kv = {500, 400}, vl.offsets_q = vl.offsets_kv = {0, 500};
  EXPECT_TRUE(starts_with(note_of(vl), "varlen")) << note_of(vl);
  Problem odd = base;  // a head stride of 65 elements (130 bytes): not a multiple of 16
  odd.k.stride = {1000 * 65, 65, 65, 1};
  EXPECT_TRUE(starts_with(note_of(odd), "tma: k: token stride 65")) << note_of(odd);
  Problem reversed = base;
  reversed.v.stride[strideattn::kSeq] = -reversed.v.stride[strideattn::kSeq];
  EXPECT_TRUE(starts_with(note_of(reversed), "tma: v: token stride")) << note_of(reversed);
  Problem unaligned = base;
  static std::uint16_t buffer[16];
  unaligned.q.data = reinterpret_cast<std::uint8_t*>(buffer) + (16 - reinterpret_cast<std::uintptr_t>(buffer) % 16) + 8;
  EXPECT_TRUE(starts_with(note_of(unaligned), "tma: q: data pointer")) << note_of(unaligned);
  // the split of a fused QKV buffer [b, s, h + 2 hg, d] (strides that no layout name gives):
  // multiples of 16 bytes, so TMA reads it in place
  Problem fused = fwd(DType::bf16, 2, 256, 16, 1, 128);
  const std::int64_t row = (16 + 2) * 128;
  fused.q.stride = {256 * row, row, 128, 1};
  fused.k.stride = fused.v.stride = {256 * row, row, 128, 1};
  EXPECT_EQ(make_cuda_plan(fused, kH200, on).ws_note, "");
  // an extent-1 dimension may carry any stride
  Problem one = fwd(DType::bf16, 1, 300, 1, 1, 128);
  one.q.stride = {7, 128, 3, 1};
  one.k.stride = one.v.stride = {5, 128, -9, 1};
  EXPECT_EQ(make_cuda_plan(one, kH200, on).ws_note, "");
  // prepare_launch makes the tensor maps; where the driver cannot (a machine without one, as
  // CI's), the call keeps the fallback (here the wgmma forward) and says why
  const PreparedLaunch prep = prepare_launch(ws, base);
  if (prep.plan.main.entry->tma) {
    EXPECT_EQ(prep.plan.ws_note, "");
  } else {
    EXPECT_EQ(name_of(prep.plan.main), name_of(def.main));
    EXPECT_TRUE(starts_with(prep.plan.ws_note, "tma: q: ")) << prep.plan.ws_note;
  }
  // a backward plan never runs it, forced or not (its dK/dV pass is a backward kernel)
  const CudaPlan b = make_cuda_plan(bwd(DType::bf16, 1, 500, 4, 4, 128), kH200, on);
  EXPECT_TRUE(b.ok()) << b.error;
  EXPECT_EQ(b.main.entry->pass, Pass::dkdv);
  EXPECT_EQ(ws_forward_refusal(bwd(DType::bf16, 1, 500, 4, 4, 128), b, kH200, on).rfind("direction", 0), 0u);
}

// The d <= 64 bucket of the warp-specialized forward: one entry per dtype and schedule (the
// overlapped one with its fold and features instantiations), the 64 bucket's tile; the
// default plan runs it on the seed case (MQA 16/1, s 2048) and on head dims below 64 (TMA
// zero-fills the columns past d), with the mma.sync forward as its fallback; the rules still
// keep it off where they did at d 128, and an A100 runs its own kernels.
TEST(CudaPlan, WarpSpecializedForwardCoversTheD64Bucket) {
  for (DType t : {DType::f16, DType::bf16})
    for (WsSchedule s : {WsSchedule::plain, WsSchedule::overlapped, WsSchedule::ping_pong}) {
      SCOPED_TRACE(::testing::Message() << strideattn::to_string(t) << " " << to_string(s));
      const KernelEntry* e = find_ws_forward(t, 64, s);
      ASSERT_NE(e, nullptr);
      EXPECT_TRUE(e->tma);
      EXPECT_EQ(e->arch, Arch::sm90a);
      EXPECT_EQ(e->bucket, 64);
      EXPECT_EQ(e->ws_schedule, s);
      EXPECT_EQ(e->threads, ws_forward_tile(64).threads);
      EXPECT_EQ(e->smem_bytes, ws_forward_tile(64).smem_bytes);
      EXPECT_EQ(e->block_rows, 128);
      EXPECT_NE(e->guarded, nullptr);
      EXPECT_NE(e->guarded, find_ws_forward(t, 128, s)->guarded) << "its own instantiation";
      EXPECT_EQ(e->fold != nullptr, s == WsSchedule::overlapped);
      EXPECT_EQ(e->mods != nullptr, s == WsSchedule::overlapped);
    }
  auto starts_with = [](const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; };

  // the seed case: ping-pong (2,048 keys), the grid of 128-query blocks, the mma.sync forward
  // as fallback
  const Problem seed = fwd(DType::bf16, 8, 2048, 16, 1, 64);
  const CudaPlan plan = make_cuda_plan(seed, kH200);
  ASSERT_TRUE(plan.ok()) << plan.error;
  ASSERT_TRUE(plan.main.entry->tma) << plan.ws_note;
  EXPECT_EQ(plan.ws_note, "");
  EXPECT_EQ(plan.main.entry->bucket, 64);
  EXPECT_EQ(plan.main.entry->ws_schedule, WsSchedule::ping_pong);
  EXPECT_EQ(plan.main.variant, Variant::guarded);
  EXPECT_EQ(plan.main.grid.x, 16u);  // 2048 / 128
  EXPECT_EQ(plan.main.grid.y, 16u);
  EXPECT_EQ(plan.main.grid.z, 8u);
  const CudaPlan off = make_cuda_plan(seed, kH200, PlanForcing{.ws_forward = false});
  ASSERT_TRUE(off.ok()) << off.error;
  EXPECT_FALSE(off.main.entry->tma);
  EXPECT_EQ(name_of(off.main), "sm90a mma.sync forward");
  EXPECT_TRUE(starts_with(off.ws_note, "forced_off")) << off.ws_note;
  EXPECT_EQ(name_of(plan.ws_fallback), name_of(off.main));
  EXPECT_EQ(plan.workspace.total, off.workspace.total);
  EXPECT_EQ(make_cuda_plan(fwd(DType::f16, 1, 4096, 4, 4, 64), kH200).main.entry->ws_schedule, WsSchedule::overlapped);

  // head dims below the bucket, and d_qk != d_v inside it
  for (auto [d_qk, d_v] : {std::pair{32, 32}, std::pair{40, 40}, std::pair{48, 48}, std::pair{8, 8}, std::pair{64, 32},
                           std::pair{48, 64}}) {
    const CudaPlan p = make_cuda_plan(problem(Direction::forward, DType::f16, 2, 300, 500, 4, 2, d_qk, d_v), kH200);
    ASSERT_TRUE(p.ok()) << p.error;
    EXPECT_TRUE(p.main.entry->tma && p.main.entry->bucket == 64) << d_qk << " " << d_v << ": " << p.ws_note;
  }

  // past kFoldKeys keys: the overlapped schedule's fold; the slot pool covers the resident
  // warps of both kernels, each slot at least the 16 rows x 64 columns of a consumer warp
  const CudaPlan folding = make_cuda_plan(fwd(DType::bf16, 1, 9000, 2, 1, 64), kH200);
  ASSERT_TRUE(folding.ok()) << folding.error;
  ASSERT_TRUE(folding.main.entry->tma) << folding.ws_note;
  EXPECT_EQ(folding.main.entry->ws_schedule, WsSchedule::overlapped);
  EXPECT_EQ(folding.main.variant, Variant::fold);
  EXPECT_EQ(folding.main.kernel(), folding.main.entry->fold);
  EXPECT_GE(folding.outer_count, 132 * 12);  // one 12-warp CTA per SM
  EXPECT_GE(folding.outer_slot_floats, std::size_t(16 * 64));
  EXPECT_EQ(folding.ws_fallback.variant, Variant::fold);

  // training features: the overlapped schedule's features instantiation (the softcap's own)
  Problem capped = seed;
  capped.softcap = 30;
  const CudaPlan mods = make_cuda_plan(capped, kH200);
  ASSERT_TRUE(mods.ok()) << mods.error;
  ASSERT_TRUE(mods.main.entry->tma) << mods.ws_note;
  EXPECT_EQ(mods.main.entry->ws_schedule, WsSchedule::overlapped);
  EXPECT_EQ(mods.main.variant, Variant::mods_softcap);
  EXPECT_EQ(mods.main.kernel(), mods.main.entry->mods_single[1]);
  EXPECT_EQ(mods.ws_fallback.variant, Variant::mods);

  // the rules that kept it off at d 128 keep it off here, the mma.sync forward running
  auto note_of = [&](const Problem& p, const PlanForcing& forcing = {}) {
    const CudaPlan c = make_cuda_plan(p, kH200, forcing);
    EXPECT_TRUE(c.ok()) << c.error;
    EXPECT_EQ(name_of(c.main), "sm90a mma.sync forward") << c.ws_note;
    return c.ws_note;
  };
  Problem vl = fwd(DType::bf16, 2, 1000, 8, 1, 64);
  vl.varlen = true, vl.seqlens_q = vl.seqlens_kv = {500, 400}, vl.offsets_q = vl.offsets_kv = {0, 500};
  EXPECT_TRUE(starts_with(note_of(vl), "varlen")) << note_of(vl);
  Problem odd = fwd(DType::bf16, 1, 1000, 1, 1, 40);  // d 40, token stride 44: 88 bytes
  odd.k.stride = {1000 * 44, 44, 44, 1};
  EXPECT_TRUE(starts_with(note_of(odd), "tma: k: token stride 44")) << note_of(odd);
  Problem long_capped = fwd(DType::bf16, 1, 9000, 2, 1, 64);
  long_capped.softcap = 30;
  EXPECT_TRUE(starts_with(note_of(long_capped), "features")) << note_of(long_capped);
  EXPECT_TRUE(starts_with(note_of(fwd(DType::bf16, 1, 9000, 2, 1, 64), PlanForcing{.ws_schedule = WsSchedule::plain}),
                          "long_keys"));
  EXPECT_TRUE(starts_with(note_of(seed, PlanForcing{.smem_optin = 100 * 1024}), "shared_memory"));
  // an A100: its kernels
  EXPECT_FALSE(make_cuda_plan(seed, kA100).main.entry->tma);
}

// The d <= 256 bucket: its entries (Bc 64, 24 / 240 registers), the default plan with the
// wgmma forward as fallback (the same block order), head dims 136..248 by TMA's zero fill, the
// fold with a slot of 16 rows x 256 columns per consumer warp, the features variant, and a GPU
// granting the wgmma forward's 197,632 bytes but not this kernel's 197,704 keeping the wgmma one.
TEST(CudaPlan, WarpSpecializedForwardCoversTheD256Bucket) {
  for (DType t : {DType::f16, DType::bf16})
    for (WsSchedule s : {WsSchedule::plain, WsSchedule::overlapped, WsSchedule::ping_pong}) {
      SCOPED_TRACE(::testing::Message() << strideattn::to_string(t) << " " << to_string(s));
      const KernelEntry* e = find_ws_forward(t, 256, s);
      ASSERT_NE(e, nullptr);
      EXPECT_TRUE(e->tma && e->bucket == 256 && e->ws_schedule == s);
      EXPECT_EQ(e->smem_bytes, ws_forward_tile(256).smem_bytes);
      EXPECT_EQ(e->fold != nullptr, s == WsSchedule::overlapped);
      EXPECT_EQ(e->mods != nullptr, s == WsSchedule::overlapped);
    }
  auto starts_with = [](const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; };
  const Problem base = fwd(DType::bf16, 2, 1000, 8, 2, 256);
  const CudaPlan plan = make_cuda_plan(base, kH200);
  ASSERT_TRUE(plan.ok()) << plan.error;
  ASSERT_TRUE(plan.main.entry->tma) << plan.ws_note;
  EXPECT_EQ(plan.main.entry->ws_schedule, WsSchedule::ping_pong);
  EXPECT_EQ(plan.main.grid.x, 8u);
  const CudaPlan off = make_cuda_plan(base, kH200, PlanForcing{.ws_forward = false});
  EXPECT_EQ(name_of(off.main), "sm90a wgmma forward");
  EXPECT_EQ(name_of(plan.ws_fallback), name_of(off.main));
  for (auto [d_qk, d_v] : {std::pair{136, 136}, std::pair{160, 160}, std::pair{192, 128}, std::pair{200, 256}}) {
    const CudaPlan p = make_cuda_plan(problem(Direction::forward, DType::f16, 2, 300, 500, 4, 2, d_qk, d_v), kH200);
    EXPECT_TRUE(p.main.entry->tma && p.main.entry->bucket == 256) << d_qk << " " << d_v << ": " << p.ws_note;
  }
  const CudaPlan folding = make_cuda_plan(fwd(DType::bf16, 1, 9000, 2, 1, 256), kH200);
  ASSERT_TRUE(folding.main.entry->tma) << folding.ws_note;
  EXPECT_EQ(folding.main.variant, Variant::fold);
  EXPECT_GE(folding.outer_slot_floats, std::size_t(16 * 256));
  EXPECT_GE(folding.outer_count, 132 * 12);
  Problem capped = base;
  capped.softcap = 30;
  const CudaPlan mods = make_cuda_plan(capped, kH200);
  ASSERT_TRUE(mods.main.entry->tma) << mods.ws_note;
  EXPECT_EQ(mods.main.variant, Variant::mods_softcap);
  const CudaPlan small = make_cuda_plan(base, kH200, PlanForcing{.smem_optin = 193 * 1024});
  ASSERT_TRUE(small.ok()) << small.error;
  ASSERT_NE(small.main.entry, nullptr);
  EXPECT_FALSE(small.main.entry->tma);
  EXPECT_TRUE(starts_with(small.ws_note, "shared_memory")) << small.ws_note;
}

}  // namespace
