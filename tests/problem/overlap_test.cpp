// The byte-overlap algebra (src/problem/overlap.cpp) against hand-built cases and brute force:
// views_overlap on small fixed views and on thousands of random ones (nested or not, stride
// 0, reversed dimensions, mixed element sizes) compared with the exact byte-set
// intersection, and the "output overlaps itself" rule compared with counting each element's
// address.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "problem/overlap.hpp"
#include "problem/problem.hpp"
#include "support/problem_case.hpp"

namespace strideattn::detail {
namespace {

TEST(ViewsOverlap, DisjointByteRanges) {
  std::vector<std::uint16_t> buf(256);
  TensorView a = bshd(buf.data(), 1, 2, 1, 8), b = bshd(buf.data() + 16, 1, 2, 1, 8);
  EXPECT_FALSE(views_overlap(a, b));
  b.data = buf.data() + 15;
  EXPECT_TRUE(views_overlap(a, b));
}

TEST(ViewsOverlap, InterleavedShareBoundingBoxButNoElement) {
  std::vector<std::uint16_t> buf(4096);
  // even and odd heads of one [s=16, 2*h=8, d=8] buffer
  TensorView even, odd;
  even.data = buf.data();
  odd.data = buf.data() + 8;
  even.shape = odd.shape = {1, 16, 4, 8};
  even.stride = odd.stride = {0, 64, 16, 1};
  EXPECT_FALSE(views_overlap(even, odd));
  EXPECT_FALSE(views_overlap(odd, even));
  EXPECT_TRUE(views_overlap(even, even));
  // a one-element overlap: odd shifted so that its last element lands on one even element
  TensorView one = odd;
  one.data = buf.data() + 8 - 7;  // row 0 of `one` covers elements 1..8: element 1..7 are even
  EXPECT_TRUE(views_overlap(even, one));
  // exactly one shared element: a single element view at the last element of `even`
  TensorView single;
  single.data = buf.data() + 15 * 64 + 3 * 16 + 7;
  single.shape = {1, 1, 1, 1};
  single.stride = {999, -3, 77, 1};
  EXPECT_TRUE(views_overlap(even, single));
  single.data = buf.data() + 15 * 64 + 3 * 16 + 8;  // the next element belongs to `odd`
  EXPECT_FALSE(views_overlap(even, single));
  EXPECT_TRUE(views_overlap(odd, single));
}

TEST(ViewsOverlap, NonNestedViewsAreCheckedExactly) {
  // Strides (s 3, h 2) over d = 1 are not nested on either side: addresses 0,2,3,5,6,8,...
  std::vector<std::uint16_t> buf(1024);
  TensorView a;
  a.data = buf.data();
  a.shape = {1, 4, 2, 1};
  a.stride = {0, 3, 2, 1};  // {0,2,3,5,6,8,9,11}
  TensorView b = a;
  b.data = buf.data() + 1;  // {1,3,4,6,...}: shares 3 with a
  EXPECT_TRUE(views_overlap(a, b));
  TensorView c;
  c.data = buf.data() + 1;
  c.shape = {1, 4, 1, 1};
  c.stride = {0, 3, 5, 1};  // {1,4,7,10}: a holds 0,2,3,5,6,8,9,11 -> no overlap
  EXPECT_FALSE(views_overlap(a, c));
}

TEST(ViewsOverlap, DifferentElementSizes) {
  std::vector<float> buf(64);
  TensorView h16;  // 8 f16 elements = bytes [0, 16)
  h16.data = buf.data();
  h16.dtype = DType::f16;
  h16.shape = {1, 1, 1, 8};
  h16.stride = {8, 8, 8, 1};
  TensorView f32 = h16;
  f32.dtype = DType::f32;
  f32.data = buf.data() + 4;  // bytes [16, 48)
  EXPECT_FALSE(views_overlap(h16, f32));
  f32.data = buf.data() + 3;
  EXPECT_TRUE(views_overlap(h16, f32));
}

TEST(ViewsOverlap, MatchesBruteForceOnRandomSmallViews) {
  // Random small views (nested or not, stride 0, gaps, mixed element sizes) over one byte
  // arena: views_overlap must equal the byte-set intersection computed by brute force.
  std::vector<std::uint32_t> arena(4096);
  auto* base = reinterpret_cast<unsigned char*>(arena.data());
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next = [&](std::uint64_t n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<std::int64_t>(x % n);
  };
  auto place = [&](TensorView& v) {  // element-aligned, every element within the arena
    std::int64_t below = 0;          // elements reversed dimensions reach below the data pointer
    for (int i = 0; i < 3; ++i)
      if (v.stride[i] < 0) below += (v.shape[i] - 1) * -v.stride[i];
    v.data = base + static_cast<std::int64_t>(size_of(v.dtype)) * (below + next(200));
  };
  auto random_view = [&]() {
    TensorView v;
    v.dtype = next(3) == 0 ? DType::f32 : DType::f16;
    const std::int64_t es = static_cast<std::int64_t>(size_of(v.dtype));
    for (int i = 0; i < 3; ++i) {
      v.shape[i] = 1 + next(4);
      v.stride[i] = next(40);
    }
    v.shape[3] = 1 + next(6);
    v.stride[3] = 1;
    for (int i = 0; i < 3; ++i)
      if (next(3) == 0) v.stride[i] = -v.stride[i];  // a reversed dimension
    place(v);
    return v;
  };
  auto bytes_of = [&](const TensorView& v) {
    std::vector<bool> set(arena.size() * 4, false);
    const std::int64_t es = static_cast<std::int64_t>(size_of(v.dtype));
    const std::int64_t start = static_cast<unsigned char*>(v.data) - base;
    for (std::int64_t b = 0; b < v.shape[0]; ++b)
      for (std::int64_t s = 0; s < v.shape[1]; ++s)
        for (std::int64_t h = 0; h < v.shape[2]; ++h)
          for (std::int64_t d = 0; d < v.shape[3]; ++d) {
            const std::int64_t e = b * v.stride[0] + s * v.stride[1] + h * v.stride[2] + d;
            for (std::int64_t k = 0; k < es; ++k) set[static_cast<std::size_t>(start + e * es + k)] = true;
          }
    return set;
  };
  int overlaps = 0, disjoint_but_boxes_meet = 0;
  for (int trial = 0; trial < 6000; ++trial) {
    const TensorView a = random_view();
    TensorView b = random_view();
    if (trial % 2 == 0) {  // same strides, shifted, other extents: views side by side in one buffer
      b.stride = a.stride;
      b.dtype = a.dtype;
      place(b);
    }
    const std::vector<bool> sa = bytes_of(a), sb = bytes_of(b);
    bool truth = false;
    std::size_t lo_a = sa.size(), hi_a = 0, lo_b = sb.size(), hi_b = 0;
    for (std::size_t i = 0; i < sa.size(); ++i) {
      truth = truth || (sa[i] && sb[i]);
      if (sa[i]) lo_a = std::min(lo_a, i), hi_a = i;
      if (sb[i]) lo_b = std::min(lo_b, i), hi_b = i;
    }
    ASSERT_EQ(views_overlap(a, b), truth) << "trial " << trial;
    ASSERT_EQ(views_overlap(b, a), truth) << "trial " << trial;
    overlaps += truth;
    disjoint_but_boxes_meet += !truth && lo_a <= hi_b && lo_b <= hi_a;
  }
  // The sweep exercised both answers, including the bounding-box-only case.
  EXPECT_GT(overlaps, 300);
  EXPECT_GT(disjoint_but_boxes_meet, 100);
}

TEST(ViewsOverlap, SelfOverlapMatchesBruteForce) {
  // An output view is rejected exactly when two of its elements share a byte.
  std::uint64_t x = 0x2545f4914f6cdd1dull;
  auto next = [&](std::uint64_t n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<std::int64_t>(x % n);
  };
  std::vector<std::uint16_t> o_arena(8192), q(4096), k(4096), v(4096);
  int rejected = 0, accepted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    TensorView o;
    o.data = o_arena.data();
    for (int i = 0; i < 3; ++i) {
      o.shape[i] = 1 + next(4);
      o.stride[i] = next(24);
    }
    o.shape[3] = 1 + next(5);
    o.stride[3] = 1;
    std::vector<int> hits(o_arena.size(), 0);
    bool truth = false;
    for (std::int64_t b = 0; b < o.shape[0]; ++b)
      for (std::int64_t s = 0; s < o.shape[1]; ++s)
        for (std::int64_t h = 0; h < o.shape[2]; ++h)
          for (std::int64_t d = 0; d < o.shape[3]; ++d)
            truth =
                truth || ++hits[static_cast<std::size_t>(b * o.stride[0] + s * o.stride[1] + h * o.stride[2] + d)] > 1;
    ForwardArgs a;
    a.q = bshd(q.data(), o.shape[0], o.shape[1], o.shape[2], o.shape[3]);
    a.k = bshd(k.data(), o.shape[0], o.shape[1], o.shape[2], o.shape[3]);
    a.v = bshd(v.data(), o.shape[0], o.shape[1], o.shape[2], o.shape[3]);
    a.o = o;
    const Status st = check(a);
    if (truth) {
      EXPECT_INVALID(st, "o overlaps itself");
      ++rejected;
    } else {
      EXPECT_TRUE(st.ok()) << "trial " << trial << ": " << st.message();
      ++accepted;
    }
  }
  EXPECT_GT(rejected, 200);
  EXPECT_GT(accepted, 200);
}

}  // namespace
}  // namespace strideattn::detail
