// Host side of the `cuda` backend: the support rules (device memory, f16/bf16, head dims,
// a GPU of compute capability >= 8.0 with a kernel for each pass), the workspace (the
// caller's or one allocated on the stream), and the prepared call of a plan: the CudaPlan
// (plan.hpp: every kernel choice, from the kernel table and the device's cached caps) and its
// pointer-free kernel parameters, made once (prepare_call), then each run binds the pointers
// and launches (launch.hpp). Varlen lengths come as host lists or as cu_seqlens arrays in
// device memory, which each run turns into the kernels' tables on the device.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/decode/decode_host.hpp"
#include "backends/cuda/device_caps.hpp"
#include "backends/cuda/kernel_image.hpp"
#include "backends/cuda/launch.hpp"
#include "backends/stream_workspace.hpp"
#include "backends/cuda/plan.hpp"
#include "backends/cuda/test_hook.hpp"
#include "common/memory_check.hpp"
#include "dispatch/backend.hpp"
#include "dispatch/select.hpp"
#include "problem/kv_cache.hpp"

namespace strideattn::detail {

namespace {

constexpr std::int64_t kMaxHeadDim = 256;
constexpr std::int64_t kMaxGridYZ = 65535;
// A caller's workspace must start this aligned: the pieces (kWorkspacePieceAlign multiples
// apart) then are too, as the int64 tables, fp32 float2 atomics and the float4 loads of the
// dQ conversion need.
constexpr std::size_t kWorkspaceAlign = 16;

Status cuda_status(cudaError_t e, const char* what) {
  return Status(StatusCode::backend_error, std::string("cuda backend: ") + what + ": " + cudaGetErrorString(e));
}

// ---------------------------------------------------------------- support rules

std::vector<const TensorView*> used_views(const Problem& p) {
  std::vector<const TensorView*> v{&p.q, &p.k, &p.v, &p.o};
  if (p.is_backward()) v.insert(v.end(), {&p.d_o, &p.dq, &p.dk, &p.dv});
  return v;
}

const std::vector<SupportRule>& rules() {
  static const std::vector<SupportRule> list = with_feature_rules(
      Backend::cuda,
      {
          // A dBias that broadcasts over the problem sums by fp32 atomics (plan.hpp, dbias_direct).
          {"dbias_deterministic",
           [](const Problem& p) -> std::optional<std::string> {
             if (!p.is_backward() || !p.dbias_on || !p.deterministic || cuda_impl::dbias_direct(p)) return std::nullopt;
             return "dBias [" + std::to_string(p.dbias.shape[0]) + ", " + std::to_string(p.dbias.shape[1]) + ", " +
                    std::to_string(p.dbias.shape[2]) + ", " + std::to_string(p.dbias.shape[3]) +
                    "] sums over a broadcast dimension by fp32 atomics, which is not bitwise reproducible, and "
                    "deterministic = true; supported: deterministic = false, a dBias of the full shape [b, h, s_q, "
                    "s_kv], or the reference and cpu backends";
           }},
          memory_rule(Memory::device),
          {"dtype",
           [](const Problem& p) -> std::optional<std::string> {
             if (p.dtype == DType::f16 || p.dtype == DType::bf16) return std::nullopt;
             return "dtype " + std::string(to_string(p.dtype)) +
                    "; supported: f16, bf16 (tensor-core kernels with fp32 accumulation)";
           }},
          {"head_dim",
           [](const Problem& p) -> std::optional<std::string> {
             for (auto [name, d] : {std::pair{"d_qk", p.d_qk}, std::pair{"d_v", p.d_v}})
               if (d <= 0 || d % 8 != 0 || d > kMaxHeadDim)
                 return std::string(name) + " = " + std::to_string(d) + "; supported: multiples of 8 up to " +
                        std::to_string(kMaxHeadDim);
             return std::nullopt;
           }},
          {"head_dim_stride",
           [](const Problem& p) -> std::optional<std::string> {
             for (const TensorView* v : used_views(p))
               if (v->shape[kHeadDim] > 1 && v->stride[kHeadDim] != 1)
                 return "a head-dim stride of " + std::to_string(v->stride[kHeadDim]) + "; supported: 1";
             return std::nullopt;
           }},
          {"grid",
           [](const Problem& p) -> std::optional<std::string> {
             if (p.heads > kMaxGridYZ || p.batch > kMaxGridYZ)
               return "heads = " + std::to_string(p.heads) + ", sequences = " + std::to_string(p.batch) +
                      "; supported: at most " + std::to_string(kMaxGridYZ) + " each";
             return std::nullopt;
           }},
          {"gpu",
           [](const Problem&) -> std::optional<std::string> {
             cuda_impl::DeviceCaps caps;
             if (const int e = cuda_impl::current_device_caps(&caps); e != 0)
               return std::string("no usable CUDA device (") + cudaGetErrorString(cudaError_t(e)) +
                      "); supported: a GPU of compute capability >= 8.0";
             const int device = caps.device, major = caps.major, minor = caps.minor;
             if (major < 8)
               return "device " + std::to_string(device) + " has compute capability " + std::to_string(major) + "." +
                      std::to_string(minor) + "; supported: >= 8.0 (mma.sync bf16, cp.async)";
             if (cudaError_t e = cuda_impl::kernel_image_status(device); e != cudaSuccess)
               return "device " + std::to_string(device) + " (compute capability " + std::to_string(major) + "." +
                      std::to_string(minor) + ") cannot run this build's kernels (" + cudaGetErrorString(e) +
                      "); supported: the architectures built, " + cuda_impl::built_architectures() +
                      " (PTX entries JIT-compile on newer GPUs)";
             return std::nullopt;
           }},
          // KV-cache attention (decode/): what the kernels the call runs need beyond the rules
          // above: the decode kernels' (head-dim strides of the new tokens, their shared memory
          // on this device, the grid), or where the shape picks the dense forward its plan's.
          {"kv_cache_decode",
           [](const Problem& p) -> std::optional<std::string> {
             if (p.kv_cache == nullptr) return std::nullopt;
             cuda_impl::DeviceCaps caps;
             if (cuda_impl::current_device_caps(&caps) != 0) return std::nullopt;  // (the gpu rule said why)
             return cuda_impl::kv_cache_refusal(*p.kv_cache, caps, cuda_impl::plan_forcing());
           }},
          // A kernel of this build fits the device for every pass the call runs (the 4-warp dK/dV
          // pass and the dQ pass at d <= 256 need 128.5 / 128 KiB of shared memory per block,
          // which sm_86 and sm_89 GPUs do not grant): the plan's kernel choice alone. (A KV-cache
          // call's kernels have the rule above.)
          {"shared_memory",
           [](const Problem& p) -> std::optional<std::string> {
             if (p.kv_cache != nullptr) return std::nullopt;
             cuda_impl::DeviceCaps caps;
             if (cuda_impl::current_device_caps(&caps) != 0) return std::nullopt;  // (the gpu rule said why)
             return cuda_impl::cuda_plan_refusal(p, caps, cuda_impl::plan_forcing());
           }},
      });
  return list;
}

// Workspace for one call: the caller's, or one allocated on the stream (stream_workspace.hpp)
// and freed after.
class Workspace {
 public:
  Status acquire(const Problem& p, std::size_t bytes, cudaStream_t stream) {
    stream_ = stream;
    if (bytes == 0) return Status::Ok();
    if (p.workspace != nullptr) {
      if (reinterpret_cast<std::uintptr_t>(p.workspace) % kWorkspaceAlign != 0)
        return Status(StatusCode::invalid_argument,
                      "workspace address " + std::to_string(reinterpret_cast<std::uintptr_t>(p.workspace)) +
                          " is not " + std::to_string(kWorkspaceAlign) +
                          "-byte aligned; the cuda backend needs that (cudaMalloc pointers are 256-byte aligned)");
      if (p.workspace_bytes < bytes)
        return Status(StatusCode::invalid_argument, "workspace of " + std::to_string(p.workspace_bytes) +
                                                        " bytes is too small; the cuda backend needs " +
                                                        std::to_string(bytes) + " (see workspace_size)");
      base_ = static_cast<unsigned char*>(p.workspace);
      return Status::Ok();
    }
    void* ptr = nullptr;
    if (cudaError_t e = stream_workspace_alloc(&ptr, bytes, stream); e != cudaSuccess)
      return cuda_status(e, "allocating the workspace");
    base_ = static_cast<unsigned char*>(ptr);
    owned_ = true;
    return Status::Ok();
  }
  ~Workspace() {
    if (owned_) (void)cudaFreeAsync(base_, stream_);
  }
  [[nodiscard]] unsigned char* base() const { return base_; }

 private:
  unsigned char* base_ = nullptr;
  bool owned_ = false;
  cudaStream_t stream_ = nullptr;
};

// The plan of a call on the current device (with the test hook's forcing, if any).
Status plan_for(const Problem& p, cuda_impl::CudaPlan* plan) {
  cuda_impl::DeviceCaps caps;
  if (const int e = cuda_impl::current_device_caps(&caps); e != 0)
    return cuda_status(cudaError_t(e), "querying the current device");
  *plan = cuda_impl::make_cuda_plan(p, caps, cuda_impl::plan_forcing());
  if (!plan->ok()) return Status(StatusCode::backend_error, "cuda backend: " + plan->error);
  return Status::Ok();
}

// A plan's preparation: the CudaPlan and its kernel parameters. A run acquires the workspace
// (the caller's: no allocation) and launches; it makes no plan and queries no device.
class CudaCall final : public PreparedCall {
 public:
  explicit CudaCall(cuda_impl::PreparedLaunch prepared) : prepared_(std::move(prepared)) {}
  [[nodiscard]] std::size_t workspace_bytes() const override { return prepared_.plan.workspace.total; }
  [[nodiscard]] Status run(const Problem& p) const override {
    const auto stream = static_cast<cudaStream_t>(p.stream);
    Workspace ws;
    if (Status s = ws.acquire(p, prepared_.plan.workspace.total, stream); !s.ok()) return s;
    return cuda_impl::launch(prepared_, p, stream, ws.base());
  }

 private:
  cuda_impl::PreparedLaunch prepared_;
};

class CudaBackend final : public BackendImpl {
 public:
  [[nodiscard]] Backend id() const override { return Backend::cuda; }

  [[nodiscard]] Verdict supports(const Problem& problem) const override {
    return evaluate_rules(Backend::cuda, rules(), problem);
  }

  // The kernels read the varlen tables from the workspace, which each run writes on the
  // device from cu_seqlens arrays (varlen_tables.hpp) as from host lists.
  [[nodiscard]] bool reads_cu_seqlens() const override { return true; }

  [[nodiscard]] Status workspace_size(const Problem& problem, std::size_t* bytes) const override {
    cuda_impl::CudaPlan plan;
    if (Status s = plan_for(problem, &plan); !s.ok()) return s;
    *bytes = plan.workspace.total;
    return Status::Ok();
  }

  [[nodiscard]] Status prepare_call(const Problem& problem, std::unique_ptr<const PreparedCall>* out) override {
    cuda_impl::CudaPlan plan;
    if (Status s = plan_for(problem, &plan); !s.ok()) return s;
    *out = std::make_unique<CudaCall>(cuda_impl::prepare_launch(std::move(plan), problem));
    return Status::Ok();
  }

  // KV-cache attention (docs/semantics.md "KV cache"): the append, then the split kernel and
  // the combine of decode/ or, for many query rows, the dense forward (make_decode_plan),
  // planned from the problem and the device's cached caps; the lengths and the block table
  // are read on the device only. Workspace: the caller's, or one on the stream.
  [[nodiscard]] bool runs_kv_cache() const override { return true; }
  [[nodiscard]] Status forward_kvcache(const KvCacheProblem& p) override {
    cuda_impl::DeviceCaps caps;
    if (const int e = cuda_impl::current_device_caps(&caps); e != 0)
      return cuda_status(cudaError_t(e), "querying the current device");
    const cuda_impl::DecodePlan plan = cuda_impl::make_decode_plan(p, caps, cuda_impl::plan_forcing());
    const auto stream = static_cast<cudaStream_t>(p.args.stream);
    Workspace ws;
    if (Status s = ws.acquire(selection_problem(p), plan.workspace, stream); !s.ok()) return s;
    return cuda_impl::run_decode(p, plan, caps.device, stream, ws.base());
  }
  // The split kernel's partial rows (none with one split), or the dense forward's workspace:
  // the plan forward_kvcache makes.
  [[nodiscard]] Status kvcache_workspace_size(const KvCacheProblem& p, std::size_t* bytes) const override {
    cuda_impl::DeviceCaps caps;
    if (const int e = cuda_impl::current_device_caps(&caps); e != 0)
      return cuda_status(cudaError_t(e), "querying the current device");
    *bytes = cuda_impl::make_decode_plan(p, caps, cuda_impl::plan_forcing()).workspace;
    return Status::Ok();
  }
  [[nodiscard]] std::string describe_kvcache_plan(const KvCacheProblem& p) const override {
    cuda_impl::DeviceCaps caps;
    if (cuda_impl::current_device_caps(&caps) != 0) return "";
    return "runs " + cuda_impl::make_decode_plan(p, caps, cuda_impl::plan_forcing()).why;
  }

  // A call without a plan of the caller's: prepared, then run once.
  [[nodiscard]] Status forward(const Problem& p) override { return run_once(p); }
  [[nodiscard]] Status backward(const Problem& p) override { return run_once(p); }

 private:
  Status run_once(const Problem& p) {
    std::unique_ptr<const PreparedCall> call;
    if (Status s = prepare_call(p, &call); !s.ok()) return s;
    return call->run(p);
  }
};

}  // namespace

BackendImpl* cuda_backend() {
  static CudaBackend backend;
  return &backend;
}

// Where a pointer lives, for the memory check of every call (common/memory_check.hpp).
// cudaPointerGetAttributes does not synchronise; when it fails (no GPU, no driver) the
// pointer is not checked and the error it left is cleared unless one was already pending.
PointerKind classify_pointer(const void* ptr) {
  const bool error_pending = cudaPeekAtLastError() != cudaSuccess;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    if (!error_pending) (void)cudaGetLastError();
    return PointerKind::unknown;
  }
  switch (attr.type) {
    case cudaMemoryTypeUnregistered:
      return PointerKind::host;
    case cudaMemoryTypeHost:
      return PointerKind::pinned_host;
    case cudaMemoryTypeDevice:
      return PointerKind::device;
    case cudaMemoryTypeManaged:
      return PointerKind::managed;
  }
  return PointerKind::unknown;
}

}  // namespace strideattn::detail
