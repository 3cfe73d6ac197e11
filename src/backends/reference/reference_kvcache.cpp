// The reference's KV-cache attention: per sequence, a plain gather of the attended keys into a
// contiguous [1, L, hg, d] copy (cache tokens 0 .. cache_seqlens - 1 through the block table or
// the batch row, then the s_new new tokens from k_new / v_new), then the reference engine on that
// dense problem with the sequence's query rows. Its addressing is its own (the cpu backend has
// another); element bits are copied, so the gather is exact in every dtype.
#include "backends/reference/reference_kvcache.hpp"

#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "common/dtype.hpp"

namespace strideattn::detail {

namespace {

using i64 = std::int64_t;

// Byte address of element (i0, i1, i2, i3) of a view.
const unsigned char* element(const TensorView& v, i64 i0, i64 i1, i64 i2, i64 i3) {
  const i64 off = i0 * v.stride[0] + i1 * v.stride[1] + i2 * v.stride[2] + i3 * v.stride[3];
  return static_cast<const unsigned char*>(v.data) + off * i64(size_of(v.dtype));
}

// Cache coordinates (batch row or page, slot) of token t of sequence n.
void cache_coords(const KvCacheProblem& p, i64 n, i64 t, i64* row, i64* slot) {
  if (!p.paged) {
    *row = n;
    *slot = t;
    return;
  }
  const BlockTableView& bt = p.args.block_table;
  *row = bt.data[n * bt.stride[0] + (t / p.page_size) * bt.stride[1]];
  *slot = t % p.page_size;
}

// Sequence n's attended tokens of one cache ([1, L, hg, d], contiguous bytes).
std::vector<unsigned char> gather(const KvCacheProblem& p, const TensorView& cache, const TensorView& fresh, i64 n,
                                  i64 cached, i64 len) {
  const i64 hg = p.kv_heads, d = cache.shape[kHeadDim], es = i64(size_of(p.dtype));
  std::vector<unsigned char> buf(std::size_t(len * hg * d * es));
  for (i64 t = 0; t < len; ++t)
    for (i64 h = 0; h < hg; ++h)
      for (i64 c = 0; c < d; ++c) {
        const unsigned char* src;
        if (t < cached) {
          i64 row = 0, slot = 0;
          cache_coords(p, n, t, &row, &slot);
          src = element(cache, row, slot, h, c);
        } else {
          src = element(fresh, n, t - cached, h, c);
        }
        std::memcpy(&buf[std::size_t(((t * hg + h) * d + c) * es)], src, std::size_t(es));
      }
  return buf;
}

TensorView contiguous(void* data, DType dtype, i64 s, i64 h, i64 d) {
  return {data, dtype, {1, s, h, d}, {s * h * d, h * d, d, 1}};
}

bool cancelled(const KvCacheProblem& p) {
  return p.args.options.cancel != nullptr && p.args.options.cancel->load(std::memory_order_relaxed);
}

}  // namespace

Status reference_kvcache_compute(const KvCacheProblem& p, RefPrecision precision, ReferenceOutputs* out) {
  KvCacheLengths len;
  if (Status s = check_kvcache_lengths(p, &len); !s.ok()) return s;
  const KvCacheArgs& a = p.args;
  const i64 b = p.batch, sq = p.s_q, h = p.heads, dv = p.d_v;
  out->o.assign(std::size_t(b * sq * h * dv), 0.0);
  out->lse.assign(std::size_t(b * h * sq), -std::numeric_limits<double>::infinity());
  if (h == 0) return Status::Ok();
  for (i64 n = 0; n < b; ++n) {
    if (cancelled(p)) break;
    const i64 cached = len.cache[std::size_t(n)], L = cached + p.s_new, lq = len.q[std::size_t(n)];
    if (lq == 0 || L == 0) continue;  // no rows, or rows that see no key: 0 and -inf
    std::vector<unsigned char> k = gather(p, a.k_cache, a.k_new, n, cached, L);
    std::vector<unsigned char> v = gather(p, a.v_cache, a.v_new, n, cached, L);
    ForwardArgs f;
    f.q = a.q;
    f.q.data = const_cast<unsigned char*>(element(a.q, n, 0, 0, 0));
    f.q.shape = {1, lq, h, p.d_qk};
    f.k = contiguous(k.data(), p.dtype, L, p.kv_heads, p.d_qk);
    f.v = contiguous(v.data(), p.dtype, L, p.kv_heads, dv);
    f.o = a.o;  // never written by reference_compute; validation needs a view
    f.o.data = const_cast<unsigned char*>(element(a.o, n, 0, 0, 0));
    f.o.shape = {1, lq, h, dv};
    f.options = a.options;
    Problem seq;
    if (Status s = make_problem(f, &seq); !s.ok())
      return Status(StatusCode::internal, "reference kv cache: sequence " + std::to_string(n) + ": " + s.message());
    const ReferenceOutputs r = reference_compute(seq, precision);
    for (i64 i = 0; i < lq; ++i)
      for (i64 hh = 0; hh < h; ++hh) {
        for (i64 c = 0; c < dv; ++c)
          out->o[std::size_t(((n * sq + i) * h + hh) * dv + c)] = r.o[std::size_t((i * h + hh) * dv + c)];
        out->lse[std::size_t((n * h + hh) * sq + i)] = r.lse[std::size_t(hh * lq + i)];
      }
  }
  if (cancelled(p))
    return Status(StatusCode::cancelled,
                  "reference kv cache: cancelled by the caller's cancel flag; nothing was written");
  return Status::Ok();
}

Status reference_kvcache_forward(const KvCacheProblem& p) {
  try {
    ReferenceOutputs r;
    if (Status s = reference_kvcache_compute(p, RefPrecision::exact, &r); !s.ok()) return s;
    const KvCacheArgs& a = p.args;
    // The append: new token t of sequence n goes to cache token cache_seqlens[n] + t.
    if (p.appends) {
      const i64 es = i64(size_of(p.dtype));
      for (i64 n = 0; n < p.batch; ++n)
        for (i64 t = 0; t < p.s_new; ++t) {
          i64 row = 0, slot = 0;
          cache_coords(p, n, a.cache_seqlens[n] + t, &row, &slot);
          for (i64 hh = 0; hh < p.kv_heads; ++hh) {
            for (i64 c = 0; c < p.d_qk; ++c)
              std::memcpy(const_cast<unsigned char*>(element(a.k_cache, row, slot, hh, c)),
                          element(a.k_new, n, t, hh, c), std::size_t(es));
            for (i64 c = 0; c < p.d_v; ++c)
              std::memcpy(const_cast<unsigned char*>(element(a.v_cache, row, slot, hh, c)),
                          element(a.v_new, n, t, hh, c), std::size_t(es));
          }
        }
    }
    const i64 sq = p.s_q, h = p.heads, dv = p.d_v;
    for (i64 n = 0; n < p.batch; ++n)
      for (i64 i = 0; i < sq; ++i)
        for (i64 hh = 0; hh < h; ++hh) {
          for (i64 c = 0; c < dv; ++c) {
            const i64 off = n * a.o.stride[0] + i * a.o.stride[1] + hh * a.o.stride[2] + c * a.o.stride[3];
            store_from_float(a.o.data, p.dtype, off, float(r.o[std::size_t(((n * sq + i) * h + hh) * dv + c)]));
          }
          if (a.lse.data)
            a.lse.data[n * a.lse.stride[0] + hh * a.lse.stride[1] + i * a.lse.stride[2]] =
                float(r.lse[std::size_t((n * h + hh) * sq + i)]);
        }
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::backend_error, "reference kv cache: out of host memory");
  }
}

}  // namespace strideattn::detail
