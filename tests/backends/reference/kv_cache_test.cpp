// KV-cache attention on `reference` (docs/semantics.md "KV cache"): against the oracle the test
// builds itself (each sequence's tokens gathered here into contiguous K / V, run as a dense
// problem), over page sizes 1, 3, 16 and 256, contiguous caches, padded and head-major strides,
// shuffled / transposed / shared block tables, appends, GQA, masks and windows, empty caches;
// the cache contents after an append; poisoned outputs; the validation errors; and the rule
// `kv_cache` that refuses the problem on backends without a KV-cache path.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "../../support/kv_case.hpp"
#include "dispatch/backend.hpp"
#include "dispatch/registry.hpp"

namespace strideattn::test_support {
namespace {

// Runs `c` on `backend` and checks O / LSE against the oracle (exactly when `exact`, else within
// `tol` relative), the caches against the expected append, and the guards.
void run_and_check(KvCase& c, Backend backend, bool exact, double tol = 0) {
  const KvCase::Dense want = c.oracle();
  ASSERT_EQ(want.o.size(), std::size_t(c.b * c.s_q * c.h * c.dv));
  const Status s = forward_with_kvcache(c.args(backend));
  ASSERT_TRUE(s.ok()) << s.message();
  for (std::size_t i = 0; i < want.o.size(); ++i) {
    const double got = c.o.get(i64(i)), w = want.o[i];
    if (exact)
      ASSERT_EQ(got, w) << "o[" << i << "]";
    else
      ASSERT_NEAR(got, w, tol * (1 + std::abs(w))) << "o[" << i << "]";
  }
  for (std::size_t i = 0; i < want.lse.size(); ++i) {
    const double got = c.lse[i + 8], w = want.lse[i];
    if (std::isinf(w)) {
      ASSERT_EQ(got, w) << "lse[" << i << "]";
      continue;
    }
    if (exact)
      ASSERT_EQ(got, w) << "lse[" << i << "]";
    else
      ASSERT_NEAR(got, w, tol * (1 + std::abs(w))) << "lse[" << i << "]";
  }
  std::vector<unsigned char> k, v;
  c.expected_caches(&k, &v);
  EXPECT_TRUE(c.kc.bytes == k) << "k_cache after the call differs from the cache with the new tokens appended";
  EXPECT_TRUE(c.vc.bytes == v) << "v_cache after the call differs from the cache with the new tokens appended";
  EXPECT_TRUE(c.guards_intact());
}

struct Shape {
  bool paged;
  i64 page_size, max_pages;
  std::vector<std::int32_t> lens;
  i64 s_new, s_q;
};

TEST(KvCacheReference, MatchesGatheredDenseAcrossLayoutsMasksAndAppends) {
  const std::vector<Shape> shapes = {
      {true, 1, 12, {5, 0, 11}, 1, 1},   {true, 3, 5, {7, 3, 0}, 2, 3},  {true, 16, 3, {33, 16, 1}, 3, 4},
      {true, 256, 1, {200, 3, 0}, 4, 5}, {false, 0, 0, {9, 4, 0}, 2, 3}, {true, 3, 4, {4, 9, 6}, 0, 2},
  };
  struct Mask {
    MaskKind kind;
    Window window;
  };
  const std::vector<Mask> masks = {
      {MaskKind::none, {}},     {MaskKind::causal_bottom_right, {}},      {MaskKind::causal, {}},
      {MaskKind::none, {2, 0}}, {MaskKind::causal_bottom_right, {1, -1}}, {MaskKind::none, {0, 1}}};
  std::uint64_t seed = 100;
  for (const Shape& sh : shapes)
    for (const Mask& m : masks)
      for (int variant = 0; variant < 2; ++variant) {
        KvCase c;
        c.b = 3;
        c.paged = sh.paged;
        c.page_size = sh.page_size;
        c.max_pages = sh.max_pages;
        c.s_max = 14;
        c.cache_seqlens = sh.lens;
        c.s_new = sh.s_new;
        c.s_q = sh.s_q;
        c.h = variant ? 6 : 4;
        c.hg = variant ? 1 : 2;  // MQA 6/1, GQA 4/2
        c.d = variant ? 8 : 16;
        c.dv = variant ? 12 : 16;
        c.pad = variant ? 3 : 0;
        c.head_major = variant == 1;
        c.transposed_table = variant == 1;
        if (variant) c.seqlens_q = {std::int32_t(sh.s_q), 0, std::int32_t(sh.s_q > 1 ? sh.s_q - 1 : 1)};
        c.options.mask = m.kind;
        c.options.window = m.window;
        c.seed = seed++;
        c.build();
        SCOPED_TRACE("paged " + std::to_string(sh.paged) + " page " + std::to_string(sh.page_size) + " s_new " +
                     std::to_string(sh.s_new) + " mask " + std::string(to_string(m.kind)) + " window " +
                     std::to_string(m.window.left) + "," + std::to_string(m.window.right) + " variant " +
                     std::to_string(variant));
        run_and_check(c, Backend::reference, true);
      }
}

TEST(KvCacheReference, F16AndBf16MatchTheOracleBitForBit) {
  for (DType dt : {DType::f16, DType::bf16}) {
    KvCase c;
    c.dtype = dt;
    c.page_size = 5;
    c.cache_seqlens = {6, 9};
    c.s_new = 2;
    c.s_q = 2;
    c.options.mask = MaskKind::causal_bottom_right;
    c.build();
    run_and_check(c, Backend::reference, true);
  }
}

TEST(KvCacheReference, DecodeRowSeesOnlyTheNewTokenUnderAZeroWindow) {
  // window (0, 0): the one query row sees exactly its own (just appended) key, so O is that
  // token's V row and LSE its score.
  KvCase c;
  c.b = 1, c.h = 2, c.hg = 1, c.d = 4, c.dv = 4;
  c.cache_seqlens = {7};
  c.s_new = 1;
  c.options.window = {0, 0};
  c.build();
  ASSERT_TRUE(forward_with_kvcache(c.args(Backend::reference)).ok());
  for (i64 hh = 0; hh < 2; ++hh) {
    double dot = 0;
    for (i64 e = 0; e < 4; ++e) {
      EXPECT_EQ(c.o.get(hh * 4 + e), c.vn.get(e));
      dot += double(c.q.get(hh * 4 + e)) * c.kn.get(e);
    }
    EXPECT_NEAR(c.lse[std::size_t(8 + hh)], dot / 2.0, 1e-6);  // scale 1/sqrt(4)
  }
}

TEST(KvCacheReference, SharedPrefixPagesAreReadBySeveralSequences) {
  KvCase c;
  c.page_size = 4;
  c.cache_seqlens = {6, 5};  // page 0 full in both, appends land on page 1
  c.s_new = 1;
  c.share_prefix = true;
  c.build();
  run_and_check(c, Backend::reference, true);
}

TEST(KvCacheReference, EmptyCaches) {
  for (i64 s_new : {0, 2}) {
    KvCase c;
    c.cache_seqlens = {0, 0};
    c.s_new = s_new;
    c.s_q = 2;
    c.options.mask = MaskKind::causal_bottom_right;
    c.build();
    run_and_check(c, Backend::reference, true);
    if (s_new == 0) {  // nothing to attend to: O 0 and LSE -inf everywhere
      for (i64 i = 0; i < c.o.size(); ++i) EXPECT_EQ(c.o.get(i), 0.f);
      for (std::size_t i = 8; i + 8 < c.lse.size(); ++i) EXPECT_EQ(c.lse[i], -INFINITY);
    }
  }
}

TEST(KvCacheReference, CacheAtFullCapacityAndAppendThatFillsIt) {
  KvCase c;
  c.page_size = 3, c.max_pages = 3;
  c.cache_seqlens = {9, 6};
  c.s_new = 0;
  c.build();
  run_and_check(c, Backend::reference, true);
  KvCase d;
  d.page_size = 3, d.max_pages = 3;
  d.cache_seqlens = {7, 4};
  d.s_new = 2;  // 7 + 2 = 9: the last slot of the last page
  d.build();
  run_and_check(d, Backend::reference, true);
}

// ------------------------------------------------------------------ errors

#define EXPECT_KV_INVALID(c, ...)                                                                         \
  do {                                                                                                    \
    const Status st_ = forward_with_kvcache((c).args(Backend::reference));                                \
    EXPECT_EQ(st_.code(), StatusCode::invalid_argument) << st_.message();                                 \
    for (const char* needle_ : {__VA_ARGS__})                                                             \
      EXPECT_NE(st_.message().find(needle_), std::string::npos) << st_.message() << " lacks " << needle_; \
    EXPECT_TRUE((c).outputs_untouched()) << "a refused call wrote O or LSE";                              \
    EXPECT_TRUE((c).kc.bytes == (c).kc_before && (c).vc.bytes == (c).vc_before) << "cache written";       \
  } while (0)

KvCase base_case() {
  KvCase c;
  c.cache_seqlens = {5, 2};
  c.s_new = 1;
  c.build();
  return c;
}

TEST(KvCacheReference, LengthErrors) {
  {
    KvCase c = base_case();
    c.cache_seqlens = {12, 2};  // capacity 4 pages x 3 = 12, plus 1 new token
    EXPECT_KV_INVALID(c, "cache_seqlens[0] is 12", "capacity of 12");
  }
  {
    KvCase c = base_case();
    c.cache_seqlens[1] = -1;
    EXPECT_KV_INVALID(c, "cache_seqlens[1] is -1");
  }
  {
    KvCase c = base_case();
    c.seqlens_q = {1, 2};
    EXPECT_KV_INVALID(c, "seqlens_q[1] is 2", "0 to q's 1 rows");
  }
  {
    KvCase c = base_case();
    c.table[std::size_t(c.table_at(1, 0))] = 99;
    EXPECT_KV_INVALID(c, "block_table[1, 0] is 99", "0 to 9");
  }
  {
    KvCase c = base_case();
    c.table[std::size_t(c.table_at(0, 1))] = -1;  // token 3..5 live on page 1
    EXPECT_KV_INVALID(c, "block_table[0, 1] is -1");
  }
  {
    KvCase c = base_case();  // both sequences append into the same slot
    c.cache_seqlens = {2, 2};
    c.table[std::size_t(c.table_at(1, 0))] = c.table[std::size_t(c.table_at(0, 0))];
    EXPECT_KV_INVALID(c, "two sequences append to slot 2 of page");
  }
}

TEST(KvCacheReference, UnusedBlockTableEntriesAreNotRead) {
  KvCase c = base_case();  // the -1 entries past each sequence's pages stay -1
  EXPECT_EQ(c.table[std::size_t(c.table_at(1, 3))], -1);
  run_and_check(c, Backend::reference, true);
}

TEST(KvCacheReference, ShapeErrors) {
  auto expect = [](KvCacheArgs a, std::initializer_list<const char*> needles) {
    const Status s = forward_with_kvcache(a);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.message();
    for (const char* n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << s.message() << " lacks " << n;
  };
  KvCase c = base_case();
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.k_new.shape[kSeq] = 13;
    a.v_new.shape[kSeq] = 13;
    expect(a, {"13 new tokens exceed the cache's capacity of 12"});
  }
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.v_new = {};
    expect(a, {"v_new"});
  }
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.k_cache.shape[kSeq] = 300;
    a.v_cache.shape[kSeq] = 300;
    expect(a, {"page size", "300", "1 to 256"});
  }
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.block_table.shape[0] = 3;
    expect(a, {"block_table: batch extent 3"});
  }
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.cache_seqlens = nullptr;
    expect(a, {"cache_seqlens is null"});
  }
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.v_cache.shape[kHead] = 1;
    expect(a, {"v_cache: head extent 1"});
  }
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.q.shape[kHead] = 3;
    a.o.shape[kHead] = 3;
    expect(a, {"heads 3 is not a multiple of kv_heads 2"});
  }
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.k_new.dtype = DType::f16;
    expect(a, {"k_new: dtype f16 differs from q's f32"});
  }
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.o.data = a.k_cache.data;  // o overlaps a cache that the append writes
    expect(a, {"overlaps"});
  }
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.lse.shape[2] = 2;
    expect(a, {"lse: shape [2, 4, 2] differs from [b, h, s_q] = [2, 4, 1]"});
  }
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.block_table = {};  // contiguous now: the cache's batch extent must be b
    expect(a, {"k_cache: batch extent 10 differs from q's batch"});
  }
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.options.window = {-2, 0};
    expect(a, {"window left is -2"});
  }
  {
    KvCacheArgs a = c.args(Backend::reference);
    a.block_table.data = reinterpret_cast<const std::int32_t*>(reinterpret_cast<const char*>(c.table.data()) + 2);
    expect(a, {"block_table: data pointer is 2 bytes past a 4-byte boundary"});
  }
}

TEST(KvCacheReference, CancelledCallWritesNothing) {
  KvCase c = base_case();
  std::atomic<bool> stop{true};
  c.options.cancel = &stop;
  const Status s = forward_with_kvcache(c.args(Backend::reference));
  EXPECT_EQ(s.code(), StatusCode::cancelled) << s.message();
  EXPECT_TRUE(c.outputs_untouched());
  EXPECT_TRUE(c.kc.bytes == c.kc_before);
}

// ------------------------------------------------------------------ the rule `kv_cache`

// Stands in for a GPU backend that would accept every problem: the dispatch's `kv_cache` rule
// must still refuse the KV-cache problem before asking it.
class AcceptsEverything final : public detail::BackendImpl {
 public:
  explicit AcceptsEverything(Backend id) : id_(id) {}
  [[nodiscard]] Backend id() const override { return id_; }
  [[nodiscard]] Verdict supports(const detail::Problem&) const override { return {id_, true, "", ""}; }
  [[nodiscard]] Status forward(const detail::Problem&) override { return Status::Ok(); }
  [[nodiscard]] Status backward(const detail::Problem&) override { return Status::Ok(); }

 private:
  Backend id_;
};

TEST(KvCacheRule, GpuBackendsRefuseWithTheKvCacheRule) {
  AcceptsEverything cuda(Backend::cuda), cudnn(Backend::cudnn);
  detail::ScopedBackendOverride fake({{Backend::cuda, &cuda}, {Backend::cudnn, &cudnn}});
  KvCase c = base_case();
  KvCacheArgs a = c.args(Backend::automatic);
  const Explanation ex = explain(a);
  ASSERT_TRUE(ex.validation.ok()) << ex.validation.message();
  EXPECT_NE(ex.layout.find("paged cache: 10 pages of 3 tokens"), std::string::npos) << ex.layout;
  int refused = 0;
  for (const Verdict& v : ex.verdicts) {
    if (v.backend == Backend::cuda || v.backend == Backend::cudnn) {
      EXPECT_FALSE(v.supported);
      EXPECT_EQ(v.rule, "kv_cache");
      EXPECT_NE(v.reason.find("supported on: reference, cpu"), std::string::npos) << v.reason;
      EXPECT_NE(v.reason.find("appends 1 tokens"), std::string::npos) << v.reason;
      ++refused;
    } else {
      EXPECT_TRUE(v.supported) << to_string(v.backend) << ": " << v.rule << ": " << v.reason;
    }
  }
  EXPECT_EQ(refused, 2);
  ASSERT_TRUE(ex.chosen.has_value());
  EXPECT_EQ(*ex.chosen, Backend::cpu);
  for (Backend b : {Backend::cuda, Backend::cudnn}) {
    a.backend = b;
    const Status s = forward_with_kvcache(a);
    EXPECT_EQ(s.code(), StatusCode::unsupported) << s.message();
    EXPECT_NE(s.message().find("kv_cache"), std::string::npos) << s.message();
    EXPECT_TRUE(c.outputs_untouched());
  }
  // The same backends still take ordinary problems: the rule is about KV-cache problems only.
  std::vector<float> q(16), k(16), v(16), o(16);
  ForwardArgs f;
  f.q = {q.data(), DType::f32, {1, 1, 1, 16}, {16, 16, 16, 1}};
  f.k = {k.data(), DType::f32, {1, 1, 1, 16}, {16, 16, 16, 1}};
  f.v = {v.data(), DType::f32, {1, 1, 1, 16}, {16, 16, 16, 1}};
  f.o = {o.data(), DType::f32, {1, 1, 1, 16}, {16, 16, 16, 1}};
  for (const Verdict& v2 : explain(f).verdicts) EXPECT_TRUE(v2.supported) << to_string(v2.backend);
}

}  // namespace
}  // namespace strideattn::test_support
