// Tests of the harness runner's own checks: guard bands, written outputs and planted
// corruption must each be caught, and a clean run must pass. If these fail, every other
// backend test could be passing vacuously.
#include <gtest/gtest.h>

#include <limits>

#include "harness/buffers.hpp"
#include "harness/runner.hpp"

namespace strideattn::harness {
namespace {

ViewSpec view(std::string buf, std::int64_t off, Dims4 shape, Dims4 stride) {
  return ViewSpec{std::move(buf), off, shape, stride};
}

TEST(BufferSet, CleanRunPassesAndInputsStayPristine) {
  BufferSet bufs;
  const ViewSpec in = view("mem", 0, {1, 4, 2, 8}, {64, 16, 8, 1});
  const ViewSpec out = view("mem", 64, {1, 4, 2, 8}, {64, 16, 8, 1});  // same buffer, disjoint
  bufs.allocate({&in, &out}, DType::f16);
  bufs.fill_random(5);
  bufs.prepare_outputs({&out}, {}, {&in});
  HostBuffer& b = bufs.at("mem");
  EXPECT_EQ(b.extent(), 128);
  for (std::int64_t o : view_offsets(in)) EXPECT_NE(b.bits(o), poison_bits(DType::f16));
  for (std::int64_t o : view_offsets(out)) EXPECT_EQ(b.bits(o), poison_bits(DType::f16));
  for (std::int64_t o : view_offsets(out)) b.set_bits(o, 0x3c00);  // 1.0
  const BufferSet::CheckResult r = bufs.check_after_run();
  EXPECT_TRUE(r.written_ok) << r.written_msg;
  EXPECT_TRUE(r.guard_ok) << r.guard_msg;
}

TEST(BufferSet, UnwrittenOutputElementIsCaught) {
  BufferSet bufs;
  const ViewSpec out = view("o", 3, {2, 3, 2, 8}, {80, 24, 8, 1});  // gaps between rows
  bufs.allocate({&out}, DType::bf16);
  bufs.fill_random(1);
  bufs.prepare_outputs({&out}, {}, {});
  HostBuffer& b = bufs.at("o");
  const std::vector<std::int64_t> offs = view_offsets(out);
  for (std::size_t i = 0; i + 1 < offs.size(); ++i) b.set_bits(offs[i], 0x3f80);
  const BufferSet::CheckResult r = bufs.check_after_run();
  EXPECT_FALSE(r.written_ok);
  EXPECT_TRUE(r.guard_ok);
  EXPECT_NE(r.written_msg.find("'o'"), std::string::npos) << r.written_msg;
}

TEST(BufferSet, WritesIntoGapsAndGuardBandsAreCaught) {
  for (std::int64_t where : {std::int64_t(-1), std::int64_t(-kGuardElems), std::int64_t(10)}) {
    BufferSet bufs;
    // Rows of 8 in a stride of 16: elements 8..15 of each row are a gap the kernel must not touch.
    const ViewSpec out = view("o", 0, {1, 4, 1, 8}, {64, 16, 16, 1});
    bufs.allocate({&out}, DType::f32);
    bufs.fill_random(2);
    bufs.prepare_outputs({&out}, {}, {});
    HostBuffer& b = bufs.at("o");
    for (std::int64_t o : view_offsets(out)) b.set_bits(o, 0);
    b.set_bits(where, 0x3f800000u);
    const BufferSet::CheckResult r = bufs.check_after_run();
    EXPECT_TRUE(r.written_ok) << where;
    EXPECT_FALSE(r.guard_ok) << "write at element " << where << " not caught";
  }
}

TEST(BufferSet, ChangedInputIsCaught) {
  BufferSet bufs;
  const ViewSpec in = view("q", 0, {1, 2, 1, 8}, {16, 8, 8, 1});
  const ViewSpec out = view("o", 0, {1, 2, 1, 8}, {16, 8, 8, 1});
  bufs.allocate({&in, &out}, DType::f16);
  bufs.fill_random(3);
  bufs.prepare_outputs({&out}, {}, {&in});
  for (std::int64_t o : view_offsets(out)) bufs.at("o").set_bits(o, 0);
  bufs.at("q").set_bits(5, bufs.at("q").bits(5) ^ 0x1);
  EXPECT_FALSE(bufs.check_after_run().guard_ok);
}

TEST(Views, RequiredExtentCountsOffsetAndReachNotStrideZero) {
  EXPECT_EQ(required_extent(view("x", 5, {2, 3, 1, 8}, {100, 10, 0, 1})), 5 + 100 + 20 + 7 + 1);
  EXPECT_EQ(required_extent(view("x", 7, {1, std::int64_t(1) << 50, 1, 8}, {0, 0, 0, 1})), 7 + 8);
  EXPECT_EQ(required_extent(view("x", 9, {0, 4, 1, 8}, {32, 8, 8, 1})), 9);  // empty: the offset
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(required_extent(view("x", 0, {1, big, 1, 8}, {1, big, 8, 1})), big);  // saturates
  EXPECT_EQ(required_extent(view("x", big, {1, 1, 1, 1}, {1, 1, 1, 1})), big);
}

TEST(Views, LayoutSizesNear2To63AreRefused) {
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  ProblemSizes z;
  z.batch = 1, z.s_q = big, z.s_kv = big, z.heads = 4, z.kv_heads = 4, z.d_qk = 64, z.d_v = 64;
  LayoutViews lv;
  for (const std::string& name : layout_names()) {
    if (name[0] == 't') continue;  // varlen: below
    const Status s = make_layout_views(name, z, &lv);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << name;
    EXPECT_NE(s.message().find("--seqlen-q 9223372036854775807"), std::string::npos) << s.message();
  }
  z.s_q = z.s_kv = 8, z.heads = z.kv_heads = z.d_qk = z.d_v = std::int64_t(1) << 32;
  EXPECT_EQ(make_layout_views("sb(h+2hg)d", z, &lv).code(), StatusCode::invalid_argument);
  ProblemSizes v;
  v.heads = v.kv_heads = 2;
  v.seqlens_q = v.seqlens_kv = {10, big};
  const Status s = make_layout_views("thd_thd_thd", v, &lv);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("--seqlens-q"), std::string::npos) << s.message();
  v.seqlens_q = v.seqlens_kv = {10};
  v.offsets_q = {big - 3};
  EXPECT_NE(make_layout_views("t3hd", v, &lv).message().find("--offsets-q 9223372036854775804"), std::string::npos);
}

// The memory pre-check counts each buffer's real extent: offsets and gaps count, logical
// elements that stride 0 maps onto one element do not.
TEST(HostMemory, CountsRealExtentsNotLogicalElements) {
  CaseSpec spec;
  spec.dtype = DType::f32;
  spec.views.q = view("q", 0, {1, 4, 1, 8}, {32, 8, 8, 1});
  spec.views.o = view("o", 0, {1, 4, 1, 8}, {32, 8, 8, 1});
  spec.views.k = view("k", 0, {1, std::int64_t(1) << 50, 1, 8}, {0, 0, 0, 1});
  spec.views.v = view("v", 0, {1, std::int64_t(1) << 50, 1, 8}, {0, 0, 0, 1});
  const HostMemoryEstimate e = estimate_host_memory(spec, false);
  EXPECT_LT(e.total(), 1 << 20) << e.total();
  EXPECT_GT(e.total(), 4 * (4 * 32 + 4 * 512));  // four small buffers and their guard bands
  // The reference's copies of K and V do scale with the key count.
  EXPECT_GT(estimate_host_memory(spec, true).scratch, 1e15);

  spec.dtype = DType::f16;
  spec.views.k = view("k", 0, {1, 4, 1, 8}, {32, 8, 8, 1});
  spec.views.v = view("v", 0, {1, 4, 1, 8}, {32, 8, 8, 1});
  spec.views.q.offset = std::int64_t(1) << 31;  // 2^31 elements before q's first
  const HostMemoryEstimate off = estimate_host_memory(spec, false);
  EXPECT_GE(off.buffers, 7.0 * double(std::int64_t(1) << 31)) << off.buffers;
  EXPECT_LT(off.buffers, 7.1 * double(std::int64_t(1) << 31)) << off.buffers;
}

CaseSpec small_case(bool grad) {
  CaseSpec spec;
  spec.dtype = DType::bf16;
  spec.sizes.batch = 2, spec.sizes.s_q = 37, spec.sizes.s_kv = 45;
  spec.sizes.heads = 4, spec.sizes.kv_heads = 2, spec.sizes.d_qk = 32, spec.sizes.d_v = 24;
  spec.layout_name = "sbhd_sbhd_sbhd";
  EXPECT_TRUE(make_layout_views(spec.layout_name, spec.sizes, &spec.views).ok());
  spec.options.mask = MaskKind::causal_bottom_right;
  spec.grad = grad;
  spec.seed = 11;
  return spec;
}

const BackendResult& only(const CaseReport& rep) {
  EXPECT_EQ(rep.backends.size(), 1u);
  return rep.backends.front();
}

TEST(RunCase, CleanCaseAgreesOnCpu) {
  CaseReport rep;
  ASSERT_TRUE(run_case(small_case(true), {Backend::cpu}, &rep).ok());
  const BackendResult& r = only(rep);
  EXPECT_EQ(r.status, "ok") << r.reason;
  ASSERT_EQ(r.checks.size(), 5u);  // o, lse, dq, dk, dv
  for (const TensorCheck& c : r.checks) {
    EXPECT_GT(c.tol, 0) << c.name;
    EXPECT_GT(c.err.max_abs_err, 0) << c.name << ": a bf16 result equal to fp64 is suspicious";
  }
  EXPECT_TRUE(rep.all_ok());
}

struct PlantCase {
  const char* kind;
  const char* tensor;
  double delta;
  const char* expect_in_reason;
};

TEST(RunCase, PlantedCorruptionIsCaught) {
  const PlantCase plants[] = {
      {"value", "o", 0.25, "o[b="},
      {"value", "lse", 0.01, "lse[b="},
      {"value", "dq", 0.25, "dq[b="},
      {"value", "dk", -0.25, "dk[b="},
      {"value", "dv", 0.25, "dv[b="},
      {"unwritten", "o", 0, "not written"},
      {"unwritten", "dk", 0, "not written"},
      {"guard", "o", 0, "outside the output views"},
      {"guard", "dv", 0, "outside the output views"},
  };
  for (const PlantCase& p : plants) {
    CaseSpec spec = small_case(true);
    spec.plant = CaseSpec::Plant{.kind = p.kind, .tensor = p.tensor, .index = 17, .delta = p.delta};
    CaseReport rep;
    ASSERT_TRUE(run_case(spec, {Backend::cpu}, &rep).ok());
    const BackendResult& r = only(rep);
    EXPECT_EQ(r.status, "mismatch") << p.kind << " " << p.tensor;
    EXPECT_NE(r.reason.find(p.expect_in_reason), std::string::npos) << p.kind << " " << p.tensor << ": " << r.reason;
    EXPECT_FALSE(rep.all_ok());
  }
}

// dO naming O's buffer: the backends' backward reads the O their forward wrote there (or, in
// the same buffer beside O, the pristine random values); the targets must read the same dO.
// The targets read the pristine dO instead, so every backend mismatched (f32: dq 3.09).
TEST(RunCase, DoAliasingOutputGetsTheSameTargetsAsTheBackends) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool same_elements : {true, false}) {
      CaseSpec spec = small_case(true);
      spec.dtype = dtype;
      const ViewSpec o = spec.views.o;  // contiguous sbhd [2, 37, 4, 24] in buffer "o"
      if (same_elements) {
        spec.views.d_o = o;
      } else {  // after O in the same buffer
        spec.views.d_o = o;
        spec.views.d_o.offset = required_extent(o) + 5;
      }
      CaseReport rep;
      ASSERT_TRUE(run_case(spec, {Backend::reference, Backend::cpu}, &rep).ok());
      for (const BackendResult& r : rep.backends) {
        EXPECT_EQ(r.status, "ok") << to_string(dtype) << " same_elements=" << same_elements << " "
                                  << to_string(r.backend) << ": " << r.reason;
        for (const TensorCheck& c : r.checks) EXPECT_EQ(c.err.non_finite, 0) << c.name;
      }
      // Still a real comparison: a planted dv error is caught.
      spec.plant = CaseSpec::Plant{.kind = "value", .tensor = "dv", .index = 3, .delta = 0.25};
      ASSERT_TRUE(run_case(spec, {Backend::cpu}, &rep).ok());
      EXPECT_EQ(only(rep).status, "mismatch") << to_string(dtype);
    }
  }
}

TEST(RunCase, InvalidViewsAreInvalidArgument) {
  CaseSpec spec = small_case(false);
  spec.views.o = spec.views.q;  // o overlaps q exactly
  spec.views.o.shape[kHeadDim] = spec.sizes.d_v;
  CaseReport rep;
  const Status s = run_case(spec, {Backend::cpu}, &rep);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.message();
}

TEST(RunCase, GpuBackendsWithoutGpuAreUnsupportedWithReason) {
  if (gpu_available()) GTEST_SKIP() << "a GPU is present; covered by the gpu-labelled tests";
  CaseReport rep;
  ASSERT_TRUE(run_case(small_case(false), {Backend::cuda, Backend::cudnn}, &rep).ok());
  for (const BackendResult& r : rep.backends) {
    EXPECT_EQ(r.status, "unsupported");
    EXPECT_FALSE(r.reason.empty());
  }
}

TEST(Reproducer, NamesLayoutAndOverrides) {
  CaseSpec spec = small_case(true);
  spec.views.o = ViewSpec{"big", 7, spec.views.o.shape, {9999, 200, 40, 1}};
  const std::string line = reproducer(spec, {Backend::cpu, Backend::cuda});
  EXPECT_EQ(line.rfind("strideattn check ", 0), 0u) << line;
  EXPECT_NE(line.find("--layout 'sbhd_sbhd_sbhd'"), std::string::npos) << line;
  EXPECT_NE(line.find("--o big+7:2,37,4,24:9999,200,40,1"), std::string::npos) << line;
  EXPECT_EQ(line.find("--q "), std::string::npos) << line;
  EXPECT_NE(line.find("--grad"), std::string::npos) << line;
  EXPECT_NE(line.find("--seed 11"), std::string::npos) << line;
  EXPECT_NE(line.find("--backends cpu,cuda"), std::string::npos) << line;
}

}  // namespace
}  // namespace strideattn::harness
