// The C ABI (include/strideattn/strideattn.h) over the C++ API: converts the plain-C argument
// structs to ForwardArgs / BackwardArgs, calls the library, and turns the Status into a
// code plus a message copied into the caller's buffer; and the plans (sa_plan) over the C++
// plans. No exception, and no C++ type, crosses the boundary. Built into the shared library strideattn_c
// (src/CMakeLists.txt).
#include "strideattn/strideattn.h"

#include <atomic>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>

#include "strideattn/strideattn.hpp"

namespace {

using namespace strideattn;

// Sizes of the version-1 structs (everything before the appended `cancel`): the smallest
// struct_size a caller may pass.
constexpr std::size_t kForwardV1Size = offsetof(sa_forward_args, cancel);
constexpr std::size_t kBackwardV1Size = offsetof(sa_backward_args, cancel);
// How many bytes past the end of the struct this library knows it will read to check that
// a newer caller's extra fields are zero. A larger struct_size is refused without reading:
// a garbage or uninitialised size must give an error, not a read past the caller's struct.
constexpr std::size_t kMaxUnknownBytes = 32;

void write_text(const std::string& text, char* buf, std::size_t len) {
  if (buf == nullptr || len == 0) return;
  const std::size_t n = text.size() < len - 1 ? text.size() : len - 1;
  std::memcpy(buf, text.data(), n);
  buf[n] = '\0';
}

int finish(const Status& s, char* msg, std::size_t msg_len) {
  write_text(s.message(), msg, msg_len);
  return static_cast<int>(s.code());
}

Status invalid(const std::string& m) { return Status(StatusCode::invalid_argument, m); }

// Copies the caller's struct into a zero-initialised current one, honouring struct_size.
template <class T>
Status read_struct(const T* in, std::size_t min_size, const char* type_name, T* out) {
  *out = T{};
  if (in == nullptr) return invalid(std::string(type_name) + " is null");
  const std::size_t size = in->struct_size;
  if (size < min_size)
    return invalid(std::string(type_name) + ".struct_size is " + std::to_string(size) +
                   "; supported: >= " + std::to_string(min_size) + " (set it to sizeof(" + type_name + "))");
  if (size > sizeof(T) + kMaxUnknownBytes)
    return invalid(std::string(type_name) + ".struct_size is " + std::to_string(size) + "; supported: " +
                   std::to_string(min_size) + " to " + std::to_string(sizeof(T) + kMaxUnknownBytes) + " (sizeof(" +
                   type_name + ") in this library (" + std::string(version()) + ") is " + std::to_string(sizeof(T)) +
                   "; a newer caller's struct may be up to " + std::to_string(kMaxUnknownBytes) + " bytes longer)");
  if (size > sizeof(T)) {
    // A newer caller: accept when every field this library does not know is zero.
    const auto* extra = reinterpret_cast<const unsigned char*>(in) + sizeof(T);
    for (std::size_t i = 0; i < size - sizeof(T); ++i) {
      if (extra[i] != 0)
        return invalid(std::string(type_name) + ".struct_size is " + std::to_string(size) +
                       " with non-zero fields past byte " + std::to_string(sizeof(T)) + " that this library (" +
                       std::string(version()) + ") does not know");
    }
  }
  std::memcpy(static_cast<void*>(out), in, size < sizeof(T) ? size : sizeof(T));
  return Status::Ok();
}

TensorView to_view(const sa_tensor_view& v) {
  TensorView t;
  t.data = v.data;
  t.dtype = static_cast<DType>(v.dtype);  // unknown values are reported by validation
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = v.shape[i];
    t.stride[i] = v.stride[i];
  }
  return t;
}

LseView to_lse(const sa_lse_view& v) {
  LseView l;
  l.data = v.data;
  for (int i = 0; i < 3; ++i) {
    l.shape[i] = v.shape[i];
    l.stride[i] = v.stride[i];
  }
  return l;
}

AttentionOptions to_options(const sa_options& o) {
  AttentionOptions a;
  a.mask = static_cast<MaskKind>(o.mask);  // unknown values are reported by validation
  if (o.has_window) a.window = Window{o.window_left, o.window_right};
  if (o.scale != 0.0) a.scale = o.scale;
  a.deterministic = o.deterministic != 0;
  return a;
}

constexpr std::int64_t kMaxSequences = std::int64_t{1} << 31;

Status to_varlen(const sa_varlen& in, Varlen* out) {
  if (in.count == 0) return Status::Ok();
  if (in.count < 0 || in.count > kMaxSequences)
    return invalid("varlen: count is " + std::to_string(in.count) + "; supported: 0 (dense) to 2^31 sequences");
  if (in.seqlens_q == nullptr || in.seqlens_kv == nullptr)
    return invalid(std::string("varlen: count is ") + std::to_string(in.count) + " but seqlens_" +
                   (in.seqlens_q == nullptr ? "q" : "kv") + " is null; supported: both length arrays given");
  const auto n = static_cast<std::size_t>(in.count);
  out->seqlens_q.assign(in.seqlens_q, in.seqlens_q + n);
  out->seqlens_kv.assign(in.seqlens_kv, in.seqlens_kv + n);
  if (in.offsets_q) out->offsets_q.assign(in.offsets_q, in.offsets_q + n);
  if (in.offsets_kv) out->offsets_kv.assign(in.offsets_kv, in.offsets_kv + n);
  return Status::Ok();
}

Status to_backend(std::int32_t b, Backend* out) {
  switch (b) {
    case SA_BACKEND_AUTO:
      *out = Backend::automatic;
      return Status::Ok();
    case SA_BACKEND_REFERENCE:
      *out = Backend::reference;
      return Status::Ok();
    case SA_BACKEND_CPU:
      *out = Backend::cpu;
      return Status::Ok();
    case SA_BACKEND_CUDA:
      *out = Backend::cuda;
      return Status::Ok();
    case SA_BACKEND_CUDNN:
      *out = Backend::cudnn;
      return Status::Ok();
    default:
      break;
  }
  return invalid("backend " + std::to_string(b) +
                 " is unknown; supported: 0 auto, 1 reference, 2 cpu, 3 cuda, 4 cudnn");
}

Status to_memory(std::int32_t m, Memory* out) {
  if (m == SA_MEMORY_HOST || m == SA_MEMORY_DEVICE) {
    *out = m == SA_MEMORY_HOST ? Memory::host : Memory::device;
    return Status::Ok();
  }
  return invalid("memory " + std::to_string(m) + " is unknown; supported: 0 host, 1 device");
}

BiasView to_bias(const sa_bias_view& v) {
  BiasView b;
  b.data = v.data;
  b.dtype = static_cast<DType>(v.dtype);
  for (int i = 0; i < 4; ++i) b.shape[std::size_t(i)] = v.shape[i], b.stride[std::size_t(i)] = v.stride[i];
  return b;
}

HeadView to_head(const sa_head_view& v) { return {v.data, {v.shape[0], v.shape[1]}, {v.stride[0], v.stride[1]}}; }

// The training features (zero for callers whose struct ends before them: none used).
template <class Args>
void to_features(const sa_features& f, Args* a) {
  a->options.softcap = f.softcap;
  a->options.dropout = {f.dropout_p, f.dropout_seed, f.dropout_offset, f.dropout_seed_ptr, f.dropout_offset_ptr};
  a->options.bias_type = static_cast<BiasType>(f.bias_type);  // out of range: validation names it
  a->bias = to_bias(f.bias);
  a->alibi_slopes = to_head(f.alibi_slopes);
  a->sinks = to_head(f.sinks);
}

// Fields both argument structs share.
template <class CArgs, class Args>
Status convert_common(const CArgs& c, Args* a) {
  a->q = to_view(c.q);
  a->k = to_view(c.k);
  a->v = to_view(c.v);
  a->o = to_view(c.o);
  a->lse = to_lse(c.lse);
  a->options = to_options(c.options);
  if (Status s = to_varlen(c.varlen, &a->varlen); !s.ok()) return s;
  if (Status s = to_backend(c.backend, &a->backend); !s.ok()) return s;
  if (Status s = to_memory(c.memory, &a->memory); !s.ok()) return s;
  a->stream = c.stream;
  a->workspace = c.workspace;
  a->workspace_bytes = c.workspace_bytes;
  // C11 atomic_bool and std::atomic<bool> share size, alignment and representation.
  a->options.cancel = static_cast<const std::atomic<bool>*>(c.cancel);
  const sa_cu_seqlens& cu = c.cu_seqlens;  // zero for callers whose struct ends before it
  a->varlen.count = cu.count;
  a->varlen.cu_seqlens_q = cu.cu_seqlens_q;
  a->varlen.cu_seqlens_kv = cu.cu_seqlens_kv;
  a->varlen.seq_offsets_q = cu.seq_offsets_q;
  a->varlen.seq_offsets_kv = cu.seq_offsets_kv;
  a->varlen.max_seqlen_q = cu.max_seqlen_q;
  a->varlen.max_seqlen_kv = cu.max_seqlen_kv;
  to_features(c.features, a);
  return Status::Ok();
}

Status convert(const sa_forward_args* in, ForwardArgs* out) {
  sa_forward_args c;
  if (Status s = read_struct(in, kForwardV1Size, "sa_forward_args", &c); !s.ok()) return s;
  if (Status s = convert_common(c, out); !s.ok()) return s;
  out->max_logit = to_head(c.max_logit);
  return Status::Ok();
}

Status convert(const sa_backward_args* in, BackwardArgs* out) {
  sa_backward_args c;
  if (Status s = read_struct(in, kBackwardV1Size, "sa_backward_args", &c); !s.ok()) return s;
  if (Status s = convert_common(c, out); !s.ok()) return s;
  out->d_o = to_view(c.d_o);
  out->dq = to_view(c.dq);
  out->dk = to_view(c.dk);
  out->dv = to_view(c.dv);
  out->dbias = to_bias(c.dbias);
  out->d_sinks = to_head(c.d_sinks);
  return Status::Ok();
}

Status convert(const sa_kvcache_args* in, KvCacheArgs* out) {
  sa_kvcache_args c;
  if (Status s = read_struct(in, sizeof(sa_kvcache_args), "sa_kvcache_args", &c); !s.ok()) return s;
  out->q = to_view(c.q);
  out->k_cache = to_view(c.k_cache);
  out->v_cache = to_view(c.v_cache);
  out->k_new = to_view(c.k_new);
  out->v_new = to_view(c.v_new);
  out->block_table.data = c.block_table.data;
  for (int i = 0; i < 2; ++i) {
    out->block_table.shape[i] = c.block_table.shape[i];
    out->block_table.stride[i] = c.block_table.stride[i];
  }
  out->cache_seqlens = c.cache_seqlens;
  out->seqlens_q = c.seqlens_q;
  out->o = to_view(c.o);
  out->lse = to_lse(c.lse);
  out->options = to_options(c.options);
  out->options.cancel = static_cast<const std::atomic<bool>*>(c.cancel);
  if (Status s = to_backend(c.backend, &out->backend); !s.ok()) return s;
  if (Status s = to_memory(c.memory, &out->memory); !s.ok()) return s;
  out->stream = c.stream;
  out->workspace = c.workspace;
  out->workspace_bytes = c.workspace_bytes;
  return Status::Ok();
}

// Runs `body` with every exception turned into a status.
template <class F>
int guarded(char* msg, std::size_t msg_len, F&& body) {
  try {
    return finish(body(), msg, msg_len);
  } catch (const std::bad_alloc&) {
    return finish(Status(StatusCode::backend_error, "out of host memory"), msg, msg_len);
  } catch (const std::exception& e) {
    return finish(Status(StatusCode::internal, std::string("internal error: ") + e.what()), msg, msg_len);
  } catch (...) {
    return finish(Status(StatusCode::internal, "internal error: unknown exception"), msg, msg_len);
  }
}

Status convert(const sa_forward_run* in, ForwardRun* out) {
  sa_forward_run c;
  if (Status s = read_struct(in, offsetof(sa_forward_run, bias), "sa_forward_run", &c); !s.ok()) return s;
  out->q = c.q, out->k = c.k, out->v = c.v, out->o = c.o, out->lse = c.lse;
  out->stream = c.stream, out->workspace = c.workspace, out->workspace_bytes = c.workspace_bytes;
  out->cu_seqlens_q = c.cu_seqlens_q, out->cu_seqlens_kv = c.cu_seqlens_kv;
  out->seq_offsets_q = c.seq_offsets_q, out->seq_offsets_kv = c.seq_offsets_kv;
  out->cancel = static_cast<const std::atomic<bool>*>(c.cancel);
  out->bias = c.bias, out->alibi_slopes = c.alibi_slopes, out->sinks = c.sinks, out->max_logit = c.max_logit;
  out->dropout_seed = c.dropout_seed, out->dropout_offset = c.dropout_offset;
  out->dropout_seed_ptr = c.dropout_seed_ptr, out->dropout_offset_ptr = c.dropout_offset_ptr;
  return Status::Ok();
}

Status convert(const sa_backward_run* in, BackwardRun* out) {
  sa_backward_run c;
  if (Status s = read_struct(in, offsetof(sa_backward_run, bias), "sa_backward_run", &c); !s.ok()) return s;
  out->q = c.q, out->k = c.k, out->v = c.v, out->o = c.o, out->d_o = c.d_o, out->lse = c.lse;
  out->dq = c.dq, out->dk = c.dk, out->dv = c.dv;
  out->stream = c.stream, out->workspace = c.workspace, out->workspace_bytes = c.workspace_bytes;
  out->cu_seqlens_q = c.cu_seqlens_q, out->cu_seqlens_kv = c.cu_seqlens_kv;
  out->seq_offsets_q = c.seq_offsets_q, out->seq_offsets_kv = c.seq_offsets_kv;
  out->cancel = static_cast<const std::atomic<bool>*>(c.cancel);
  out->bias = c.bias, out->alibi_slopes = c.alibi_slopes, out->sinks = c.sinks;
  out->dbias = c.dbias, out->d_sinks = c.d_sinks;
  out->dropout_seed = c.dropout_seed, out->dropout_offset = c.dropout_offset;
  out->dropout_seed_ptr = c.dropout_seed_ptr, out->dropout_offset_ptr = c.dropout_offset_ptr;
  return Status::Ok();
}

std::string explanation_text(const Explanation& ex) {
  std::string t;
  if (!ex.validation.ok()) return "invalid: " + ex.validation.message() + "\n";
  t += "layout: " + ex.layout + "\n";
  for (const Verdict& v : ex.verdicts) {
    t += std::string(to_string(v.backend)) + ": " + (v.supported ? "supported" : "unsupported");
    if (!v.rule.empty()) t += " [" + v.rule + "]";
    if (!v.reason.empty()) t += " " + v.reason;
    t += "\n";
  }
  t += "auto: " + (ex.chosen ? std::string(to_string(*ex.chosen)) : std::string("no backend can run it")) + "\n";
  return t;
}

template <class CArgs, class Args>
int explain_c(const CArgs* in, char* buf, std::size_t len) {
  try {
    Args a;
    if (Status s = convert(in, &a); !s.ok()) {
      write_text("invalid: " + s.message() + "\n", buf, len);
      return static_cast<int>(s.code());
    }
    const Explanation ex = explain(a);
    write_text(explanation_text(ex), buf, len);
    return static_cast<int>(ex.validation.code());
  } catch (...) {
    write_text("internal error while explaining\n", buf, len);
    return SA_INTERNAL;
  }
}

}  // namespace

// The opaque plan of the C ABI: one of the two C++ plans.
struct sa_plan {
  bool backward = false;
  ForwardPlan forward;
  BackwardPlan backward_plan;
  [[nodiscard]] const PlanInfo& info() const {
    return backward ? static_cast<const PlanInfo&>(backward_plan) : static_cast<const PlanInfo&>(forward);
  }
};

namespace {

template <class CArgs, class Args>
int plan_create(const CArgs* args, sa_plan** plan, char* msg, std::size_t msg_len, bool backward) {
  return guarded(msg, msg_len, [&] {
    if (plan == nullptr) return invalid("sa_plan_create: plan is null");
    *plan = nullptr;
    Args a;
    if (Status s = convert(args, &a); !s.ok()) return s;
    auto p = std::make_unique<sa_plan>();
    p->backward = backward;
    Status s;
    if constexpr (std::is_same_v<Args, ForwardArgs>)
      s = make_plan(a, &p->forward);
    else
      s = make_plan(a, &p->backward_plan);
    if (!s.ok()) return s;
    *plan = p.release();
    return Status::Ok();
  });
}

}  // namespace

extern "C" {

SA_API int sa_plan_create(const sa_forward_args* args, sa_plan** plan, char* msg, size_t msg_len) {
  return plan_create<sa_forward_args, ForwardArgs>(args, plan, msg, msg_len, false);
}

SA_API int sa_plan_create_backward(const sa_backward_args* args, sa_plan** plan, char* msg, size_t msg_len) {
  return plan_create<sa_backward_args, BackwardArgs>(args, plan, msg, msg_len, true);
}

SA_API int sa_plan_run(const sa_plan* plan, const sa_forward_run* run, char* msg, size_t msg_len) {
  return guarded(msg, msg_len, [&] {
    if (plan == nullptr) return invalid("sa_plan_run: plan is null");
    if (plan->backward) return invalid("sa_plan_run: a backward plan; run it with sa_plan_run_backward");
    ForwardRun r;
    if (Status s = convert(run, &r); !s.ok()) return s;
    return plan->forward.run(r);
  });
}

SA_API int sa_plan_run_backward(const sa_plan* plan, const sa_backward_run* run, char* msg, size_t msg_len) {
  return guarded(msg, msg_len, [&] {
    if (plan == nullptr) return invalid("sa_plan_run_backward: plan is null");
    if (!plan->backward) return invalid("sa_plan_run_backward: a forward plan; run it with sa_plan_run");
    BackwardRun r;
    if (Status s = convert(run, &r); !s.ok()) return s;
    return plan->backward_plan.run(r);
  });
}

SA_API int sa_plan_workspace_size(const sa_plan* plan, size_t* bytes, char* msg, size_t msg_len) {
  return guarded(msg, msg_len, [&] {
    if (bytes == nullptr) return invalid("sa_plan_workspace_size: bytes is null");
    *bytes = 0;
    if (plan == nullptr) return invalid("sa_plan_workspace_size: plan is null");
    *bytes = plan->info().workspace_size();
    return Status::Ok();
  });
}

SA_API int32_t sa_plan_backend(const sa_plan* plan) {
  return plan == nullptr ? -1 : static_cast<int32_t>(plan->info().backend());
}

SA_API int32_t sa_plan_is_backward(const sa_plan* plan) { return plan != nullptr && plan->backward ? 1 : 0; }

SA_API int sa_plan_reason(const sa_plan* plan, char* buf, size_t len) {
  if (plan == nullptr) {
    write_text("sa_plan_reason: plan is null", buf, len);
    return SA_INVALID_ARGUMENT;
  }
  try {
    write_text(plan->info().reason(), buf, len);
    return SA_OK;
  } catch (...) {
    write_text("internal error", buf, len);
    return SA_INTERNAL;
  }
}

SA_API void sa_plan_destroy(sa_plan* plan) { delete plan; }

SA_API int sa_forward(const sa_forward_args* args, char* msg, size_t msg_len) {
  return guarded(msg, msg_len, [&] {
    ForwardArgs a;
    if (Status s = convert(args, &a); !s.ok()) return s;
    return forward(a);
  });
}

SA_API int sa_backward(const sa_backward_args* args, char* msg, size_t msg_len) {
  return guarded(msg, msg_len, [&] {
    BackwardArgs a;
    if (Status s = convert(args, &a); !s.ok()) return s;
    return backward(a);
  });
}

SA_API int sa_workspace_size(const sa_forward_args* args, size_t* bytes, char* msg, size_t msg_len) {
  return guarded(msg, msg_len, [&] {
    if (bytes == nullptr) return invalid("sa_workspace_size: bytes is null");
    *bytes = 0;
    ForwardArgs a;
    if (Status s = convert(args, &a); !s.ok()) return s;
    return workspace_size(a, bytes);
  });
}

SA_API int sa_backward_workspace_size(const sa_backward_args* args, size_t* bytes, char* msg, size_t msg_len) {
  return guarded(msg, msg_len, [&] {
    if (bytes == nullptr) return invalid("sa_backward_workspace_size: bytes is null");
    *bytes = 0;
    BackwardArgs a;
    if (Status s = convert(args, &a); !s.ok()) return s;
    return workspace_size(a, bytes);
  });
}

SA_API int sa_explain(const sa_forward_args* args, char* buf, size_t len) {
  return explain_c<sa_forward_args, ForwardArgs>(args, buf, len);
}

SA_API int sa_explain_backward(const sa_backward_args* args, char* buf, size_t len) {
  return explain_c<sa_backward_args, BackwardArgs>(args, buf, len);
}

SA_API const char* sa_version(void) {
  static const std::string v(strideattn::version());
  return v.c_str();
}

SA_API int sa_backend_compiled(int32_t backend) {
  Backend b;
  if (!to_backend(backend, &b).ok() || b == Backend::automatic) return 0;
  return backend_compiled(b) ? 1 : 0;
}

SA_API const char* sa_status_name(int status) {
  switch (status) {
    case SA_OK:
      return "ok";
    case SA_INVALID_ARGUMENT:
      return "invalid_argument";
    case SA_UNSUPPORTED:
      return "unsupported";
    case SA_BACKEND_ERROR:
      return "backend_error";
    case SA_INTERNAL:
      return "internal";
    case SA_CANCELLED:
      return "cancelled";
    default:
      return "unknown";
  }
}

}  // extern "C"

// ---------------------------------------------------------------- KV-cache attention

SA_API int sa_forward_with_kvcache(const sa_kvcache_args* args, char* msg, size_t msg_len) {
  return guarded(msg, msg_len, [&] {
    KvCacheArgs a;
    if (Status s = convert(args, &a); !s.ok()) return s;
    return forward_with_kvcache(a);
  });
}

SA_API int sa_explain_kvcache(const sa_kvcache_args* args, char* buf, size_t len) {
  return explain_c<sa_kvcache_args, KvCacheArgs>(args, buf, len);
}

SA_API int sa_kvcache_workspace_size(const sa_kvcache_args* args, size_t* bytes, char* msg, size_t msg_len) {
  return guarded(msg, msg_len, [&] {
    if (bytes == nullptr) return invalid("sa_kvcache_workspace_size: bytes is null");
    *bytes = 0;
    KvCacheArgs a;
    if (Status s = convert(args, &a); !s.ok()) return s;
    return workspace_size(a, bytes);
  });
}

static_assert(static_cast<int>(strideattn::StatusCode::invalid_argument) == SA_INVALID_ARGUMENT);
static_assert(static_cast<int>(strideattn::StatusCode::unsupported) == SA_UNSUPPORTED);
static_assert(static_cast<int>(strideattn::StatusCode::backend_error) == SA_BACKEND_ERROR);
static_assert(static_cast<int>(strideattn::StatusCode::internal) == SA_INTERNAL);
static_assert(static_cast<int>(strideattn::StatusCode::cancelled) == SA_CANCELLED);
static_assert(sizeof(std::atomic<bool>) == 1 && std::atomic<bool>::is_always_lock_free);
static_assert(static_cast<int>(strideattn::DType::bf16) == SA_BF16 &&
              static_cast<int>(strideattn::DType::f32) == SA_F32);
static_assert(static_cast<int>(strideattn::MaskKind::causal_bottom_right) == SA_MASK_CAUSAL_BOTTOM_RIGHT);
static_assert(static_cast<int>(strideattn::Backend::cudnn) == SA_BACKEND_CUDNN &&
              static_cast<int>(strideattn::Backend::cpu) == SA_BACKEND_CPU);
