// The host side of the cuda backend's kernel choice for the training features, without a GPU:
// each pass runs a feature instantiation (every feature, or a single feature's) exactly where
// the problem has features, on every device and in both backward forms; the kernel chosen
// has every feature of the problem (the single-feature one only for exactly its feature);
// dBias goes through the fp32 accumulator only where the bias broadcasts. (plan_test.cpp:
// the plan's other choices.)
#include <gtest/gtest.h>

#include "backends/cuda/device_presets.hpp"
#include "backends/cuda/plan_problems.hpp"
#include "backends/cuda/common/feature_set.hpp"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/plan.hpp"
#include "problem/problem.hpp"

namespace {

using strideattn::DType;
using strideattn::detail::Direction;
using strideattn::detail::Problem;
using namespace strideattn::cuda_impl;

using namespace strideattn::cuda_impl::test_devices;
using namespace strideattn::cuda_impl::test_problems;

// The training features run each pass's feature variant (Variant::mods, or a single
// feature's), on every device and in both backward forms; the folds and group splits are
// counted as without them (the variant folds where they say so), and a problem without
// features never runs it.
TEST(CudaPlan, TrainingFeaturesRunTheFeatureVariant) {
  auto with_softcap = [](Problem p) {
    p.softcap = 30;
    return p;
  };
  for (const DeviceCaps& caps : {kA100, kSm86, kH200})
    for (int d : {64, 128, 256}) {
      SCOPED_TRACE(::testing::Message() << "sm " << caps.major << caps.minor << " d " << d);
      const CudaPlan f = make_cuda_plan(with_softcap(fwd(DType::bf16, 2, 500, 4, 2, d)), caps);
      ASSERT_TRUE(f.ok()) << f.error;
      EXPECT_TRUE(is_feature_variant(f.main.variant)) << int(f.main.variant);
      EXPECT_NE(f.main.kernel(), nullptr);
      for (bool deterministic : {false, true}) {
        const Problem plain = bwd(DType::bf16, 2, 500, 4, 2, d, deterministic);
        const CudaPlan b = make_cuda_plan(with_softcap(plain), caps), ref = make_cuda_plan(plain, caps);
        EXPECT_EQ(b.ok(), ref.ok()) << b.error;  // (sm_86 has no d <= 256 backward)
        if (!ref.ok()) continue;
        EXPECT_TRUE(is_feature_variant(b.main.variant)) << int(b.main.variant);
        EXPECT_NE(b.main.kernel(), nullptr);
        EXPECT_FALSE(is_feature_variant(ref.main.variant));
        EXPECT_EQ(b.single_pass, ref.single_pass);
        EXPECT_EQ(b.group_splits, ref.group_splits);
        EXPECT_EQ(b.workspace.total, ref.workspace.total);
        if (!b.single_pass) {
          EXPECT_EQ(b.dq.variant, Variant::mods);
          EXPECT_NE(b.dq.kernel(), nullptr);
        }
      }
    }
  // Sinks alone (and the max logit, a forward output): the forward's feature variant, the
  // backward's plain passes (P from the LSE, which holds the sinks; d_sinks its own reduction)
  for (const DeviceCaps& caps : {kA100, kH200})
    for (bool deterministic : {false, true}) {
      Problem f = fwd(DType::bf16, 2, 500, 4, 2, 128), b = bwd(DType::bf16, 2, 500, 4, 2, 128, deterministic);
      f.sinks_on = f.max_logit_on = true;
      b.sinks_on = b.d_sinks_on = true;
      EXPECT_EQ(make_cuda_plan(f, caps).main.variant, Variant::mods);
      const CudaPlan sb = make_cuda_plan(b, caps),
                     ref = make_cuda_plan(bwd(DType::bf16, 2, 500, 4, 2, 128, deterministic), caps);
      ASSERT_TRUE(sb.ok()) << sb.error;
      EXPECT_EQ(sb.main.variant, ref.main.variant);
      EXPECT_EQ(sb.main.kernel(), ref.main.kernel());
      EXPECT_EQ(sb.dq.variant, ref.dq.variant);
      EXPECT_EQ(sb.workspace.total, ref.workspace.total);
    }
  // Long key ranges: the forward's fold (its slots) and the dQ pass's fold stay planned.
  const CudaPlan long_f = make_cuda_plan(with_softcap(fwd(DType::f16, 1, 20000, 2, 1, 128)), kH200);
  EXPECT_EQ(long_f.main.variant, Variant::mods_softcap);  // (the wgmma forward's, the softcap alone)
  EXPECT_GT(long_f.outer_count, 0);
  const CudaPlan long_k =
      make_cuda_plan(with_softcap(problem(Direction::backward, DType::bf16, 1, 256, 1 << 20, 4, 4, 128, 128)), kH200);
  EXPECT_EQ(long_k.dq.variant, Variant::mods);
  EXPECT_GT(long_k.q_fold_blocks, 0);
  EXPECT_GT(long_k.dq_accum_bytes, 0u);
}

// dBias: stored by the dK/dV pass where no extent-1 dimension stands for more than one index
// of the problem (no workspace), otherwise an fp32 accumulator over its elements.
TEST(CudaPlan, DbiasAccumulatorOnlyWhereItBroadcasts) {
  Problem p = bwd(DType::bf16, 2, 300, 4, 2, 64);
  p.bias_type = strideattn::BiasType::post_scale;
  p.dbias_on = true;
  const CudaPlan plain = make_cuda_plan(bwd(DType::bf16, 2, 300, 4, 2, 64), kH200);
  for (const strideattn::Dims4& shape : {strideattn::Dims4{2, 4, 300, 300}, strideattn::Dims4{1, 4, 300, 300},
                                         strideattn::Dims4{1, 1, 1, 300}, strideattn::Dims4{2, 4, 300, 1}}) {
    p.bias.shape = p.dbias.shape = shape;
    const bool direct = shape[0] == 2 && shape[1] == 4 && shape[2] == 300 && shape[3] == 300;
    EXPECT_EQ(dbias_direct(p), direct);
    const CudaPlan plan = make_cuda_plan(p, kH200);
    ASSERT_TRUE(plan.ok()) << plan.error;
    EXPECT_EQ(plan.main.variant, Variant::mods_bias);  // (the 64 bucket: the wgmma pass's)
    const std::size_t elems = std::size_t(shape[0] * shape[1] * shape[2] * shape[3]);
    EXPECT_EQ(plan.dbias_accum_bytes, direct ? 0 : elems * 4);
    EXPECT_EQ(plan.workspace.total - plan.workspace.dbias_accum,
              (plan.dbias_accum_bytes + kWorkspacePieceAlign - 1) / kWorkspacePieceAlign * kWorkspacePieceAlign);
    EXPECT_EQ(plan.workspace.dbias_accum, plain.workspace.total);
  }
  // A problem extent of 1 is no broadcast: one batch, one head.
  Problem one = bwd(DType::bf16, 1, 300, 1, 1, 64);
  one.bias_type = strideattn::BiasType::pre_scale;
  one.dbias_on = true;
  one.bias.shape = one.dbias.shape = {1, 1, 300, 300};
  EXPECT_TRUE(dbias_direct(one));
}

// Every combination of the training features runs an instantiation that has each of them:
// the single-feature one only for exactly its feature (a kernel without a feature the problem
// has would ignore it, silently), where the entry has it. The backward's set is the features
// that change the scores; the forward's adds the sinks and the max logit. Over the four
// kernels with single-feature instantiations: the warp-specialized dK/dV pass (d 128), the
// wgmma dK/dV pass (every bucket; the deterministic backward keeps it), the overlapped
// warp-specialized forward (every bucket) and the wgmma forward (varlen, d 128 and 256).

// `p` with the features of `bits` (common/feature_set.hpp), the bias broadcast over heads.
Problem with_features(Problem p, int bits) {
  if (bits & kFeatBias) {
    p.bias_type = strideattn::BiasType::pre_scale;
    p.bias.shape = {p.batch, 1, p.s_q, p.s_kv};
  }
  if (bits & kFeatSoftcap) p.softcap = 20;
  if (bits & kFeatAlibi) p.alibi_on = true;
  if (bits & kFeatDropout) p.dropout_p = 0.2;
  p.sinks_on = (bits & kFeatSinks) != 0;
  p.max_logit_on = (bits & kFeatMaxLogit) != 0;
  return p;
}

// The plan of `p` (with the features `bits`) runs an instantiation of `entry`'s kind
// (`tma`) that has every one of them.
void expect_covered(const Problem& p, int bits, bool tma) {
  const CudaPlan plan = make_cuda_plan(p, kH200);
  ASSERT_TRUE(plan.ok()) << plan.error;
  ASSERT_EQ(plan.main.entry->tma, tma) << plan.ws_note;
  const KernelEntry& e = *plan.main.entry;
  ASSERT_EQ(pass_features(p, e.pass), bits);
  EXPECT_NE(plan.main.kernel(), nullptr);
  const int single = int(plan.main.variant) - int(Variant::mods_bias);
  if (single >= 0) {
    EXPECT_EQ(kSingleFeatures[single], bits);
  } else {
    EXPECT_EQ(plan.main.variant, Variant::mods);
    // several features, or one whose own instantiation this entry lacks
    const bool lone = (bits & (bits - 1)) == 0;
    bool has_own = false;
    for (int i = 0; i < kSingleFeatureCount; ++i) has_own |= kSingleFeatures[i] == bits && e.mods_single[i] != nullptr;
    EXPECT_TRUE(!lone || !has_own) << "a feature alone with its own instantiation ran every feature's";
  }
  if (plan.backward && !plan.single_pass) EXPECT_EQ(plan.dq.variant, Variant::mods);  // (the dQ pass: all)
}

TEST(CudaPlan, FeatureVariantsCoverTheProblemsFeatures) {
  for (int bits = 1; bits <= kScoreFeatures; ++bits) {
    SCOPED_TRACE(::testing::Message() << "features " << bits);
    expect_covered(with_features(bwd(DType::bf16, 2, 1000, 8, 2, 128), bits), bits, true);
    for (int d : {64, 128, 256})  // (deterministic: the wgmma pass)
      expect_covered(with_features(bwd(DType::bf16, 2, 1000, 8, 2, d, true), bits), bits, false);
  }
  for (int bits = 1; bits <= kFeatAll; ++bits) {
    SCOPED_TRACE(::testing::Message() << "forward features " << bits);
    for (int d : {64, 128, 256}) expect_covered(with_features(fwd(DType::f16, 2, 1000, 8, 2, d), bits), bits, true);
    for (int d : {128, 256}) {  // varlen: the wgmma forward
      Problem vl = fwd(DType::f16, 1, 1000, 8, 2, d);
      vl.varlen = true, vl.batch = 2, vl.s_q = vl.s_kv = 500;
      vl.seqlens_q = vl.seqlens_kv = {500, 400}, vl.offsets_q = vl.offsets_kv = {0, 500};
      expect_covered(with_features(vl, bits), bits, false);
    }
  }
  // the single-feature instantiations each entry has: the backward's four score features
  const KernelEntry* ws = find_ws_backward(DType::bf16, 128);
  ASSERT_NE(ws, nullptr);
  for (int i = 0; i < kSingleFeatureCount; ++i) EXPECT_EQ(ws->mods_single[i] != nullptr, i < kScoreFeatureCount);
  // ... the forwards' six, but where their bucket leaves one out (the tiles' functions)
  for (DType t : {DType::f16, DType::bf16})
    for (int d : {64, 128, 256}) {
      const KernelEntry* wsf = find_ws_forward(t, d, WsSchedule::overlapped);
      ASSERT_NE(wsf, nullptr);
      for (int i = 0; i < kSingleFeatureCount; ++i)
        EXPECT_EQ(wsf->mods_single[i] != nullptr, ws_forward_single_feature(d, kSingleFeatures[i])) << d << " " << i;
      if (d == 64) continue;  // (the wgmma forward: d 128 and 256)
      const KernelEntry* wf = find_kernel(t, Arch::sm90a, d, Pass::forward, 1 << 30);
      ASSERT_NE(wf, nullptr);
      for (int i = 0; i < kSingleFeatureCount; ++i)
        EXPECT_EQ(wf->mods_single[i] != nullptr, wgmma_forward_single_feature(d, kSingleFeatures[i])) << d << " " << i;
    }
  KernelEntry all_only = *ws;  // an entry with none
  for (const void*& k : all_only.mods_single) k = nullptr;
  EXPECT_EQ(feature_variant(with_features(bwd(DType::bf16, 2, 1000, 8, 2, 128), kFeatAlibi), all_only), Variant::mods);
  // dBias alone counts as the bias (it comes with one)
  Problem db = bwd(DType::bf16, 2, 1000, 8, 2, 128);
  db.bias_type = strideattn::BiasType::post_scale;
  db.dbias_on = true;
  db.bias.shape = db.dbias.shape = {2, 8, 1000, 1000};
  EXPECT_EQ(feature_variant(db, *ws), Variant::mods_bias);
}

}  // namespace
