// The KV-cache addressing of the dense forward (src/backends/cuda/common/kv_cache_rows.hpp), on
// the host: FastDivmod equals / and % for every page size 1..256 over token indices up to
// 2^31 - 1; a CacheRef puts (token, head) where the block table and the cache's strides put
// it (page sizes 1, 3, 16, 200; shuffled and transposed tables, head-major pages), gives null
// for an entry outside the pool, and follows a contiguous cache's strides; kv_seq_lengths is the promise rule (broken
// lengths: no rows, no keys).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "backends/cuda/common/kv_cache_rows.hpp"

namespace {

using namespace strideattn::cuda_impl;
using strideattn::kernel::Strides;
using i64 = std::int64_t;

TEST(CudaKvCacheRows, FastDivmodIsExact) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any(0, 0x7fffffffu);
  for (std::uint32_t d = 1; d <= 256; ++d) {
    const FastDivmod f(d);
    std::vector<std::uint32_t> ns = {
        0, 1, d - 1, d, d + 1, 0x7fffffffu, 0x7fffffffu - d, 0x7fffffffu / d * d, 0x7fffffffu / d * d - 1};
    for (int i = 0; i < 2000; ++i) ns.push_back(any(rng));
    for (std::uint32_t n = 0; n < 5000; ++n) ns.push_back(n);
    for (std::uint32_t n : ns) {
      const std::uint32_t q = f.div(n);
      ASSERT_EQ(q, n / d) << n << " / " << d;
      ASSERT_EQ(f.mod(n, q), n % d) << n << " % " << d;
    }
  }
}

TEST(CudaKvCacheRows, PagedCacheFollowsTheBlockTable) {
  const std::vector<std::uint16_t> buffer(1);  // (addresses are compared, never read)
  const std::uint16_t* const origin = buffer.data();
  const i64 b = 3, hg = 4, d = 64, max_pages = 9;
  for (i64 page : {1, 3, 16, 200})
    for (bool head_major : {false, true})
      for (bool transposed : {false, true}) {
        const i64 pages = b * max_pages + 2;
        // [page, slot, head, d] or [page, head, slot, d], rows padded by 8
        const Strides st = head_major ? Strides{hg * page * (d + 8), d + 8, page * (d + 8), 1}
                                      : Strides{page * hg * (d + 8), hg * (d + 8), d + 8, 1};
        std::vector<std::int32_t> table(static_cast<std::size_t>(b * max_pages));
        std::vector<std::int32_t> order(static_cast<std::size_t>(pages));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), std::mt19937(unsigned(page)));
        const i64 bt_b = transposed ? 1 : max_pages, bt_p = transposed ? b : 1;
        for (i64 n = 0; n < b; ++n)
          for (i64 j = 0; j < max_pages; ++j)
            table[std::size_t(n * bt_b + j * bt_p)] = order[std::size_t(n * max_pages + j)];
        table[std::size_t(1 * bt_b + 2 * bt_p)] = std::int32_t(pages);  // outside the pool
        table[std::size_t(2 * bt_b + 0 * bt_p)] = -1;
        KvCacheParams kv;
        kv.block_table = table.data();
        kv.bt_b = bt_b, kv.bt_p = bt_p, kv.num_pages = pages;
        kv.page = FastDivmod(std::uint32_t(page));
        for (i64 n = 0; n < b; ++n) {
          const CacheRef<const std::uint16_t> ref = cache_ref(origin, st, kv, n, 0);
          for (i64 t = 0; t < max_pages * page; t += 1 + t / 7)
            for (i64 h = 0; h < hg; ++h) {
              const i64 pg = table[std::size_t(n * bt_b + (t / page) * bt_p)];
              const std::uint16_t* want =
                  pg < 0 || pg >= pages ? nullptr : origin + (pg * st.b + (t % page) * st.s + h * st.h);
              ASSERT_EQ(ref.row(t, h), want) << "page " << page << " n " << n << " t " << t << " h " << h;
            }
        }
      }
}

TEST(CudaKvCacheRows, ContiguousCacheFollowsItsStrides) {
  const std::vector<std::uint16_t> buffer(1);
  const std::uint16_t* const origin = buffer.data();
  const Strides st{5000 * 4 * 72, 4 * 72, 72, 1};  // [b, s_max 5000, hg 4, d 64] with padded rows
  const KvCacheParams kv;                          // no block table
  for (i64 n = 0; n < 3; ++n) {
    const CacheRef<const std::uint16_t> ref = cache_ref(origin, st, kv, n, 0);
    for (i64 t : {0, 1, 4999})
      for (i64 h = 0; h < 4; ++h) ASSERT_EQ(ref.row(t, h), origin + (n * st.b + t * st.s + h * st.h));
  }
}

TEST(CudaKvCacheRows, LengthsFollowThePromises) {
  const std::int32_t cache[] = {0, 10, 90, -1, 100, 5};
  const std::int32_t q[] = {8, 0, 8, 8, 8, 9};
  struct Want {
    i64 attended, rows;
    bool broken;
  };
  // s_q 8, s_new 10, capacity 100
  const Want want[] = {{10, 8, false}, {20, 0, false}, {100, 8, false}, {0, 0, true}, {0, 0, true}, {0, 0, true}};
  for (int n = 0; n < 6; ++n) {
    const SeqLengths s = kv_seq_lengths(cache, q, 8, 10, 100, n);
    EXPECT_EQ(s.attended, want[n].attended) << n;
    EXPECT_EQ(s.q_rows, want[n].rows) << n;
    EXPECT_EQ(s.broken, want[n].broken) << n;
  }
  const SeqLengths all = kv_seq_lengths(cache, nullptr, 8, 0, 100, 2);
  EXPECT_EQ(all.q_rows, 8);
  EXPECT_EQ(all.attended, 90);
}

}  // namespace
