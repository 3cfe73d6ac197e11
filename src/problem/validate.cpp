// Validation rules of the contract (docs/semantics.md "What is rejected"). The memory-overlap
// test behind the "outputs must not overlap" rules is the algebra in overlap.cpp.
//
// Every failure is one line naming the tensor, the value found and what is supported. The
// rules run in a fixed order (enums, each view alone, dtypes, shapes, options, varlen
// tables, LSE, overlap) and the first failure is returned. Nothing here dereferences a
// tensor pointer, and all size arithmetic is overflow-checked, so garbage input gives a
// message, never a crash.
//
// Decisions:
//  - Negative strides (a reversed view, numpy's x[:, ::-1]) are accepted on the batch, seq
//    and head dimensions: every backend addresses elements with signed 64-bit offsets. The
//    head dimension must be contiguous: stride 1, or -1 (reversed; the host backends read
//    it, the GPU backends refuse it by rule). Size-1 dimensions, the head dimension
//    included, may carry any stride; it is never used.
//  - Zero-size batch, sequence or heads means "nothing to do" (empty outputs); a zero head
//    dim is invalid.
//  - scale must be finite, > 0 and a normal fp32 number (FLT_MIN..FLT_MAX): every backend
//    multiplies fp32 scores by it.
//  - Head dims above what a backend supports are not a validation error (backends refuse).
//  - Data pointers must be aligned to their element size (2 bytes for f16/bf16, 4 for f32
//    and LSE): every backend loads elements through typed pointers.
//  - Window sizes are capped at 2^62 so that the int64 mask arithmetic cannot overflow; any
//    window at least as wide as the sequence is already equivalent to -1 (unbounded).
#include "problem/validate.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "problem/overlap.hpp"

namespace strideattn::detail {

namespace {

using i64 = std::int64_t;
using i128 = __int128;

constexpr i64 kI64Max = std::numeric_limits<i64>::max();
constexpr i64 kMaxWindow = i64{1} << 62;  // window sizes above this overflow the mask arithmetic
constexpr i64 kMaxCuSeqlensCount = std::numeric_limits<std::int32_t>::max() - 1;  // count + 1 int32 entries

Status invalid(const std::string& message) { return Status(StatusCode::invalid_argument, message); }

std::string str(i128 v) {
  if (v == 0) return "0";
  const bool neg = v < 0;
  std::string s;
  while (v != 0) {
    int digit = static_cast<int>(v % 10);
    s.push_back(static_cast<char>('0' + (digit < 0 ? -digit : digit)));
    v /= 10;
  }
  if (neg) s.push_back('-');
  return {s.rbegin(), s.rend()};
}

template <std::size_t N>
std::string shape_str(const std::array<i64, N>& a) {
  std::string s = "[";
  for (std::size_t i = 0; i < N; ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}

constexpr const char* kTensorDims[4] = {"batch", "seq", "head", "head-dim"};
constexpr const char* kLseDims[3] = {"batch", "head", "seq"};

bool valid_dtype(DType d) { return d == DType::f16 || d == DType::bf16 || d == DType::f32; }

// ------------------------------------------------------------------ the tensors of a problem

struct Named {
  const char* name;
  const TensorView* view;
};

struct NamedRegion {
  const char* name;
  Region region;
  i128 data = 0;  // the view's data pointer
};

NamedRegion named_region(const char* name, const TensorView& v) {
  return {name, region_of(v), static_cast<i128>(reinterpret_cast<std::uintptr_t>(v.data))};
}
NamedRegion named_region(const char* name, const LseView& v) {
  return {name, region_of(v), static_cast<i128>(reinterpret_cast<std::uintptr_t>(v.data))};
}

}  // namespace

template <std::size_t N>
Status check_view_alone(const char* name, void* data, i64 elem_bytes, const std::array<i64, N>& shape,
                        const std::array<i64, N>& stride, const char* const* dim_names, int unit_stride_dim,
                        bool deferred) {
  for (std::size_t i = 0; i < N; ++i) {
    if (shape[i] < 0)
      return invalid(std::string(name) + ": " + dim_names[i] + " extent is " + std::to_string(shape[i]) +
                     "; supported: >= 0");
  }
  bool empty = false;
  for (std::size_t i = 0; i < N; ++i) empty = empty || shape[i] == 0;
  // (an empty view has no element to address: its strides are whatever the framework left,
  // e.g. 0 from a DLPack export of a zero-size array)
  if (!empty && unit_stride_dim >= 0 && shape[unit_stride_dim] > 1 && stride[unit_stride_dim] != 1 &&
      stride[unit_stride_dim] != -1)
    return invalid(std::string(name) + ": head-dim stride is " + std::to_string(stride[unit_stride_dim]) +
                   "; supported: 1, or -1 for a reversed head dim (the head dimension must be contiguous)");
  // Elements reach from data + low to data + reach (element offsets; low <= 0 from
  // negative strides). Both ends, in bytes, must fit in int64 and the low end must not
  // fall below address 0.
  i128 reach = 0, low = 0;
  for (std::size_t i = 0; i < N; ++i) {
    if (shape[i] <= 1) continue;  // size-1 dims may carry any stride
    if (empty) continue;
    const i128 step = static_cast<i128>(shape[i] - 1) * stride[i];
    (step < 0 ? low : reach) += step;
    if (reach > kI64Max / elem_bytes - 1 || -low > kI64Max / elem_bytes - 1)
      return invalid(std::string(name) + ": view extent overflows int64 (" + dim_names[i] + " extent " +
                     std::to_string(shape[i]) + " with stride " + std::to_string(stride[i]) +
                     " reaches past byte 2^63); supported: views whose elements lie within 2^63 bytes");
  }
  if (!empty) {
    const i128 base = static_cast<i128>(reinterpret_cast<std::uintptr_t>(data));
    const i128 last = base + reach * elem_bytes;
    if (last > kI64Max)
      return invalid(std::string(name) + ": view extent overflows int64 (pointer plus " + str(reach * elem_bytes) +
                     " bytes); supported: views whose last byte fits in int64");
    if (data != nullptr && base + low * elem_bytes < 0)
      return invalid(std::string(name) + ": negative strides reach " + str(-low * elem_bytes) +
                     " bytes below the data pointer, past address 0; supported: views whose every element "
                     "lies at a valid address");
  }
  if (data == nullptr && !empty && !deferred)
    return invalid(std::string(name) + ": data is null but the view has shape " + shape_str(shape) +
                   "; supported: a valid pointer, or null only for an empty view");
  if (!empty && reinterpret_cast<std::uintptr_t>(data) % static_cast<std::uintptr_t>(elem_bytes) != 0)
    return invalid(std::string(name) + ": data pointer is " +
                   std::to_string(reinterpret_cast<std::uintptr_t>(data) % static_cast<std::uintptr_t>(elem_bytes)) +
                   " bytes past a " + std::to_string(elem_bytes) + "-byte boundary; supported: a pointer aligned to " +
                   "the " + std::to_string(elem_bytes) + "-byte element size");
  return Status::Ok();
}
template Status check_view_alone<2>(const char*, void*, i64, const std::array<i64, 2>&, const std::array<i64, 2>&,
                                    const char* const*, int, bool);
template Status check_view_alone<4>(const char*, void*, i64, const std::array<i64, 4>&, const std::array<i64, 4>&,
                                    const char* const*, int, bool);

namespace {

Status check_tensor_alone(const char* name, const TensorView& v, bool deferred) {
  if (!valid_dtype(v.dtype))
    return invalid(std::string(name) + ": dtype " + std::to_string(static_cast<int>(v.dtype)) +
                   " is unknown; supported: f16, bf16, f32");
  if (v.shape[kHeadDim] == 0) return invalid(std::string(name) + ": head-dim extent is 0; supported: >= 1");
  return check_view_alone(name, v.data, static_cast<i64>(size_of(v.dtype)), v.shape, v.stride, kTensorDims, kHeadDim,
                          deferred);
}

// `a`'s extent of `dim` must equal `b`'s.
Status same_extent(const char* a_name, const TensorView& a, const char* b_name, const TensorView& b, int dim) {
  if (a.shape[dim] == b.shape[dim]) return Status::Ok();
  return invalid(std::string(a_name) + ": " + kTensorDims[dim] + " extent " + std::to_string(a.shape[dim]) +
                 " differs from " + b_name + "'s " + std::to_string(b.shape[dim]));
}

Status same_shape(const char* a_name, const TensorView& a, const char* b_name, const TensorView& b) {
  for (int dim = 0; dim < 4; ++dim)
    if (Status s = same_extent(a_name, a, b_name, b, dim); !s.ok()) return s;
  return Status::Ok();
}

Status check_shapes(const Problem& p) {
  const struct {
    const char *a, *b;
    const TensorView *va, *vb;
    int dim;
  } rules[] = {
      {"k", "q", &p.k, &p.q, kBatch}, {"v", "q", &p.v, &p.q, kBatch},   {"v", "k", &p.v, &p.k, kSeq},
      {"v", "k", &p.v, &p.k, kHead},  {"k", "q", &p.k, &p.q, kHeadDim}, {"o", "q", &p.o, &p.q, kBatch},
      {"o", "q", &p.o, &p.q, kSeq},   {"o", "q", &p.o, &p.q, kHead},    {"o", "v", &p.o, &p.v, kHeadDim},
  };
  for (const auto& r : rules)
    if (Status s = same_extent(r.a, *r.va, r.b, *r.vb, r.dim); !s.ok()) return s;
  if ((p.heads == 0) != (p.kv_heads == 0))
    return invalid("q has " + std::to_string(p.heads) + " heads but k and v have " + std::to_string(p.kv_heads) +
                   "; supported: heads % kv_heads == 0, or both 0 (an empty problem)");
  if (p.kv_heads > 0 && p.heads % p.kv_heads != 0)
    return invalid("heads " + std::to_string(p.heads) + " is not a multiple of kv_heads " + std::to_string(p.kv_heads) +
                   " (q has " + std::to_string(p.heads) + " heads, k and v " + std::to_string(p.kv_heads) +
                   "); supported: heads % kv_heads == 0");
  if (p.is_backward()) {
    if (Status s = same_shape("dO", p.d_o, "o", p.o); !s.ok()) return s;
    if (Status s = same_shape("dq", p.dq, "q", p.q); !s.ok()) return s;
    if (Status s = same_shape("dk", p.dk, "k", p.k); !s.ok()) return s;
    if (Status s = same_shape("dv", p.dv, "v", p.v); !s.ok()) return s;
  }
  return Status::Ok();
}

Status check_options(const Problem& p) {
  if (p.memory != Memory::host && p.memory != Memory::device)
    return invalid("memory " + std::to_string(static_cast<int>(p.memory)) + " is unknown; supported: host, device");
  const int mask = static_cast<int>(p.mask);
  if (mask < 0 || mask > static_cast<int>(MaskKind::causal_bottom_right))
    return invalid("mask kind " + std::to_string(mask) + " is unknown; supported: none, causal, causal_bottom_right");
  if (p.window.left < -1)
    return invalid("window left is " + std::to_string(p.window.left) + "; supported: -1 (unbounded) or >= 0");
  if (p.window.right < -1)
    return invalid("window right is " + std::to_string(p.window.right) + "; supported: -1 (unbounded) or >= 0");
  // The mask arithmetic adds a window to token indices (i + s_kv - s_q + right + 1) in int64;
  // a window near INT64_MAX would overflow it and silently mask every key.
  for (const auto& [side, w] : {std::pair{"left", p.window.left}, std::pair{"right", p.window.right}})
    if (w > kMaxWindow)
      return invalid(std::string("window ") + side + " is " + std::to_string(w) + "; supported: -1 (unbounded) or 0.." +
                     std::to_string(kMaxWindow) +
                     " (2^62; a window as wide as the sequence already acts as unbounded)");
  // Normal fp32 range: backends multiply fp32 scores by the scale rounded to fp32, so a
  // value that rounds to inf, 0 or a subnormal would change the answer.
  if (!(p.scale >= static_cast<double>(std::numeric_limits<float>::min()) &&
        p.scale <= static_cast<double>(std::numeric_limits<float>::max()))) {
    auto shortest = [](auto x) {  // the shortest text that reads back as the same value
      char buf[64];
      const auto r = std::to_chars(buf, buf + sizeof buf, x);
      return std::string(buf, r.ptr);
    };
    return invalid("scale is " + shortest(p.scale) + "; supported: a finite value > 0 that is a normal fp32 number (" +
                   shortest(std::numeric_limits<float>::min()) + " to " + shortest(std::numeric_limits<float>::max()) +
                   ")");
  }
  return Status::Ok();
}

}  // namespace

// One side's varlen tables against the token extent of its views. `lens` and `offs` name the
// lists in messages (seqlens_q / offsets_q, or what the cu_seqlens arrays were read into).
Status check_varlen_side(const char* side, const char* tensor, const std::vector<i64>& seqlens,
                         const std::vector<i64>& offsets, i64 tokens, const std::string& lens,
                         const std::string& offs) {
  if (offsets.size() != seqlens.size())
    return invalid("varlen: " + offs + " has " + std::to_string(offsets.size()) + " entries but " + lens + " has " +
                   std::to_string(seqlens.size()) +
                   "; supported: one offset per sequence (or none: packed back to back)");
  struct Seq {
    i64 begin, end;
    std::size_t index;
  };
  std::vector<Seq> seqs;
  for (std::size_t i = 0; i < seqlens.size(); ++i) {
    if (seqlens[i] < 0)
      return invalid("varlen: " + lens + "[" + std::to_string(i) + "] is " + std::to_string(seqlens[i]) +
                     "; supported: >= 0");
    if (offsets[i] < 0)
      return invalid("varlen: " + offs + "[" + std::to_string(i) + "] is " + std::to_string(offsets[i]) +
                     "; supported: >= 0");
    const i128 end = static_cast<i128>(offsets[i]) + seqlens[i];
    if (end > tokens)
      return invalid(std::string(tensor) + ": sequence " + std::to_string(i) + " runs to token " + str(end) + " but " +
                     tensor + " has " + std::to_string(tokens) + " tokens");
    if (seqlens[i] > 0) seqs.push_back({offsets[i], static_cast<i64>(end), i});
  }
  std::sort(seqs.begin(), seqs.end(), [](const Seq& a, const Seq& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < seqs.size(); ++i) {
    if (seqs[i].begin < seqs[i - 1].end) {
      const Seq &a = seqs[i - 1], &b = seqs[i];
      return invalid(std::string("varlen: ") + side + " sequences " + std::to_string(std::min(a.index, b.index)) +
                     " and " + std::to_string(std::max(a.index, b.index)) + " overlap (tokens [" +
                     std::to_string(a.begin) + ", " + std::to_string(a.end) + ") and [" + std::to_string(b.begin) +
                     ", " + std::to_string(b.end) + ")); supported: disjoint sequences");
    }
  }
  return Status::Ok();
}

namespace {

// The cu_seqlens form (Varlen::count > 0): what can be checked without reading the arrays.
Status check_cu_seqlens(const Problem& p, Pointers mode, const Varlen& vl) {
  const bool any_array = vl.cu_seqlens_q || vl.cu_seqlens_kv || vl.seq_offsets_q || vl.seq_offsets_kv;
  if (vl.count == 0) {
    if (any_array || vl.max_seqlen_q != 0 || vl.max_seqlen_kv != 0)
      return invalid(
          "varlen: cu_seqlens arrays or max_seqlen bounds are set but count is 0; supported: count = the number "
          "of sequences (cu_seqlens_q has count + 1 entries), or none of them (dense, or seqlens lists)");
    return Status::Ok();
  }
  if (vl.count < 0 || vl.count > kMaxCuSeqlensCount)
    return invalid("varlen: count is " + std::to_string(vl.count) + "; supported: 1 to " +
                   std::to_string(kMaxCuSeqlensCount) + " sequences (int32 cu_seqlens)");
  if (!vl.seqlens_q.empty() || !vl.seqlens_kv.empty() || !vl.offsets_q.empty() || !vl.offsets_kv.empty())
    return invalid("varlen: both forms are given (seqlens/offsets lists and count " + std::to_string(vl.count) +
                   " with cu_seqlens arrays); supported: one of them");
  const struct {
    const char* name;
    i64 max;
    i64 tokens;
    const char* tensor;
  } bounds[] = {{"max_seqlen_q", vl.max_seqlen_q, p.q.shape[kSeq], "q"},
                {"max_seqlen_kv", vl.max_seqlen_kv, p.k.shape[kSeq], "k"}};
  for (const auto& b : bounds)
    if (b.max < 0 || b.max > b.tokens)
      return invalid(std::string("varlen: ") + b.name + " is " + std::to_string(b.max) + "; supported: 0 to the " +
                     std::to_string(b.tokens) + " tokens of " + b.tensor + " (a sequence lies within the view)");
  const struct {
    const char* name;
    const std::int32_t* ptr;
    bool required;
  } arrays[] = {{"cu_seqlens_q", vl.cu_seqlens_q, true},
                {"cu_seqlens_kv", vl.cu_seqlens_kv, true},
                {"seq_offsets_q", vl.seq_offsets_q, false},
                {"seq_offsets_kv", vl.seq_offsets_kv, false}};
  for (const auto& a : arrays) {
    if (a.ptr == nullptr && a.required && mode == Pointers::bound)
      return invalid(std::string("varlen: count is ") + std::to_string(vl.count) + " but " + a.name +
                     " is null; supported: an int32 array of count + 1 entries in the tensors' memory");
    if (reinterpret_cast<std::uintptr_t>(a.ptr) % 4 != 0)
      return invalid(std::string("varlen: ") + a.name + " is " +
                     std::to_string(reinterpret_cast<std::uintptr_t>(a.ptr) % 4) +
                     " bytes past a 4-byte boundary; supported: an int32 array aligned to 4 bytes");
  }
  return Status::Ok();
}

Status check_varlen(const Problem& p, const std::vector<Named>& tensors, Pointers mode, const Varlen& given) {
  if (Status s = check_cu_seqlens(p, mode, given); !s.ok()) return s;
  if (!p.varlen) return Status::Ok();
  if (p.cu_seqlens) {
    for (const Named& t : tensors)
      if (t.view->shape[kBatch] != 1)
        return invalid(std::string(t.name) + ": batch extent is " + std::to_string(t.view->shape[kBatch]) +
                       " in a varlen problem; supported: 1 (the seq dimension counts tokens)");
    return Status::Ok();
  }
  if (p.seqlens_q.size() != p.seqlens_kv.size())
    return invalid("varlen: seqlens_q has " + std::to_string(p.seqlens_q.size()) + " sequences but seqlens_kv has " +
                   std::to_string(p.seqlens_kv.size()) + "; supported: the same count on both sides");
  for (const Named& t : tensors) {
    if (t.view->shape[kBatch] != 1)
      return invalid(std::string(t.name) + ": batch extent is " + std::to_string(t.view->shape[kBatch]) +
                     " in a varlen problem; supported: 1 (the seq dimension counts tokens)");
  }
  if (Status s = check_varlen_side("q", "q", p.seqlens_q, p.offsets_q, p.q.shape[kSeq], "seqlens_q", "offsets_q");
      !s.ok())
    return s;
  return check_varlen_side("kv", "k", p.seqlens_kv, p.offsets_kv, p.k.shape[kSeq], "seqlens_kv", "offsets_kv");
}

Status check_lse(const Problem& p, Pointers mode) {
  const bool deferred = mode == Pointers::deferred;
  if (!p.is_backward() && !p.writes_lse()) return Status::Ok();  // forward: LSE not requested
  if (p.lse.data == nullptr && !deferred)
    return invalid("lse: data is null; supported: backward needs the forward's LSE [b, h, s_q] (fp32)");
  if (Status s = check_view_alone("lse", p.lse.data, 4, p.lse.shape, p.lse.stride, kLseDims, -1, deferred); !s.ok())
    return s;
  const std::array<i64, 3> want{p.varlen ? 1 : p.q.shape[kBatch], p.q.shape[kHead], p.q.shape[kSeq]};
  if (p.lse.shape != want)
    return invalid("lse: shape " + shape_str(p.lse.shape) + " differs from " +
                   (p.varlen ? "[1, h, tokens_q] = " : "[b, h, s_q] = ") + shape_str(want));
  return Status::Ok();
}

std::string witness_text(const NamedRegion& a, const NamedRegion& b, const OverlapResult& r) {
  return std::string("(") + a.name + " data + " + str(r.witness - a.data) + " bytes is " + b.name + " data + " +
         str(r.witness - b.data) + " bytes)";
}

}  // namespace

Status check_overlap(const Problem& p) {
  std::vector<NamedRegion> inputs, outputs;
  inputs.push_back(named_region("q", p.q));
  inputs.push_back(named_region("k", p.k));
  inputs.push_back(named_region("v", p.v));
  if (p.is_backward()) {
    inputs.push_back(named_region("o", p.o));
    inputs.push_back(named_region("dO", p.d_o));
    inputs.push_back(named_region("lse", p.lse));
    outputs.push_back(named_region("dq", p.dq));
    outputs.push_back(named_region("dk", p.dk));
    outputs.push_back(named_region("dv", p.dv));
  } else {
    outputs.push_back(named_region("o", p.o));
    if (p.writes_lse()) outputs.push_back(named_region("lse", p.lse));
  }
  // Training features: their inputs, and their outputs (max logit, dBias, d_sink).
  const auto bias_as = [](const BiasView& b) { return TensorView{b.data, b.dtype, b.shape, b.stride}; };
  const auto head_as = [](const HeadView& h) {
    return LseView{h.data, {h.shape[0], h.shape[1], 1}, {h.stride[0], h.stride[1], 1}};
  };
  if (p.bias_on()) inputs.push_back(named_region("bias", bias_as(p.bias)));
  if (p.alibi_on) inputs.push_back(named_region("alibi_slopes", head_as(p.alibi)));
  if (p.sinks_on) inputs.push_back(named_region("sinks", head_as(p.sinks)));
  if (p.max_logit_on) outputs.push_back(named_region("max_logit", head_as(p.max_logit)));
  if (p.dbias_on) outputs.push_back(named_region("dbias", bias_as(p.dbias)));
  if (p.d_sinks_on) outputs.push_back(named_region("d_sinks", head_as(p.d_sinks)));
  for (const NamedRegion& out : outputs) {
    const OverlapResult r = self_overlap(out.region);
    if (!r.overlap) continue;
    if (!r.exact)
      return invalid(std::string(out.name) +
                     " may overlap itself (strides not nested and too many rows to check exactly); "
                     "supported: outputs whose elements have distinct addresses");
    return invalid(std::string(out.name) + " overlaps itself: two of its elements share " + out.name + " data + " +
                   str(r.witness - out.data) + " bytes; supported: outputs whose elements have distinct addresses");
  }
  auto check_pair = [](const NamedRegion& out, const NamedRegion& other) -> Status {
    const OverlapResult r = overlap_regions(out.region, other.region);
    if (!r.overlap) return Status::Ok();
    if (!r.exact)
      return invalid(std::string(out.name) + " may overlap " + other.name +
                     " in memory (byte ranges intersect and the strides are too irregular to check "
                     "exactly); supported: outputs disjoint from every other tensor");
    return invalid(std::string(out.name) + " overlaps " + other.name + " in memory " + witness_text(out, other, r) +
                   "; supported: outputs disjoint from every other tensor");
  };
  // A plan's pointer given at run time (null) has no address yet: its pairs are the run's.
  auto known = [](const NamedRegion& r) { return r.data != 0 || r.region.empty; };
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (!known(outputs[i])) continue;
    for (const NamedRegion& in : inputs)
      if (known(in))
        if (Status s = check_pair(outputs[i], in); !s.ok()) return s;
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (known(outputs[j]))
        if (Status s = check_pair(outputs[i], outputs[j]); !s.ok()) return s;
  }
  return Status::Ok();
}

Status validate_problem(const Problem& p, Pointers mode, const Varlen& varlen) {
  const bool deferred = mode == Pointers::deferred;
  std::vector<Named> tensors = {{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"o", &p.o}};
  if (p.is_backward()) {
    tensors.push_back({"dO", &p.d_o});
    tensors.push_back({"dq", &p.dq});
    tensors.push_back({"dk", &p.dk});
    tensors.push_back({"dv", &p.dv});
  }
  for (const Named& t : tensors)
    if (Status s = check_tensor_alone(t.name, *t.view, deferred); !s.ok()) return s;
  for (const Named& t : tensors) {
    if (t.view->dtype != p.q.dtype)
      return invalid(std::string(t.name) + ": dtype " + std::string(to_string(t.view->dtype)) + " differs from q's " +
                     std::string(to_string(p.q.dtype)) + "; supported: one dtype for every tensor (LSE is fp32)");
  }
  if (Status s = check_shapes(p); !s.ok()) return s;
  if (Status s = check_options(p); !s.ok()) return s;
  if (Status s = check_varlen(p, tensors, mode, varlen); !s.ok()) return s;
  if (Status s = check_lse(p, mode); !s.ok()) return s;
  if (Status s = check_features(p, mode); !s.ok()) return s;
  return check_overlap(p);
}

Status check_tensor_view(const char* name, const TensorView& view, Pointers mode) {
  return check_tensor_alone(name, view, mode == Pointers::deferred);
}

Status check_lse_view(const LseView& view, Pointers mode) {
  return check_view_alone("lse", view.data, 4, view.shape, view.stride, kLseDims, -1, mode == Pointers::deferred);
}

Status check_problem_options(const Problem& problem) { return check_options(problem); }

}  // namespace strideattn::detail
