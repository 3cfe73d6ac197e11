// Private to strideattn_harness: where a backend's tensors live, and the device copies of a
// case's buffers that GPU backends run on (upload, download, sync). In CPU-only builds the
// mirror reports "built without CUDA" and GPU backends are unavailable.
#pragma once

#include <map>
#include <string>

#include "harness/buffers.hpp"
#include "harness/case_setup.hpp"

#ifdef STRIDEATTN_HARNESS_CUDA
#include <cuda_runtime.h>
#endif

namespace strideattn::harness::internal {

bool is_gpu(Backend b);
// Where a backend's tensors live: GPU backends, and `auto` when a GPU is present (what a
// caller with device tensors gets), use device mirrors.
bool on_device(Backend b);

#ifdef STRIDEATTN_HARNESS_CUDA
std::string cuda_msg(const char* what, cudaError_t e);  // "what: CUDA's message"
#endif

// Device copies of every host buffer (guard bands included), same layout.
class DeviceMirror {
 public:
  DeviceMirror() = default;
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;
  ~DeviceMirror();
  [[nodiscard]] Status upload(BufferSet& bufs);
  [[nodiscard]] Status download(BufferSet& bufs);
  [[nodiscard]] const Bases& bases() const { return bases_; }

 private:
  std::map<std::string, void*> raw_;
  Bases bases_;
};

Status device_sync();  // cudaDeviceSynchronize (nothing without CUDA)

// Why a backend cannot run in this process at all (empty when it can).
std::string unavailable_reason(Backend b);

}  // namespace strideattn::harness::internal
