// strideattn._jax_ffi: the XLA FFI handlers behind strideattn.jax, the forward (O and LSE)
// and the backward (dQ, dK, dV; dBias and d_sinks with those training features), for XLA's
// CPU platform (host buffers: the reference and cpu backends) and its CUDA platform (device
// buffers on XLA's stream: the cuda and cudnn backends), and the trace-time query that
// validates a call and sizes its workspace without running it. Every tensor is a view into
// one of the call's XLA buffers, described per buffer axis (which logical dimension that
// axis is, its first index and its extent); the element strides come from the buffer's own
// dimensions (XLA buffers are dense row-major), so one fused QKV buffer is read as three
// strided views, with no copy.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <map>
#include <new>
#include <string>
#include <string_view>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "strideattn/strideattn.hpp"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;
using namespace strideattn;

namespace {

// ---------------------------------------------------------------- call description

// One XLA buffer of the call: its address (a stand-in at trace time), element type and
// dimensions.
struct Buffer {
  void* data = nullptr;
  bool stand_in = false;  // trace time: `data` only places the views, it is never read
  ffi::DataType type = ffi::DataType::INVALID;
  std::vector<std::int64_t> dims;
};

// The attributes of one call, decoded from an ffi::Dictionary (run time) or from a Python
// dict (trace time); strideattn/jax.py writes them.
//
// A view attribute is an int64 array [buffer, then (role, start, extent) per buffer axis]:
// `buffer` indexes the call's arguments (inputs) or results (outputs); `role` is the logical
// dimension that axis is (tensors: 0 batch, 1 seq, 2 head, 3 head_dim; LSE: 0 batch, 1 head,
// 2 seq) or -1 for an axis held at index `start` (extent 1), e.g. the "3" axis of a
// [b, s, 3, h, d] buffer. A logical dimension no axis names has extent 1.
struct CallAttrs {
  std::map<std::string, std::vector<std::int64_t>, std::less<>> views;
  std::string mask = "none";
  std::string backend = "auto";
  std::int64_t window_left = -1, window_right = -1;
  bool has_scale = false;
  double scale = 0.0;
  bool deterministic = false;
  // 0: dense; 1: sequence lengths and offsets in the attributes; 2: in argument buffers
  // (int32 or int64), whose argument indices varlen_args gives (seqlens_q, seqlens_kv,
  // offsets_q, offsets_kv; -1: offsets packed back to back), read on the host; 3: int32
  // cu_seqlens argument buffers (varlen_args: cu_seqlens_q, cu_seqlens_kv, seq_offsets_q,
  // seq_offsets_kv; -1: none) passed to the library as they are, in the buffers' memory, with
  // the bounds max_seqlen_q / max_seqlen_kv.
  std::int64_t varlen = 0;
  std::vector<std::int64_t> seqlens_q, seqlens_kv, offsets_q, offsets_kv;
  std::vector<std::int64_t> varlen_args;
  std::int64_t max_seqlen_q = 0, max_seqlen_kv = 0;
  // Training features: options, and the argument indices of their arrays (bias, alibi_slopes,
  // sinks, dropout_rng; -1: none) and, in a backward, the result indices of the gradients
  // (dbias, d_sinks; -1: none). dropout_rng: uint32[4], the seed then the offset as two
  // little-endian uint64, read when the call runs.
  double softcap = 0.0, dropout_p = 0.0;
  std::string bias_type = "none";
  std::vector<std::int64_t> feature_args, feature_rets;
  std::int64_t workspace = -1;  // result index of the workspace buffer (uint8), -1: none
  std::int64_t max_logit = -1;  // forward: result index of the max logit (fp32 [rows, h]), -1: none
};

constexpr const char* kForwardInputs[] = {"q", "k", "v"};
constexpr const char* kForwardOutputs[] = {"o", "lse"};
constexpr const char* kBackwardInputs[] = {"q", "k", "v", "o", "do", "lse"};
constexpr const char* kBackwardOutputs[] = {"dq", "dk", "dv"};
constexpr const char* kIntArrays[] = {"seqlens_q",   "seqlens_kv",   "offsets_q",   "offsets_kv",
                                      "varlen_args", "feature_args", "feature_rets"};

Status bad(std::string msg) { return Status(StatusCode::invalid_argument, std::move(msg)); }

// Reads CallAttrs from a source with has / str / i64 / flag / f64 / ints accessors.
template <class Source>
Status decode_attrs(const Source& src, bool backward, CallAttrs* a) {
  auto view = [&](const char* name) -> Status {
    if (!src.has(name)) return Status::Ok();
    std::vector<std::int64_t> v;
    if (Status s = src.ints(name, &v); !s.ok()) return s;
    a->views[name] = std::move(v);
    return Status::Ok();
  };
  if (backward) {
    for (const char* n : kBackwardInputs)
      if (Status s = view(n); !s.ok()) return s;
    for (const char* n : kBackwardOutputs)
      if (Status s = view(n); !s.ok()) return s;
  } else {
    for (const char* n : kForwardInputs)
      if (Status s = view(n); !s.ok()) return s;
    for (const char* n : kForwardOutputs)
      if (Status s = view(n); !s.ok()) return s;
  }
  if (Status s = src.str("mask", &a->mask); !s.ok()) return s;
  if (Status s = src.str("backend", &a->backend); !s.ok()) return s;
  if (Status s = src.i64("window_left", &a->window_left); !s.ok()) return s;
  if (Status s = src.i64("window_right", &a->window_right); !s.ok()) return s;
  if (Status s = src.flag("has_scale", &a->has_scale); !s.ok()) return s;
  if (Status s = src.f64("scale", &a->scale); !s.ok()) return s;
  if (Status s = src.flag("deterministic", &a->deterministic); !s.ok()) return s;
  if (Status s = src.i64("varlen", &a->varlen); !s.ok()) return s;
  if (Status s = src.i64("workspace", &a->workspace); !s.ok()) return s;
  if (Status s = src.i64("max_logit", &a->max_logit); !s.ok()) return s;
  if (Status s = src.i64("max_seqlen_q", &a->max_seqlen_q); !s.ok()) return s;
  if (Status s = src.i64("max_seqlen_kv", &a->max_seqlen_kv); !s.ok()) return s;
  if (Status s = src.f64("softcap", &a->softcap); !s.ok()) return s;
  if (Status s = src.f64("dropout_p", &a->dropout_p); !s.ok()) return s;
  if (Status s = src.str("bias_type", &a->bias_type); !s.ok()) return s;
  std::vector<std::int64_t>* arrays[] = {&a->seqlens_q,   &a->seqlens_kv,   &a->offsets_q,   &a->offsets_kv,
                                         &a->varlen_args, &a->feature_args, &a->feature_rets};
  for (std::size_t i = 0; i < std::size(kIntArrays); ++i)
    if (src.has(kIntArrays[i]))
      if (Status s = src.ints(kIntArrays[i], arrays[i]); !s.ok()) return s;
  return Status::Ok();
}

// Attribute source over XLA's dictionary (run time). Missing scalars keep their defaults.
struct FfiSource {
  const ffi::Dictionary& d;
  bool has(std::string_view n) const { return d.contains(n); }
  template <class T, class Out>
  Status get(std::string_view n, Out* out) const {
    if (!d.contains(n)) return Status::Ok();
    ffi::ErrorOr<T> v = d.get<T>(n);
    if (v.has_error()) return bad("attribute " + std::string(n) + ": " + v.error().message());
    *out = Out(*v);
    return Status::Ok();
  }
  Status str(std::string_view n, std::string* o) const { return get<std::string_view>(n, o); }
  Status i64(std::string_view n, std::int64_t* o) const { return get<std::int64_t>(n, o); }
  Status flag(std::string_view n, bool* o) const { return get<bool>(n, o); }
  Status f64(std::string_view n, double* o) const { return get<double>(n, o); }
  Status ints(std::string_view n, std::vector<std::int64_t>* o) const {
    ffi::ErrorOr<ffi::Span<const std::int64_t>> v = d.get<ffi::Span<const std::int64_t>>(n);
    if (v.has_error()) return bad("attribute " + std::string(n) + ": " + v.error().message());
    o->assign(v->begin(), v->end());
    return Status::Ok();
  }
};

// Attribute source over the Python dict strideattn/jax.py builds (trace time): the same
// keys, with Python str / int / bool / float / list-of-int values.
struct PySource {
  const nb::dict& d;
  bool has(const char* n) const { return d.contains(n); }
  template <class T>
  Status get(const char* n, T* out) const {
    if (!d.contains(n)) return Status::Ok();
    if (!nb::try_cast<T>(d[n], *out)) return bad(std::string("attribute ") + n + " has the wrong type");
    return Status::Ok();
  }
  Status str(const char* n, std::string* o) const { return get(n, o); }
  Status i64(const char* n, std::int64_t* o) const { return get(n, o); }
  Status flag(const char* n, bool* o) const { return get(n, o); }
  Status f64(const char* n, double* o) const { return get(n, o); }
  Status ints(const char* n, std::vector<std::int64_t>* o) const { return get(n, o); }
};

// ---------------------------------------------------------------- views

std::string dims_str(const std::vector<std::int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

std::string_view type_name(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F16:
      return "float16";
    case ffi::DataType::BF16:
      return "bfloat16";
    case ffi::DataType::F32:
      return "float32";
    case ffi::DataType::F64:
      return "float64";
    case ffi::DataType::S32:
      return "int32";
    case ffi::DataType::S64:
      return "int64";
    case ffi::DataType::U8:
      return "uint8";
    case ffi::DataType::U32:
      return "uint32";
    default:
      return "another XLA type";
  }
}

// The library's dtype of a float16 / bfloat16 / float32 buffer, or an error naming `what`.
Status float_dtype(ffi::DataType t, std::string_view what, DType* out) {
  switch (t) {
    case ffi::DataType::F16:
      *out = DType::f16;
      return Status::Ok();
    case ffi::DataType::BF16:
      *out = DType::bf16;
      return Status::Ok();
    case ffi::DataType::F32:
      *out = DType::f32;
      return Status::Ok();
    default:
      return bad(std::string(what) + " has dtype " + std::string(type_name(t)) +
                 "; supported: float16, bfloat16, float32");
  }
}

// A view of N logical dimensions into buffer `bufs[desc[0]]`: data pointer, shape, element
// strides from the buffer's row-major dimensions, and its element count.
template <std::size_t N>
Status view_of(std::string_view name, const std::vector<std::int64_t>& desc, const std::vector<Buffer>& bufs,
               const char* side, void** data, ffi::DataType* type, std::array<std::int64_t, N>* shape,
               std::array<std::int64_t, N>* stride, std::int64_t* elements) {
  const std::string who = std::string(name) + " view";
  if (desc.empty() || desc[0] < 0 || desc[0] >= static_cast<std::int64_t>(bufs.size()))
    return bad(who + ": names " + side + " " + (desc.empty() ? std::string("none") : std::to_string(desc[0])) + " of " +
               std::to_string(bufs.size()));
  const Buffer& b = bufs[static_cast<std::size_t>(desc[0])];
  const std::size_t rank = b.dims.size();
  if (desc.size() != 1 + 3 * rank)
    return bad(who + ": describes " + std::to_string((desc.size() - 1) / 3) + " axes but " + side + " " +
               std::to_string(desc[0]) + " has shape " + dims_str(b.dims));
  std::vector<std::int64_t> row_major(rank, 1);
  for (std::size_t i = rank; i-- > 1;) row_major[i - 1] = row_major[i] * b.dims[i];
  std::array<bool, N> named{};
  shape->fill(1);
  stride->fill(0);
  std::int64_t offset = 0;
  for (std::size_t ax = 0; ax < rank; ++ax) {
    const std::int64_t role = desc[1 + 3 * ax], start = desc[2 + 3 * ax], extent = desc[3 + 3 * ax];
    if (role < -1 || role >= static_cast<std::int64_t>(N) || (role >= 0 && named[role]))
      return bad(who + ": axis " + std::to_string(ax) + " has role " + std::to_string(role) +
                 "; supported: -1 (held at an index) or a logical dimension 0.." + std::to_string(N - 1) +
                 " named once");
    if (start < 0 || extent < 0 || (role < 0 && extent != 1) || start + extent > b.dims[ax])
      return bad(who + ": axis " + std::to_string(ax) + " takes [" + std::to_string(start) + ", " +
                 std::to_string(start + extent) + ") of extent " + std::to_string(b.dims[ax]));
    offset += start * row_major[ax];
    if (role >= 0) {
      named[role] = true;
      (*shape)[role] = extent;
      (*stride)[role] = row_major[ax];
    }
  }
  // A dimension no axis names has extent 1; its stride is the view's span, so it never looks
  // like an aliased (zero-stride) dimension to the overlap rules.
  std::int64_t span = 1;
  for (std::size_t i = 0; i < N; ++i)
    if (named[i] && (*shape)[i] > 0) span += ((*shape)[i] - 1) * (*stride)[i];
  for (std::size_t i = 0; i < N; ++i)
    if (!named[i]) (*stride)[i] = span;
  *elements = 1;
  for (std::size_t i = 0; i < N; ++i) *elements *= (*shape)[i];
  *type = b.type;
  *data = b.data == nullptr
              ? nullptr
              : static_cast<unsigned char*>(b.data) + offset * static_cast<std::int64_t>(ffi::ByteWidth(b.type));
  return Status::Ok();
}

Status tensor_view(std::string_view name, const CallAttrs& a, const std::vector<Buffer>& bufs, const char* side,
                   TensorView* out, std::int64_t* elements) {
  auto it = a.views.find(name);
  if (it == a.views.end()) return bad(std::string(name) + " view: missing");
  void* data = nullptr;
  ffi::DataType type{};
  if (Status s = view_of<4>(name, it->second, bufs, side, &data, &type, &out->shape, &out->stride, elements); !s.ok())
    return s;
  if (Status s = float_dtype(type, name, &out->dtype); !s.ok()) return s;
  out->data = data;
  return Status::Ok();
}

Status lse_view(const CallAttrs& a, const std::vector<Buffer>& bufs, const char* side, LseView* out,
                std::int64_t* elements) {
  auto it = a.views.find("lse");
  if (it == a.views.end()) return Status::Ok();  // forward without LSE
  void* data = nullptr;
  ffi::DataType type{};
  if (Status s = view_of<3>("lse", it->second, bufs, side, &data, &type, &out->shape, &out->stride, elements); !s.ok())
    return s;
  if (type != ffi::DataType::F32) return bad("lse has dtype " + std::string(type_name(type)) + "; supported: float32");
  out->data = static_cast<float*>(data);
  return Status::Ok();
}

// ---------------------------------------------------------------- options and varlen

Status read_lengths(const Buffer& b, const char* name, std::vector<std::int64_t>* out) {
  if (b.dims.size() != 1)
    return bad(std::string(name) + " has shape " + dims_str(b.dims) + "; supported: one dimension");
  if (b.type != ffi::DataType::S32 && b.type != ffi::DataType::S64)
    return bad(std::string(name) + " has dtype " + std::string(type_name(b.type)) + "; supported: int32, int64");
  const std::size_t n = static_cast<std::size_t>(b.dims[0]);
  out->assign(n, 0);  // trace time: empty sequences stand in
  if (b.stand_in) return Status::Ok();
  for (std::size_t i = 0; i < n; ++i)
    (*out)[i] = b.type == ffi::DataType::S32 ? static_cast<const std::int32_t*>(b.data)[i]
                                             : static_cast<const std::int64_t*>(b.data)[i];
  return Status::Ok();
}

// The cu_seqlens form: int32 arrays handed to the library where they are (host or device
// memory), never read here. cu_seqlens_q fixes the count; the others must hold enough entries.
Status fill_cu_seqlens(const CallAttrs& a, const std::vector<Buffer>& args, Varlen* v) {
  const char* names[] = {"cu_seqlens_q", "cu_seqlens_kv", "seq_offsets_q", "seq_offsets_kv"};
  const std::int32_t** outs[] = {&v->cu_seqlens_q, &v->cu_seqlens_kv, &v->seq_offsets_q, &v->seq_offsets_kv};
  std::int64_t count = 0;
  for (int i = 0; i < 4; ++i) {
    const std::int64_t idx = a.varlen_args[static_cast<std::size_t>(i)];
    if (idx < 0) {
      if (i < 2) return bad(std::string(names[i]) + ": missing");
      continue;
    }
    if (idx >= static_cast<std::int64_t>(args.size())) return bad(std::string(names[i]) + ": no such argument");
    const Buffer& b = args[static_cast<std::size_t>(idx)];
    if (b.dims.size() != 1 || b.type != ffi::DataType::S32)
      return bad(std::string(names[i]) + " is " + std::string(type_name(b.type)) + " of shape " + dims_str(b.dims) +
                 "; supported: a one-dimensional int32 array");
    const std::int64_t n = b.dims[0];
    if (i == 0) {
      if (n < 2)
        return bad("cu_seqlens_q has " + std::to_string(n) +
                   " entries; supported: count + 1 entries for count >= 1 sequences (0 first, then the running "
                   "total of tokens)");
      count = n - 1;
    } else if (i == 1 && n != count + 1) {
      return bad("cu_seqlens_kv has " + std::to_string(n) + " entries but cu_seqlens_q has " +
                 std::to_string(count + 1) + "; supported: the same count + 1 entries on both sides");
    } else if (i > 1 && n < count) {
      return bad(std::string(names[i]) + " has " + std::to_string(n) + " entries for " + std::to_string(count) +
                 " sequences; supported: at least count entries (the first token of each sequence)");
    }
    *outs[i] = static_cast<const std::int32_t*>(b.data);
  }
  v->count = count;
  v->max_seqlen_q = a.max_seqlen_q;
  v->max_seqlen_kv = a.max_seqlen_kv;
  return Status::Ok();
}

Status fill_varlen(const CallAttrs& a, const std::vector<Buffer>& args, Memory memory, Varlen* v) {
  if (a.varlen == 0) return Status::Ok();
  if (a.varlen == 1) {
    v->seqlens_q = a.seqlens_q;
    v->seqlens_kv = a.seqlens_kv;
    v->offsets_q = a.offsets_q;
    v->offsets_kv = a.offsets_kv;
    return Status::Ok();
  }
  if ((a.varlen != 2 && a.varlen != 3) || a.varlen_args.size() != 4) return bad("varlen attributes are inconsistent");
  if (a.varlen == 3) return fill_cu_seqlens(a, args, v);
  // Lengths read here, on the host. On the CUDA platform these buffers live on the device,
  // and reading them would synchronise the stream; cu_seqlens arrays are read by the kernels.
  if (memory == Memory::device)
    return Status(StatusCode::unsupported,
                  "seqlens/offsets given as JAX arrays are read on the host, which the GPU cannot do without "
                  "a synchronisation; on the GPU pass cu_seqlens_q/cu_seqlens_kv (int32 JAX arrays, read by "
                  "the kernels) with max_seqlen_q/max_seqlen_kv, or the lengths as Python ints or numpy arrays "
                  "(fixed when the function is traced)");
  const char* names[] = {"seqlens_q", "seqlens_kv", "offsets_q", "offsets_kv"};
  std::vector<std::int64_t>* outs[] = {&v->seqlens_q, &v->seqlens_kv, &v->offsets_q, &v->offsets_kv};
  for (int i = 0; i < 4; ++i) {
    const std::int64_t idx = a.varlen_args[i];
    if (idx < 0) continue;
    if (idx >= static_cast<std::int64_t>(args.size())) return bad(std::string(names[i]) + ": no such argument");
    if (Status s = read_lengths(args[static_cast<std::size_t>(idx)], names[i], outs[i]); !s.ok()) return s;
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- training features

// Buffer `idx` of `bufs` (nullptr: -1, none), or an error naming `what`.
Status feature_buffer(std::int64_t idx, const std::vector<Buffer>& bufs, const char* what, const char* side,
                      const Buffer** out) {
  *out = nullptr;
  if (idx < 0) return Status::Ok();
  if (idx >= static_cast<std::int64_t>(bufs.size())) return bad(std::string(what) + ": no such " + side);
  *out = &bufs[static_cast<std::size_t>(idx)];
  return Status::Ok();
}

// A bias array of rank 1..4 as the library's [b or 1, h or 1, s_q or 1, s_kv or 1] view: its
// dimensions right-aligned (numpy's broadcasting), the missing leading ones extent 1, the
// strides those of its row-major layout.
Status bias_view(const Buffer& b, const char* what, BiasView* out) {
  const std::size_t rank = b.dims.size();
  if (rank < 1 || rank > 4)
    return bad(std::string(what) + " has shape " + dims_str(b.dims) +
               "; supported: 1 to 4 dimensions, broadcast to [b, h, s_q, s_kv] from the right");
  if (Status s = float_dtype(b.type, what, &out->dtype); !s.ok()) return s;
  std::int64_t stride = 1;
  for (std::size_t i = 4; i-- > 0;) {
    const std::size_t from_right = 3 - i;
    const std::int64_t extent = from_right < rank ? b.dims[rank - 1 - from_right] : 1;
    out->shape[i] = extent;
    out->stride[i] = stride;
    stride *= extent;
  }
  out->data = b.data;
  return Status::Ok();
}

// An fp32 array [h] (rows 1) or [rows, h] as a HeadView.
Status head_view(const Buffer& b, const char* what, bool two_dims, HeadView* out) {
  if (b.type != ffi::DataType::F32 || b.dims.empty() || b.dims.size() > (two_dims ? 2u : 1u))
    return bad(std::string(what) + " is " + std::string(type_name(b.type)) + " of shape " + dims_str(b.dims) +
               "; supported: float32 [h]" + (two_dims ? " or [b, h]" : ""));
  const bool rows = b.dims.size() == 2;
  out->shape = {rows ? b.dims[0] : 1, b.dims.back()};
  out->stride = {b.dims.back(), 1};
  out->data = static_cast<float*>(b.data);
  return Status::Ok();
}

// The features' options and views (a backward: with its gradients' results, whose elements
// are added to `counts`, the results' coverage).
template <class Args>
Status fill_features(const CallAttrs& a, const std::vector<Buffer>& args, const std::vector<Buffer>& rets,
                     std::vector<std::int64_t>* counts, Args* out) {
  if (a.feature_args.empty()) return Status::Ok();
  if (a.feature_args.size() != 4) return bad("feature attributes are inconsistent");
  out->options.softcap = a.softcap;
  out->options.dropout.p = a.dropout_p;
  const std::optional<BiasType> type = bias_type_from_string(a.bias_type);
  if (!type) return bad("bias_type='" + a.bias_type + "' is not a bias type; supported: post_scale, pre_scale");
  const Buffer *bias = nullptr, *alibi = nullptr, *sinks = nullptr, *rng = nullptr;
  if (Status s = feature_buffer(a.feature_args[0], args, "bias", "argument", &bias); !s.ok()) return s;
  if (Status s = feature_buffer(a.feature_args[1], args, "alibi_slopes", "argument", &alibi); !s.ok()) return s;
  if (Status s = feature_buffer(a.feature_args[2], args, "sinks", "argument", &sinks); !s.ok()) return s;
  if (Status s = feature_buffer(a.feature_args[3], args, "dropout_rng", "argument", &rng); !s.ok()) return s;
  if (bias != nullptr) {
    out->options.bias_type = *type;
    if (Status s = bias_view(*bias, "bias", &out->bias); !s.ok()) return s;
  }
  if (alibi != nullptr)
    if (Status s = head_view(*alibi, "alibi_slopes", true, &out->alibi_slopes); !s.ok()) return s;
  if (sinks != nullptr)
    if (Status s = head_view(*sinks, "sinks", false, &out->sinks); !s.ok()) return s;
  if (rng != nullptr) {
    if (rng->type != ffi::DataType::U32 || rng->dims != std::vector<std::int64_t>{4})
      return bad("dropout_rng is " + std::string(type_name(rng->type)) + " of shape " + dims_str(rng->dims) +
                 "; supported: uint32 [4] (the seed, then the offset, as little-endian uint64)");
    if (reinterpret_cast<std::uintptr_t>(rng->data) % 8 != 0)
      return bad("dropout_rng is not 8-byte aligned; supported: an XLA buffer of its own");
    const auto* words = static_cast<const std::uint64_t*>(rng->data);
    out->options.dropout.seed_ptr = words;
    out->options.dropout.offset_ptr = words == nullptr ? nullptr : words + 1;
  }
  if constexpr (std::is_same_v<Args, BackwardArgs>) {
    if (a.feature_rets.size() != 2) return bad("feature attributes are inconsistent");
    const Buffer *dbias = nullptr, *d_sinks = nullptr;
    if (Status s = feature_buffer(a.feature_rets[0], rets, "dbias", "result", &dbias); !s.ok()) return s;
    if (Status s = feature_buffer(a.feature_rets[1], rets, "d_sinks", "result", &d_sinks); !s.ok()) return s;
    if (dbias != nullptr) {
      if (bias == nullptr || dbias->dims != bias->dims || dbias->type != bias->type)
        return bad("dbias result of shape " + dims_str(dbias->dims) +
                   " does not match the bias; supported: the bias's shape and dtype");
      if (Status s = bias_view(*dbias, "dbias", &out->dbias); !s.ok()) return s;
      (*counts)[static_cast<std::size_t>(a.feature_rets[0])] +=
          out->dbias.shape[0] * out->dbias.shape[1] * out->dbias.shape[2] * out->dbias.shape[3];
    }
    if (d_sinks != nullptr) {
      if (Status s = head_view(*d_sinks, "d_sinks", false, &out->d_sinks); !s.ok()) return s;
      (*counts)[static_cast<std::size_t>(a.feature_rets[1])] += out->d_sinks.shape[1];
    }
  }
  return Status::Ok();
}

template <class Args>
Status fill_common(const CallAttrs& a, const std::vector<Buffer>& args, const std::vector<Buffer>& rets, Memory memory,
                   void* stream, Args* out) {
  const std::optional<MaskKind> mask = mask_from_string(a.mask);
  if (!mask) return bad("mask='" + a.mask + "' is not a mask; supported: none, causal, causal_bottom_right");
  out->options.mask = *mask;
  out->options.window = Window{.left = a.window_left, .right = a.window_right};
  if (a.has_scale) out->options.scale = a.scale;
  out->options.deterministic = a.deterministic;
  const std::optional<Backend> backend = backend_from_string(a.backend);
  if (!backend)
    return bad("backend='" + a.backend + "' is not a backend; supported: auto, reference, cpu, cuda, cudnn");
  out->backend = *backend;
  out->memory = memory;
  out->stream = stream;
  if (Status s = fill_varlen(a, args, memory, &out->varlen); !s.ok()) return s;
  if (a.workspace >= 0) {
    if (a.workspace >= static_cast<std::int64_t>(rets.size())) return bad("workspace: no such result");
    const Buffer& w = rets[static_cast<std::size_t>(a.workspace)];
    out->workspace_bytes = w.dims.empty() ? 0 : static_cast<std::size_t>(w.dims[0]);
    out->workspace = out->workspace_bytes ? w.data : nullptr;
  }
  return Status::Ok();
}

// Every result buffer is fully covered by its output views (the library writes every element
// of every output view and refuses overlapping outputs), so no uninitialised element reaches
// JAX. `counts[i]` is the elements of the views placed in result i.
Status check_covered(const CallAttrs& a, const std::vector<Buffer>& rets, const std::vector<std::int64_t>& counts) {
  for (std::size_t i = 0; i < rets.size(); ++i) {
    if (static_cast<std::int64_t>(i) == a.workspace) continue;
    std::int64_t n = 1;
    for (std::int64_t d : rets[i].dims) n *= d;
    if (counts[i] != n)
      return Status(StatusCode::internal, "result " + std::to_string(i) + " of shape " + dims_str(rets[i].dims) +
                                              " is covered by " + std::to_string(counts[i]) +
                                              " elements of output views; every element must be written");
  }
  return Status::Ok();
}

// Adds an output view's elements to the count of the result it lives in (checked by view_of).
void add_count(const CallAttrs& a, std::string_view name, std::int64_t elements, std::vector<std::int64_t>* counts) {
  auto it = a.views.find(name);
  if (it != a.views.end() && !it->second.empty()) (*counts)[static_cast<std::size_t>(it->second[0])] += elements;
}

Status build(const CallAttrs& a, const std::vector<Buffer>& args, const std::vector<Buffer>& rets, Memory memory,
             void* stream, ForwardArgs* f) {
  std::int64_t n = 0;
  if (Status s = tensor_view("q", a, args, "argument", &f->q, &n); !s.ok()) return s;
  if (Status s = tensor_view("k", a, args, "argument", &f->k, &n); !s.ok()) return s;
  if (Status s = tensor_view("v", a, args, "argument", &f->v, &n); !s.ok()) return s;
  std::vector<std::int64_t> counts(rets.size(), 0);
  if (Status s = tensor_view("o", a, rets, "result", &f->o, &n); !s.ok()) return s;
  add_count(a, "o", n, &counts);
  n = 0;
  if (Status s = lse_view(a, rets, "result", &f->lse, &n); !s.ok()) return s;
  add_count(a, "lse", n, &counts);
  if (Status s = fill_features(a, args, rets, &counts, f); !s.ok()) return s;
  if (a.max_logit >= 0) {
    const Buffer* ml = nullptr;
    if (Status s = feature_buffer(a.max_logit, rets, "max_logit", "result", &ml); !s.ok()) return s;
    if (Status s = head_view(*ml, "max_logit", true, &f->max_logit); !s.ok()) return s;
    counts[static_cast<std::size_t>(a.max_logit)] += f->max_logit.shape[0] * f->max_logit.shape[1];
  }
  if (Status s = check_covered(a, rets, counts); !s.ok()) return s;
  return fill_common(a, args, rets, memory, stream, f);
}

Status build(const CallAttrs& a, const std::vector<Buffer>& args, const std::vector<Buffer>& rets, Memory memory,
             void* stream, BackwardArgs* b) {
  std::int64_t n = 0;
  if (Status s = tensor_view("q", a, args, "argument", &b->q, &n); !s.ok()) return s;
  if (Status s = tensor_view("k", a, args, "argument", &b->k, &n); !s.ok()) return s;
  if (Status s = tensor_view("v", a, args, "argument", &b->v, &n); !s.ok()) return s;
  if (Status s = tensor_view("o", a, args, "argument", &b->o, &n); !s.ok()) return s;
  if (Status s = tensor_view("do", a, args, "argument", &b->d_o, &n); !s.ok()) return s;
  if (a.views.find("lse") == a.views.end()) return bad("lse view: missing (the backward needs the forward's LSE)");
  if (Status s = lse_view(a, args, "argument", &b->lse, &n); !s.ok()) return s;
  std::vector<std::int64_t> counts(rets.size(), 0);
  TensorView* grads[] = {&b->dq, &b->dk, &b->dv};
  for (int i = 0; i < 3; ++i) {
    if (Status s = tensor_view(kBackwardOutputs[i], a, rets, "result", grads[i], &n); !s.ok()) return s;
    add_count(a, kBackwardOutputs[i], n, &counts);
  }
  if (Status s = fill_features(a, args, rets, &counts, b); !s.ok()) return s;
  if (Status s = check_covered(a, rets, counts); !s.ok()) return s;
  return fill_common(a, args, rets, memory, stream, b);
}

// ---------------------------------------------------------------- handlers

ffi::Error to_error(const Status& s) {
  ffi::ErrorCode code = ffi::ErrorCode::kInternal;
  switch (s.code()) {
    case StatusCode::ok:
      return ffi::Error::Success();
    case StatusCode::invalid_argument:
      code = ffi::ErrorCode::kInvalidArgument;
      break;
    case StatusCode::unsupported:
      code = ffi::ErrorCode::kUnimplemented;
      break;
    case StatusCode::cancelled:
      code = ffi::ErrorCode::kCancelled;
      break;
    case StatusCode::backend_error:
    case StatusCode::internal:
      code = ffi::ErrorCode::kInternal;
      break;
  }
  return ffi::Error(code, "strideattn (" + std::string(to_string(s.code())) + "): " + s.message());
}

Buffer buffer_of(const ffi::AnyBuffer& b) {
  Buffer out;
  out.data = b.untyped_data();
  out.type = b.element_type();
  const auto dims = b.dimensions();
  out.dims.assign(dims.begin(), dims.end());
  return out;
}

template <class Args>
ffi::Error run(Memory memory, void* stream, ffi::RemainingArgs in, ffi::RemainingRets out, ffi::Dictionary attrs) {
  try {
    constexpr bool backward = std::is_same_v<Args, BackwardArgs>;
    CallAttrs a;
    if (Status s = decode_attrs(FfiSource{attrs}, backward, &a); !s.ok()) return to_error(s);
    std::vector<Buffer> args, rets;
    for (std::size_t i = 0; i < in.size(); ++i) {
      ffi::ErrorOr<ffi::AnyBuffer> b = in.get<ffi::AnyBuffer>(i);
      if (b.has_error()) return b.error();
      args.push_back(buffer_of(*b));
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> b = out.get<ffi::AnyBuffer>(i);
      if (b.has_error()) return b.error();
      rets.push_back(buffer_of(**b));
    }
    Args call;
    if (Status s = build(a, args, rets, memory, stream, &call); !s.ok()) return to_error(s);
    if constexpr (backward)
      return to_error(strideattn::backward(call));
    else
      return to_error(strideattn::forward(call));
  } catch (const std::bad_alloc&) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, "strideattn: out of host memory");
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("strideattn: ") + e.what());
  }
}

ffi::Error forward_cpu(ffi::RemainingArgs in, ffi::RemainingRets out, ffi::Dictionary attrs) {
  return run<ForwardArgs>(Memory::host, nullptr, in, out, attrs);
}
ffi::Error backward_cpu(ffi::RemainingArgs in, ffi::RemainingRets out, ffi::Dictionary attrs) {
  return run<BackwardArgs>(Memory::host, nullptr, in, out, attrs);
}
// The stream is XLA's cudaStream_t, passed through as the library's opaque stream: nothing
// here includes a CUDA header, and nothing synchronises.
ffi::Error forward_cuda(void* stream, ffi::RemainingArgs in, ffi::RemainingRets out, ffi::Dictionary attrs) {
  return run<ForwardArgs>(Memory::device, stream, in, out, attrs);
}
ffi::Error backward_cuda(void* stream, ffi::RemainingArgs in, ffi::RemainingRets out, ffi::Dictionary attrs) {
  return run<BackwardArgs>(Memory::device, stream, in, out, attrs);
}

}  // namespace

// Not marked command-buffer compatible: a varlen call with host lengths copies its sequence
// tables from host memory, and the cudnn backend may build a graph on first use, neither of
// which a CUDA graph capture may hold.
XLA_FFI_DEFINE_HANDLER_SYMBOL(strideattn_jax_forward_cpu, forward_cpu,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs<ffi::Dictionary>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(strideattn_jax_backward_cpu, backward_cpu,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs<ffi::Dictionary>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    strideattn_jax_forward_cuda, forward_cuda,
    ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().RemainingArgs().RemainingRets().Attrs<ffi::Dictionary>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    strideattn_jax_backward_cuda, backward_cuda,
    ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().RemainingArgs().RemainingRets().Attrs<ffi::Dictionary>());

namespace {

// ---------------------------------------------------------------- trace-time query

ffi::DataType parse_type(const std::string& name) {
  if (name == "float16") return ffi::DataType::F16;
  if (name == "bfloat16") return ffi::DataType::BF16;
  if (name == "float32") return ffi::DataType::F32;
  if (name == "float64") return ffi::DataType::F64;
  if (name == "int32") return ffi::DataType::S32;
  if (name == "int64") return ffi::DataType::S64;
  if (name == "uint8") return ffi::DataType::U8;
  if (name == "uint32") return ffi::DataType::U32;
  return ffi::DataType::INVALID;
}

// Stand-in addresses for trace time: buffer i of a side starts at its own 1 TiB-aligned
// address, so views keep their offsets and alignment and distinct buffers never meet.
std::vector<Buffer> fake_buffers(const std::vector<std::tuple<std::string, std::vector<std::int64_t>>>& specs,
                                 std::uintptr_t first) {
  std::vector<Buffer> out;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    Buffer b;
    b.type = parse_type(std::get<0>(specs[i]));
    b.dims = std::get<1>(specs[i]);
    b.data = reinterpret_cast<void*>((first + i) << 40);
    b.stand_in = true;
    out.push_back(std::move(b));
  }
  return out;
}

using Spec = std::vector<std::tuple<std::string, std::vector<std::int64_t>>>;

// (status code name, message, workspace bytes) for a call with these buffers and attributes
// on host (device=false) or device memory: what the library's validation and backend
// selection say, and the workspace the backend it chooses needs. Varlen lengths held in
// argument buffers are unknown here: empty sequences stand in, so rules on their values are
// checked when the call runs.
std::tuple<std::string, std::string, std::size_t> query(bool backward, bool device, const Spec& arg_specs,
                                                        const Spec& ret_specs, const nb::dict& attrs) {
  CallAttrs a;
  Status s = decode_attrs(PySource{attrs}, backward, &a);
  const Memory memory = device ? Memory::device : Memory::host;
  std::size_t bytes = 0;
  if (s.ok()) {
    const std::vector<Buffer> args = fake_buffers(arg_specs, 1);
    const std::vector<Buffer> rets = fake_buffers(ret_specs, 1 + arg_specs.size());
    if (backward) {
      BackwardArgs b;
      s = build(a, args, rets, memory, nullptr, &b);
      if (s.ok()) s = workspace_size(b, &bytes);
    } else {
      ForwardArgs f;
      s = build(a, args, rets, memory, nullptr, &f);
      if (s.ok()) s = workspace_size(f, &bytes);
    }
  }
  return {std::string(to_string(s.code())), s.message(), bytes};
}

}  // namespace

NB_MODULE(_jax_ffi, m) {
  m.doc() = "strideattn XLA FFI handlers and their trace-time query (use strideattn.jax, not this module)";
  m.def("handlers", [] {
    // platform -> (forward, backward) handler capsules for jax.ffi.register_ffi_target
    nb::dict d;
    d["cpu"] = nb::make_tuple(nb::capsule(reinterpret_cast<void*>(&strideattn_jax_forward_cpu)),
                              nb::capsule(reinterpret_cast<void*>(&strideattn_jax_backward_cpu)));
    d["CUDA"] = nb::make_tuple(nb::capsule(reinterpret_cast<void*>(&strideattn_jax_forward_cuda)),
                               nb::capsule(reinterpret_cast<void*>(&strideattn_jax_backward_cuda)));
    return d;
  });
  m.def("xla_ffi_api_version", [] { return nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR); });
  m.def("query", &query, nb::arg("backward"), nb::arg("device"), nb::arg("args"), nb::arg("rets"), nb::arg("attrs"));
}
