// Layout views (tools/harness/views.cpp) and layout description (src/problem/layout.cpp):
// every named layout the harness makes is named back correctly by describe_layout (forward
// and backward problems built by make_problem from host buffers), the odd views of docs/design.md
// are not given a wrong name, size-1 dims with garbage strides keep their name, and
// make_layout_views rejects what a packed layout cannot hold.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "harness/views.hpp"
#include "problem/layout.hpp"
#include "problem/problem.hpp"

namespace strideattn {
namespace {

using harness::LayoutViews;
using harness::ProblemSizes;
using harness::ViewSpec;

// Host buffers for the views of one layout, sized by required_extent.
struct Buffers {
  std::map<std::string, std::vector<std::uint16_t>> mem;
  std::vector<float> lse;
  void reserve(const ViewSpec& v) {
    auto& b = mem[v.buffer];
    const auto n = static_cast<std::size_t>(harness::required_extent(v));
    if (b.size() < n) b.resize(n);
  }
  TensorView view(const ViewSpec& v) {
    TensorView t;
    t.data = mem.at(v.buffer).data() + v.offset;
    t.dtype = DType::bf16;
    t.shape = v.shape;
    t.stride = v.stride;
    return t;
  }
};

void set_varlen(const ProblemSizes& sizes, Varlen* varlen) {
  varlen->seqlens_q = sizes.seqlens_q;
  varlen->seqlens_kv = sizes.seqlens_kv;
  varlen->offsets_q = sizes.offsets_q;
  varlen->offsets_kv = sizes.offsets_kv;
}

// describe_layout of the forward and backward problems the layout's views make; both must
// validate. Returns the forward description (the backward one must be equal).
std::string describe(std::string_view layout, const ProblemSizes& sizes) {
  LayoutViews lv;
  Status s = harness::make_layout_views(layout, sizes, &lv);
  EXPECT_TRUE(s.ok()) << layout << ": " << s.message();
  if (!s.ok()) return "";
  Buffers buf;
  for (const ViewSpec* v : {&lv.q, &lv.k, &lv.v, &lv.o, &lv.d_o, &lv.dq, &lv.dk, &lv.dv}) buf.reserve(*v);
  const std::int64_t b = sizes.varlen() ? 1 : sizes.batch;
  const std::int64_t sq = sizes.varlen() ? sizes.q_tokens() : sizes.s_q;
  buf.lse.resize(static_cast<std::size_t>(b * sizes.heads * sq));
  LseView lse;
  lse.data = buf.lse.data();
  lse.shape = {b, sizes.heads, sq};
  lse.stride = {sizes.heads * sq, sq, 1};

  ForwardArgs f;
  f.q = buf.view(lv.q);
  f.k = buf.view(lv.k);
  f.v = buf.view(lv.v);
  f.o = buf.view(lv.o);
  f.lse = lse;
  set_varlen(sizes, &f.varlen);
  detail::Problem fp;
  s = detail::make_problem(f, &fp);
  EXPECT_TRUE(s.ok()) << layout << " forward: " << s.message();
  if (!s.ok()) return "";

  BackwardArgs g;
  g.q = f.q;
  g.k = f.k;
  g.v = f.v;
  g.o = f.o;
  g.lse = lse;
  g.d_o = buf.view(lv.d_o);
  g.dq = buf.view(lv.dq);
  g.dk = buf.view(lv.dk);
  g.dv = buf.view(lv.dv);
  set_varlen(sizes, &g.varlen);
  detail::Problem bp;
  s = detail::make_problem(g, &bp);
  EXPECT_TRUE(s.ok()) << layout << " backward: " << s.message();
  if (!s.ok()) return "";
  const std::string name = detail::describe_layout(fp);
  EXPECT_EQ(detail::describe_layout(bp), name) << layout;
  // The public explain() reports the same description.
  EXPECT_EQ(explain(f).layout, name) << layout;
  return name;
}

ProblemSizes dense(std::int64_t heads, std::int64_t kv_heads, std::int64_t s_q, std::int64_t s_kv) {
  ProblemSizes z;
  z.batch = 2;
  z.s_q = s_q;
  z.s_kv = s_kv;
  z.heads = heads;
  z.kv_heads = kv_heads;
  z.d_qk = z.d_v = 16;
  return z;
}

ProblemSizes varlen(std::int64_t heads, std::int64_t kv_heads, bool same_tokens) {
  ProblemSizes z = dense(heads, kv_heads, 1, 1);
  z.seqlens_q = {3, 0, 4};
  z.offsets_q = {0, 4, 5};  // one padding token between sequence 0 and 2, and after
  if (same_tokens) {
    z.seqlens_kv = {2, 1, 3};
    z.offsets_kv = {0, 3, 6};
  } else {
    z.seqlens_kv = {5, 2, 0};
  }
  return z;
}

TEST(LayoutNames, EveryNamedLayoutIsNamedBack) {
  const char* gqa_ok[] = {"bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd", "sbhd_sb2hd",
                          "sbhd_sbh2d",     "bshd_bs2hd",     "bshd_bsh2d"};
  for (const char* name : gqa_ok) {
    EXPECT_EQ(describe(name, dense(4, 2, 5, 7)), name);
    EXPECT_EQ(describe(name, dense(4, 4, 6, 6)), name);
  }
  for (const char* name : {"sb3hd", "sbh3d", "bs3hd", "bsh3d"}) EXPECT_EQ(describe(name, dense(4, 4, 6, 6)), name);
  for (const char* name : {"thd_thd_thd", "thd_t2hd", "thd_th2d"}) {
    EXPECT_EQ(describe(name, varlen(4, 2, false)), name);
    EXPECT_EQ(describe(name, varlen(2, 2, true)), name);
  }
  for (const char* name : {"t3hd", "th3d"}) EXPECT_EQ(describe(name, varlen(4, 4, true)), name);
}

TEST(LayoutNames, SplitOfFusedBufferIsDescribedAsSplit) {
  EXPECT_EQ(describe("sb(h+2hg)d", dense(4, 1, 6, 6)),
            "q, k, v share one buffer: split of sb(h+2hg)d with h 4, hg 1, head stride 16, sequence stride 192, "
            "batch stride 96");
  EXPECT_EQ(describe("bs(h+2hg)d", dense(4, 2, 6, 6)),
            "q, k, v share one buffer: split of bs(h+2hg)d with h 4, hg 2, head stride 16, sequence stride 128, "
            "batch stride 768");
  const std::string t = describe("t(h+2hg)d", varlen(6, 2, true));
  EXPECT_NE(t.find("split of t(h+2hg)d with h 6, hg 2"), std::string::npos) << t;
  // With h == hg the split is exactly the packed 3hd memory, and is named so.
  EXPECT_EQ(describe("sb(h+2hg)d", dense(4, 4, 6, 6)), "sb3hd");
  EXPECT_EQ(describe("bs(h+2hg)d", dense(4, 4, 6, 6)), "bs3hd");
  EXPECT_EQ(describe("t(h+2hg)d", varlen(4, 4, true)), "t3hd");
}

TEST(LayoutNames, SeedSplitIsNotSbhd) {
  // The seed case (docs/design.md): [s, b, h + 2hg, d], h = 16, hg = 1, d = 64, s = 2048, b = 1.
  ProblemSizes z;
  z.batch = 1;
  z.s_q = z.s_kv = 2048;
  z.heads = 16;
  z.kv_heads = 1;
  z.d_qk = z.d_v = 64;
  LayoutViews lv;
  ASSERT_TRUE(harness::make_layout_views("sb(h+2hg)d", z, &lv).ok());
  EXPECT_EQ(lv.q.stride, (Dims4{1152, 1152, 64, 1}));
  EXPECT_EQ(lv.k.offset, 1024);
  EXPECT_EQ(lv.v.offset, 1088);
  EXPECT_EQ(describe("sb(h+2hg)d", z),
            "q, k, v share one buffer: split of sb(h+2hg)d with h 16, hg 1, head stride 64, sequence stride 1152");
}

// Views built by hand over one host buffer per tensor.
struct Hand {
  std::vector<std::vector<std::uint16_t>> keep;
  TensorView make(Dims4 shape, Dims4 stride, std::int64_t extent) {
    keep.emplace_back(static_cast<std::size_t>(extent));
    TensorView t;
    t.data = keep.back().data();
    t.dtype = DType::f16;
    t.shape = shape;
    t.stride = stride;
    return t;
  }
  std::string describe(TensorView q, TensorView k, TensorView v, TensorView o) {
    ForwardArgs a;
    a.q = q;
    a.k = k;
    a.v = v;
    a.o = o;
    detail::Problem p;
    Status s = detail::make_problem(a, &p);
    EXPECT_TRUE(s.ok()) << s.message();
    return s.ok() ? detail::describe_layout(p) : "";
  }
};

TEST(LayoutOddViews, TransposedSbhdMemoryIsNamedSbhd) {
  // sbhd memory [s, b, h, d] handed over as logical [b, s, h, d]: its strides say sbhd.
  const std::int64_t b = 2, s = 5, h = 3, d = 8;
  Hand m;
  const Dims4 shape{b, s, h, d}, sbhd{h * d, b * h * d, d, 1};
  auto t = [&] { return m.make(shape, sbhd, b * s * h * d); };
  const std::string name = m.describe(t(), t(), t(), t());
  EXPECT_EQ(name, "sbhd_sbhd_sbhd");
  // Mixed: q bshd, k and v transposed sbhd.
  const Dims4 bshd{s * h * d, h * d, d, 1};
  EXPECT_EQ(m.describe(m.make(shape, bshd, b * s * h * d), t(), t(), m.make(shape, bshd, b * s * h * d)),
            "bshd_sbhd_sbhd");
}

TEST(LayoutOddViews, BhsdTransposedIsNamedBhsd) {
  const std::int64_t b = 2, s = 5, h = 3, d = 8;
  Hand m;
  const Dims4 shape{b, s, h, d}, bhsd{h * s * d, d, s * d, 1}, bshd{s * h * d, h * d, d, 1};
  const std::string name = m.describe(m.make(shape, bhsd, b * s * h * d), m.make(shape, bhsd, b * s * h * d),
                                      m.make(shape, bhsd, b * s * h * d), m.make(shape, bshd, b * s * h * d));
  EXPECT_EQ(name, "bhsd_bhsd_bhsd");
}

TEST(LayoutOddViews, SlicedHeadDimIsNotNamed) {
  // x[..., :d] of a bshd buffer padded to d + 64.
  const std::int64_t b = 2, s = 5, h = 3, d = 8, w = d + 64;
  Hand m;
  const Dims4 shape{b, s, h, d}, padded{s * h * w, h * w, w, 1}, bshd{s * h * d, h * d, d, 1};
  auto t = [&] { return m.make(shape, padded, b * s * h * w); };
  const std::string name = m.describe(t(), t(), t(), m.make(shape, bshd, b * s * h * d));
  EXPECT_EQ(name.find("bshd_bshd_bshd"), std::string::npos) << name;
  EXPECT_NE(name.find("q: shape [2, 5, 3, 8] strides (b 1080, s 216, h 72, d 1), not a named layout"),
            std::string::npos)
      << name;
}

TEST(LayoutOddViews, PaddedFusedRowsAreDescribedNotNamed) {
  // q, k, v heads of one [s, b, 4 + 2 + 2 + 1 (gap), d] buffer: shared, but not a split.
  const std::int64_t b = 2, s = 5, h = 4, hg = 2, d = 8, row = (h + 2 * hg + 1) * d;
  Hand m;
  TensorView q = m.make({b, s, h, d}, {row, b * row, d, 1}, s * b * row);
  TensorView k = q, v = q;
  k.shape[kHead] = v.shape[kHead] = hg;
  k.data = static_cast<std::uint16_t*>(q.data) + h * d;
  v.data = static_cast<std::uint16_t*>(q.data) + (h + hg + 1) * d;
  const std::string name = m.describe(q, k, v, m.make({b, s, h, d}, {s * h * d, h * d, d, 1}, b * s * h * d));
  EXPECT_EQ(name,
            "q, k, v share one buffer of sb-ordered rows of 72 elements (q at element 0, k at 32, v at 56), "
            "head stride 8, sequence stride 144, batch stride 72, not a named layout");
}

TEST(LayoutOddViews, SizeOneDimsWithGarbageStridesKeepTheName) {
  // MQA with bshd tensors: k and v have one head whose stride is garbage.
  const std::int64_t b = 2, s = 5, h = 4, d = 8;
  Hand m;
  const Dims4 q_shape{b, s, h, d}, kv_shape{b, s, 1, d};
  TensorView q = m.make(q_shape, {s * h * d, h * d, d, 1}, b * s * h * d);
  TensorView k = m.make(kv_shape, {s * d, d, -77, 1}, b * s * d);
  TensorView v = m.make(kv_shape, {s * d, d, 1 << 30, 1}, b * s * d);
  TensorView o = m.make(q_shape, {s * h * d, h * d, d, 1}, b * s * h * d);
  EXPECT_EQ(m.describe(q, k, v, o), "bshd_bshd_bshd");
  // sb3hd with h = 1 and a garbage head stride.
  const std::int64_t row = 3 * d;
  TensorView qkv = m.make({b, s, 1, d}, {row, b * row, 12345, 1}, s * b * row);
  TensorView kk = qkv, vv = qkv;
  kk.data = static_cast<std::uint16_t*>(qkv.data) + d;
  vv.data = static_cast<std::uint16_t*>(qkv.data) + 2 * d;
  kk.stride[kHead] = 0;
  EXPECT_EQ(m.describe(qkv, kk, vv, m.make({b, s, 1, d}, {s * d, d, 0, 1}, b * s * d)), "sb3hd");
}

TEST(LayoutOddViews, VarlenBatchStrideIsIgnored) {
  ProblemSizes z = varlen(2, 2, true);
  LayoutViews lv;
  ASSERT_TRUE(harness::make_layout_views("thd_thd_thd", z, &lv).ok());
  for (ViewSpec* v : {&lv.q, &lv.k, &lv.v, &lv.o}) v->stride[kBatch] = -99;
  Buffers buf;
  for (const ViewSpec* v : {&lv.q, &lv.k, &lv.v, &lv.o}) buf.reserve(*v);
  ForwardArgs f;
  f.q = buf.view(lv.q);
  f.k = buf.view(lv.k);
  f.v = buf.view(lv.v);
  f.o = buf.view(lv.o);
  set_varlen(z, &f.varlen);
  detail::Problem p;
  ASSERT_TRUE(detail::make_problem(f, &p).ok());
  EXPECT_EQ(detail::describe_layout(p), "thd_thd_thd");
}

// ---------------------------------------------------------------- make_layout_views itself

TEST(LayoutViews, StridesOfEachFormat) {
  LayoutViews lv;
  ProblemSizes z = dense(4, 2, 5, 7);  // b 2, d 16
  ASSERT_TRUE(harness::make_layout_views("sbhd_sbhd_sbhd", z, &lv).ok());
  EXPECT_EQ(lv.q.stride, (Dims4{64, 128, 16, 1}));
  EXPECT_EQ(lv.k.stride, (Dims4{32, 64, 16, 1}));
  EXPECT_EQ(lv.o.buffer, "o");
  EXPECT_EQ(lv.dq.buffer, "dq");
  ASSERT_TRUE(harness::make_layout_views("bhsd_bhsd_bhsd", z, &lv).ok());
  EXPECT_EQ(lv.q.stride, (Dims4{4 * 5 * 16, 16, 5 * 16, 1}));
  EXPECT_EQ(lv.v.stride, (Dims4{2 * 7 * 16, 16, 7 * 16, 1}));
  ASSERT_TRUE(harness::make_layout_views("bshd_bsh2d", z, &lv).ok());
  EXPECT_EQ(lv.k.buffer, "kv");
  EXPECT_EQ(lv.v.offset, 16);
  EXPECT_EQ(lv.k.stride, (Dims4{7 * 64, 64, 32, 1}));
  EXPECT_EQ(lv.dk.buffer, "dkv");
  EXPECT_EQ(lv.dv.offset, 16);
  EXPECT_EQ(lv.dq.buffer, "dq");
  ASSERT_TRUE(harness::make_layout_views("sbh3d", dense(4, 4, 5, 5), &lv).ok());
  EXPECT_EQ(lv.q.buffer, "qkv");
  EXPECT_EQ(lv.k.offset, 16);
  EXPECT_EQ(lv.q.stride, (Dims4{192, 384, 48, 1}));
  EXPECT_EQ(lv.dv.buffer, "dqkv");
  EXPECT_EQ(lv.dv.offset, 32);
  EXPECT_EQ(harness::required_extent(lv.v), 32 + 4 * 384 + 192 + 3 * 48 + 16);
}

TEST(LayoutViews, Tokens) {
  ProblemSizes z = varlen(2, 2, false);
  EXPECT_EQ(z.q_tokens(), 9);   // offsets 0, 4, 5 with lengths 3, 0, 4
  EXPECT_EQ(z.kv_tokens(), 7);  // packed 5 + 2 + 0
  z.offsets_kv = {0, 20, 1};
  EXPECT_EQ(z.kv_tokens(), 22);
  ProblemSizes d = dense(2, 2, 5, 7);
  EXPECT_EQ(d.q_tokens(), 5);
  EXPECT_EQ(d.kv_tokens(), 7);
}

TEST(LayoutViews, PackedLayoutsRefuseWhatTheyCannotHold) {
  LayoutViews lv;
  auto msg = [&](std::string_view name, const ProblemSizes& z) {
    const Status s = harness::make_layout_views(name, z, &lv);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << name;
    return s.message();
  };
  EXPECT_NE(msg("sb3hd", dense(4, 2, 6, 6)).find("needs heads == kv-heads; got 4 and 2"), std::string::npos);
  EXPECT_NE(msg("th3d", varlen(4, 2, true)).find("needs heads == kv-heads"), std::string::npos);
  ProblemSizes z = dense(4, 4, 6, 6);
  z.d_v = 8;
  EXPECT_NE(msg("bs3hd", z).find("head-dim == head-dim-v; got 16 and 8"), std::string::npos);
  EXPECT_NE(msg("bshd_bs2hd", z).find("head-dim == head-dim-v"), std::string::npos);
  EXPECT_NE(msg("sb(h+2hg)d", z).find("head-dim == head-dim-v"), std::string::npos);
  EXPECT_NE(msg("sbh3d", dense(4, 4, 6, 7)).find("equal q and kv seqlen; got 6 and 7"), std::string::npos);
  EXPECT_NE(msg("thd_thd_thd", dense(4, 4, 6, 6)).find("needs --seqlens-q"), std::string::npos);
  EXPECT_NE(msg("bshd_bshd_bshd", varlen(2, 2, true)).find("is dense"), std::string::npos);
  EXPECT_NE(msg("bshd", dense(4, 4, 6, 6)).find("unknown layout 'bshd'"), std::string::npos);
  // ... while GQA and d_qk != d_v are fine for separate layouts.
  z = dense(4, 2, 6, 9);
  z.d_v = 8;
  EXPECT_TRUE(harness::make_layout_views("bshd_bshd_bshd", z, &lv).ok());
  EXPECT_EQ(lv.v.shape, (Dims4{2, 9, 2, 8}));
  EXPECT_EQ(lv.o.shape, (Dims4{2, 6, 4, 8}));
}

TEST(LayoutViews, EveryNameIsKnown) {
  for (const std::string& name : harness::layout_names()) {
    LayoutViews lv;
    const bool thd = name[0] == 't';
    const Status s = harness::make_layout_views(name, thd ? varlen(2, 2, true) : dense(2, 2, 4, 4), &lv);
    EXPECT_TRUE(s.ok()) << name << ": " << s.message();
  }
  EXPECT_EQ(harness::layout_names().size(), 19u);
}

}  // namespace
}  // namespace strideattn
