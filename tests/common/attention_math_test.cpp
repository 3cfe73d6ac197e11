// Tests of the mask tile arithmetic in src/common/attention_math.hpp that the kernels use to
// skip masking: every helper against the per-element rule (MaskRule::visible), exhaustively
// over small problems of every mask kind, window and length relation (s_q <, =, > s_kv).
#include <gtest/gtest.h>

#include <cstdint>

#include "common/attention_math.hpp"

namespace {

using strideattn::kernel::MaskRule;

// Every (s_q, s_kv) up to 7, every mask kind, windows unbounded or 0..3 on either side.
template <class F>
void for_each_mask(F&& f) {
  const std::int64_t windows[] = {-1, 0, 1, 3};
  for (std::int64_t s_q = 0; s_q <= 7; ++s_q)
    for (std::int64_t s_kv = 0; s_kv <= 7; ++s_kv)
      for (int kind = 0; kind <= 2; ++kind)
        for (std::int64_t left : windows)
          for (std::int64_t right : windows) {
            MaskRule m;
            m.s_q = s_q, m.s_kv = s_kv, m.kind = kind, m.left = left, m.right = right;
            f(m);
          }
}

bool all_visible(const MaskRule& m, std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
  for (std::int64_t i = r0; i < r1; ++i)
    for (std::int64_t j = c0; j < c1; ++j)
      if (!m.visible(i, j)) return false;
  return true;
}

TEST(AttentionMath, TileFullyVisibleMatchesElementRule) {
  int checked = 0;
  for_each_mask([&](const MaskRule& m) {
    for (std::int64_t r0 = 0; r0 < m.s_q; ++r0)
      for (std::int64_t r1 = r0 + 1; r1 <= m.s_q; ++r1)
        for (std::int64_t c0 = 0; c0 < m.s_kv; ++c0)
          for (std::int64_t c1 = c0 + 1; c1 <= m.s_kv; ++c1, ++checked)
            ASSERT_EQ(strideattn::kernel::tile_fully_visible(m, r0, r1, c0, c1), all_visible(m, r0, r1, c0, c1))
                << "kind " << m.kind << " s_q " << m.s_q << " s_kv " << m.s_kv << " left " << m.left << " right "
                << m.right << " rows [" << r0 << ", " << r1 << ") keys [" << c0 << ", " << c1 << ")";
  });
  EXPECT_GT(checked, 100000);
}

// The hoisted form the 8-warp backward uses: one row interval per key block, then a range
// check per row block, equal to tile_fully_visible for every row block.
TEST(AttentionMath, RowsSeeingAllKeysIsTheHoistedTileTest) {
  int checked = 0, full = 0;
  for_each_mask([&](const MaskRule& m) {
    for (std::int64_t c0 = 0; c0 < m.s_kv; ++c0)
      for (std::int64_t c1 = c0 + 1; c1 <= m.s_kv; ++c1) {
        const auto rows = strideattn::kernel::rows_seeing_all_keys(m, c0, c1);
        for (std::int64_t r0 = 0; r0 < m.s_q; ++r0)
          for (std::int64_t r1 = r0 + 1; r1 <= m.s_q; ++r1, ++checked) {
            const bool expect = all_visible(m, r0, r1, c0, c1);
            full += expect;
            ASSERT_EQ(r0 >= rows.begin && r1 <= rows.end, expect)
                << "kind " << m.kind << " s_q " << m.s_q << " s_kv " << m.s_kv << " left " << m.left << " right "
                << m.right << " rows [" << r0 << ", " << r1 << ") keys [" << c0 << ", " << c1 << ") interval ["
                << rows.begin << ", " << rows.end << ")";
          }
      }
  });
  EXPECT_GT(checked, 100000);
  EXPECT_GT(full, 10000);  // both answers occur often
  EXPECT_GT(checked - full, 10000);
}

// The per-key interval the wgmma backward masks S^T with, against the element rule, for every
// key of the problem and two past its end.
TEST(AttentionMath, QueriesSeeingKeyIsTheElementRule) {
  int checked = 0, seen = 0;
  for_each_mask([&](const MaskRule& m) {
    for (std::int64_t j = 0; j < m.s_kv + 2; ++j) {
      const auto q = strideattn::kernel::queries_seeing_key(m, j);
      for (std::int64_t i = 0; i < m.s_q; ++i, ++checked) {
        const bool expect = j < m.s_kv && m.visible(i, j);
        seen += expect;
        ASSERT_EQ(i >= q.begin && i < q.end, expect)
            << "kind " << m.kind << " s_q " << m.s_q << " s_kv " << m.s_kv << " left " << m.left << " right " << m.right
            << " query " << i << " key " << j << " interval [" << q.begin << ", " << q.end << ")";
      }
    }
  });
  EXPECT_GT(checked, 50000);
  EXPECT_GT(seen, 10000);
  EXPECT_GT(checked - seen, 10000);
}

}  // namespace
