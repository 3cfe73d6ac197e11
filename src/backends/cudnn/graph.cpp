// The one translation unit that includes the cuDNN frontend: builds SDPA forward/backward
// graphs from a GraphKey (real dims and strides; KV-cache forwards with their page tables),
// keeps them in a bounded per-device cache (least recently used entry evicted when full;
// failed builds are cached too), and executes them, by key or through a handle a plan holds
// (no lookup per run). Never prints (the frontend's own logging, which CUDNN_FRONTEND_LOG_INFO
// would turn on, is compiled out) and never lets an exception escape.
#define CUDNN_FRONTEND_SKIP_JSON_LIB 1
#define NV_CUDNN_FRONTEND_DISABLE_LOGGING 1
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cudnn_frontend.h>

#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backends/cudnn/graph.hpp"

namespace strideattn::detail::cudnn {

namespace fe = cudnn_frontend;
using fe::graph::Tensor_attributes;

namespace {

// Tensor uids in the variant pack.
enum Uid : std::int64_t {
  kUidQ = 1,
  kUidK,
  kUidV,
  kUidO,
  kUidStats,
  kUidDO,
  kUidDQ,
  kUidDK,
  kUidDV,
  kUidSeqQ,
  kUidSeqKV,
  kUidRagged0,  // + RaggedSlot
  kUidPageTableK = kUidRagged0 + 8,
  kUidPageTableV,
  kUidBias,
  kUidDBias,
  kUidSink,
  kUidDSink,
  kUidEnd,
};

std::vector<std::int64_t> vec(const std::array<std::int64_t, 4>& a) { return {a.begin(), a.end()}; }

}  // namespace

// A built graph with what a run needs beside it: its device's cuDNN handle and, once known, the
// order in which the graph takes its tensors (a run then passes a pointer array, no map).
struct GraphHandle {
  std::shared_ptr<fe::graph::Graph> graph;
  cudnnHandle_t handle = nullptr;
  bool backward = false, stats = false, varlen = false, kv = false, paged = false, bias = false, dbias = false;
  bool sinks = false, d_sinks = false;
  mutable std::vector<std::int64_t> sorted_uids;  // empty until the first run fills it (under the run lock)
};

namespace {

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // null when the build failed
  PrepareResult result;
  std::shared_ptr<GraphHandle> handle;  // the graph with its device's cuDNN handle
};

// Runs of graphs share each device's cuDNN handle (cudnnSetStream, then execute): one at a time.
std::mutex& run_mutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

// The cache: one map for all devices (the device is part of the key), LRU order in a list,
// one cuDNN handle per device. Handles live for the process: destroying them at exit can run
// after the CUDA runtime has shut down.
class Cache {
 public:
  static Cache& instance() {
    static Cache* cache = new Cache();  // never destroyed, see above
    return *cache;
  }

  std::mutex mu;

  cudnnHandle_t handle(int device, std::string* error) {
    auto it = handles_.find(device);
    if (it != handles_.end()) return it->second;
    cudnnHandle_t h = nullptr;
    cudnnStatus_t st = cudnnCreate(&h);
    if (st != CUDNN_STATUS_SUCCESS) {
      *error = std::string("cudnnCreate failed: ") + cudnnGetErrorString(st);
      return nullptr;
    }
    handles_[device] = h;
    return h;
  }

  Entry* find(const GraphKey& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second.second);  // most recently used first
    return &it->second.first;
  }

  Entry* insert(const GraphKey& key, Entry entry) {
    while (map_.size() >= kCacheCapacity && !lru_.empty()) {
      map_.erase(lru_.back());
      lru_.pop_back();
    }
    lru_.push_front(key);
    auto [it, inserted] = map_.emplace(key, std::make_pair(std::move(entry), lru_.begin()));
    (void)inserted;
    return &it->second.first;
  }

  std::size_t size() const { return map_.size(); }

 private:
  std::unordered_map<int, cudnnHandle_t> handles_;
  std::list<GraphKey> lru_;
  std::unordered_map<GraphKey, std::pair<Entry, std::list<GraphKey>::iterator>, GraphKeyHash> map_;
};

fe::DataType_t io_type(DType d) { return d == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF; }

std::shared_ptr<Tensor_attributes> make_tensor(fe::graph::Graph& g, const char* name, std::int64_t uid,
                                               const TensorLayout& t) {
  return g.tensor(Tensor_attributes().set_name(name).set_uid(uid).set_dim(vec(t.dim)).set_stride(vec(t.stride)));
}

std::shared_ptr<Tensor_attributes> index_tensor(fe::graph::Graph& g, const char* name, std::int64_t uid,
                                                std::int64_t n) {
  return g.tensor(Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

template <class Attrs>
void apply_band(Attrs& attrs, const Band& band) {
  if (!band.has_left && !band.has_right) return;
  attrs.set_diagonal_alignment(band.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                 : fe::DiagonalAlignment_t::TOP_LEFT);
  if (band.has_right) attrs.set_diagonal_band_right_bound(static_cast<int>(band.right_bound));
  if (band.has_left) attrs.set_diagonal_band_left_bound(static_cast<int>(band.left_bound));
}

// Builds the graph; on failure fills stage/message.
std::shared_ptr<fe::graph::Graph> build(const GraphKey& key, cudnnHandle_t handle, PrepareResult* r) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io_type(key.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);

  const std::int64_t b = key.q.dim[0], h = key.q.dim[1], s_q = key.q.dim[2];
  auto Q = make_tensor(*g, "Q", kUidQ, key.q);
  auto K = make_tensor(*g, "K", kUidK, key.k);
  auto V = make_tensor(*g, "V", kUidV, key.v);

  std::shared_ptr<Tensor_attributes> seq_q, seq_kv;
  auto ragged = [&](RaggedSlot slot, const char* name) {
    return index_tensor(*g, name, std::int64_t(kUidRagged0) + std::int64_t(slot), b + 1);
  };
  if (key.varlen || key.kv) {
    seq_q = index_tensor(*g, "seq_len_q", kUidSeqQ, b);
    seq_kv = index_tensor(*g, "seq_len_kv", kUidSeqKV, b);
  }
  if (key.varlen) {
    Q->set_ragged_offset(ragged(kRagQ, "ragged_q"));
    K->set_ragged_offset(ragged(kRagK, "ragged_k"));
    V->set_ragged_offset(ragged(kRagV, "ragged_v"));
  }
  auto page_table = [&](const char* name, std::int64_t uid) {
    return g->tensor(Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({b, 1, key.table_pages, 1})
                         .set_stride({key.table_pages, key.table_pages, 1, 1})
                         .set_data_type(fe::DataType_t::INT32));
  };
  const std::vector<std::int64_t> stats_dim{b, h, s_q, 1}, stats_stride{h * s_q, s_q, 1, 1};
  std::shared_ptr<Tensor_attributes> bias;
  if (key.bias) {
    bias = make_tensor(*g, "Bias", kUidBias, key.bias_layout);
    bias->set_data_type(io_type(key.bias_dtype));
  }
  auto sink_tensor = [&](const char* name, std::int64_t uid) {
    return g->tensor(Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({1, h, 1, 1})
                         .set_stride({h, 1, 1, 1})
                         .set_data_type(fe::DataType_t::FLOAT));
  };
  std::shared_ptr<Tensor_attributes> sink;
  if (key.sinks) sink = sink_tensor("sink", kUidSink);

  if (!key.backward) {
    auto attrs = fe::graph::SDPA_attributes()
                     .set_name("strideattn_sdpa_fwd")
                     .set_generate_stats(key.stats)
                     .set_attn_scale(static_cast<float>(key.scale));
    if (key.varlen || key.kv) attrs.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
    if (key.paged)
      attrs.set_paged_attention_k_table(page_table("page_table_k", kUidPageTableK))
          .set_paged_attention_v_table(page_table("page_table_v", kUidPageTableV))
          .set_paged_attention_max_seq_len_kv(static_cast<int>(key.max_seq_kv));
    if (bias) attrs.set_bias(bias);
    if (sink) attrs.set_sink_token(sink);
    apply_band(attrs, key.band);
    auto [O, Stats] = g->sdpa(Q, K, V, attrs);
    O->set_output(true).set_uid(kUidO).set_dim(vec(key.o.dim)).set_stride(vec(key.o.stride));
    if (key.varlen) O->set_ragged_offset(ragged(kRagO, "ragged_o"));
    if (key.stats && Stats)
      Stats->set_output(true)
          .set_uid(kUidStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim(stats_dim)
          .set_stride(stats_stride);
  } else {
    auto O = make_tensor(*g, "O", kUidO, key.o);
    auto dO = make_tensor(*g, "dO", kUidDO, key.d_o);
    auto Stats = g->tensor(Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kUidStats)
                               .set_dim(stats_dim)
                               .set_stride(stats_stride)
                               .set_data_type(fe::DataType_t::FLOAT));
    if (key.varlen) {
      O->set_ragged_offset(ragged(kRagO, "ragged_o"));
      dO->set_ragged_offset(ragged(kRagDO, "ragged_do"));
    }
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("strideattn_sdpa_bwd")
                     .set_attn_scale(static_cast<float>(key.scale))
                     .set_deterministic_algorithm(key.deterministic);
    if (key.varlen) attrs.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
    std::shared_ptr<Tensor_attributes> dBias;
    if (bias) attrs.set_bias(bias);
    if (key.dbias) {
      dBias = make_tensor(*g, "dBias", kUidDBias, key.dbias_layout);
      dBias->set_data_type(io_type(key.bias_dtype));
      attrs.set_dbias(dBias);
    }
    std::shared_ptr<Tensor_attributes> dSink;
    if (sink) attrs.set_sink_token(sink);
    if (key.d_sinks) {
      dSink = sink_tensor("dsink", kUidDSink);
      attrs.set_dsink_token(dSink);
    }
    apply_band(attrs, key.band);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, attrs);
    if (dBias) dBias->set_output(true);
    if (dSink) dSink->set_output(true);
    dQ->set_output(true).set_uid(kUidDQ).set_dim(vec(key.dq.dim)).set_stride(vec(key.dq.stride));
    dK->set_output(true).set_uid(kUidDK).set_dim(vec(key.dk.dim)).set_stride(vec(key.dk.stride));
    dV->set_output(true).set_uid(kUidDV).set_dim(vec(key.dv.dim)).set_stride(vec(key.dv.stride));
    if (key.varlen) {
      dQ->set_ragged_offset(ragged(kRagDQ, "ragged_dq"));
      dK->set_ragged_offset(ragged(kRagDK, "ragged_dk"));
      dV->set_ragged_offset(ragged(kRagDV, "ragged_dv"));
    }
  }

  auto step = [&](const char* stage, fe::error_t err) {
    if (err.is_good()) return true;
    r->stage = stage;
    r->message = err.get_message();
    if (r->message.empty()) r->message = "error code " + std::to_string(int(err.get_code()));
    return false;
  };
  if (!step("validate", g->validate())) return nullptr;
  if (!step("build_operation_graph", g->build_operation_graph(handle))) return nullptr;
  if (!step("create_execution_plans", g->create_execution_plans({fe::HeurMode_t::A}))) return nullptr;
  if (!step("check_support", g->check_support(handle))) return nullptr;
  if (!step("build_plans", g->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE))) return nullptr;
  std::int64_t ws = 0;
  if (!step("get_workspace_size", g->get_workspace_size(ws))) return nullptr;
  r->workspace_bytes = ws;
  r->ok = true;
  return g;
}

}  // namespace

std::size_t GraphKeyHash::operator()(const GraphKey& k) const {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
  auto mix = [&](std::uint64_t x) {
    h ^= x;
    h *= 1099511628211ull;
  };
  auto mix_layout = [&](const TensorLayout& t) {
    for (auto x : t.dim) mix(std::uint64_t(x));
    for (auto x : t.stride) mix(std::uint64_t(x));
  };
  mix(std::uint64_t(k.device));
  mix(k.backward);
  mix(std::uint64_t(k.dtype));
  for (const TensorLayout* t : {&k.q, &k.k, &k.v, &k.o, &k.d_o, &k.dq, &k.dk, &k.dv}) mix_layout(*t);
  mix(k.stats);
  mix(k.varlen);
  mix(k.kv);
  mix(k.paged);
  mix(std::uint64_t(k.table_pages));
  mix(std::uint64_t(k.max_seq_kv));
  mix(k.band.bottom_right);
  mix(k.band.has_left);
  mix(k.band.has_right);
  mix(std::uint64_t(k.band.left_bound));
  mix(std::uint64_t(k.band.right_bound));
  std::uint64_t scale_bits = 0;
  static_assert(sizeof(scale_bits) == sizeof(k.scale));
  std::memcpy(&scale_bits, &k.scale, sizeof(scale_bits));
  mix(scale_bits);
  mix(k.deterministic);
  mix(k.bias);
  mix(k.dbias);
  mix(std::uint64_t(k.bias_dtype));
  mix_layout(k.bias_layout);
  mix_layout(k.dbias_layout);
  mix(k.sinks);
  mix(k.d_sinks);
  return static_cast<std::size_t>(h);
}

PrepareResult prepare(const GraphKey& key) {
  try {
    Cache& cache = Cache::instance();
    std::lock_guard<std::mutex> lock(cache.mu);
    if (Entry* e = cache.find(key)) return e->result;
    PrepareResult r;
    std::string error;
    cudnnHandle_t handle = cache.handle(key.device, &error);
    if (!handle) {
      r.stage = "cudnnCreate";
      r.message = error;
      return r;  // not cached: the next call may succeed
    }
    Entry entry;
    entry.graph = build(key, handle, &r);
    entry.result = r;
    if (entry.graph) {
      entry.handle = std::make_shared<GraphHandle>();
      entry.handle->graph = entry.graph;
      entry.handle->handle = handle;
      entry.handle->backward = key.backward;
      entry.handle->stats = key.stats;
      entry.handle->varlen = key.varlen;
      entry.handle->kv = key.kv;
      entry.handle->paged = key.paged;
      entry.handle->bias = key.bias;
      entry.handle->dbias = key.dbias;
      entry.handle->sinks = key.sinks;
      entry.handle->d_sinks = key.d_sinks;
    }
    cache.insert(key, std::move(entry));
    return r;
  } catch (const std::exception& e) {
    PrepareResult r;
    r.stage = "graph construction";
    r.message = std::string("exception from the cuDNN frontend: ") + e.what();
    return r;
  }
}

std::string execute(const GraphKey& key, const GraphPointers& p, void* stream) {
  std::shared_ptr<const GraphHandle> handle;
  try {
    Cache& cache = Cache::instance();
    std::lock_guard<std::mutex> lock(cache.mu);
    Entry* e = cache.find(key);
    if (!e || !e->handle) return "no graph was built for this problem (prepare() failed or was evicted)";
    handle = e->handle;
  } catch (const std::exception& ex) {
    return std::string("exception from the cuDNN frontend: ") + ex.what();
  }
  return execute(*handle, p, stream);
}

std::shared_ptr<const GraphHandle> prepare_handle(const GraphKey& key, PrepareResult* result) {
  *result = prepare(key);
  if (!result->ok) return nullptr;
  try {
    Cache& cache = Cache::instance();
    std::lock_guard<std::mutex> lock(cache.mu);
    Entry* e = cache.find(key);
    if (e && e->handle) return e->handle;
  } catch (const std::exception& e) {
    result->message = e.what();
  }
  result->ok = false;
  result->stage = "graph cache";
  if (result->message.empty()) result->message = "the graph was evicted from the cache while it was prepared";
  return nullptr;
}

std::string execute(const GraphHandle& g, const GraphPointers& p, void* stream) {
  try {
    // The tensors by uid, in the order of `Uid`; absent ones are not part of the graph.
    void* by_uid[kUidEnd] = {};
    by_uid[kUidQ] = const_cast<void*>(p.q);
    by_uid[kUidK] = const_cast<void*>(p.k);
    by_uid[kUidV] = const_cast<void*>(p.v);
    by_uid[kUidO] = p.o;
    by_uid[kUidStats] = p.stats;
    by_uid[kUidDO] = const_cast<void*>(p.d_o);
    by_uid[kUidDQ] = p.dq;
    by_uid[kUidDK] = p.dk;
    by_uid[kUidDV] = p.dv;
    by_uid[kUidSeqQ] = const_cast<std::int32_t*>(p.seq_len_q);
    by_uid[kUidSeqKV] = const_cast<std::int32_t*>(p.seq_len_kv);
    for (int s = 0; s < 8; ++s) by_uid[kUidRagged0 + s] = const_cast<std::int32_t*>(p.ragged[std::size_t(s)]);
    by_uid[kUidPageTableK] = const_cast<std::int32_t*>(p.page_table_k);
    by_uid[kUidPageTableV] = const_cast<std::int32_t*>(p.page_table_v);
    by_uid[kUidBias] = const_cast<void*>(p.bias);
    by_uid[kUidDBias] = p.dbias;
    by_uid[kUidSink] = const_cast<float*>(p.sinks);
    by_uid[kUidDSink] = p.d_sinks;
    std::lock_guard<std::mutex> lock(run_mutex());
    cudnnStatus_t st = cudnnSetStream(g.handle, static_cast<cudaStream_t>(stream));
    if (st != CUDNN_STATUS_SUCCESS) return std::string("cudnnSetStream: ") + cudnnGetErrorString(st);
    fe::error_t err;
    if (!g.sorted_uids.empty()) {
      void* sorted[kUidEnd];
      const int n = int(g.sorted_uids.size());
      for (int i = 0; i < n; ++i) sorted[i] = by_uid[g.sorted_uids[std::size_t(i)]];
      err = g.graph->execute(g.handle, sorted, n, p.workspace);
    } else {
      // First run: by uid map, after which the graph knows its order (kept for the next runs).
      std::unordered_map<std::int64_t, void*> pack;
      pack[kUidQ] = by_uid[kUidQ], pack[kUidK] = by_uid[kUidK], pack[kUidV] = by_uid[kUidV];
      pack[kUidO] = by_uid[kUidO];
      if (g.backward || g.stats) pack[kUidStats] = by_uid[kUidStats];
      if (g.backward)
        for (std::int64_t u : {kUidDO, kUidDQ, kUidDK, kUidDV}) pack[u] = by_uid[u];
      if (g.kv) pack[kUidSeqQ] = by_uid[kUidSeqQ], pack[kUidSeqKV] = by_uid[kUidSeqKV];
      if (g.bias) pack[kUidBias] = by_uid[kUidBias];
      if (g.dbias) pack[kUidDBias] = by_uid[kUidDBias];
      if (g.sinks) pack[kUidSink] = by_uid[kUidSink];
      if (g.d_sinks) pack[kUidDSink] = by_uid[kUidDSink];
      if (g.paged) pack[kUidPageTableK] = by_uid[kUidPageTableK], pack[kUidPageTableV] = by_uid[kUidPageTableV];
      if (g.varlen) {
        pack[kUidSeqQ] = by_uid[kUidSeqQ], pack[kUidSeqKV] = by_uid[kUidSeqKV];
        for (int s = 0; s < (g.backward ? 8 : 4); ++s) pack[kUidRagged0 + s] = by_uid[kUidRagged0 + s];
      }
      err = g.graph->execute(g.handle, pack, p.workspace);
      if (err.is_good()) {
        std::vector<std::int64_t> uids = g.graph->get_variant_pack_uids_sorted();
        bool known = uids.size() <= std::size_t(kUidEnd);
        for (std::int64_t u : uids) known = known && u > 0 && u < kUidEnd && pack.count(u);
        if (known) g.sorted_uids = std::move(uids);
      }
    }
    if (err.is_bad()) {
      std::string msg = err.get_message();
      return msg.empty() ? "execute failed with error code " + std::to_string(int(err.get_code())) : msg;
    }
    return {};
  } catch (const std::exception& ex) {
    return std::string("exception from the cuDNN frontend: ") + ex.what();
  }
}

std::int64_t runtime_version() {
  try {
    return static_cast<std::int64_t>(cudnnGetVersion());
  } catch (...) {
    return 0;
  }
}

std::size_t cache_entries() {
  Cache& cache = Cache::instance();
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.size();
}

}  // namespace strideattn::detail::cudnn
