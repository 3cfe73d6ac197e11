// Views of named buffers, and the views each layout name of the CLI grammar makes
// (docs/design.md "CLI").
// Shared by the CLI, the fuzzer and the tests. A ViewSpec is an element offset into a named
// buffer plus logical shape and strides; views naming the same buffer alias its memory.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strideattn/strideattn.hpp"

namespace strideattn::harness {

struct ViewSpec {
  std::string buffer;        // buffer name; views with the same name alias
  std::int64_t offset = 0;   // element offset of logical (0,0,0,0)
  Dims4 shape{0, 0, 0, 0};   // b, s, h, d
  Dims4 stride{0, 0, 0, 0};  // elements
};

// LSE is always its own fp32 buffer, contiguous [b, h, s_q] (varlen: [1, h, tokens]).
struct ProblemSizes {
  std::int64_t batch = 1, s_q = 1, s_kv = 1, heads = 1, kv_heads = 1, d_qk = 64, d_v = 64;
  // varlen (thd layouts): token counts and first-token offsets per sequence
  std::vector<std::int64_t> seqlens_q, seqlens_kv, offsets_q, offsets_kv;
  [[nodiscard]] bool varlen() const { return !seqlens_q.empty(); }
  // varlen: tokens in the seq dimension (max over offset + length; at least the packed sum)
  [[nodiscard]] std::int64_t q_tokens() const;
  [[nodiscard]] std::int64_t kv_tokens() const;
};

struct LayoutViews {
  ViewSpec q, k, v, o;
  ViewSpec d_o, dq, dk, dv;  // gradients mirror their tensors' layout (packed dqkv for sb3hd)
};

// Every layout name of the grammar: bshd_bshd_bshd, sbhd_sbhd_sbhd, bhsd_bhsd_bhsd, sb3hd,
// sbh3d, bs3hd, bsh3d, sbhd_sb2hd, sbhd_sbh2d, bshd_bs2hd, bshd_bsh2d, thd_thd_thd, t3hd,
// th3d, thd_t2hd, thd_th2d, sb(h+2hg)d, bs(h+2hg)d, t(h+2hg)d.
[[nodiscard]] const std::vector<std::string>& layout_names();

// Views that `layout` makes for `sizes`. Errors (unknown name; packed layouts that need
// h == hg or d_qk == d_v; thd layouts without varlen sizes) say what and why.
[[nodiscard]] Status make_layout_views(std::string_view layout, const ProblemSizes& sizes, LayoutViews* out);

// Smallest buffer extent (elements) that holds the view: offset + the largest element any
// positive stride reaches + 1 (stride 0 adds nothing; an empty view needs only its offset).
// kInt64Max when that does not fit in int64.
[[nodiscard]] std::int64_t required_extent(const ViewSpec& view);

// The CLI's explicit view syntax BUF[+OFFSET]:SHAPE:STRIDES ("q+5:2,70,2,32:8960,128,64,1"),
// as `--q` etc. take it and the reproducer writes it.
[[nodiscard]] std::string format_view(const ViewSpec& v);

}  // namespace strideattn::harness
