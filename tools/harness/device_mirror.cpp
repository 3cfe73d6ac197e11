// The device mirror (device_mirror.hpp): device copies of every host buffer of a case for
// GPU backends, which backends can run in this process, and gpu_available (runner.hpp).
#include "harness/device_mirror.hpp"

#include "common/dtype.hpp"

namespace strideattn::harness::internal {

bool is_gpu(Backend b) { return b == Backend::cuda || b == Backend::cudnn; }
bool on_device(Backend b) { return is_gpu(b) || (b == Backend::automatic && gpu_available()); }

#ifdef STRIDEATTN_HARNESS_CUDA
std::string cuda_msg(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }
#endif

DeviceMirror::~DeviceMirror() {
#ifdef STRIDEATTN_HARNESS_CUDA
  for (auto& [name, p] : raw_) (void)cudaFree(p);
#endif
}

Status DeviceMirror::upload(BufferSet& bufs) {
#ifdef STRIDEATTN_HARNESS_CUDA
  for (auto& [name, buf] : bufs.all()) {
    void*& p = raw_[name];
    if (!p) {
      if (cudaError_t e = cudaMalloc(&p, buf.total_bytes()); e != cudaSuccess) {
        p = nullptr;
        return Status(StatusCode::backend_error, cuda_msg("cudaMalloc", e));
      }
    }
    if (cudaError_t e = cudaMemcpy(p, buf.raw(), buf.total_bytes(), cudaMemcpyHostToDevice); e != cudaSuccess)
      return Status(StatusCode::backend_error, cuda_msg("cudaMemcpy to device", e));
    bases_[name] = static_cast<std::byte*>(p) + kGuardElems * std::int64_t(size_of(buf.dtype()));
  }
  return Status::Ok();
#else
  (void)bufs;
  return Status(StatusCode::unsupported, "built without CUDA");
#endif
}

Status DeviceMirror::download(BufferSet& bufs) {
#ifdef STRIDEATTN_HARNESS_CUDA
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
    return Status(StatusCode::backend_error, cuda_msg("after the run", e));
  for (auto& [name, buf] : bufs.all())
    if (cudaError_t e = cudaMemcpy(buf.raw(), raw_.at(name), buf.total_bytes(), cudaMemcpyDeviceToHost);
        e != cudaSuccess)
      return Status(StatusCode::backend_error, cuda_msg("cudaMemcpy to host", e));
  return Status::Ok();
#else
  (void)bufs;
  return Status(StatusCode::unsupported, "built without CUDA");
#endif
}

Status device_sync() {
#ifdef STRIDEATTN_HARNESS_CUDA
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
    return Status(StatusCode::backend_error, cuda_msg("cudaDeviceSynchronize", e));
#endif
  return Status::Ok();
}

std::string unavailable_reason(Backend b) {
  if (b == Backend::automatic) return {};
  if (is_gpu(b)) {
#ifndef STRIDEATTN_HARNESS_CUDA
    return "built without CUDA";
#else
    if (!backend_compiled(b)) return b == Backend::cudnn ? "built without cuDNN" : "built without CUDA";
    if (!gpu_available()) return "no GPU present";
#endif
  }
  if (!backend_compiled(b)) return "backend not compiled into this build";
  return {};
}

}  // namespace strideattn::harness::internal

namespace strideattn::harness {

bool gpu_available() {
#ifdef STRIDEATTN_HARNESS_CUDA
  static const bool available = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return available;
#else
  return false;
#endif
}

}  // namespace strideattn::harness
