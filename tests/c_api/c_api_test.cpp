// The C ABI (libstrideattn_c.so): the header is plain C with the same struct layout in C and
// C++; errors come back as codes with one-line messages (null args, struct_size, unknown
// enums, validation failures, truncation); and a forward + backward round trip through
// sa_forward / sa_backward on strided views of one fused buffer (the seed's split) matches
// the fp64 reference under the correctness rule (docs/semantics.md), writes every output
// element and nothing outside the output views.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends/reference/reference.hpp"
#include "common/dtype.hpp"
#include "harness/compare.hpp"
#include "harness/views.hpp"
#include "problem/problem.hpp"
#include "strideattn/strideattn.h"
#include "strideattn/strideattn.hpp"

extern "C" {
size_t sa_test_forward_args_size_c(void);
size_t sa_test_backward_args_size_c(void);
size_t sa_test_forward_run_size_c(void);
size_t sa_test_backward_run_size_c(void);
sa_forward_args sa_test_default_forward_args_c(void);
sa_tensor_view sa_test_view_c(void* data, int32_t dtype, const int64_t shape[4], const int64_t stride[4]);
}

namespace strideattn {
namespace {

constexpr std::uint16_t kPoison = 0x7fc1;  // a bf16 NaN: never a result
constexpr std::int64_t kGuard = 37;        // elements of guard band on each side of a buffer

sa_tensor_view c_view(void* data, const Dims4& shape, const Dims4& stride) {
  return sa_test_view_c(data, SA_BF16, shape.data(), stride.data());
}

TEST(CApi, HeaderIsPlainCWithTheSameLayout) {
  EXPECT_EQ(sa_test_forward_args_size_c(), sizeof(sa_forward_args));
  EXPECT_EQ(sa_test_backward_args_size_c(), sizeof(sa_backward_args));
  EXPECT_EQ(sa_test_forward_run_size_c(), sizeof(sa_forward_run));
  EXPECT_EQ(sa_test_backward_run_size_c(), sizeof(sa_backward_run));
  EXPECT_STREQ(sa_version(), std::string(version()).c_str());
  EXPECT_STREQ(sa_status_name(SA_INVALID_ARGUMENT), "invalid_argument");
  EXPECT_EQ(sa_backend_compiled(SA_BACKEND_REFERENCE), backend_compiled(Backend::reference) ? 1 : 0);
  EXPECT_EQ(sa_backend_compiled(SA_BACKEND_AUTO), 0);
  EXPECT_EQ(sa_backend_compiled(42), 0);
}

TEST(CApi, NullAndStructSizeErrors) {
  char msg[256];
  EXPECT_EQ(sa_forward(nullptr, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_STREQ(msg, "sa_forward_args is null");
  sa_forward_args a = sa_test_default_forward_args_c();
  a.struct_size = 8;
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("sa_forward_args.struct_size is 8; supported: >= "), std::string::npos) << msg;
  sa_backward_args b{};
  EXPECT_EQ(sa_backward(&b, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("sa_backward_args.struct_size is 0"), std::string::npos) << msg;
  std::size_t bytes = 7;
  EXPECT_EQ(sa_workspace_size(nullptr, &bytes, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(sa_workspace_size(&a, nullptr, nullptr, 0), SA_INVALID_ARGUMENT);  // msg may be null
}

TEST(CApi, NewerCallersStructAcceptedOnlyWithZeroUnknownFields) {
  struct Newer {
    sa_forward_args base;
    std::int64_t future_field;
  } n{};
  n.base = sa_test_default_forward_args_c();
  n.base.struct_size = sizeof(Newer);
  char msg[256];
  // Zero tail: accepted, and the call proceeds to validation (zero views are invalid).
  EXPECT_EQ(sa_forward(&n.base, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("q: head"), std::string::npos) << msg;
  n.future_field = 5;
  EXPECT_EQ(sa_forward(&n.base, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("non-zero fields past byte"), std::string::npos) << msg;
}

// The struct ends right before a PROT_NONE page: a struct_size past what the library may
// read (sizeof + 64 > sizeof + 32) must be refused without touching the guard page (reading
// the claimed tail faults), and the largest accepted size reads only zero bytes.
TEST(CApi, OversizedStructSizeIsRefusedWithoutReadingPastTheStruct) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* mem = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* bytes = static_cast<unsigned char*>(mem);
  ASSERT_EQ(mprotect(bytes + page, page, PROT_NONE), 0);
  // Forward: struct at the very end of the readable page.
  auto* f = reinterpret_cast<sa_forward_args*>(bytes + page - sizeof(sa_forward_args));
  *f = sa_test_default_forward_args_c();
  char msg[512];
  for (std::size_t size :
       {sizeof(sa_forward_args) + 64, sizeof(sa_forward_args) + 33, std::size_t{1} << 40, ~std::size_t{0}}) {
    f->struct_size = size;
    EXPECT_EQ(sa_forward(f, msg, sizeof msg), SA_INVALID_ARGUMENT);
    EXPECT_NE(std::string(msg).find("sa_forward_args.struct_size is " + std::to_string(size) + "; supported: "),
              std::string::npos)
        << msg;
    EXPECT_NE(std::string(msg).find(" to " + std::to_string(sizeof(sa_forward_args) + 32)), std::string::npos) << msg;
    EXPECT_EQ(sa_workspace_size(f, nullptr, msg, sizeof msg), SA_INVALID_ARGUMENT);
  }
  // Backward likewise.
  auto* b = reinterpret_cast<sa_backward_args*>(bytes + page - sizeof(sa_backward_args));
  std::memset(static_cast<void*>(b), 0, sizeof *b);
  b->struct_size = sizeof(sa_backward_args) + 64;
  EXPECT_EQ(sa_backward(b, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("sa_backward_args.struct_size is " + std::to_string(sizeof(sa_backward_args) + 64)),
            std::string::npos)
      << msg;
  // The largest accepted size: its 32-byte tail is read (zero here), then validation runs.
  auto* g = reinterpret_cast<sa_forward_args*>(bytes + page - sizeof(sa_forward_args) - 32);
  std::memset(static_cast<void*>(g), 0, sizeof(sa_forward_args) + 32);
  *g = sa_test_default_forward_args_c();
  g->struct_size = sizeof(sa_forward_args) + 32;
  EXPECT_EQ(sa_forward(g, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("q: head"), std::string::npos) << msg;
  munmap(mem, 2 * page);
}

// A valid forward problem over separate bshd host buffers, for error-path tests.
struct Small {
  static constexpr std::int64_t B = 1, S = 4, H = 2, D = 8;
  std::vector<std::uint16_t> q = std::vector<std::uint16_t>(B * S * H * D, 0x3f80), k = q, v = q, o = q;
  sa_forward_args args() {
    sa_forward_args a = sa_test_default_forward_args_c();
    const Dims4 shape{B, S, H, D}, stride{S * H * D, H * D, D, 1};
    a.q = c_view(q.data(), shape, stride);
    a.k = c_view(k.data(), shape, stride);
    a.v = c_view(v.data(), shape, stride);
    a.o = c_view(o.data(), shape, stride);
    a.backend = SA_BACKEND_REFERENCE;
    return a;
  }
};

TEST(CApi, TrainingFeaturesTravelThroughTheAbi) {
  Small s;
  char msg[256];
  sa_forward_args a = s.args();
  a.features.dropout_p = 1.5;
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("dropout: p = 1.5"), std::string::npos) << msg;
  a = s.args();
  a.features.bias_type = 9;
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("bias_type 9 is unknown"), std::string::npos) << msg;
  // Sinks and the max logit, written through the ABI: a sink far above every logit makes O
  // tiny, the max logit is the one score (all inputs 1: scale * d = sqrt(8)).
  float sinks[2] = {40.f, 40.f}, max_logit[2] = {0.f, 0.f};
  a = s.args();
  a.features.softcap = 50.0;
  a.features.sinks = {sinks, {1, 2}, {2, 1}};
  a.max_logit = {max_logit, {1, 2}, {2, 1}};
  ASSERT_EQ(sa_forward(&a, msg, sizeof msg), SA_OK) << msg;
  const double want = 50.0 * std::tanh(std::sqrt(8.0) / 50.0);
  EXPECT_NEAR(max_logit[0], want, 1e-5);
  EXPECT_NEAR(max_logit[1], want, 1e-5);
  EXPECT_LT(std::fabs(float_from_bf16(s.o[0])), 1e-10f);
  // An older caller's struct (ending before the features) gets none of them.
  a = s.args();
  a.features.dropout_p = 1.5;
  a.struct_size = offsetof(sa_forward_args, features);
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_OK) << msg;
  EXPECT_EQ(float_from_bf16(s.o[0]), 1.f);
  // The cudnn backend's dropout rule through explain, in a build with it (the cuda backend
  // refuses these host tensors by their memory first).
  a = s.args();
  a.features.dropout_p = 0.1;
  char text[4096];
  (void)sa_explain(&a, text, sizeof text);
  if (backend_compiled(Backend::cudnn)) EXPECT_NE(std::string(text).find("dropout"), std::string::npos) << text;
}

TEST(CApi, ValidationMessagesComeThrough) {
  Small s;
  char msg[256];
  sa_forward_args a = s.args();
  a.k.stride[3] = 2;
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_STREQ(msg,
               "k: head-dim stride is 2; supported: 1, or -1 for a reversed head dim (the head dimension "
               "must be contiguous)");
  a = s.args();
  a.v.dtype = 9;
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("v: dtype 9 is unknown"), std::string::npos) << msg;
  a = s.args();
  a.backend = 17;
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("backend 17 is unknown"), std::string::npos) << msg;
  a = s.args();
  a.memory = 3;
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("memory 3 is unknown"), std::string::npos) << msg;
  a = s.args();
  a.options.has_window = 1;
  a.options.window_left = -3;
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("window left is -3"), std::string::npos) << msg;
  a = s.args();
  a.options.scale = -1.0;
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("scale is -1"), std::string::npos) << msg;
  a = s.args();
  a.o.data = s.q.data();
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("o overlaps q in memory"), std::string::npos) << msg;
  a = s.args();
  const std::int64_t lens[1] = {4};
  a.varlen.count = 1;
  a.varlen.seqlens_q = lens;
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("seqlens_kv is null"), std::string::npos) << msg;
  a.varlen.count = -2;
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("varlen: count is -2"), std::string::npos) << msg;
}

TEST(CApi, MessageIsTruncatedAndTerminated) {
  Small s;
  sa_forward_args a = s.args();
  a.k.stride[3] = 2;
  char msg[8];
  std::memset(msg, 'x', sizeof msg);
  EXPECT_EQ(sa_forward(&a, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_STREQ(msg, "k: head");
  EXPECT_EQ(sa_forward(&a, nullptr, 0), SA_INVALID_ARGUMENT);
  char one[1] = {'x'};
  EXPECT_EQ(sa_forward(&a, one, 1), SA_INVALID_ARGUMENT);
  EXPECT_EQ(one[0], '\0');
}

// ---------------------------------------------------------------- round trip

// Named host buffers with guard bands; inputs random, outputs poisoned.
struct Buffers {
  std::map<std::string, std::vector<std::uint16_t>> mem;
  void add(const harness::ViewSpec& v) {
    auto& b = mem[v.buffer];
    const auto n = static_cast<std::size_t>(harness::required_extent(v) + 2 * kGuard);
    if (b.size() < n) b.resize(n, kPoison);
  }
  void fill_random(const std::string& name, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& x : mem.at(name)) x = detail::float_to_bf16(u(rng));
  }
  std::uint16_t* at(const harness::ViewSpec& v) { return mem.at(v.buffer).data() + kGuard + v.offset; }
  sa_tensor_view view(const harness::ViewSpec& v) { return c_view(at(v), v.shape, v.stride); }
  TensorView cpp(const harness::ViewSpec& v) {
    TensorView t;
    t.data = at(v);
    t.dtype = DType::bf16;
    t.shape = v.shape;
    t.stride = v.stride;
    return t;
  }
};

// Logical row-major values of a view, and the element offsets the view covers.
std::vector<double> gather(const std::uint16_t* base, const harness::ViewSpec& v, std::vector<bool>* covered,
                           const std::uint16_t* buffer_begin) {
  std::vector<double> out;
  for (std::int64_t b = 0; b < v.shape[0]; ++b)
    for (std::int64_t s = 0; s < v.shape[1]; ++s)
      for (std::int64_t h = 0; h < v.shape[2]; ++h)
        for (std::int64_t d = 0; d < v.shape[3]; ++d) {
          const std::int64_t off = b * v.stride[0] + s * v.stride[1] + h * v.stride[2] + d * v.stride[3];
          out.push_back(detail::bf16_to_float(base[off]));
          if (covered) (*covered)[static_cast<std::size_t>(base + off - buffer_begin)] = true;
        }
  return out;
}

// Every element of the output views was written (no poison left), nothing else changed.
void expect_written_and_guarded(Buffers& buf, const std::string& name, const std::vector<harness::ViewSpec>& views,
                                const std::vector<std::uint16_t>& before) {
  const auto& mem = buf.mem.at(name);
  std::vector<bool> covered(mem.size(), false);
  for (const auto& v : views) {
    const std::vector<double> vals = gather(buf.at(v), v, &covered, mem.data());
    for (double x : vals) ASSERT_FALSE(std::isnan(x)) << name << ": an output element was not written";
  }
  for (std::size_t i = 0; i < mem.size(); ++i)
    if (!covered[i]) ASSERT_EQ(mem[i], before[i]) << name << ": element " << i << " outside the views changed";
}

void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& exact,
                  const std::vector<double>& naive, bool is_lse) {
  ASSERT_EQ(got.size(), exact.size()) << what;
  const harness::ErrorStats naive_err = harness::compare(naive, exact);
  double max_abs = 0;
  for (double x : exact)
    if (std::isfinite(x)) max_abs = std::max(max_abs, std::fabs(x));
  const double tol = harness::tolerance(is_lse ? DType::f32 : DType::bf16,
                                        {.naive_err = naive_err.max_abs_err, .magnitude = max_abs, .largest = max_abs});
  const harness::ErrorStats err = harness::compare(got, exact);
  EXPECT_EQ(err.non_finite, 0) << what;
  EXPECT_LE(err.max_abs_err, tol) << what << ": worst element " << err.worst_index << " = " << err.worst_value
                                  << ", expected " << err.worst_expected;
  EXPECT_GT(max_abs, 0.0) << what << ": a zero result proves nothing";
}

TEST(CApi, ForwardAndBackwardRoundTripOnTheSeedSplit) {
  if (!backend_compiled(Backend::reference)) GTEST_SKIP() << "reference backend not in this build";
  harness::ProblemSizes z;
  z.batch = 2;
  z.s_q = z.s_kv = 9;
  z.heads = 4;
  z.kv_heads = 1;
  z.d_qk = z.d_v = 16;
  harness::LayoutViews lv;
  ASSERT_TRUE(harness::make_layout_views("sb(h+2hg)d", z, &lv).ok());
  Buffers buf;
  for (const auto* v : {&lv.q, &lv.k, &lv.v, &lv.o, &lv.d_o, &lv.dq, &lv.dk, &lv.dv}) buf.add(*v);
  std::mt19937 rng(20240611);
  buf.fill_random("qkv", rng);
  buf.fill_random("do", rng);
  std::vector<float> lse(static_cast<std::size_t>(z.batch * z.heads * z.s_q + 2 * kGuard),
                         std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> lse_before = lse;

  sa_forward_args f = sa_test_default_forward_args_c();
  f.q = buf.view(lv.q);
  f.k = buf.view(lv.k);
  f.v = buf.view(lv.v);
  f.o = buf.view(lv.o);
  f.lse.data = lse.data() + kGuard;
  f.lse.shape[0] = z.batch;
  f.lse.shape[1] = z.heads;
  f.lse.shape[2] = z.s_q;
  f.lse.stride[0] = z.heads * z.s_q;
  f.lse.stride[1] = z.s_q;
  f.lse.stride[2] = 1;
  f.options.mask = SA_MASK_CAUSAL;
  f.options.scale = 0.3;
  f.backend = SA_BACKEND_REFERENCE;

  char text[4096];
  EXPECT_EQ(sa_explain(&f, text, sizeof text), SA_OK);
  EXPECT_NE(std::string(text).find("layout: q, k, v share one buffer: split of sb(h+2hg)d with h 4, hg 1"),
            std::string::npos)
      << text;
  EXPECT_NE(std::string(text).find("reference: supported"), std::string::npos) << text;

  const std::vector<std::uint16_t> o_before = buf.mem.at("o");
  char msg[512];
  ASSERT_EQ(sa_forward(&f, msg, sizeof msg), SA_OK) << msg;
  EXPECT_STREQ(msg, "");
  expect_written_and_guarded(buf, "o", {lv.o}, o_before);
  for (std::int64_t i = 0; i < kGuard; ++i) {
    EXPECT_TRUE(std::isnan(lse[static_cast<std::size_t>(i)]));
    EXPECT_TRUE(std::isnan(lse[lse.size() - 1 - static_cast<std::size_t>(i)]));
  }

  // The same problem through the C++ API, for the fp64 reference.
  ForwardArgs cf;
  cf.q = buf.cpp(lv.q);
  cf.k = buf.cpp(lv.k);
  cf.v = buf.cpp(lv.v);
  cf.o = buf.cpp(lv.o);
  cf.lse.data = f.lse.data;
  cf.lse.shape = {z.batch, z.heads, z.s_q};
  cf.lse.stride = {z.heads * z.s_q, z.s_q, 1};
  cf.options.mask = MaskKind::causal;
  cf.options.scale = 0.3;
  detail::Problem fp;
  ASSERT_TRUE(detail::make_problem(cf, &fp).ok());
  const auto exact = detail::reference_compute(fp, detail::RefPrecision::exact);
  const auto naive = detail::reference_compute(fp, detail::RefPrecision::naive_lowp);
  expect_close("o", gather(buf.at(lv.o), lv.o, nullptr, nullptr), exact.o, naive.o, false);
  std::vector<double> lse_got(lse.begin() + kGuard, lse.end() - kGuard);
  expect_close("lse", lse_got, exact.lse, naive.lse, true);

  // Backward into the packed dqkv buffer, reading o and lse the forward wrote.
  sa_backward_args g{};
  g.struct_size = sizeof g;
  g.q = f.q;
  g.k = f.k;
  g.v = f.v;
  g.o = f.o;
  g.lse = f.lse;
  g.d_o = buf.view(lv.d_o);
  g.dq = buf.view(lv.dq);
  g.dk = buf.view(lv.dk);
  g.dv = buf.view(lv.dv);
  g.options = f.options;
  g.backend = SA_BACKEND_REFERENCE;
  std::size_t ws = 123;
  EXPECT_EQ(sa_backward_workspace_size(&g, &ws, msg, sizeof msg), SA_OK) << msg;
  const std::vector<std::uint16_t> dqkv_before = buf.mem.at("dqkv");
  ASSERT_EQ(sa_backward(&g, msg, sizeof msg), SA_OK) << msg;
  expect_written_and_guarded(buf, "dqkv", {lv.dq, lv.dk, lv.dv}, dqkv_before);

  BackwardArgs cb;
  cb.q = cf.q;
  cb.k = cf.k;
  cb.v = cf.v;
  cb.o = cf.o;
  cb.lse = cf.lse;
  cb.d_o = buf.cpp(lv.d_o);
  cb.dq = buf.cpp(lv.dq);
  cb.dk = buf.cpp(lv.dk);
  cb.dv = buf.cpp(lv.dv);
  cb.options = cf.options;
  detail::Problem bp;
  ASSERT_TRUE(detail::make_problem(cb, &bp).ok());
  const auto bexact = detail::reference_compute(bp, detail::RefPrecision::exact);
  const auto bnaive = detail::reference_compute(bp, detail::RefPrecision::naive_lowp);
  expect_close("dq", gather(buf.at(lv.dq), lv.dq, nullptr, nullptr), bexact.dq, bnaive.dq, false);
  expect_close("dk", gather(buf.at(lv.dk), lv.dk, nullptr, nullptr), bexact.dk, bnaive.dk, false);
  expect_close("dv", gather(buf.at(lv.dv), lv.dv, nullptr, nullptr), bexact.dv, bnaive.dv, false);
}

TEST(CApi, VarlenTablesTravelThroughTheAbi) {
  if (!backend_compiled(Backend::reference)) GTEST_SKIP() << "reference backend not in this build";
  harness::ProblemSizes z;
  z.heads = 2;
  z.kv_heads = 2;
  z.d_qk = z.d_v = 8;
  z.seqlens_q = {3, 0, 5};
  z.offsets_q = {0, 3, 4};  // one padding token between sequences 0 and 2
  z.seqlens_kv = {4, 2, 6};
  z.offsets_kv = {1, 6, 9};
  harness::LayoutViews lv;
  ASSERT_TRUE(harness::make_layout_views("thd_thd_thd", z, &lv).ok());
  Buffers buf;
  for (const auto* v : {&lv.q, &lv.k, &lv.v, &lv.o}) buf.add(*v);
  std::mt19937 rng(7);
  for (const char* n : {"q", "k", "v"}) buf.fill_random(n, rng);
  sa_forward_args f = sa_test_default_forward_args_c();
  f.q = buf.view(lv.q);
  f.k = buf.view(lv.k);
  f.v = buf.view(lv.v);
  f.o = buf.view(lv.o);
  f.varlen.count = 3;
  f.varlen.seqlens_q = z.seqlens_q.data();
  f.varlen.seqlens_kv = z.seqlens_kv.data();
  f.varlen.offsets_q = z.offsets_q.data();
  f.varlen.offsets_kv = z.offsets_kv.data();
  f.backend = SA_BACKEND_REFERENCE;
  char msg[512];
  ASSERT_EQ(sa_forward(&f, msg, sizeof msg), SA_OK) << msg;

  ForwardArgs cf;
  cf.q = buf.cpp(lv.q);
  cf.k = buf.cpp(lv.k);
  cf.v = buf.cpp(lv.v);
  cf.o = buf.cpp(lv.o);
  cf.varlen.seqlens_q = z.seqlens_q;
  cf.varlen.seqlens_kv = z.seqlens_kv;
  cf.varlen.offsets_q = z.offsets_q;
  cf.varlen.offsets_kv = z.offsets_kv;
  detail::Problem p;
  ASSERT_TRUE(detail::make_problem(cf, &p).ok());
  const auto exact = detail::reference_compute(p, detail::RefPrecision::exact);
  const auto naive = detail::reference_compute(p, detail::RefPrecision::naive_lowp);
  expect_close("o", gather(buf.at(lv.o), lv.o, nullptr, nullptr), exact.o, naive.o, false);

  // A sequence running past the tokens is reported through the ABI.
  const std::int64_t bad_offsets[3] = {0, 3, 6};
  f.varlen.offsets_q = bad_offsets;
  EXPECT_EQ(sa_forward(&f, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_STREQ(msg, "q: sequence 2 runs to token 11 but q has 9 tokens");
}

// ---------------------------------------------------------------- plans

// The seed split through sa_plan_*: plans made once, run on the buffers (and again on a copy
// of them elsewhere in memory), against the fp64 reference; the per-run checks and the
// argument errors come back as codes and one-line messages.
TEST(CApi, PlansRunTheSeedSplitWithPointersGivenPerRun) {
  if (!backend_compiled(Backend::reference)) GTEST_SKIP() << "reference backend not in this build";
  harness::ProblemSizes z;
  z.batch = 2;
  z.s_q = z.s_kv = 7;
  z.heads = 4;
  z.kv_heads = 1;
  z.d_qk = z.d_v = 16;
  harness::LayoutViews lv;
  ASSERT_TRUE(harness::make_layout_views("sb(h+2hg)d", z, &lv).ok());
  Buffers buf;
  for (const auto* v : {&lv.q, &lv.k, &lv.v, &lv.o, &lv.d_o, &lv.dq, &lv.dk, &lv.dv}) buf.add(*v);
  std::mt19937 rng(99);
  buf.fill_random("qkv", rng);
  buf.fill_random("do", rng);
  std::vector<float> lse(static_cast<std::size_t>(z.batch * z.heads * z.s_q), 0.f);

  sa_forward_args f = sa_test_default_forward_args_c();
  f.q = buf.view(lv.q), f.k = buf.view(lv.k), f.v = buf.view(lv.v), f.o = buf.view(lv.o);
  // The views here are 2-byte aligned (a 37-element guard band): the plan is made with the
  // pointers, which fixes that alignment (null would assume 16 bytes), and the LSE is
  // requested by its shape alone.
  f.lse.shape[0] = z.batch, f.lse.shape[1] = z.heads, f.lse.shape[2] = z.s_q;
  f.lse.stride[0] = z.heads * z.s_q, f.lse.stride[1] = z.s_q, f.lse.stride[2] = 1;
  f.options.mask = SA_MASK_CAUSAL;
  f.backend = SA_BACKEND_REFERENCE;
  char msg[512];
  sa_plan* fp = nullptr;
  ASSERT_EQ(sa_plan_create(&f, &fp, msg, sizeof msg), SA_OK) << msg;
  ASSERT_NE(fp, nullptr);
  EXPECT_EQ(sa_plan_backend(fp), SA_BACKEND_REFERENCE);
  EXPECT_EQ(sa_plan_is_backward(fp), 0);
  char reason[256];
  EXPECT_EQ(sa_plan_reason(fp, reason, sizeof reason), SA_OK);
  EXPECT_NE(std::string(reason).find("forward runs on reference"), std::string::npos) << reason;
  std::size_t ws = 99;
  EXPECT_EQ(sa_plan_workspace_size(fp, &ws, msg, sizeof msg), SA_OK);
  EXPECT_EQ(ws, 0u);

  sa_forward_run r{};
  r.struct_size = sizeof r;
  r.q = buf.at(lv.q), r.k = buf.at(lv.k), r.v = buf.at(lv.v), r.o = buf.at(lv.o), r.lse = lse.data();
  const std::vector<std::uint16_t> o_before = buf.mem.at("o");
  ASSERT_EQ(sa_plan_run(fp, &r, msg, sizeof msg), SA_OK) << msg;
  expect_written_and_guarded(buf, "o", {lv.o}, o_before);
  ForwardArgs cf;
  cf.q = buf.cpp(lv.q), cf.k = buf.cpp(lv.k), cf.v = buf.cpp(lv.v), cf.o = buf.cpp(lv.o);
  cf.lse = {lse.data(), {z.batch, z.heads, z.s_q}, {z.heads * z.s_q, z.s_q, 1}};
  cf.options.mask = MaskKind::causal;
  detail::Problem prob;
  ASSERT_TRUE(detail::make_problem(cf, &prob).ok());
  const auto exact = detail::reference_compute(prob, detail::RefPrecision::exact);
  const auto naive = detail::reference_compute(prob, detail::RefPrecision::naive_lowp);
  expect_close("o", gather(buf.at(lv.o), lv.o, nullptr, nullptr), exact.o, naive.o, false);
  expect_close("lse", std::vector<double>(lse.begin(), lse.end()), exact.lse, naive.lse, true);

  // The same plan on a copy of the inputs elsewhere: the same answer.
  Buffers copy = buf;
  sa_forward_run r2 = r;
  r2.q = copy.at(lv.q), r2.k = copy.at(lv.k), r2.v = copy.at(lv.v), r2.o = copy.at(lv.o);
  std::fill(copy.mem.at("o").begin(), copy.mem.at("o").end(), kPoison);
  std::vector<float> lse2(lse.size(), 0.f);
  r2.lse = lse2.data();
  ASSERT_EQ(sa_plan_run(fp, &r2, msg, sizeof msg), SA_OK) << msg;
  EXPECT_EQ(gather(copy.at(lv.o), lv.o, nullptr, nullptr), gather(buf.at(lv.o), lv.o, nullptr, nullptr));

  // Per-run checks and argument errors.
  sa_forward_run bad = r;
  bad.o = const_cast<std::uint16_t*>(static_cast<const std::uint16_t*>(r.q));
  EXPECT_EQ(sa_plan_run(fp, &bad, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("o overlaps q in memory"), std::string::npos) << msg;
  bad = r;
  bad.lse = nullptr;
  EXPECT_EQ(sa_plan_run(fp, &bad, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("lse: data is null"), std::string::npos) << msg;
  bad = r;
  bad.struct_size = 8;
  EXPECT_EQ(sa_plan_run(fp, &bad, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("sa_forward_run.struct_size is 8"), std::string::npos) << msg;
  EXPECT_EQ(sa_plan_run(nullptr, &r, msg, sizeof msg), SA_INVALID_ARGUMENT);
  sa_backward_run br{};
  br.struct_size = sizeof br;
  EXPECT_EQ(sa_plan_run_backward(fp, &br, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("a forward plan"), std::string::npos) << msg;

  // Backward into the fused dqkv buffer.
  sa_backward_args g{};
  g.struct_size = sizeof g;
  g.q = f.q, g.k = f.k, g.v = f.v, g.o = f.o, g.lse = f.lse;
  g.d_o = buf.view(lv.d_o), g.dq = buf.view(lv.dq), g.dk = buf.view(lv.dk), g.dv = buf.view(lv.dv);
  g.options = f.options;
  g.backend = SA_BACKEND_REFERENCE;
  sa_plan* bp = nullptr;
  ASSERT_EQ(sa_plan_create_backward(&g, &bp, msg, sizeof msg), SA_OK) << msg;
  EXPECT_EQ(sa_plan_is_backward(bp), 1);
  br.q = r.q, br.k = r.k, br.v = r.v, br.o = r.o, br.d_o = buf.at(lv.d_o), br.lse = lse.data();
  br.dq = buf.at(lv.dq), br.dk = buf.at(lv.dk), br.dv = buf.at(lv.dv);
  const std::vector<std::uint16_t> dqkv_before = buf.mem.at("dqkv");
  ASSERT_EQ(sa_plan_run_backward(bp, &br, msg, sizeof msg), SA_OK) << msg;
  expect_written_and_guarded(buf, "dqkv", {lv.dq, lv.dk, lv.dv}, dqkv_before);
  BackwardArgs cb;
  cb.q = cf.q, cb.k = cf.k, cb.v = cf.v, cb.o = cf.o, cb.lse = cf.lse;
  cb.d_o = buf.cpp(lv.d_o), cb.dq = buf.cpp(lv.dq), cb.dk = buf.cpp(lv.dk), cb.dv = buf.cpp(lv.dv);
  cb.options = cf.options;
  detail::Problem bprob;
  ASSERT_TRUE(detail::make_problem(cb, &bprob).ok());
  const auto bexact = detail::reference_compute(bprob, detail::RefPrecision::exact);
  const auto bnaive = detail::reference_compute(bprob, detail::RefPrecision::naive_lowp);
  expect_close("dq", gather(buf.at(lv.dq), lv.dq, nullptr, nullptr), bexact.dq, bnaive.dq, false);
  expect_close("dk", gather(buf.at(lv.dk), lv.dk, nullptr, nullptr), bexact.dk, bnaive.dk, false);
  expect_close("dv", gather(buf.at(lv.dv), lv.dv, nullptr, nullptr), bexact.dv, bnaive.dv, false);
  sa_plan_destroy(fp);
  sa_plan_destroy(bp);
  sa_plan_destroy(nullptr);

  // A refused plan: *plan stays null.
  f.backend = 42;
  sa_plan* none = reinterpret_cast<sa_plan*>(&f);
  EXPECT_EQ(sa_plan_create(&f, &none, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(sa_plan_backend(nullptr), -1);
}

TEST(CApi, CuSeqlensArraysTravelThroughTheAbi) {
  if (!backend_compiled(Backend::reference)) GTEST_SKIP() << "reference backend not in this build";
  harness::ProblemSizes z;
  z.heads = 2;
  z.kv_heads = 2;
  z.d_qk = z.d_v = 8;
  z.seqlens_q = {3, 0, 5};
  z.offsets_q = {0, 3, 4};
  z.seqlens_kv = {4, 2, 6};
  z.offsets_kv = {1, 6, 9};
  harness::LayoutViews lv;
  ASSERT_TRUE(harness::make_layout_views("thd_thd_thd", z, &lv).ok());
  Buffers buf;
  for (const auto* v : {&lv.q, &lv.k, &lv.v, &lv.o}) buf.add(*v);
  std::mt19937 rng(8);
  for (const char* n : {"q", "k", "v"}) buf.fill_random(n, rng);
  const std::int32_t cu_q[] = {0, 3, 3, 8}, cu_kv[] = {0, 4, 6, 12}, off_q[] = {0, 3, 4}, off_kv[] = {1, 6, 9};
  sa_forward_args f = sa_test_default_forward_args_c();
  f.q = buf.view(lv.q), f.k = buf.view(lv.k), f.v = buf.view(lv.v), f.o = buf.view(lv.o);
  f.cu_seqlens.count = 3;
  f.cu_seqlens.cu_seqlens_q = cu_q;
  f.cu_seqlens.cu_seqlens_kv = cu_kv;
  f.cu_seqlens.seq_offsets_q = off_q;
  f.cu_seqlens.seq_offsets_kv = off_kv;
  f.cu_seqlens.max_seqlen_q = 5;
  f.cu_seqlens.max_seqlen_kv = 6;
  f.backend = SA_BACKEND_REFERENCE;
  char msg[512];
  ASSERT_EQ(sa_forward(&f, msg, sizeof msg), SA_OK) << msg;
  ForwardArgs cf;
  cf.q = buf.cpp(lv.q), cf.k = buf.cpp(lv.k), cf.v = buf.cpp(lv.v), cf.o = buf.cpp(lv.o);
  cf.varlen.seqlens_q = z.seqlens_q, cf.varlen.seqlens_kv = z.seqlens_kv;
  cf.varlen.offsets_q = z.offsets_q, cf.varlen.offsets_kv = z.offsets_kv;
  detail::Problem p;
  ASSERT_TRUE(detail::make_problem(cf, &p).ok());
  const auto exact = detail::reference_compute(p, detail::RefPrecision::exact);
  const auto naive = detail::reference_compute(p, detail::RefPrecision::naive_lowp);
  expect_close("o", gather(buf.at(lv.o), lv.o, nullptr, nullptr), exact.o, naive.o, false);
  f.cu_seqlens.max_seqlen_q = 4;  // sequence 2 has 5 tokens
  EXPECT_EQ(sa_forward(&f, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("sequence 2 has 5 tokens"), std::string::npos) << msg;
  // An older caller's struct (ending before cu_seqlens) gets none.
  f.struct_size = offsetof(sa_forward_args, cu_seqlens);
  EXPECT_EQ(sa_forward(&f, msg, sizeof msg), SA_OK) << msg;  // dense [1, 9, 2, 8] against [1, 12, 2, 8]
}

}  // namespace
}  // namespace strideattn
