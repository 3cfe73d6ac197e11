// kvcache.hpp: the `cudnn` backend's KV-cache forward.
#include "backends/cudnn/kvcache.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>

#include "backends/cuda/decode/decode_host.hpp"
#include "backends/cudnn/kv_kernels.hpp"
#include "backends/cudnn/rules.hpp"
#include "backends/stream_workspace.hpp"

namespace strideattn::detail::cudnn {

namespace {

using i64 = std::int64_t;

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// A page container [num_pages, page_size, hg, d] as cuDNN's [num_pages, hg, page_size, d]; the
// stride of a size-1 dimension is never used, so it gets the span of the others (as layout_of).
TensorLayout page_layout(const TensorView& t) {
  i64 span = 1;
  for (int i = 0; i < 4; ++i)
    if (t.shape[i] > 1) span = std::max(span, t.shape[i] * t.stride[i]);
  auto st = [&](int dim) { return t.shape[dim] > 1 ? t.stride[dim] : span; };
  TensorLayout l;
  l.dim = {t.shape[kBatch], t.shape[kHead], t.shape[kSeq], t.shape[kHeadDim]};
  l.stride = {st(kBatch), st(kHead), st(kSeq), 1};
  return l;
}

// The pieces of one call's workspace.
struct KvScratch {
  std::size_t cudnn_ws = 0, seq_q = 0, seq_kv = 0, broken = 0, table = 0, stats = 0, total = 0;
};

KvScratch plan_scratch(const KvCacheProblem& p, i64 cudnn_ws) {
  KvScratch s;
  const std::size_t b = std::size_t(p.batch);
  std::size_t at = align_up(std::size_t(std::max<i64>(cudnn_ws, 0)));
  s.cudnn_ws = at;
  s.seq_q = at, at += align_up(b * 4);
  s.seq_kv = at, at += align_up(b * 4);
  s.broken = at, at += align_up(b * 4);
  s.table = at, at += p.paged ? align_up(b * std::size_t(p.max_pages) * 4) : 0;
  s.stats = at, at += align_up(b * std::size_t(p.heads * p.s_q) * sizeof(float));
  s.total = at;
  return s;
}

int current_device() {
  int dev = 0;
  (void)cudaGetDevice(&dev);
  return dev;
}

// The graph of `p`, built once per key (the cache), and its scratch layout.
Status prepare(const KvCacheProblem& p, GraphKey* key, std::shared_ptr<const GraphHandle>* graph, KvScratch* sc) {
  std::string why;
  auto band = band_for(selection_problem(p), &why);
  if (!band) return Status(StatusCode::unsupported, "cudnn: mask_alignment: " + why);
  *key = make_kv_key(p, *band, current_device());
  PrepareResult r;
  *graph = prepare_handle(*key, &r);
  if (!*graph)
    return Status(StatusCode::backend_error, "cudnn: cuDNN refused the KV-cache graph at " + r.stage + ": " +
                                                 r.message +
                                                 " (no static support rule caught this problem; the rule that should "
                                                 "have caught it: kv_cache_cudnn)");
  *sc = plan_scratch(p, r.workspace_bytes);
  return Status::Ok();
}

}  // namespace

GraphKey make_kv_key(const KvCacheProblem& p, const Band& band, int device) {
  const KvCacheArgs& a = p.args;
  GraphKey k;
  k.device = device;
  k.dtype = p.dtype;
  k.q = layout_of(a.q, p.batch, p.s_q, false);
  k.o = layout_of(a.o, p.batch, p.s_q, false);
  if (p.paged) {
    k.k = page_layout(a.k_cache);
    k.v = page_layout(a.v_cache);
  } else {
    k.k = layout_of(a.k_cache, p.batch, p.capacity, false);
    k.v = layout_of(a.v_cache, p.batch, p.capacity, false);
  }
  k.stats = true;  // the row fix-up reads them, and they are the LSE
  k.kv = true;
  k.paged = p.paged;
  k.table_pages = p.paged ? p.max_pages : 0;
  k.max_seq_kv = p.paged ? p.capacity : 0;
  k.band = band;
  k.scale = p.scale;
  return k;
}

Status kv_workspace_size(const KvCacheProblem& p, std::size_t* bytes) {
  GraphKey key;
  std::shared_ptr<const GraphHandle> graph;
  KvScratch sc;
  if (Status s = prepare(p, &key, &graph, &sc); !s.ok()) return s;
  *bytes = sc.total;
  return Status::Ok();
}

Status kv_forward(const KvCacheProblem& p) {
  GraphKey key;
  std::shared_ptr<const GraphHandle> graph;
  KvScratch sc;
  if (Status s = prepare(p, &key, &graph, &sc); !s.ok()) return s;
  const KvCacheArgs& a = p.args;
  const auto stream = static_cast<cudaStream_t>(a.stream);
  std::byte* base = nullptr;
  bool owned = false;
  if (a.workspace != nullptr) {
    if (a.workspace_bytes < sc.total)
      return Status(StatusCode::invalid_argument, "cudnn: workspace of " + std::to_string(a.workspace_bytes) +
                                                      " bytes is too small; this call needs " +
                                                      std::to_string(sc.total) + " (see workspace_size)");
    base = static_cast<std::byte*>(a.workspace);
  } else {
    void* ptr = nullptr;
    if (cudaError_t e = stream_workspace_alloc(&ptr, sc.total, stream); e != cudaSuccess)
      return Status(StatusCode::backend_error, std::string("cudnn: allocating the workspace (") +
                                                   std::to_string(sc.total) + " bytes): " + cudaGetErrorString(e));
    base = static_cast<std::byte*>(ptr);
    owned = true;
  }
  auto run = [&]() -> std::string {
    // The new tokens into the caches first (the `cuda` backend's append kernel; stream order).
    if (Status s = cuda_impl::run_append(p, stream); !s.ok()) return s.message();
    KvFix f;
    f.cache_seqlens = a.cache_seqlens;
    f.seqlens_q = a.seqlens_q;
    f.block_table = a.block_table.data;
    f.bt_b = a.block_table.stride[0];
    f.bt_p = a.block_table.stride[1];
    f.batch = p.batch, f.s_q = p.s_q, f.heads = p.heads, f.d_v = p.d_v, f.s_new = p.s_new;
    f.capacity = p.capacity;
    f.page_size = p.paged ? p.page_size : 0;
    f.num_pages = p.num_pages;
    f.max_pages = p.max_pages;
    f.mask_kind = static_cast<int>(a.options.mask);
    f.window_left = a.options.window.left;
    f.window_right = a.options.window.right;
    f.seq_q = reinterpret_cast<std::int32_t*>(base + sc.seq_q);
    f.seq_kv = reinterpret_cast<std::int32_t*>(base + sc.seq_kv);
    f.broken = reinterpret_cast<std::int32_t*>(base + sc.broken);
    f.table = p.paged ? reinterpret_cast<std::int32_t*>(base + sc.table) : nullptr;
    float* stats = reinterpret_cast<float*>(base + sc.stats);
    f.stats = stats;
    f.o = a.o.data;
    f.o_st = {a.o.stride[kBatch], a.o.stride[kSeq], a.o.stride[kHead],
              a.o.shape[kHeadDim] > 1 ? a.o.stride[kHeadDim] : 1};
    f.bf16 = p.dtype == DType::bf16;
    f.lse = a.lse.data;
    f.lse_b = a.lse.stride[0], f.lse_h = a.lse.stride[1], f.lse_s = a.lse.stride[2];
    if (auto e = kv_prepare(f, stream); !e.empty()) return e;
    GraphPointers ptrs;
    ptrs.q = a.q.data;
    ptrs.k = a.k_cache.data;
    ptrs.v = a.v_cache.data;
    ptrs.o = a.o.data;
    ptrs.stats = stats;
    ptrs.seq_len_q = f.seq_q;
    ptrs.seq_len_kv = f.seq_kv;
    ptrs.page_table_k = f.table;
    ptrs.page_table_v = f.table;
    ptrs.workspace = sc.cudnn_ws ? base : nullptr;
    if (auto e = execute(*graph, ptrs, stream); !e.empty()) return "executing the KV-cache graph: " + e;
    return kv_finish(f, stream);
  };
  const std::string err = run();
  if (owned) (void)cudaFreeAsync(base, stream);
  if (!err.empty()) return Status(StatusCode::backend_error, "cudnn: " + err);
  return Status::Ok();
}

}  // namespace strideattn::detail::cudnn
