// The `cuda` forward at the numerical edges (docs/semantics.md, "Non-finite values, overflow
// and the scale"), on device buffers through the public API, against the `reference` backend
// run on host copies of the same inputs:
//   - logits of 1e4 to 1e6 (inputs scaled up) and scale = 1e30: every row's answer is one-hot,
//     and the output must equal the reference bit for bit (no NaN, no rounding of P = 1);
//   - planted NaN / -inf: the output is NaN exactly where the reference's is;
//   - K and V one row repeated over 2^22 - 2^23 keys (stride-0 views): O must equal that V row
//     exactly, which a single fp32 accumulator over the whole row misses by up to 9%.
// Skips when no GPU is present.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "harness/runner.hpp"
#include "strideattn/strideattn.hpp"

namespace {

using strideattn::Backend;
using strideattn::DType;
using strideattn::MaskKind;
using strideattn::Memory;
using strideattn::TensorView;

#define SKIP_WITHOUT_GPU()                    \
  if (!strideattn::harness::gpu_available())  \
  GTEST_SKIP() << "no CUDA GPU present: the " \
                  "cuda edge tests need one"

float to_float(DType t, std::uint16_t x) {
  return t == DType::bf16 ? strideattn::detail::bf16_to_float(x) : strideattn::detail::f16_to_float(x);
}
std::uint16_t from_float(DType t, float x) {
  return t == DType::bf16 ? strideattn::detail::float_to_bf16(x) : strideattn::detail::float_to_f16(x);
}

// A device copy of a host buffer, freed at scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes, const void* host = nullptr) {
    EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
    if (host)
      EXPECT_EQ(cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    else
      EXPECT_EQ(cudaMemset(ptr, 0xff, bytes), cudaSuccess);  // NaN poison
  }
  ~DeviceBuffer() { cudaFree(ptr); }
};

// Q [1, s_q, h, d], K and V [1, s_kv, hg, d] with given element strides (dense when the
// seq stride is h * d; 0 repeats one row), O dense.
struct Case {
  DType dtype = DType::bf16;
  std::int64_t s_q = 128, s_kv = 128, h = 2, hg = 1, d = 128;
  std::int64_t kv_seq_stride = -1;  // -1: dense
  MaskKind mask = MaskKind::none;
  double scale = 0;  // 0: default
  std::vector<std::uint16_t> q, k, v;
};

struct Result {
  std::vector<std::uint16_t> o;
  std::vector<float> lse;
};

Result run(Backend backend, const Case& c) {
  const std::int64_t kv_rows = c.kv_seq_stride == 0 ? 1 : c.s_kv;
  const std::int64_t kv_s = c.kv_seq_stride < 0 ? c.hg * c.d : c.kv_seq_stride;
  const std::size_t o_elems = std::size_t(c.s_q * c.h * c.d);
  Result r{std::vector<std::uint16_t>(o_elems), std::vector<float>(std::size_t(c.h * c.s_q))};
  auto views = [&](void* q, void* k, void* v, void* o, float* lse) {
    strideattn::ForwardArgs a;
    a.q = TensorView{q, c.dtype, {1, c.s_q, c.h, c.d}, {c.s_q * c.h * c.d, c.h * c.d, c.d, 1}};
    a.k = TensorView{k, c.dtype, {1, c.s_kv, c.hg, c.d}, {kv_rows * c.hg * c.d, kv_s, c.d, 1}};
    a.v = TensorView{v, c.dtype, {1, c.s_kv, c.hg, c.d}, {kv_rows * c.hg * c.d, kv_s, c.d, 1}};
    a.o = TensorView{o, c.dtype, {1, c.s_q, c.h, c.d}, {c.s_q * c.h * c.d, c.h * c.d, c.d, 1}};
    a.lse = strideattn::LseView{lse, {1, c.h, c.s_q}, {c.h * c.s_q, c.s_q, 1}};
    a.options.mask = c.mask;
    if (c.scale > 0) a.options.scale = c.scale;
    a.backend = backend;
    return a;
  };
  if (backend == Backend::reference) {
    strideattn::ForwardArgs a = views(const_cast<std::uint16_t*>(c.q.data()), const_cast<std::uint16_t*>(c.k.data()),
                                      const_cast<std::uint16_t*>(c.v.data()), r.o.data(), r.lse.data());
    const strideattn::Status st = strideattn::forward(a);
    EXPECT_TRUE(st.ok()) << st.message();
    return r;
  }
  DeviceBuffer q(c.q.size() * 2, c.q.data()), k(c.k.size() * 2, c.k.data()), v(c.v.size() * 2, c.v.data());
  DeviceBuffer o(o_elems * 2), lse(r.lse.size() * 4);
  strideattn::ForwardArgs a = views(q.ptr, k.ptr, v.ptr, o.ptr, static_cast<float*>(lse.ptr));
  a.memory = Memory::device;
  const strideattn::Status st = strideattn::forward(a);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(r.o.data(), o.ptr, o_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(r.lse.data(), lse.ptr, r.lse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return r;
}

// Fills q, k (times `qk_factor`) and v with standard-normal values rounded to the dtype.
void fill(Case& c, float qk_factor, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const std::int64_t kv_rows = c.kv_seq_stride == 0 ? 1 : c.s_kv;
  c.q.resize(std::size_t(c.s_q * c.h * c.d));
  c.k.resize(std::size_t(kv_rows * c.hg * c.d));
  c.v.resize(c.k.size());
  for (auto& x : c.q) x = from_float(c.dtype, normal(rng) * qk_factor);
  for (auto& x : c.k) x = from_float(c.dtype, normal(rng) * qk_factor);
  for (auto& x : c.v) x = from_float(c.dtype, normal(rng));
}

// O against the reference: every element the reference gives as non-finite is non-finite
// (NaN where it is NaN); every finite one is within `o_tol` (0: the same bits) unless
// `leaks_allowed`, where a non-finite input a row does not see may still reach it through a
// tile it shares (docs/semantics.md). LSE: the same rule, within fp32 rounding of its terms.
void expect_same(const Case& c, const Result& got, const Result& want, double o_tol = 0, bool leaks_allowed = false) {
  std::int64_t o_bad = 0, lse_bad = 0, first = -1;
  auto agrees = [&](double g, double w, double tol) {
    if (std::isnan(w)) return std::isnan(g);
    if (std::isinf(w)) return !std::isfinite(g);
    if (!std::isfinite(g)) return leaks_allowed;
    return std::fabs(g - w) <= tol;
  };
  for (std::size_t i = 0; i < want.o.size(); ++i)
    if (!agrees(to_float(c.dtype, got.o[i]), to_float(c.dtype, want.o[i]), o_tol)) {
      ++o_bad;
      if (first < 0) first = std::int64_t(i);
    }
  for (std::size_t i = 0; i < want.lse.size(); ++i)
    lse_bad += agrees(got.lse[i], want.lse[i], 1e-5 * std::fabs(want.lse[i]) + 1e-5) ? 0 : 1;
  EXPECT_EQ(o_bad, 0) << "O elements differing from the reference; first at " << first << ": "
                      << (first >= 0 ? to_float(c.dtype, got.o[std::size_t(first)]) : 0.f) << " vs "
                      << (first >= 0 ? to_float(c.dtype, want.o[std::size_t(first)]) : 0.f);
  EXPECT_EQ(lse_bad, 0) << "LSE elements differing from the reference";
}

TEST(CudaEdges, OneHotRowsAtLargeLogitsAreExact) {
  SKIP_WITHOUT_GPU();
  // logits ~ factor^2 * sqrt(d): every row's largest score leads the next by far more than
  // fp32's exp range, so O is one V row, exactly representable.
  for (DType t : {DType::bf16, DType::f16})
    for (std::int64_t d : {64, 128, 256}) {
      const float factor = t == DType::bf16 ? 1000.f : 150.f;
      SCOPED_TRACE(::testing::Message() << (t == DType::bf16 ? "bf16" : "f16") << " d " << d);
      Case c;
      c.dtype = t;
      c.d = d;
      c.s_q = 200, c.s_kv = 300;
      fill(c, factor, 7 + d);
      expect_same(c, run(Backend::cuda, c), run(Backend::reference, c));
    }
}

TEST(CudaEdges, ExtremeScalesGiveTheExactAnswer) {
  SKIP_WITHOUT_GPU();
  for (double scale : {1e10, 1e30, 1e-30})
    for (std::int64_t d : {64, 128}) {
      SCOPED_TRACE(::testing::Message() << "scale " << scale << " d " << d);
      Case c;
      c.d = d;
      c.scale = scale;
      c.mask = MaskKind::causal;
      fill(c, 1.f, 11 + d);
      // a tiny scale makes every P equal: O is a mean, compared by the correctness rule's
      // spirit (half an output ulp of the mean's rounding); a huge one makes rows one-hot.
      expect_same(c, run(Backend::cuda, c), run(Backend::reference, c), scale > 1 ? 0 : 2e-2);
    }
}

TEST(CudaEdges, NanAndInfinityFollowTheDefinition) {
  SKIP_WITHOUT_GPU();
  // MHA with 2 heads, causal (row i sees keys 0..i).
  //   head 0: every query is all ones and keys 0..20 are -inf: rows 0..20 see only -inf
  //           scores (l = 0: NaN, never the "no key" answer), later rows give those keys
  //           weight 0 and stay finite; V[70, 5] NaN: O[i, 5] of rows >= 70 NaN, their
  //           other columns finite (rows before 70 may be NaN in column 5 too: key 70 shares
  //           their key tile, and P = 0 times NaN is NaN);
  //   head 1: a NaN in key 40 (rows >= 40 NaN) and a NaN query row 10.
  for (std::int64_t d : {64, 128}) {
    Case c;
    c.d = d, c.s_q = 96, c.s_kv = 96, c.h = 2, c.hg = 2;
    c.mask = MaskKind::causal;
    fill(c, 1.f, 3 + d);
    auto at = [&](std::int64_t row, std::int64_t head, std::int64_t j) {
      return std::size_t((row * 2 + head) * d + j);
    };
    for (std::int64_t j = 0; j < d; ++j) {
      for (std::int64_t i = 0; i < c.s_q; ++i) c.q[at(i, 0, j)] = from_float(c.dtype, 1.f);
      for (std::int64_t i = 0; i <= 20; ++i) c.k[at(i, 0, j)] = from_float(c.dtype, -INFINITY);
      c.q[at(10, 1, j)] = from_float(c.dtype, NAN);
    }
    c.k[at(40, 1, 3)] = from_float(c.dtype, NAN);
    c.v[at(70, 0, 5)] = from_float(c.dtype, NAN);
    SCOPED_TRACE(::testing::Message() << "d " << d);
    const Result got = run(Backend::cuda, c), want = run(Backend::reference, c);
    expect_same(c, got, want, 2e-2, /*leaks_allowed=*/true);
    // the contract itself, independently of the reference
    for (std::int64_t i = 0; i < c.s_q; ++i) {
      EXPECT_EQ(std::isnan(got.lse[std::size_t(i)]), i <= 20) << "head 0 row " << i;
      EXPECT_EQ(std::isnan(got.lse[std::size_t(c.s_q + i)]), i == 10 || i >= 40) << "head 1 row " << i;
      const float o5 = to_float(c.dtype, got.o[at(i, 0, 5)]), o6 = to_float(c.dtype, got.o[at(i, 0, 6)]);
      if (i <= 20 || i >= 70) EXPECT_TRUE(std::isnan(o5)) << "head 0 row " << i << " column 5";
      EXPECT_EQ(std::isnan(o6), i <= 20) << "head 0 row " << i << " column 6";
      EXPECT_EQ(std::isnan(to_float(c.dtype, got.o[at(i, 1, 0)])), i == 10 || i >= 40) << "head 1 row " << i;
    }
  }
}

TEST(CudaEdges, LongRowsAreSummedInBlocks) {
  SKIP_WITHOUT_GPU();
  // K and V one row each over 2^22 (d 64, the mma.sync forward) and 2^23 keys (d 128, the
  // sm_90a one): every score is the same, so O = that V row exactly, LSE = S + log(s_kv).
  for (auto [d, s_kv] : {std::pair<std::int64_t, std::int64_t>{64, 1 << 22}, {128, 1 << 23}}) {
    SCOPED_TRACE(::testing::Message() << "d " << d << " s_kv " << s_kv);
    Case c;
    c.d = d, c.s_q = 64, c.s_kv = s_kv, c.h = 2, c.hg = 1;
    c.kv_seq_stride = 0;
    fill(c, 1.f, 5 + d);
    const Result got = run(Backend::cuda, c);
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < c.s_q * c.h; ++i)
      for (std::int64_t j = 0; j < d; ++j) bad += got.o[std::size_t(i * d + j)] == c.v[std::size_t(j)] ? 0 : 1;
    EXPECT_EQ(bad, 0) << "O elements that are not the repeated V row";
    for (std::int64_t head = 0; head < c.h; ++head)
      for (std::int64_t i = 0; i < c.s_q; ++i) {
        double s = 0;
        for (std::int64_t j = 0; j < d; ++j)
          s += double(to_float(c.dtype, c.q[std::size_t((i * c.h + head) * d + j)])) *
               to_float(c.dtype, c.k[std::size_t(j)]);
        const double want = s / std::sqrt(double(d)) + std::log(double(s_kv));
        ASSERT_NEAR(got.lse[std::size_t(head * c.s_q + i)], want, 1e-5 * std::fabs(want) + 1e-4);
      }
  }
}

}  // namespace
