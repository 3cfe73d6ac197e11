// The `cudnn` backend: turns a validated Problem into a cuDNN graph key (every tensor's real
// dims and strides, permuted from our [b, s, h, d] views to cuDNN's [b, h, s, d]), runs the
// cached graph, and writes what cuDNN leaves alone (varlen padding tokens, LSE in layouts
// cuDNN cannot write directly). Support is the flat rule list of rules.cpp plus a last rule,
// "cudnn_graph": cuDNN itself accepts the graph (its message is the reason when not). A plan's
// preparation (CudnnCall) finds the graph and lays out the workspace once; a run binds
// pointers, builds the varlen tables (uploaded from the host lists, or made on the device from
// cu_seqlens arrays: cu_seqlens.hpp) and enqueues the graph and its fix-ups. KV-cache calls go
// to kvcache.hpp.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cudnn/cu_seqlens.hpp"
#include "backends/cudnn/fixup.hpp"
#include "backends/cudnn/graph.hpp"
#include "backends/cudnn/kvcache.hpp"
#include "backends/cudnn/nonfinite.hpp"
#include "backends/cudnn/rules.hpp"
#include "backends/stream_workspace.hpp"
#include "dispatch/backend.hpp"
#include "problem/params.hpp"

namespace strideattn::detail {

namespace cudnn {
namespace {

// Stride to give a size-1 dimension: its stride is never used, so any value is correct; we
// pick the span of the other dimensions so cuDNN sees a plausible, aligned layout.
std::int64_t span_of(const Dims4& shape, const Dims4& stride) {
  std::int64_t span = 1;
  for (int i = 0; i < 4; ++i)
    if (shape[i] > 1) span = std::max(span, shape[i] * stride[i]);
  return span;
}

}  // namespace

// Our [b, s, h, d] view -> cuDNN [b, h, s, d]; varlen views are [1, tokens, h, d] and become
// [batch, h, s_max, d] with per-sequence ragged offsets.
TensorLayout layout_of(const TensorView& t, std::int64_t batch, std::int64_t s, bool varlen) {
  TensorLayout l;
  const std::int64_t span = span_of(t.shape, t.stride);
  auto st = [&](int dim) { return t.shape[dim] > 1 ? t.stride[dim] : span; };
  l.dim = {batch, t.shape[kHead], s, t.shape[kHeadDim]};
  // Varlen: the seq stride also scales the ragged offsets; a single-token view may carry any
  // stride there, and then no offset other than 0 exists.
  const std::int64_t s_stride = st(kSeq);
  const std::int64_t b_stride = varlen ? s_stride * std::max<std::int64_t>(s, 1) : st(kBatch);
  l.stride = {b_stride, st(kHead), s_stride, 1};
  return l;
}

namespace {

bool lse_is_packed(const Problem& p) {
  if (p.varlen || !(p.is_backward() || p.writes_lse())) return false;
  const auto& st = p.lse.stride;
  const std::int64_t h = p.heads, s = p.s_q;
  return (s <= 1 || st[2] == 1) && (h <= 1 || st[1] == s) && (p.batch <= 1 || st[0] == h * s);
}

GraphKey make_key(const Problem& p, const Band& band, int device) {
  GraphKey k;
  k.device = device;
  k.backward = p.is_backward();
  k.dtype = p.dtype;
  k.q = layout_of(p.q, p.batch, p.s_q, p.varlen);
  k.k = layout_of(p.k, p.batch, p.s_kv, p.varlen);
  k.v = layout_of(p.v, p.batch, p.s_kv, p.varlen);
  k.o = layout_of(p.o, p.batch, p.s_q, p.varlen);
  if (k.backward) {
    k.d_o = layout_of(p.d_o, p.batch, p.s_q, p.varlen);
    k.dq = layout_of(p.dq, p.batch, p.s_q, p.varlen);
    k.dk = layout_of(p.dk, p.batch, p.s_kv, p.varlen);
    k.dv = layout_of(p.dv, p.batch, p.s_kv, p.varlen);
  }
  // The non-finite fix-up reads the stats of every forward (nonfinite.hpp).
  k.stats = true;  // the non-finite fix-up reads the stats of every forward
  k.varlen = p.varlen;
  k.band = band;
  k.scale = p.scale;
  k.deterministic = k.backward && p.deterministic;
  if (p.bias_on()) {  // (post_scale: the bias rule refuses the rest)
    k.bias = true;
    k.bias_dtype = p.bias.dtype;
    k.bias_layout = bias_layout_of(p.bias);
    k.dbias = k.backward && p.dbias_on;
    if (k.dbias) k.dbias_layout = bias_layout_of(p.dbias);
  }
  k.sinks = p.sinks_on;  // (dense, contiguous: the sinks rule)
  k.d_sinks = k.backward && p.d_sinks_on;
  return k;
}

int current_device() {
  int dev = 0;
  cudaGetDevice(&dev);
  return dev;
}

// The rule cuDNN's refusal most likely belongs to, for the message when no static rule caught
// it (a missing rule is a bug to report).
std::string nearest_rule(const Problem& p) {
  if (p.varlen) return "varlen_version";
  if (!p.window.unbounded() || p.mask != MaskKind::none) return "band_version";
  if (p.is_backward() && (p.d_qk > 128 || p.d_v > 128)) return "head_dim";
  if (p.d_qk != p.d_v) return "head_dim";
  return "alignment";
}

std::string graph_failure(const Problem& p, const PrepareResult& r) {
  return "cuDNN refused the " + std::string(to_string(p.direction)) + " graph at " + r.stage + ": " + r.message +
         " (no static support rule caught this problem; the rule that should "
         "have caught it: " +
         nearest_rule(p) + ")";
}

// ------------------------------------------------------------------ scratch memory

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Everything one call needs beside the caller's tensors: cuDNN's workspace, the int32 tables
// cuDNN reads (seq lens, ragged offsets), the int64 tables of the fix-up kernels, the packed
// stats when the caller's LSE cannot be used directly (or the caller wants none), and the
// non-finite backward fix-up's flags. Laid out in one allocation. Varlen lists: the tables
// are built here once and uploaded by each run; cu_seqlens arrays: the tables area is what
// cu_seqlens.hpp's kernels fill on the device.
struct Scratch {
  std::size_t cudnn_ws = 0, tables = 0, stats = 0, nonfinite = 0, total = 0;
  bool cu = false;                     // cu_seqlens: tables made on the device
  std::vector<std::byte> host_tables;  // uploaded to [tables, tables + size)
  // byte offsets within host_tables
  std::size_t seq_q = 0, seq_kv = 0, ragged = 0, lens64 = 0, offs64 = 0, q_pad = 0, kv_pad = 0;
  std::size_t lens64_kv = 0, offs64_kv = 0;
  std::int64_t n_q_pad = 0, n_kv_pad = 0;
  bool temp_stats = false;
};

template <class T>
std::size_t append(std::vector<std::byte>* buf, const std::vector<T>& v) {
  const std::size_t at = align_up(buf->size());
  buf->resize(at + v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(buf->data() + at, v.data(), v.size() * sizeof(T));
  return at;
}

// Tokens of a [1, tokens, ...] view that cuDNN does not write: gaps between sequences, and
// the tokens of sequences whose own length is given to cuDNN as 0.
std::vector<std::int64_t> unowned_tokens(std::int64_t tokens, const std::vector<std::int64_t>& offs,
                                         const std::vector<std::int32_t>& lens) {
  std::vector<char> owned(std::size_t(std::max<std::int64_t>(tokens, 0)), 0);
  for (std::size_t b = 0; b < offs.size(); ++b)
    for (std::int64_t t = offs[b]; t < offs[b] + lens[b] && t < tokens; ++t) owned[std::size_t(t)] = 1;
  std::vector<std::int64_t> out;
  for (std::int64_t t = 0; t < tokens; ++t)
    if (!owned[std::size_t(t)]) out.push_back(t);
  return out;
}

Scratch plan_scratch(const Problem& p, std::int64_t cudnn_ws) {
  Scratch s;
  s.cudnn_ws = align_up(std::size_t(std::max<std::int64_t>(cudnn_ws, 0)));
  s.temp_stats = !lse_is_packed(p);  // the forward always has stats: the fix-up reads them
  if (p.cu_seqlens) {
    s.cu = true;
    s.tables = align_up(cu_seqlens_bytes(p.batch, p.q_tokens(), p.kv_tokens(), p.is_backward() ? 8 : 4));
  } else if (p.varlen) {
    // Lengths cuDNN sees: a sequence with no keys gets 0 queries too (its rows are written
    // here as O = 0, LSE = -inf, dQ = 0); a sequence with no queries keeps its keys but its
    // dK/dV rows are zeroed here (cuDNN has no row to visit them from).
    std::vector<std::int32_t> lq(std::size_t(p.batch)), lkv(std::size_t(p.batch));
    std::vector<std::int32_t> kv_owned(std::size_t(p.batch));
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const std::size_t i = std::size_t(b);
      lkv[i] = std::int32_t(p.seqlens_kv[i]);
      lq[i] = p.seqlens_kv[i] == 0 ? 0 : std::int32_t(p.seqlens_q[i]);
      kv_owned[i] = lq[i] == 0 && p.is_backward() ? 0 : lkv[i];
    }
    s.seq_q = append(&s.host_tables, lq);
    s.seq_kv = append(&s.host_tables, lkv);
    // Ragged element offsets per tensor: offsets[b] * seq stride, plus the end.
    std::vector<std::int32_t> ragged;
    auto add = [&](const TensorView& t, const std::vector<std::int64_t>& offs, const std::vector<std::int32_t>& lens) {
      const std::int64_t seq_stride = t.shape[kSeq] > 1 ? t.stride[kSeq] : 0;
      for (std::int64_t b = 0; b < p.batch; ++b) ragged.push_back(std::int32_t(offs[std::size_t(b)] * seq_stride));
      std::int64_t end = 0;
      for (std::int64_t b = 0; b < p.batch; ++b) end = std::max(end, offs[std::size_t(b)] + lens[std::size_t(b)]);
      ragged.push_back(std::int32_t(end * seq_stride));
    };
    add(p.q, p.offsets_q, lq);
    add(p.k, p.offsets_kv, lkv);
    add(p.v, p.offsets_kv, lkv);
    add(p.o, p.offsets_q, lq);
    if (p.is_backward()) {
      add(p.d_o, p.offsets_q, lq);
      add(p.dq, p.offsets_q, lq);
      add(p.dk, p.offsets_kv, lkv);
      add(p.dv, p.offsets_kv, lkv);
    }
    s.ragged = append(&s.host_tables, ragged);
    s.lens64 = append(&s.host_tables, std::vector<std::int64_t>(lq.begin(), lq.end()));
    s.offs64 = append(&s.host_tables, std::vector<std::int64_t>(p.offsets_q));
    s.lens64_kv = append(&s.host_tables, std::vector<std::int64_t>(lkv.begin(), lkv.end()));
    s.offs64_kv = append(&s.host_tables, std::vector<std::int64_t>(p.offsets_kv));
    auto qpad = unowned_tokens(p.q_tokens(), p.offsets_q, lq);
    auto kvpad = unowned_tokens(p.kv_tokens(), p.offsets_kv, kv_owned);
    s.n_q_pad = std::int64_t(qpad.size());
    s.n_kv_pad = std::int64_t(kvpad.size());
    s.q_pad = append(&s.host_tables, qpad);
    s.kv_pad = append(&s.host_tables, kvpad);
  }
  if (!s.cu) s.tables = align_up(s.host_tables.size());
  if (s.temp_stats) s.stats = align_up(std::size_t(p.batch * p.heads * p.s_q) * sizeof(float));
  if (p.is_backward()) s.nonfinite = align_up(nonfinite_backward_scratch(make_params(p)));
  s.total = s.cudnn_ws + s.tables + s.stats + s.nonfinite;
  return s;
}

std::string cuda_error(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

// The support rules of this device (queried once) and the last rule, cuDNN's own acceptance of
// the graph; built once, not per call.
const std::vector<SupportRule>& rules() {
  static const std::vector<SupportRule> list = [] {
    std::vector<SupportRule> r = support_rules(current_device_info());
    r.push_back({"cudnn_graph", [](const Problem& q) -> std::optional<std::string> {
                   std::string why;
                   auto band = band_for(q, &why);
                   if (!band) return why;
                   if (q.kv_cache != nullptr) {
                     PrepareResult res = prepare(make_kv_key(*q.kv_cache, *band, current_device()));
                     if (res.ok) return std::nullopt;
                     return "cuDNN refused the KV-cache graph at " + res.stage + ": " + res.message +
                            " (no static support rule caught this problem; the rule that should have caught it: "
                            "kv_cache_cudnn)";
                   }
                   PrepareResult res = prepare(make_key(q, *band, current_device()));
                   if (res.ok) return std::nullopt;
                   return graph_failure(q, res);
                 }});
    return r;
  }();
  return list;
}

// The varlen tables of one run, on the device: the host lists' upload, or the conversion of
// the run's cu_seqlens arrays.
struct RunTables {
  const std::int32_t* seq_q = nullptr;
  const std::int32_t* seq_kv = nullptr;
  const std::int32_t* ragged = nullptr;  // [slots][batch + 1]
  const std::int64_t* lens64 = nullptr;
  const std::int64_t* offs64 = nullptr;
  const std::int64_t* lens64_kv = nullptr;  // keys per sequence (the non-finite fix-up's mask)
  const std::int64_t* offs64_kv = nullptr;
  const std::uint8_t* q_marks = nullptr;   // cu_seqlens: tokens cuDNN writes
  const std::uint8_t* kv_marks = nullptr;  // (host lists: the token lists of Scratch)
};

std::string make_tables(const Problem& p, const Scratch& sc, std::byte* tables, cudaStream_t stream, RunTables* out) {
  if (!p.varlen) return {};
  if (!sc.cu) {
    cudaError_t e =
        cudaMemcpyAsync(tables, sc.host_tables.data(), sc.host_tables.size(), cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return cuda_error("uploading varlen tables", e);
    out->seq_q = reinterpret_cast<const std::int32_t*>(tables + sc.seq_q);
    out->seq_kv = reinterpret_cast<const std::int32_t*>(tables + sc.seq_kv);
    out->ragged = reinterpret_cast<const std::int32_t*>(tables + sc.ragged);
    out->lens64 = reinterpret_cast<const std::int64_t*>(tables + sc.lens64);
    out->offs64 = reinterpret_cast<const std::int64_t*>(tables + sc.offs64);
    out->lens64_kv = reinterpret_cast<const std::int64_t*>(tables + sc.lens64_kv);
    out->offs64_kv = reinterpret_cast<const std::int64_t*>(tables + sc.offs64_kv);
    return {};
  }
  CuSeqlensTables ct;
  ct.cu_q = p.cu_seqlens_q;
  ct.cu_kv = p.cu_seqlens_kv;
  ct.off_q = p.seq_offsets_q;
  ct.off_kv = p.seq_offsets_kv;
  ct.count = p.batch;
  ct.max_q = p.s_q;
  ct.max_kv = p.s_kv;
  ct.q_tokens = p.q_tokens();
  ct.kv_tokens = p.kv_tokens();
  ct.backward = p.is_backward();
  ct.slots = p.is_backward() ? 8 : 4;
  const TensorView* by_slot[kRaggedSlots] = {&p.q, &p.k, &p.v, &p.o, &p.d_o, &p.dq, &p.dk, &p.dv};
  for (int s = 0; s < ct.slots; ++s) ct.seq_stride[s] = by_slot[s]->shape[kSeq] > 1 ? by_slot[s]->stride[kSeq] : 0;
  cu_seqlens_layout(tables, &ct);
  if (auto e = convert_cu_seqlens(ct, stream); !e.empty()) return e;
  out->seq_q = ct.seq_q;
  out->seq_kv = ct.seq_kv;
  out->ragged = ct.ragged;
  out->lens64 = ct.lens64;
  out->offs64 = ct.offs64;
  out->lens64_kv = ct.kv_own64;  // = the keys, except for sequences with no query rows
  out->offs64_kv = ct.kv_offs64;
  out->q_marks = ct.q_marks;
  out->kv_marks = ct.kv_marks;
  return {};
}

// The elements cuDNN does not write: varlen tokens outside its sequences.
std::string write_padding(const Problem& p, const Scratch& sc, const std::byte* tables, const RunTables& rt,
                          cudaStream_t stream) {
  if (!p.varlen) return {};
  if (sc.cu) {
    auto zero = [&](const TensorView& t, const std::uint8_t* marks, std::int64_t tokens) {
      return zero_unmarked_tokens(t.data, t.stride[kSeq], t.stride[kHead], t.shape[kHead], t.shape[kHeadDim], marks,
                                  tokens, stream);
    };
    if (!p.is_backward()) {
      if (auto e = zero(p.o, rt.q_marks, p.q_tokens()); !e.empty()) return e;
      if (p.writes_lse())
        return lse_fill_unmarked_tokens(p.lse.data, p.lse.stride[1], p.lse.stride[2], p.heads, rt.q_marks, p.q_tokens(),
                                        stream);
      return {};
    }
    if (auto e = zero(p.dq, rt.q_marks, p.q_tokens()); !e.empty()) return e;
    if (auto e = zero(p.dk, rt.kv_marks, p.kv_tokens()); !e.empty()) return e;
    return zero(p.dv, rt.kv_marks, p.kv_tokens());
  }
  const auto* q_pad = reinterpret_cast<const std::int64_t*>(tables + sc.q_pad);
  const auto* kv_pad = reinterpret_cast<const std::int64_t*>(tables + sc.kv_pad);
  auto zero = [&](const TensorView& t, const std::int64_t* list, std::int64_t n) {
    return zero_tokens(t.data, t.stride[kSeq], t.stride[kHead], t.shape[kHead], t.shape[kHeadDim], list, n, stream);
  };
  if (!p.is_backward()) {
    if (auto e = zero(p.o, q_pad, sc.n_q_pad); !e.empty()) return e;
    if (p.writes_lse())
      if (auto e = lse_fill_tokens(p.lse.data, p.lse.stride[1], p.lse.stride[2], p.heads, q_pad, sc.n_q_pad, stream);
          !e.empty())
        return e;
  } else {
    if (auto e = zero(p.dq, q_pad, sc.n_q_pad); !e.empty()) return e;
    if (auto e = zero(p.dk, kv_pad, sc.n_kv_pad); !e.empty()) return e;
    if (auto e = zero(p.dv, kv_pad, sc.n_kv_pad); !e.empty()) return e;
  }
  return {};
}

// dBias of a causal problem: elements of keys no query sees are 0 by the definition, and
// cuDNN's backward skips the tiles above the diagonal, so they are cleared before the graph
// writes the rest (one 2D memset per head, or one for all when the heads are evenly pitched).
std::string zero_dbias(const Problem& p, cudaStream_t stream) {
  const BiasView& v = p.dbias;
  const std::size_t es = size_of(v.dtype);
  const std::int64_t heads = v.shape[1], rows = v.shape[2], cols = v.shape[3];
  const std::int64_t row_stride = rows > 1 ? v.stride[2] : cols;  // (rule: keys contiguous)
  const bool even = heads <= 1 || v.stride[1] == rows * row_stride;
  const std::int64_t calls = even ? 1 : heads, height = even ? heads * rows : rows;
  for (std::int64_t hh = 0; hh < calls; ++hh) {
    char* base = static_cast<char*>(v.data) + std::size_t(hh * v.stride[1]) * es;
    cudaError_t e =
        cudaMemset2DAsync(base, std::size_t(row_stride) * es, 0, std::size_t(cols) * es, std::size_t(height), stream);
    if (e != cudaSuccess) return cuda_error("clearing dbias", e);
  }
  return {};
}

std::string run_with(const Problem& p, const GraphKey& key, const GraphHandle& graph, const Scratch& sc,
                     std::byte* base, cudaStream_t stream) {
  std::byte* tables = base + sc.cudnn_ws;
  float* stats = sc.temp_stats ? reinterpret_cast<float*>(tables + sc.tables) : p.lse.data;
  RunTables rt;
  if (auto e = make_tables(p, sc, tables, stream, &rt); !e.empty()) return e;
  LseCopy copy;
  copy.user = p.lse.data;
  copy.user_stride_b = p.lse.stride[0];
  copy.user_stride_h = p.lse.stride[1];
  copy.user_stride_s = p.lse.stride[2];
  copy.packed = stats;
  copy.batch = p.batch;
  copy.heads = p.heads;
  copy.s_max = p.s_q;
  copy.lens = rt.lens64;
  copy.offsets = rt.offs64;

  if (p.is_backward() && sc.temp_stats)
    if (auto e = lse_copy(copy, /*packed_to_user=*/false, stream); !e.empty()) return e;

  GraphPointers ptrs;
  ptrs.q = p.q.data;
  ptrs.k = p.k.data;
  ptrs.v = p.v.data;
  ptrs.o = p.o.data;
  ptrs.stats = key.stats ? stats : nullptr;
  ptrs.d_o = p.d_o.data;
  ptrs.dq = p.dq.data;
  ptrs.dk = p.dk.data;
  ptrs.dv = p.dv.data;
  ptrs.bias = key.bias ? p.bias.data : nullptr;
  ptrs.dbias = key.dbias ? p.dbias.data : nullptr;
  ptrs.sinks = key.sinks ? p.sinks.data : nullptr;
  ptrs.d_sinks = key.d_sinks ? p.d_sinks.data : nullptr;
  ptrs.workspace = sc.cudnn_ws ? base : nullptr;
  if (key.dbias && p.mask != MaskKind::none)
    if (auto e = zero_dbias(p, stream); !e.empty()) return e;
  if (p.varlen) {
    ptrs.seq_len_q = rt.seq_q;
    ptrs.seq_len_kv = rt.seq_kv;
    const int slots = p.is_backward() ? 8 : 4;
    for (int i = 0; i < slots; ++i) ptrs.ragged[std::size_t(i)] = rt.ragged + i * (p.batch + 1);
  }
  if (auto e = execute(graph, ptrs, stream); !e.empty()) return "executing the graph: " + e;

  {  // NaN where the definition has it (cuDNN's answer differs on non-finite inputs)
    NonFiniteFix fix;
    fix.a = make_params(p);
    fix.bf16 = p.dtype == DType::bf16;
    fix.stats = stats;
    fix.exact = exact_recompute_limits();
    // The exact recompute (exact_backward.cuh) knows no bias or sink: with one, cuDNN's
    // gradients stand.
    if (key.bias || key.sinks) fix.exact = {INFINITY, -INFINITY, INFINITY};
    if (p.varlen) {
      fix.a.q_seq.seqlens = rt.lens64;  // cuDNN's lengths: 0 queries for a sequence with no keys
      fix.a.q_seq.offsets = rt.offs64;
      fix.a.kv_seq.seqlens = rt.lens64_kv;
      fix.a.kv_seq.offsets = rt.offs64_kv;
    }
    const std::string e = p.is_backward() ? nonfinite_backward(fix, tables + sc.tables + sc.stats, stream)
                                          : nonfinite_forward(fix, stream);
    if (!e.empty()) return e;
  }

  if (!p.is_backward() && sc.temp_stats && p.writes_lse())
    if (auto e = lse_copy(copy, /*packed_to_user=*/true, stream); !e.empty()) return e;

  return write_padding(p, sc, tables, rt, stream);
}

// A plan's preparation: the graph found once, the workspace laid out once (and for varlen
// lists the tables built once).
class CudnnCall final : public PreparedCall {
 public:
  CudnnCall(GraphKey key, std::shared_ptr<const GraphHandle> graph, Scratch sc)
      : key_(std::move(key)), graph_(std::move(graph)), sc_(std::move(sc)) {}
  [[nodiscard]] std::size_t workspace_bytes() const override { return sc_.total; }

  [[nodiscard]] Status run(const Problem& p) const override {
    // A plan run checks feature pointers against their element size only; the bias and sinks
    // rules asked 16 bytes of the plan's pointers, which the graph may rely on.
    for (auto [name, on, ptr] : {std::tuple{"bias", key_.bias, static_cast<const void*>(p.bias.data)},
                                 std::tuple{"dbias", key_.dbias, static_cast<const void*>(p.dbias.data)},
                                 std::tuple{"sinks", key_.sinks, static_cast<const void*>(p.sinks.data)},
                                 std::tuple{"d_sinks", key_.d_sinks, static_cast<const void*>(p.d_sinks.data)}})
      if (on && reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0)
        return Status(StatusCode::invalid_argument,
                      std::string("cudnn: ") + name + " data pointer is " +
                          std::to_string(reinterpret_cast<std::uintptr_t>(ptr) % 16) +
                          " bytes past a 16-byte boundary; supported: 16-byte aligned (what the plan was made for)");
    cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
    std::byte* base = nullptr;
    bool owned = false;
    if (sc_.total > 0) {
      if (p.workspace && p.workspace_bytes >= sc_.total) {
        base = static_cast<std::byte*>(p.workspace);  // (a plan refuses a smaller one)
      } else {
        // No workspace from the caller: one from the stream-ordered pool (stream_workspace.hpp),
        // freed on the stream.
        void* ptr = nullptr;
        cudaError_t e = stream_workspace_alloc(&ptr, sc_.total, stream);
        if (e != cudaSuccess)
          return Status(StatusCode::backend_error, "cudnn: " + cuda_error("allocating workspace", e) + " (" +
                                                       std::to_string(sc_.total) + " bytes)");
        base = static_cast<std::byte*>(ptr);
        owned = true;
      }
    }
    std::string err = run_with(p, key_, *graph_, sc_, base, stream);
    if (owned) cudaFreeAsync(base, stream);
    if (!err.empty()) return Status(StatusCode::backend_error, "cudnn: " + err);
    return Status::Ok();
  }

 private:
  GraphKey key_;
  std::shared_ptr<const GraphHandle> graph_;
  Scratch sc_;
};

class CudnnBackend final : public BackendImpl {
 public:
  Backend id() const override { return Backend::cudnn; }

  Verdict supports(const Problem& p) const override { return evaluate_rules(Backend::cudnn, rules(), p); }

  bool reads_cu_seqlens() const override { return true; }

  Status workspace_size(const Problem& p, std::size_t* bytes) const override {
    std::unique_ptr<const PreparedCall> call;
    if (Status s = make_call(p, &call); !s.ok()) return s;
    *bytes = call->workspace_bytes();
    return Status::Ok();
  }

  Status prepare_call(const Problem& p, std::unique_ptr<const PreparedCall>* out) override { return make_call(p, out); }

  // KV-cache attention (kvcache.hpp): the cuda backend's append, then the cached graph with
  // cuDNN's padding mask (and page tables), then the rows cuDNN leaves to us.
  bool runs_kv_cache() const override { return true; }
  Status forward_kvcache(const KvCacheProblem& p) override { return kv_forward(p); }
  Status kvcache_workspace_size(const KvCacheProblem& p, std::size_t* bytes) const override {
    return kv_workspace_size(p, bytes);
  }

  Status forward(const Problem& p) override { return run_once(p); }
  Status backward(const Problem& p) override { return run_once(p); }

 private:
  static Status make_call(const Problem& p, std::unique_ptr<const PreparedCall>* out) {
    std::string why;
    auto band = band_for(p, &why);
    if (!band) return Status(StatusCode::unsupported, "cudnn: mask_alignment: " + why);
    GraphKey key = make_key(p, *band, current_device());
    PrepareResult r;
    std::shared_ptr<const GraphHandle> graph = prepare_handle(key, &r);
    if (!graph) return Status(StatusCode::backend_error, "cudnn: " + graph_failure(p, r));
    *out = std::make_unique<CudnnCall>(std::move(key), std::move(graph), plan_scratch(p, r.workspace_bytes));
    return Status::Ok();
  }

  static Status run_once(const Problem& p) {
    std::unique_ptr<const PreparedCall> call;
    if (Status s = make_call(p, &call); !s.ok()) return s;
    return call->run(p);
  }
};

}  // namespace
}  // namespace cudnn

BackendImpl* cudnn_backend() {
  static cudnn::CudnnBackend backend;
  return &backend;
}

}  // namespace strideattn::detail
