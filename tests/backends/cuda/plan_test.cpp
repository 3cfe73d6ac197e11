// The host side of the cuda backend's kernel choice, without a GPU: the kernel table covers
// every (dtype, head-dim bucket, pass, architecture), and make_cuda_plan's choices for an
// A100, an sm_86 card and an H200 (DeviceCaps written out here) are the documented ones:
// which kernel, which instantiation, grid, group splits, single- or two-pass backward, the
// forward fold, the backward's folds, the workspace layout, the test hook's forcings, and a clear refusal where no
// kernel fits the GPU's shared memory (the support rule's cheap check says the same); a
// cu_seqlens problem's plan (grids from the bounds, tables in the workspace); and what a
// prepared call holds (prepare_launch): the pointer-free kernel parameters and a host-list
// problem's tables, no pointer of the problem it was made from; the warp-specialized dK/dV
// pass in the default plan wherever it covers the problem, kept off by the test hook, and
// each rule that keeps it off named. (The warp-specialized forward's choices:
// ws_plan_test.cpp.)
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <string_view>

#include "backends/cuda/device_presets.hpp"
#include "backends/cuda/plan_problems.hpp"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/launch.hpp"
#include "backends/cuda/plan.hpp"
#include "backends/cuda/test_hook.hpp"
#include "problem/problem.hpp"

namespace {

using strideattn::DType;
using strideattn::detail::Direction;
using strideattn::detail::Problem;
using namespace strideattn::cuda_impl;

using namespace strideattn::cuda_impl::test_devices;
using namespace strideattn::cuda_impl::test_problems;

TEST(CudaKernelTable, CoversEveryDtypeBucketPassAndArchitecture) {
  std::set<const void*> kernels;
  for (DType t : {DType::f16, DType::bf16})
    for (Arch a : kArchs)
      for (int d : kBuckets)
        for (Pass pass : {Pass::forward, Pass::dkdv, Pass::dq}) {
          SCOPED_TRACE(::testing::Message()
                       << to_string(a) << " d " << d << " " << to_string(pass) << " " << strideattn::to_string(t));
          int entries = 0;
          for (const KernelEntry& e : kernel_table()) {
            // (the warp-specialized forward, which find_kernel never returns: WarpSpecialized...)
            if (e.tma || e.dtype != t || e.arch != a || e.bucket != d || e.pass != pass) continue;
            ++entries;
            EXPECT_NE(e.guarded, nullptr) << e.name;
            EXPECT_NE(e.fold, nullptr) << e.name << ": every pass has its folding instantiation";
            EXPECT_NE(e.mods, nullptr) << e.name << ": every pass has its training-feature instantiation";
            if (e.full_d != nullptr) EXPECT_TRUE(unguarded_full_d(a, d)) << e.name << ": a FullD duplicate";
            EXPECT_TRUE(e.threads == kThreads || e.threads == kKvThreads) << e.name;
            EXPECT_GT(e.block_rows, 0) << e.name;
            EXPECT_LE(e.smem_bytes, a == Arch::sm90a ? kSm90SmemOptin : 163 * 1024) << e.name;
            EXPECT_EQ(e.grid == GridShape::key_blocks, pass == Pass::dkdv) << e.name;
            if (pass == Pass::dkdv) EXPECT_GT(e.split_target, 0) << e.name;
            for (const void* k : {e.guarded, e.full_d, e.fold, e.mods})
              if (k != nullptr) EXPECT_TRUE(kernels.insert(k).second) << e.name << ": a kernel in two entries";
          }
          // One kernel per (bucket, pass, architecture), but for the sm80 dK/dV pass at
          // d <= 128: the 8-warp pass, then the 4-warp one for GPUs that cannot grant it.
          const int expected = a == Arch::sm80 && d == 128 && pass == Pass::dkdv ? 2 : 1;
          EXPECT_EQ(entries, expected);
          EXPECT_NE(find_kernel(t, a, d, pass, 1 << 30), nullptr);
        }
}

TEST(CudaKernelTable, PreferenceOrderAndSharedMemoryFallback) {
  const KernelEntry* big = find_kernel(DType::bf16, Arch::sm80, 128, Pass::dkdv, 163 * 1024);
  ASSERT_NE(big, nullptr);
  EXPECT_STREQ(big->name, "sm80 8-warp dK/dV pass");
  const KernelEntry* small = find_kernel(DType::bf16, Arch::sm80, 128, Pass::dkdv, 99 * 1024);
  ASSERT_NE(small, nullptr);
  EXPECT_STREQ(small->name, "sm80 4-warp dK/dV pass");
  int needed = 0;
  EXPECT_EQ(find_kernel(DType::bf16, Arch::sm80, 256, Pass::dkdv, 99 * 1024, &needed), nullptr);
  EXPECT_EQ(needed, kv_tile(Arch::sm80, 256).smem_bytes);
}

TEST(CudaPlan, DeviceArchitecture) {
  EXPECT_EQ(kA100.arch(), Arch::sm80);
  EXPECT_EQ(kSm86.arch(), Arch::sm80);
  EXPECT_EQ(kH200.arch(), Arch::sm90a);
  DeviceCaps no_sm90a = kH200;
  no_sm90a.sm90a_code = false;  // a build without 90a among its architectures
  EXPECT_EQ(no_sm90a.arch(), Arch::sm80);
  const CudaPlan plan = make_cuda_plan(fwd(DType::bf16, 1, 256, 2, 2, 128), no_sm90a);
  ASSERT_TRUE(plan.ok()) << plan.error;
  EXPECT_EQ(name_of(plan.main), "sm80 mma.sync forward");
}

TEST(CudaPlan, ForwardKernelsAndInstantiations) {
  {  // A100, d 128: the sm80 forward, guarded (no FullD at d = 128 on sm80)
    const CudaPlan plan = make_cuda_plan(fwd(DType::bf16, 4, 1000, 16, 16, 128), kA100);
    ASSERT_TRUE(plan.ok()) << plan.error;
    EXPECT_EQ(plan.arch, Arch::sm80);
    EXPECT_EQ(name_of(plan.main), "sm80 mma.sync forward");
    EXPECT_EQ(plan.main.variant, Variant::guarded);
    EXPECT_EQ(plan.main.grid.x, 8u);  // ceil(1000 / 128)
    EXPECT_EQ(plan.main.grid.y, 16u);
    EXPECT_EQ(plan.main.grid.z, 4u);
    EXPECT_EQ(plan.main.entry->smem_bytes, 96 * 1024);
    EXPECT_EQ(plan.workspace.total, 0u);
  }
  {  // A100, d 64 = the bucket: FullD; d 40: guarded
    EXPECT_EQ(make_cuda_plan(fwd(DType::f16, 1, 300, 2, 1, 64), kA100).main.variant, Variant::full_d);
    EXPECT_EQ(make_cuda_plan(fwd(DType::f16, 1, 300, 2, 1, 40), kA100).main.variant, Variant::guarded);
  }
  {  // H200: the warp-specialized forward, with as its fallback at d 64 the mma.sync forward
     // (the wgmma one lost there), at d 128 / 256 the wgmma one
    const CudaPlan p64 = make_cuda_plan(fwd(DType::bf16, 1, 300, 2, 1, 64), kH200);
    EXPECT_TRUE(p64.main.entry->tma);
    EXPECT_EQ(name_of(p64.ws_fallback), "sm90a mma.sync forward");
    EXPECT_EQ(p64.ws_fallback.variant, Variant::full_d);
    for (int d : {128, 256}) {
      const CudaPlan p = make_cuda_plan(fwd(DType::bf16, 1, 300, 2, 1, d), kH200);
      const KernelLaunch& wgmma = p.ws_fallback;
      EXPECT_TRUE(p.main.entry->tma) << d;
      EXPECT_EQ(name_of(wgmma), "sm90a wgmma forward") << d;
      EXPECT_EQ(wgmma.variant, Variant::guarded) << d;
      EXPECT_EQ(wgmma.entry->threads, kKvThreads) << d;
    }
  }
  {  // over kFoldKeys keys: the fold, with one slot per warp that can be resident
    const CudaPlan a100 = make_cuda_plan(fwd(DType::bf16, 1, 9000, 2, 1, 128), kA100);
    EXPECT_EQ(a100.main.variant, Variant::fold);
    // 128 threads, 96 KiB: one CTA per SM by shared memory, 4 warps, 108 SMs
    EXPECT_EQ(a100.outer_count, 108 * 4);
    EXPECT_EQ(a100.outer_slot_floats, std::size_t(32 * 128));  // 2 m-tiles of 16 rows x 128
    EXPECT_EQ(a100.workspace.outer_flags - a100.workspace.outer_slots, std::size_t(432 * 32 * 128 * 4));
    EXPECT_EQ(a100.workspace.total - a100.workspace.outer_flags, std::size_t(1792));  // 432 ints, rounded up
    const CudaPlan h200 = make_cuda_plan(fwd(DType::bf16, 1, 9000, 2, 1, 128), kH200, PlanForcing{.ws_forward = false});
    EXPECT_EQ(h200.outer_count, 132 * 8);  // one 8-warp CTA per SM
    EXPECT_EQ(h200.outer_slot_floats, std::size_t(16 * 128));
    // the warp-specialized forward's fold: one 12-warp CTA per SM (8 of them consumers)
    const CudaPlan ws = make_cuda_plan(fwd(DType::bf16, 1, 9000, 2, 1, 128), kH200);
    EXPECT_TRUE(ws.main.entry->tma);
    EXPECT_EQ(ws.main.variant, Variant::fold);
    EXPECT_EQ(ws.outer_count, 132 * 12);
    EXPECT_EQ(ws.outer_slot_floats, std::size_t(16 * 128));
  }
}

TEST(CudaPlan, BackwardKernelsPerDevice) {
  {  // A100, d 128: the 8-warp pass, single pass unless deterministic
    const CudaPlan single = make_cuda_plan(bwd(DType::bf16, 4, 1024, 16, 16, 128), kA100);
    ASSERT_TRUE(single.ok()) << single.error;
    EXPECT_EQ(name_of(single.main), "sm80 8-warp dK/dV pass");
    EXPECT_EQ(single.main.variant, Variant::guarded);
    EXPECT_TRUE(single.single_pass);
    EXPECT_EQ(single.dq.entry, nullptr);
    EXPECT_EQ(single.dq_accum_bytes, std::size_t(4 * 16 * 1024 * 128 * 4));
    const CudaPlan two = make_cuda_plan(bwd(DType::bf16, 4, 1024, 16, 16, 128, true), kA100);
    EXPECT_FALSE(two.single_pass);
    EXPECT_EQ(name_of(two.dq), "sm80 dQ pass");
    EXPECT_EQ(two.workspace.total, std::size_t(4 * 16 * 1024 * 4));  // the delta rows alone
  }
  {  // sm_86, d 128: 99 KiB is too little for the 8-warp pass: the 4-warp one, two-pass
    const CudaPlan plan = make_cuda_plan(bwd(DType::f16, 2, 500, 8, 8, 128), kSm86);
    ASSERT_TRUE(plan.ok()) << plan.error;
    EXPECT_EQ(name_of(plan.main), "sm80 4-warp dK/dV pass");
    EXPECT_FALSE(plan.single_pass) << "the 4-warp pass does not add dQ";
    EXPECT_EQ(name_of(plan.dq), "sm80 dQ pass");
    // d 64 fits the 8-warp pass there (97 KiB)
    EXPECT_EQ(name_of(make_cuda_plan(bwd(DType::f16, 2, 500, 8, 8, 64), kSm86).main), "sm80 8-warp dK/dV pass");
  }
  {  // sm_86, d 256: no backward kernel fits, refused saying what and how much
    const CudaPlan plan = make_cuda_plan(bwd(DType::f16, 1, 100, 2, 2, 256), kSm86);
    EXPECT_FALSE(plan.ok());
    EXPECT_NE(plan.error.find("131584 bytes"), std::string::npos) << plan.error;
    EXPECT_NE(plan.error.find("101376 bytes"), std::string::npos) << plan.error;
    EXPECT_NE(plan.error.find("8.6"), std::string::npos) << plan.error;
    // its forward runs (96 KiB)
    EXPECT_TRUE(make_cuda_plan(fwd(DType::f16, 1, 100, 2, 2, 256), kSm86).ok());
  }
  {  // H200: the wgmma pass in every bucket (at d 128 the warp-specialized pass, with the wgmma
     // pass as its fallback), single pass; the deterministic one adds the dQ pass
    for (int d : kBuckets) {
      const CudaPlan plan = make_cuda_plan(bwd(DType::bf16, 2, 700, 4, 4, d), kH200);
      EXPECT_EQ(name_of(d == 128 ? plan.ws_fallback : plan.main), "sm90a wgmma dK/dV pass") << d;
      if (d == 128) EXPECT_EQ(name_of(plan.main), "sm90a warp-specialized dK/dV pass");
      EXPECT_TRUE(plan.single_pass) << d;
      const CudaPlan two = make_cuda_plan(bwd(DType::bf16, 2, 700, 4, 4, d, true), kH200);
      EXPECT_EQ(name_of(two.dq), "sm90a dQ pass") << d;
    }
  }
}

TEST(CudaPlan, GroupSplitsFillTheGpu) {
  // The seed case on an H200: MQA 16/1, 8 sequences of 2k keys, d 64: 16 key blocks x 8
  // sequences = 128 CTAs against 8 x 132 wanted: 9 splits asked, 8 of 2 heads each.
  const CudaPlan seed = make_cuda_plan(bwd(DType::f16, 8, 2048, 16, 1, 64), kH200);
  ASSERT_TRUE(seed.ok()) << seed.error;
  EXPECT_EQ(seed.group_splits, 8);
  EXPECT_EQ(seed.main.grid.x, 16u);
  EXPECT_EQ(seed.main.grid.y, 8u);
  EXPECT_EQ(seed.partial_rows, 8 * 1 * 2048);
  EXPECT_EQ(seed.workspace.dq_accum - seed.workspace.partial, std::size_t(8) * 8 * 2048 * (64 + 64) * 4);
  // Enough CTAs without splitting: none; MHA: none.
  EXPECT_EQ(make_cuda_plan(bwd(DType::f16, 8, 8192, 64, 8, 128), kH200).group_splits, 1);
  EXPECT_EQ(make_cuda_plan(bwd(DType::f16, 1, 128, 4, 4, 64), kH200).group_splits, 1);
  // The 4-warp pass at d 256 on an A100: 64 keys x 2 head-dim splits per CTA, 4 CTAs per SM
  const CudaPlan a100 = make_cuda_plan(bwd(DType::f16, 1, 640, 12, 1, 256), kA100);
  EXPECT_EQ(name_of(a100.main), "sm80 4-warp dK/dV pass");
  EXPECT_EQ(a100.main.grid.x, 20u);  // 10 key blocks x 2
  EXPECT_EQ(a100.group_splits, 12);  // 20 CTAs against 432: ceil = 22, at most one per head
}

TEST(CudaPlan, WorkspaceLayout) {
  Problem p = bwd(DType::bf16, 1, 200, 4, 2, 64);
  p.batch = 3, p.varlen = true, p.s_q = p.s_kv = 90;
  p.seqlens_q = p.seqlens_kv = {30, 90, 80};
  p.offsets_q = p.offsets_kv = {0, 30, 120};
  const CudaPlan plan = make_cuda_plan(p, kA100);
  ASSERT_TRUE(plan.ok()) << plan.error;
  const WorkspaceLayout& w = plan.workspace;
  EXPECT_EQ(w.tables, 0u);
  EXPECT_EQ(w.delta, 256u);            // 4 x 3 int64 = 96 bytes, rounded up
  EXPECT_EQ(w.partial, 256u + 3328u);  // delta: [1][4 heads][200 tokens] fp32, 3,200 bytes rounded up
  EXPECT_EQ(plan.group_splits, 2);     // 6 CTAs of 128 keys on 108 SMs
  EXPECT_EQ(plan.partial_rows, 1 * 2 * 200);
  for (std::size_t at : {w.tables, w.delta, w.partial, w.dq_accum, w.outer_slots, w.outer_flags, w.total})
    EXPECT_EQ(at % kWorkspacePieceAlign, 0u);
  EXPECT_GE(w.total, w.dq_accum + plan.dq_accum_bytes);
}

TEST(CudaPlan, TestHookForcings) {
  const Problem p = bwd(DType::bf16, 2, 333, 8, 2, 128, true);
  {  // the sm80 kernels on an H200
    const CudaPlan plan = make_cuda_plan(p, kH200, PlanForcing{.arch = Arch::sm80});
    EXPECT_EQ(name_of(plan.main), "sm80 8-warp dK/dV pass");
    EXPECT_EQ(name_of(plan.dq), "sm80 dQ pass");
  }
  {  // and the 4-warp pass there, as a GPU with less shared memory gets it
    const CudaPlan plan = make_cuda_plan(p, kH200, PlanForcing{.arch = Arch::sm80, .smem_optin = 160 * 1024});
    EXPECT_EQ(name_of(plan.main), "sm80 4-warp dK/dV pass");
  }
  {  // the sm90a kernels where they cannot run: refused
    const CudaPlan plan = make_cuda_plan(p, kA100, PlanForcing{.arch = Arch::sm90a});
    EXPECT_FALSE(plan.ok());
    EXPECT_NE(plan.error.find("9.0"), std::string::npos) << plan.error;
  }
  {  // forced splits: 4 asked of a group of 4; MQA 6/1 with 4 asked gives 3 of 2 heads
    EXPECT_EQ(make_cuda_plan(p, kH200, PlanForcing{.group_splits = 4}).group_splits, 4);
    EXPECT_EQ(make_cuda_plan(bwd(DType::f16, 1, 130, 6, 1, 128), kH200, PlanForcing{.group_splits = 4}).group_splits,
              3);
  }
  {  // single / two pass whatever `deterministic` says, where the pass adds dQ
    EXPECT_TRUE(make_cuda_plan(p, kH200, PlanForcing{.single_pass = true}).single_pass);
    const Problem q = bwd(DType::bf16, 2, 333, 8, 2, 128, false);
    EXPECT_FALSE(make_cuda_plan(q, kH200, PlanForcing{.single_pass = false}).single_pass);
    EXPECT_FALSE(make_cuda_plan(q, kSm86, PlanForcing{.single_pass = true}).single_pass) << "the 4-warp pass";
  }
  {  // the scoped hook: what the backend passes to make_cuda_plan, restored when it ends
    EXPECT_FALSE(plan_forcing().arch.has_value());
    {
      const ScopedCudaPlanForcing outer(PlanForcing{.arch = Arch::sm80});
      EXPECT_EQ(plan_forcing().arch, Arch::sm80);
      {
        const ScopedCudaPlanForcing inner(PlanForcing{.group_splits = 3});
        EXPECT_FALSE(plan_forcing().arch.has_value());
        EXPECT_EQ(plan_forcing().group_splits, 3);
      }
      EXPECT_EQ(plan_forcing().arch, Arch::sm80);
    }
    EXPECT_FALSE(plan_forcing().arch.has_value());
  }
}

// The backward's folds over long ranges (kernel_params.hpp, kFoldRows): a dK/dV pass whose
// CTAs loop over more than kFoldRows query rows (over their GQA heads) folds into zeroed fp32
// partial planes every kFoldRows rows; past 2 kFoldRows keys the two-pass backward runs and
// its dQ pass folds into dq_accum. Ordinary shapes do neither.
TEST(CudaPlan, LongRangesFoldTheBackward) {
  // H200, d 128: the wgmma dK/dV pass takes 64 queries per iteration (+ 1 for a range that
  // straddles a block): 1,023 + 1 iterations do not fold, 1,024 + 1 do, every 1,024.
  const std::int64_t rows = kFoldRows;
  const int every = kFoldRows / 64;
  const CudaPlan short_q =
      make_cuda_plan(problem(Direction::backward, DType::bf16, 1, rows - 64, 1024, 4, 4, 128, 128), kH200);
  ASSERT_TRUE(short_q.ok()) << short_q.error;
  EXPECT_EQ(short_q.kv_fold_blocks, 0);
  EXPECT_EQ(short_q.q_fold_blocks, 0);
  EXPECT_EQ(short_q.partial_rows, 0);
  EXPECT_TRUE(short_q.single_pass);
  EXPECT_NE(short_q.main.variant, Variant::fold);
  const CudaPlan long_q =
      make_cuda_plan(problem(Direction::backward, DType::bf16, 1, rows, 1024, 4, 4, 128, 128), kH200);
  ASSERT_TRUE(long_q.ok()) << long_q.error;
  EXPECT_EQ(long_q.kv_fold_blocks, every);
  EXPECT_EQ(long_q.main.variant, Variant::fold);
  EXPECT_EQ(long_q.q_fold_blocks, 0);
  EXPECT_TRUE(long_q.single_pass);
  EXPECT_EQ(long_q.group_splits, 1);
  EXPECT_EQ(long_q.partial_rows, 4 * 1024);  // one plane: the fold's, without group splits
  EXPECT_EQ(long_q.partial_bytes, std::size_t(4) * 1024 * (128 + 128) * 4);
  EXPECT_EQ(long_q.workspace.dq_accum - long_q.workspace.partial, long_q.partial_bytes);
  // d 64: 128 queries per iteration, a fold every 512.
  EXPECT_EQ(
      make_cuda_plan(problem(Direction::backward, DType::bf16, 1, rows, 1024, 4, 4, 64, 64), kH200).kv_fold_blocks,
      kFoldRows / 128);
  // GQA 8/1 counts every head of the group a CTA loops over: 16k queries fold.
  EXPECT_EQ(make_cuda_plan(problem(Direction::backward, DType::bf16, 64, 16 * 1024, 4096, 8, 1, 128, 128), kH200)
                .kv_fold_blocks,
            every);
  // Long key ranges: two-pass, the dQ pass folding into dq_accum; the dK/dV pass does not.
  const CudaPlan long_k =
      make_cuda_plan(problem(Direction::backward, DType::bf16, 1, 256, 1 << 20, 4, 4, 128, 128), kH200);
  ASSERT_TRUE(long_k.ok()) << long_k.error;
  EXPECT_FALSE(long_k.single_pass);
  EXPECT_EQ(name_of(long_k.dq), "sm90a dQ pass");
  EXPECT_EQ(long_k.q_fold_blocks, kFoldRows / long_k.dq.entry->loop_rows);
  EXPECT_EQ(long_k.dq.variant, Variant::fold);
  EXPECT_EQ(long_k.kv_fold_blocks, 0);
  EXPECT_NE(long_k.main.variant, Variant::fold);
  EXPECT_EQ(long_k.dq_accum_bytes, std::size_t(256) * 4 * 128 * 4);
  // 2 kFoldRows keys still run the single pass.
  EXPECT_TRUE(
      make_cuda_plan(problem(Direction::backward, DType::bf16, 1, 256, 2 * rows, 4, 4, 128, 128), kH200).single_pass);
  // The same on the sm80 kernels (8-warp pass, its dQ pass) and deterministic.
  const Problem both = problem(Direction::backward, DType::f16, 1, rows * 2, 1 << 20, 2, 2, 64, 64, true);
  for (const CudaPlan& plan : {make_cuda_plan(both, kA100), make_cuda_plan(both, kH200)}) {
    ASSERT_TRUE(plan.ok()) << plan.error;
    EXPECT_FALSE(plan.single_pass);
    EXPECT_EQ(plan.kv_fold_blocks, kFoldRows / plan.main.entry->loop_rows);
    EXPECT_EQ(plan.q_fold_blocks, kFoldRows / plan.dq.entry->loop_rows);
  }
  // The test hook: a fold every 3 blocks on a small problem (both passes where both run), or
  // none on a long one.
  const Problem small = bwd(DType::bf16, 2, 333, 8, 2, 128, true);
  const CudaPlan every3 = make_cuda_plan(small, kH200, PlanForcing{.fold_blocks = 3});
  EXPECT_EQ(every3.kv_fold_blocks, 3);
  EXPECT_EQ(every3.q_fold_blocks, 3);
  EXPECT_EQ(every3.partial_rows, 2 * 2 * 333);
  const CudaPlan none = make_cuda_plan(both, kH200, PlanForcing{.fold_blocks = -1});
  EXPECT_EQ(none.kv_fold_blocks, 0);
  EXPECT_EQ(none.q_fold_blocks, 0);
  EXPECT_EQ(none.partial_rows, 0);
  // The forward has no such fold (it folds by keys: outer_count).
  EXPECT_EQ(
      make_cuda_plan(problem(Direction::forward, DType::bf16, 1, rows * 2, 64, 2, 2, 64, 64), kH200).kv_fold_blocks, 0);
}

// The support rule `shared_memory` runs the plan's kernel choice alone: it refuses exactly
// the problems make_cuda_plan refuses, with the same message.
TEST(CudaPlan, RefusalCheckAgreesWithThePlan) {
  const PlanForcing forcings[] = {{},
                                  {.arch = Arch::sm80},
                                  {.arch = Arch::sm90a},
                                  {.smem_optin = 100 * 1024},
                                  {.single_pass = true},
                                  {.single_pass = false}};
  int refused = 0, planned = 0;
  for (const DeviceCaps& caps : {kA100, kSm86, kH200})
    for (const PlanForcing& f : forcings)
      for (int d : {64, 96, 128, 256})
        for (bool backward : {false, true})
          for (bool deterministic : {false, true}) {
            const Problem p =
                backward ? bwd(DType::f16, 2, 300, 4, 2, d, deterministic) : fwd(DType::bf16, 2, 300, 4, 2, d);
            const CudaPlan plan = make_cuda_plan(p, caps, f);
            const std::optional<std::string> why = cuda_plan_refusal(p, caps, f);
            EXPECT_EQ(why.has_value(), !plan.ok()) << "d " << d << " device " << caps.device << " " << plan.error;
            if (why) EXPECT_EQ(*why, plan.error);
            EXPECT_EQ(plan.device, caps.device);
            (plan.ok() ? planned : refused)++;
          }
  EXPECT_GT(refused, 0);  // (sm90a on the A100 and sm_86, the d 256 backward on sm_86, ...)
  EXPECT_GT(planned, 0);
}

// cu_seqlens: the plan is made for the count and the bounds (no lengths): grids from
// max_seqlen, the tables in the workspace as for lists.
TEST(CudaPlan, CuSeqlensPlansUseTheBounds) {
  Problem p = bwd(DType::bf16, 1, 1000, 4, 4, 128, true);
  p.varlen = true, p.cu_seqlens = true;
  p.batch = 7, p.s_q = 300, p.s_kv = 500;  // count and bounds; the views hold 1,000 tokens
  const CudaPlan plan = make_cuda_plan(p, kH200);
  ASSERT_TRUE(plan.ok()) << plan.error;
  EXPECT_EQ(plan.main.grid.x, 4u);  // ceil(500 / 128) key blocks
  EXPECT_EQ(plan.main.grid.z, 7u);
  EXPECT_EQ(plan.dq.grid.x, 3u);  // ceil(300 / 128) query blocks
  EXPECT_EQ(plan.workspace.tables, 0u);
  EXPECT_EQ(plan.workspace.delta, 256u);  // 4 x 7 int64 = 224 bytes, rounded up
  const PreparedLaunch prep = prepare_launch(plan, p);
  EXPECT_TRUE(prep.host_tables.empty());  // each run computes them on the device
}

// What prepare_launch keeps: sizes, strides, mask and scales; no data pointer of the problem it
// was made from (each run binds its own) and no host table pointer; a host-list problem's
// tables in the kernels' layout.
TEST(CudaPlan, PreparedLaunchHoldsNoPointers) {
  Problem p = bwd(DType::bf16, 1, 200, 4, 2, 64);
  p.batch = 3, p.varlen = true, p.s_q = p.s_kv = 90;
  p.seqlens_q = {30, 90, 80}, p.seqlens_kv = {10, 90, 0};
  p.offsets_q = {0, 30, 120}, p.offsets_kv = {5, 30, 200};
  p.mask = strideattn::MaskKind::causal_bottom_right, p.window = {7, 3};
  static std::uint16_t dummy[8];
  for (auto* v : {&p.q, &p.k, &p.v, &p.o, &p.d_o, &p.dq, &p.dk, &p.dv}) v->data = dummy;
  const PreparedLaunch prep = prepare_launch(make_cuda_plan(p, kA100), p);
  ASSERT_TRUE(prep.plan.ok()) << prep.plan.error;
  const KernelParams& kp = prep.params;
  for (const void* ptr :
       {kp.p.q, kp.p.k, kp.p.v, kp.p.d_o, static_cast<const void*>(kp.p.o), static_cast<const void*>(kp.p.dq),
        static_cast<const void*>(kp.p.dk), static_cast<const void*>(kp.p.dv), static_cast<const void*>(kp.p.lse)})
    EXPECT_EQ(ptr, nullptr);
  EXPECT_EQ(kp.p.q_seq.seqlens, nullptr);
  EXPECT_EQ(kp.p.kv_seq.offsets, nullptr);
  EXPECT_EQ(kp.delta, nullptr);
  EXPECT_EQ(kp.p.q_seq.max_len, 90);
  EXPECT_EQ(kp.p.window_left, 7);
  EXPECT_EQ(kp.q_tokens, 200);
  EXPECT_FLOAT_EQ(kp.p.scale, 0.125f);
  EXPECT_FLOAT_EQ(kp.scale_log2, 0.125f * 1.4426950408889634f);
  EXPECT_EQ(kp.group_splits, prep.plan.group_splits);
  const std::vector<std::int64_t> want = {30, 90, 80, 0, 30, 120, 10, 90, 0, 5, 30, 200};
  EXPECT_EQ(prep.host_tables, want);
}

// The warp-specialized TMA dK/dV pass (sm90/ws_backward.cuh): one entry per dtype at d <= 128,
// sm90a, which find_kernel never returns; the default backward plan runs it wherever it
// covers the problem, with the wgmma pass as its fallback (same grid, group splits and
// workspace), the test hook keeps it off, and every problem it does not cover keeps the wgmma
// pass with the rule named.
TEST(CudaPlan, WarpSpecializedBackwardWhereItCovers) {
  for (DType t : {DType::f16, DType::bf16}) {
    const KernelEntry* e = find_ws_backward(t, 128);
    ASSERT_NE(e, nullptr);
    EXPECT_TRUE(e->tma);
    EXPECT_EQ(e->arch, Arch::sm90a);
    EXPECT_EQ(e->pass, Pass::dkdv);
    EXPECT_EQ(e->grid, GridShape::key_blocks);
    EXPECT_TRUE(e->adds_dq);
    EXPECT_EQ(e->threads, ws_backward_tile(128).threads);
    EXPECT_EQ(e->smem_bytes, ws_backward_tile(128).smem_bytes);
    EXPECT_NE(e->guarded, nullptr);
    EXPECT_EQ(e->fold, nullptr);
    // the training features: every one, and each alone (ws_backward_features)
    EXPECT_NE(e->mods, nullptr);
    std::set<const void*> kernels = {e->guarded, e->mods};
    for (int i = 0; i < kScoreFeatureCount; ++i) {
      EXPECT_NE(e->mods_single[i], nullptr);
      EXPECT_TRUE(kernels.insert(e->mods_single[i]).second) << "an instantiation twice";
    }
    const KernelEntry* wgmma = find_kernel(t, Arch::sm90a, 128, Pass::dkdv, 1 << 30);
    ASSERT_NE(wgmma, nullptr);
    EXPECT_FALSE(wgmma->tma);
    EXPECT_EQ(e->block_rows, wgmma->block_rows);
    EXPECT_EQ(e->loop_rows, wgmma->loop_rows);
    EXPECT_EQ(e->split_target, wgmma->split_target);
    EXPECT_NE(e->guarded, wgmma->guarded);
    // the 64 bucket's entry: the wgmma pass's blocks (128 keys, 128 queries per iteration)
    const KernelEntry* e64 = find_ws_backward(t, 64);
    ASSERT_NE(e64, nullptr);
    const KernelEntry* wgmma64 = find_kernel(t, Arch::sm90a, 64, Pass::dkdv, 1 << 30);
    ASSERT_NE(wgmma64, nullptr);
    EXPECT_TRUE(e64->tma);
    EXPECT_EQ(e64->bucket, 64);
    EXPECT_EQ(e64->threads, ws_backward_tile(64).threads);
    EXPECT_EQ(e64->smem_bytes, ws_backward_tile(64).smem_bytes);
    EXPECT_EQ(e64->block_rows, wgmma64->block_rows);
    EXPECT_EQ(e64->loop_rows, wgmma64->loop_rows);
    EXPECT_EQ(e64->loop_rows, 128);
    EXPECT_NE(e64->guarded, e->guarded);
    EXPECT_EQ(e64->mods, nullptr);
    for (const void* k : e64->mods_single) EXPECT_EQ(k, nullptr);
    EXPECT_EQ(find_ws_backward(t, 256), nullptr);
    // the forward's lookup never returns it, nor the backward's a forward
    for (WsSchedule schedule : {WsSchedule::plain, WsSchedule::overlapped, WsSchedule::ping_pong})
      EXPECT_EQ(find_ws_forward(t, 128, schedule)->pass, Pass::forward);
  }
  auto starts_with = [](const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; };

  // the default: the new pass, the wgmma pass's grid, splits and workspace, wgmma as fallback
  const Problem base = bwd(DType::bf16, 2, 1000, 8, 2, 128);
  const CudaPlan def = make_cuda_plan(base, kH200, PlanForcing{.ws_backward = false});
  ASSERT_TRUE(def.ok()) << def.error;
  EXPECT_FALSE(def.main.entry->tma);
  EXPECT_TRUE(starts_with(def.ws_note, "forced_off")) << def.ws_note;
  const CudaPlan ws = make_cuda_plan(base, kH200);
  ASSERT_TRUE(ws.ok()) << ws.error;
  ASSERT_TRUE(ws.main.entry->tma) << ws.ws_note;
  EXPECT_EQ(ws.main.entry->pass, Pass::dkdv);
  EXPECT_EQ(ws.ws_note, "");
  EXPECT_EQ(ws.main.variant, Variant::guarded);
  EXPECT_EQ(ws.main.grid.x, 8u);  // ceil(1000 / 128)
  EXPECT_EQ(ws.main.grid.x, def.main.grid.x);
  EXPECT_EQ(ws.main.grid.y, def.main.grid.y);
  EXPECT_EQ(ws.main.grid.z, 2u);
  EXPECT_EQ(ws.group_splits, def.group_splits);
  EXPECT_TRUE(ws.single_pass);
  EXPECT_EQ(ws.dq.entry, nullptr);
  EXPECT_EQ(name_of(ws.ws_fallback), name_of(def.main));
  EXPECT_EQ(ws.workspace.total, def.workspace.total);
  EXPECT_EQ(ws.kv_fold_blocks, 0);
  // GQA split over CTAs (partial planes and the reduction, as the wgmma pass's)
  const Problem mqa = bwd(DType::f16, 1, 512, 16, 1, 128);
  const CudaPlan split = make_cuda_plan(mqa, kH200);
  ASSERT_TRUE(split.ok()) << split.error;
  EXPECT_TRUE(split.main.entry->tma) << split.ws_note;
  EXPECT_GT(split.group_splits, 1);
  EXPECT_EQ(split.group_splits, make_cuda_plan(mqa, kH200, PlanForcing{.ws_backward = false}).group_splits);
  EXPECT_GT(split.partial_rows, 0);
  EXPECT_EQ(split.main.grid.y, unsigned(split.group_splits));
  // head dims of the bucket below it (TMA zero-fills the columns past d), d_qk != d_v
  EXPECT_TRUE(
      make_cuda_plan(problem(Direction::backward, DType::f16, 1, 100, 300, 4, 4, 96, 128), kH200).main.entry->tma);
  // the split of a fused QKV buffer [b, s, h + 2 hg, d]: multiples of 16 bytes, read in place
  Problem fused = bwd(DType::bf16, 2, 256, 16, 1, 128);
  const std::int64_t row = (16 + 2) * 128;
  fused.q.stride = {256 * row, row, 128, 1};
  fused.k.stride = fused.v.stride = {256 * row, row, 128, 1};
  EXPECT_EQ(make_cuda_plan(fused, kH200).ws_note, "");

  // the 64 bucket: only where a test forces it (ws_backward_by_default), then with the wgmma
  // pass's grid, splits and workspace; head dims below 64 too (TMA's zero fill)
  for (std::int64_t d : {64, 40}) {
    const Problem p64 = problem(Direction::backward, DType::bf16, 2, 700, 700, 8, 2, d, d);
    const CudaPlan plain64 = make_cuda_plan(p64, kH200);
    ASSERT_TRUE(plain64.ok()) << plain64.error;
    EXPECT_FALSE(plain64.main.entry->tma);
    EXPECT_EQ(plain64.ws_note, "");
    const CudaPlan forced64 = make_cuda_plan(p64, kH200, PlanForcing{.ws_backward = true});
    ASSERT_TRUE(forced64.ok()) << forced64.error;
    ASSERT_TRUE(forced64.main.entry->tma) << forced64.ws_note;
    EXPECT_EQ(forced64.main.entry->bucket, 64);
    EXPECT_EQ(forced64.main.variant, Variant::guarded);
    EXPECT_EQ(forced64.main.grid.x, plain64.main.grid.x);
    EXPECT_EQ(forced64.main.grid.y, plain64.main.grid.y);
    EXPECT_EQ(forced64.main.grid.z, plain64.main.grid.z);
    EXPECT_EQ(forced64.group_splits, plain64.group_splits);
    EXPECT_EQ(forced64.workspace.total, plain64.workspace.total);
    EXPECT_EQ(name_of(forced64.ws_fallback), name_of(plain64.main));
    EXPECT_TRUE(starts_with(ws_backward_refusal(p64, plain64, kH200, {}), "head_dim: bucket 64 runs the wgmma pass"));
  }

  // what keeps it off, each with its rule (the wgmma pass runs, in its own variant)
  auto note_of = [&](const Problem& p, const PlanForcing& forcing = {}, const DeviceCaps& caps = kH200) {
    const CudaPlan plan = make_cuda_plan(p, caps, forcing);
    EXPECT_TRUE(plan.ok()) << plan.error;
    EXPECT_TRUE(plan.main.entry == nullptr || !plan.main.entry->tma) << plan.ws_note;
    return plan.ws_note;
  };
  EXPECT_TRUE(starts_with(note_of(base, PlanForcing{.ws_backward = false}), "forced_off"));
  // other buckets and architectures: their kernels, no note
  for (int d : {64, 256}) EXPECT_EQ(note_of(bwd(DType::bf16, 1, 500, 4, 4, d)), "") << d;
  EXPECT_EQ(note_of(base, {}, kA100), "");
  EXPECT_EQ(note_of(base, PlanForcing{.arch = Arch::sm80}), "");
  // ... but the rules name them when asked
  {
    const CudaPlan a100 = make_cuda_plan(base, kA100);
    EXPECT_TRUE(starts_with(ws_backward_refusal(base, a100, kA100, {}), "arch: sm80")) << a100.ws_note;
    const Problem d64 = bwd(DType::bf16, 1, 500, 4, 4, 64);
    EXPECT_TRUE(starts_with(ws_backward_refusal(d64, make_cuda_plan(d64, kH200), kH200, {}), "head_dim: bucket 64"));
    const Problem d256 = bwd(DType::bf16, 1, 500, 4, 4, 256);
    EXPECT_TRUE(starts_with(ws_backward_refusal(d256, make_cuda_plan(d256, kH200), kH200, {}),
                            "head_dim: bucket 256 (supported"));
    const Problem f = fwd(DType::bf16, 1, 500, 4, 4, 128);
    EXPECT_TRUE(starts_with(ws_backward_refusal(f, make_cuda_plan(f, kH200), kH200, {}), "direction: forward"));
  }
  Problem vl = base;
  vl.varlen = true, vl.batch = 2, vl.seqlens_q = vl.seqlens_kv = {500, 400}, vl.offsets_q = vl.offsets_kv = {0, 500};
  EXPECT_TRUE(starts_with(note_of(vl), "varlen")) << note_of(vl);
  // The training features that change the scores: in the 128 bucket the pass's single-feature
  // instantiation where one is on, its every-feature one for several (feature_variant)
  Problem capped = base;
  capped.softcap = 30;
  Problem dropping = base;
  dropping.dropout_p = 0.1;
  Problem slopes = base;
  slopes.alibi_on = true;
  Problem biased = base;
  biased.bias_type = strideattn::BiasType::post_scale;
  biased.bias.shape = {2, 8, 1000, 1000};
  const std::pair<const Problem*, Variant> singles[] = {{&biased, Variant::mods_bias},
                                                        {&capped, Variant::mods_softcap},
                                                        {&slopes, Variant::mods_alibi},
                                                        {&dropping, Variant::mods_dropout}};
  for (auto [problem, variant] : singles) {
    const CudaPlan plan = make_cuda_plan(*problem, kH200);
    ASSERT_TRUE(plan.ok()) << plan.error;
    EXPECT_EQ(plan.ws_note, "");
    EXPECT_TRUE(plan.main.entry->tma);
    EXPECT_EQ(plan.main.variant, variant);
    EXPECT_NE(plan.main.kernel(), nullptr);
    EXPECT_EQ(plan.ws_fallback.variant, variant);  // the wgmma pass's instantiation of it
    EXPECT_EQ(plan.workspace.total, make_cuda_plan(*problem, kH200, PlanForcing{.ws_backward = false}).workspace.total);
  }
  Problem two = capped;
  two.alibi_on = true;
  const CudaPlan both = make_cuda_plan(two, kH200);
  EXPECT_TRUE(both.main.entry->tma) << both.ws_note;
  EXPECT_EQ(both.main.variant, Variant::mods);
  EXPECT_EQ(both.main.kernel(), both.main.entry->mods);
  // the 64 bucket (where forced) has none: the wgmma pass's variant runs them
  Problem capped64 = bwd(DType::bf16, 2, 1000, 8, 2, 64);
  capped64.softcap = 30;
  const CudaPlan forced64 = make_cuda_plan(capped64, kH200, PlanForcing{.ws_backward = true});
  EXPECT_TRUE(starts_with(forced64.ws_note, "features: the bias, ALiBi, softcap or dropout is on in bucket 64"))
      << forced64.ws_note;
  EXPECT_FALSE(forced64.main.entry->tma);
  EXPECT_EQ(forced64.main.variant, Variant::mods_softcap);
  // ... but sinks alone run it (P from the LSE, which holds them)
  Problem sinks = base;
  sinks.sinks_on = sinks.d_sinks_on = true;
  const CudaPlan with_sinks = make_cuda_plan(sinks, kH200);
  EXPECT_EQ(with_sinks.ws_note, "");
  EXPECT_TRUE(with_sinks.main.entry->tma);
  EXPECT_EQ(with_sinks.main.variant, Variant::guarded);
  EXPECT_TRUE(starts_with(note_of(bwd(DType::bf16, 2, 1000, 8, 2, 128, true)), "deterministic"));
  EXPECT_TRUE(starts_with(note_of(base, PlanForcing{.single_pass = false}), "two_pass"));
  {
    const Problem long_keys =
        problem(Direction::backward, DType::bf16, 1, 256, 2 * std::int64_t(kFoldRows) + 1, 2, 2, 128, 128);
    const std::string n = note_of(long_keys);
    EXPECT_TRUE(starts_with(n, "two_pass")) << n;
    EXPECT_NE(n.find(std::to_string(2 * std::int64_t(kFoldRows) + 1)), std::string::npos) << n;
  }
  {
    const Problem long_q = problem(Direction::backward, DType::bf16, 1, std::int64_t(kFoldRows), 1024, 4, 4, 128, 128);
    const std::string n = note_of(long_q);
    EXPECT_TRUE(starts_with(n, "fold: the dK/dV pass folds every " + std::to_string(kFoldRows / 64))) << n;
    EXPECT_EQ(make_cuda_plan(long_q, kH200).main.variant, Variant::fold);
  }
  {
    // (8 bytes short of the new pass, 32 more than the wgmma pass needs)
    static_assert(ws_backward_tile(128).smem_bytes - 8 >= kv_wgmma_tile(128).smem_bytes);
    DeviceCaps small = kH200;
    small.smem_optin = ws_backward_tile(128).smem_bytes - 8;
    const std::string n = note_of(base, {}, small);
    EXPECT_TRUE(starts_with(n, "shared_memory: needs 165928 bytes")) << n;
    EXPECT_TRUE(starts_with(note_of(base, PlanForcing{.smem_optin = small.smem_optin}), "shared_memory"));
  }
  Problem odd = base;  // a head stride of 65 elements (130 bytes): not a multiple of 16
  odd.k.stride = {1000 * 65 * 2, 65 * 2, 65, 1};
  EXPECT_TRUE(starts_with(note_of(odd), "tma: k: ")) << note_of(odd);
  Problem odd_do = base;
  odd_do.d_o.stride = {1000 * 8 * 129, 8 * 129, 129, 1};
  EXPECT_TRUE(starts_with(note_of(odd_do), "tma: d_o: ")) << note_of(odd_do);
  Problem unaligned = base;
  static std::uint16_t buffer[16];
  unaligned.q.data = reinterpret_cast<std::uint8_t*>(buffer) + (16 - reinterpret_cast<std::uintptr_t>(buffer) % 16) + 8;
  EXPECT_TRUE(starts_with(note_of(unaligned), "tma: q: data pointer")) << note_of(unaligned);

  // prepare_launch makes the tensor maps; where the driver cannot (a machine without one, as
  // CI's), the call keeps the wgmma pass and says why
  const PreparedLaunch prep = prepare_launch(ws, base);
  if (prep.plan.main.entry->tma) {
    EXPECT_EQ(prep.plan.ws_note, "");
  } else {
    EXPECT_EQ(name_of(prep.plan.main), name_of(def.main));
    EXPECT_TRUE(starts_with(prep.plan.ws_note, "tma: q: ")) << prep.plan.ws_note;
  }
}

}  // namespace
