// Layout description (issue "Foundation" item 4): names the views of Q, K and V in the
// field's vocabulary only when their strides and pointer offsets really are that layout,
// otherwise says what they are. Description only: no kernel reads it.
//
// Names given (dense):  <f>_<f>_<f> for separate contiguous tensors, f in bshd, sbhd, bhsd
// (mixed q vs kv formats allowed, e.g. sbhd_bshd_bshd); sb3hd, sbh3d, bs3hd, bsh3d (q, k, v
// in one buffer); sbhd_sb2hd, sbhd_sbh2d, bshd_bs2hd, bshd_bsh2d (k, v in one buffer).
// Varlen: thd_thd_thd, t3hd, th3d, thd_t2hd, thd_th2d.
// Otherwise: a split of one fused [s, b, h + 2hg, d] buffer (and its bs / t forms) is
// described as such, other shared buffers by their row geometry, and lone tensors by their
// strides. When O or dO is not contiguous in a named format, a note about it is appended.
//
// We only have pointers, not allocations: views are taken to share a buffer when their
// strides agree and their pointer differences are whole elements that place them side by
// side within one row. Size-1 dimensions may carry any stride and are ignored when matching.
#include "problem/layout.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strideattn::detail {

namespace {

using i64 = std::int64_t;

enum class Format { bshd, sbhd, bhsd, thd };

const char* format_name(Format f) {
  switch (f) {
    case Format::bshd:
      return "bshd";
    case Format::sbhd:
      return "sbhd";
    case Format::bhsd:
      return "bhsd";
    case Format::thd:
      return "thd";
  }
  return "?";
}

// Prefix of a packed name for the q-side format: "sb", "bs", "t".
const char* row_prefix(Format f) {
  switch (f) {
    case Format::sbhd:
      return "sb";
    case Format::bshd:
      return "bs";
    case Format::thd:
      return "t";
    case Format::bhsd:
      break;
  }
  return "?";
}

// Strides agree with `want` on every dimension of extent > 1.
bool strides_match(const TensorView& v, const Dims4& want) {
  for (int i = 0; i < 4; ++i)
    if (v.shape[i] > 1 && v.stride[i] != want[i]) return false;
  return true;
}

// A view whose (b, s) rows hold `row` elements with heads `head_stride` apart, in `format`
// (sbhd: batch inner; bshd / thd: seq inner). Batch extent for sbhd rows is the view's own.
bool matches_rows(const TensorView& v, Format format, i64 row, i64 head_stride) {
  const i64 b = v.shape[kBatch], s = v.shape[kSeq];
  switch (format) {
    case Format::bshd:
    case Format::thd:
      return strides_match(v, {s * row, row, head_stride, 1});
    case Format::sbhd:
      return strides_match(v, {row, b * row, head_stride, 1});
    case Format::bhsd:
      break;
  }
  return false;
}

bool contiguous_in(const TensorView& v, Format f) {
  const i64 s = v.shape[kSeq], h = v.shape[kHead], d = v.shape[kHeadDim];
  if (f == Format::bhsd) return strides_match(v, {h * s * d, d, s * d, 1});
  return matches_rows(v, f, h * d, d);
}

std::vector<Format> formats_of(const Problem& p) {
  if (p.varlen) return {Format::thd};
  return {Format::sbhd, Format::bshd, Format::bhsd};  // preference when memory is ambiguous
}

// Element offset of `b` from `a`, when it is a whole number of elements.
std::optional<i64> element_delta(const TensorView& a, const TensorView& b) {
  const auto pa = reinterpret_cast<std::intptr_t>(a.data), pb = reinterpret_cast<std::intptr_t>(b.data);
  const i64 bytes = static_cast<i64>(pb - pa), es = static_cast<i64>(size_of(a.dtype));
  if (bytes % es != 0) return std::nullopt;
  return bytes / es;
}

std::string strides_text(const TensorView& v) {
  return "shape [" + std::to_string(v.shape[0]) + ", " + std::to_string(v.shape[1]) + ", " +
         std::to_string(v.shape[2]) + ", " + std::to_string(v.shape[3]) + "] strides (b " +
         std::to_string(v.stride[0]) + ", s " + std::to_string(v.stride[1]) + ", h " + std::to_string(v.stride[2]) +
         ", d " + std::to_string(v.stride[3]) + ")";
}

// The named contiguous format of one tensor, or a description of its strides.
std::string describe_tensor(const Problem& p, const char* name, const TensorView& v) {
  for (Format f : formats_of(p))
    if (contiguous_in(v, f)) return std::string(name) + ": " + format_name(f);
  return std::string(name) + ": " + strides_text(v) + ", not a named layout";
}

// ---------------------------------------------------------------- named layouts

// q, k, v in one buffer: <rows>3hd or <rows>h3d.
std::optional<std::string> packed_qkv(const Problem& p) {
  const TensorView &q = p.q, &k = p.k, &v = p.v;
  if (q.shape != k.shape || q.shape != v.shape) return std::nullopt;  // needs h == hg, d_qk == d_v
  const auto dk = element_delta(q, k), dv = element_delta(q, v);
  if (!dk || !dv) return std::nullopt;
  const i64 h = q.shape[kHead], d = q.shape[kHeadDim], row = 3 * h * d;
  for (Format f : formats_of(p)) {
    if (f == Format::bhsd) continue;
    const bool all_rows_3hd = matches_rows(q, f, row, d) && matches_rows(k, f, row, d) && matches_rows(v, f, row, d);
    if (all_rows_3hd && *dk == h * d && *dv == 2 * h * d) return std::string(row_prefix(f)) + "3hd";
    const bool all_rows_h3d =
        matches_rows(q, f, row, 3 * d) && matches_rows(k, f, row, 3 * d) && matches_rows(v, f, row, 3 * d);
    if (all_rows_h3d && *dk == d && *dv == 2 * d) return std::string(row_prefix(f)) + "h3d";
  }
  return std::nullopt;
}

// q contiguous alone, k and v in one buffer: <q format>_<rows>2hd or _<rows>h2d.
std::optional<std::string> packed_kv(const Problem& p) {
  const TensorView &q = p.q, &k = p.k, &v = p.v;
  if (k.shape != v.shape) return std::nullopt;  // needs d_qk == d_v
  const auto delta = element_delta(k, v);
  if (!delta) return std::nullopt;
  const i64 hg = k.shape[kHead], d = k.shape[kHeadDim], row = 2 * hg * d;
  for (Format f : formats_of(p)) {
    if (f == Format::bhsd || !contiguous_in(q, f)) continue;
    const std::string base = std::string(format_name(f)) + "_" + row_prefix(f);
    if (matches_rows(k, f, row, d) && matches_rows(v, f, row, d) && *delta == hg * d) return base + "2hd";
    if (matches_rows(k, f, row, 2 * d) && matches_rows(v, f, row, 2 * d) && *delta == d) return base + "h2d";
  }
  return std::nullopt;
}

// Each tensor contiguous in its own format; one common format preferred when memory is
// ambiguous (size-1 dims).
std::optional<std::string> separate(const Problem& p) {
  const TensorView* views[3] = {&p.q, &p.k, &p.v};
  for (Format f : formats_of(p)) {
    if (contiguous_in(p.q, f) && contiguous_in(p.k, f) && contiguous_in(p.v, f))
      return std::string(format_name(f)) + "_" + format_name(f) + "_" + format_name(f);
  }
  std::string name;
  for (const TensorView* v : views) {
    std::optional<Format> found;
    for (Format f : formats_of(p)) {
      if (contiguous_in(*v, f)) {
        found = f;
        break;
      }
    }
    if (!found) return std::nullopt;
    if (!name.empty()) name += '_';
    name += format_name(*found);
  }
  return name;
}

// ---------------------------------------------------------------- descriptions

// Strides (b, s) and head stride shared by views that sit side by side in one buffer.
struct SharedRows {
  Format format = Format::sbhd;
  i64 row = 0;  // elements per (b, s) row
  i64 head_stride = 0;
};

// Whether `views` (same b, s extents) are consistent with one buffer of rows in some format:
// common head stride, the same row geometry, and pointer offsets inside one row.
std::optional<SharedRows> shared_rows(const Problem& p, const std::vector<const TensorView*>& views,
                                      std::vector<i64>* deltas) {
  const TensorView& first = *views.front();
  const i64 hs = first.shape[kHead] > 1 ? first.stride[kHead] : first.shape[kHeadDim];
  deltas->assign(1, 0);
  for (std::size_t i = 1; i < views.size(); ++i) {
    const auto d = element_delta(first, *views[i]);
    if (!d || *d < 0 || views[i]->dtype != first.dtype) return std::nullopt;
    deltas->push_back(*d);
  }
  for (Format f : formats_of(p)) {
    if (f == Format::bhsd) continue;
    // Row length from the stride of the dimension inner to the other: sbhd -> batch, else seq.
    const int row_dim = (f == Format::sbhd) ? kBatch : kSeq;
    const int other_dim = (f == Format::sbhd) ? kSeq : kBatch;
    i64 row = first.shape[row_dim] > 1 ? first.stride[row_dim] : 0;
    if (row == 0 && first.shape[other_dim] > 1) row = first.stride[other_dim] / std::max<i64>(first.shape[row_dim], 1);
    if (row <= 0) continue;
    bool ok = true;
    for (std::size_t i = 0; i < views.size() && ok; ++i) {
      const TensorView& v = *views[i];
      const i64 h = v.shape[kHead], d = v.shape[kHeadDim];
      ok = matches_rows(v, f, row, h > 1 ? hs : d) && (*deltas)[i] + (h - 1) * hs + d <= row;
    }
    if (ok) return SharedRows{f, row, hs};
  }
  return std::nullopt;
}

std::string geometry_text(const SharedRows& g, const TensorView& v) {
  std::string s = "head stride " + std::to_string(g.head_stride);
  if (g.format == Format::sbhd) {
    s += ", sequence stride " + std::to_string(v.shape[kBatch] * g.row);
    if (v.shape[kBatch] > 1) s += ", batch stride " + std::to_string(g.row);
  } else {
    s += ", sequence stride " + std::to_string(g.row);
    if (v.shape[kBatch] > 1) s += ", batch stride " + std::to_string(v.shape[kSeq] * g.row);
  }
  return s;
}

std::optional<std::string> describe_shared(const Problem& p) {
  const i64 h = p.q.shape[kHead], hg = p.k.shape[kHead], d = p.q.shape[kHeadDim];
  std::vector<i64> deltas;
  if (auto g = shared_rows(p, {&p.q, &p.k, &p.v}, &deltas)) {
    const bool split = g->head_stride == d && p.v.shape[kHeadDim] == d && deltas[1] == h * d &&
                       deltas[2] == (h + hg) * d && g->row == (h + 2 * hg) * d;
    const std::string prefix = row_prefix(g->format);
    if (split)
      return "q, k, v share one buffer: split of " + prefix + "(h+2hg)d with h " + std::to_string(h) + ", hg " +
             std::to_string(hg) + ", " + geometry_text(*g, p.q);
    return "q, k, v share one buffer of " + prefix + "-ordered rows of " + std::to_string(g->row) +
           " elements (q at element 0, k at " + std::to_string(deltas[1]) + ", v at " + std::to_string(deltas[2]) +
           "), " + geometry_text(*g, p.q) + ", not a named layout";
  }
  if (auto g = shared_rows(p, {&p.k, &p.v}, &deltas)) {
    return describe_tensor(p, "q", p.q) + "; k, v share one buffer of " + row_prefix(g->format) + "-ordered rows of " +
           std::to_string(g->row) + " elements (v at element " + std::to_string(deltas[1]) + " from k), " +
           geometry_text(*g, p.k) + ", not a named layout";
  }
  return std::nullopt;
}

// Notes for outputs / gradient inputs that are not contiguous in a named format.
std::string output_notes(const Problem& p) {
  std::string notes;
  auto note = [&](const char* name, const TensorView& v) {
    if (v.data == nullptr) return;
    for (Format f : formats_of(p))
      if (contiguous_in(v, f)) return;
    notes += std::string("; ") + name + ": " + strides_text(v);
  };
  if (!p.is_backward()) note("o", p.o);
  if (p.is_backward()) note("dO", p.d_o);
  return notes;
}

}  // namespace

std::string describe_layout(const Problem& p) {
  std::string name;
  if (auto n = packed_qkv(p))
    name = *n;
  else if (auto n2 = packed_kv(p))
    name = *n2;
  else if (auto n3 = separate(p))
    name = *n3;
  else if (auto n4 = describe_shared(p))
    name = *n4;
  else
    name = describe_tensor(p, "q", p.q) + "; " + describe_tensor(p, "k", p.k) + "; " + describe_tensor(p, "v", p.v);
  return name + output_notes(p);
}

}  // namespace strideattn::detail
