// The `cpu` backend's KV-cache attention (docs/semantics.md "KV cache"): the append of the new
// tokens into the caches first (as FlashAttention's flash_attn_with_kvcache writes them before
// it attends), then per sequence a gather of its attended tokens out of the cache (pages through
// the block table, any strides) into a contiguous [1, L, hg, d] buffer, and the tiled forward
// (cpu_forward.cpp) on that sequence's query rows, writing its O and LSE rows in place.
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_common.hpp"
#include "problem/kv_cache.hpp"

namespace strideattn::detail::cpu {

namespace {

using i64 = std::int64_t;

// A [b, s, h, d] view's row (i0, i1, i2): its first element's byte address and head-dim step.
struct Row {
  unsigned char* base;
  i64 step;  // bytes between head-dim elements (element size, negated for a reversed view)
};

Row row_of(const TensorView& v, i64 i0, i64 i1, i64 i2) {
  const i64 es = i64(size_of(v.dtype));
  const i64 off = i0 * v.stride[kBatch] + i1 * v.stride[kSeq] + i2 * v.stride[kHead];
  return {static_cast<unsigned char*>(v.data) + off * es, (v.shape[kHeadDim] > 1 ? v.stride[kHeadDim] : 1) * es};
}

void copy_row(const Row& dst, const Row& src, i64 d, i64 es) {
  if (dst.step == es && src.step == es) {
    std::memmove(dst.base, src.base, std::size_t(d * es));
    return;
  }
  for (i64 c = 0; c < d; ++c) std::memcpy(dst.base + c * dst.step, src.base + c * src.step, std::size_t(es));
}

// The page (or batch row) and slot of token t of sequence n; block-table entries were checked.
std::pair<i64, i64> locate(const KvCacheProblem& p, i64 n, i64 t) {
  if (!p.paged) return {n, t};
  const BlockTableView& bt = p.args.block_table;
  return {i64(bt.data[n * bt.stride[0] + (t / p.page_size) * bt.stride[1]]), t % p.page_size};
}

void append(const KvCacheProblem& p, const KvCacheLengths& len) {
  const KvCacheArgs& a = p.args;
  const i64 es = i64(size_of(p.dtype));
  for (i64 n = 0; n < p.batch; ++n)
    for (i64 t = 0; t < p.s_new; ++t) {
      const auto [page, slot] = locate(p, n, len.cache[std::size_t(n)] + t);
      for (i64 h = 0; h < p.kv_heads; ++h) {
        copy_row(row_of(a.k_cache, page, slot, h), row_of(a.k_new, n, t, h), p.d_qk, es);
        copy_row(row_of(a.v_cache, page, slot, h), row_of(a.v_new, n, t, h), p.d_v, es);
      }
    }
}

// Tokens 0 .. L - 1 of sequence n out of one cache, contiguous [L, hg, d].
void gather(const KvCacheProblem& p, const TensorView& cache, i64 n, i64 L, std::vector<unsigned char>* out) {
  const i64 es = i64(size_of(p.dtype)), hg = p.kv_heads, d = cache.shape[kHeadDim];
  out->resize(std::size_t(L * hg * d * es));
  for (i64 t = 0; t < L; ++t) {
    const auto [page, slot] = locate(p, n, t);
    for (i64 h = 0; h < hg; ++h)
      copy_row({out->data() + (t * hg + h) * d * es, es}, row_of(cache, page, slot, h), d, es);
  }
}

// O rows [r0, r1) of sequence n get 0, their LSE -inf (rows past the query length, or rows
// of a sequence with nothing to attend to).
void write_empty_rows(const KvCacheProblem& p, i64 n, i64 r0, i64 r1) {
  const KvCacheArgs& a = p.args;
  for (i64 i = r0; i < r1; ++i)
    for (i64 h = 0; h < p.heads; ++h) {
      const i64 base = n * a.o.stride[kBatch] + i * a.o.stride[kSeq] + h * a.o.stride[kHead];
      for (i64 c = 0; c < p.d_v; ++c) store_from_float(a.o.data, p.dtype, base + c * a.o.stride[kHeadDim], 0.f);
      if (a.lse.data)
        a.lse.data[n * a.lse.stride[0] + h * a.lse.stride[1] + i * a.lse.stride[2]] =
            -std::numeric_limits<float>::infinity();
    }
}

}  // namespace

Status forward_kvcache(const KvCacheProblem& p) {
  KvCacheLengths len;
  if (Status s = check_kvcache_lengths(p, &len); !s.ok()) return s;
  const KvCacheArgs& a = p.args;
  if (p.appends && p.kv_heads > 0) append(p, len);
  if (p.heads == 0) return Status::Ok();
  std::vector<unsigned char> k, v;
  for (i64 n = 0; n < p.batch; ++n) {
    if (a.options.cancel != nullptr && a.options.cancel->load(std::memory_order_relaxed))
      return Status(StatusCode::cancelled,
                    "cpu kv cache: cancelled by the caller's cancel flag; outputs are incomplete");
    const i64 L = len.attended(n, p.s_new), lq = len.q[std::size_t(n)];
    if (L == 0) {
      write_empty_rows(p, n, 0, p.s_q);
      continue;
    }
    write_empty_rows(p, n, lq, p.s_q);
    if (lq == 0) continue;
    gather(p, a.k_cache, n, L, &k);
    gather(p, a.v_cache, n, L, &v);
    ForwardArgs f;
    f.q = a.q;
    f.q.data = row_of(a.q, n, 0, 0).base;
    f.q.shape = {1, lq, p.heads, p.d_qk};
    f.k = {k.data(), p.dtype, {1, L, p.kv_heads, p.d_qk}, {L * p.kv_heads * p.d_qk, p.kv_heads * p.d_qk, p.d_qk, 1}};
    f.v = {v.data(), p.dtype, {1, L, p.kv_heads, p.d_v}, {L * p.kv_heads * p.d_v, p.kv_heads * p.d_v, p.d_v, 1}};
    f.o = a.o;
    f.o.data = row_of(a.o, n, 0, 0).base;
    f.o.shape = {1, lq, p.heads, p.d_v};
    if (a.lse.data) {
      f.lse = a.lse;
      f.lse.data = a.lse.data + n * a.lse.stride[0];
      f.lse.shape = {1, p.heads, lq};
    }
    f.options = a.options;
    Problem seq;
    if (Status s = make_problem(f, &seq); !s.ok())
      return Status(StatusCode::internal, "cpu kv cache: sequence " + std::to_string(n) + ": " + s.message());
    if (Status s = forward(seq); !s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace strideattn::detail::cpu
