// The cudnn backend's support rules and mask mapping, on a CPU: faked devices and cuDNN
// versions (DeviceInfo) drive each named rule to refuse with the value found and what is
// supported, and cuDNN's diagonal band (as documented in graph.hpp, read from the frontend's
// sliding_window_mask) is checked against our MaskRule on every (i, j) of many shapes; the
// KV-cache rules on the selection view of KV-cache problems.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>

#include "backends/cudnn/rules.hpp"
#include "common/attention_math.hpp"
#include "problem/kv_cache.hpp"
#include "problem/problem.hpp"
#include "support/kv_case.hpp"

namespace strideattn::detail::cudnn {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// A forward problem on 256-byte aligned host buffers, marked as device memory (the rules
// never dereference pointers).
struct Fixture {
  std::int64_t b = 2, sq = 64, skv = 64, h = 4, hg = 4, dqk = 64, dv = 64;
  DType dtype = DType::bf16;
  MaskKind mask = MaskKind::none;
  Window window{};
  std::int64_t q_row_pad = 0;  // extra elements per q row (changes strides)
  std::int64_t q_offset = 0;   // element offset of q's data pointer
  Varlen varlen{};
  std::vector<std::unique_ptr<void, FreeDeleter>> keep;

  TensorView view(std::int64_t bb, std::int64_t s, std::int64_t heads, std::int64_t d, std::int64_t pad = 0,
                  std::int64_t offset = 0) {
    const std::int64_t es = std::int64_t(size_of(dtype));
    const std::int64_t row = d + pad;
    const std::size_t bytes = std::size_t(((bb * s * heads * row + offset) * es + 255) / 256 * 256 + 256);
    keep.emplace_back(std::aligned_alloc(256, bytes));
    TensorView t;
    t.data = static_cast<char*>(keep.back().get()) + offset * es;
    t.dtype = dtype;
    t.shape = {bb, s, heads, d};
    t.stride = {s * heads * row, heads * row, row, 1};
    return t;
  }

  Problem problem() {
    ForwardArgs a;
    const bool vl = varlen.enabled();
    std::int64_t tq = sq, tkv = skv;
    if (vl) {
      tq = tkv = 0;
      for (std::size_t i = 0; i < varlen.seqlens_q.size(); ++i) tq += varlen.seqlens_q[i];
      for (std::size_t i = 0; i < varlen.seqlens_kv.size(); ++i) tkv += varlen.seqlens_kv[i];
    }
    const std::int64_t bb = vl ? 1 : b;
    a.q = view(bb, tq, h, dqk, q_row_pad, q_offset);
    a.k = view(bb, tkv, hg, dqk);
    a.v = view(bb, tkv, hg, dv);
    a.o = view(bb, tq, h, dv);
    a.options.mask = mask;
    a.options.window = window;
    a.varlen = varlen;
    a.memory = Memory::device;
    Problem p;
    Status s = make_problem(a, &p);
    EXPECT_TRUE(s.ok()) << s.message();
    return p;
  }
};

DeviceInfo hopper(std::int64_t version = 91900) { return {true, "", 90, version}; }

Verdict verdict(const DeviceInfo& dev, const Problem& p) {
  return evaluate_rules(Backend::cudnn, support_rules(dev), p);
}

void expect_refused(const Verdict& v, const std::string& rule, const std::string& text) {
  EXPECT_FALSE(v.supported);
  EXPECT_EQ(v.rule, rule) << v.reason;
  EXPECT_NE(v.reason.find(text), std::string::npos) << v.reason;
  EXPECT_NE(v.reason.find("supported"), std::string::npos) << "names what is supported: " << v.reason;
}

TEST(CudnnRules, PlainProblemPassesEveryStaticRuleOnHopper) {
  Fixture f;
  Verdict v = verdict(hopper(), f.problem());
  EXPECT_TRUE(v.supported) << v.rule << ": " << v.reason;
}

TEST(CudnnRules, HostMemoryIsRefusedFirst) {
  Fixture f;
  Problem p = f.problem();
  p.memory = Memory::host;
  Verdict v = verdict(hopper(), p);
  EXPECT_EQ(v.rule, "memory");
}

TEST(CudnnRules, NoGpu) {
  Fixture f;
  DeviceInfo d;
  d.gpu_error = "no CUDA device found";
  d.cudnn_version = 91900;
  expect_refused(verdict(d, f.problem()), "gpu", "no CUDA device found");
}

TEST(CudnnRules, VersionGates) {
  Fixture f;
  Problem p = f.problem();
  expect_refused(verdict(hopper(8907), p), "cudnn_version", "cuDNN 8.9.7; supported: >= 9.0");
  expect_refused(verdict(hopper(0), p), "cudnn_version", "could not be loaded");
  expect_refused(verdict(hopper(91000), p), "cudnn_known_bug", "9.10.0");
  EXPECT_TRUE(verdict(hopper(91002), p).supported);
}

TEST(CudnnRules, ArchAndDtype) {
  Fixture f;
  expect_refused(verdict(DeviceInfo{true, "", 75, 91900}, f.problem()), "gpu_arch", "7.5");
  Fixture g;
  g.dtype = DType::f32;
  expect_refused(verdict(hopper(), g.problem()), "dtype", "f32");
}

TEST(CudnnRules, HeadDimLimitsDependOnArchAndVersion) {
  Fixture a;
  a.dqk = a.dv = 264;
  expect_refused(verdict(hopper(), a.problem()), "head_dim", "d_qk = 264; supported: <= 256");
  Fixture b;
  b.dqk = b.dv = 36;
  expect_refused(verdict(hopper(), b.problem()), "head_dim", "multiples of 8");
  Fixture c;
  c.dqk = 192;
  c.dv = 128;
  EXPECT_TRUE(verdict(hopper(), c.problem()).supported);
  expect_refused(verdict(DeviceInfo{true, "", 80, 90900}, c.problem()), "head_dim", "<= 128");
  EXPECT_TRUE(verdict(DeviceInfo{true, "", 80, 91900}, c.problem()).supported);
}

// The rule only looks at direction, determinism and the two head dims.
TEST(CudnnRules, DeterministicBackwardWithUnequalHeadDimsIsRefused) {
  Fixture f;
  f.dqk = 192;
  f.dv = 128;
  Problem p = f.problem();
  p.direction = strideattn::detail::Direction::backward;
  p.deterministic = true;
  const Verdict v = verdict(hopper(), p);
  ASSERT_FALSE(v.supported);
  EXPECT_EQ(v.rule, "deterministic_mla") << v.reason;
  EXPECT_NE(v.reason.find("d_qk 192 != d_v 128"), std::string::npos) << v.reason;
  p.deterministic = false;
  EXPECT_NE(verdict(hopper(), p).rule, "deterministic_mla");
  Fixture g;  // equal head dims stay allowed
  Problem q = g.problem();
  q.direction = strideattn::detail::Direction::backward;
  q.deterministic = true;
  EXPECT_NE(verdict(hopper(), q).rule, "deterministic_mla");
}

// Varlen with a wide d_qk and a narrower d_v (wrong results on cuDNN 9.19): refused in that
// band only; the same dims dense, and the edges of the band, stay supported.
TEST(CudnnRules, VarlenWithWideQkAndNarrowVIsRefused) {
  auto varlen_problem = [](std::int64_t dqk, std::int64_t dv, bool varlen, Fixture& f) {
    f.dqk = dqk;
    f.dv = dv;
    if (varlen) {
      f.varlen.seqlens_q = {74, 46, 1};
      f.varlen.seqlens_kv = {74, 46, 1};
    }
    return f.problem();
  };
  Fixture f;
  const Verdict v = verdict(hopper(), varlen_problem(224, 72, true, f));
  ASSERT_FALSE(v.supported);
  EXPECT_EQ(v.rule, "varlen_wide_qk") << v.reason;
  EXPECT_NE(v.reason.find("d_qk 224 > 192 and d_v 72 < 192"), std::string::npos) << v.reason;
  for (auto [dqk, dv] : {std::pair{192, 72}, std::pair{224, 192}, std::pair{256, 256}}) {
    Fixture g;
    EXPECT_TRUE(verdict(hopper(), varlen_problem(dqk, dv, true, g)).supported) << dqk << "/" << dv;
  }
  Fixture dense;
  EXPECT_TRUE(verdict(hopper(), varlen_problem(224, 72, false, dense)).supported);
}

TEST(CudnnRules, AlignmentOfPointersAndStrides) {
  Fixture a;
  a.q_offset = 3;  // 6 bytes past a 16-byte boundary
  expect_refused(verdict(hopper(), a.problem()), "alignment", "tensor q data pointer is 6 bytes");
  Fixture b;
  b.q_row_pad = 3;  // row of 67 elements = 134 bytes
  expect_refused(verdict(hopper(), b.problem()), "alignment", "tensor q seq stride 268 elements");
  Fixture c;
  c.q_row_pad = 64;  // x[..., :d] of a d + 64 buffer: aligned, accepted
  EXPECT_TRUE(verdict(hopper(), c.problem()).supported);
}

TEST(CudnnRules, CausalTopLeftWithWindowNeedsEqualLengths) {
  Fixture a;
  a.mask = MaskKind::causal;
  a.window = {8, -1};
  a.skv = 96;
  expect_refused(verdict(hopper(), a.problem()), "mask_alignment", "s_q 64 != s_kv 96");
  Fixture b;
  b.mask = MaskKind::causal;
  b.window = {8, -1};
  EXPECT_TRUE(verdict(hopper(), b.problem()).supported);
}

TEST(CudnnRules, RowsWithoutKeysAreRefused) {
  Fixture a;
  a.mask = MaskKind::causal_bottom_right;
  a.sq = 64;
  a.skv = 32;
  expect_refused(verdict(hopper(), a.problem()), "empty_rows", "query row 0 of sequence 0");
  // Whole varlen sequences without keys are handled by the backend (written like padding).
  Fixture b;
  b.varlen.seqlens_q = {8, 8};
  b.varlen.seqlens_kv = {8, 0};
  EXPECT_TRUE(verdict(hopper(), b.problem()).supported) << verdict(hopper(), b.problem()).reason;
}

// cu_seqlens arrays (lengths read on the device): masks under which a row could see no key are
// refused when the plan is made, since no length can be read on the host; none and top-left
// causal run (every row of a sequence with keys sees key 0).
TEST(CudnnRules, CuSeqlensMasksThatDependOnTheLengthsAreRefused) {
  Fixture f;
  f.varlen.seqlens_q = {40, 24};
  f.varlen.seqlens_kv = {40, 24};
  Problem base = f.problem();  // the same views, with the lengths as arrays instead of lists
  base.cu_seqlens = true;
  base.seqlens_q.clear(), base.seqlens_kv.clear(), base.offsets_q.clear(), base.offsets_kv.clear();
  base.s_q = base.s_kv = 40;
  for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
    Problem p = base;
    p.mask = m;
    Verdict v = verdict(hopper(), p);
    EXPECT_TRUE(v.supported) << int(m) << ": " << v.rule << ": " << v.reason;
  }
  Problem p = base;
  p.mask = MaskKind::causal_bottom_right;
  expect_refused(verdict(hopper(), p), "cu_seqlens_mask", "whether a row sees no key depends on the lengths");
  p = base;
  p.window = {16, 0};
  expect_refused(verdict(hopper(), p), "cu_seqlens_mask", "window 16,0");
  p.mask = MaskKind::causal;
  expect_refused(verdict(hopper(), p), "cu_seqlens_mask", "mask causal");
  // With the lists the same views and masks are decided per sequence (these sequences have
  // s_q == s_kv, so no row is empty).
  Fixture g;
  g.varlen = f.varlen;
  g.mask = MaskKind::causal_bottom_right;
  EXPECT_TRUE(verdict(hopper(), g.problem()).supported);
}

TEST(CudnnRules, EmptyProblemsAreRefusedNotBuilt) {
  Fixture a;
  a.sq = 0;
  expect_refused(verdict(hopper(), a.problem()), "empty_problem", "s_q 0");
  Fixture b;
  b.varlen.seqlens_q = {0, 0};
  b.varlen.seqlens_kv = {5, 3};
  expect_refused(verdict(hopper(), b.problem()), "empty_problem", "longest sequence");
}

TEST(CudnnRules, ZeroHeadsIsAnEmptyProblem) {
  Fixture a;
  a.h = a.hg = 0;
  expect_refused(verdict(hopper(), a.problem()), "empty_problem", "heads 0");
}

TEST(CudnnRules, NegativeStridesAreRefused) {
  Fixture a;
  Problem p = a.problem();
  EXPECT_TRUE(verdict(hopper(), p).supported) << verdict(hopper(), p).reason;
  // k[:, ::-1]: same bytes, seq walked backwards from the last token.
  p.k.data = static_cast<char*>(p.k.data) + (p.k.shape[kSeq] - 1) * p.k.stride[kSeq] * 2;
  p.k.stride[kSeq] = -p.k.stride[kSeq];
  expect_refused(verdict(hopper(), p), "negative_stride", "tensor k seq stride -256");
  // A size-1 dimension's negative stride is never used: still supported.
  Fixture b;
  b.b = 1;
  Problem q = b.problem();
  q.o.stride[kBatch] = -5;
  EXPECT_TRUE(verdict(hopper(), q).supported) << verdict(hopper(), q).reason;
}

TEST(CudnnRules, OneQueryOnOneKeyHasNoBackward) {
  Fixture a;
  a.sq = a.skv = 1;
  Problem p = a.problem();
  EXPECT_TRUE(verdict(hopper(), p).supported) << "the forward runs: " << verdict(hopper(), p).reason;
  p.direction = Direction::backward;
  expect_refused(verdict(hopper(), p), "single_token_backward", "s_q = s_kv = 1");
  Fixture b;
  b.sq = 1;
  b.skv = 2;
  Problem q = b.problem();
  q.direction = Direction::backward;
  const Verdict v = verdict(hopper(), q);
  EXPECT_NE(v.rule, "single_token_backward") << v.reason;
}

TEST(CudnnRules, BottomRightNeedsSqNotAboveSkvWhenDense) {
  Fixture a;
  a.sq = 64;
  a.skv = 48;
  a.window = {-1, 32};  // right bound wide enough that every row sees keys
  expect_refused(verdict(hopper(), a.problem()), "bottom_right_shape", "s_q 64 > s_kv 48");
}

TEST(CudnnRules, WindowAndVarlenVersionGates) {
  Fixture a;
  a.window = {16, 0};
  expect_refused(verdict(hopper(90500), a.problem()), "band_version", "cuDNN >= 9.6");
  Fixture b;
  b.hg = 2;
  b.varlen.seqlens_q = {8, 16};
  b.varlen.seqlens_kv = {8, 16};
  expect_refused(verdict(hopper(90500), b.problem()), "varlen_version", "4/2 heads");
  EXPECT_TRUE(verdict(hopper(), b.problem()).supported);
}

// KV-cache problems (the selection view of a KvCacheProblem: the caches as K and V): a paged
// decode and a chunk with more rows than some sequences have keys pass the static rules (the
// row fix-up writes rows without keys, cuDNN's padding mask takes s_q above the capacity);
// old cuDNN and top-left causal with a window are refused by their KV rules.
TEST(CudnnRules, KvCacheRules) {
  auto verdict_of = [](test_support::KvCase& c, const DeviceInfo& dev) {
    c.build();
    KvCacheArgs a = c.args(Backend::cudnn);
    a.memory = Memory::device;
    KvCacheProblem kp;
    const Status s = make_kvcache_problem(a, &kp);
    EXPECT_TRUE(s.ok()) << s.message();
    return verdict(dev, selection_problem(kp));
  };
  auto kv_case = [](MaskKind mask, Window w, std::int64_t s_q) {
    test_support::KvCase c;
    c.dtype = DType::bf16;
    c.h = 8, c.hg = 2, c.d = c.dv = 64;
    c.page_size = 16, c.max_pages = 2;
    c.cache_seqlens = {20, 3};
    c.s_new = 1;
    c.s_q = s_q;
    c.options.mask = mask;
    c.options.window = w;
    return c;
  };
  {
    test_support::KvCase c = kv_case(MaskKind::causal_bottom_right, {}, 1);
    const Verdict v = verdict_of(c, hopper());
    EXPECT_TRUE(v.supported) << v.rule << ": " << v.reason;
  }
  {
    test_support::KvCase c = kv_case(MaskKind::causal_bottom_right, {4, 0}, 40);  // s_q 40 > capacity 32
    const Verdict v = verdict_of(c, hopper());
    EXPECT_TRUE(v.supported) << v.rule << ": " << v.reason;
  }
  {
    test_support::KvCase c = kv_case(MaskKind::none, {}, 1);
    expect_refused(verdict_of(c, hopper(90800)), "kv_cache_version", "9.10.2");
  }
  {
    test_support::KvCase c = kv_case(MaskKind::causal, {8, 0}, 2);
    expect_refused(verdict_of(c, hopper()), "kv_cache_mask", "causal_bottom_right with a window");
  }
  // (pages enough for sequence 0's 20 cached tokens and the one appended)
  auto pages_for = [](std::int64_t page) { return (21 + page - 1) / page; };
  for (std::int64_t page : {3, 200}) {  // cuDNN's paged load takes powers of two only
    test_support::KvCase c = kv_case(MaskKind::causal_bottom_right, {}, 1);
    c.page_size = page, c.max_pages = pages_for(page);
    expect_refused(verdict_of(c, hopper()), "kv_cache_page_size", "page size " + std::to_string(page));
  }
  for (std::int64_t page : {1, 64, 256}) {
    test_support::KvCase c = kv_case(MaskKind::causal_bottom_right, {}, 1);
    c.page_size = page, c.max_pages = pages_for(page);
    const Verdict v = verdict_of(c, hopper());
    EXPECT_TRUE(v.supported) << page << ": " << v.rule << ": " << v.reason;
  }
}

// ------------------------------------------------------------------ the post-scale bias

// A bias view [bb, hh, sq, skv] on its own 256-byte aligned buffer, contiguous, in `dtype`.
BiasView bias_view(Fixture& f, Dims4 shape, DType dtype) {
  BiasView v;
  const std::size_t bytes = std::size_t(shape[0] * shape[1] * shape[2] * shape[3]) * size_of(dtype) + 512;
  f.keep.emplace_back(std::aligned_alloc(256, (bytes + 255) / 256 * 256));
  v.data = f.keep.back().get();
  v.dtype = dtype;
  v.shape = shape;
  v.stride = {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1};
  return v;
}

Problem with_bias(Fixture& f, Dims4 shape, bool backward = false, bool dbias = false) {
  Problem p = f.problem();
  p.bias_type = BiasType::post_scale;
  p.bias = bias_view(f, shape, f.dtype);
  if (backward) p.direction = strideattn::detail::Direction::backward;
  if (dbias) {
    p.dbias = bias_view(f, shape, f.dtype);
    p.dbias_on = true;
  }
  return p;
}

// Every shape cuDNN broadcasts (batch and heads) runs forward, and backward without dBias;
// dBias only of [1, h, s_q, s_kv]; the rest is refused by the rule `bias` naming the value.
TEST(CudnnRules, PostScaleBiasShapes) {
  Fixture f;  // b 2, h 4, s_q = s_kv = 64
  for (Dims4 shape : {Dims4{2, 4, 64, 64}, Dims4{1, 4, 64, 64}, Dims4{2, 1, 64, 64}, Dims4{1, 1, 64, 64}}) {
    SCOPED_TRACE(::testing::Message() << shape[0] << "," << shape[1]);
    Verdict v = verdict(hopper(), with_bias(f, shape));
    EXPECT_TRUE(v.supported) << v.rule << ": " << v.reason;
    v = verdict(hopper(), with_bias(f, shape, /*backward=*/true));
    EXPECT_TRUE(v.supported) << v.rule << ": " << v.reason;
    v = verdict(hopper(), with_bias(f, shape, true, /*dbias=*/true));
    if (shape[0] == 1 && shape[1] == 4) {
      EXPECT_TRUE(v.supported) << v.rule << ": " << v.reason;
    } else {
      expect_refused(v, "bias", "cuDNN writes dBias of shape [1, h, s_q, s_kv] only");
      EXPECT_NE(v.reason.find("[1, 4, 64, 64]"), std::string::npos) << v.reason;
    }
  }
  {
    SCOPED_TRACE("rows");
    expect_refused(verdict(hopper(), with_bias(f, {2, 4, 1, 64})), "bias", "broadcasts over query rows");
  }
  {
    SCOPED_TRACE("keys");
    expect_refused(verdict(hopper(), with_bias(f, {2, 4, 64, 1})), "bias", "broadcasts over keys");
  }
  // A stride-0 batch (one slab for every batch) is the broadcast [1, h, ...], dBias too.
  Problem p = with_bias(f, {2, 4, 64, 64}, true, true);
  p.bias.stride[0] = 0;
  Verdict v = verdict(hopper(), p);
  expect_refused(v, "bias", "dbias [2, 4, 64, 64]: cuDNN writes");  // a dBias per batch, not their sum
  p.dbias.shape[0] = 1;
  p.bias.shape[0] = 1;
  EXPECT_TRUE(verdict(hopper(), p).supported) << verdict(hopper(), p).reason;
  const TensorLayout l = bias_layout_of(p.bias);
  EXPECT_EQ(l.dim, (std::array<std::int64_t, 4>{1, 4, 64, 64}));
  EXPECT_EQ(l.stride[3], 1);
}

TEST(CudnnRules, PostScaleBiasTypeDtypeStridesAndMasks) {
  Fixture f;
  Problem p = with_bias(f, {1, 4, 64, 64});
  p.bias_type = BiasType::pre_scale;
  expect_refused(verdict(hopper(), p), "bias", "pre_scale bias: cuDNN adds its bias after the scale");
  p = with_bias(f, {1, 4, 64, 64});
  p.bias.dtype = DType::f32;
  expect_refused(verdict(hopper(), p), "bias", "in f32 with bf16 tensors; supported: the tensors' dtype");
  p = with_bias(f, {1, 4, 64, 64});
  p.bias.stride = {1, 64, 4 * 64, 4};  // keys strided: [s_q, s_kv, h] in memory
  expect_refused(verdict(hopper(), p), "bias", "key stride 4; supported: 1");
  p = with_bias(f, {1, 4, 64, 64});
  p.bias.stride = {0, 64 * 68, 68, 1};  // padded rows of 68 elements: 136 bytes
  expect_refused(verdict(hopper(), p), "bias", "row stride 68 elements (136 bytes); supported: multiples of 16");
  p.bias.stride = {0, 64 * 72, 72, 1};  // rows of 72: 144 bytes
  EXPECT_TRUE(verdict(hopper(), p).supported) << verdict(hopper(), p).reason;
  p.bias.data = static_cast<char*>(p.bias.data) + 2;
  expect_refused(verdict(hopper(), p), "bias", "data pointer is 2 bytes past a 16-byte boundary");
  p = with_bias(f, {1, 4, 64, 64}, true, true);
  p.dbias.stride = {0, 64 * 68, 68, 1};
  expect_refused(verdict(hopper(), p), "bias",
                 "dbias [1, 4, 64, 64] strides [0, 4352, 68, 1]: cuDNN writes dBias in packed rows; supported: key "
                 "stride 1 and query-row stride 64");
  // Masks: none and top-left causal; bottom-right and windows are refused by name.
  f.mask = MaskKind::causal;
  EXPECT_TRUE(verdict(hopper(), with_bias(f, {1, 4, 64, 64}, true, true)).supported);
  f.mask = MaskKind::causal_bottom_right;
  expect_refused(verdict(hopper(), with_bias(f, {1, 4, 64, 64})), "bias", "no bias with a bottom-right");
  f.mask = MaskKind::none;
  f.window = {16, 0};
  expect_refused(verdict(hopper(), with_bias(f, {1, 4, 64, 64})), "bias", "window 16,0");
  // Versions: dBias on lengths that are not multiples of 64 below 9.5.
  Fixture g;
  g.sq = g.skv = 104;  // rows of 208 bytes
  expect_refused(verdict(hopper(90400), with_bias(g, {1, 4, 104, 104}, true, true)), "bias",
                 "supported: multiples of 64 below cuDNN 9.5");
  EXPECT_TRUE(verdict(hopper(90500), with_bias(g, {1, 4, 104, 104}, true, true)).supported);
}

TEST(CudnnRules, PostScaleBiasWithVarlenIsRefused) {
  Fixture f;
  f.b = 2;
  f.varlen.seqlens_q = {64, 32};
  f.varlen.seqlens_kv = {64, 32};
  f.varlen.offsets_q = {0, 64};
  f.varlen.offsets_kv = {0, 64};
  Problem p = with_bias(f, {2, 4, 64, 64});
  expect_refused(verdict(hopper(), p), "bias", "post_scale bias with varlen tensors");
}

// ------------------------------------------------------------------ sinks

Problem with_sinks(Fixture& f, bool backward = false, bool d_sinks = false) {
  Problem p = f.problem();
  auto head_view = [&](std::int64_t stride) {
    HeadView v;
    f.keep.emplace_back(std::aligned_alloc(256, 4096));
    v.data = static_cast<float*>(f.keep.back().get());
    v.shape = {1, f.h};
    v.stride = {f.h * stride, stride};
    return v;
  };
  p.sinks = head_view(1);
  p.sinks_on = true;
  if (backward) p.direction = strideattn::detail::Direction::backward;
  if (d_sinks) {
    p.d_sinks = head_view(1);
    p.d_sinks_on = true;
  }
  return p;
}

// Dense sinks run forward and backward (with d_sinks) from cuDNN 9.13, every mask; the rule
// `sinks` refuses older versions, varlen, one query row and strided or misaligned views.
TEST(CudnnRules, SinksOnDenseTensorsFromCudnn913) {
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right}) {
    Fixture f;
    f.mask = m;
    SCOPED_TRACE(::testing::Message() << "mask " << int(m));
    Verdict v = verdict(hopper(), with_sinks(f));
    EXPECT_TRUE(v.supported) << v.rule << ": " << v.reason;
    v = verdict(hopper(), with_sinks(f, true, true));
    EXPECT_TRUE(v.supported) << v.rule << ": " << v.reason;
  }
  Fixture f;
  expect_refused(verdict(hopper(91200), with_sinks(f)), "sinks", "supported: cuDNN >= 9.13");
  Problem p = with_sinks(f, true, true);
  p.d_sinks.stride[1] = 2;
  expect_refused(verdict(hopper(), p), "sinks", "d_sinks head stride 2; supported: 1");
  p = with_sinks(f);
  p.sinks.data += 1;
  expect_refused(verdict(hopper(), p), "sinks", "sinks data pointer is 4 bytes past a 16-byte boundary");
  Fixture one;
  one.sq = 1;
  expect_refused(verdict(hopper(), with_sinks(one)), "sinks", "with s_q 1");
  Fixture vl;
  vl.varlen.seqlens_q = {64, 32};
  vl.varlen.seqlens_kv = {64, 32};
  vl.varlen.offsets_q = {0, 64};
  vl.varlen.offsets_kv = {0, 64};
  expect_refused(verdict(hopper(), with_sinks(vl)), "sinks", "with varlen tensors");
}

TEST(CudnnBand, MappingValues) {
  std::string why;
  Fixture f;
  auto band = [&](MaskKind m, Window w) {
    f.mask = m;
    f.window = w;
    auto b = band_for(f.problem(), &why);
    EXPECT_TRUE(b.has_value()) << why;
    return b.value_or(Band{});
  };
  EXPECT_EQ(band(MaskKind::none, {}), Band{});
  EXPECT_EQ(band(MaskKind::causal, {}), (Band{false, false, true, 0, 0}));
  EXPECT_EQ(band(MaskKind::causal_bottom_right, {}), (Band{true, false, true, 0, 0}));
  EXPECT_EQ(band(MaskKind::none, {16, 8}), (Band{true, true, true, 17, 8}));
  EXPECT_EQ(band(MaskKind::causal_bottom_right, {20, -1}), (Band{true, true, true, 21, 0}));
  EXPECT_EQ(band(MaskKind::none, {-1, 5}), (Band{true, false, true, 0, 5}));
}

// cuDNN's band semantics (frontend sliding_window_mask): keep j iff
// j <= i + shift + right (has_right) and j + left > i + shift (has_left), shift = s_kv - s_q
// when bottom-right aligned, else 0.
bool cudnn_keeps(const Band& band, std::int64_t sq, std::int64_t skv, std::int64_t i, std::int64_t j) {
  const std::int64_t shift = band.bottom_right ? skv - sq : 0;
  if (band.has_right && !(j <= i + shift + band.right_bound)) return false;
  if (band.has_left && !(j + band.left_bound > i + shift)) return false;
  return true;
}

TEST(CudnnBand, BandEqualsOurMaskOnEveryElement) {
  std::mt19937 rng(12345);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Fixture f;
    f.b = 1;
    f.sq = 1 + std::int64_t(rng() % 40);
    f.skv = 1 + std::int64_t(rng() % 40);
    f.mask = static_cast<MaskKind>(rng() % 3);
    auto side = [&]() -> std::int64_t { return rng() % 3 == 0 ? -1 : std::int64_t(rng() % 12); };
    f.window = rng() % 2 ? Window{} : Window{side(), side()};
    Problem p = f.problem();
    std::string why;
    auto band = band_for(p, &why);
    if (!band) {
      // Only causal top-left with a window and unequal lengths is refused.
      EXPECT_EQ(f.mask, MaskKind::causal);
      EXPECT_FALSE(f.window.unbounded());
      EXPECT_NE(f.sq, f.skv);
      continue;
    }
    kernel::MaskRule m;
    m.s_q = f.sq;
    m.s_kv = f.skv;
    m.kind = static_cast<int>(f.mask);
    m.left = f.window.left;
    m.right = f.window.right;
    for (std::int64_t i = 0; i < f.sq; ++i)
      for (std::int64_t j = 0; j < f.skv; ++j)
        ASSERT_EQ(cudnn_keeps(*band, f.sq, f.skv, i, j), m.visible(i, j))
            << "s_q " << f.sq << " s_kv " << f.skv << " mask " << int(f.mask) << " window " << f.window.left << ","
            << f.window.right << " at i " << i << " j " << j;
    ++checked;
  }
  EXPECT_GT(checked, 300);
}

}  // namespace
}  // namespace strideattn::detail::cudnn
