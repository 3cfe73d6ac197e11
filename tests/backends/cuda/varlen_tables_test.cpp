// The device conversion of cu_seqlens arrays into the cuda kernels' int64 tables
// (src/backends/cuda/varlen_tables.hpp), on a GPU (skips without one): arrays that keep the
// promise give exactly the lengths and first tokens, with and without seq_offsets; arrays that
// break it (lengths above the bound, negative, past the view; offsets past the view) are
// clamped into the views, as computed here on the host independently.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/cuda/varlen_tables.hpp"

namespace strideattn::cuda_impl {
namespace {

bool gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The tables for host arrays, by the rule of docs/semantics.md written out again.
std::vector<std::int64_t> expected(const std::vector<std::int32_t>& cu_q, const std::vector<std::int32_t>& cu_kv,
                                   const std::vector<std::int32_t>& off_q, const std::vector<std::int32_t>& off_kv,
                                   std::int64_t max_q, std::int64_t max_kv, std::int64_t tq, std::int64_t tkv) {
  const std::int64_t n = std::int64_t(cu_q.size()) - 1;
  std::vector<std::int64_t> t(std::size_t(4 * n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t oq = std::clamp<std::int64_t>(off_q.empty() ? cu_q[i] : off_q[i], 0, tq);
    const std::int64_t okv = std::clamp<std::int64_t>(off_kv.empty() ? cu_kv[i] : off_kv[i], 0, tkv);
    t[i] = std::min(std::clamp<std::int64_t>(cu_q[i + 1] - cu_q[i], 0, max_q), tq - oq);
    t[n + i] = oq;
    t[2 * n + i] = std::min(std::clamp<std::int64_t>(cu_kv[i + 1] - cu_kv[i], 0, max_kv), tkv - okv);
    t[3 * n + i] = okv;
  }
  return t;
}

std::vector<std::int64_t> on_device(const std::vector<std::int32_t>& cu_q, const std::vector<std::int32_t>& cu_kv,
                                    const std::vector<std::int32_t>& off_q, const std::vector<std::int32_t>& off_kv,
                                    std::int64_t max_q, std::int64_t max_kv, std::int64_t tq, std::int64_t tkv) {
  const std::int64_t n = std::int64_t(cu_q.size()) - 1;
  std::vector<std::int32_t> all(cu_q);
  all.insert(all.end(), cu_kv.begin(), cu_kv.end());
  all.insert(all.end(), off_q.begin(), off_q.end());
  all.insert(all.end(), off_kv.begin(), off_kv.end());
  std::int32_t* arrays = nullptr;
  std::int64_t* tables = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&arrays), all.size() * 4), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&tables), std::size_t(4 * n + 8) * 8), cudaSuccess);
  cudaMemcpy(arrays, all.data(), all.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(tables, 0xff, std::size_t(4 * n + 8) * 8);
  CuSeqlensInput in;
  in.cu_q = arrays;
  in.cu_kv = arrays + n + 1;
  in.off_q = off_q.empty() ? nullptr : arrays + 2 * n + 2;
  in.off_kv = off_kv.empty() ? nullptr : arrays + 2 * n + 2 + std::int64_t(off_q.size());
  in.count = n, in.max_q = max_q, in.max_kv = max_kv, in.q_tokens = tq, in.kv_tokens = tkv;
  EXPECT_EQ(launch_varlen_tables(in, tables, nullptr), cudaSuccess);
  std::vector<std::int64_t> out(std::size_t(4 * n + 8));
  EXPECT_EQ(cudaMemcpy(out.data(), tables, out.size() * 8, cudaMemcpyDeviceToHost), cudaSuccess);
  for (std::size_t i = std::size_t(4 * n); i < out.size(); ++i) EXPECT_EQ(out[i], -1) << "written past the tables";
  out.resize(std::size_t(4 * n));
  cudaFree(arrays);
  cudaFree(tables);
  return out;
}

TEST(CudaVarlenTables, KeptPromisesGiveTheLengthsAndOffsets) {
  if (!gpu()) GTEST_SKIP() << "no GPU present";
  const std::vector<std::int32_t> cu_q{0, 5, 5, 12}, cu_kv{0, 3, 10, 20};
  EXPECT_EQ(on_device(cu_q, cu_kv, {}, {}, 7, 10, 12, 20),
            (std::vector<std::int64_t>{5, 0, 7, 0, 5, 5, 3, 7, 10, 0, 3, 10}));
  const std::vector<std::int32_t> off_q{20, 0, 8}, off_kv{1, 5, 30};  // gaps, any order
  EXPECT_EQ(on_device(cu_q, cu_kv, off_q, off_kv, 7, 10, 30, 40), expected(cu_q, cu_kv, off_q, off_kv, 7, 10, 30, 40));
}

TEST(CudaVarlenTables, BrokenPromisesAreClampedIntoTheViews) {
  if (!gpu()) GTEST_SKIP() << "no GPU present";
  std::vector<std::int32_t> cu_q, cu_kv, off_q;
  std::uint32_t x = 12345;
  auto next = [&] { return x = x * 1664525u + 1013904223u; };
  cu_q.push_back(0), cu_kv.push_back(0);
  for (int i = 0; i < 700; ++i) {  // more sequences than one block's threads
    cu_q.push_back(std::int32_t(next() % 200) - 50);
    cu_kv.push_back(cu_kv.back() + std::int32_t(next() % 90) - 20);
    off_q.push_back(std::int32_t(next() % 400) - 100);
  }
  const auto got = on_device(cu_q, cu_kv, off_q, {}, 64, 48, 256, 300);
  EXPECT_EQ(got, expected(cu_q, cu_kv, off_q, {}, 64, 48, 256, 300));
  const std::int64_t n = 700;
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_LE(got[i] + got[n + i], 256);
    EXPECT_LE(got[2 * n + i] + got[3 * n + i], 300);
  }
}

}  // namespace
}  // namespace strideattn::cuda_impl
