// The host side of the cuda backend's KV-cache path without a GPU (decode/decode_host.hpp):
// the plan for described GPUs (head-dim bucket, row tiles, resident CTAs, the split count and
// the workspace of the partial rows) on the benchmark's decode rows and on chunked prefill,
// and the support rule kv_cache_decode (new tokens with a reversed head dim, shared memory on an
// sm_86 card). The problems point at made-up addresses: nothing here dereferences them.
#include <gtest/gtest.h>

#include <cstdint>

#include "backends/cuda/device_presets.hpp"
#include "backends/cuda/decode/decode_host.hpp"
#include "backends/cuda/decode/decode_tiles.hpp"
#include "problem/kv_cache.hpp"

namespace {

using namespace strideattn;
using namespace strideattn::cuda_impl;
using i64 = std::int64_t;

using namespace strideattn::cuda_impl::test_devices;

// A decode problem: b sequences, s_q query rows, h / hg heads, head dim d, a contiguous cache of
// s_kv tokens per sequence, or a paged one of `page` tokens a page; optional new tokens.
detail::KvCacheProblem make(i64 b, i64 s_q, i64 h, i64 hg, i64 d, i64 s_kv, i64 page = 0, i64 s_new = 0,
                            i64 k_new_dim_stride = 1) {
  auto at = [](int i) { return reinterpret_cast<void*>(std::uintptr_t(1) << 40 | std::uintptr_t(i) << 36); };
  auto dense = [](void* p, i64 n, i64 s, i64 heads, i64 dd) {
    return TensorView{p, DType::bf16, {n, s, heads, dd}, {s * heads * dd, heads * dd, dd, 1}};
  };
  KvCacheArgs a;
  a.q = dense(at(1), b, s_q, h, d);
  a.o = dense(at(2), b, s_q, h, d);
  const i64 rows = page ? b * (s_kv / page) : b, slots = page ? page : s_kv;
  a.k_cache = dense(at(3), rows, slots, hg, d);
  a.v_cache = dense(at(4), rows, slots, hg, d);
  if (page) {
    a.block_table.data = static_cast<const std::int32_t*>(at(5));
    a.block_table.shape = {b, s_kv / page};
    a.block_table.stride = {s_kv / page, 1};
  }
  if (s_new) {
    a.k_new = dense(at(6), b, s_new, hg, d);
    a.v_new = dense(at(7), b, s_new, hg, d);
    a.k_new.stride[3] = k_new_dim_stride;
  }
  a.cache_seqlens = static_cast<const std::int32_t*>(at(8));
  a.memory = Memory::device;
  detail::KvCacheProblem p;
  const Status s = detail::make_kvcache_problem(a, &p);
  EXPECT_TRUE(s.ok()) << s.message();
  return p;
}

TEST(DecodePlan, BenchmarkRowsOnAnH200) {
  struct Row {
    i64 b, s_kv;
    int splits;
  };
  // GQA 32/8 and 64/8 (the row tile holds the group: 4 or 8 rows), d 128: 2 CTAs per SM.
  for (i64 h : {32, 64})
    for (Row r : {Row{1, 32768, 29}, Row{16, 8192, 2}, Row{64, 4096, 1}, Row{8, 16384, 4}})
      for (i64 page : {0, 16, 64}) {
        SCOPED_TRACE("h " + std::to_string(h) + " b " + std::to_string(r.b) + " page " + std::to_string(page));
        const DecodePlan plan = make_decode_plan(make(r.b, 1, h, 8, 128, r.s_kv, page), kH200);
        EXPECT_EQ(plan.bucket, 128);
        EXPECT_EQ(plan.row_tiles, 1);
        EXPECT_EQ(plan.per_sm, 2);
        EXPECT_EQ(plan.splits, r.splits);
        const std::size_t rows = std::size_t(r.splits * r.b * h);
        EXPECT_EQ(plan.workspace, r.splits > 1 ? (rows * 128 * 4 + 255) / 256 * 256 + rows * 4 : 0);
        EXPECT_EQ(decode_refusal(make(r.b, 1, h, 8, 128, r.s_kv, page), kH200), std::nullopt);
      }
}

TEST(DecodePlan, ChunkedPrefillLoopsOverRowTiles) {
  // (the decode kernels forced: the shape picks the dense forward, DecodePlan.DenseForward)
  // 512 query rows x a group of 4 = 2,048 rows: 128 tiles of 16; the grid is full, one split.
  const DecodePlan plan = make_decode_plan(make(4, 512, 32, 8, 128, 4096, 64), kH200, {.kv_cache_dense = false});
  EXPECT_FALSE(plan.dense);
  EXPECT_EQ(plan.row_tiles, 128);
  EXPECT_EQ(plan.splits, 1);
  EXPECT_EQ(plan.workspace, 0u);
  // d 64 and d 256 buckets, d_qk != d_v through the bucket of the larger
  EXPECT_EQ(make_decode_plan(make(2, 1, 8, 8, 64, 1024), kH200).bucket, 64);
  EXPECT_EQ(make_decode_plan(make(2, 1, 8, 8, 64, 1024), kH200).per_sm, 3);
  EXPECT_EQ(make_decode_plan(make(2, 1, 8, 8, 256, 1024), kH200).bucket, 256);
}

// Many query rows per sequence and head (s_q >= kDenseMinQueryRows) run the dense forward's
// KV-cache instantiation: the wgmma forward on an H200, the mma.sync one on an
// sm_86 card; fewer run the decode kernels, whatever group x s_q is; the test hook forces
// either. The dense plan's workspace is the forward's (the fold's slots past kFoldKeys keys).
TEST(DecodePlan, DenseForward) {
  const DecodePlan paged = make_decode_plan(make(4, 512, 32, 8, 128, 4096, 16), kH200);
  EXPECT_TRUE(paged.dense);
  EXPECT_EQ(paged.forward.main.variant, Variant::kv_cache);
  EXPECT_STREQ(paged.forward.main.entry->name, "sm90a wgmma forward");
  EXPECT_EQ(paged.workspace, 0u);
  EXPECT_NE(paged.why.find("the dense forward (sm90a wgmma forward, KV-cache instantiation, paged): 512 query "
                           "rows per sequence and head (2048 per KV head), at least 64"),
            std::string::npos)
      << paged.why;
  const DecodePlan contiguous = make_decode_plan(make(4, 512, 32, 8, 64, 4096), kH200);
  EXPECT_TRUE(contiguous.dense);
  EXPECT_EQ(contiguous.forward.main.variant, Variant::kv_cache);
  EXPECT_STREQ(contiguous.forward.main.entry->name, "sm90a mma.sync forward");
  const DecodePlan sm86 = make_decode_plan(make(2, 64, 8, 2, 64, 1024, 3), kSm86);
  EXPECT_TRUE(sm86.dense);
  EXPECT_STREQ(sm86.forward.main.entry->name, "sm80 mma.sync forward");
  EXPECT_EQ(sm86.forward.main.variant, Variant::kv_cache);
  // the threshold is s_q, not group x s_q (8 x 8 = 64 rows per KV head stay on the decode kernels)
  EXPECT_FALSE(make_decode_plan(make(2, 63, 32, 8, 128, 1024, 16), kH200).dense);
  EXPECT_TRUE(make_decode_plan(make(2, 64, 8, 8, 128, 1024, 16), kH200).dense);
  EXPECT_FALSE(make_decode_plan(make(2, 8, 64, 8, 128, 1024, 16), kH200).dense);
  EXPECT_NE(make_decode_plan(make(2, 8, 64, 8, 128, 1024, 16), kH200).why.find("the decode kernels"),
            std::string::npos);
  // forced either way
  EXPECT_TRUE(make_decode_plan(make(2, 1, 32, 8, 128, 1024, 16), kH200, {.kv_cache_dense = true}).dense);
  EXPECT_FALSE(make_decode_plan(make(2, 512, 32, 8, 128, 1024, 16), kH200, {.kv_cache_dense = false}).dense);
  // a long cache: the fold, its slots in the workspace
  const DecodePlan longer = make_decode_plan(make(2, 128, 32, 8, 128, 32768, 64), kH200);
  EXPECT_TRUE(longer.dense);
  EXPECT_GT(longer.forward.outer_count, 0);
  EXPECT_EQ(longer.forward.main.variant, Variant::kv_cache_fold);
  EXPECT_EQ(longer.workspace, longer.forward.workspace.total);
  EXPECT_GT(longer.workspace, 0u);
  const DecodePlan longer_c = make_decode_plan(make(2, 128, 32, 8, 128, 32768), kH200);
  EXPECT_EQ(longer_c.forward.main.variant, Variant::kv_cache_fold);
  EXPECT_GT(longer_c.forward.outer_count, 0);
  // the support rule of the dense path is the forward plan's
  EXPECT_EQ(kv_cache_refusal(make(4, 512, 32, 8, 128, 4096, 16), kH200, {}), std::nullopt);
  const auto reversed = kv_cache_refusal(make(2, 100, 8, 2, 64, 256, 16, 1, -1), kH200, {});
  ASSERT_TRUE(reversed.has_value());
  EXPECT_NE(reversed->find("k_new has a head-dim stride of -1; supported: 1"), std::string::npos) << *reversed;
}

TEST(DecodePlan, SupportRule) {
  // new tokens with a reversed head dim (valid input; the kernels read rows forwards)
  const auto reversed = decode_refusal(make(2, 1, 8, 2, 64, 256, 16, 1, -1), kH200);
  ASSERT_TRUE(reversed.has_value());
  EXPECT_NE(reversed->find("k_new has a head-dim stride of -1; supported: 1"), std::string::npos) << *reversed;
  // an sm_86 card grants 99 KiB per block: the d <= 64 kernel (66 KiB) fits, d <= 128 does not
  EXPECT_EQ(decode_refusal(make(2, 1, 8, 2, 64, 256, 16), kSm86), std::nullopt);
  const auto smem = decode_refusal(make(2, 1, 8, 2, 128, 256, 16), kSm86);
  ASSERT_TRUE(smem.has_value());
  EXPECT_NE(smem->find("needs 102400 bytes of shared memory per block; device 1 grants 101376"), std::string::npos)
      << *smem;
}

}  // namespace
