// A problem with more than 2^31 elements per tensor (b = 1, s = 140000, h = 128, d = 128,
// bf16: 2.29e9 elements in each of Q, K, V, O), made cheap by a causal sliding window of 40
// keys. Only the rows checked here get random inputs (the rest are zero); the output rows
// of tokens past element 2^31 (and one before it) are compared with an fp64 CPU computation
// of just those rows. A 32-bit offset anywhere in the kernels' index math would read or
// write the wrong rows and fail by far more than the tolerance.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/dtype.hpp"
#include "harness/runner.hpp"
#include "strideattn/strideattn.hpp"

namespace {

using strideattn::detail::bf16_to_float;
using strideattn::detail::float_to_bf16;

TEST(CudaBackendLarge, RowsBeyondTwoToThe31Elements) {
  if (!strideattn::harness::gpu_available()) GTEST_SKIP() << "no CUDA GPU present";
  constexpr std::int64_t S = 140000, H = 128, D = 128, W = 40;
  constexpr std::int64_t kElems = S * H * D;
  static_assert(kElems > (std::int64_t(1) << 31), "the point of the test");
  const std::size_t bytes = std::size_t(kElems) * 2;
  std::size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  if (free_b < 4 * bytes + (std::size_t(1) << 30))
    GTEST_SKIP() << "needs " << (4 * bytes >> 30) << " GiB of free device memory, found " << (free_b >> 30);

  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  ASSERT_EQ(cudaMalloc(&q, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&k, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&v, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&o, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&lse, S * H * 4), cudaSuccess);
  for (void* p : {q, k, v}) ASSERT_EQ(cudaMemset(p, 0, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(o, 0xff, bytes), cudaSuccess);  // NaN poison
  ASSERT_EQ(cudaMemset(lse, 0xff, S * H * 4), cudaSuccess);

  const std::int64_t tokens[] = {1000, 131073, 135007, S - 1};
  const std::int64_t row = H * D;  // elements per token
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  // host copies of the rows that matter: Q of each checked token, K/V of its window
  struct Rows {
    std::vector<std::uint16_t> q, k, v;
  };
  std::vector<Rows> host;
  for (std::int64_t t : tokens) {
    Rows r;
    r.q.resize(row);
    r.k.resize((W + 1) * row);
    r.v.resize((W + 1) * row);
    for (auto* vec : {&r.q, &r.k, &r.v})
      for (auto& e : *vec) e = float_to_bf16(uni(rng));
    const std::size_t first_kv = std::size_t(t - W) * row;
    ASSERT_EQ(cudaMemcpy(static_cast<std::uint16_t*>(q) + t * row, r.q.data(), row * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(static_cast<std::uint16_t*>(k) + first_kv, r.k.data(), r.k.size() * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(static_cast<std::uint16_t*>(v) + first_kv, r.v.data(), r.v.size() * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
    host.push_back(std::move(r));
  }

  auto view = [&](void* p) {
    strideattn::TensorView t;
    t.data = p, t.dtype = strideattn::DType::bf16, t.shape = {1, S, H, D};
    t.stride = {S * H * D, H * D, D, 1};
    return t;
  };
  strideattn::ForwardArgs fa;
  fa.q = view(q), fa.k = view(k), fa.v = view(v), fa.o = view(o);
  fa.lse = {lse, {1, H, S}, {H * S, S, 1}};
  fa.options.mask = strideattn::MaskKind::causal;
  fa.options.window = {W, 0};
  fa.backend = strideattn::Backend::cuda;
  fa.memory = strideattn::Memory::device;
  const strideattn::Status st = strideattn::forward(fa);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const double scale = 1.0 / std::sqrt(double(D));
  // Tolerance for one output row of bf16 inputs: output rounding (2^-8 relative on |o| <= 1)
  // plus P rounded to bf16 before P V; a wrong row index gives errors of order 0.3.
  const double tol_o = 1e-2, tol_lse = 1e-3;
  for (std::size_t c = 0; c < std::size(tokens); ++c) {
    const std::int64_t t = tokens[c];
    std::vector<std::uint16_t> out(row);
    std::vector<float> lse_row(H);
    ASSERT_EQ(cudaMemcpy(out.data(), static_cast<std::uint16_t*>(o) + t * row, row * 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (std::int64_t h = 0; h < H; ++h)
      ASSERT_EQ(cudaMemcpy(&lse_row[h], lse + h * S + t, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    double worst = 0, worst_lse = 0;
    for (std::int64_t h = 0; h < H; ++h) {
      std::vector<double> s(W + 1);
      double mx = -INFINITY;
      for (std::int64_t j = 0; j <= W; ++j) {
        double dot = 0;
        for (std::int64_t d = 0; d < D; ++d)
          dot += double(bf16_to_float(host[c].q[h * D + d])) * bf16_to_float(host[c].k[j * row + h * D + d]);
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (std::int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (std::int64_t j = 0; j <= W; ++j) acc += s[j] * bf16_to_float(host[c].v[j * row + h * D + d]);
        const double err = std::abs(acc / sum - double(bf16_to_float(out[h * D + d])));
        worst = std::isnan(err) ? INFINITY : std::max(worst, err);
      }
      const double lse_err = std::abs(mx + std::log(sum) - double(lse_row[h]));
      worst_lse = std::isnan(lse_err) ? INFINITY : std::max(worst_lse, lse_err);
    }
    EXPECT_LE(worst, tol_o) << "token " << t << " (element offset " << t * row << ")";
    EXPECT_LE(worst_lse, tol_lse) << "token " << t;
  }
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse);
}

}  // namespace
