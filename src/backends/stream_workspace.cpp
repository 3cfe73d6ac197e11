// stream_workspace.hpp: the per-device pools, made on first use.
#include "backends/stream_workspace.hpp"

#include <cstdint>
#include <limits>
#include <mutex>

namespace strideattn::detail {

namespace {

constexpr int kMaxDevices = 64;

// The pool of `device`, made once (null when the driver refuses one: the default pool then).
cudaMemPool_t device_pool(int device) {
  static std::mutex mu;
  static cudaMemPool_t pools[kMaxDevices] = {};
  static bool tried[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!tried[device]) {
    tried[device] = true;
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    if (cudaMemPoolCreate(&pool, &props) == cudaSuccess) {
      std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
      (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      pools[device] = pool;
    } else {
      (void)cudaGetLastError();
    }
  }
  return pools[device];
}

}  // namespace

cudaError_t stream_workspace_alloc(void** ptr, std::size_t bytes, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    (void)cudaGetLastError();
    capture = cudaStreamCaptureStatusActive;  // (unknown: the allocation a graph may own)
  }
  int device = -1;
  if (capture == cudaStreamCaptureStatusNone && cudaGetDevice(&device) == cudaSuccess)
    if (cudaMemPool_t pool = device_pool(device)) return cudaMallocFromPoolAsync(ptr, bytes, pool, stream);
  return cudaMallocAsync(ptr, bytes, stream);
}

}  // namespace strideattn::detail
