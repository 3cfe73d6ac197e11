// Host-device mask, tile-range and index arithmetic shared by the `cpu` backend and the CUDA
// kernels (and used by `reference` for the mask rule), so that CI on a CPU exercises the
// exact logic the GPU runs. Plain C++ that compiles under nvcc and any host compiler; no
// allocation, no exceptions, no std:: containers.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SA_HD __host__ __device__ __forceinline__
#else
#define SA_HD inline
#endif

namespace strideattn::kernel {

SA_HD std::int64_t min64(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
SA_HD std::int64_t max64(std::int64_t a, std::int64_t b) { return a > b ? a : b; }
SA_HD std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------------------ masks

enum MaskCode : int { kMaskNone = 0, kMaskCausal = 1, kMaskCausalBottomRight = 2 };

// The mask of one sequence: which key j a query row i sees. Every mask is an interval of
// keys [lo(i), hi(i)) and both ends are non-decreasing in i; the tile arithmetic below
// relies on that.
struct MaskRule {
  std::int64_t s_q = 0, s_kv = 0;
  int kind = kMaskNone;
  std::int64_t left = -1, right = -1;  // window around the bottom-right diagonal, -1 unbounded

  // Offset that maps query row i onto the bottom-right diagonal: key i + shift.
  SA_HD std::int64_t shift() const { return s_kv - s_q; }

  SA_HD std::int64_t key_begin(std::int64_t i) const {
    std::int64_t lo = 0;
    if (left >= 0) lo = max64(lo, i + shift() - left);
    return min64(lo, s_kv);
  }
  SA_HD std::int64_t key_end(std::int64_t i) const {
    std::int64_t hi = s_kv;
    if (kind == kMaskCausal) hi = min64(hi, i + 1);
    if (kind == kMaskCausalBottomRight) hi = min64(hi, i + shift() + 1);
    if (right >= 0) hi = min64(hi, i + shift() + right + 1);
    return max64(hi, key_begin(i));  // empty rows give an empty range, never a negative one
  }
  SA_HD bool visible(std::int64_t i, std::int64_t j) const { return j >= key_begin(i) && j < key_end(i); }

  // Queries that see key j: [query_begin(j), query_end(j)), the inverse of the key range.
  SA_HD std::int64_t query_begin(std::int64_t j) const {
    std::int64_t first = 0;  // smallest i with key_end(i) > j
    if (kind == kMaskCausal) first = max64(first, j);
    if (kind == kMaskCausalBottomRight) first = max64(first, j - shift());
    if (right >= 0) first = max64(first, j - shift() - right);
    return min64(first, s_q);
  }
  SA_HD std::int64_t query_end(std::int64_t j) const {
    std::int64_t last = s_q;  // one past the largest i with key_begin(i) <= j
    if (left >= 0) last = min64(last, j - shift() + left + 1);
    return max64(last, query_begin(j));
  }
};

// A tile of rows [r0, r1) against a tile of keys [c0, c1).
struct TileRange {
  std::int64_t begin = 0, end = 0;  // [begin, end) of the other axis that needs work
};

// Keys any row of [r0, r1) sees (monotone ends make this the union of the rows' ranges).
SA_HD TileRange key_range_for_rows(const MaskRule& m, std::int64_t r0, std::int64_t r1) {
  if (r1 <= r0) return {0, 0};
  TileRange t{m.key_begin(r0), m.key_end(r1 - 1)};
  if (t.end < t.begin) t.end = t.begin;
  return t;
}

// Rows that see any key of [c0, c1).
SA_HD TileRange query_range_for_keys(const MaskRule& m, std::int64_t c0, std::int64_t c1) {
  if (c1 <= c0) return {0, 0};
  TileRange t{m.query_begin(c0), m.query_end(c1 - 1)};
  if (t.end < t.begin) t.end = t.begin;
  return t;
}

// Queries that see key j, one interval (monotone ends); empty for a key past s_kv, which no
// query sees (query_begin / query_end alone would give one). The wgmma backward masks its
// key-major S^T tiles with it: one interval per key row, then two 32-bit compares per element.
SA_HD TileRange queries_seeing_key(const MaskRule& m, std::int64_t j) {
  if (j < 0 || j >= m.s_kv) return {0, 0};
  return {m.query_begin(j), m.query_end(j)};
}

// True when every (row, key) pair of the tile is visible, so the kernel may skip masking.
SA_HD bool tile_fully_visible(const MaskRule& m, std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
  if (r1 <= r0 || c1 <= c0) return true;
  // The latest begin is at the last row; the earliest end at the first row.
  return m.key_begin(r1 - 1) <= c0 && m.key_end(r0) >= c1;
}

// Rows that see every key of [c0, c1), for 0 <= c0 < c1 <= s_kv: [begin, end), an interval
// because both ends of the key ranges are non-decreasing in the row. For rows r0 < r1 the
// tile test is a range check, tile_fully_visible(m, r0, r1, c0, c1) == (r0 >= begin && r1 <=
// end), which a kernel walking many row blocks against one key block hoists out of its loop.
//   end: the first row whose key_begin passes c0 (none without a left window);
//   begin: the first row whose upper bounds (min of s_kv and the causal / window ends) reach
//   c1. key_end's max with key_begin only matters for rows with key_begin >= c1 > c0, which
//   are past `end` anyway.
SA_HD TileRange rows_seeing_all_keys(const MaskRule& m, std::int64_t c0, std::int64_t c1) {
  std::int64_t begin = 0, end = m.s_q;
  if (m.left >= 0) end = min64(end, max64(begin, c0 - m.shift() + m.left + 1));
  if (m.kind == kMaskCausal) begin = max64(begin, c1 - 1);
  if (m.kind == kMaskCausalBottomRight) begin = max64(begin, c1 - 1 - m.shift());
  if (m.right >= 0) begin = max64(begin, c1 - 1 - m.shift() - m.right);
  return {begin, end};
}

// ------------------------------------------------------------------------------ indexing

// Strides of one [b, s, h, d] tensor. The head-dim stride d is 1, or -1 for a reversed
// head dim (the cuda and cudnn backends refuse -1 and read rows as contiguous).
struct Strides {
  std::int64_t b = 0, s = 0, h = 0, d = 1;
};

// Where the tokens of sequence `batch` live in a tensor's seq dimension, and how many.
struct SequenceSpan {
  std::int64_t base = 0;    // element offset of token 0, head 0, dim 0
  std::int64_t length = 0;  // tokens
};

// Per-side (query or key/value) sequence table. Dense problems have seqlens == nullptr and
// every sequence `batch` has `max_len` tokens at batch offset `batch`. Varlen problems have
// per-sequence lengths and first-token offsets along the (single-batch) seq dimension.
struct SequenceTable {
  const std::int64_t* seqlens = nullptr;  // host or device memory, matching the kernel
  const std::int64_t* offsets = nullptr;
  std::int64_t max_len = 0;

  SA_HD bool varlen() const { return seqlens != nullptr; }
  SA_HD std::int64_t length(std::int64_t batch) const { return varlen() ? seqlens[batch] : max_len; }
  // Position of the sequence's token 0 along the tensor's seq dimension, and batch index.
  SA_HD std::int64_t first_token(std::int64_t batch) const { return varlen() ? offsets[batch] : 0; }
  SA_HD std::int64_t batch_index(std::int64_t batch) const { return varlen() ? 0 : batch; }

  SA_HD SequenceSpan span(const Strides& st, std::int64_t batch) const {
    return {batch_index(batch) * st.b + first_token(batch) * st.s, length(batch)};
  }
};

// Element offset of (token, head) within a sequence span; add the head-dim index.
SA_HD std::int64_t row_offset(const SequenceSpan& span, const Strides& st, std::int64_t token, std::int64_t head) {
  return span.base + token * st.s + head * st.h;
}

// LSE strides, logical [b, h, s_q].
struct LseStrides {
  std::int64_t b = 0, h = 0, s = 0;
};
SA_HD std::int64_t lse_offset(const SequenceTable& q, const LseStrides& st, std::int64_t batch, std::int64_t head,
                              std::int64_t token) {
  return q.batch_index(batch) * st.b + head * st.h + (q.first_token(batch) + token) * st.s;
}

// GQA: query head `head` reads KV head head / (h / hg).
SA_HD std::int64_t kv_head_of(std::int64_t head, std::int64_t heads, std::int64_t kv_heads) {
  return head / (heads / kv_heads);
}

// The mask rule of sequence `batch` given the problem-wide mask and window.
SA_HD MaskRule mask_for(const SequenceTable& q, const SequenceTable& kv, std::int64_t batch, int kind,
                        std::int64_t left, std::int64_t right) {
  MaskRule m;
  m.s_q = q.length(batch);
  m.s_kv = kv.length(batch);
  m.kind = kind;
  m.left = left;
  m.right = right;
  return m;
}

// ------------------------------------------------------------------------------ params

// Everything a kernel needs, in plain fields; built on the host from a validated problem
// (see src/problem/params.hpp). Pointers are untyped; the dtype picks the kernel.
struct AttentionParams {
  // sizes
  std::int64_t batch = 0;  // number of sequences
  std::int64_t heads = 0, kv_heads = 0;
  std::int64_t d_qk = 0, d_v = 0;
  SequenceTable q_seq, kv_seq;
  // mask and scale
  int mask_kind = kMaskNone;
  std::int64_t window_left = -1, window_right = -1;
  float scale = 1.f;
  // tensors
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  const void* d_o = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Strides q_st, k_st, v_st, o_st, do_st, dq_st, dk_st, dv_st;
  LseStrides lse_st;

  SA_HD MaskRule mask(std::int64_t b) const { return mask_for(q_seq, kv_seq, b, mask_kind, window_left, window_right); }
};

}  // namespace strideattn::kernel
