// `cpu` backward by recomputation, FlashAttention-2 manner, in fp32. Three parallel passes,
// each output element owned by exactly one work item, so the result is bitwise
// deterministic for any thread count:
//   1. D = rowsum(dO * O) from the given O, per (query row, head).
//   2. dK, dV: item = (sequence, KV head, key tile). For each query head of the GQA group
//      and each query tile in kernel::query_range_for_keys: recompute P = exp(scale S - LSE)
//      from Q, K and the given LSE; dV += P^T dO; dP = dO V^T; dS = P * (dP - D);
//      dK += dS^T (scale Q). dK and dV are written once, summed over the group.
//   3. dQ: item = (sequence, query head, query tile). For each key tile in
//      kernel::key_range_for_rows recompute P and dS the same way; dQ = scale * sum dS K.
// The sums over tiles (dK/dV over query tiles and heads, dQ over key tiles) are pairwise
// (cpu_accumulate.hpp), so their error does not grow with the sequence length. NaN in any
// operand reaches the gradients the fp64 definition makes NaN, and no others.
// Varlen padding tokens of dQ, dK and dV are written as 0.
#include <atomic>
#include <cmath>
#include <limits>

#include "backends/cpu/cpu_accumulate.hpp"
#include "backends/cpu/cpu_common.hpp"
#include "backends/cpu/cpu_features.hpp"
#include "backends/cpu/cpu_pack.hpp"
#include "problem/params.hpp"

namespace strideattn::detail::cpu {
namespace {

// Rows of D: sequence b's query row i, head h is D[(row_base[b] + i) * heads + h].
struct DTable {
  std::vector<std::int64_t> row_base;
  std::vector<float> d;
  std::int64_t heads = 0;
  float* at(std::int64_t b, std::int64_t i, std::int64_t h) {
    return &d[static_cast<std::size_t>((row_base[b] + i) * heads + h)];
  }
};

// Per-thread fp32 tile buffers.
struct Scratch {
  std::int64_t dq = 0, dv = 0;
  std::vector<float> q, d_o;         // [kBlockRows][d_qk], [kBlockRows][d_v]
  std::vector<float> kt, vt;         // [d_qk][kBlockKeys], [d_v][kBlockKeys]  (transposed)
  std::vector<float> k;              // [kBlockKeys][d_qk]  (dQ pass)
  std::vector<float> p, ds;          // [kBlockRows][kBlockKeys]
  std::vector<float> th, dl;         // [kBlockRows][kBlockKeys] softcap's tanh; dL (dBias pass)
  std::vector<float> acc_b;          // [d_v] staging for O rows (pass 1)
  std::vector<float> lse, delta;     // [kBlockRows]
  std::vector<float> row;            // staging for transposed loads
  std::vector<std::int64_t> j0, j1;  // [kBlockRows] visible columns of each row in a tile
  PartialStack partials;             // per block of tiles: dK [keys][d_qk], dV [keys][d_v], or dQ
  Scratch(std::int64_t d_qk, std::int64_t d_v)
      : dq(d_qk),
        dv(d_v),
        q(kBlockRows * d_qk),
        d_o(kBlockRows * d_v),
        kt(d_qk * kBlockKeys),
        vt(d_v * kBlockKeys),
        k(kBlockKeys * d_qk),
        p(kBlockRows * kBlockKeys),
        ds(kBlockRows * kBlockKeys),
        th(kBlockRows * kBlockKeys),
        dl(kBlockRows * kBlockKeys),
        acc_b(d_v),
        lse(kBlockRows),
        delta(kBlockRows),
        row(kernel::max64(d_qk, d_v)),
        j0(kBlockRows),
        j1(kBlockRows) {}
};

// Everything one sequence/head pair reads, resolved once per item.
struct Views {
  kernel::MaskRule mask;
  kernel::SequenceSpan q, k, v, o, d_o, dq, dk, dv;
};
Views views_of(const kernel::AttentionParams& a, std::int64_t b) {
  return {a.mask(b),
          a.q_seq.span(a.q_st, b),
          a.kv_seq.span(a.k_st, b),
          a.kv_seq.span(a.v_st, b),
          a.q_seq.span(a.o_st, b),
          a.q_seq.span(a.do_st, b),
          a.q_seq.span(a.dq_st, b),
          a.kv_seq.span(a.dk_st, b),
          a.kv_seq.span(a.dv_st, b)};
}

// fp32 operands of one tile: K^T and V^T ([d][kBlockKeys]) and K rows ([key][d_qk]) of a
// key tile; scaled Q rows and dO rows of a query tile. From the pack when there is one,
// otherwise converted into the thread's scratch.
struct KeyOperands {
  const float* k_t = nullptr;
  const float* v_t = nullptr;
  const float* k = nullptr;
};
struct RowOperands {
  const float* q = nullptr;
  const float* d_o = nullptr;
};

KeyOperands load_kv(const kernel::AttentionParams& a, DType dt, const Pack* pack, const Views& vw, std::int64_t b,
                    std::int64_t kvh, std::int64_t c0, std::int64_t nc, bool k_rows, Scratch& w) {
  if (pack) return {pack->k_t(b, kvh, c0), pack->v_t(b, kvh, c0), pack->k_rows(b, kvh, c0)};
  for (std::int64_t j = 0; j < nc; ++j) {
    float* row = w.row.data();
    load_row(a.k, dt, kernel::row_offset(vw.k, a.k_st, c0 + j, kvh), a.k_st.d, w.dq, row);
    for (std::int64_t x = 0; x < w.dq; ++x) w.kt[x * kBlockKeys + j] = row[x];
    if (k_rows) std::copy_n(row, w.dq, w.k.data() + j * w.dq);
    load_row(a.v, dt, kernel::row_offset(vw.v, a.v_st, c0 + j, kvh), a.v_st.d, w.dv, row);
    for (std::int64_t x = 0; x < w.dv; ++x) w.vt[x * kBlockKeys + j] = row[x];
  }
  return {w.kt.data(), w.vt.data(), w.k.data()};
}

// Q (unscaled: S = scale (Q K^T), dK = scale dS^T Q), dO, LSE and D of query rows
// [r0, r0 + rows) of head `h`; LSE and D always go to the scratch.
RowOperands load_rows(const kernel::AttentionParams& a, DType dt, const Pack* pack, const Views& vw, DTable& dtab,
                      std::int64_t b, std::int64_t h, std::int64_t r0, std::int64_t rows, Scratch& w) {
  for (std::int64_t r = 0; r < rows; ++r) {
    w.lse[r] = a.lse[kernel::lse_offset(a.q_seq, a.lse_st, b, h, r0 + r)];
    w.delta[r] = *dtab.at(b, r0 + r, h);
  }
  if (pack) return {pack->q_rows(b, h, r0), pack->do_rows(b, h, r0)};
  for (std::int64_t r = 0; r < rows; ++r) {
    load_row(a.q, dt, kernel::row_offset(vw.q, a.q_st, r0 + r, h), a.q_st.d, w.dq, w.q.data() + r * w.dq);
    load_row(a.d_o, dt, kernel::row_offset(vw.d_o, a.do_st, r0 + r, h), a.do_st.d, w.dv, w.d_o.data() + r * w.dv);
  }
  return {w.q.data(), w.d_o.data()};
}

// Where a tile's training features come from: the features and the (sequence, query head).
struct TileFeatures {
  const Features* f = nullptr;
  std::int64_t b = 0, h = 0;
  bool want_dl = false;  // also keep dL (the logit's gradient) in w.dl
};

// For the tile rows [r0, r0 + rows) x keys [c0, c0 + nc):
// P = exp(L - LSE) on visible pairs (0 elsewhere and on rows with LSE = -inf), L the logit
// (scale (Q K^T) and the features' modifiers), dL = P * (Z dO V^T - D), dS = dL times the
// softcap's derivative, and w.p = Z P (what dV sums). Results in w.p and w.ds (and w.dl when
// asked), each row's visible columns in w.j0/w.j1. Returns whether the mask leaves the whole
// tile visible.
bool recompute_tile(const kernel::MaskRule& mask, std::int64_t r0, std::int64_t rows, std::int64_t c0, std::int64_t nc,
                    float scale, const RowOperands& ro, const KeyOperands& ko, Scratch& w, const TileFeatures& tf) {
  const Features& f = *tf.f;
  float* p = w.p.data();
  float* ds = w.ds.data();
  std::fill_n(p, rows * kBlockKeys, 0.f);
  std::fill_n(ds, rows * kBlockKeys, 0.f);
  gemm_acc(rows, nc, w.dq, ro.q, w.dq, 1, ko.k_t, kBlockKeys, p, kBlockKeys);
  scale_scores(p, rows, nc, scale, ro.q, w.dq, ko.k_t);
  gemm_acc(rows, nc, w.dv, ro.d_o, w.dv, 1, ko.v_t, kBlockKeys, ds, kBlockKeys);
  const bool full = kernel::tile_fully_visible(mask, r0, r0 + rows, c0, c0 + nc);
  for (std::int64_t r = 0; r < rows; ++r) {
    float* pr = p + r * kBlockKeys;
    float* dsr = ds + r * kBlockKeys;
    std::int64_t j0 = 0, j1 = nc;
    if (!full) {
      j0 = kernel::min64(kernel::max64(mask.key_begin(r0 + r) - c0, 0), nc);
      j1 = kernel::max64(kernel::min64(mask.key_end(r0 + r) - c0, nc), j0);
    }
    const float lse = w.lse[r], delta = w.delta[r];
    if (lse == kNegInf) j1 = j0;  // row sees no key at all: P = 0
    w.j0[r] = j0, w.j1[r] = j1;
    for (std::int64_t j = 0; j < j0; ++j) pr[j] = dsr[j] = 0.f;
    float* thr = w.th.data() + r * kBlockKeys;
    if (f.modifies_scores()) f.modify_row(pr, j0, j1, c0, tf.b, tf.h, r0 + r, mask.s_q, mask.s_kv, scale, thr);
    (void)exp_sub_sum(pr + j0, j1 - j0, lse);
    if (f.dropout) {
      // dP becomes Z dP, then P becomes Z P: dL = P (Z dP - D), dV += (Z P)^T dO.
      f.drop_row(dsr, j0, j1, c0, tf.b, tf.h, r0 + r);
      for (std::int64_t j = j0; j < j1; ++j) dsr[j] = pr[j] * (dsr[j] - delta);
      f.drop_row(pr, j0, j1, c0, tf.b, tf.h, r0 + r);
    } else {
      for (std::int64_t j = j0; j < j1; ++j) dsr[j] = pr[j] * (dsr[j] - delta);
    }
    if (tf.want_dl) std::copy(dsr, dsr + nc, w.dl.data() + r * kBlockKeys);
    if (f.cap > 0.f)
      for (std::int64_t j = j0; j < j1; ++j) dsr[j] *= 1.f - thr[j] * thr[j];
    for (std::int64_t j = j1; j < nc; ++j) pr[j] = dsr[j] = 0.f;
  }
  return full;
}

// ------------------------------------------------------------------------------ pass 1: D

// With sinks, `sink_part` ([heads]) receives the item's part of d_sink = -sum P_sink D.
void compute_delta(const kernel::AttentionParams& a, DType dt, const WorkItem& it, DTable& dtab, const Features& f,
                   float* sink_part, Scratch& w) {
  const Views vw = views_of(a, it.batch);
  for (std::int64_t i = it.r0; i < it.r1; ++i)
    for (std::int64_t h = 0; h < a.heads; ++h) {
      load_row(a.o, dt, kernel::row_offset(vw.o, a.o_st, i, h), a.o_st.d, w.dv, w.acc_b.data());
      load_row(a.d_o, dt, kernel::row_offset(vw.d_o, a.do_st, i, h), a.do_st.d, w.dv, w.row.data());
      float sum = 0.f;
      for (std::int64_t x = 0; x < w.dv; ++x) sum += w.acc_b[x] * w.row[x];
      *dtab.at(it.batch, i, h) = sum;
      if (sink_part) {
        const float lse = a.lse[kernel::lse_offset(a.q_seq, a.lse_st, it.batch, h, i)];
        if (lse != kNegInf && vw.mask.key_end(i) > vw.mask.key_begin(i))  // rows that see no key add nothing
          sink_part[h] -= std::exp(f.sink(h) - lse) * sum;
      }
    }
}

// ------------------------------------------------------------------------------ pass 4: dBias

// Item: (bias batch index b', bias head index h', bias rows [r0, r1)); with an extent-1 row
// dimension one item takes every row. It sums, over every (sequence, query head) that reads
// its slab, dL (post-scale) or scale * dS (pre-scale) of each visible pair into its elements,
// so each dBias element has one owner and a fixed order. A broadcast dimension makes that a
// long sum (b * h * s_q terms for a [1, 1, 1, s_kv] bias): each (sequence, head, row tile)
// adds into a partial, and the partials are merged pairwise (cpu_accumulate.hpp), so the
// error grows like that of a blocked fp32 sum; with the key dimension broadcast too, each
// row's keys of a tile are summed on their own first.
bool dbias_item(const kernel::AttentionParams& a, DType dt, const Pack* pack, const WorkItem& it, DTable& dtab,
                const Problem& p, const Features& f, Scratch& w) {
  const auto& bs = p.dbias.shape;
  const bool rows_bcast = bs[2] == 1, cols_bcast = bs[3] == 1;
  const std::int64_t nrows = it.r1 - it.r0, ncols = bs[3];
  const std::size_t size = static_cast<std::size_t>(nrows * ncols);
  const AddMerge merge{size};
  w.partials.reset(size);
  const bool post = p.bias_type == BiasType::post_scale;
  const std::int64_t b_lo = bs[0] == 1 ? 0 : it.batch, b_hi = bs[0] == 1 ? a.batch : it.batch + 1;
  const std::int64_t h_lo = bs[1] == 1 ? 0 : it.head, h_hi = bs[1] == 1 ? a.heads : it.head + 1;
  for (std::int64_t b = b_lo; b < b_hi; ++b) {
    const Views vw = views_of(a, b);
    const std::int64_t i_lo = rows_bcast ? 0 : it.r0,
                       i_hi = rows_bcast ? vw.mask.s_q : kernel::min64(it.r1, vw.mask.s_q);
    for (std::int64_t h = h_lo; h < h_hi; ++h) {
      const std::int64_t kvh = kernel::kv_head_of(h, a.heads, a.kv_heads);
      for (std::int64_t r0 = i_lo; r0 < i_hi; r0 += kBlockRows) {
        if (cancelled(p)) return false;
        const std::int64_t rows = kernel::min64(r0 + kBlockRows, i_hi) - r0;
        const RowOperands ro = load_rows(a, dt, pack, vw, dtab, b, h, r0, rows, w);
        float* acc = w.partials.next();
        if (w.partials.starts_partial()) std::fill_n(acc, size, 0.f);
        const kernel::TileRange keys = kernel::key_range_for_rows(vw.mask, r0, r0 + rows);
        for (std::int64_t c0 = keys.begin / kBlockKeys * kBlockKeys; c0 < keys.end; c0 += kBlockKeys) {
          const std::int64_t nc = kernel::min64(c0 + kBlockKeys, keys.end) - c0;
          const KeyOperands ko = load_kv(a, dt, pack, vw, b, kvh, c0, nc, false, w);
          (void)recompute_tile(vw.mask, r0, rows, c0, nc, a.scale, ro, ko, w, {&f, b, h, post});
          for (std::int64_t r = 0; r < rows; ++r) {
            const float* g = (post ? w.dl.data() : w.ds.data()) + r * kBlockKeys;
            float* dst = acc + (rows_bcast ? 0 : (r0 + r - it.r0)) * ncols;
            const float mul = post ? 1.f : a.scale;
            if (cols_bcast) {
              float sum = 0.f;
              for (std::int64_t j = w.j0[r]; j < w.j1[r]; ++j) sum += mul * g[j];
              dst[0] += sum;
            } else {
              for (std::int64_t j = w.j0[r]; j < w.j1[r]; ++j) dst[c0 + j] += mul * g[j];
            }
          }
        }
        w.partials.end_tile(merge);
      }
    }
  }
  const float* total = w.partials.finish_or_zeros(merge);  // zeros: no visible pair reads the slab
  const BiasView& out = p.dbias;
  for (std::int64_t r = 0; r < nrows; ++r)
    for (std::int64_t j = 0; j < ncols; ++j)
      store_from_float(
          out.data, out.dtype,
          it.batch * out.stride[0] + it.head * out.stride[1] + (it.r0 + r) * out.stride[2] + j * out.stride[3],
          total[r * ncols + j]);
  return true;
}

// ------------------------------------------------------------------------------ pass 2: dK, dV

// Returns false when the cancel flag stopped it (its outputs are then not written).
bool key_tile(const kernel::AttentionParams& a, DType dt, const Pack* pack, const WorkItem& it, DTable& dtab,
              const std::atomic<bool>* cancel, const Features& f, Scratch& w) {
  const Views vw = views_of(a, it.batch);
  const std::int64_t kvh = it.head, c0 = it.r0, nc = it.r1 - it.r0;  // c0: multiple of kBlockKeys
  const std::int64_t group = a.heads / a.kv_heads;
  const std::int64_t dk_size = nc * w.dq, size = dk_size + nc * w.dv;
  const AddMerge merge{static_cast<std::size_t>(size)};
  w.partials.reset(static_cast<std::size_t>(size));
  const KeyOperands ko = load_kv(a, dt, pack, vw, it.batch, kvh, c0, nc, false, w);
  const kernel::TileRange queries = kernel::query_range_for_keys(vw.mask, c0, it.r1);
  for (std::int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (std::int64_t r0 = queries.begin; r0 < queries.end; r0 += kBlockRows) {
      if (cancel && cancel->load(std::memory_order_relaxed)) return false;
      const std::int64_t rows = kernel::min64(r0 + kBlockRows, queries.end) - r0;
      const RowOperands ro = load_rows(a, dt, pack, vw, dtab, it.batch, h, r0, rows, w);
      const bool full = recompute_tile(vw.mask, r0, rows, c0, nc, a.scale, ro, ko, w, {&f, it.batch, h});
      float* dk = w.partials.next();
      float* dv = dk + dk_size;
      if (w.partials.starts_partial()) std::fill_n(dk, size, 0.f);
      if (full || (all_finite(ro.d_o, rows * w.dv) && all_finite(ro.q, rows * w.dq))) {
        // dV += P^T dO ; dK += dS^T Q (scaled when stored)   (A(j, i) = P[i][j]: row step 1, column step
        // kBlockKeys)
        gemm_acc(nc, w.dv, rows, w.p.data(), 1, kBlockKeys, ro.d_o, w.dv, dv, w.dv);
        gemm_acc(nc, w.dq, rows, w.ds.data(), 1, kBlockKeys, ro.q, w.dq, dk, w.dq);
      } else {
        // A non-finite dO or Q row must not reach keys its row does not see (0 * NaN):
        // each key sums over the rows that see it.
        for (std::int64_t j = 0; j < nc; ++j) {
          const std::int64_t i0 = kernel::min64(kernel::max64(vw.mask.query_begin(c0 + j) - r0, 0), rows);
          const std::int64_t i1 = kernel::max64(kernel::min64(vw.mask.query_end(c0 + j) - r0, rows), i0);
          const std::int64_t off = i0 * kBlockKeys + j;
          gemm_acc(1, w.dv, i1 - i0, w.p.data() + off, 1, kBlockKeys, ro.d_o + i0 * w.dv, w.dv, dv + j * w.dv, w.dv);
          gemm_acc(1, w.dq, i1 - i0, w.ds.data() + off, 1, kBlockKeys, ro.q + i0 * w.dq, w.dq, dk + j * w.dq, w.dq);
        }
      }
      w.partials.end_tile(merge);
    }
  }
  const float* total = w.partials.finish_or_zeros(merge);  // zeros: no query sees these keys
  for (std::int64_t j = 0; j < nc; ++j) {
    store_row(a.dk, dt, kernel::row_offset(vw.dk, a.dk_st, c0 + j, kvh), a.dk_st.d, w.dq, total + j * w.dq, a.scale);
    store_row(a.dv, dt, kernel::row_offset(vw.dv, a.dv_st, c0 + j, kvh), a.dv_st.d, w.dv, total + dk_size + j * w.dv);
  }
  return true;
}

// ------------------------------------------------------------------------------ pass 3: dQ

// Returns false when the cancel flag stopped it (its outputs are then not written).
bool query_tile(const kernel::AttentionParams& a, DType dt, const Pack* pack, const WorkItem& it, DTable& dtab,
                const std::atomic<bool>* cancel, const Features& f, Scratch& w) {
  const Views vw = views_of(a, it.batch);
  const std::int64_t h = it.head, r0 = it.r0, rows = it.r1 - it.r0;
  const std::int64_t kvh = kernel::kv_head_of(h, a.heads, a.kv_heads);
  const std::int64_t size = rows * w.dq;
  const AddMerge merge{static_cast<std::size_t>(size)};
  w.partials.reset(static_cast<std::size_t>(size));
  const RowOperands ro = load_rows(a, dt, pack, vw, dtab, it.batch, h, r0, rows, w);
  // Key tiles start at multiples of kBlockKeys (the pack's layout).
  const kernel::TileRange keys = kernel::key_range_for_rows(vw.mask, r0, it.r1);
  for (std::int64_t c0 = keys.begin / kBlockKeys * kBlockKeys; c0 < keys.end; c0 += kBlockKeys) {
    if (cancel && cancel->load(std::memory_order_relaxed)) return false;
    const std::int64_t nc = kernel::min64(c0 + kBlockKeys, keys.end) - c0;
    const KeyOperands ko = load_kv(a, dt, pack, vw, it.batch, kvh, c0, nc, true, w);
    const bool full = recompute_tile(vw.mask, r0, rows, c0, nc, a.scale, ro, ko, w, {&f, it.batch, h});
    float* dq = w.partials.next();
    if (w.partials.starts_partial()) std::fill_n(dq, size, 0.f);
    if (full || all_finite(ko.k, nc * w.dq)) {
      gemm_acc(rows, w.dq, nc, w.ds.data(), kBlockKeys, 1, ko.k, w.dq, dq, w.dq);  // dQ += dS K
    } else {
      // A non-finite K row must not reach rows that do not see it (0 * NaN).
      for (std::int64_t r = 0; r < rows; ++r)
        gemm_acc(1, w.dq, w.j1[r] - w.j0[r], w.ds.data() + r * kBlockKeys + w.j0[r], kBlockKeys, 1,
                 ko.k + w.j0[r] * w.dq, w.dq, dq + r * w.dq, w.dq);
    }
    w.partials.end_tile(merge);
  }
  const float* total = w.partials.finish_or_zeros(merge);  // zeros: these rows see no key
  for (std::int64_t r = 0; r < rows; ++r)
    store_row(a.dq, dt, kernel::row_offset(vw.dq, a.dq_st, r0 + r, h), a.dq_st.d, w.dq, total + r * w.dq, a.scale);
  return true;
}

// ------------------------------------------------------------------------------ driver

// Varlen padding: gradient rows of tokens that belong to no sequence are 0.
void zero_padding(void* base, DType dt, const kernel::SequenceTable& table, std::int64_t batch, std::int64_t tokens,
                  std::int64_t heads, const kernel::Strides& st, std::int64_t dim) {
  if (!table.varlen()) return;
  const auto covered = covered_tokens(table, batch, tokens);
  for (std::int64_t t = 0; t < tokens; ++t)
    if (!covered[static_cast<std::size_t>(t)])
      for (std::int64_t h = 0; h < heads; ++h) zero_row(base, dt, t * st.s + h * st.h, st.d, dim);
}

// Runs fn(item, scratch) over the items; fn returns false when cancelled, which sets
// `stopped` and ends every thread's loop.
template <class Fn>
bool run_items(const std::vector<WorkItem>& items, const kernel::AttentionParams& a, double flops,
               std::atomic<bool>& stopped, Fn&& fn) {
  if (items.empty()) return true;
  std::atomic<std::size_t> next{0};
  return run_threads(threads_for(flops, items.size()), [&](int) {
    Scratch w(a.d_qk, a.d_v);
    for (std::size_t i = next++; i < items.size() && !stopped.load(std::memory_order_relaxed); i = next++)
      if (!fn(items[i], w)) stopped = true;
  });
}

}  // namespace

Status backward(const Problem& p) {
  const kernel::AttentionParams a = make_params(p);
  if (cancelled(p)) return cancelled_status("backward");
  const DType dt = p.dtype;
  zero_padding(a.dq, dt, a.q_seq, a.batch, p.q_tokens(), a.heads, a.dq_st, a.d_qk);
  zero_padding(a.dk, dt, a.kv_seq, a.batch, p.kv_tokens(), a.kv_heads, a.dk_st, a.d_qk);
  zero_padding(a.dv, dt, a.kv_seq, a.batch, p.kv_tokens(), a.kv_heads, a.dv_st, a.d_v);

  DTable dtab;
  dtab.heads = a.heads;
  dtab.row_base.resize(static_cast<std::size_t>(a.batch) + 1, 0);
  for (std::int64_t b = 0; b < a.batch; ++b) dtab.row_base[b + 1] = dtab.row_base[b] + a.q_seq.length(b);
  dtab.d.assign(static_cast<std::size_t>(dtab.row_base[a.batch] * a.heads), 0.f);

  std::vector<WorkItem> row_tiles, q_items, k_items;
  for (std::int64_t b = 0; b < a.batch; ++b) {
    const kernel::MaskRule mask = a.mask(b);
    for (std::int64_t r0 = 0; r0 < mask.s_q; r0 += kBlockRows) {
      const std::int64_t r1 = kernel::min64(r0 + kBlockRows, mask.s_q);
      row_tiles.push_back({b, 0, r0, r1, 0});
      const kernel::TileRange keys = kernel::key_range_for_rows(mask, r0, r1);
      for (std::int64_t h = 0; h < a.heads; ++h)
        q_items.push_back({b, h, r0, r1, (keys.end - keys.begin + 1) * (r1 - r0)});
    }
    for (std::int64_t c0 = 0; c0 < mask.s_kv; c0 += kBlockKeys) {
      const std::int64_t c1 = kernel::min64(c0 + kBlockKeys, mask.s_kv);
      const kernel::TileRange rows = kernel::query_range_for_keys(mask, c0, c1);
      for (std::int64_t kvh = 0; kvh < a.kv_heads; ++kvh)
        k_items.push_back({b, kvh, c0, c1, (rows.end - rows.begin + 1) * (c1 - c0)});
    }
  }
  heaviest_first(q_items);
  heaviest_first(k_items);

  // fp32 copies of every operand the passes re-read (K/V per query tile, Q/dO per key
  // tile), made once; over the pack budget the passes convert tile by tile.
  Pack pack;
  const PackRequest request{.k_t = true, .k_rows = true, .v_t = true, .q_rows = true, .do_rows = true};
  const bool packed =
      (p.s_q > kBlockRows || p.s_kv > kBlockKeys) && pack.build(a, dt, request, threads_for(p.flops(), k_items.size()));
  const Pack* pk = packed ? &pack : nullptr;

  std::atomic<bool> stopped{false};
  const double flops = p.flops();
  const Features f = Features::of(p);
  // d_sink: each row tile's part per head, summed in tile order below (deterministic).
  std::vector<float> sink_parts(p.d_sinks_on ? row_tiles.size() * static_cast<std::size_t>(a.heads) : 0, 0.f);
  bool ok = run_items(row_tiles, a, flops, stopped, [&](const WorkItem& it, Scratch& w) {
    const std::size_t index = static_cast<std::size_t>(&it - row_tiles.data());
    compute_delta(a, dt, it, dtab, f,
                  sink_parts.empty() ? nullptr : &sink_parts[index * static_cast<std::size_t>(a.heads)], w);
    return !cancelled(p);
  });
  ok = ok && run_items(k_items, a, flops, stopped,
                       [&](const WorkItem& it, Scratch& w) { return key_tile(a, dt, pk, it, dtab, p.cancel, f, w); });
  ok = ok && run_items(q_items, a, flops, stopped,
                       [&](const WorkItem& it, Scratch& w) { return query_tile(a, dt, pk, it, dtab, p.cancel, f, w); });
  if (ok && p.dbias_on) {
    std::vector<WorkItem> bias_items;
    const auto& bs = p.dbias.shape;
    for (std::int64_t b = 0; b < bs[0]; ++b)
      for (std::int64_t h = 0; h < bs[1]; ++h)
        for (std::int64_t r0 = 0; r0 < bs[2]; r0 += kBlockRows)
          bias_items.push_back({b, h, r0, kernel::min64(r0 + kBlockRows, bs[2]), 0});
    ok = run_items(bias_items, a, flops, stopped,
                   [&](const WorkItem& it, Scratch& w) { return dbias_item(a, dt, pk, it, dtab, p, f, w); });
  }
  if (ok && p.d_sinks_on) {
    for (std::int64_t h = 0; h < a.heads; ++h) {
      float sum = 0.f;
      for (std::size_t t = 0; t < row_tiles.size(); ++t) sum += sink_parts[t * static_cast<std::size_t>(a.heads) + h];
      p.d_sinks.data[h * p.d_sinks.stride[1]] = sum;
    }
  }
  if (stopped.load()) return cancelled_status("backward");
  if (!ok)
    return Status(StatusCode::backend_error,
                  "cpu backward: a worker thread failed (out of host memory for its tile "
                  "buffers); the gradients are incomplete");
  return Status::Ok();
}

}  // namespace strideattn::detail::cpu
