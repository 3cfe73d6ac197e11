// The `cuda` backward over very long ranges (docs/semantics.md, "Long sequences"): dK and dV
// summed over millions of queries, dQ over millions of keys, must stay at the output's
// rounding, where one fp32 register sum over the whole range drifts by several fp16 ulps.
// Stride-0 views repeat one row millions of times in a few bytes, and the inputs are chosen
// so that every term is exact in fp16 and the exact sum fits it: O = 0, so delta = 0; every
// LSE = s + 10 ln 2, so every P = 2^-10; V = e_0, so dP = dO's column 0, which is +-[1, 2),
// and dS = P dP is a normal fp16 number (a P of 1/n would make dS subnormal, and its rounding
// would hide the sum's). Then:
//   long queries (n rows of one q, one dO row g; 128 keys of one k, v):
//     dV_j = n 2^-10 g and dK_j = scale n 2^-10 g_0 q for every key j;
//   long keys (n keys of one k, v; 64 distinct queries q_i, dO rows g_i):
//     dQ_i = scale n 2^-10 g_i0 k.
// Every kernel pairing runs (the plan's own choice, deterministic two-pass, the sm80 kernels),
// then the same with the fold turned off through the test hook: that error must be larger
// than the bound, or the test could not tell a fold from none. And the folds themselves,
// forced every few blocks on small problems, against the fp64 reference. Skips when no GPU
// is present.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/test_hook.hpp"
#include "common/dtype.hpp"
#include "harness/runner.hpp"
#include "strideattn/strideattn.hpp"
#include "support/backend_case.hpp"

namespace {

using strideattn::Backend;
using strideattn::DType;
using strideattn::MaskKind;
using strideattn::Memory;
using strideattn::TensorView;
using strideattn::cuda_impl::Arch;
using strideattn::cuda_impl::PlanForcing;
using strideattn::cuda_impl::ScopedCudaPlanForcing;
using strideattn::harness::CaseSpec;

#define SKIP_WITHOUT_GPU()                    \
  if (!strideattn::harness::gpu_available())  \
  GTEST_SKIP() << "no CUDA GPU present: the " \
                  "cuda long-range backward tests need one"

constexpr std::int64_t kRows = std::int64_t(1) << 22;  // the long range
constexpr double kLogP = -10 * 0.69314718055994531;    // ln 2^-10
// |got - exact| <= kRel |exact| + kAbs: an fp16 output rounds by at most 2^-11 relative, and a
// folded sum (at most 4,096 k-steps in a register chain, about 2^-23 drift each when every
// term is alike) adds at most 5e-4; an unfolded one over 2^22 rows adds 2^18 k-steps in a row
// and drifts far past the bound.
constexpr double kRel = 1.5e-3, kAbs = 1e-6;

struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t n, const void* host = nullptr) : bytes(n) {
    EXPECT_EQ(cudaMalloc(&ptr, n), cudaSuccess);
    if (host)
      EXPECT_EQ(cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice), cudaSuccess);
    else
      EXPECT_EQ(cudaMemset(ptr, 0xff, n), cudaSuccess);  // NaN poison
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  template <class T>
  std::vector<T> read(std::size_t count) const {
    std::vector<T> out(count);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

std::vector<std::uint16_t> normal_rows(std::int64_t rows, std::int64_t d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<std::uint16_t> x(std::size_t(rows * d));
  for (auto& e : x) e = strideattn::detail::float_to_f16(normal(rng));
  return x;
}
// V = e_0; dO's column 0 of row i = +-(1 + (i % 64) / 64), exact in fp16.
std::vector<std::uint16_t> unit_row(std::int64_t d) {
  std::vector<std::uint16_t> x(std::size_t(d), 0);
  x[0] = strideattn::detail::float_to_f16(1.f);
  return x;
}
void set_column0(std::vector<std::uint16_t>& g, std::int64_t rows, std::int64_t d) {
  for (std::int64_t i = 0; i < rows; ++i)
    g[std::size_t(i * d)] = strideattn::detail::float_to_f16(float((i % 2 ? -1 : 1) * (1 + double(i % 64) / 64)));
}
double f(std::uint16_t x) { return strideattn::detail::f16_to_float(x); }
double dot(const std::uint16_t* a, const std::uint16_t* b, std::int64_t d) {
  double s = 0;
  for (std::int64_t c = 0; c < d; ++c) s += f(a[c]) * f(b[c]);
  return s;
}

// [1, rows, 1, d] f16 over `buf`: one row repeated (stride 0) or dense.
TensorView rows_view(void* buf, std::int64_t rows, std::int64_t d, bool repeat) {
  return {buf, DType::f16, {1, rows, 1, d}, {repeat ? 0 : rows * d, repeat ? 0 : d, d, 1}};
}

// The largest |got - want| / (kRel |want| + kAbs) over the elements.
double worst(const std::vector<std::uint16_t>& got, const std::vector<double>& want) {
  double w = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double e = std::fabs(f(got[i]) - want[i]) / (kRel * std::fabs(want[i]) + kAbs);
    w = std::max(w, std::isnan(e) ? INFINITY : e);
  }
  return w;
}

struct Pairing {
  const char* name;
  PlanForcing forcing;
  bool deterministic = false;
};
const Pairing kPairings[] = {{"plan", {}},
                             {"deterministic", {}, true},
                             {"sm80", {.arch = Arch::sm80}},
                             {"sm80 deterministic", {.arch = Arch::sm80}, true}};

// The cuda backward on the device for one case: Q and dO of s_q rows and K and V of s_kv
// rows (each pair one repeated row where `repeat_q` / `repeat_kv`), O one zero row (delta = 0),
// the given LSE; the gradients of the side that is not repeated are read back.
struct Grads {
  std::vector<std::uint16_t> dq, dk, dv;
};
struct Inputs {
  std::int64_t d = 0, s_q = 0, s_kv = 0;
  bool repeat_q = false, repeat_kv = false;
  std::vector<std::uint16_t> q, g, k, v;
  std::vector<float> lse;
};
Grads run_backward(const Inputs& in, const PlanForcing& forcing, bool deterministic) {
  const std::int64_t d = in.d;
  const std::vector<std::uint16_t> zero(std::size_t(d), 0);
  DeviceBuffer q(in.q.size() * 2, in.q.data()), g(in.g.size() * 2, in.g.data()), k(in.k.size() * 2, in.k.data()),
      v(in.v.size() * 2, in.v.data()), o(zero.size() * 2, zero.data()), lse(in.lse.size() * 4, in.lse.data());
  DeviceBuffer dq(std::size_t(in.s_q * d) * 2), dk(std::size_t(in.s_kv * d) * 2), dv(std::size_t(in.s_kv * d) * 2);
  strideattn::BackwardArgs a;
  a.q = rows_view(q.ptr, in.s_q, d, in.repeat_q), a.d_o = rows_view(g.ptr, in.s_q, d, in.repeat_q);
  a.o = rows_view(o.ptr, in.s_q, d, true);
  a.k = rows_view(k.ptr, in.s_kv, d, in.repeat_kv), a.v = rows_view(v.ptr, in.s_kv, d, in.repeat_kv);
  a.lse = {static_cast<float*>(lse.ptr), {1, 1, in.s_q}, {in.s_q, in.s_q, 1}};
  a.dq = rows_view(dq.ptr, in.s_q, d, false);
  a.dk = rows_view(dk.ptr, in.s_kv, d, false), a.dv = rows_view(dv.ptr, in.s_kv, d, false);
  a.options.deterministic = deterministic;
  a.backend = Backend::cuda, a.memory = Memory::device;
  const ScopedCudaPlanForcing forced(forcing);
  const strideattn::Status st = strideattn::backward(a);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Grads out;
  if (!in.repeat_q) out.dq = dq.read<std::uint16_t>(std::size_t(in.s_q * d));
  if (!in.repeat_kv) {
    out.dk = dk.read<std::uint16_t>(std::size_t(in.s_kv * d));
    out.dv = dv.read<std::uint16_t>(std::size_t(in.s_kv * d));
  }
  return out;
}

// dK and dV over kRows queries: the worst error in units of the bound, for `forcing`.
double long_queries(std::int64_t d, const PlanForcing& forcing, bool deterministic) {
  Inputs in;
  in.d = d, in.s_q = kRows, in.s_kv = 128, in.repeat_q = true;
  in.q = normal_rows(1, d, 11 + d), in.g = normal_rows(1, d, 12 + d);
  set_column0(in.g, 1, d);
  // K and V dense (dK, dV are read back) but every row the same, so every P is 2^-10
  const auto k_row = normal_rows(1, d, 13 + d), v_row = unit_row(d);
  for (std::int64_t j = 0; j < in.s_kv; ++j) {
    in.k.insert(in.k.end(), k_row.begin(), k_row.end());
    in.v.insert(in.v.end(), v_row.begin(), v_row.end());
  }
  const double scale = 1.0 / std::sqrt(double(d));
  const double s = scale * dot(in.q.data(), in.k.data(), d);
  in.lse.assign(std::size_t(in.s_q), float(s - kLogP));
  const Grads got = run_backward(in, forcing, deterministic);
  std::vector<double> want_k, want_v;
  const double mass = double(in.s_q) * std::exp(kLogP);  // n 2^-10
  for (std::int64_t j = 0; j < in.s_kv; ++j)
    for (std::int64_t c = 0; c < d; ++c) {
      want_k.push_back(scale * mass * f(in.g[0]) * f(in.q[std::size_t(c)]));
      want_v.push_back(mass * f(in.g[std::size_t(c)]));
    }
  return std::max(worst(got.dk, want_k), worst(got.dv, want_v));
}

// dQ over kRows keys, 64 distinct queries: the worst error in units of the bound.
double long_keys(std::int64_t d, const PlanForcing& forcing, bool deterministic) {
  Inputs in;
  in.d = d, in.s_q = 64, in.s_kv = kRows, in.repeat_kv = true;
  in.q = normal_rows(in.s_q, d, 21 + d), in.k = normal_rows(1, d, 23 + d), in.v = unit_row(d);
  in.g = normal_rows(in.s_q, d, 22 + d);
  set_column0(in.g, in.s_q, d);
  const double scale = 1.0 / std::sqrt(double(d));
  for (std::int64_t i = 0; i < in.s_q; ++i)
    in.lse.push_back(float(scale * dot(&in.q[std::size_t(i * d)], in.k.data(), d) - kLogP));
  const Grads got = run_backward(in, forcing, deterministic);
  std::vector<double> want;
  const double mass = double(in.s_kv) * std::exp(kLogP);  // n 2^-10
  for (std::int64_t i = 0; i < in.s_q; ++i)
    for (std::int64_t c = 0; c < d; ++c)
      want.push_back(scale * mass * f(in.g[std::size_t(i * d)]) * f(in.k[std::size_t(c)]));
  return worst(got.dq, want);
}

void expect_folds_hold(double (*run)(std::int64_t, const PlanForcing&, bool), const char* what) {
  for (std::int64_t d : {64, 128, 256})
    for (const Pairing& pairing : kPairings) {
      SCOPED_TRACE(::testing::Message() << what << ", d " << d << ", " << pairing.name);
      const double folded = run(d, pairing.forcing, pairing.deterministic);
      PlanForcing off = pairing.forcing;
      off.fold_blocks = -1;
      const double unfolded = run(d, off, pairing.deterministic);
      std::printf("%s d %lld %s: worst error %.3g of the bound folded, %.3g without the fold\n", what,
                  static_cast<long long>(d), pairing.name, folded, unfolded);
      EXPECT_LE(folded, 1.0);
      EXPECT_GT(unfolded, 1.0) << "without the fold the error should exceed the bound: the test cannot tell";
    }
}

// (below the 8-warp dK/dV pass's shared memory: the 4-warp pass runs, as on an sm_86)
constexpr int kSmemBelowEightWarpPass = 160 * 1024;
constexpr strideattn::test_support::DenseCaseBuilder dense{.seed_offset = 29};
constexpr strideattn::test_support::VarlenCaseBuilder varlen{
    .seed_base = 5151, .head_dim = 64, .head_dim_in_seed = true};
void expect_cuda_ok(const CaseSpec& spec) { strideattn::test_support::expect_backend_ok(Backend::cuda, spec); }

// The backward's folds (kernel_params.hpp) run only past kFoldRows rows; the test
// hook makes them fold every 1 or 3 blocks on small problems, so every kernel that folds
// (wgmma and sm80 dK/dV passes, the dQ pass) does it many times on GQA with group splits,
// causal masks, varlen with gaps and split views of a fused buffer, against the reference.
TEST(CudaLongBackward, FoldsEveryFewBlocksOnSmallProblems) {
  SKIP_WITHOUT_GPU();
  const CaseSpec gqa = dense(DType::bf16, 2, 300, 300, 8, 2, 64, 64, MaskKind::causal, -1, -1, true, "sb(h+2hg)d");
  const CaseSpec mqa = dense(DType::f16, 1, 330, 200, 6, 1, 128, 128, MaskKind::none, -1, -1, true);
  const CaseSpec big = dense(DType::bf16, 1, 200, 260, 4, 4, 256, 256, MaskKind::causal_bottom_right, -1, -1, true);
  for (int fold : {1, 3})
    for (const PlanForcing& base :
         {PlanForcing{}, PlanForcing{.single_pass = false}, PlanForcing{.arch = Arch::sm80},
          PlanForcing{.arch = Arch::sm80, .smem_optin = kSmemBelowEightWarpPass}, PlanForcing{.group_splits = 3}}) {
      PlanForcing forcing = base;
      forcing.fold_blocks = fold;
      SCOPED_TRACE(::testing::Message() << "fold every " << fold << ", arch " << (base.arch ? "sm80" : "plan")
                                        << ", smem " << base.smem_optin << ", splits " << base.group_splits);
      const ScopedCudaPlanForcing forced(forcing);
      expect_cuda_ok(gqa);
      expect_cuda_ok(mqa);
      expect_cuda_ok(big);
      expect_cuda_ok(varlen(DType::bf16, {30, 0, 170}, {90, 40, 0}, {}, {}, MaskKind::causal_bottom_right));
    }
}

TEST(CudaLongBackward, DkDvOverMillionsOfQueriesFold) {
  SKIP_WITHOUT_GPU();
  expect_folds_hold(long_queries, "dK/dV over 2^22 queries");
}

TEST(CudaLongBackward, DqOverMillionsOfKeysFolds) {
  SKIP_WITHOUT_GPU();
  expect_folds_hold(long_keys, "dQ over 2^22 keys");
}

}  // namespace
