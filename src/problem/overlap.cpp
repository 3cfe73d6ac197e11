// The byte-overlap algebra (overlap.hpp): two views overlap when some byte of one is a byte
// of the other. Each view is reduced to contiguous runs ("rows": the head-dim run, merged
// with any dimension whose stride equals the run length) repeated over the remaining
// dimensions. If the byte ranges are disjoint there is no overlap. Otherwise, when one
// view's dimensions are nested (each stride >= the span of all smaller ones), membership in
// it is decided by division, and the other view's rows are enumerated and tested one by
// one. When neither is nested, both row sets are enumerated, sorted and swept. Enumeration
// is capped at kMaxRows rows per view; above the cap the answer is the conservative one
// ("may overlap"), and validate.cpp's message says so. The same machinery decides whether
// an output overlaps itself.
#include "problem/overlap.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace strideattn::detail {

namespace {

using i64 = std::int64_t;
using i128 = __int128;

constexpr i64 kMaxRows = i64{1} << 22;  // enumeration cap per view (see header comment)

// Nesting, row count and end of a region from its base, run and sorted dims.
void finish_region(Region* r) {
  i128 span = r->run, reach = r->run;
  r->nested = true;
  r->rows = 1;
  for (const auto& d : r->dims) {
    if (d.stride < span) r->nested = false;
    span = d.stride * (d.extent - 1) + span;
    reach += d.stride * (d.extent - 1);
    r->rows = r->rows > (i128{1} << 64) / d.extent ? (i128{1} << 64) : r->rows * d.extent;
  }
  r->hi = r->base + reach;
}

Region make_region(const void* data, i64 elem_bytes, const i64* shape, const i64* stride, int rank) {
  Region r;
  r.base = static_cast<i128>(reinterpret_cast<std::uintptr_t>(data));
  r.run = elem_bytes;
  for (int i = 0; i < rank; ++i) {
    if (shape[i] <= 0) {
      r.empty = true;
      return r;
    }
  }
  for (int i = 0; i < rank; ++i) {
    if (shape[i] == 1) continue;
    i128 s = static_cast<i128>(stride[i]) * elem_bytes;
    if (s > (i128{1} << 60) || s < -(i128{1} << 60)) {  // absurd stride: no exact answer
      r.representable = false;
      return r;
    }
    if (s < 0) {  // walk the dimension the other way: same set of bytes
      s = -s;
      r.base -= s * (shape[i] - 1);
    }
    r.dims.push_back({shape[i], s});
  }
  // Merge dimensions that continue the contiguous run (head dim first, stride 1 element).
  for (bool merged = true; merged;) {
    merged = false;
    for (std::size_t k = 0; k < r.dims.size(); ++k) {
      if (r.dims[k].stride == r.run) {
        r.run *= r.dims[k].extent;
        r.dims.erase(r.dims.begin() + static_cast<std::ptrdiff_t>(k));
        merged = true;
        break;
      }
    }
  }
  std::sort(r.dims.begin(), r.dims.end(), [](const Region::D& a, const Region::D& b) { return a.stride < b.stride; });
  finish_region(&r);
  return r;
}

// The same region without its dimension `k` (base unchanged).
Region without_dim(const Region& r, std::size_t k) {
  Region out = r;
  out.dims.erase(out.dims.begin() + static_cast<std::ptrdiff_t>(k));
  finish_region(&out);
  return out;
}

// Smallest byte offset q >= p (p >= 0, relative to base) in a nested region, using its
// first k dims; -1 when there is none.
i128 next_in(const Region& r, std::size_t k, i128 p) {
  if (k == 0) return p < r.run ? p : -1;
  const Region::D& d = r.dims[k - 1];
  const i128 i = p / d.stride;
  if (i >= d.extent) return -1;
  const i128 q = next_in(r, k - 1, p - i * d.stride);
  if (q >= 0) return i * d.stride + q;
  if (i + 1 < d.extent) return (i + 1) * d.stride;
  return -1;
}

// Row starts (absolute) of a region with at most kMaxRows rows.
std::vector<i128> row_starts(const Region& r) {
  std::vector<i128> starts;
  starts.reserve(static_cast<std::size_t>(r.rows));
  std::vector<i64> idx(r.dims.size(), 0);
  i128 off = r.base;
  for (;;) {
    starts.push_back(off);
    std::size_t k = 0;
    for (; k < r.dims.size(); ++k) {
      if (++idx[k] < r.dims[k].extent) {
        off += r.dims[k].stride;
        break;
      }
      off -= r.dims[k].stride * (r.dims[k].extent - 1);
      idx[k] = 0;
    }
    if (k == r.dims.size()) break;
  }
  return starts;
}

}  // namespace

Region region_of(const TensorView& v) {
  return make_region(v.data, static_cast<i64>(size_of(v.dtype)), v.shape.data(), v.stride.data(), 4);
}
Region region_of(const LseView& v) { return make_region(v.data, 4, v.shape.data(), v.stride.data(), 3); }

OverlapResult overlap_regions(const Region& a, const Region& b) {
  OverlapResult res;
  if (a.empty || b.empty) return res;
  if (!a.representable || !b.representable) {
    res.overlap = true;
    res.exact = false;
    return res;
  }
  if (a.hi <= b.base || b.hi <= a.base) return res;  // disjoint byte ranges
  // A dimension of equal stride s in both (the largest such): A = U_i (A' + i s) and
  // B = U_j (B' + j s), so they meet iff A' meets B' + m s for some shift m = j - i that a
  // valid pair (i, j) realises. Only shifts whose boxes intersect can matter; peel the
  // dimension when there are at most three of them (blocks no wider than a stride, the
  // usual case of views side by side in one buffer), which keeps this fast for large views.
  for (std::size_t ka = a.dims.size(); ka-- > 0;) {
    std::size_t kb = b.dims.size();
    for (std::size_t j = 0; j < b.dims.size(); ++j)
      if (b.dims[j].stride == a.dims[ka].stride) kb = j;
    if (kb == b.dims.size()) continue;
    const i128 stride = a.dims[ka].stride;
    if (stride <= 0) break;
    const Region a0 = without_dim(a, ka), b0 = without_dim(b, kb);
    auto floor_div = [](i128 x, i128 y) { return x >= 0 ? x / y : -((-x + y - 1) / y); };
    // [b0.base + m s, b0.hi + m s) meets [a0.base, a0.hi)  <=>  a0.base - b0.hi < m s < a0.hi - b0.base
    i128 m_lo = floor_div(a0.base - b0.hi, stride) + 1;
    i128 m_hi = -floor_div(-(a0.hi - b0.base), stride) - 1;
    m_lo = std::max<i128>(m_lo, -(a.dims[ka].extent - 1));
    m_hi = std::min<i128>(m_hi, b.dims[kb].extent - 1);
    if (m_hi - m_lo + 1 > 3) break;
    for (i128 m = m_lo; m <= m_hi; ++m) {
      Region shifted = b0;
      shifted.base += m * stride;
      shifted.hi += m * stride;
      OverlapResult r = overlap_regions(a0, shifted);
      if (r.overlap) {
        if (r.exact) r.witness += (m < 0 ? -m : 0) * stride;  // A block i = max(0, -m), B block i + m
        return r;
      }
    }
    return res;
  }
  // Enumerate the rows of `s`, test each against nested `t`.
  auto probe = [&](const Region& s, const Region& t) -> OverlapResult {
    OverlapResult out;
    for (i128 x : row_starts(s)) {
      const i128 p = x - t.base;
      if (p + s.run <= 0) continue;
      const i128 q = next_in(t, t.dims.size(), p < 0 ? 0 : p);
      if (q >= 0 && q < p + s.run) {
        out.overlap = true;
        out.witness = t.base + q;
        return out;
      }
    }
    return out;
  };
  const bool a_small = a.rows <= kMaxRows, b_small = b.rows <= kMaxRows;
  if (b.nested && a_small && (!a.nested || a.rows <= b.rows || !b_small)) return probe(a, b);
  if (a.nested && b_small) return probe(b, a);
  if (a_small && b_small) {  // neither nested: sort both row sets and sweep
    struct Run {
      i128 lo, hi;
    };
    auto runs = [](const Region& r) {
      std::vector<Run> v;
      for (i128 x : row_starts(r)) v.push_back({x, x + r.run});
      std::sort(v.begin(), v.end(), [](const Run& l, const Run& m) { return l.lo < m.lo; });
      return v;
    };
    const std::vector<Run> ra = runs(a), rb = runs(b);
    std::size_t i = 0, j = 0;
    while (i < ra.size() && j < rb.size()) {
      const i128 lo = std::max(ra[i].lo, rb[j].lo), hi = std::min(ra[i].hi, rb[j].hi);
      if (lo < hi) {
        res.overlap = true;
        res.witness = lo;
        return res;
      }
      if (ra[i].hi < rb[j].hi)
        ++i;
      else
        ++j;
    }
    return res;
  }
  res.overlap = true;
  res.exact = false;
  return res;
}

// Whether two distinct elements of a region share a byte.
OverlapResult self_overlap(const Region& r) {
  OverlapResult res;
  if (r.empty || r.nested) return res;
  if (!r.representable || r.rows > kMaxRows) {
    res.overlap = true;
    res.exact = false;
    return res;
  }
  std::vector<i128> starts = row_starts(r);
  std::sort(starts.begin(), starts.end());
  for (std::size_t i = 1; i < starts.size(); ++i) {
    if (starts[i] < starts[i - 1] + r.run) {
      res.overlap = true;
      res.witness = starts[i];
      return res;
    }
  }
  return res;
}

bool views_overlap(const TensorView& a, const TensorView& b) {
  return overlap_regions(region_of(a), region_of(b)).overlap;
}

}  // namespace strideattn::detail
