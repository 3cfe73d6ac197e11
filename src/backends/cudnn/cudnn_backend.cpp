// The `cudnn` backend: turns a validated Problem into a cuDNN graph key (every tensor's real
// dims and strides, permuted from our [b, s, h, d] views to cuDNN's [b, h, s, d]), runs the
// cached graph, and writes what cuDNN leaves alone (varlen padding tokens, LSE in layouts
// cuDNN cannot write directly). Support is the flat rule list of rules.cpp plus a last rule,
// "cudnn_graph": cuDNN itself accepts the graph (its message is the reason when not).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cudnn/fixup.hpp"
#include "backends/cudnn/graph.hpp"
#include "backends/cudnn/nonfinite.hpp"
#include "backends/cudnn/rules.hpp"
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

bool lse_is_packed(const Problem& p) {
  if (p.varlen || !p.lse.data) return false;
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
// non-finite backward fix-up's flags. Laid out in one allocation.
struct Scratch {
  std::size_t cudnn_ws = 0, tables = 0, stats = 0, nonfinite = 0, total = 0;
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
  s.temp_stats = !lse_is_packed(p);
  if (p.varlen) {
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
  s.tables = align_up(s.host_tables.size());
  if (s.temp_stats) s.stats = align_up(std::size_t(p.batch * p.heads * p.s_q) * sizeof(float));
  if (p.is_backward()) s.nonfinite = align_up(nonfinite_backward_scratch(make_params(p)));
  s.total = s.cudnn_ws + s.tables + s.stats + s.nonfinite;
  return s;
}

std::string cuda_error(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

class CudnnBackend final : public BackendImpl {
 public:
  Backend id() const override { return Backend::cudnn; }

  Verdict supports(const Problem& p) const override {
    std::vector<SupportRule> rules = support_rules(current_device_info());
    rules.push_back({"cudnn_graph", [](const Problem& q) -> std::optional<std::string> {
                       std::string why;
                       auto band = band_for(q, &why);
                       if (!band) return why;
                       PrepareResult r = prepare(make_key(q, *band, current_device()));
                       if (r.ok) return std::nullopt;
                       return graph_failure(q, r);
                     }});
    return evaluate_rules(Backend::cudnn, rules, p);
  }

  Status workspace_size(const Problem& p, std::size_t* bytes) const override {
    std::int64_t ws = 0;
    if (Status s = prepared(p, nullptr, &ws); !s.ok()) return s;
    *bytes = plan_scratch(p, ws).total;
    return Status::Ok();
  }

  Status forward(const Problem& p) override { return run(p); }
  Status backward(const Problem& p) override { return run(p); }

 private:
  static Status prepared(const Problem& p, GraphKey* key_out, std::int64_t* ws) {
    std::string why;
    auto band = band_for(p, &why);
    if (!band) return Status(StatusCode::unsupported, "cudnn: mask_alignment: " + why);
    GraphKey key = make_key(p, *band, current_device());
    PrepareResult r = prepare(key);
    if (!r.ok) return Status(StatusCode::backend_error, "cudnn: " + graph_failure(p, r));
    if (key_out) *key_out = key;
    *ws = r.workspace_bytes;
    return Status::Ok();
  }

  static Status run(const Problem& p) {
    GraphKey key;
    std::int64_t ws = 0;
    if (Status s = prepared(p, &key, &ws); !s.ok()) return s;
    Scratch sc = plan_scratch(p, ws);
    cudaStream_t stream = static_cast<cudaStream_t>(p.stream);

    std::byte* base = nullptr;
    bool owned = false;
    if (sc.total > 0) {
      if (p.workspace && p.workspace_bytes >= sc.total) {
        base = static_cast<std::byte*>(p.workspace);
      } else {
        void* ptr = nullptr;
        cudaError_t e = cudaMallocAsync(&ptr, sc.total, stream);
        if (e != cudaSuccess)
          return Status(StatusCode::backend_error, "cudnn: " + cuda_error("allocating workspace", e) + " (" +
                                                       std::to_string(sc.total) + " bytes)");
        base = static_cast<std::byte*>(ptr);
        owned = true;
      }
    }
    std::string err = run_with(p, key, sc, base, stream);
    if (owned) cudaFreeAsync(base, stream);
    if (!err.empty()) return Status(StatusCode::backend_error, "cudnn: " + err);
    return Status::Ok();
  }

  static std::string run_with(const Problem& p, const GraphKey& key, const Scratch& sc, std::byte* base,
                              cudaStream_t stream) {
    std::byte* tables = base + sc.cudnn_ws;
    float* stats = sc.temp_stats ? reinterpret_cast<float*>(tables + sc.tables) : p.lse.data;
    if (!sc.host_tables.empty()) {
      cudaError_t e =
          cudaMemcpyAsync(tables, sc.host_tables.data(), sc.host_tables.size(), cudaMemcpyHostToDevice, stream);
      if (e != cudaSuccess) return cuda_error("uploading varlen tables", e);
    }
    auto table = [&](std::size_t at) { return tables + at; };
    const auto* lens64 = p.varlen ? reinterpret_cast<const std::int64_t*>(table(sc.lens64)) : nullptr;
    const auto* offs64 = p.varlen ? reinterpret_cast<const std::int64_t*>(table(sc.offs64)) : nullptr;
    LseCopy copy;
    copy.user = p.lse.data;
    copy.user_stride_b = p.lse.stride[0];
    copy.user_stride_h = p.lse.stride[1];
    copy.user_stride_s = p.lse.stride[2];
    copy.packed = stats;
    copy.batch = p.batch;
    copy.heads = p.heads;
    copy.s_max = p.s_q;
    copy.lens = lens64;
    copy.offsets = offs64;

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
    ptrs.workspace = sc.cudnn_ws ? base : nullptr;
    if (p.varlen) {
      ptrs.seq_len_q = reinterpret_cast<const std::int32_t*>(table(sc.seq_q));
      ptrs.seq_len_kv = reinterpret_cast<const std::int32_t*>(table(sc.seq_kv));
      const auto* ragged = reinterpret_cast<const std::int32_t*>(table(sc.ragged));
      const int slots = p.is_backward() ? 8 : 4;
      for (int i = 0; i < slots; ++i) ptrs.ragged[std::size_t(i)] = ragged + i * (p.batch + 1);
    }
    if (auto e = execute(key, ptrs, stream); !e.empty()) return "executing the graph: " + e;

    {  // NaN where the definition has it (cuDNN's answer differs on non-finite inputs)
      NonFiniteFix fix;
      fix.a = make_params(p);
      fix.bf16 = p.dtype == DType::bf16;
      fix.stats = stats;
      if (p.varlen) {
        fix.a.q_seq.seqlens = lens64;  // cuDNN's lengths: 0 queries for a sequence with no keys
        fix.a.q_seq.offsets = offs64;
        fix.a.kv_seq.seqlens = reinterpret_cast<const std::int64_t*>(table(sc.lens64_kv));
        fix.a.kv_seq.offsets = reinterpret_cast<const std::int64_t*>(table(sc.offs64_kv));
      }
      const std::string e = p.is_backward() ? nonfinite_backward(fix, tables + sc.tables + sc.stats, stream)
                                            : nonfinite_forward(fix, stream);
      if (!e.empty()) return e;
    }

    if (!p.is_backward() && sc.temp_stats && p.lse.data)
      if (auto e = lse_copy(copy, /*packed_to_user=*/true, stream); !e.empty()) return e;

    if (!p.varlen) return {};
    const auto* q_pad = reinterpret_cast<const std::int64_t*>(table(sc.q_pad));
    const auto* kv_pad = reinterpret_cast<const std::int64_t*>(table(sc.kv_pad));
    auto zero = [&](const TensorView& t, const std::int64_t* list, std::int64_t n) {
      return zero_tokens(t.data, t.stride[kSeq], t.stride[kHead], t.shape[kHead], t.shape[kHeadDim], list, n, stream);
    };
    if (!p.is_backward()) {
      if (auto e = zero(p.o, q_pad, sc.n_q_pad); !e.empty()) return e;
      if (p.lse.data)
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
};

}  // namespace
}  // namespace cudnn

BackendImpl* cudnn_backend() {
  static cudnn::CudnnBackend backend;
  return &backend;
}

}  // namespace strideattn::detail
