// Test helper for KV-cache attention: one problem in host memory with its caches (contiguous or
// paged, padded strides, head-major pages, shuffled / transposed / partly unused block tables,
// pages shared between sequences), fresh random inputs, poisoned outputs with guard elements
// around every written view, and the explicit oracle: each sequence's attended tokens gathered
// here into contiguous K / V and run as a dense forward problem on `reference`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/dtype.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::test_support {

using i64 = std::int64_t;

// Elements of one dtype in a byte buffer, with `guard` poisoned elements before the view.
struct Buf {
  DType dtype = DType::f32;
  std::vector<unsigned char> bytes;
  i64 guard = 8;
  void resize(i64 n, float fill) {
    bytes.assign(std::size_t((n + 2 * guard) * i64(size_of(dtype))), 0);
    for (i64 i = -guard; i < n + guard; ++i) set(i, fill);
  }
  [[nodiscard]] i64 size() const { return i64(bytes.size()) / i64(size_of(dtype)) - 2 * guard; }
  void* data() { return bytes.data() + guard * i64(size_of(dtype)); }
  void set(i64 i, float x) { detail::store_from_float(data(), dtype, i, x); }
  [[nodiscard]] float get(i64 i) const {
    return detail::load_as_float(bytes.data() + guard * i64(size_of(dtype)), dtype, i);
  }
};

struct KvCase {
  i64 b = 2, s_q = 1, h = 4, hg = 2, d = 16, dv = 16;
  DType dtype = DType::f32;
  bool paged = true;
  i64 page_size = 3, max_pages = 4, num_pages = 0;  // num_pages 0: b * max_pages + 2 spare pages
  i64 s_max = 12;                                   // contiguous capacity
  std::vector<std::int32_t> cache_seqlens{5, 2};
  i64 s_new = 0;
  std::vector<std::int32_t> seqlens_q;  // empty: none given
  AttentionOptions options{};
  i64 pad = 0;              // extra elements after each cache head row
  bool head_major = false;  // caches laid out [page, head, slot, d]
  bool transposed_table = false;
  bool share_prefix = false;  // sequence 1 reads sequence 0's first page (must be full in both)
  std::uint64_t seed = 1;

  static constexpr float kPoison = 12345.f;

  Buf q, kc, vc, kn, vn, o;
  std::vector<float> lse;  // with 8 guard floats each side
  std::vector<std::int32_t> table;
  std::vector<unsigned char> kc_before, vc_before;

  [[nodiscard]] i64 rows() const { return paged ? (num_pages ? num_pages : b * max_pages + 2) : b; }
  [[nodiscard]] i64 slots() const { return paged ? page_size : s_max; }
  [[nodiscard]] Dims4 cache_stride(i64 dd) const {
    const i64 row = dd + pad;
    if (head_major) return {hg * slots() * row, row, slots() * row, 1};
    return {slots() * hg * row, hg * row, row, 1};
  }
  [[nodiscard]] i64 cache_elems(i64 dd) const { return rows() * slots() * hg * (dd + pad); }
  [[nodiscard]] i64 table_at(i64 n, i64 j) const { return transposed_table ? j * b + n : n * max_pages + j; }
  [[nodiscard]] i64 qlen(i64 n) const { return seqlens_q.empty() ? s_q : seqlens_q[std::size_t(n)]; }

  void build() {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.f, 1.f);
    auto fill = [&](Buf& x, i64 n) {
      x.dtype = dtype;
      x.resize(n, kPoison);
      for (i64 i = 0; i < n; ++i) x.set(i, dist(rng));
    };
    fill(q, b * s_q * h * d);
    fill(kc, cache_elems(d));
    fill(vc, cache_elems(dv));
    fill(kn, b * s_new * hg * d);
    fill(vn, b * s_new * hg * dv);
    o.dtype = dtype;
    o.resize(b * s_q * h * dv, kPoison);
    lse.assign(std::size_t(b * h * s_q + 16), kPoison);
    if (paged) {  // shuffled pages, each used once; unused entries -1
      std::vector<std::int32_t> pages(static_cast<std::size_t>(rows()));
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), rng);
      table.assign(std::size_t(b * max_pages), -1);
      std::size_t next = 0;
      for (i64 n = 0; n < b; ++n) {
        const i64 used = (cache_seqlens[std::size_t(n)] + s_new + page_size - 1) / page_size;
        for (i64 j = 0; j < used; ++j) table[std::size_t(table_at(n, j))] = pages[next++];
      }
      if (share_prefix) table[std::size_t(table_at(1, 0))] = table[std::size_t(table_at(0, 0))];
    }
    kc_before = kc.bytes;
    vc_before = vc.bytes;
  }

  [[nodiscard]] TensorView cache_view(Buf& x, i64 dd) const {
    return {x.data(), dtype, {rows(), slots(), hg, dd}, cache_stride(dd)};
  }
  static TensorView dense(Buf& x, DType dt, i64 bb, i64 s, i64 heads, i64 dd) {
    return {x.data(), dt, {bb, s, heads, dd}, {s * heads * dd, heads * dd, dd, 1}};
  }

  KvCacheArgs args(Backend backend) {
    KvCacheArgs a;
    a.q = dense(q, dtype, b, s_q, h, d);
    a.k_cache = cache_view(kc, d);
    a.v_cache = cache_view(vc, dv);
    if (s_new > 0) {
      a.k_new = dense(kn, dtype, b, s_new, hg, d);
      a.v_new = dense(vn, dtype, b, s_new, hg, dv);
    }
    if (paged) {
      a.block_table.data = table.data();
      a.block_table.shape = {b, max_pages};
      a.block_table.stride = transposed_table ? std::array<i64, 2>{1, b} : std::array<i64, 2>{max_pages, 1};
    }
    a.cache_seqlens = cache_seqlens.data();
    a.seqlens_q = seqlens_q.empty() ? nullptr : seqlens_q.data();
    a.o = dense(o, dtype, b, s_q, h, dv);
    a.lse = {lse.data() + 8, {b, h, s_q}, {h * s_q, s_q, 1}};
    a.options = options;
    a.backend = backend;
    return a;
  }

  // Element (token t of sequence n, head hh, c) of a cache as it was built (before any append).
  [[nodiscard]] i64 cache_index(i64 n, i64 t, i64 hh, i64 c, i64 dd) const {
    const i64 row = paged ? table[std::size_t(table_at(n, t / page_size))] : n;
    const i64 slot = paged ? t % page_size : t;
    const Dims4 st = cache_stride(dd);
    return row * st[0] + slot * st[1] + hh * st[2] + c;
  }

  struct Dense {
    std::vector<float> o, lse;  // o [b, s_q, h, dv], lse [b, h, s_q]
  };
  // The oracle: for each sequence, its cache tokens and new tokens gathered into contiguous
  // buffers here, then a dense forward problem on `reference` (s_q = its query rows, s_kv = the
  // attended length, the same options: the masks' bottom-right diagonal is the attended end).
  Dense oracle() {
    Dense r;
    r.o.assign(std::size_t(b * s_q * h * dv), 0.f);
    r.lse.assign(std::size_t(b * h * s_q), -std::numeric_limits<float>::infinity());
    for (i64 n = 0; n < b; ++n) {
      const i64 cached = cache_seqlens[std::size_t(n)], L = cached + s_new, lq = qlen(n);
      if (L == 0 || lq == 0) continue;
      Buf kk, vv, qq, oo;
      kk.dtype = vv.dtype = qq.dtype = oo.dtype = dtype;
      kk.resize(L * hg * d, 0.f), vv.resize(L * hg * dv, 0.f), qq.resize(lq * h * d, 0.f), oo.resize(lq * h * dv, 0.f);
      Buf kc0 = kc, vc0 = vc;  // the caches as built, whatever a call wrote since
      kc0.bytes = kc_before, vc0.bytes = vc_before;
      for (i64 t = 0; t < L; ++t)
        for (i64 hh = 0; hh < hg; ++hh) {
          for (i64 c = 0; c < d; ++c)
            kk.set((t * hg + hh) * d + c, t < cached ? kc0.get(cache_index(n, t, hh, c, d))
                                                     : kn.get(((n * s_new + t - cached) * hg + hh) * d + c));
          for (i64 c = 0; c < dv; ++c)
            vv.set((t * hg + hh) * dv + c, t < cached ? vc0.get(cache_index(n, t, hh, c, dv))
                                                      : vn.get(((n * s_new + t - cached) * hg + hh) * dv + c));
        }
      for (i64 i = 0; i < lq * h * d; ++i) qq.set(i, q.get(n * s_q * h * d + i));
      std::vector<float> l(std::size_t(h * lq));
      ForwardArgs f;
      f.q = dense(qq, dtype, 1, lq, h, d);
      f.k = dense(kk, dtype, 1, L, hg, d);
      f.v = dense(vv, dtype, 1, L, hg, dv);
      f.o = dense(oo, dtype, 1, lq, h, dv);
      f.lse = {l.data(), {1, h, lq}, {h * lq, lq, 1}};
      f.options = options;
      f.backend = Backend::reference;
      if (!strideattn::forward(f).ok()) return {};
      for (i64 i = 0; i < lq * h * dv; ++i) r.o[std::size_t(n * s_q * h * dv + i)] = oo.get(i);
      for (i64 hh = 0; hh < h; ++hh)
        for (i64 i = 0; i < lq; ++i) r.lse[std::size_t((n * h + hh) * s_q + i)] = l[std::size_t(hh * lq + i)];
    }
    return r;
  }

  // The caches as the call must leave them: as built, with each new token at its slot.
  void expected_caches(std::vector<unsigned char>* k, std::vector<unsigned char>* v) const {
    Buf ek = kc, ev = vc;
    ek.bytes = kc_before, ev.bytes = vc_before;
    for (i64 n = 0; n < b; ++n)
      for (i64 t = 0; t < s_new; ++t)
        for (i64 hh = 0; hh < hg; ++hh) {
          const i64 tok = cache_seqlens[std::size_t(n)] + t;
          for (i64 c = 0; c < d; ++c)
            ek.set(cache_index(n, tok, hh, c, d), kn.get(((n * s_new + t) * hg + hh) * d + c));
          for (i64 c = 0; c < dv; ++c)
            ev.set(cache_index(n, tok, hh, c, dv), vn.get(((n * s_new + t) * hg + hh) * dv + c));
        }
    *k = ek.bytes, *v = ev.bytes;
  }

  [[nodiscard]] float poison() const { return detail::round_to(dtype, kPoison); }
  [[nodiscard]] bool outputs_untouched() const {
    for (i64 i = -o.guard; i < o.size() + o.guard; ++i)
      if (o.get(i) != poison()) return false;
    for (float x : lse)
      if (x != kPoison) return false;
    return true;
  }
  [[nodiscard]] bool guards_intact() const {
    for (i64 i = 1; i <= o.guard; ++i)
      if (o.get(-i) != poison() || o.get(o.size() - 1 + i) != poison()) return false;
    for (std::size_t i = 0; i < 8; ++i)
      if (lse[i] != kPoison || lse[lse.size() - 1 - i] != kPoison) return false;
    return true;
  }
};

}  // namespace strideattn::test_support
