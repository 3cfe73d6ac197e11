// prepare_launch and launch (launch.hpp): a plan made ready once, then run on a stream. The
// per-run part of a `cuda` call: what depends on the pointers (the tensors, the alignment of
// each view, which picks the 16-byte or element-wise load path per tensor), the workspace
// pieces, the varlen tables, and the launches in order.
#include "backends/cuda/launch.hpp"

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/common/aux_kernels.hpp"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/tma_maps.hpp"
#include "backends/cuda/varlen_tables.hpp"
#include "common/log.hpp"
#include "common/philox.hpp"
#include "problem/params.hpp"

namespace strideattn::cuda_impl {

namespace {

using detail::Problem;

Status cuda_status(cudaError_t e, const char* what) {
  return Status(StatusCode::backend_error, std::string("cuda backend: ") + what + ": " + cudaGetErrorString(e));
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

// ---------------------------------------------------------------- parameters

// The training features of a run (KernelParams::f): the values and the views' pointers and
// strides; a broadcast dimension (extent 1) gets stride 0.
FeatureParams features_of(const Problem& p) {
  FeatureParams f;
  f.softcap = static_cast<float>(p.softcap);
  if (p.alibi_on) {
    f.alibi = p.alibi.data;
    f.alibi_sb = p.alibi.shape[0] == 1 ? 0 : p.alibi.stride[0];
    f.alibi_sh = p.alibi.stride[1];
  }
  if (p.sinks_on) f.sinks = p.sinks.data, f.sinks_sh = p.sinks.stride[1];
  if (p.max_logit_on && !p.is_backward())
    f.max_logit = p.max_logit.data, f.max_logit_sb = p.max_logit.stride[0], f.max_logit_sh = p.max_logit.stride[1];
  if (p.d_sinks_on && p.is_backward()) f.d_sinks = p.d_sinks.data, f.d_sinks_sh = p.d_sinks.stride[1];
  if (p.bias_on()) {
    f.bias = p.bias.data, f.bias_kind = int(p.bias_type), f.bias_dtype = int(p.bias.dtype);
    for (int d = 0; d < 4; ++d) f.bias_st[d] = p.bias.shape[std::size_t(d)] == 1 ? 0 : p.bias.stride[std::size_t(d)];
  }
  if (p.dbias_on && p.is_backward()) {
    f.dbias = p.dbias.data, f.dbias_dtype = int(p.dbias.dtype);
    std::int64_t dense = 1;
    for (int d = 3; d >= 0; --d) {
      const std::int64_t n = p.dbias.shape[std::size_t(d)];
      f.dbias_shape[d] = n;
      f.dbias_st[d] = n == 1 ? 0 : p.dbias.stride[std::size_t(d)];
      f.dbias_accum_st[d] = n == 1 ? 0 : dense;
      dense *= n;
    }
  }
  if (p.dropout_on()) {
    f.dropout_scale = static_cast<float>(1.0 / (1.0 - p.dropout_p));  // as `cpu`'s keep_scale
    f.dropout_threshold = kernel::dropout_threshold(p.dropout_p);
    f.dropout_seed = p.dropout_seed, f.dropout_offset = p.dropout_offset;
    f.dropout_seed_ptr = p.dropout_seed_ptr, f.dropout_offset_ptr = p.dropout_offset_ptr;
  }
  return f;
}

// What a run fills in the plan's parameters: its tensors and their alignment, and the
// workspace pieces the plan laid out.
KernelParams bind(const PreparedLaunch& prep, const Problem& p, unsigned char* ws) {
  const CudaPlan& plan = prep.plan;
  const WorkspaceLayout& w = plan.workspace;
  KernelParams kp = prep.params;
  kernel::AttentionParams& a = kp.p;
  a.q = p.q.data, a.k = p.k.data, a.v = p.v.data, a.o = p.o.data, a.lse = p.lse.data;
  a.d_o = p.d_o.data, a.dq = p.dq.data, a.dk = p.dk.data, a.dv = p.dv.data;
  kp.aligned = alignment_bits(p);
  kp.f = features_of(p);
  if (p.varlen) {
    const std::size_t n = std::size_t(p.batch);
    auto* tables = reinterpret_cast<std::int64_t*>(ws + w.tables);
    a.q_seq.seqlens = tables;
    a.q_seq.offsets = tables + n;
    a.kv_seq.seqlens = tables + 2 * n;
    a.kv_seq.offsets = tables + 3 * n;
  }
  if (plan.backward) kp.delta = reinterpret_cast<float*>(ws + w.delta);
  if (plan.partial_rows > 0) kp.dkv_partial = reinterpret_cast<float*>(ws + w.partial);
  if (plan.dq_accum_bytes > 0) kp.dq_accum = reinterpret_cast<float*>(ws + w.dq_accum);
  if (plan.dbias_accum_bytes > 0) kp.f.dbias_accum = reinterpret_cast<float*>(ws + w.dbias_accum);
  if (plan.outer_count > 0) {
    kp.outer_slots = reinterpret_cast<float*>(ws + w.outer_slots);
    kp.outer_flags = reinterpret_cast<int*>(ws + w.outer_flags);
  }
  return kp;
}

// ---------------------------------------------------------------- kernel launches

// Whether a kernel of the table has been granted its dynamic shared memory on a device: one
// bit per device (64 of them; beyond, every launch asks again) per (entry, variant).
constexpr int kMaxCachedDevices = 64;
std::atomic<std::uint64_t>* smem_granted(const KernelLaunch& l) {
  static const std::span<const KernelEntry> table = kernel_table();
  static const std::unique_ptr<std::atomic<std::uint64_t>[]> bits(
      new std::atomic<std::uint64_t>[table.size() * kVariantCount]());
  return &bits[std::size_t(l.entry - table.data()) * kVariantCount + std::size_t(l.variant)];
}

// Launches `l` with `kp` (nothing to launch when its grid is empty), after granting the
// kernel its dynamic shared memory once per device (cudaFuncSetAttribute is a driver call
// that every launch would otherwise repeat).
// `arg` is the kernel's one parameter: the KernelParams, or for a tma entry WsForwardParams
// (forward) or WsBackwardParams (dK/dV pass).
cudaError_t launch_kernel(const KernelLaunch& l, const void* arg, int device, cudaStream_t stream) {
  const void* fn = l.kernel();
  std::atomic<std::uint64_t>* granted = smem_granted(l);
  const std::uint64_t bit = device >= 0 && device < kMaxCachedDevices ? std::uint64_t(1) << device : 0;
  // (A failure is returned and cleared from the runtime's last error, as the <<<>>> launches
  // it replaces left it: the next call's launch checks must not see it.)
  if (bit == 0 || (granted->load(std::memory_order_acquire) & bit) == 0) {
    if (cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, l.entry->smem_bytes);
        e != cudaSuccess) {
      (void)cudaGetLastError();
      return e;
    }
    granted->fetch_or(bit, std::memory_order_acq_rel);
  }
  if (l.grid.empty()) return cudaSuccess;
  void* args[] = {const_cast<void*>(arg)};
  const cudaError_t e = cudaLaunchKernel(fn, dim3(l.grid.x, l.grid.y, l.grid.z), dim3(unsigned(l.entry->threads)), args,
                                         std::size_t(l.entry->smem_bytes), stream);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

// The debug log line of a run: which kernels, which load paths.
std::string describe(const CudaPlan& plan, std::uint32_t bits) {
  std::string s = "cuda: head-dim bucket " + std::to_string(plan.bucket) + ", " + to_string(plan.arch) +
                  " kernels; 16-byte loads for";
  const std::pair<const char*, std::uint32_t> names[] = {{" q", kVecQ}, {" k", kVecK}, {" v", kVecV}};
  for (auto [n, b] : names) s += (bits & b) ? n : "";
  if (plan.backward) s += (bits & kVecDO) ? " do" : "";
  s += " (others take the element-wise path)";
  if (plan.main.variant == Variant::mods) s += "; the training features' kernel variant";
  for (int i = 0; i < kSingleFeatureCount; ++i)
    if (int(plan.main.variant) == int(Variant::mods_bias) + i)
      s += std::string("; the training features' kernel variant with ") + kSingleFeatureNames[i] + " alone";
  if (plan.main.variant == Variant::kv_cache || plan.main.variant == Variant::kv_cache_fold)
    s += "; the KV-cache kernel variant (lengths from device memory, K and V through the cache)";
  if (!plan.backward) {
    s += std::string("; forward: ") + plan.main.entry->name;
    if (plan.main.entry->tma) s += " (TMA loads of q, k, v)";
    if (!plan.ws_note.empty()) s += "; warp-specialized forward not run: " + plan.ws_note;
    if (plan.outer_count > 0) s += " (folding every " + std::to_string(kFoldKeys) + " keys)";
    return s;
  }
  if (plan.group_splits > 1)
    s += "; dK/dV pass: query-head group split over " + std::to_string(plan.group_splits) + " CTAs";
  if (plan.kv_fold_blocks > 0) s += "; dK/dV pass folding every " + std::to_string(plan.kv_fold_blocks) + " blocks";
  if (plan.q_fold_blocks > 0) s += "; dQ pass folding every " + std::to_string(plan.q_fold_blocks) + " blocks";
  s += std::string("; dK/dV pass: ") + plan.main.entry->name;
  if (plan.main.entry->tma) s += " (TMA loads of q, k, v, do)";
  if (!plan.ws_note.empty()) s += "; warp-specialized dK/dV pass not run: " + plan.ws_note;
  s += plan.single_pass ? "; single-pass backward (dQ by fp32 atomics)"
                        : std::string("; two-pass backward (deterministic), dQ pass: ") + plan.dq.entry->name;
  return s;
}

}  // namespace

PreparedLaunch prepare_launch(CudaPlan plan, const Problem& p) {
  PreparedLaunch prep;
  KernelParams& kp = prep.params;
  kp.p = detail::make_params(p);
  // (pointers are each run's: bind)
  kernel::AttentionParams& a = kp.p;
  a.q = a.k = a.v = a.d_o = nullptr;
  a.o = a.dq = a.dk = a.dv = nullptr;
  a.lse = nullptr;
  a.q_seq.seqlens = a.q_seq.offsets = a.kv_seq.seqlens = a.kv_seq.offsets = nullptr;
  kp.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  kp.q_tokens = p.q.shape[kSeq];
  kp.kv_tokens = p.kv_tokens();
  kp.group_splits = plan.group_splits;
  kp.partial_rows = plan.partial_rows;
  kp.kv_fold_blocks = plan.kv_fold_blocks;
  kp.q_fold_blocks = plan.q_fold_blocks;
  kp.outer_count = plan.outer_count;
  if (p.varlen && !p.cu_seqlens) {
    const std::size_t n = std::size_t(p.batch);
    prep.host_tables.resize(4 * n);
    for (std::size_t i = 0; i < n; ++i) {
      prep.host_tables[i] = p.seqlens_q[i];
      prep.host_tables[n + i] = p.offsets_q[i];
      prep.host_tables[2 * n + i] = p.seqlens_kv[i];
      prep.host_tables[3 * n + i] = p.offsets_kv[i];
    }
  }
  // The warp-specialized forward's tensor maps; where the driver cannot make them, the
  // fallback forward (CudaPlan::ws_fallback) runs instead, and the log says why.
  if (plan.main.entry != nullptr && plan.main.entry->tma && !plan.backward) {
    const WsForwardTile tile = ws_forward_tile(plan.bucket);
    if (std::string e = encode_forward_maps(p, tile.br, tile.bc, &prep.maps); !e.empty()) {
      plan.main = plan.ws_fallback;
      plan.ws_note = "tma: " + e;
    }
  }
  // The same for the warp-specialized dK/dV pass and the wgmma pass.
  if (plan.main.entry != nullptr && plan.main.entry->tma && plan.backward) {
    const WsBackwardTile tile = ws_backward_tile(plan.bucket);
    if (std::string e = encode_backward_maps(p, tile.br, tile.bc, &prep.backward_maps); !e.empty()) {
      plan.main = plan.ws_fallback;
      plan.ws_note = "tma: " + e;
    }
  }
  prep.plan = std::move(plan);
  return prep;
}

Status fill_varlen_tables(const Problem& p, const std::vector<std::int64_t>& host_tables, std::int64_t* tables,
                          cudaStream_t stream) {
  if (p.cu_seqlens) {
    const CuSeqlensInput in{.cu_q = p.cu_seqlens_q,
                            .cu_kv = p.cu_seqlens_kv,
                            .off_q = p.seq_offsets_q,
                            .off_kv = p.seq_offsets_kv,
                            .count = p.batch,
                            .max_q = p.s_q,
                            .max_kv = p.s_kv,
                            .q_tokens = p.q_tokens(),
                            .kv_tokens = p.kv_tokens()};
    if (cudaError_t e = launch_varlen_tables(in, tables, stream); e != cudaSuccess)
      return cuda_status(e, "converting the cu_seqlens arrays");
    return Status::Ok();
  }
  if (cudaError_t e = cudaMemcpyAsync(tables, host_tables.data(), host_tables.size() * sizeof(std::int64_t),
                                      cudaMemcpyHostToDevice, stream);
      e != cudaSuccess)
    return cuda_status(e, "copying the varlen tables");
  return Status::Ok();
}

Status launch(const PreparedLaunch& prep, const Problem& p, cudaStream_t stream, unsigned char* ws) {
  const CudaPlan& plan = prep.plan;
  const KernelParams kp = bind(prep, p, ws);
  const DType t = plan.dtype;
  const int device = plan.device;
  if (p.varlen)
    if (Status s = fill_varlen_tables(p, prep.host_tables, reinterpret_cast<std::int64_t*>(ws + plan.workspace.tables),
                                      stream);
        !s.ok())
      return s;
  if (kp.outer_count > 0)
    if (cudaError_t e = cudaMemsetAsync(kp.outer_flags, 0, std::size_t(kp.outer_count) * sizeof(int), stream);
        e != cudaSuccess)
      return cuda_status(e, "clearing the outer accumulator's slot flags");
  if (detail::log_level() >= detail::LogLevel::debug)
    detail::log_line(detail::LogLevel::debug, describe(plan, kp.aligned));
  // Varlen: the output tokens outside every sequence are zeroed.
  if (p.varlen)
    if (cudaError_t e = launch_zero_padding(kp, plan.backward ? 1 : 0, p.q_tokens(), p.kv_tokens(), stream);
        e != cudaSuccess)
      return cuda_status(e, "zeroing padding tokens");

  if (!plan.backward) {
    if (cudaError_t e = launch_init_max_logit(kp, stream); e != cudaSuccess)
      return cuda_status(e, "max-logit initialisation launch");
    if (plan.main.entry->tma) {
      // (the maps in the parameter block: a 128-byte copy each and a pointer patch, no sync)
      WsForwardParams wp{prep.maps, kp};
      if (std::string e = patch_forward_maps(&wp.maps, p.q.data, p.k.data, p.v.data); !e.empty())
        return Status(StatusCode::backend_error, "cuda backend: the warp-specialized forward's tensor maps: " + e);
      if (cudaError_t e = launch_kernel(plan.main, &wp, device, stream); e != cudaSuccess)
        return cuda_status(e, "forward kernel launch");
      return Status::Ok();
    }
    if (cudaError_t e = launch_kernel(plan.main, &kp, device, stream); e != cudaSuccess)
      return cuda_status(e, "forward kernel launch");
    return Status::Ok();
  }
  if (cudaError_t e = launch_delta(t, kp, stream); e != cudaSuccess) return cuda_status(e, "delta pre-pass launch");
  if (cudaError_t e = launch_d_sinks(kp, stream); e != cudaSuccess) return cuda_status(e, "d_sinks launch");
  // Single pass: the dK/dV pass adds dS K into the zeroed fp32 accumulator; the folds add
  // into theirs (the dQ pass into dq_accum, the dK/dV pass into its partial planes).
  if (kp.dq_accum != nullptr)
    if (cudaError_t e = cudaMemsetAsync(kp.dq_accum, 0, plan.dq_accum_bytes, stream); e != cudaSuccess)
      return cuda_status(e, "zeroing the dQ accumulator");
  if (plan.kv_fold_blocks > 0)
    if (cudaError_t e = cudaMemsetAsync(kp.dkv_partial, 0, plan.partial_bytes, stream); e != cudaSuccess)
      return cuda_status(e, "zeroing the dK/dV fold's partial planes");
  // dBias: the view zeroed for the pass's stores, or the accumulator for its atomics.
  if (cudaError_t e = launch_zero_dbias(kp, stream); e != cudaSuccess) return cuda_status(e, "dBias zeroing launch");
  if (plan.dbias_accum_bytes > 0)
    if (cudaError_t e = cudaMemsetAsync(kp.f.dbias_accum, 0, plan.dbias_accum_bytes, stream); e != cudaSuccess)
      return cuda_status(e, "zeroing the dBias accumulator");
  // (the two-pass dK/dV pass must not add dQ: its dQ pass owns dq_accum when it folds)
  KernelParams main_kp = kp;
  if (!plan.single_pass) main_kp.dq_accum = nullptr;
  if (plan.main.entry->tma) {
    // (as the forward's: the maps in the parameter block, patched with this run's pointers)
    WsBackwardParams wp{prep.backward_maps, main_kp};
    if (std::string e = patch_backward_maps(&wp.maps, p.q.data, p.k.data, p.v.data, p.d_o.data); !e.empty())
      return Status(StatusCode::backend_error, "cuda backend: the warp-specialized dK/dV pass's tensor maps: " + e);
    if (cudaError_t e = launch_kernel(plan.main, &wp, device, stream); e != cudaSuccess)
      return cuda_status(e, "backward kernel launch");
  } else if (cudaError_t e = launch_kernel(plan.main, &main_kp, device, stream); e != cudaSuccess) {
    return cuda_status(e, "backward kernel launch");
  }
  if (!plan.single_pass)
    if (cudaError_t e = launch_kernel(plan.dq, &kp, device, stream); e != cudaSuccess)
      return cuda_status(e, "dQ pass launch");
  if (cudaError_t e = launch_reduce_dkv(t, kp, stream); e != cudaSuccess)
    return cuda_status(e, "dK/dV reduction launch");
  if (cudaError_t e = launch_convert_dq(t, kp, stream); e != cudaSuccess) return cuda_status(e, "dQ conversion launch");
  if (cudaError_t e = launch_convert_dbias(kp, stream); e != cudaSuccess)
    return cuda_status(e, "dBias conversion launch");
  return Status::Ok();
}

}  // namespace strideattn::cuda_impl
