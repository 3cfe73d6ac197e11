// `cudnn` on non-finite inputs (docs/semantics.md, "Non-finite values, overflow and the
// scale"; the fix-up is src/backends/cudnn/nonfinite.cu). Two parts:
//   - CudnnNonFinite/Planted: NaN and infinities planted in Q, K, V or dO, and rows whose
//     scores are all -inf, on dense, GQA, MQA, causal, windowed and varlen problems with
//     padding, run through harness::run_case against the fp64 reference under its
//     non-finite policy (tools/harness/compare.hpp: the reference's NaN must be NaN, its inf
//     non-finite, every output "no key" answer only where the reference gives it).
//   - CudnnNonFiniteReach: device buffers through the public API against the `reference`
//     backend on host copies of the same inputs: every NaN of the reference is NaN, and what
//     a plant cannot reach is finite and close to the reference: other sequences, other
//     KV-head groups, the other rows of a Q or dO plant (in O, LSE, dQ), LSE and dV of a V
//     plant, varlen padding (0, LSE -inf) and rows that see no key (O = 0, LSE = -inf,
//     whatever their Q holds). The forward without LSE must give the same
//     O as the forward with it (its stats then live in the workspace).
// Skips, saying so, without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cudnn/nonfinite.hpp"
#include "common/attention_math.hpp"
#include "common/dtype.hpp"
#include "harness/runner.hpp"
#include "harness/views.hpp"
#include "strideattn/strideattn.hpp"
#include "support/backend_case.hpp"

namespace strideattn {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!harness::gpu_available()) GTEST_SKIP() << "no CUDA GPU present: the cudnn non-finite tests need one"

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ======================================================================= the harness's rule

using harness::CaseSpec;
using harness::ProblemSizes;

struct Shape {
  std::string name;
  ProblemSizes sizes;
  std::string layout;
  MaskKind mask = MaskKind::none;
  Window window{};
  DType dtype = DType::bf16;
};

ProblemSizes dense_sizes(std::int64_t b, std::int64_t sq, std::int64_t skv, std::int64_t h, std::int64_t hg,
                         std::int64_t d) {
  ProblemSizes s;
  s.batch = b, s.s_q = sq, s.s_kv = skv, s.heads = h, s.kv_heads = hg, s.d_qk = d, s.d_v = d;
  return s;
}

ProblemSizes varlen_sizes(std::vector<std::int64_t> lq, std::vector<std::int64_t> lkv, std::vector<std::int64_t> oq,
                          std::vector<std::int64_t> okv, std::int64_t h, std::int64_t hg, std::int64_t d) {
  ProblemSizes s = dense_sizes(std::int64_t(lq.size()), 0, 0, h, hg, d);
  s.seqlens_q = std::move(lq), s.seqlens_kv = std::move(lkv);
  s.offsets_q = std::move(oq), s.offsets_kv = std::move(okv);
  for (auto x : s.seqlens_q) s.s_q = std::max(s.s_q, x);
  for (auto x : s.seqlens_kv) s.s_kv = std::max(s.s_kv, x);
  return s;
}

// Every row of every shape sees at least one key (cuDNN refuses other rows: empty_rows),
// except the rows of the varlen sequence with no keys, which get the "no key" answer.
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {
      {"dense_mha_f16", dense_sizes(2, 160, 160, 2, 2, 64), "bshd_bshd_bshd", MaskKind::none, {}, DType::f16},
      {"gqa_causal", dense_sizes(1, 200, 200, 8, 2, 128), "bshd_bshd_bshd", MaskKind::causal, {}, DType::bf16},
      {"mqa_window", dense_sizes(2, 150, 220, 4, 1, 64), "sbhd_sbhd_sbhd", MaskKind::none, {24, 8}, DType::bf16},
      {"gqa_causal_br_f16",
       dense_sizes(1, 96, 300, 4, 2, 64),
       "bhsd_bhsd_bhsd",
       MaskKind::causal_bottom_right,
       {},
       DType::f16},
      // head dims 32 and 256: the fix-up's row kernel reads a row with 4 and with 32 lanes
      {"mqa_causal_d32", dense_sizes(1, 130, 130, 2, 1, 32), "bshd_bshd_bshd", MaskKind::causal, {}, DType::bf16},
      {"mha_d256_f16", dense_sizes(1, 100, 100, 2, 2, 256), "bshd_bshd_bshd", MaskKind::none, {}, DType::f16},
      // padding between sequences, a sequence without queries and one without keys
      {"varlen_gaps_gqa",
       varlen_sizes({20, 33, 0, 9, 7}, {40, 33, 12, 0, 17}, {3, 30, 70, 70, 85}, {0, 50, 90, 110, 110}, 8, 2, 64),
       "thd_thd_thd",
       MaskKind::causal_bottom_right,
       {},
       DType::bf16},
      {"varlen_window",
       varlen_sizes({40, 60}, {50, 60}, {}, {}, 4, 2, 128),
       "thd_t2hd",
       MaskKind::none,
       {12, 3},
       DType::bf16},
  };
  return s;
}

// A position inside sequence `seq`: row (query side) or key (key side), head, head-dim column.
struct Site {
  std::int64_t seq = 0, pos = 0, head = 0, col = 0;
};

// Logical row-major index of a site in a view of the case: [b, s, heads, d] dense,
// [1, tokens, heads, d] varlen (offsets default to packed).
std::int64_t logical_index(const ProblemSizes& z, bool kv_side, std::int64_t heads, std::int64_t d, const Site& s) {
  if (!z.varlen()) {
    const std::int64_t len = kv_side ? z.s_kv : z.s_q;
    return ((s.seq * len + s.pos) * heads + s.head) * d + s.col;
  }
  const auto& lens = kv_side ? z.seqlens_kv : z.seqlens_q;
  const auto& offs = kv_side ? z.offsets_kv : z.offsets_q;
  std::int64_t first = 0;
  if (!offs.empty()) {
    first = offs[std::size_t(s.seq)];
  } else {
    for (std::int64_t i = 0; i < s.seq; ++i) first += lens[std::size_t(i)];
  }
  return ((first + s.pos) * heads + s.head) * d + s.col;
}

struct Planter {
  std::string name;
  // The plants for a case, given the sequence planted in, its lengths and the sizes.
  std::function<std::vector<CaseSpec::InputPlant>(const ProblemSizes&, std::int64_t seq, std::int64_t lq,
                                                  std::int64_t lkv)>
      make;
};

const std::vector<Planter>& planters() {
  using P = CaseSpec::InputPlant;
  auto q_at = [](const ProblemSizes& z, Site s) { return logical_index(z, false, z.heads, z.d_qk, s); };
  auto k_at = [](const ProblemSizes& z, Site s) { return logical_index(z, true, z.kv_heads, z.d_qk, s); };
  auto v_at = [](const ProblemSizes& z, Site s) { return logical_index(z, true, z.kv_heads, z.d_v, s); };
  auto do_at = [](const ProblemSizes& z, Site s) { return logical_index(z, false, z.heads, z.d_v, s); };
  static const std::vector<Planter> p = {
      {"q_nan_row",
       [=](const ProblemSizes& z, std::int64_t n, std::int64_t lq, std::int64_t) {
         std::vector<P> out;
         for (std::int64_t c = 0; c < z.d_qk; ++c) out.push_back({"q", q_at(z, {n, lq / 2, z.heads - 1, c}), kNaN});
         return out;
       }},
      {"q_nan",
       [=](const ProblemSizes& z, std::int64_t n, std::int64_t lq, std::int64_t) {
         return std::vector<P>{{"q", q_at(z, {n, lq / 2, z.heads - 1, 3}), kNaN}};
       }},
      {"q_inf",
       [=](const ProblemSizes& z, std::int64_t n, std::int64_t lq, std::int64_t) {
         return std::vector<P>{{"q", q_at(z, {n, lq / 3, 0, 3}), kInf}};
       }},
      {"k_nan",
       [=](const ProblemSizes& z, std::int64_t n, std::int64_t, std::int64_t lkv) {
         return std::vector<P>{{"k", k_at(z, {n, lkv / 2, z.kv_heads - 1, 5}), kNaN}};
       }},
      {"k_minus_inf_row",
       [=](const ProblemSizes& z, std::int64_t n, std::int64_t, std::int64_t lkv) {
         std::vector<P> out;
         for (std::int64_t c = 0; c < z.d_qk; ++c) out.push_back({"k", k_at(z, {n, lkv / 2, 0, c}), -kInf});
         return out;
       }},
      {"v_nan",
       [=](const ProblemSizes& z, std::int64_t n, std::int64_t, std::int64_t lkv) {
         return std::vector<P>{{"v", v_at(z, {n, lkv / 2, 0, 7}), kNaN}};
       }},
      {"v_inf",
       [=](const ProblemSizes& z, std::int64_t n, std::int64_t, std::int64_t lkv) {
         return std::vector<P>{{"v", v_at(z, {n, lkv / 3, z.kv_heads - 1, 7}), kInf}};
       }},
      {"do_nan",
       [=](const ProblemSizes& z, std::int64_t n, std::int64_t lq, std::int64_t) {
         return std::vector<P>{{"do", do_at(z, {n, lq / 2, 0, 1}), kNaN}};
       }},
      {"do_minus_inf",
       [=](const ProblemSizes& z, std::int64_t n, std::int64_t lq, std::int64_t) {
         return std::vector<P>{{"do", do_at(z, {n, lq - 1, z.heads - 1, 1}), -kInf}};
       }},
      // Q row (+inf, 0, 0, ...) against keys whose column 0 is -1: every score of the row is
      // -inf, l = 0, and the definition gives NaN (not the "no key" answer).
      {"all_scores_minus_inf",
       [=](const ProblemSizes& z, std::int64_t n, std::int64_t lq, std::int64_t lkv) {
         const std::int64_t hq = z.heads - 1, hk = hq / (z.heads / z.kv_heads), row = lq / 2;
         std::vector<P> out{{"q", q_at(z, {n, row, hq, 0}), kInf}};
         for (std::int64_t c = 1; c < z.d_qk; ++c) out.push_back({"q", q_at(z, {n, row, hq, c}), 0.0});
         for (std::int64_t j = 0; j < lkv; ++j) out.push_back({"k", k_at(z, {n, j, hk, 0}), -1.0});
         return out;
       }},
  };
  return p;
}

CaseSpec planted_case(const Shape& sh, const Planter& pl, std::uint64_t seed) {
  CaseSpec c;
  c.dtype = sh.dtype;
  c.sizes = sh.sizes;
  c.layout_name = sh.layout;
  c.options.mask = sh.mask;
  c.options.window = sh.window;
  c.grad = true;
  c.seed = seed;
  // The last sequence with queries and keys.
  std::int64_t n = c.sizes.batch - 1, lq = c.sizes.s_q, lkv = c.sizes.s_kv;
  if (c.sizes.varlen())
    for (n = c.sizes.batch - 1; n > 0; --n)
      if (c.sizes.seqlens_q[std::size_t(n)] > 0 && c.sizes.seqlens_kv[std::size_t(n)] > 0) break;
  if (c.sizes.varlen()) lq = c.sizes.seqlens_q[std::size_t(n)], lkv = c.sizes.seqlens_kv[std::size_t(n)];
  c.input_plants = pl.make(c.sizes, n, lq, lkv);
  const Status s = harness::make_layout_views(c.layout_name, c.sizes, &c.views);
  EXPECT_TRUE(s.ok()) << s.message();
  return c;
}

class Planted : public ::testing::TestWithParam<std::tuple<int, int>> {};

// One planted case through cudnn against the reference under its non-finite policy.
void expect_planted_case_ok(int si, int pi) {
  const CaseSpec spec =
      planted_case(shapes()[std::size_t(si)], planters()[std::size_t(pi)], std::uint64_t(9100 + 16 * si + pi));
  harness::CaseReport report;
  const Status s = harness::run_case(spec, {Backend::cudnn}, &report);
  const std::string repro = harness::reproducer(spec, {Backend::cudnn});
  ASSERT_TRUE(s.ok()) << s.message() << "\n  " << repro;
  ASSERT_EQ(report.backends.size(), 1u);
  const auto& r = report.backends[0];
  EXPECT_EQ(r.status, "ok") << test_support::describe(report) << "  " << repro;
  EXPECT_TRUE(r.guard_ok) << repro;
  EXPECT_TRUE(r.written_ok) << repro;
  EXPECT_EQ(r.checks.size(), 5u) << repro;
}

TEST_P(Planted, FollowsTheReferenceUnderTheNonFinitePolicy) {
  SKIP_WITHOUT_GPU();
  const auto [si, pi] = GetParam();
  expect_planted_case_ok(si, pi);
}

// The same with every group's gradients recomputed exactly (what inputs past cuDNN's
// envelope get, nonfinite.hpp): the recompute and the NaN pass together give the definition's
// NaN and nothing more.
TEST_P(Planted, FollowsTheReferenceWhenEveryGroupIsRecomputed) {
  SKIP_WITHOUT_GPU();
  const auto [si, pi] = GetParam();
  constexpr float kInfF = std::numeric_limits<float>::infinity();
  const detail::cudnn::ScopedExactRecomputeLimits every_group({-kInfF, -kInfF, -kInfF});
  expect_planted_case_ok(si, pi);
}

INSTANTIATE_TEST_SUITE_P(CudnnNonFinite, Planted,
                         ::testing::Combine(::testing::Range(0, int(shapes().size())),
                                            ::testing::Range(0, int(planters().size()))),
                         [](const auto& info) {
                           return shapes()[std::size_t(std::get<0>(info.param))].name + "_" +
                                  planters()[std::size_t(std::get<1>(info.param))].name;
                         });

// ======================================================================= where the NaN may go

float to_float(DType t, std::uint16_t x) {
  return t == DType::bf16 ? detail::bf16_to_float(x) : detail::f16_to_float(x);
}
std::uint16_t from_float(DType t, float x) {
  return t == DType::bf16 ? detail::float_to_bf16(x) : detail::float_to_f16(x);
}

// Device memory, freed at scope exit: a copy of `host`, or `fill` bytes.
struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  DeviceBuffer(std::size_t n, const void* host, int fill = 0x46) : bytes(n) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<std::size_t>(n, 16)), cudaSuccess);
    if (host)
      EXPECT_EQ(cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice), cudaSuccess);
    else
      EXPECT_EQ(cudaMemset(ptr, fill, n), cudaSuccess);  // 0x46: finite poison in every dtype
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> out(bytes / sizeof(T));
    EXPECT_EQ(cudaMemcpy(out.data(), ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

// One problem in contiguous [B, T, heads, d] buffers (varlen: B = 1, T = tokens, with
// padding wherever the sequences leave tokens free).
struct Dev {
  DType dtype = DType::bf16;
  std::int64_t b = 1, s_q = 1, s_kv = 1, h = 1, hg = 1, d = 64;
  MaskKind mask = MaskKind::none;
  Window window{};
  Varlen varlen;                             // offsets given in full when enabled
  std::int64_t tokens_q = 0, tokens_kv = 0;  // varlen
  std::vector<std::uint16_t> q, k, v, d_o;

  [[nodiscard]] bool is_varlen() const { return varlen.enabled(); }
  [[nodiscard]] std::int64_t B() const { return is_varlen() ? 1 : b; }
  [[nodiscard]] std::int64_t Tq() const { return is_varlen() ? tokens_q : s_q; }
  [[nodiscard]] std::int64_t Tkv() const { return is_varlen() ? tokens_kv : s_kv; }
  [[nodiscard]] std::int64_t seqs() const { return is_varlen() ? std::int64_t(varlen.seqlens_q.size()) : b; }
  [[nodiscard]] std::int64_t group() const { return h / hg; }
  [[nodiscard]] kernel::MaskRule rule(std::int64_t n) const {
    kernel::MaskRule m;
    m.s_q = is_varlen() ? varlen.seqlens_q[std::size_t(n)] : s_q;
    m.s_kv = is_varlen() ? varlen.seqlens_kv[std::size_t(n)] : s_kv;
    m.kind = int(mask);
    m.left = window.left, m.right = window.right;
    return m;
  }
  // Buffer index of (sequence n, row or key pos, head, col) on the query or key side.
  [[nodiscard]] std::size_t at(bool kv_side, std::int64_t n, std::int64_t pos, std::int64_t head,
                               std::int64_t col) const {
    const std::int64_t heads = kv_side ? hg : h, T = kv_side ? Tkv() : Tq();
    const std::int64_t first = is_varlen() ? (kv_side ? varlen.offsets_kv : varlen.offsets_q)[std::size_t(n)] : 0;
    const std::int64_t bb = is_varlen() ? 0 : n;
    return std::size_t(((bb * T + first + pos) * heads + head) * d + col);
  }
  void fill(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto make = [&](std::vector<std::uint16_t>& x, std::int64_t T, std::int64_t heads) {
      x.resize(std::size_t(B() * T * heads * d));
      for (auto& e : x) e = from_float(dtype, normal(rng));
    };
    make(q, Tq(), h), make(k, Tkv(), hg), make(v, Tkv(), hg), make(d_o, Tq(), h);
  }
  void set(std::vector<std::uint16_t>& x, std::size_t i, double value) const { x[i] = from_float(dtype, float(value)); }
};

struct Outputs {
  std::vector<std::uint16_t> o, o_no_lse, dq, dk, dv;
  std::vector<float> lse;
};

struct Views {
  TensorView q, k, v, o, o2, d_o, dq, dk, dv;
  LseView lse;
};

Views views_on(const Dev& c, void* q, void* k, void* v, void* o, void* o2, float* lse, void* d_o, void* dq, void* dk,
               void* dv) {
  auto view = [&](void* p, std::int64_t T, std::int64_t heads) {
    return TensorView{p, c.dtype, {c.B(), T, heads, c.d}, {T * heads * c.d, heads * c.d, c.d, 1}};
  };
  Views w;
  w.q = view(q, c.Tq(), c.h), w.k = view(k, c.Tkv(), c.hg), w.v = view(v, c.Tkv(), c.hg);
  w.o = view(o, c.Tq(), c.h), w.o2 = view(o2, c.Tq(), c.h), w.d_o = view(d_o, c.Tq(), c.h);
  w.dq = view(dq, c.Tq(), c.h), w.dk = view(dk, c.Tkv(), c.hg), w.dv = view(dv, c.Tkv(), c.hg);
  w.lse = LseView{lse, {c.B(), c.h, c.Tq()}, {c.h * c.Tq(), c.Tq(), 1}};
  return w;
}

template <class Args>
void fill_common(const Dev& c, Backend backend, Args* a) {
  a->options.mask = c.mask;
  a->options.window = c.window;
  a->varlen = c.varlen;
  a->backend = backend;
  a->memory = backend == Backend::cudnn ? Memory::device : Memory::host;
}

// Runs a call with a workspace of the size workspace_size() reports, filled with garbage.
template <class Args, class Call>
void with_workspace(Args* a, Call call) {
  std::size_t bytes = 0;
  const Status ws = workspace_size(*a, &bytes);
  ASSERT_TRUE(ws.ok()) << ws.message();
  DeviceBuffer w(bytes, nullptr, 0xff);
  a->workspace = bytes ? w.ptr : nullptr;
  a->workspace_bytes = bytes;
  const Status s = call(*a);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// cudnn on the device: forward with LSE, forward without (into another O), backward of the
// first forward's O and LSE.
Outputs run_cudnn(const Dev& c) {
  const std::size_t qb = c.q.size() * 2, kb = c.k.size() * 2;
  DeviceBuffer q(qb, c.q.data()), k(kb, c.k.data()), v(kb, c.v.data()), d_o(qb, c.d_o.data());
  DeviceBuffer o(qb, nullptr), o2(qb, nullptr), dq(qb, nullptr), dk(kb, nullptr), dv(kb, nullptr);
  DeviceBuffer lse(std::size_t(c.B() * c.h * c.Tq()) * 4, nullptr);
  const Views w =
      views_on(c, q.ptr, k.ptr, v.ptr, o.ptr, o2.ptr, static_cast<float*>(lse.ptr), d_o.ptr, dq.ptr, dk.ptr, dv.ptr);
  Outputs r;
  ForwardArgs f;
  f.q = w.q, f.k = w.k, f.v = w.v, f.o = w.o, f.lse = w.lse;
  fill_common(c, Backend::cudnn, &f);
  with_workspace(&f, [](const ForwardArgs& a) { return forward(a); });
  ForwardArgs f2 = f;
  f2.o = w.o2, f2.lse = LseView{};
  with_workspace(&f2, [](const ForwardArgs& a) { return forward(a); });
  BackwardArgs bw;
  bw.q = w.q, bw.k = w.k, bw.v = w.v, bw.o = w.o, bw.d_o = w.d_o, bw.lse = w.lse;
  bw.dq = w.dq, bw.dk = w.dk, bw.dv = w.dv;
  fill_common(c, Backend::cudnn, &bw);
  with_workspace(&bw, [](const BackwardArgs& a) { return backward(a); });
  r.o = o.download<std::uint16_t>(), r.o_no_lse = o2.download<std::uint16_t>();
  r.lse = lse.download<float>();
  r.dq = dq.download<std::uint16_t>(), r.dk = dk.download<std::uint16_t>(), r.dv = dv.download<std::uint16_t>();
  return r;
}

// The reference on host copies: forward, and the backward of the given O and LSE (cudnn's,
// so both backwards see the same inputs).
Outputs run_reference(const Dev& c, const Outputs& given) {
  Dev in = c;
  Outputs r;
  r.o.assign(c.q.size(), 0), r.lse.assign(std::size_t(c.B() * c.h * c.Tq()), 0.f);
  r.dq.assign(c.q.size(), 0), r.dk.assign(c.k.size(), 0), r.dv.assign(c.k.size(), 0);
  std::vector<std::uint16_t> o = given.o;
  std::vector<float> lse = given.lse;
  const Views w = views_on(c, in.q.data(), in.k.data(), in.v.data(), r.o.data(), nullptr, r.lse.data(), in.d_o.data(),
                           r.dq.data(), r.dk.data(), r.dv.data());
  ForwardArgs f;
  f.q = w.q, f.k = w.k, f.v = w.v, f.o = w.o, f.lse = w.lse;
  fill_common(c, Backend::reference, &f);
  const Status fs = forward(f);
  EXPECT_TRUE(fs.ok()) << fs.message();
  BackwardArgs bw;
  bw.q = w.q, bw.k = w.k, bw.v = w.v, bw.d_o = w.d_o;
  bw.o = w.o, bw.o.data = o.data();
  bw.lse = w.lse, bw.lse.data = lse.data();
  bw.dq = w.dq, bw.dk = w.dk, bw.dv = w.dv;
  fill_common(c, Backend::reference, &bw);
  const Status bs = backward(bw);
  EXPECT_TRUE(bs.ok()) << bs.message();
  return r;
}

enum class Out { o, lse, dq, dk, dv };
const char* name_of(Out t) {
  const char* names[] = {"O", "LSE", "dQ", "dK", "dV"};
  return names[int(t)];
}

// A non-finite value planted at a site of a sequence; only these may make outputs
// non-finite (plants in padding, or in rows and keys nothing pairs them with, must not).
struct Plant {
  char tensor;  // 'q', 'k', 'v', 'g' (dO)
  Site at;
};

// Whether output `t` at (sequence n, row or key pos, head, col) may be non-finite where the
// reference is finite: docs/semantics.md lets a plant reach more than the definition within
// its sequence and KV-head group (the tiles it shares), and nothing else.
bool may_be_non_finite(const Dev& c, const std::vector<Plant>& plants, Out t, std::int64_t n, std::int64_t pos,
                       std::int64_t head, std::int64_t col) {
  const bool row_side = t == Out::o || t == Out::lse || t == Out::dq;
  const std::int64_t group = row_side ? head / c.group() : head;
  for (const Plant& p : plants) {
    const bool q_side = p.tensor == 'q' || p.tensor == 'g';
    if (p.at.seq != n || (q_side ? p.at.head / c.group() : p.at.head) != group) continue;
    // A planted Q or dO row may reach dK / dV of any key of its group: cuDNN's own windowed
    // backward (9.19) spreads a NaN in one dO row to keys hundreds of positions outside the
    // row's window, through masked tiles it still multiplies (P = 0 times NaN).
    switch (p.tensor) {
      case 'q':
        if (!row_side || (pos == p.at.pos && head == p.at.head)) return true;
        break;
      case 'g':  // dO: no forward output reads it
        if (t == Out::dq ? (pos == p.at.pos && head == p.at.head) : !row_side) return true;
        break;
      case 'k':
        return true;
      case 'v':  // V reaches O's column and, through D, dQ and dK; never LSE or dV
        if ((t == Out::o && col == p.at.col) || t == Out::dq || t == Out::dk) return true;
        break;
    }
  }
  return false;
}

// Compares every element of cudnn's outputs with the reference's: NaN where it is NaN,
// non-finite where it is inf (LSE -inf, the "no key" answer, exactly), finite and within a
// loose bound where it is finite unless may_be_non_finite, and padding tokens exactly 0 (LSE
// -inf). `want_nan`: outputs whose reference must hold NaN (the plant is seen).
void expect_reach(const Dev& c, const std::vector<Plant>& plants, const std::vector<Out>& want_nan) {
  const Outputs got = run_cudnn(c);
  const Outputs ref = run_reference(c, got);
  // token -> (sequence, position) for each side; -1: padding.
  auto owners = [&](bool kv_side) {
    std::vector<std::pair<std::int64_t, std::int64_t>> own(std::size_t(c.B() * (kv_side ? c.Tkv() : c.Tq())), {-1, -1});
    for (std::int64_t n = 0; n < c.seqs(); ++n) {
      const kernel::MaskRule m = c.rule(n);
      for (std::int64_t i = 0; i < (kv_side ? m.s_kv : m.s_q); ++i)
        own[c.at(kv_side, n, i, 0, 0) / std::size_t((kv_side ? c.hg : c.h) * c.d)] = {n, i};
    }
    return own;
  };
  const auto own_q = owners(false), own_kv = owners(true);
  int failures = 0;
  auto check = [&](Out t, const char* label, auto&& get, auto&& want, std::size_t count, std::int64_t heads,
                   std::int64_t cols, bool kv_side, bool lse_layout) {
    double largest = 1;
    for (std::size_t i = 0; i < count; ++i)
      if (std::isfinite(want(i))) largest = std::max(largest, std::fabs(want(i)));
    const double tol = (t == Out::lse ? 1e-3 : 3e-2) * largest;
    std::int64_t nans = 0;
    for (std::size_t i = 0; i < count; ++i) {
      std::int64_t token, head, col = 0;
      if (lse_layout) {  // [B, h, T]
        token = std::int64_t(i) % c.Tq() + std::int64_t(i) / (c.h * c.Tq()) * c.Tq();
        head = std::int64_t(i) / c.Tq() % c.h;
      } else {  // [B, T, heads, cols]
        col = std::int64_t(i) % cols;
        head = std::int64_t(i) / cols % heads;
        token = std::int64_t(i) / (cols * heads);
      }
      const auto [n, pos] = (kv_side ? own_kv : own_q)[std::size_t(token)];
      const double g = get(i), w = want(i);
      nans += std::isnan(w);
      bool ok;
      if (n < 0) {
        ok = g == w;  // padding: 0, or -inf in LSE
      } else if (std::isnan(w)) {
        ok = std::isnan(g);
      } else if (std::isinf(w)) {
        ok = t == Out::lse && w < 0 ? g == w : !std::isfinite(g);
      } else if (std::isfinite(g)) {
        ok = std::fabs(g - w) <= tol;
      } else {
        ok = may_be_non_finite(c, plants, t, n, pos, head, col);
      }
      if (!ok && ++failures <= 12)
        ADD_FAILURE() << label << ": sequence " << n << " position " << pos << " head " << head << " col " << col
                      << " (token " << token << "): cudnn " << g << ", reference " << w << " (bound " << tol << ")";
    }
    if (std::find(want_nan.begin(), want_nan.end(), t) != want_nan.end())
      EXPECT_GT(nans, 0) << label << ": the reference has no NaN, so the plant proves nothing";
  };
  auto half = [&](const std::vector<std::uint16_t>& x) {
    return [&](std::size_t i) { return double(to_float(c.dtype, x[i])); };
  };
  auto flt = [](const std::vector<float>& x) { return [&](std::size_t i) { return double(x[i]); }; };
  check(Out::o, "O", half(got.o), half(ref.o), got.o.size(), c.h, c.d, false, false);
  check(Out::o, "O (forward without LSE)", half(got.o_no_lse), half(ref.o), got.o.size(), c.h, c.d, false, false);
  check(Out::lse, "LSE", flt(got.lse), flt(ref.lse), got.lse.size(), c.h, 1, false, true);
  check(Out::dq, "dQ", half(got.dq), half(ref.dq), got.dq.size(), c.h, c.d, false, false);
  check(Out::dk, "dK", half(got.dk), half(ref.dk), got.dk.size(), c.hg, c.d, true, false);
  check(Out::dv, "dV", half(got.dv), half(ref.dv), got.dv.size(), c.hg, c.d, true, false);
}

// Sets a whole row (every column) of a q-side or kv-side buffer.
void set_row(const Dev& c, std::vector<std::uint16_t>& x, bool kv_side, std::int64_t n, std::int64_t pos,
             std::int64_t head, double value) {
  for (std::int64_t col = 0; col < c.d; ++col) c.set(x, c.at(kv_side, n, pos, head, col), value);
}

Dev dense_dev(DType t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t hg, MaskKind mask,
              Window window = {}) {
  Dev c;
  c.dtype = t, c.b = b, c.s_q = c.s_kv = s, c.h = h, c.hg = hg, c.d = 64, c.mask = mask, c.window = window;
  c.fill(std::uint64_t(s * 31 + h * 7 + int(mask) + window.left + 3));
  return c;
}

// A NaN query row and a NaN in dO, in different sequences and KV groups: each reaches its
// own row of O / LSE / dQ and (at least) the keys that row sees, nothing outside its group.
TEST(CudnnNonFiniteReach, QueryAndGradientRowsStayInTheirRowAndKeys) {
  SKIP_WITHOUT_GPU();
  struct Config {
    const char* name;
    Dev c;
  };
  const Config configs[] = {
      {"causal gqa bf16", dense_dev(DType::bf16, 2, 600, 4, 2, MaskKind::causal)},
      {"window f16", dense_dev(DType::f16, 2, 600, 4, 2, MaskKind::none, {64, 32})},
  };
  for (Config cfg : configs) {
    SCOPED_TRACE(cfg.name);
    Dev& c = cfg.c;
    const std::vector<Plant> plants = {{'q', {1, 100, 3, 0}}, {'g', {0, 200, 0, 5}}};
    set_row(c, c.q, false, 1, 100, 3, kNaN);
    c.set(c.d_o, c.at(false, 0, 200, 0, 5), kNaN);
    expect_reach(c, plants, {Out::o, Out::lse, Out::dq, Out::dk, Out::dv});
  }
}

// A NaN in K reaches every row that sees the key; a NaN in V[j, c] reaches O[:, c] of the
// rows that see j and, through D, their dQ and dK, but never LSE or dV.
TEST(CudnnNonFiniteReach, KeyAndValuePlantsReachTheRowsThatSeeThem) {
  SKIP_WITHOUT_GPU();
  Dev c = dense_dev(DType::bf16, 2, 400, 4, 2, MaskKind::none, {30, 10});
  const std::vector<Plant> plants = {{'k', {0, 100, 0, 2}}, {'v', {1, 50, 1, 7}}};
  c.set(c.k, c.at(true, 0, 100, 0, 2), kNaN);
  c.set(c.v, c.at(true, 1, 50, 1, 7), kNaN);
  expect_reach(c, plants, {Out::o, Out::lse, Out::dq, Out::dk, Out::dv});
}

// Every score of a row -inf (Q row (+inf, 0, ...), column 0 of every key -1): l = 0 gives
// NaN in O and LSE, never the "no key" answer cuDNN gives such a row.
TEST(CudnnNonFiniteReach, AllScoresMinusInfGiveNaNNotTheNoKeyAnswer) {
  SKIP_WITHOUT_GPU();
  Dev c = dense_dev(DType::bf16, 1, 200, 2, 1, MaskKind::causal);
  for (std::int64_t col = 1; col < c.d; ++col) c.set(c.q, c.at(false, 0, 120, 1, col), 0.0);
  c.set(c.q, c.at(false, 0, 120, 1, 0), kInf);
  for (std::int64_t j = 0; j < c.s_kv; ++j) c.set(c.k, c.at(true, 0, j, 0, 0), -1.0);
  expect_reach(c, {{'q', {0, 120, 1, 0}}}, {Out::o, Out::lse, Out::dq, Out::dk, Out::dv});
}

// Varlen with padding before, between and after the sequences, a sequence without queries
// and one without keys. Planted: a NaN query row, a NaN key and a NaN in dO, each in its own
// sequence; NaN in padding tokens of Q, K, V and dO, in the queries of the sequence that has
// no keys (its rows see none: O = 0, LSE = -inf) and in the keys of the sequence that has no
// queries (no row sees them: dK = dV = 0). Only the first three may reach anything.
TEST(CudnnNonFiniteReach, VarlenPaddingAndEmptySequencesStayClean) {
  SKIP_WITHOUT_GPU();
  Dev c;
  c.dtype = DType::bf16, c.h = 4, c.hg = 2, c.d = 64, c.mask = MaskKind::causal_bottom_right;
  c.varlen.seqlens_q = {24, 0, 40, 9, 30};
  c.varlen.seqlens_kv = {30, 12, 40, 0, 64};
  c.varlen.offsets_q = {2, 30, 30, 75, 90};    // gaps 0-1, 26-29, 70-74, 84-89, tail 120-127
  c.varlen.offsets_kv = {0, 34, 50, 95, 100};  // gaps 30-33, 46-49, 90-99, tail 164-169
  c.tokens_q = 128, c.tokens_kv = 170;
  c.b = 5;
  c.fill(77);
  const std::vector<Plant> plants = {{'q', {2, 20, 1, 0}}, {'k', {4, 10, 1, 3}}, {'g', {0, 5, 2, 0}}};
  set_row(c, c.q, false, 2, 20, 1, kNaN);
  c.set(c.k, c.at(true, 4, 10, 1, 3), kNaN);
  c.set(c.d_o, c.at(false, 0, 5, 2, 0), kNaN);
  auto token = [&](std::vector<std::uint16_t>& x, std::int64_t heads, std::int64_t t) {
    for (std::int64_t hh = 0; hh < heads; ++hh)
      x[std::size_t((t * heads + hh) * c.d + 1)] = from_float(c.dtype, float(kNaN));
  };
  token(c.q, c.h, 28), token(c.k, c.hg, 31), token(c.v, c.hg, 168), token(c.d_o, c.h, 125);
  set_row(c, c.q, false, 3, 2, 0, kNaN);  // sequence 3 has no keys
  set_row(c, c.k, true, 1, 2, 0, kNaN);   // sequence 1 has no queries
  set_row(c, c.v, true, 1, 6, 1, kNaN);
  expect_reach(c, plants, {Out::o, Out::lse, Out::dq, Out::dk, Out::dv});
}

}  // namespace
}  // namespace strideattn
