// KV-cache attention on `cudnn` (src/backends/cudnn/kvcache.hpp: cuDNN's padding mask with
// per-sequence lengths, paged caches through its page tables, the cuda append kernel first and a
// row fix-up after) against the fp64 reference under the correctness rule, on device copies of
// fresh random inputs: contiguous and paged caches (page sizes 1, 4, 16, 64, 256;
// shuffled, shared, transposed and partly unused block tables), lengths 0, 1, page boundaries
// and the capacity, appends that cross pages (the appended slots hold k_new / v_new, every
// other cache byte is unchanged), GQA / MHA / MQA, head dims 64-256 and d_qk != d_v, s_q = 1
// and chunks with seqlens_q, every mask cuDNN takes (bottom-right diagonals and windows
// measured from the attended end), large values in every cache slot no sequence holds, NaN-filled O and
// LSE, a planted error the comparison must catch, broken promises (NaN rows), a decode step
// replayed from a CUDA graph with new lengths, the workspace query, and the refusals by name.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "harness/runner.hpp"
#include "support/kv_case.hpp"
#include "support/kv_device.hpp"

namespace strideattn::test_support {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!strideattn::harness::gpu_available()) GTEST_SKIP() << "no CUDA GPU present: the cudnn KV-cache tests need one"

std::uint64_t g_seed = 19100;

KvCase make(DType dt, bool paged, i64 page, std::vector<std::int32_t> lens, i64 s_new, i64 s_q, i64 h, i64 hg, i64 d,
            i64 dv, MaskKind mask = MaskKind::causal_bottom_right, Window w = {}) {
  return make_case(g_seed++, dt, paged, page, std::move(lens), s_new, s_q, h, hg, d, dv, mask, w);
}

void expect_ok(KvCase& c, const RunOptions& ro = {}) { expect_ok_on(Backend::cudnn, c, ro); }

TEST(CudnnKvCache, PageSizesLengthsAndAppends) {
  SKIP_WITHOUT_GPU();
  for (i64 page : {1, 16, 64, 256})  // (3 and 200: refused, kv_cache_page_size, in Refusals)
    for (i64 s_new : {0, 1, 5}) {
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

TEST(CudnnKvCache, FullCapacity) {
  SKIP_WITHOUT_GPU();
  for (bool paged : {true, false}) {
    KvCase c = make(DType::bf16, paged, 16, {61, 61}, 3, 1, 8, 8, 64, 64);
    c.max_pages = 4;
    c.s_max = 64;
    c.build();
    expect_ok(c);
  }
}

TEST(CudnnKvCache, GqaMhaMqaAndHeadDims) {
  SKIP_WITHOUT_GPU();
  struct H {
    i64 h, hg;
  };
  for (H hs : {H{32, 8}, H{8, 8}, H{16, 1}})
    for (i64 d : {64, 128, 256}) {
      KvCase c = make(DType::bf16, true, 16, {300, 17, 1000}, 1, 1, hs.h, hs.hg, d, d);
      c.build();
      expect_ok(c);
    }
  for (auto [d, dv] : {std::pair<i64, i64>{192, 128}, {40, 24}}) {
    KvCase c = make(DType::f16, true, 8, {90, 0, 33}, 2, 3, 6, 3, d, dv);
    c.build();
    expect_ok(c);
  }
}

TEST(CudnnKvCache, QueryRowsMasksAndWindows) {
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
      // sequence 1 (3 keys) under a bottom-right diagonal with 7 or 40 rows: rows that see no
      // key (O = 0, LSE = -inf: the fix-up's)
      KvCase c = make(DType::bf16, true, 16, {500, 3, 0, 64}, 2, s_q, 32, 8, 128, 128, m, w);
      if (s_q > 1) c.seqlens_q = {std::int32_t(s_q), std::int32_t(s_q / 2), 1, 0};
      c.build();
      expect_ok(c);
    }
}

TEST(CudnnKvCache, BlockTables) {
  SKIP_WITHOUT_GPU();
  for (bool transposed : {false, true}) {
    KvCase c = make(DType::bf16, true, 16, {40, 33, 100}, 2, 1, 32, 8, 128, 128);
    c.share_prefix = true;
    c.transposed_table = transposed;
    c.build();
    expect_ok(c);
  }
  KvCase c = make(DType::f16, true, 4, {2000, 1, 0, 77}, 1, 1, 16, 4, 64, 64);
  c.num_pages = c.b * c.max_pages + 50;
  c.build();
  expect_ok(c);
}

// Head-major pages [page, head, slot, d] with 16-byte rows, head-major Q and O.
TEST(CudnnKvCache, StridedViews) {
  SKIP_WITHOUT_GPU();
  for (int variant = 0; variant < 2; ++variant) {
    KvCase c = make(DType::bf16, variant == 0, 16, {300, 45, 16}, 3, 5, 8, 2, 64, 64);
    c.head_major = true;
    c.pad = 8;
    c.seqlens_q = {5, 2, 4};
    c.build();
    RunOptions ro;
    ro.qo = variant == 0 ? QoLayout::head_major : QoLayout::dense;
    expect_ok(c, ro);
  }
}

// Slots past each length and pages no sequence uses hold large finite values: cuDNN reads the
// last tile of a sequence past its length and must mask those keys out. (It multiplies them by
// 0, so NaN or infinity there reaches O as NaN: the documented limit of `cudnn` KV calls,
// docs/backends.md; `cuda` never reads them, CudaKvCache tests NaN there.)
TEST(CudnnKvCache, UnusedSlotsAreMaskedOut) {
  SKIP_WITHOUT_GPU();
  for (bool paged : {true, false})
    for (i64 s_new : {0, 3}) {
      KvCase c = make(DType::bf16, paged, 16, {0, 1, 16, 17, 250}, s_new, 2, 8, 2, 128, 128);
      c.seqlens_q = {2, 1, 2, 2, 1};
      c.build();
      poison_unused_slots(c, 3.0e4f);
      expect_ok(c);
    }
}

TEST(CudnnKvCache, PlantedErrorIsCaught) {
  SKIP_WITHOUT_GPU();
  for (bool paged : {true, false}) {
    KvCase c = make(DType::bf16, paged, 16, {20, 9}, 0, 1, 4, 2, 64, 64, MaskKind::none);
    c.build();
    RunOptions ro;
    ro.plant_index = c.cache_index(0, 3, 0, 5, c.dv);
    ro.plant = 64.f;
    const RunResult r = run_on(Backend::cudnn, c, ro);
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_FALSE(r.o.pass()) << "a changed V element went unnoticed: max abs err " << r.o.err.max_abs_err;
  }
}

// Lengths or a block-table entry that break the caller's promises: that sequence's O and LSE
// rows are NaN, the others right, and the run does not fault.
TEST(CudnnKvCache, BrokenPromisesGiveNanRows) {
  SKIP_WITHOUT_GPU();
  for (int what = 0; what < 3; ++what) {
    SCOPED_TRACE(what == 0 ? "cache_seqlens" : what == 1 ? "seqlens_q" : "block table");
    KvCase good = make(DType::bf16, true, 16, {40, 30, 70}, what == 1 ? 0 : 2, 3, 8, 2, 64, 64);
    good.seqlens_q = {3, 3, 2};
    good.build();
    KvCase bad = good;
    if (what == 0) bad.cache_seqlens[1] = std::int32_t(bad.max_pages * bad.page_size);
    if (what == 1) bad.seqlens_q[1] = 4;
    if (what == 2) bad.table[std::size_t(bad.table_at(1, 1))] = std::int32_t(bad.rows() + 7);
    const RunResult want = run_on(Backend::cudnn, good);
    ASSERT_TRUE(want.status.ok()) << want.status.message();
    ASSERT_TRUE(want.o.pass() && want.lse.pass());
    // (the reference refuses the broken case: run it on the device through a copy of the
    // good case's buffers with the broken host arrays)
    KvCacheArgs host = bad.args(Backend::cudnn);
    DeviceBuffers dev;
    for (Buf* b : {&bad.q, &bad.kc, &bad.vc, &bad.kn, &bad.vn, &bad.o}) dev.add(b->bytes.data(), b->bytes.size());
    dev.add(bad.lse.data(), bad.lse.size() * sizeof(float));
    dev.add(bad.cache_seqlens.data(), bad.cache_seqlens.size() * 4);
    dev.add(bad.seqlens_q.data(), bad.seqlens_q.size() * 4);
    dev.add(bad.table.data(), bad.table.size() * 4);
    KvCacheArgs a = host;
    a.q.data = dev.at(a.q.data), a.k_cache.data = dev.at(a.k_cache.data), a.v_cache.data = dev.at(a.v_cache.data);
    a.k_new.data = dev.at(a.k_new.data), a.v_new.data = dev.at(a.v_new.data), a.o.data = dev.at(a.o.data);
    a.lse.data = dev.at(a.lse.data), a.block_table.data = dev.at(a.block_table.data);
    a.cache_seqlens = dev.at(a.cache_seqlens), a.seqlens_q = dev.at(a.seqlens_q);
    a.memory = Memory::device;
    const Status s = forward_with_kvcache(a);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dev.back(bad.o.bytes.data());
    dev.back(bad.lse.data());
    const std::vector<double> o = read_o(bad, host.o, bad.o.bytes.data() + bad.o.guard * i64(size_of(bad.dtype)));
    for (i64 n = 0; n < bad.b; ++n)
      for (i64 hh = 0; hh < bad.h; ++hh)
        for (i64 i = 0; i < bad.s_q; ++i) {
          const std::size_t l = std::size_t((n * bad.h + hh) * bad.s_q + i);
          const double got_lse = bad.lse[l + 8];
          if (n == 1) {
            ASSERT_TRUE(std::isnan(got_lse)) << "lse of the broken sequence, row " << i;
          } else if (std::isinf(want.lse_out[l])) {
            ASSERT_EQ(got_lse, want.lse_out[l]);
          } else {
            ASSERT_NEAR(got_lse, want.lse_out[l], 1e-3);
          }
          for (i64 e = 0; e < bad.dv; ++e) {
            const std::size_t at = std::size_t(((n * bad.s_q + i) * bad.h + hh) * bad.dv + e);
            if (n == 1)
              ASSERT_TRUE(std::isnan(o[at])) << "o of the broken sequence, row " << i;
            else
              ASSERT_NEAR(o[at], want.o_out[at], 0.02) << "o of sequence " << n;
          }
        }
    EXPECT_TRUE(bad.guards_intact());
  }
}

// A decode step captured in a CUDA graph with the caller's workspace (workspace_size's bytes)
// and replayed with new lengths: the call neither synchronises nor allocates, and the lengths
// are read when the graph runs.
TEST(CudnnKvCache, GraphReplayReadsNewLengths) {
  SKIP_WITHOUT_GPU();
  KvCase c = make(DType::bf16, true, 16, {128, 48}, 0, 1, 8, 2, 128, 128);
  c.build();
  DeviceBuffers dev;
  for (Buf* b : {&c.q, &c.kc, &c.vc, &c.o}) dev.add(b->bytes.data(), b->bytes.size());
  dev.add(c.lse.data(), c.lse.size() * sizeof(float));
  dev.add(c.cache_seqlens.data(), c.cache_seqlens.size() * 4);
  dev.add(c.table.data(), c.table.size() * 4);
  KvCacheArgs a = c.args(Backend::cudnn);
  a.q.data = dev.at(a.q.data), a.k_cache.data = dev.at(a.k_cache.data), a.v_cache.data = dev.at(a.v_cache.data);
  a.o.data = dev.at(a.o.data), a.lse.data = dev.at(a.lse.data), a.block_table.data = dev.at(a.block_table.data);
  std::int32_t* lens_dev = dev.at(c.cache_seqlens.data());
  a.cache_seqlens = lens_dev;
  a.memory = Memory::device;
  std::size_t ws_bytes = 0;
  ASSERT_TRUE(workspace_size(a, &ws_bytes).ok());
  EXPECT_GT(ws_bytes, 0u);  // lengths, flags, the packed table and the stats at least
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
  a.stream = stream, a.workspace = ws, a.workspace_bytes = ws_bytes - 1;
  const Status small = forward_with_kvcache(a);
  EXPECT_EQ(small.code(), StatusCode::invalid_argument) << small.message();
  EXPECT_NE(small.message().find("too small"), std::string::npos) << small.message();
  a.workspace_bytes = ws_bytes;
  ASSERT_TRUE(forward_with_kvcache(a).ok());
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
    c.cache_seqlens = lens;
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

// What cudnn refuses, by name, in explain: causal (top-left) with a window, f32, 4-byte rows,
// pages of a size that is not a power of two.
TEST(CudnnKvCache, RefusalsNameTheirRule) {
  SKIP_WITHOUT_GPU();
  struct Want {
    DType dtype;
    MaskKind mask;
    Window window;
    i64 pad;
    const char* rule;
    i64 page = 16;
  };
  for (const Want& w :
       {Want{DType::bf16, MaskKind::causal, {8, 0}, 0, "kv_cache_mask"},
        Want{DType::f32, MaskKind::none, {}, 0, "dtype"}, Want{DType::bf16, MaskKind::none, {}, 2, "alignment"},
        Want{DType::bf16, MaskKind::none, {}, 0, "kv_cache_page_size", 3},
        Want{DType::bf16, MaskKind::none, {}, 0, "kv_cache_page_size", 200}}) {
    KvCase c = make(w.dtype, true, w.page, {30, 2}, 1, 1, 4, 2, 64, 64, w.mask, w.window);
    c.pad = w.pad;
    c.build();
    KvCacheArgs a = c.args(Backend::cudnn);
    a.memory = Memory::device;  // (explain only: nothing is read)
    const Explanation ex = explain(a);
    ASSERT_TRUE(ex.validation.ok()) << ex.validation.message();
    bool found = false;
    for (const Verdict& v : ex.verdicts)
      if (v.backend == Backend::cudnn) {
        found = true;
        EXPECT_FALSE(v.supported);
        EXPECT_EQ(v.rule, w.rule) << v.reason;
      }
    EXPECT_TRUE(found);
  }
}

}  // namespace
}  // namespace strideattn::test_support
