// Host side of the `cuda` backend: the support rules (device memory, f16/bf16, head dims,
// a GPU of compute capability >= 8.0), the workspace (device copies of the varlen tables,
// the backward's delta rows and, for GQA/MQA with few KV heads, the dK/dV partials of the
// split query-head groups, and for the single-pass backward the fp32 dQ accumulator), the
// choice of dK/dV kernel and of single- or two-pass backward, the alignment choice between
// the 16-byte and element-wise load paths per tensor, and the launch sequence of each
// direction.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/kernel_image.hpp"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/tiles.hpp"
#include "common/log.hpp"
#include "common/memory_check.hpp"
#include "dispatch/backend.hpp"
#include "dispatch/select.hpp"
#include "problem/params.hpp"

namespace strideattn::detail {

namespace {

using cuda_impl::KernelParams;

constexpr std::int64_t kMaxHeadDim = 256;
constexpr std::int64_t kMaxGridYZ = 65535;
constexpr std::size_t kAlign = 256;

std::size_t round_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
// A caller's workspace must start this aligned: the pieces (kAlign multiples apart) then
// are too, as the int64 tables, fp32 float2 atomics and the float4 loads of the dQ conversion need.
constexpr std::size_t kWorkspaceAlign = 16;

// ---------------------------------------------------------------- support rules

std::vector<const TensorView*> used_views(const Problem& p) {
  std::vector<const TensorView*> v{&p.q, &p.k, &p.v, &p.o};
  if (p.is_backward()) v.insert(v.end(), {&p.d_o, &p.dq, &p.dk, &p.dv});
  return v;
}

const std::vector<SupportRule>& rules() {
  static const std::vector<SupportRule> list = {
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
         int device = 0;
         if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
           cudaGetLastError();
           return std::string("no usable CUDA device (") + cudaGetErrorString(e) +
                  "); supported: a GPU of compute capability >= 8.0";
         }
         int major = 0, minor = 0;
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
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
  };
  return list;
}

// ---------------------------------------------------------------- dK/dV pass parallelism

// The dK/dV pass runs one CTA per (key block, KV head, sequence), each looping over every
// query head of its GQA group. With few KV heads that grid is too small: the seed case (MQA
// 16/1, 8 sequences of 2k keys, d 64) has 128 CTAs for 132 SMs. Splitting the group over
// CTAs brings the grid to about target_ctas_per_sm x SMs CTAs, at the price of fp32 partials
// and one reduction pass: several waves, so that the causal imbalance between key blocks
// evens out. 4-warp kernel: 4 CTAs per SM (two waves of the two resident). 8-warp kernel
// (one resident per SM): 16, the fastest of 1-16 forced splits on the seed's fwd+bwd.
// sm_90a wgmma pass (also one per SM, each about 1.5x faster): 8, faster than 16 on the same
// case (bench/cuda-notes.md, steps 15 and 16).
std::int64_t target_ctas_per_sm(bool kv8, bool wgmma) { return wgmma ? 8 : kv8 ? 16 : 4; }

// What the kernel choices below need to know of the current GPU, queried once per call
// (plan_workspace). All zero when it cannot be queried: every choice then falls back to the
// kernels that need nothing of it.
struct DeviceCaps {
  int major = 0, minor = 0;  // compute capability
  int smem_optin = 0;        // opt-in shared memory per block, bytes
  int sms = 0;               // multiprocessors
  int smem_per_sm = 0;       // shared memory per multiprocessor, bytes
};

// A test knob that is either "0" or "1": 0 or 1; -1 when unset or anything else.
int env_switch(const char* name) {
  const char* env = std::getenv(name);
  if (env == nullptr) return -1;
  if (std::strcmp(env, "0") == 0) return 0;
  if (std::strcmp(env, "1") == 0) return 1;
  return -1;
}

// The architecture whose kernels run on `gpu` (common/arch.hpp): the sm_90a kernels on a 9.0
// GPU where the build carries sm_90a code (STRIDEATTN_CUDA_SM90A, set by CMake from the CUDA
// architectures), the sm80 ones everywhere else, and also there with STRIDEATTN_CUDA_WGMMA=0
// (tests: every device pass builds the sm80 kernels).
cuda_impl::Arch kernel_arch(const DeviceCaps& gpu) {
#if defined(STRIDEATTN_CUDA_SM90A)
  if (gpu.major == 9 && gpu.minor == 0 && env_switch("STRIDEATTN_CUDA_WGMMA") != 0) return cuda_impl::Arch::sm90a;
#endif
  (void)gpu;
  return cuda_impl::Arch::sm80;
}

DeviceCaps current_device() {
  DeviceCaps c;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&c.major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&c.minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&c.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&c.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess) {
    cudaGetLastError();
    return DeviceCaps{};
  }
  return c;
}

// STRIDEATTN_CUDA_GROUP_SPLITS=N (tests): use N splits (clamped to 1..group) whatever the
// grid size, so the split and unsplit dK/dV paths run on the same inputs on any GPU.
std::int64_t forced_group_splits(std::int64_t group) {
  const char* env = std::getenv("STRIDEATTN_CUDA_GROUP_SPLITS");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const long long n = std::strtoll(env, &end, 10);
  if (*end != '\0' || n < 1) return 0;
  return std::min<std::int64_t>(n, group);
}

// The sm80 kernels' dK/dV pass at d <= 128: the 8-warp kernel (128 keys per CTA), or the
// 4-warp one on GPUs whose opt-in shared memory per block is below the 8-warp kernel's
// (d <= 128: 161 KiB; sm_86 and sm_89 have 99 KiB) and with STRIDEATTN_CUDA_KV8=0 (tests).
// d <= 64 always runs the 8-warp kernel (97 KiB fits every GPU of compute capability 8.0+),
// d <= 256 the 4-warp one.
bool kv_pass_8warps(int bucket, const DeviceCaps& gpu) {
  if (bucket == 64) return true;
  if (bucket != 128 || env_switch("STRIDEATTN_CUDA_KV8") == 0) return false;
  return gpu.smem_optin >= cuda_impl::kv8_tile(cuda_impl::Arch::sm80, bucket).smem_bytes;
}

int choose_group_splits(const Problem& p, bool kv8, bool wgmma, const DeviceCaps& gpu) {
  const std::int64_t group = p.group_size();
  if (!p.is_backward() || group <= 1) return 1;
  if (const std::int64_t forced = forced_group_splits(group); forced > 0) {
    const std::int64_t per_split = (group + forced - 1) / forced;
    const std::int64_t splits = (group + per_split - 1) / per_split;
    return p.kv_heads * splits > kMaxGridYZ ? 1 : int(splits);
  }
  const int bucket = cuda_impl::head_dim_bucket(p.d_qk, p.d_v);
  const cuda_impl::Arch arch = kernel_arch(gpu);
  // keys per CTA and CTAs per key block of the pass that runs
  const std::int64_t keys = wgmma ? cuda_impl::kv_wgmma_tile(bucket).bc
                            : kv8 ? cuda_impl::kv8_tile(arch, bucket).bc
                                  : cuda_impl::kv_tile(arch, bucket).bc;
  const std::int64_t dim_splits = wgmma || kv8 ? 1 : cuda_impl::kv_tile(arch, bucket).dim_splits;
  const std::int64_t ctas = (p.s_kv + keys - 1) / keys * dim_splits * p.kv_heads * p.batch;
  const std::int64_t target = target_ctas_per_sm(kv8, wgmma) * gpu.sms;
  if (ctas <= 0 || ctas >= target) return 1;
  std::int64_t splits = std::min(group, (target + ctas - 1) / ctas);
  const std::int64_t per_split = (group + splits - 1) / splits;
  splits = (group + per_split - 1) / per_split;  // no split left without heads
  if (p.kv_heads * splits > kMaxGridYZ) return 1;
  return int(splits);
}

// ---------------------------------------------------------------- single-pass backward

// The single-pass backward (dQ by fp32 atomics in the dK/dV pass) when the pass can add dQ
// (`pass_adds_dq`: the 8-warp or the wgmma pass) and the caller does not ask for bitwise
// reproducibility; otherwise, and where the 4-warp pass runs, the deterministic two-pass
// backward.
bool use_fused_dq(const Problem& p, bool pass_adds_dq) {
  if (!p.is_backward() || !pass_adds_dq) return false;
  // STRIDEATTN_CUDA_FUSED_DQ=0/1 (tests): force the two-pass (0) or single-pass (1) backward
  // whatever `deterministic` says, so both run on the same inputs.
  const int forced = env_switch("STRIDEATTN_CUDA_FUSED_DQ");
  return forced >= 0 ? forced == 1 : !p.deterministic;
}

// Bytes of the single-pass backward's fp32 dQ accumulator (unrounded).
std::size_t dq_accum_bytes(const Problem& p) {
  return std::size_t(p.q.shape[kBatch]) * std::size_t(p.heads) * std::size_t(p.q.shape[kSeq]) * std::size_t(p.d_qk) *
         sizeof(float);
}

// An upper bound of the forward kernel's warps resident on the GPU at once: the size of the
// outer accumulator's slot pool (outer_accumulator.cuh), which must never run dry. CTAs per
// SM are bounded by threads (2,048), the 32-CTA limit and shared memory; registers only
// lower the real count. 0 when the GPU could not be queried (no blocked accumulation then).
int forward_resident_warps(int bucket, bool wgmma, const DeviceCaps& gpu) {
  using namespace cuda_impl;
  const int threads = wgmma ? kKvThreads : kThreads;
  const int smem = wgmma ? forward_wgmma_tile(bucket).smem_bytes : forward_tile(kernel_arch(gpu), bucket).smem_bytes;
  int ctas = std::min(32, 2048 / threads);
  if (gpu.smem_per_sm > 0) ctas = std::max(1, std::min(ctas, gpu.smem_per_sm / smem));
  return gpu.sms * ctas * (threads / 32);
}

// ---------------------------------------------------------------- layout of the workspace

struct WorkspacePlan {
  std::size_t tables = 0;    // 4 x batch int64: seqlens_q, offsets_q, seqlens_kv, offsets_kv
  std::size_t delta = 0;     // backward: fp32 [q batch extent][heads][q tokens]
  std::size_t partial = 0;   // backward, group splits > 1: fp32 dK/dV partial planes
  std::size_t dq_accum = 0;  // single-pass backward: fp32 [q batch extent][heads][q tokens][d_qk]
  int group_splits = 1;
  std::int64_t partial_rows = 0;                 // rows of one partial plane
  bool kv8 = false;                              // the 8-warp dK/dV pass runs (kv_pass_8warps)
  bool wgmma = false;                            // the sm_90a wgmma kernel runs it (kv_pass_wgmma)
  bool fwd_wgmma = false;                        // forward: the sm_90a wgmma kernel (forward_wgmma)
  cuda_impl::Arch arch = cuda_impl::Arch::sm80;  // the kernels' architecture (kernel_arch)
  std::size_t outer = 0;                         // forward over > kFoldKeys keys: the outer slots, then flags
  int outer_count = 0;                           // slots
  std::size_t outer_slot_floats = 0;
  [[nodiscard]] std::size_t total() const { return tables + delta + partial + dq_accum + outer; }
};

// The workspace and every kernel choice of one call (the GPU is queried once, here).
WorkspacePlan plan_workspace(const Problem& p) {
  WorkspacePlan w;
  const DeviceCaps gpu = current_device();
  const int bucket = cuda_impl::head_dim_bucket(p.d_qk, p.d_v);
  w.arch = kernel_arch(gpu);
  if (p.varlen) w.tables = round_up(4 * std::size_t(p.batch) * sizeof(std::int64_t));
  if (!p.is_backward()) {
    w.fwd_wgmma = w.arch == cuda_impl::Arch::sm90a && cuda_impl::has_forward_wgmma(bucket);
    if (p.s_kv > cuda_impl::kFoldKeys) {
      w.outer_count = forward_resident_warps(bucket, w.fwd_wgmma, gpu);
      const int rows_per_warp = w.fwd_wgmma ? 16 : 16 * cuda_impl::forward_tile(w.arch, bucket).mt;
      w.outer_slot_floats = std::size_t(rows_per_warp) * std::size_t(bucket);
      w.outer = round_up(std::size_t(w.outer_count) * w.outer_slot_floats * sizeof(float)) +
                round_up(std::size_t(w.outer_count) * sizeof(int));
    }
  }
  if (p.is_backward()) {
    w.delta =
        round_up(std::size_t(p.q.shape[kBatch]) * std::size_t(p.heads) * std::size_t(p.q.shape[kSeq]) * sizeof(float));
    w.wgmma = w.arch == cuda_impl::Arch::sm90a;
    w.kv8 = !w.wgmma && kv_pass_8warps(bucket, gpu);
    w.group_splits = choose_group_splits(p, w.kv8, w.wgmma, gpu);
    if (w.group_splits > 1) {
      w.partial_rows = p.k.shape[kBatch] * p.kv_heads * p.k.shape[kSeq];
      w.partial = round_up(std::size_t(w.group_splits) * std::size_t(w.partial_rows) * std::size_t(p.d_qk + p.d_v) *
                           sizeof(float));
    }
    if (use_fused_dq(p, w.kv8 || w.wgmma)) {
      w.dq_accum = round_up(dq_accum_bytes(p));
    }
  }
  return w;
}

// ---------------------------------------------------------------- alignment of each view

bool strides_multiple_of(const TensorView& v, std::int64_t m) {
  for (int d : {kBatch, kSeq, kHead})
    if (v.shape[d] > 1 && v.stride[d] % m != 0) return false;
  return true;
}
bool vector_loadable(const TensorView& v) {
  return reinterpret_cast<std::uintptr_t>(v.data) % 16 == 0 && strides_multiple_of(v, 8);
}
bool pair_storable(const TensorView& v) {
  return reinterpret_cast<std::uintptr_t>(v.data) % 4 == 0 && strides_multiple_of(v, 2);
}

std::uint32_t alignment_bits(const Problem& p) {
  using namespace cuda_impl;
  std::uint32_t bits = 0;
  if (vector_loadable(p.q)) bits |= kVecQ;
  if (vector_loadable(p.k)) bits |= kVecK;
  if (vector_loadable(p.v)) bits |= kVecV;
  if (pair_storable(p.o)) bits |= kPairO;
  if (p.is_backward()) {
    if (vector_loadable(p.d_o)) bits |= kVecDO;
    if (vector_loadable(p.o)) bits |= kVecO;
    if (pair_storable(p.dq)) bits |= kPairDQ;
    if (pair_storable(p.dk)) bits |= kPairDK;
    if (pair_storable(p.dv)) bits |= kPairDV;
  }
  return bits;
}

Status cuda_status(cudaError_t e, const char* what) {
  return Status(StatusCode::backend_error, std::string("cuda backend: ") + what + ": " + cudaGetErrorString(e));
}

// Workspace for one call: the caller's, or one allocated on the stream and freed after.
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
    if (cudaError_t e = cudaMallocAsync(&ptr, bytes, stream); e != cudaSuccess)
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

// Fill the kernel parameters: strides and sizes from the problem, varlen tables copied
// into the workspace.
Status prepare(const Problem& p, const WorkspacePlan& plan, const Workspace& ws, cudaStream_t stream,
               KernelParams* kp) {
  kp->p = make_params(p);
  kp->aligned = alignment_bits(p);
  kp->scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  kp->q_tokens = p.q.shape[kSeq];
  if (p.varlen) {
    const std::size_t n = std::size_t(p.batch);
    std::vector<std::int64_t> host(4 * n);
    for (std::size_t i = 0; i < n; ++i) {
      host[i] = p.seqlens_q[i];
      host[n + i] = p.offsets_q[i];
      host[2 * n + i] = p.seqlens_kv[i];
      host[3 * n + i] = p.offsets_kv[i];
    }
    auto* dev = reinterpret_cast<std::int64_t*>(ws.base());
    if (cudaError_t e =
            cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream);
        e != cudaSuccess)
      return cuda_status(e, "copying the varlen tables");
    kp->p.q_seq.seqlens = dev;
    kp->p.q_seq.offsets = dev + n;
    kp->p.kv_seq.seqlens = dev + 2 * n;
    kp->p.kv_seq.offsets = dev + 3 * n;
  }
  if (p.is_backward()) kp->delta = reinterpret_cast<float*>(ws.base() + plan.tables);
  kp->kv_tokens = p.kv_tokens();
  kp->group_splits = plan.group_splits;
  kp->kv_pass_8warps = plan.kv8;
  kp->kv_pass_wgmma = plan.wgmma;
  kp->fwd_wgmma = plan.fwd_wgmma;
  if (plan.group_splits > 1) {
    kp->dkv_partial = reinterpret_cast<float*>(ws.base() + plan.tables + plan.delta);
    kp->partial_rows = plan.partial_rows;
  }
  if (plan.dq_accum > 0) {
    kp->dq_accum = reinterpret_cast<float*>(ws.base() + plan.tables + plan.delta + plan.partial);
  }
  if (plan.outer_count > 0) {
    unsigned char* outer = ws.base() + plan.tables + plan.delta + plan.partial + plan.dq_accum;
    kp->outer_slots = reinterpret_cast<float*>(outer);
    kp->outer_flags = reinterpret_cast<int*>(
        outer + round_up(std::size_t(plan.outer_count) * plan.outer_slot_floats * sizeof(float)));
    kp->outer_count = plan.outer_count;
    if (cudaError_t e = cudaMemsetAsync(kp->outer_flags, 0, std::size_t(plan.outer_count) * sizeof(int), stream);
        e != cudaSuccess)
      return cuda_status(e, "clearing the outer accumulator's slot flags");
  }
  return Status::Ok();
}

cuda_impl::ElemType elem_type(const Problem& p) {
  return p.dtype == DType::f16 ? cuda_impl::ElemType::f16 : cuda_impl::ElemType::bf16;
}

std::string describe_paths(const Problem& p, std::uint32_t bits) {
  using namespace cuda_impl;
  std::string s = "cuda: head-dim bucket " + std::to_string(head_dim_bucket(p.d_qk, p.d_v)) + "; 16-byte loads for";
  const std::pair<const char*, std::uint32_t> names[] = {{" q", kVecQ}, {" k", kVecK}, {" v", kVecV}};
  for (auto [n, b] : names) s += (bits & b) ? n : "";
  if (p.is_backward()) s += (bits & kVecDO) ? " do" : "";
  return s + " (others take the element-wise path)";
}

class CudaBackend final : public BackendImpl {
 public:
  [[nodiscard]] Backend id() const override { return Backend::cuda; }

  [[nodiscard]] Verdict supports(const Problem& problem) const override {
    return evaluate_rules(Backend::cuda, rules(), problem);
  }

  [[nodiscard]] Status workspace_size(const Problem& problem, std::size_t* bytes) const override {
    *bytes = plan_workspace(problem).total();
    return Status::Ok();
  }

  [[nodiscard]] Status forward(const Problem& p) override {
    Workspace ws;
    KernelParams kp;
    cuda_impl::Arch arch{};
    if (Status s = begin(p, &ws, &kp, &arch); !s.ok()) return s;
    const int bucket = cuda_impl::head_dim_bucket(p.d_qk, p.d_v);
    if (cudaError_t e = cuda_impl::launch_forward(elem_type(p), arch, bucket, kp, stream_of(p)); e != cudaSuccess)
      return cuda_status(e, "forward kernel launch");
    return Status::Ok();
  }

  [[nodiscard]] Status backward(const Problem& p) override {
    Workspace ws;
    KernelParams kp;
    cuda_impl::Arch arch{};
    if (Status s = begin(p, &ws, &kp, &arch); !s.ok()) return s;
    const cudaStream_t stream = stream_of(p);
    if (cudaError_t e = cuda_impl::launch_delta(elem_type(p), kp, stream); e != cudaSuccess)
      return cuda_status(e, "delta pre-pass launch");
    // Single pass: the dK/dV pass adds dS K into the zeroed fp32 accumulator.
    if (kp.dq_accum != nullptr)
      if (cudaError_t e = cudaMemsetAsync(kp.dq_accum, 0, dq_accum_bytes(p), stream); e != cudaSuccess)
        return cuda_status(e, "zeroing the dQ accumulator");
    const int bucket = cuda_impl::head_dim_bucket(p.d_qk, p.d_v);
    if (cudaError_t e = cuda_impl::launch_backward(elem_type(p), arch, bucket, kp, stream); e != cudaSuccess)
      return cuda_status(e, "backward kernel launch");
    if (cudaError_t e = cuda_impl::launch_reduce_dkv(elem_type(p), kp, stream); e != cudaSuccess)
      return cuda_status(e, "dK/dV reduction launch");
    if (cudaError_t e = cuda_impl::launch_convert_dq(elem_type(p), kp, stream); e != cudaSuccess)
      return cuda_status(e, "dQ conversion launch");
    return Status::Ok();
  }

 private:
  static cudaStream_t stream_of(const Problem& p) { return static_cast<cudaStream_t>(p.stream); }

  // The start both directions share: workspace, kernel parameters, and for varlen the output
  // tokens outside every sequence zeroed.
  static Status begin(const Problem& p, Workspace* ws, KernelParams* kp, cuda_impl::Arch* arch) {
    const cudaStream_t stream = stream_of(p);
    const WorkspacePlan plan = plan_workspace(p);
    *arch = plan.arch;
    if (Status s = ws->acquire(p, plan.total(), stream); !s.ok()) return s;
    if (Status s = prepare(p, plan, *ws, stream, kp); !s.ok()) return s;
    if (log_level() >= LogLevel::debug) {
      std::string line = describe_paths(p, kp->aligned);
      if (kp->group_splits > 1)
        line += "; dK/dV pass: query-head group split over " + std::to_string(kp->group_splits) + " CTAs";
      if (kp->fwd_wgmma) line += "; forward: wgmma (sm_90a)";
      if (p.is_backward())
        line += kp->kv_pass_wgmma    ? "; dK/dV pass: 8 warps, wgmma (sm_90a)"
                : kp->kv_pass_8warps ? "; dK/dV pass: 8 warps"
                                     : "; dK/dV pass: 4 warps";
      if (p.is_backward())
        line += kp->dq_accum == nullptr ? "; two-pass backward (deterministic)"
                                        : "; single-pass backward (dQ by fp32 atomics)";
      log_line(LogLevel::debug, line);
    }
    if (p.varlen)
      if (cudaError_t e =
              cuda_impl::launch_zero_padding(*kp, p.is_backward() ? 1 : 0, p.q_tokens(), p.kv_tokens(), stream);
          e != cudaSuccess)
        return cuda_status(e, "zeroing padding tokens");
    return Status::Ok();
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
