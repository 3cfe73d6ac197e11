// `cpu` forward: the tiled online-softmax algorithm (FlashAttention-2 order) in fp32.
// Work item = (sequence, query head, tile of kBlockRows query rows). For each item: load the
// Q tile, loop over the key tiles the mask leaves visible (kernel::key_range_for_rows),
// S = scale * Q K^T, mask only tiles that are not kernel::tile_fully_visible, and form the
// softmax partial of each block of kTilesPerPartial key tiles (its max m, sum l of
// exp(S - m), unnormalized P V, online within the block); partials are merged pairwise
// (cpu_accumulate.hpp) so error does not grow with the number of keys.
// Then O = O / l and LSE = m + log(l). Rows whose mask leaves no key get O = 0 and
// LSE = -inf; NaN and overflowing scores propagate to O and LSE (docs/semantics.md). Items
// run on the thread pool, heaviest first; K^T and V are converted to fp32 once per call
// (cpu_pack.hpp) when several query tiles read them.
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

// Per-thread fp32 tile buffers, allocated once per thread per call.
struct Scratch {
  std::vector<float> q;              // [kBlockRows][d_qk]
  std::vector<float> kt;             // [d_qk][kBlockKeys]  K tile transposed: S rows are contiguous
  std::vector<float> v;              // [kBlockKeys][d_v]
  std::vector<float> s;              // [kBlockRows][kBlockKeys]  scores, then probabilities
  std::vector<float> row;            // [max(d_qk, d_v)]  staging for transposed loads
  std::vector<std::int64_t> j0, j1;  // [kBlockRows] visible columns of each row in a tile
  PartialStack partials;             // per block of tiles: [m: rows][l: rows][P V: rows x d_v]
  Scratch(std::int64_t d_qk, std::int64_t d_v)
      : q(kBlockRows * d_qk),
        kt(d_qk * kBlockKeys),
        v(kBlockKeys * d_v),
        s(kBlockRows * kBlockKeys),
        row(kernel::max64(d_qk, d_v)),
        j0(kBlockRows),
        j1(kBlockRows) {}
};

std::vector<WorkItem> make_items(const kernel::AttentionParams& a) {
  std::vector<WorkItem> items;
  for (std::int64_t b = 0; b < a.batch; ++b) {
    const kernel::MaskRule mask = a.mask(b);
    for (std::int64_t r0 = 0; r0 < mask.s_q; r0 += kBlockRows) {
      const std::int64_t r1 = kernel::min64(r0 + kBlockRows, mask.s_q);
      const kernel::TileRange keys = kernel::key_range_for_rows(mask, r0, r1);
      for (std::int64_t h = 0; h < a.heads; ++h)
        items.push_back({b, h, r0, r1, (keys.end - keys.begin + 1) * (r1 - r0)});
    }
  }
  heaviest_first(items);
  return items;
}

// K^T tile ([d_qk][kBlockKeys]) and V rows ([nc][d_v]) of keys [c0, c0 + nc) of KV head
// `kvh`: from the pack when there is one, otherwise converted into the thread's scratch.
struct KvTile {
  const float* k_t = nullptr;
  const float* v = nullptr;
};
KvTile kv_tile(const kernel::AttentionParams& a, DType dt, const Pack* pack, std::int64_t b, std::int64_t kvh,
               std::int64_t c0, std::int64_t nc, Scratch& w) {
  if (pack) return {pack->k_t(b, kvh, c0), pack->v_rows(b, kvh, c0)};
  const kernel::SequenceSpan k_span = a.kv_seq.span(a.k_st, b);
  const kernel::SequenceSpan v_span = a.kv_seq.span(a.v_st, b);
  for (std::int64_t j = 0; j < nc; ++j) {
    load_row(a.k, dt, kernel::row_offset(k_span, a.k_st, c0 + j, kvh), a.k_st.d, a.d_qk, w.row.data());
    for (std::int64_t k = 0; k < a.d_qk; ++k) w.kt[k * kBlockKeys + j] = w.row[k];
    load_row(a.v, dt, kernel::row_offset(v_span, a.v_st, c0 + j, kvh), a.v_st.d, a.d_v, w.v.data() + j * a.d_v);
  }
  return {w.kt.data(), w.v.data()};
}

// Returns false when the cancel flag stopped it (its outputs are then not written).
// `f`: the training features; `*max_logit` receives the item's largest logit (-inf: none).
bool run_item(const kernel::AttentionParams& a, DType dt, const Pack* pack, const WorkItem& it,
              const std::atomic<bool>* cancel, const Features& f, float* max_logit, Scratch& w) {
  const std::int64_t dq = a.d_qk, dv = a.d_v, rows = it.r1 - it.r0;
  const kernel::MaskRule mask = a.mask(it.batch);
  const std::int64_t kvh = kernel::kv_head_of(it.head, a.heads, a.kv_heads);
  const kernel::SequenceSpan q_span = a.q_seq.span(a.q_st, it.batch);
  const kernel::SequenceSpan o_span = a.q_seq.span(a.o_st, it.batch);

  float* q = w.q.data();
  float* s = w.s.data();
  for (std::int64_t r = 0; r < rows; ++r)
    load_row(a.q, dt, kernel::row_offset(q_span, a.q_st, it.r0 + r, it.head), a.q_st.d, dq, q + r * dq);
  const SoftmaxMerge merge{rows, dv};
  w.partials.reset(static_cast<std::size_t>(rows * (2 + dv)));

  // Key tiles start at multiples of kBlockKeys (the pack's layout); keys before
  // keys.begin are invisible to every row and are masked like any other.
  const kernel::TileRange keys = kernel::key_range_for_rows(mask, it.r0, it.r1);
  for (std::int64_t c0 = keys.begin / kBlockKeys * kBlockKeys; c0 < keys.end; c0 += kBlockKeys) {
    if (cancel && cancel->load(std::memory_order_relaxed)) return false;
    const std::int64_t c1 = kernel::min64(c0 + kBlockKeys, keys.end), nc = c1 - c0;
    const KvTile kv = kv_tile(a, dt, pack, it.batch, kvh, c0, nc, w);
    // S = scale (Q K^T): the scale after the dot products, as the definition has it (a
    // pre-scaled Q carries its rounding into every score: at logits of 1e4 that is 1e-3 in
    // the exponent, and scale * Q can overflow where the scores do not)
    std::fill_n(s, rows * kBlockKeys, 0.f);
    gemm_acc(rows, nc, dq, q, dq, 1, kv.k_t, kBlockKeys, s, kBlockKeys);
    scale_scores(s, rows, nc, a.scale, q, dq, kv.k_t);

    // The block's partial: m = max of the visible scores (NaN ignored), l = sum exp(S - m),
    // online over the block's tiles as in FlashAttention.
    float* tm = w.partials.next();
    float* tl = tm + rows;
    float* to = tm + 2 * rows;
    if (w.partials.starts_partial()) {
      std::fill_n(tm, rows, kNegInf);
      std::fill_n(tl, rows, 0.f);
      std::fill_n(to, rows * dv, 0.f);
    }
    const bool full = kernel::tile_fully_visible(mask, it.r0, it.r1, c0, c1);
    for (std::int64_t r = 0; r < rows; ++r) {
      float* sr = s + r * kBlockKeys;
      std::int64_t j0 = 0, j1 = nc;  // visible columns of this row within the tile
      if (!full) {
        j0 = kernel::min64(kernel::max64(mask.key_begin(it.r0 + r) - c0, 0), nc);
        j1 = kernel::max64(kernel::min64(mask.key_end(it.r0 + r) - c0, nc), j0);
      }
      w.j0[r] = j0, w.j1[r] = j1;
      for (std::int64_t j = 0; j < j0; ++j) sr[j] = 0.f;
      for (std::int64_t j = j1; j < nc; ++j) sr[j] = 0.f;
      if (f.modifies_scores())
        f.modify_row(sr, j0, j1, c0, it.batch, it.head, it.r0 + r, mask.s_q, mask.s_kv, a.scale, nullptr);
      if (max_logit) *max_logit = row_max(sr + j0, j1 - j0, *max_logit);  // NaN ignored
      const float m = row_max(sr + j0, j1 - j0, tm[r]);
      // m = -inf: no visible score is finite or +inf. Shifting by 0 keeps -inf scores at
      // weight 0 and NaN scores NaN; the merge and the final step handle the rest. The old
      // sum's factor: 0 when it had max -inf (keeping a NaN l and O), NaN for +inf - +inf.
      const float sum = exp_sub_sum(sr + j0, j1 - j0, m == kNegInf ? 0.f : m);
      const float alpha = tm[r] == m ? 1.f : tm[r] == kNegInf ? 0.f : std::exp(tm[r] - m);
      if (alpha != 1.f) {
        float* orow = to + r * dv;
        for (std::int64_t k = 0; k < dv; ++k) orow[k] *= alpha;
      }
      tl[r] = tl[r] * alpha + sum;
      tm[r] = m;
      if (f.dropout) f.drop_row(sr, j0, j1, c0, it.batch, it.head, it.r0 + r);  // after l: LSE has no dropout
    }
    // O += P V. Where the mask cuts the tile and V holds a non-finite value, each row
    // multiplies only its visible keys: 0 * NaN must not reach rows that do not see that key.
    if (full || all_finite(kv.v, nc * dv)) {
      gemm_acc(rows, dv, nc, s, kBlockKeys, 1, kv.v, dv, to, dv);
    } else {
      for (std::int64_t r = 0; r < rows; ++r)
        gemm_acc(1, dv, w.j1[r] - w.j0[r], s + r * kBlockKeys + w.j0[r], kBlockKeys, 1, kv.v + w.j0[r] * dv, dv,
                 to + r * dv, dv);
    }
    w.partials.end_tile(merge);
  }
  const float* total = w.partials.finish(merge);

  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = it.r0 + r;
    const std::int64_t off = kernel::row_offset(o_span, a.o_st, i, it.head);
    float lse = kNegInf;
    if (mask.key_end(i) <= mask.key_begin(i) || total == nullptr) {
      zero_row(a.o, dt, off, a.o_st.d, dv);  // the mask leaves this row no key
    } else if (f.sinks_on) {
      // The sink joins the denominator: m' = max(m, sink), l' = l e^(m - m') + e^(sink - m').
      const float m = total[r], l = total[rows + r], sink = f.sink(it.head);
      const float mm = m > sink ? m : sink;
      const float keep = m == kNegInf ? 0.f : std::exp(m - mm);
      const float ll = l * keep + std::exp(sink - mm);
      store_row(a.o, dt, off, a.o_st.d, dv, total + 2 * rows + r * dv, keep / ll);
      lse = mm + std::log(ll);
    } else {
      const float m = total[r], l = total[rows + r];
      if (m == kNegInf) {
        // Every visible score is -inf or NaN: the definition's exp(S - max) is NaN.
        const float nan = std::numeric_limits<float>::quiet_NaN();
        for (std::int64_t k = 0; k < dv; ++k) w.row[k] = nan;
        store_row(a.o, dt, off, a.o_st.d, dv, w.row.data());
        lse = nan;
      } else {
        store_row(a.o, dt, off, a.o_st.d, dv, total + 2 * rows + r * dv, 1.f / l);
        lse = m + std::log(l);
      }
    }
    if (a.lse) a.lse[kernel::lse_offset(a.q_seq, a.lse_st, it.batch, it.head, i)] = lse;
  }
  return true;
}

// Varlen padding: every element of O (and LSE) that belongs to no sequence gets 0 (-inf).
void write_padding(const Problem& p, const kernel::AttentionParams& a) {
  if (!p.varlen) return;
  const std::int64_t tokens = p.q_tokens();
  const std::int64_t lse_tokens = p.writes_lse() ? p.lse.shape[2] : 0;
  const auto covered = covered_tokens(a.q_seq, a.batch, kernel::max64(tokens, lse_tokens));
  for (std::int64_t t = 0; t < kernel::max64(tokens, lse_tokens); ++t) {
    if (covered[static_cast<std::size_t>(t)]) continue;
    for (std::int64_t h = 0; h < a.heads; ++h) {
      if (t < tokens) zero_row(a.o, p.dtype, t * a.o_st.s + h * a.o_st.h, a.o_st.d, a.d_v);
      if (t < lse_tokens) a.lse[h * a.lse_st.h + t * a.lse_st.s] = kNegInf;
    }
  }
}

}  // namespace

Status forward(const Problem& p) {
  const kernel::AttentionParams a = make_params(p);
  if (cancelled(p)) return cancelled_status("forward");
  write_padding(p, a);
  if (p.max_logit_on)
    for (std::int64_t b = 0; b < p.max_logit.shape[0]; ++b)
      for (std::int64_t h = 0; h < p.max_logit.shape[1]; ++h)
        p.max_logit.data[b * p.max_logit.stride[0] + h * p.max_logit.stride[1]] = kNegInf;
  const std::vector<WorkItem> items = make_items(a);
  if (items.empty()) return Status::Ok();
  const int threads = threads_for(p.flops(), items.size());
  // K^T and V in fp32 once per call when more than one query tile reads them.
  Pack pack;
  const bool packed = p.s_q > kBlockRows && pack.build(a, p.dtype, PackRequest{.k_t = true, .v_rows = true}, threads);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> stopped{false};
  const Features f = Features::of(p);
  // Max logit: each item's, then the max per (batch, head) in item order.
  std::vector<float> item_max(p.max_logit_on ? items.size() : 0, kNegInf);
  const bool ok = run_threads(threads, [&](int) {
    Scratch w(a.d_qk, a.d_v);
    for (std::size_t i = next++; i < items.size() && !stopped.load(std::memory_order_relaxed); i = next++)
      if (!run_item(a, p.dtype, packed ? &pack : nullptr, items[i], p.cancel, f,
                    item_max.empty() ? nullptr : &item_max[i], w))
        stopped = true;
  });
  if (stopped.load()) return cancelled_status("forward");
  if (ok && p.max_logit_on) {
    for (std::size_t i = 0; i < items.size(); ++i) {
      float* dst = &p.max_logit.data[items[i].batch * p.max_logit.stride[0] + items[i].head * p.max_logit.stride[1]];
      if (item_max[i] > *dst) *dst = item_max[i];
    }
  }
  if (!ok)
    return Status(StatusCode::backend_error,
                  "cpu forward: a worker thread failed (out of host memory for its tile "
                  "buffers); the output is incomplete");
  return Status::Ok();
}

}  // namespace strideattn::detail::cpu
