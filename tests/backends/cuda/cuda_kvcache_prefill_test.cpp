// KV-cache calls with many query rows (chunked prefill) on `cuda`: the dense forward
// (sm90/forward.cuh on an H200, sm80/forward.cuh where the test hook forces the sm80 kernels)
// with K and V read through the cache, against the fp64 reference under the correctness rule
// (fresh random inputs, NaN-filled O and LSE, guards, the caches byte for byte). The shape
// picks the dense forward here (s_q >= kDenseMinQueryRows; explain says so); each case also
// runs forced onto the decode kernels, on the same inputs. Paged (page sizes 1, 3, 16, 64, 200:
// smaller and larger than the kernels' key blocks, not powers of two) and contiguous caches,
// shuffled, shared and transposed block tables, lengths 0 and at page boundaries, rows past
// seqlens_q, GQA 32/8, MHA and MQA, head dims 64, 128, 256, f16 and bf16, odd strides (the
// element-wise loads), unused cache slots filled with NaN (a kernel that reads past a
// sequence's length shows), long caches (the fold), and a planted K or V error that must be
// caught. Broken promises on the dense path: cuda_kvcache_test.cpp (every case there runs both
// ways). Skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/decode/decode_host.hpp"
#include "backends/cuda/test_hook.hpp"
#include "harness/runner.hpp"
#include "support/kv_case.hpp"
#include "support/kv_device.hpp"

namespace strideattn::test_support {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!strideattn::harness::gpu_available()) GTEST_SKIP() << "no CUDA GPU present: the cuda KV-cache tests need one"

std::uint64_t g_seed = 9700;

KvCase make(DType dt, bool paged, i64 page, std::vector<std::int32_t> lens, i64 s_new, i64 s_q, i64 h, i64 hg, i64 d,
            MaskKind mask = MaskKind::causal_bottom_right, Window w = {}) {
  return make_case(g_seed++, dt, paged, page, std::move(lens), s_new, s_q, h, hg, d, d, mask, w);
}

// What explain says the cuda backend runs for the case.
std::string cuda_reason(KvCase& c) {
  KvCacheArgs a = c.args(Backend::cuda);
  a.memory = Memory::device;  // (explain only: nothing is read)
  const Explanation ex = explain(a);
  for (const Verdict& v : ex.verdicts)
    if (v.backend == Backend::cuda) return v.supported ? v.reason : "unsupported: " + v.rule + ": " + v.reason;
  return "no verdict";
}

// The case on the shape's choice (the dense forward: checked through explain), then forced
// onto the decode kernels; `arch` forces the dense forward's architecture too.
void expect_ok(KvCase& c, const RunOptions& ro = {}, std::optional<cuda_impl::Arch> arch = std::nullopt) {
  ASSERT_GE(c.s_q, cuda_impl::kDenseMinQueryRows);
  for (bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode kernels (forced)" : "dense forward");
    cuda_impl::PlanForcing f;
    f.arch = arch;
    if (decode) f.kv_cache_dense = false;
    const cuda_impl::ScopedCudaPlanForcing force(f);
    const std::string why = cuda_reason(c);
    EXPECT_NE(why.find(decode ? "runs the decode kernels" : "runs the dense forward"), std::string::npos) << why;
    expect_ok_on(Backend::cuda, c, ro);
  }
}

TEST(CudaKvCachePrefill, ShapeChoosesTheKernels) {
  SKIP_WITHOUT_GPU();
  for (i64 s_q : {1, 63, 64, 512}) {
    KvCase c = make(DType::bf16, true, 16, {100, 30}, 0, s_q, 32, 8, 128);
    c.build();
    const std::string why = cuda_reason(c);
    EXPECT_NE(why.find(s_q >= 64 ? "runs the dense forward" : "runs the decode kernels"), std::string::npos)
        << "s_q " << s_q << ": " << why;
    if (s_q >= 64) EXPECT_NE(why.find("KV-cache instantiation, paged"), std::string::npos) << why;
  }
}

TEST(CudaKvCachePrefill, PageSizesAndLengths) {
  SKIP_WITHOUT_GPU();
  // lengths 0, a page boundary, one past it, and a long one; appends that cross pages
  int i = 0;
  for (i64 page : {0, 1, 3, 16, 64, 200}) {
    const i64 p = page ? page : 64;
    for (i64 s_new : {0, 70}) {
      KvCase c = make(i++ % 2 ? DType::f16 : DType::bf16, page != 0, page,
                      {0, std::int32_t(p), std::int32_t(p + 1), 450}, s_new, 96, 8, 2, 64);
      c.seqlens_q = {96, 70, 1, 96};
      c.build();
      poison_unused_slots(c);
      expect_ok(c);
    }
  }
}

TEST(CudaKvCachePrefill, HeadsHeadDimsAndDtypes) {
  SKIP_WITHOUT_GPU();
  struct H {
    i64 h, hg;
  };
  int i = 0;
  for (H hs : {H{32, 8}, H{16, 1}, H{4, 4}})
    for (i64 d : {64, 128, 256}) {
      const bool paged = i % 3 != 2;
      KvCase c =
          make(i % 2 ? DType::f16 : DType::bf16, paged, i % 3 == 0 ? 16 : 64, {260, 17, 129}, 3, 72, hs.h, hs.hg, d);
      ++i;
      c.build();
      poison_unused_slots(c);
      expect_ok(c);
    }
}

// The sm80 forward (mma.sync) on the same kind of inputs: what an A100 runs.
TEST(CudaKvCachePrefill, Sm80Kernels) {
  SKIP_WITHOUT_GPU();
  for (i64 d : {64, 128, 256})
    for (bool paged : {true, false}) {
      KvCase c = make(paged ? DType::bf16 : DType::f16, paged, 3, {300, 0, 64}, 2, 80, 8, 2, d);
      c.build();
      poison_unused_slots(c);
      expect_ok(c, {}, cuda_impl::Arch::sm80);
    }
}

TEST(CudaKvCachePrefill, MasksAndWindows) {
  SKIP_WITHOUT_GPU();
  const std::pair<MaskKind, Window> masks[] = {{MaskKind::none, {}},
                                               {MaskKind::causal, {}},
                                               {MaskKind::none, {40, 0}},
                                               {MaskKind::causal_bottom_right, {100, -1}},
                                               {MaskKind::none, {3, 70}}};
  for (const auto& [m, w] : masks) {
    KvCase c = make(DType::bf16, true, 16, {500, 3, 0, 200}, 2, 130, 8, 2, 128, m, w);
    c.seqlens_q = {130, 65, 1, 0};
    c.build();
    expect_ok(c);
  }
}

TEST(CudaKvCachePrefill, BlockTables) {
  SKIP_WITHOUT_GPU();
  // shared prefix (sequence 1 reads sequence 0's first page), transposed table; the pages are
  // shuffled over the pool by build()
  for (bool transposed : {false, true}) {
    KvCase c = make(DType::bf16, true, 16, {40, 33, 100}, 2, 64, 32, 8, 128);
    c.share_prefix = true;
    c.transposed_table = transposed;
    c.build();
    expect_ok(c);
  }
  KvCase c = make(DType::f16, true, 3, {2000, 1, 0, 77}, 1, 100, 16, 4, 64);
  c.num_pages = c.b * c.max_pages + 50;
  c.build();
  poison_unused_slots(c);
  expect_ok(c);
}

TEST(CudaKvCachePrefill, OddStridedViews) {
  SKIP_WITHOUT_GPU();
  // head-major pages with padded rows (pad 5: the element-wise path), head-major Q and O, Q off
  // 16 bytes
  for (int variant = 0; variant < 4; ++variant) {
    KvCase c = make(variant % 2 ? DType::f16 : DType::bf16, variant < 3, 16, {300, 45, 16}, 3, 80, 8, 2, 64);
    c.head_major = variant != 1;
    c.pad = variant == 2 ? 8 : 5;
    c.seqlens_q = {80, 20, 64};
    c.build();
    RunOptions ro;
    ro.qo = variant % 2 ? QoLayout::head_major : QoLayout::dense;
    ro.odd_q_offset = variant == 3;
    expect_ok(c, ro);
  }
}

// Caches longer than kFoldKeys: the dense forward's fold (its outer accumulator in the workspace).
TEST(CudaKvCachePrefill, LongCaches) {
  SKIP_WITHOUT_GPU();
  for (bool paged : {true, false}) {
    KvCase c = make(DType::bf16, paged, 64, {20000, 9000}, 64, 64, 8, 2, 128);
    c.build();
    expect_ok(c);
  }
}

// The comparison is not vacuous on the dense path: one K or V element of an attended token
// changed after the reference ran must fail O.
TEST(CudaKvCachePrefill, PlantedErrorIsCaught) {
  SKIP_WITHOUT_GPU();
  for (bool paged : {true, false})
    for (bool k : {false, true}) {
      KvCase c = make(DType::bf16, paged, 16, {20, 9}, 0, 64, 4, 2, 64, MaskKind::none);
      c.build();
      const std::string why = cuda_reason(c);
      ASSERT_NE(why.find("runs the dense forward"), std::string::npos) << why;
      RunOptions ro;
      ro.plant_index = c.cache_index(0, 3, 0, 5, k ? c.d : c.dv);
      ro.plant_k = k;
      ro.plant = 64.f;
      const RunResult r = run_on(Backend::cuda, c, ro);
      ASSERT_TRUE(r.status.ok()) << r.status.message();
      EXPECT_FALSE(r.o.pass()) << "a changed " << (k ? "K" : "V") << " element went unnoticed: max abs err "
                               << r.o.err.max_abs_err;
    }
}

}  // namespace
}  // namespace strideattn::test_support
