// The per-device cache of DeviceCaps (device_caps.hpp): the attributes are read once for each
// device the process uses, then served from memory.
#include <cuda_runtime.h>

#include <array>
#include <mutex>

#include "backends/cuda/device_caps.hpp"

namespace strideattn::cuda_impl {

namespace {

constexpr int kMaxDevices = 64;

struct Cached {
  std::once_flag once;
  DeviceCaps caps;
  int error = 0;
};
std::array<Cached, kMaxDevices> g_devices;

int query(int device, DeviceCaps* c) {
  c->device = device;
#if defined(STRIDEATTN_CUDA_SM90A)
  c->sm90a_code = true;
#endif
  const std::pair<cudaDeviceAttr, int*> attrs[] = {
      {cudaDevAttrComputeCapabilityMajor, &c->major},
      {cudaDevAttrComputeCapabilityMinor, &c->minor},
      {cudaDevAttrMultiProcessorCount, &c->sms},
      {cudaDevAttrMaxSharedMemoryPerBlockOptin, &c->smem_optin},
      {cudaDevAttrMaxSharedMemoryPerMultiprocessor, &c->smem_per_sm},
  };
  for (auto [attr, value] : attrs)
    if (cudaError_t e = cudaDeviceGetAttribute(value, attr, device); e != cudaSuccess) {
      cudaGetLastError();
      return int(e);
    }
  return 0;
}

}  // namespace

int current_device_caps(DeviceCaps* out) {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    cudaGetLastError();
    return int(e);
  }
  if (device < 0 || device >= kMaxDevices) return query(device, out);  // (uncached: not expected)
  Cached& c = g_devices[std::size_t(device)];
  std::call_once(c.once, [&] { c.error = query(device, &c.caps); });
  *out = c.caps;
  return c.error;
}

}  // namespace strideattn::cuda_impl
