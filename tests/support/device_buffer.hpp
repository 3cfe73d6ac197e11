// A random bf16 buffer in device memory for the kernel tests that call the public API with
// device pointers: normal(0, 1) draws (or zeros), 16 bytes of slack past the end, read back
// as raw 16-bit values, poisoned with NaN.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace strideattn::test_support {

struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t elems = 0;
  explicit DeviceBuffer(std::size_t n, std::mt19937_64* rng = nullptr) : elems(n) {
    std::vector<std::uint16_t> host(n, 0);
    if (rng != nullptr) {
      std::normal_distribution<float> dist(0.f, 1.f);
      for (auto& e : host) {
        const float f = dist(*rng);
        std::uint32_t u;
        std::memcpy(&u, &f, 4);
        e = static_cast<std::uint16_t>(u >> 16);
      }
    }
    EXPECT_EQ(cudaMalloc(&ptr, n * 2 + 16), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  [[nodiscard]] std::vector<std::uint16_t> bytes() const {
    std::vector<std::uint16_t> host(elems);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr, elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  void poison() const { EXPECT_EQ(cudaMemset(ptr, 0xff, elems * 2), cudaSuccess); }  // (NaN)
};

}  // namespace strideattn::test_support
