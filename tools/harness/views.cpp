// Layout name -> views of named buffers, for the CLI, the fuzzer and the tests.
//
// Every view is given in logical [b, s, h, d] order with the real strides of the memory
// layout the name stands for. The buffers a layout makes:
//   separate layouts (bshd_bshd_bshd, ...): "q", "k", "v", each contiguous in its format;
//   qkv-packed (sb3hd, sbh3d, bs3hd, bsh3d, t3hd, th3d) and split of one fused buffer
//     (sb(h+2hg)d, bs(h+2hg)d, t(h+2hg)d): "qkv";
//   kv-packed (sbhd_sb2hd, ...): "q" and "kv".
// Outputs o and d_o are separate contiguous buffers "o", "do" in the q side's format.
// Gradients mirror their tensors: "dq"/"dk"/"dv", or "dqkv" / "dkv" with the same strides
// and offsets as "qkv" / "kv".
// Varlen (thd) layouts: batch extent 1, the seq dimension counts tokens
// (ProblemSizes::q_tokens / kv_tokens).
#include "harness/views.hpp"

#include <algorithm>
#include <optional>
#include <sstream>
#include <string>

#include "harness/checked.hpp"

namespace strideattn::harness {

namespace {

// Sum of lengths, and the largest offset + length, of one side's varlen tables. Offsets
// missing (or fewer than lengths) count as packed back to back. Saturates at kInt64Max
// (make_layout_views refuses such tables).
std::int64_t varlen_tokens(const std::vector<std::int64_t>& seqlens, const std::vector<std::int64_t>& offsets) {
  std::int64_t packed = 0, reach = 0;
  for (std::size_t i = 0; i < seqlens.size(); ++i) {
    const std::int64_t len = std::max<std::int64_t>(seqlens[i], 0);
    const std::int64_t start = i < offsets.size() ? offsets[i] : packed;
    packed = saturating_add(packed, len);
    reach = std::max(reach, saturating_add(start, len));
  }
  return std::max(packed, reach);
}

Status bad(std::string message) { return Status(StatusCode::invalid_argument, std::move(message)); }

std::string str(std::int64_t x) { return std::to_string(x); }

// Every sequence's offset + length, and the packed total, must fit in int64.
Status check_varlen_side(const char* side, const std::vector<std::int64_t>& seqlens,
                         const std::vector<std::int64_t>& offsets) {
  std::int64_t packed = 0;
  for (std::size_t i = 0; i < seqlens.size(); ++i) {
    const std::int64_t len = std::max<std::int64_t>(seqlens[i], 0);
    if (i < offsets.size() && !checked_add(offsets[i], len))
      return bad(std::string("--offsets-") + side + " " + str(offsets[i]) + " plus --seqlens-" + side + " " + str(len) +
                 " (sequence " + str(std::int64_t(i)) + ") overflows a 64-bit token index");
    const std::optional<std::int64_t> next = checked_add(packed, len);
    if (!next) return bad(std::string("--seqlens-") + side + ": the token counts sum to more than 2^63 - 1");
    packed = *next;
  }
  return Status::Ok();
}

// Memory formats of one side (q side or kv side) of a layout.
enum class Format { bshd, sbhd, bhsd, thd };

// What a layout name means.
struct LayoutKind {
  Format q_format = Format::bshd;
  Format kv_format = Format::bshd;
  enum class Packing { separate, qkv_3hd, qkv_h3d, kv_2hd, kv_h2d, fused_split } packing = Packing::separate;
};

bool parse_layout(std::string_view name, LayoutKind* kind) {
  using P = LayoutKind::Packing;
  struct Entry {
    std::string_view name;
    Format q, kv;
    P packing;
  };
  static constexpr Entry kTable[] = {
      {"bshd_bshd_bshd", Format::bshd, Format::bshd, P::separate},
      {"sbhd_sbhd_sbhd", Format::sbhd, Format::sbhd, P::separate},
      {"bhsd_bhsd_bhsd", Format::bhsd, Format::bhsd, P::separate},
      {"sb3hd", Format::sbhd, Format::sbhd, P::qkv_3hd},
      {"sbh3d", Format::sbhd, Format::sbhd, P::qkv_h3d},
      {"bs3hd", Format::bshd, Format::bshd, P::qkv_3hd},
      {"bsh3d", Format::bshd, Format::bshd, P::qkv_h3d},
      {"sbhd_sb2hd", Format::sbhd, Format::sbhd, P::kv_2hd},
      {"sbhd_sbh2d", Format::sbhd, Format::sbhd, P::kv_h2d},
      {"bshd_bs2hd", Format::bshd, Format::bshd, P::kv_2hd},
      {"bshd_bsh2d", Format::bshd, Format::bshd, P::kv_h2d},
      {"thd_thd_thd", Format::thd, Format::thd, P::separate},
      {"t3hd", Format::thd, Format::thd, P::qkv_3hd},
      {"th3d", Format::thd, Format::thd, P::qkv_h3d},
      {"thd_t2hd", Format::thd, Format::thd, P::kv_2hd},
      {"thd_th2d", Format::thd, Format::thd, P::kv_h2d},
      {"sb(h+2hg)d", Format::sbhd, Format::sbhd, P::fused_split},
      {"bs(h+2hg)d", Format::bshd, Format::bshd, P::fused_split},
      {"t(h+2hg)d", Format::thd, Format::thd, P::fused_split},
  };
  for (const Entry& e : kTable) {
    if (e.name == name) {
      kind->q_format = e.q;
      kind->kv_format = e.kv;
      kind->packing = e.packing;
      return true;
    }
  }
  return false;
}

// Strides of a tensor stored in `format` where one (s, b) or (t) row holds `row` elements
// (row = heads * d for a plain tensor; larger when heads of other tensors are interleaved),
// and heads are `head_stride` apart.
struct RowGeometry {
  std::int64_t batch = 1, seq = 1;  // extents of the buffer's b and s (tokens for thd)
  std::int64_t row = 0;             // elements per (b, s) row of the buffer
  std::int64_t head_stride = 0;
};

Dims4 strides_of(Format format, const RowGeometry& g) {
  switch (format) {
    case Format::bshd:
      return {g.seq * g.row, g.row, g.head_stride, 1};
    case Format::sbhd:
      return {g.row, g.batch * g.row, g.head_stride, 1};
    case Format::thd:
      return {g.seq * g.row, g.row, g.head_stride, 1};
    case Format::bhsd:
      break;  // only made by contiguous_view
  }
  return {0, 0, 0, 1};
}

// One contiguous tensor [b, s, h, d] stored in `format`, in its own buffer.
ViewSpec contiguous_view(std::string buffer, Format format, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                         std::int64_t d) {
  ViewSpec v;
  v.buffer = std::move(buffer);
  v.shape = {batch, seq, heads, d};
  if (format == Format::bhsd) {
    v.stride = {heads * seq * d, d, seq * d, 1};
  } else {
    v.stride = strides_of(format, RowGeometry{.batch = batch, .seq = seq, .row = heads * d, .head_stride = d});
  }
  return v;
}

ViewSpec packed_view(std::string buffer, Format format, const RowGeometry& g, std::int64_t offset, std::int64_t heads,
                     std::int64_t d) {
  ViewSpec v;
  v.buffer = std::move(buffer);
  v.offset = offset;
  v.shape = {g.batch, g.seq, heads, d};
  v.stride = strides_of(format, g);
  return v;
}

ViewSpec renamed(ViewSpec v, std::string buffer) {
  v.buffer = std::move(buffer);
  return v;
}

}  // namespace

std::int64_t ProblemSizes::q_tokens() const { return varlen() ? varlen_tokens(seqlens_q, offsets_q) : s_q; }

std::int64_t ProblemSizes::kv_tokens() const { return varlen() ? varlen_tokens(seqlens_kv, offsets_kv) : s_kv; }

const std::vector<std::string>& layout_names() {
  static const std::vector<std::string> kNames = {
      "bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd", "sb3hd",      "sbh3d",       "bs3hd", "bsh3d",
      "sbhd_sb2hd",     "sbhd_sbh2d",     "bshd_bs2hd",     "bshd_bsh2d", "thd_thd_thd", "t3hd",  "th3d",
      "thd_t2hd",       "thd_th2d",       "sb(h+2hg)d",     "bs(h+2hg)d", "t(h+2hg)d"};
  return kNames;
}

Status make_layout_views(std::string_view layout, const ProblemSizes& sizes, LayoutViews* out) {
  if (out == nullptr) return bad("make_layout_views: out is null");
  LayoutKind kind;
  if (!parse_layout(layout, &kind)) {
    std::string known;
    for (const auto& n : layout_names()) known += (known.empty() ? "" : ", ") + n;
    return bad("unknown layout '" + std::string(layout) + "'; supported: " + known);
  }
  const std::string name(layout);
  const bool thd = kind.q_format == Format::thd;
  if (thd && !sizes.varlen()) return bad("layout " + name + " is varlen (thd) and needs --seqlens-q/--seqlens-kv");
  if (!thd && sizes.varlen())
    return bad("layout " + name +
               " is dense; varlen sequence lengths need a thd layout (thd_thd_thd, t3hd, th3d, "
               "thd_t2hd, thd_th2d, t(h+2hg)d)");
  if (sizes.batch < 0 || sizes.s_q < 0 || sizes.s_kv < 0 || sizes.heads < 0 || sizes.kv_heads < 0 || sizes.d_qk < 0 ||
      sizes.d_v < 0)
    return bad("layout " + name + ": sizes must not be negative");
  if (thd) {
    if (Status s = check_varlen_side("q", sizes.seqlens_q, sizes.offsets_q); !s.ok()) return s;
    if (Status s = check_varlen_side("kv", sizes.seqlens_kv, sizes.offsets_kv); !s.ok()) return s;
  }

  const std::int64_t h = sizes.heads, hg = sizes.kv_heads, dqk = sizes.d_qk, dv = sizes.d_v;
  const std::int64_t b = thd ? 1 : sizes.batch;
  const std::int64_t sq = thd ? sizes.q_tokens() : sizes.s_q;
  const std::int64_t skv = thd ? sizes.kv_tokens() : sizes.s_kv;
  const char* seq_word = thd ? "tokens" : "seqlen";

  // Every stride, offset and buffer extent below is at most b * max(sq, skv) * 3 * (h + 2hg)
  // * max(dqk, dv): when that fits in int64, none of them overflows.
  std::optional<std::int64_t> heads_all;  // h + 2hg
  if (const std::optional<std::int64_t> two_hg = checked_mul(2, hg)) heads_all = checked_add(h, *two_hg);
  if (!heads_all || !checked_product({b, std::max<std::int64_t>(std::max(sq, skv), 1), 3, *heads_all,
                                      std::max<std::int64_t>(std::max(dqk, dv), 1)})) {
    std::string sizes_text =
        thd ? "--seqlens-q/--offsets-q (" + str(sq) + " tokens) --seqlens-kv/--offsets-kv (" + str(skv) + " tokens)"
            : "--batch " + str(b) + " --seqlen-q " + str(sq) + " --seqlen-kv " + str(skv);
    return bad(sizes_text + " --heads " + str(h) + " --kv-heads " + str(hg) + " --head-dim " + str(dqk) +
               " --head-dim-v " + str(dv) + ": a buffer of layout " + name + " would hold more than 2^63 - 1 elements");
  }

  using P = LayoutKind::Packing;
  const bool qkv_packed = kind.packing == P::qkv_3hd || kind.packing == P::qkv_h3d || kind.packing == P::fused_split;
  const bool kv_packed = kind.packing == P::kv_2hd || kind.packing == P::kv_h2d;
  if ((qkv_packed || kv_packed) && dqk != dv)
    return bad("layout " + name + " packs k and v in one buffer and needs head-dim == head-dim-v; got " +
               std::to_string(dqk) + " and " + std::to_string(dv));
  if (qkv_packed && sq != skv)
    return bad("layout " + name + " packs q, k and v in one buffer and needs equal q and kv " + seq_word + "; got " +
               std::to_string(sq) + " and " + std::to_string(skv));
  if ((kind.packing == P::qkv_3hd || kind.packing == P::qkv_h3d) && h != hg)
    return bad("layout " + name + " packs q, k and v with one head count and needs heads == kv-heads; got " +
               std::to_string(h) + " and " + std::to_string(hg) +
               " (for GQA/MQA use a split of one fused buffer: sb(h+2hg)d, bs(h+2hg)d, t(h+2hg)d)");

  LayoutViews v;
  const Format qf = kind.q_format, kvf = kind.kv_format;
  const std::int64_t d = dqk;
  switch (kind.packing) {
    case P::separate:
      v.q = contiguous_view("q", qf, b, sq, h, dqk);
      v.k = contiguous_view("k", kvf, b, skv, hg, dqk);
      v.v = contiguous_view("v", kvf, b, skv, hg, dv);
      break;
    case P::qkv_3hd: {  // row [3, h, d]
      const RowGeometry g{.batch = b, .seq = sq, .row = 3 * h * d, .head_stride = d};
      v.q = packed_view("qkv", qf, g, 0, h, d);
      v.k = packed_view("qkv", qf, g, h * d, h, d);
      v.v = packed_view("qkv", qf, g, 2 * h * d, h, d);
      break;
    }
    case P::qkv_h3d: {  // row [h, 3, d]
      const RowGeometry g{.batch = b, .seq = sq, .row = 3 * h * d, .head_stride = 3 * d};
      v.q = packed_view("qkv", qf, g, 0, h, d);
      v.k = packed_view("qkv", qf, g, d, h, d);
      v.v = packed_view("qkv", qf, g, 2 * d, h, d);
      break;
    }
    case P::fused_split: {  // row [h + 2hg, d]: q heads, then k heads, then v heads
      const RowGeometry g{.batch = b, .seq = sq, .row = (h + 2 * hg) * d, .head_stride = d};
      v.q = packed_view("qkv", qf, g, 0, h, d);
      v.k = packed_view("qkv", qf, g, h * d, hg, d);
      v.v = packed_view("qkv", qf, g, (h + hg) * d, hg, d);
      break;
    }
    case P::kv_2hd: {  // kv row [2, hg, d]
      const RowGeometry g{.batch = b, .seq = skv, .row = 2 * hg * d, .head_stride = d};
      v.q = contiguous_view("q", qf, b, sq, h, dqk);
      v.k = packed_view("kv", kvf, g, 0, hg, d);
      v.v = packed_view("kv", kvf, g, hg * d, hg, d);
      break;
    }
    case P::kv_h2d: {  // kv row [hg, 2, d]
      const RowGeometry g{.batch = b, .seq = skv, .row = 2 * hg * d, .head_stride = 2 * d};
      v.q = contiguous_view("q", qf, b, sq, h, dqk);
      v.k = packed_view("kv", kvf, g, 0, hg, d);
      v.v = packed_view("kv", kvf, g, d, hg, d);
      break;
    }
  }
  v.o = contiguous_view("o", qf, b, sq, h, dv);
  v.d_o = contiguous_view("do", qf, b, sq, h, dv);
  if (qkv_packed) {
    v.dq = renamed(v.q, "dqkv");
    v.dk = renamed(v.k, "dqkv");
    v.dv = renamed(v.v, "dqkv");
  } else if (kv_packed) {
    v.dq = renamed(v.q, "dq");
    v.dk = renamed(v.k, "dkv");
    v.dv = renamed(v.v, "dkv");
  } else {
    v.dq = renamed(v.q, "dq");
    v.dk = renamed(v.k, "dk");
    v.dv = renamed(v.v, "dv");
  }
  *out = std::move(v);
  return Status::Ok();
}

std::int64_t required_extent(const ViewSpec& view) {
  for (int i = 0; i < 4; ++i)
    if (view.shape[i] <= 0) return view.offset;  // no elements: only the offset must exist
  std::optional<std::int64_t> last = view.offset;
  for (int i = 0; i < 4 && last; ++i) {
    if (view.stride[i] <= 0) continue;  // stride 0 reaches nothing new; negative reach below
    const std::optional<std::int64_t> reach = checked_mul(view.shape[i] - 1, view.stride[i]);
    last = reach ? checked_add(*last, *reach) : std::nullopt;
  }
  return last ? saturating_add(*last, 1) : kInt64Max;
}

std::string format_view(const ViewSpec& v) {
  std::ostringstream os;
  os << v.buffer;
  if (v.offset != 0) os << "+" << v.offset;
  os << ":" << v.shape[0] << "," << v.shape[1] << "," << v.shape[2] << "," << v.shape[3] << ":" << v.stride[0] << ","
     << v.stride[1] << "," << v.stride[2] << "," << v.stride[3];
  return os.str();
}

}  // namespace strideattn::harness
