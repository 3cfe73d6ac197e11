// KV-cache attention on `cpu` (docs/semantics.md "KV cache"): against the test's gathered oracle
// (a dense problem per sequence on `reference`) within fp32 rounding, over page sizes 1, 3, 16
// and 256, contiguous caches, padded / head-major strides, transposed and shared block tables,
// appends, GQA and MQA, masks and windows, query lengths and empty caches; paged and contiguous
// caches holding the same tokens give the same bytes; f16 / bf16 within the correctness rule's
// scale; the cache after the append; errors found while reading the lengths write nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "../../support/kv_case.hpp"

namespace strideattn::test_support {
namespace {

// O / LSE against the oracle within `tol` (relative to 1 + |value|); caches and guards exact.
void check(KvCase& c, Backend backend, double tol) {
  const KvCase::Dense want = c.oracle();
  ASSERT_EQ(want.o.size(), std::size_t(c.b * c.s_q * c.h * c.dv));
  const Status s = forward_with_kvcache(c.args(backend));
  ASSERT_TRUE(s.ok()) << s.message();
  for (std::size_t i = 0; i < want.o.size(); ++i)
    ASSERT_NEAR(c.o.get(i64(i)), want.o[i], tol * (1 + std::abs(want.o[i]))) << "o[" << i << "]";
  for (std::size_t i = 0; i < want.lse.size(); ++i) {
    if (std::isinf(want.lse[i]))
      ASSERT_EQ(c.lse[i + 8], want.lse[i]) << "lse[" << i << "]";
    else
      ASSERT_NEAR(c.lse[i + 8], want.lse[i], 1e-5 * (1 + std::abs(want.lse[i]))) << "lse[" << i << "]";
  }
  std::vector<unsigned char> k, v;
  c.expected_caches(&k, &v);
  EXPECT_TRUE(c.kc.bytes == k) << "k_cache after the call";
  EXPECT_TRUE(c.vc.bytes == v) << "v_cache after the call";
  EXPECT_TRUE(c.guards_intact());
}

TEST(CpuKvCache, MatchesGatheredDenseAcrossLayoutsMasksAndAppends) {
  struct Shape {
    bool paged;
    i64 page_size, max_pages;
    std::vector<std::int32_t> lens;
    i64 s_new, s_q;
  };
  const std::vector<Shape> shapes = {
      {true, 1, 40, {35, 0, 11}, 1, 1},    {true, 3, 30, {70, 3, 0}, 2, 3}, {true, 16, 8, {100, 16, 1}, 3, 9},
      {true, 256, 1, {200, 30, 0}, 4, 70}, {false, 0, 0, {90, 4, 0}, 2, 3}, {true, 7, 10, {40, 69, 6}, 0, 2},
  };
  const std::vector<std::pair<MaskKind, Window>> masks = {{MaskKind::none, {}},
                                                          {MaskKind::causal_bottom_right, {}},
                                                          {MaskKind::causal, {}},
                                                          {MaskKind::none, {8, 0}},
                                                          {MaskKind::causal_bottom_right, {3, -1}}};
  std::uint64_t seed = 500;
  for (const Shape& sh : shapes)
    for (const auto& [kind, window] : masks)
      for (int variant = 0; variant < 2; ++variant) {
        KvCase c;
        c.b = 3;
        c.paged = sh.paged;
        c.page_size = sh.page_size;
        c.max_pages = sh.max_pages;
        c.s_max = 96;
        c.cache_seqlens = sh.lens;
        c.s_new = sh.s_new;
        c.s_q = sh.s_q;
        c.h = variant ? 6 : 4;
        c.hg = variant ? 1 : 2;
        c.d = variant ? 24 : 32;
        c.dv = variant ? 40 : 32;
        c.pad = variant ? 5 : 0;
        c.head_major = variant == 1;
        c.transposed_table = variant == 1;
        if (variant) c.seqlens_q = {std::int32_t(sh.s_q), 0, std::int32_t(sh.s_q > 1 ? sh.s_q - 1 : 1)};
        c.options.mask = kind;
        c.options.window = window;
        c.seed = seed++;
        c.build();
        SCOPED_TRACE("paged " + std::to_string(sh.paged) + " page " + std::to_string(sh.page_size) + " mask " +
                     std::string(to_string(kind)) + " window " + std::to_string(window.left) + "," +
                     std::to_string(window.right) + " variant " + std::to_string(variant));
        check(c, Backend::cpu, 2e-5);
      }
}

TEST(CpuKvCache, LowPrecisionWithinTheDtypesRounding) {
  for (DType dt : {DType::f16, DType::bf16}) {
    KvCase c;
    c.dtype = dt;
    c.page_size = 16, c.max_pages = 4;
    c.cache_seqlens = {40, 17};
    c.s_new = 3;
    c.s_q = 3;
    c.d = c.dv = 64;
    c.options.mask = MaskKind::causal_bottom_right;
    c.build();
    // Both run the dtype's P rounding in their own order: a few ulps of |O| <= ~3.
    check(c, Backend::cpu, dt == DType::f16 ? 4e-3 : 3e-2);
  }
}

// The same tokens in a contiguous cache and in a shuffled paged one: the same bytes out.
TEST(CpuKvCache, PagedEqualsContiguous) {
  for (Backend backend : {Backend::cpu, Backend::reference}) {
    KvCase paged;
    paged.b = 2, paged.page_size = 5, paged.max_pages = 6;
    paged.cache_seqlens = {23, 9};
    paged.s_new = 2, paged.s_q = 4;
    paged.options.mask = MaskKind::causal_bottom_right;
    paged.build();
    KvCase flat = paged;
    flat.paged = false;
    flat.s_max = 30;
    flat.build();
    flat.q = paged.q, flat.kn = paged.kn, flat.vn = paged.vn;  // the same inputs, and the same cached tokens
    for (i64 n = 0; n < 2; ++n)
      for (i64 t = 0; t < paged.cache_seqlens[std::size_t(n)]; ++t)
        for (i64 hh = 0; hh < paged.hg; ++hh)
          for (i64 e = 0; e < paged.d; ++e) {
            flat.kc.set(flat.cache_index(n, t, hh, e, flat.d), paged.kc.get(paged.cache_index(n, t, hh, e, paged.d)));
            flat.vc.set(flat.cache_index(n, t, hh, e, flat.dv), paged.vc.get(paged.cache_index(n, t, hh, e, paged.dv)));
          }
    flat.kc_before = flat.kc.bytes, flat.vc_before = flat.vc.bytes;
    ASSERT_TRUE(forward_with_kvcache(paged.args(backend)).ok());
    ASSERT_TRUE(forward_with_kvcache(flat.args(backend)).ok());
    EXPECT_TRUE(paged.o.bytes == flat.o.bytes) << to_string(backend);
    EXPECT_EQ(paged.lse, flat.lse) << to_string(backend);
  }
}

TEST(CpuKvCache, EmptyCachesAndSharedPrefix) {
  for (i64 s_new : {0, 3}) {
    KvCase c;
    c.cache_seqlens = {0, 0};
    c.s_new = s_new, c.s_q = 3;
    c.options.mask = MaskKind::causal_bottom_right;
    c.build();
    check(c, Backend::cpu, 2e-5);
  }
  KvCase c;
  c.page_size = 4;
  c.cache_seqlens = {6, 5};
  c.s_new = 1;
  c.share_prefix = true;
  c.build();
  check(c, Backend::cpu, 2e-5);
}

TEST(CpuKvCache, LengthErrorsWriteNothing) {
  KvCase c;
  c.cache_seqlens = {5, 2};
  c.s_new = 1;
  c.build();
  c.table[std::size_t(c.table_at(1, 0))] = 10;  // 10 pages: 0..9
  Status s = forward_with_kvcache(c.args(Backend::cpu));
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.message();
  EXPECT_NE(s.message().find("block_table[1, 0] is 10"), std::string::npos) << s.message();
  c.table[std::size_t(c.table_at(1, 0))] = 0;
  c.cache_seqlens[0] = 12;
  s = forward_with_kvcache(c.args(Backend::cpu));
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.message();
  EXPECT_NE(s.message().find("cache_seqlens[0] is 12 with 1 new tokens"), std::string::npos) << s.message();
  EXPECT_TRUE(c.outputs_untouched());
  EXPECT_TRUE(c.kc.bytes == c.kc_before && c.vc.bytes == c.vc_before);
}

TEST(CpuKvCache, AutoPicksCpuForHostMemory) {
  KvCase c;
  c.build();
  const Explanation ex = explain(c.args(Backend::automatic));
  ASSERT_TRUE(ex.validation.ok()) << ex.validation.message();
  ASSERT_TRUE(ex.chosen.has_value());
  EXPECT_EQ(*ex.chosen, Backend::cpu);
  check(c, Backend::automatic, 2e-5);
}

}  // namespace
}  // namespace strideattn::test_support
