// KV-cache attention on `cuda` (the decode kernels of src/backends/cuda/decode/) against the
// fp64 reference under the correctness rule, on fresh random inputs copied to the device:
// contiguous and paged caches (page sizes 1, 3, 16, 64, 200, 256; shuffled, shared and partly
// unused block tables, transposed tables), lengths 0, 1, page boundaries and the capacity,
// appends that cross pages (the appended slots must hold k_new / v_new and every other byte
// of the caches, guards included, must be unchanged), GQA 32/8 and 64/8, MHA and MQA, s_q = 1
// and a few dozen rows with seqlens_q, every mask and windows, head dims 64, 128, 256 and
// d_qk != d_v, odd strided views (head-major pages, padded rows: the element-wise load path;
// head-major Q and O), split and unsplit key ranges, NaN-filled O and LSE, a planted error the
// comparison must catch, and lengths or block-table entries that break the caller's promises
// (NaN rows, no crash, nothing outside the valid appends written). Every case runs twice,
// through the decode kernels and through the dense forward (forced by the plan's test hook,
// whatever the shape would pick: docs/backends.md "KV-cache attention"). Skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backends/cuda/test_hook.hpp"
#include "backends/reference/reference_kvcache.hpp"
#include "harness/compare.hpp"
#include "harness/runner.hpp"
#include "problem/kv_cache.hpp"
#include "support/kv_case.hpp"
#include "support/kv_device.hpp"

namespace strideattn::test_support {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!strideattn::harness::gpu_available()) GTEST_SKIP() << "no CUDA GPU present: the cuda KV-cache tests need one"

std::uint64_t g_seed = 9100;

// The kernels of a KV-cache call, forced: the decode kernels, then the dense forward.
cuda_impl::PlanForcing forced(bool dense) {
  cuda_impl::PlanForcing f;
  f.kv_cache_dense = dense;
  return f;
}
const char* path_name(bool dense) { return dense ? "dense forward" : "decode kernels"; }

RunResult run_cuda(KvCase& c, const RunOptions& ro = {}) { return run_on(Backend::cuda, c, ro); }
void expect_ok(KvCase& c, const RunOptions& ro = {}) {
  for (bool dense : {false, true}) {
    SCOPED_TRACE(path_name(dense));
    const cuda_impl::ScopedCudaPlanForcing force(forced(dense));
    expect_ok_on(Backend::cuda, c, ro);
  }
}

// A case with the sizes given and fresh inputs (a new seed each).
KvCase make(DType dt, bool paged, i64 page, std::vector<std::int32_t> lens, i64 s_new, i64 s_q, i64 h, i64 hg, i64 d,
            i64 dv, MaskKind mask = MaskKind::causal_bottom_right, Window w = {}) {
  return make_case(g_seed++, dt, paged, page, std::move(lens), s_new, s_q, h, hg, d, dv, mask, w);
}

TEST(CudaKvCache, PageSizesLengthsAndAppends) {
  SKIP_WITHOUT_GPU();
  for (i64 page : {1, 3, 16, 64, 200, 256})
    for (i64 s_new : {0, 1, 5}) {
      // lengths 0, 1, a page boundary, one past it, and a long one
      KvCase c = make(DType::bf16, true, page, {0, 1, std::int32_t(page), std::int32_t(page + 1), 700}, s_new, 1, 8, 2,
                      128, 128);
      c.build();
      expect_ok(c);
    }
  for (i64 s_new : {0, 2}) {
    KvCase c = make(DType::f16, false, 0, {0, 1, 64, 65, 900}, s_new, 1, 8, 2, 128, 128);
    c.build();
    expect_ok(c);
  }
}

TEST(CudaKvCache, FullCapacity) {
  SKIP_WITHOUT_GPU();
  for (bool paged : {true, false}) {
    // capacity 64 (4 pages of 16, or s_max 64): 61 cached + 3 appended fill it exactly
    KvCase c = make(DType::bf16, paged, 16, {61, 61}, 3, 1, 8, 8, 64, 64);
    c.max_pages = 4;
    c.s_max = 64;
    c.build();
    expect_ok(c);
  }
}

TEST(CudaKvCache, GqaMhaMqaAndHeadDims) {
  SKIP_WITHOUT_GPU();
  struct H {
    i64 h, hg;
  };
  for (H hs : {H{32, 8}, H{64, 8}, H{8, 8}, H{16, 1}})
    for (i64 d : {64, 128, 256}) {
      KvCase c = make(DType::bf16, true, 16, {300, 17, 1000}, 1, 1, hs.h, hs.hg, d, d);
      c.build();
      expect_ok(c);
    }
  // d_qk != d_v, and head dims off the buckets
  for (auto [d, dv] : {std::pair<i64, i64>{192, 128}, {40, 24}, {128, 256}, {8, 8}}) {
    KvCase c = make(DType::f16, true, 7, {90, 0, 33}, 2, 3, 6, 3, d, dv);
    c.build();
    expect_ok(c);
  }
}

TEST(CudaKvCache, QueryRowsMasksAndWindows) {
  SKIP_WITHOUT_GPU();
  const std::pair<MaskKind, Window> masks[] = {{MaskKind::none, {}},
                                               {MaskKind::causal_bottom_right, {}},
                                               {MaskKind::causal, {}},
                                               {MaskKind::none, {8, 0}},
                                               {MaskKind::causal_bottom_right, {40, -1}},
                                               {MaskKind::none, {3, 5}},
                                               {MaskKind::causal_bottom_right, {0, 0}}};
  for (const auto& [m, w] : masks)
    for (i64 s_q : {1, 7, 40}) {
      KvCase c = make(DType::bf16, true, 16, {500, 3, 0, 64}, 2, s_q, 32, 8, 128, 128, m, w);
      if (s_q > 1) c.seqlens_q = {std::int32_t(s_q), std::int32_t(s_q / 2), 1, 0};
      c.build();
      expect_ok(c);
    }
}

// Chunked prefill: many row tiles per KV head (group 4 x 200 rows = 50 tiles).
TEST(CudaKvCache, ChunkedPrefill) {
  SKIP_WITHOUT_GPU();
  KvCase c = make(DType::f16, true, 64, {1000, 200}, 200, 200, 8, 2, 64, 64);
  c.seqlens_q = {200, 150};
  c.build();
  expect_ok(c);
}

TEST(CudaKvCache, BlockTables) {
  SKIP_WITHOUT_GPU();
  // shared prefix (sequence 1 reads sequence 0's first page), transposed table
  for (bool transposed : {false, true}) {
    KvCase c = make(DType::bf16, true, 16, {40, 33, 100}, 2, 1, 32, 8, 128, 128);
    c.share_prefix = true;
    c.transposed_table = transposed;
    c.build();
    expect_ok(c);
  }
  // many spare pages in the pool, and sequences of very different lengths
  KvCase c = make(DType::f16, true, 3, {2000, 1, 0, 77}, 1, 1, 16, 4, 64, 64);
  c.num_pages = c.b * c.max_pages + 50;
  c.build();
  expect_ok(c);
}

TEST(CudaKvCache, OddStridedViews) {
  SKIP_WITHOUT_GPU();
  // head-major pages [page, head, slot, d] with padded rows (pad 5: strides off the 8-element
  // grid, so the caches take the element-wise path), head-major Q and O, Q off 16 bytes.
  for (int variant = 0; variant < 4; ++variant) {
    KvCase c = make(variant % 2 ? DType::f16 : DType::bf16, variant < 3, 16, {300, 45, 16}, 3, 5, 8, 2, 64, 64,
                    MaskKind::causal_bottom_right);
    c.head_major = variant != 1;
    c.pad = variant == 2 ? 8 : 5;  // 8: padded but still 16-byte rows
    c.seqlens_q = {5, 2, 4};
    c.build();
    RunOptions ro;
    ro.qo = variant % 2 ? QoLayout::head_major : QoLayout::dense;
    ro.odd_q_offset = variant == 3;
    expect_ok(c, ro);
  }
}

// Splits of the key range: a single sequence and KV head over a long cache takes many splits,
// many sequences take one; both against the reference, and the combine's NaN and -inf rows.
TEST(CudaKvCache, SplitAndUnsplitKeyRanges) {
  SKIP_WITHOUT_GPU();
  {
    KvCase c = make(DType::bf16, true, 64, {40000}, 1, 1, 8, 1, 128, 128);
    c.build();
    expect_ok(c);
  }
  {
    std::vector<std::int32_t> lens(160, 200);
    for (std::size_t i = 0; i < lens.size(); ++i) lens[i] = std::int32_t(50 + 37 * i % 400);
    KvCase c = make(DType::f16, false, 0, lens, 1, 1, 32, 8, 128, 128);
    c.build();
    expect_ok(c);
  }
  {
    // window: most splits see no key of the row (their partials are -inf)
    KvCase c = make(DType::bf16, true, 16, {20000, 5}, 0, 2, 4, 1, 64, 64, MaskKind::causal_bottom_right, {30, 0});
    c.build();
    expect_ok(c);
  }
}

// The comparison is not vacuous: one V element of an attended token changed after the
// reference ran must fail O.
TEST(CudaKvCache, PlantedErrorIsCaught) {
  SKIP_WITHOUT_GPU();
  for (bool dense : {false, true})
    for (bool paged : {true, false}) {
      SCOPED_TRACE(path_name(dense));
      const cuda_impl::ScopedCudaPlanForcing force(forced(dense));
      KvCase c = make(DType::bf16, paged, 16, {20, 9}, 0, 1, 4, 2, 64, 64, MaskKind::none);
      c.build();
      RunOptions ro;
      ro.plant_index = c.cache_index(0, 3, 0, 5, c.dv);
      ro.plant = 64.f;
      const RunResult r = run_cuda(c, ro);
      ASSERT_TRUE(r.status.ok()) << r.status.message();
      EXPECT_FALSE(r.o.pass()) << "a changed V element went unnoticed: max abs err " << r.o.err.max_abs_err;
    }
}

// Lengths and block-table entries that break the caller's promises: the sequence's O and LSE
// rows are NaN, the other sequences correct, nothing out of bounds, and no append of the broken
// sequence lands anywhere.
TEST(CudaKvCache, BrokenPromisesGiveNanRows) {
  SKIP_WITHOUT_GPU();
  // short caches run unsplit; a 3,000-token one makes every sequence's keys split (the combine
  // then writes the broken sequence's rows)
  for (int what = 0; what < 12; ++what) {
    const bool split = what % 6 >= 3, dense = what >= 6;
    const cuda_impl::ScopedCudaPlanForcing force(forced(dense));
    SCOPED_TRACE(std::string(path_name(dense)) + ", broken " +
                 std::string(what % 3 == 0   ? "cache_seqlens"
                             : what % 3 == 1 ? "seqlens_q"
                                             : "block table") +
                 (split ? ", split" : ", unsplit"));
    KvCase c = make(DType::bf16, true, 16, {split ? 3000 : 40, 30, 70}, what % 3 == 1 ? 0 : 2, 3, 8, 2, 64, 64);
    c.seqlens_q = {3, 3, 2};
    c.build();
    // the reference on the valid case, then the promise broken for sequence 1 only
    KvCase good = c;
    KvCacheArgs ha = good.args(Backend::reference);
    detail::KvCacheProblem hp;
    ASSERT_TRUE(detail::make_kvcache_problem(ha, &hp).ok());
    detail::ReferenceOutputs exact;
    ASSERT_TRUE(detail::reference_kvcache_compute(hp, detail::RefPrecision::exact, &exact).ok());
    std::vector<unsigned char> want_k, want_v;
    good.expected_caches(&want_k, &want_v);
    if (what % 3 == 0) c.cache_seqlens[1] = std::int32_t(c.max_pages * c.page_size);  // + s_new > capacity
    if (what % 3 == 1) c.seqlens_q[1] = 4;                                            // > s_q
    if (what % 3 == 2) c.table[std::size_t(c.table_at(1, 1))] = std::int32_t(c.rows() + 7);

    DeviceBuffers dev;
    for (Buf* b : {&c.q, &c.kc, &c.vc, &c.kn, &c.vn, &c.o}) dev.add(b->bytes.data(), b->bytes.size());
    dev.add(c.lse.data(), c.lse.size() * sizeof(float));
    dev.add(c.cache_seqlens.data(), c.cache_seqlens.size() * 4);
    dev.add(c.seqlens_q.data(), c.seqlens_q.size() * 4);
    dev.add(c.table.data(), c.table.size() * 4);
    KvCacheArgs a = c.args(Backend::cuda);
    a.q.data = dev.at(a.q.data), a.k_cache.data = dev.at(a.k_cache.data), a.v_cache.data = dev.at(a.v_cache.data);
    a.k_new.data = dev.at(a.k_new.data), a.v_new.data = dev.at(a.v_new.data), a.o.data = dev.at(a.o.data);
    a.lse.data = dev.at(a.lse.data), a.block_table.data = dev.at(a.block_table.data);
    a.cache_seqlens = dev.at(a.cache_seqlens), a.seqlens_q = dev.at(a.seqlens_q);
    a.memory = Memory::device;
    const Status s = forward_with_kvcache(a);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (Buf* b : {&c.kc, &c.vc, &c.o}) dev.back(b->bytes.data());
    dev.back(c.lse.data());
    for (i64 n = 0; n < c.b; ++n)
      for (i64 i = 0; i < c.s_q; ++i)
        for (i64 hh = 0; hh < c.h; ++hh) {
          const float lse = c.lse[std::size_t(8 + (n * c.h + hh) * c.s_q + i)];
          const double want_lse = exact.lse[std::size_t((n * c.h + hh) * c.s_q + i)];
          for (i64 e = 0; e < c.dv; ++e) {
            const i64 at = ((n * c.s_q + i) * c.h + hh) * c.dv + e;
            if (n == 1) {
              ASSERT_TRUE(std::isnan(c.o.get(at))) << "o of the broken sequence, row " << i << " head " << hh;
            } else {
              ASSERT_NEAR(c.o.get(at), exact.o[std::size_t(at)], 0.05) << "o of sequence " << n;
            }
          }
          if (n == 1)
            ASSERT_TRUE(std::isnan(lse)) << "lse of the broken sequence";
          else if (std::isinf(want_lse))
            ASSERT_EQ(double(lse), want_lse);
          else
            ASSERT_NEAR(lse, want_lse, 0.01);
        }
    EXPECT_TRUE(c.guards_intact());
    // Sequences 0 and 2 appended as promised; sequence 1 appended nothing: its lengths are
    // broken, or (block table) its new tokens fall on the page whose entry is broken.
    for (i64 t = 0; t < c.s_new; ++t)
      for (i64 hh = 0; hh < c.hg; ++hh) {
        for (i64 e = 0; e < c.d; ++e) {
          const i64 idx = good.cache_index(1, good.cache_seqlens[1] + t, hh, e, c.d);
          detail::store_from_float(want_k.data() + c.kc.guard * 2, c.dtype, idx, good.kc.get(idx));
        }
        for (i64 e = 0; e < c.dv; ++e) {
          const i64 idx = good.cache_index(1, good.cache_seqlens[1] + t, hh, e, c.dv);
          detail::store_from_float(want_v.data() + c.vc.guard * 2, c.dtype, idx, good.vc.get(idx));
        }
      }
    EXPECT_TRUE(c.kc.bytes == want_k && c.vc.bytes == want_v) << "cache bytes outside the valid appends changed";
  }
}

// A decode step captured once in a CUDA graph and replayed with new lengths written to the
// device between replays: the lengths are read when the kernels run, and the call makes no
// allocation or synchronisation that capture would refuse (the caller's workspace, global
// capture mode). Each replay against the reference for its lengths.
TEST(CudaKvCache, GraphReplayReadsNewLengths) {
  SKIP_WITHOUT_GPU();
  // pages for 128 and 48 tokens; every replay's lengths stay within them
  for (bool dense : {false, true}) {
    SCOPED_TRACE(path_name(dense));
    const cuda_impl::ScopedCudaPlanForcing force(forced(dense));
    KvCase c = make(DType::bf16, true, 16, {128, 48}, 0, 1, 8, 2, 128, 128);
    c.build();
    DeviceBuffers dev;
    for (Buf* b : {&c.q, &c.kc, &c.vc, &c.o}) dev.add(b->bytes.data(), b->bytes.size());
    dev.add(c.lse.data(), c.lse.size() * sizeof(float));
    dev.add(c.cache_seqlens.data(), c.cache_seqlens.size() * 4);
    dev.add(c.table.data(), c.table.size() * 4);
    KvCacheArgs a = c.args(Backend::cuda);
    a.q.data = dev.at(a.q.data), a.k_cache.data = dev.at(a.k_cache.data), a.v_cache.data = dev.at(a.v_cache.data);
    a.o.data = dev.at(a.o.data), a.lse.data = dev.at(a.lse.data), a.block_table.data = dev.at(a.block_table.data);
    std::int32_t* lens_dev = dev.at(c.cache_seqlens.data());
    a.cache_seqlens = lens_dev;
    a.memory = Memory::device;
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    void* ws = nullptr;
    const std::size_t ws_bytes = std::size_t(64) << 20;
    ASSERT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
    a.stream = stream, a.workspace = ws, a.workspace_bytes = ws_bytes;
    ASSERT_TRUE(forward_with_kvcache(a).ok());  // (first call: the once-per-device queries)
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    const Status captured = forward_with_kvcache(a);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(captured.ok()) << captured.message();
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (const std::vector<std::int32_t>& lens : {std::vector<std::int32_t>{100, 37}, {128, 1}, {0, 48}, {17, 16}}) {
      SCOPED_TRACE("lengths " + std::to_string(lens[0]) + ", " + std::to_string(lens[1]));
      c.cache_seqlens = lens;  // (the same host storage: the device copy's source)
      ASSERT_EQ(cudaMemcpyAsync(lens_dev, lens.data(), 8, cudaMemcpyHostToDevice, stream), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      dev.back(c.o.bytes.data());
      dev.back(c.lse.data());
      KvCacheArgs host = c.args(Backend::reference);
      detail::KvCacheProblem p;
      ASSERT_TRUE(detail::make_kvcache_problem(host, &p).ok());
      detail::ReferenceOutputs exact, naive;
      ASSERT_TRUE(detail::reference_kvcache_compute(p, detail::RefPrecision::exact, &exact).ok());
      ASSERT_TRUE(detail::reference_kvcache_compute(p, detail::RefPrecision::naive_lowp, &naive).ok());
      const std::vector<double> o = read_o(c, host.o, c.o.bytes.data() + c.o.guard * i64(size_of(c.dtype)));
      std::vector<double> lse(exact.lse.size());
      for (std::size_t i = 0; i < lse.size(); ++i) lse[i] = c.lse[i + 8];
      const harness::TensorCheck co = harness::check_tensor("o", c.dtype, o, naive.o, exact.o);
      const harness::TensorCheck cl = harness::check_tensor("lse", DType::f32, lse, naive.lse, exact.lse);
      EXPECT_TRUE(co.pass()) << "o: max abs err " << co.err.max_abs_err << " tol " << co.tol;
      EXPECT_TRUE(cl.pass()) << "lse: max abs err " << cl.err.max_abs_err << " tol " << cl.tol;
    }
    (void)cudaGraphExecDestroy(exec);
    (void)cudaGraphDestroy(graph);
    (void)cudaFree(ws);
    (void)cudaStreamDestroy(stream);
  }
}

// The caller's workspace is used as given (no allocation); too small a one is refused.
TEST(CudaKvCache, CallersWorkspace) {
  SKIP_WITHOUT_GPU();
  KvCase c = make(DType::bf16, true, 16, {30000}, 1, 1, 8, 1, 128, 128);
  c.build();
  DeviceBuffers dev;
  for (Buf* b : {&c.q, &c.kc, &c.vc, &c.kn, &c.vn, &c.o}) dev.add(b->bytes.data(), b->bytes.size());
  dev.add(c.lse.data(), c.lse.size() * sizeof(float));
  dev.add(c.cache_seqlens.data(), c.cache_seqlens.size() * 4);
  dev.add(c.table.data(), c.table.size() * 4);
  KvCacheArgs a = c.args(Backend::cuda);
  a.q.data = dev.at(a.q.data), a.k_cache.data = dev.at(a.k_cache.data), a.v_cache.data = dev.at(a.v_cache.data);
  a.k_new.data = dev.at(a.k_new.data), a.v_new.data = dev.at(a.v_new.data), a.o.data = dev.at(a.o.data);
  a.lse.data = dev.at(a.lse.data), a.block_table.data = dev.at(a.block_table.data);
  a.cache_seqlens = dev.at(a.cache_seqlens);
  a.memory = Memory::device;
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, 64), cudaSuccess);
  a.workspace = ws;
  a.workspace_bytes = 64;
  const Status s = forward_with_kvcache(a);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.message();
  EXPECT_NE(s.message().find("too small"), std::string::npos) << s.message();
  (void)cudaFree(ws);
}

// Lengths left in host memory while the call says device memory: refused before any kernel
// could read them, naming the array.
TEST(CudaKvCache, HostLengthsAreRefused) {
  SKIP_WITHOUT_GPU();
  KvCase c = make(DType::bf16, true, 16, {30, 2}, 0, 1, 4, 2, 64, 64);
  c.build();
  DeviceBuffers dev;
  for (Buf* b : {&c.q, &c.kc, &c.vc, &c.o}) dev.add(b->bytes.data(), b->bytes.size());
  dev.add(c.table.data(), c.table.size() * 4);
  KvCacheArgs a = c.args(Backend::cuda);
  a.q.data = dev.at(a.q.data), a.k_cache.data = dev.at(a.k_cache.data), a.v_cache.data = dev.at(a.v_cache.data);
  a.o.data = dev.at(a.o.data), a.block_table.data = dev.at(a.block_table.data);
  a.lse = {};
  a.memory = Memory::device;  // cache_seqlens stays in host memory
  const Status s = forward_with_kvcache(a);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.message();
  EXPECT_EQ(s.message().rfind("cache_seqlens.data points to host memory but memory is device", 0), 0u) << s.message();
}

// What the cuda backend refuses, by name: f32, head dims past 256, host memory.
TEST(CudaKvCache, RefusalsNameTheirRule) {
  SKIP_WITHOUT_GPU();
  KvCase c = make(DType::f32, true, 16, {30, 2}, 1, 1, 4, 2, 64, 64);
  c.build();
  KvCacheArgs a = c.args(Backend::cuda);
  a.memory = Memory::device;  // (explain only: nothing is read)
  const Explanation ex = explain(a);
  ASSERT_TRUE(ex.validation.ok()) << ex.validation.message();
  bool found = false;
  for (const Verdict& v : ex.verdicts)
    if (v.backend == Backend::cuda) {
      found = true;
      EXPECT_FALSE(v.supported);
      EXPECT_EQ(v.rule, "dtype") << v.reason;
    }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace strideattn::test_support
