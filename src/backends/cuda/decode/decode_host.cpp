// decode_host.hpp: the KV-cache support rule, the choice of kernels (decode or dense
// forward), the decode plan and its run.
#include "backends/cuda/decode/decode_host.hpp"

#include <climits>
#include <cstdint>

#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/decode/decode_launch.hpp"
#include "backends/cuda/decode/decode_tiles.hpp"
#include "common/log.hpp"

namespace strideattn::cuda_impl {

namespace {

using i64 = std::int64_t;

kernel::Strides strides_of(const TensorView& t) {
  return {t.stride[kBatch], t.stride[kSeq], t.stride[kHead], t.shape[kHeadDim] > 1 ? t.stride[kHeadDim] : 1};
}

// 16-byte cp.async rows: base 16-byte aligned, every stride of an extent > 1 dimension a
// multiple of 8 elements (the dense path's rule, launch.cpp).
bool vector_loadable(const TensorView& v) {
  if (reinterpret_cast<std::uintptr_t>(v.data) % 16 != 0) return false;
  for (int d : {kBatch, kSeq, kHead})
    if (v.shape[d] > 1 && v.stride[d] % 8 != 0) return false;
  return true;
}

// Row tiles per (sequence, KV head): the group's query heads times the query rows, 16 a tile
// (none for a problem without heads).
i64 row_tiles_of(const detail::KvCacheProblem& p) {
  return p.kv_heads > 0 ? (p.group_size() * p.s_q + kDecodeRows - 1) / kDecodeRows : 0;
}

}  // namespace

namespace {

// The append's rule (decode/append.cuh runs before either kernel set): the new tokens need a
// unit head-dim stride.
std::optional<std::string> append_refusal(const detail::KvCacheProblem& p) {
  if (p.appends)
    for (const auto& [name, v] : {std::pair{"k_new", &p.args.k_new}, std::pair{"v_new", &p.args.v_new}})
      if (v->shape[kHeadDim] > 1 && v->stride[kHeadDim] != 1)
        return std::string(name) + " has a head-dim stride of " + std::to_string(v->stride[kHeadDim]) +
               "; supported: 1";
  return std::nullopt;
}

}  // namespace

std::optional<std::string> decode_refusal(const detail::KvCacheProblem& p, const DeviceCaps& caps) {
  if (auto r = append_refusal(p)) return r;
  const int bucket = head_dim_bucket(p.d_qk, p.d_v);
  const DecodeTile tile = decode_tile(bucket);
  if (caps.smem_optin > 0 && tile.smem_bytes > caps.smem_optin)
    return "the decode kernel for head dims up to " + std::to_string(bucket) + " needs " +
           std::to_string(tile.smem_bytes) + " bytes of shared memory per block; device " +
           std::to_string(caps.device) + " grants " + std::to_string(caps.smem_optin) +
           "; supported: GPUs that grant it (8.0, 9.0), or smaller head dims";
  const i64 ctas = p.kv_heads * row_tiles_of(p) * kDecodeMaxSplits;
  if (ctas > INT_MAX)
    return "kv_heads x ceil(group x s_q / " + std::to_string(kDecodeRows) +
           ") = " + std::to_string(p.kv_heads * row_tiles_of(p)) + " row tiles per sequence; supported: at most " +
           std::to_string(INT_MAX / kDecodeMaxSplits);
  return std::nullopt;
}

bool kv_cache_dense(const detail::KvCacheProblem& p, const PlanForcing& forcing) {
  if (p.batch == 0 || p.heads == 0 || p.s_q == 0) return false;  // (nothing for a forward to do)
  return forcing.kv_cache_dense.value_or(p.s_q >= kDenseMinQueryRows);
}

namespace {

// The dense forward's forcing for a KV-cache call: the test's, without the warp-specialized
// forward (its TMA maps address dense tensors only).
PlanForcing dense_forcing(const PlanForcing& forcing) {
  PlanForcing f = forcing;
  f.ws_forward = false;
  return f;
}

}  // namespace

std::optional<std::string> kv_cache_refusal(const detail::KvCacheProblem& p, const DeviceCaps& caps,
                                            const PlanForcing& forcing) {
  if (!kv_cache_dense(p, forcing)) return decode_refusal(p, caps);
  if (auto r = append_refusal(p)) return r;
  return cuda_plan_refusal(detail::selection_problem(p), caps, dense_forcing(forcing));
}

DecodePlan make_decode_plan(const detail::KvCacheProblem& p, const DeviceCaps& caps, const PlanForcing& forcing) {
  DecodePlan plan;
  const std::string rows = std::to_string(p.s_q) + " query rows per sequence and head (" +
                           std::to_string(p.kv_heads > 0 ? p.group_size() * p.s_q : 0) + " per KV head)";
  if (kv_cache_dense(p, forcing)) {
    plan.forward = make_cuda_plan(detail::selection_problem(p), caps, dense_forcing(forcing));
    if (plan.forward.ok()) {
      plan.dense = true;
      plan.bucket = plan.forward.bucket;
      plan.forward.main.variant = plan.forward.outer_count > 0 ? Variant::kv_cache_fold : Variant::kv_cache;
      plan.workspace = plan.forward.workspace.total;
      plan.why = std::string("the dense forward (") + plan.forward.main.entry->name +
                 (p.paged ? ", KV-cache instantiation, paged" : ", KV-cache instantiation, contiguous") + "): " + rows +
                 (forcing.kv_cache_dense ? ", forced by a test" : ", at least " + std::to_string(kDenseMinQueryRows));
      return plan;
    }
  }
  plan.why = "the decode kernels (flash-decoding split kernel): " + rows +
             (forcing.kv_cache_dense ? ", forced by a test" : ", fewer than " + std::to_string(kDenseMinQueryRows));
  if (!plan.forward.ok()) plan.why += "; the dense forward has no plan: " + plan.forward.error;
  plan.bucket = head_dim_bucket(p.d_qk, p.d_v);
  plan.row_tiles = int(row_tiles_of(p));
  const DecodeTile tile = decode_tile(plan.bucket);
  // Resident CTAs per SM from shared memory (the kernel's 1 KiB of static shared memory and
  // the runtime's 1 KiB reserve per block on top), at most 4. Registers allow at least as
  // many (ptxas: 109-111 / 145-148 / 208-211 at d 64 / 128 / 256, 3 / 2 / 2 CTAs by shared
  // memory on a 9.0 GPU).
  const int per_sm = caps.smem_per_sm > 0 ? caps.smem_per_sm / (tile.smem_bytes + 2048) : 1;
  plan.per_sm = per_sm < 1 ? 1 : per_sm > 4 ? 4 : per_sm;
  plan.splits = decode_splits(p.batch * p.kv_heads * plan.row_tiles, p.capacity, caps.sms, plan.per_sm);
  if (plan.splits > 1) {
    const std::size_t rows = std::size_t(plan.splits) * std::size_t(p.batch * p.heads * p.s_q);
    const std::size_t o_bytes = (rows * std::size_t(p.d_v) * sizeof(float) + 255) / 256 * 256;
    plan.workspace = o_bytes + rows * sizeof(float);
  }
  return plan;
}

DecodeParams decode_params(const detail::KvCacheProblem& p) {
  const KvCacheArgs& a = p.args;
  DecodeParams d;
  d.q = a.q.data;
  d.o = a.o.data;
  d.lse = a.lse.data;
  d.q_st = strides_of(a.q);
  d.o_st = strides_of(a.o);
  d.lse_st = {a.lse.stride[0], a.lse.stride[1], a.lse.stride[2]};
  d.k = a.k_cache.data;
  d.v = a.v_cache.data;
  d.k_st = strides_of(a.k_cache);
  d.v_st = strides_of(a.v_cache);
  if (p.appends) {
    d.k_new = a.k_new.data;
    d.v_new = a.v_new.data;
    d.kn_st = strides_of(a.k_new);
    d.vn_st = strides_of(a.v_new);
  }
  if (p.paged) {
    d.block_table = a.block_table.data;
    d.bt_b = a.block_table.stride[0];
    d.bt_p = a.block_table.stride[1];
    d.page_size = p.page_size;
    d.num_pages = p.num_pages;
  }
  d.cache_seqlens = a.cache_seqlens;
  d.seqlens_q = a.seqlens_q;
  d.batch = p.batch;
  d.s_q = p.s_q;
  d.heads = p.heads;
  d.kv_heads = p.kv_heads;
  d.group = p.kv_heads > 0 ? p.group_size() : 1;
  d.d_qk = p.d_qk;
  d.d_v = p.d_v;
  d.capacity = p.capacity;
  d.s_new = p.s_new;
  d.mask_kind = static_cast<int>(a.options.mask);
  d.window_left = a.options.window.left;
  d.window_right = a.options.window.right;
  d.scale = float(p.scale);
  d.scale_log2 = float(p.scale * 1.4426950408889634);
  return d;
}

Status run_append(const detail::KvCacheProblem& p, cudaStream_t stream) {
  if (!p.appends) return Status::Ok();
  const DecodeParams d = decode_params(p);
  const cudaError_t e = p.dtype == DType::f16 ? launch_append_f16(d, stream) : launch_append_bf16(d, stream);
  if (e != cudaSuccess)
    return Status(StatusCode::backend_error,
                  std::string("launching the kv-cache append kernel: ") + cudaGetErrorString(e));
  return Status::Ok();
}

Status run_decode(const detail::KvCacheProblem& p, const DecodePlan& plan, int device, cudaStream_t stream,
                  unsigned char* workspace) {
  if (plan.dense) return run_prefill(p, plan, stream, workspace);
  const KvCacheArgs& a = p.args;
  DecodeParams d = decode_params(p);
  d.row_tiles = plan.row_tiles;
  d.splits = plan.splits;
  if (plan.splits > 1) {
    const std::size_t rows = std::size_t(plan.splits) * std::size_t(p.batch * p.heads * p.s_q);
    d.part_o = reinterpret_cast<float*>(workspace);
    d.part_lse = reinterpret_cast<float*>(workspace + (rows * std::size_t(p.d_v) * sizeof(float) + 255) / 256 * 256);
  }
  if (vector_loadable(a.q)) d.aligned |= kVecQ;
  if (vector_loadable(a.k_cache)) d.aligned |= kVecK;
  if (vector_loadable(a.v_cache)) d.aligned |= kVecV;
  if (detail::log_level() >= detail::LogLevel::debug)
    detail::log_line(detail::LogLevel::debug,
                     "cuda kv cache: head-dim bucket " + std::to_string(plan.bucket) + ", " +
                         std::to_string(plan.row_tiles) + " row tiles, " + std::to_string(plan.splits) + " splits, " +
                         std::to_string(plan.per_sm) + " CTAs per SM; 16-byte loads for" +
                         ((d.aligned & kVecQ) ? " q" : "") + ((d.aligned & kVecK) ? " k" : "") +
                         ((d.aligned & kVecV) ? " v" : ""));
  const cudaError_t e = p.dtype == DType::f16 ? launch_decode_f16(d, plan.bucket, device, stream)
                                              : launch_decode_bf16(d, plan.bucket, device, stream);
  if (e != cudaSuccess)
    return Status(StatusCode::backend_error,
                  std::string("cuda backend: launching the kv-cache kernels: ") + cudaGetErrorString(e));
  return Status::Ok();
}

}  // namespace strideattn::cuda_impl
