// make_kvcache_problem(): the validation rules of KV-cache attention (docs/semantics.md "KV
// cache" and "What is rejected"), the host-side checks of the lengths and block table that the
// host backends run before they read a cache, and the Problem that backend selection sees.
// As in validate.cpp, nothing at make time dereferences a pointer and garbage sizes give a
// message, never a crash.
#include "problem/kv_cache.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "problem/overlap.hpp"
#include "problem/validate.hpp"

namespace strideattn::detail {

namespace {

using i64 = std::int64_t;
using i128 = __int128;

constexpr i64 kMaxPageSize = 256;

Status invalid(const std::string& message) { return Status(StatusCode::invalid_argument, message); }

std::string shape_str(const Dims4& a) {
  std::string s(1, '[');
  for (std::size_t i = 0; i < 4; ++i) {
    if (i) s += ", ";
    s += std::to_string(a[i]);
  }
  s += ']';
  return s;
}

bool absent(const TensorView& v) { return v.data == nullptr && v.shape == Dims4{0, 0, 0, 0}; }

Status want_extent(const char* name, const TensorView& v, int dim, i64 want, const char* what) {
  static constexpr const char* kDims[4] = {"batch", "seq", "head", "head-dim"};
  if (v.shape[dim] == want) return Status::Ok();
  return invalid(std::string(name) + ": " + kDims[dim] + " extent " + std::to_string(v.shape[dim]) + " differs from " +
                 what + " " + std::to_string(want));
}

Status check_int32_array(const char* name, const std::int32_t* data, bool required, i64 count) {
  if (data == nullptr) {
    if (required && count > 0)
      return invalid(std::string("kv cache: ") + name + " is null; supported: an int32 array of b = " +
                     std::to_string(count) + " entries in the tensors' memory");
    return Status::Ok();
  }
  if (reinterpret_cast<std::uintptr_t>(data) % 4 != 0)
    return invalid(std::string("kv cache: ") + name + " is " +
                   std::to_string(reinterpret_cast<std::uintptr_t>(data) % 4) +
                   " bytes past a 4-byte boundary; supported: an int32 array aligned to 4 bytes");
  return Status::Ok();
}

Status check_block_table(const BlockTableView& t, i64 batch) {
  for (int i = 0; i < 2; ++i)
    if (t.shape[i] < 0)
      return invalid(std::string("block_table: ") + (i == 0 ? "batch" : "page") + " extent is " +
                     std::to_string(t.shape[i]) + "; supported: >= 0");
  if (t.shape[0] != batch)
    return invalid("block_table: batch extent " + std::to_string(t.shape[0]) + " differs from q's batch " +
                   std::to_string(batch) + "; supported: one row of page indices per sequence");
  if (reinterpret_cast<std::uintptr_t>(t.data) % 4 != 0)
    return invalid("block_table: data pointer is " + std::to_string(reinterpret_cast<std::uintptr_t>(t.data) % 4) +
                   " bytes past a 4-byte boundary; supported: an int32 matrix aligned to 4 bytes");
  i128 reach = 0, low = 0;
  if (t.shape[0] > 0 && t.shape[1] > 0)
    for (int i = 0; i < 2; ++i) {
      const i128 step = static_cast<i128>(t.shape[i] - 1) * t.stride[i];
      (step < 0 ? low : reach) += step;
    }
  const i128 base = static_cast<i128>(reinterpret_cast<std::uintptr_t>(t.data));
  if (base + reach * 4 > std::numeric_limits<i64>::max() || base + low * 4 < 0)
    return invalid("block_table: strides [" + std::to_string(t.stride[0]) + ", " + std::to_string(t.stride[1]) +
                   "] reach outside the address space; supported: a view whose entries lie at valid addresses");
  return Status::Ok();
}

// The bytes of an int32 array or matrix, as an fp32 LSE-shaped region (both are 4 bytes).
Region int32_region(const std::int32_t* data, i64 rows, i64 cols, i64 row_stride, i64 col_stride) {
  LseView v;
  v.data = const_cast<float*>(reinterpret_cast<const float*>(data));
  v.shape = {1, rows, cols};
  v.stride = {0, row_stride, col_stride};
  return region_of(v);
}

struct Named {
  const char* name;
  Region region;
  bool known;
};

Status check_overlaps(const KvCacheProblem& p) {
  const KvCacheArgs& a = p.args;
  std::vector<Named> inputs, outputs;
  auto add = [](std::vector<Named>& list, const char* name, const Region& r, const void* data) {
    list.push_back({name, r, data != nullptr});
  };
  add(inputs, "q", region_of(a.q), a.q.data);
  if (p.appends) {
    add(inputs, "k_new", region_of(a.k_new), a.k_new.data);
    add(inputs, "v_new", region_of(a.v_new), a.v_new.data);
    add(outputs, "k_cache", region_of(a.k_cache), a.k_cache.data);
    add(outputs, "v_cache", region_of(a.v_cache), a.v_cache.data);
  } else {
    add(inputs, "k_cache", region_of(a.k_cache), a.k_cache.data);
    add(inputs, "v_cache", region_of(a.v_cache), a.v_cache.data);
  }
  if (p.paged)
    add(inputs, "block_table",
        int32_region(a.block_table.data, a.block_table.shape[0], a.block_table.shape[1], a.block_table.stride[0],
                     a.block_table.stride[1]),
        a.block_table.data);
  add(inputs, "cache_seqlens", int32_region(a.cache_seqlens, 1, p.batch, 0, 1), a.cache_seqlens);
  if (a.seqlens_q) add(inputs, "seqlens_q", int32_region(a.seqlens_q, 1, p.batch, 0, 1), a.seqlens_q);
  add(outputs, "o", region_of(a.o), a.o.data);
  if (a.lse.data) add(outputs, "lse", region_of(a.lse), a.lse.data);

  for (const Named& out : outputs) {
    if (!out.known) continue;
    const OverlapResult r = self_overlap(out.region);
    if (r.overlap)
      return invalid(std::string(out.name) + (r.exact ? " overlaps itself" : " may overlap itself") +
                     ": two of its elements share an address, and it is written" +
                     (out.name[0] == 'o' || out.name[0] == 'l' ? "" : " (new tokens are appended)") +
                     "; supported: written views whose elements have distinct addresses");
  }
  auto pair = [](const Named& out, const Named& other) -> Status {
    if (!out.known || !other.known) return Status::Ok();
    const OverlapResult r = overlap_regions(out.region, other.region);
    if (!r.overlap) return Status::Ok();
    return invalid(std::string(out.name) + (r.exact ? " overlaps " : " may overlap ") + other.name +
                   " in memory; supported: written views disjoint from every other tensor");
  };
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (const Named& in : inputs)
      if (Status s = pair(outputs[i], in); !s.ok()) return s;
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (Status s = pair(outputs[i], outputs[j]); !s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace

Status make_kvcache_problem(const KvCacheArgs& args, KvCacheProblem* out) {
  KvCacheProblem p;
  p.args = args;
  const KvCacheArgs& a = p.args;
  p.appends = !absent(a.k_new) || !absent(a.v_new);
  p.paged = a.block_table.data != nullptr || a.block_table.shape != std::array<i64, 2>{0, 0};

  // Each view alone, then the dtypes.
  struct View {
    const char* name;
    const TensorView* v;
  };
  std::vector<View> views{{"q", &a.q}, {"k_cache", &a.k_cache}, {"v_cache", &a.v_cache}, {"o", &a.o}};
  if (p.appends) {
    views.push_back({"k_new", &a.k_new});
    views.push_back({"v_new", &a.v_new});
  }
  for (const View& v : views)
    if (Status s = check_tensor_view(v.name, *v.v, Pointers::bound); !s.ok()) return s;
  for (const View& v : views)
    if (v.v->dtype != a.q.dtype)
      return invalid(std::string(v.name) + ": dtype " + std::string(to_string(v.v->dtype)) + " differs from q's " +
                     std::string(to_string(a.q.dtype)) + "; supported: one dtype for every tensor (LSE is fp32)");

  p.dtype = a.q.dtype;
  p.batch = a.q.shape[kBatch];
  p.s_q = a.q.shape[kSeq];
  p.heads = a.q.shape[kHead];
  p.d_qk = a.q.shape[kHeadDim];
  p.kv_heads = a.k_cache.shape[kHead];
  p.d_v = a.v_cache.shape[kHeadDim];

  // Shapes.
  if (Status s = want_extent("k_cache", a.k_cache, kHeadDim, p.d_qk, "q's head dim"); !s.ok()) return s;
  for (int dim : {int(kBatch), int(kSeq), int(kHead)})
    if (Status s = want_extent("v_cache", a.v_cache, dim, a.k_cache.shape[dim], "k_cache's"); !s.ok()) return s;
  if (Status s = want_extent("o", a.o, kBatch, p.batch, "q's"); !s.ok()) return s;
  if (Status s = want_extent("o", a.o, kSeq, p.s_q, "q's"); !s.ok()) return s;
  if (Status s = want_extent("o", a.o, kHead, p.heads, "q's"); !s.ok()) return s;
  if (Status s = want_extent("o", a.o, kHeadDim, p.d_v, "v_cache's head dim"); !s.ok()) return s;
  if ((p.heads == 0) != (p.kv_heads == 0))
    return invalid("q has " + std::to_string(p.heads) + " heads but k_cache and v_cache have " +
                   std::to_string(p.kv_heads) + "; supported: heads % kv_heads == 0, or both 0 (an empty problem)");
  if (p.kv_heads > 0 && p.heads % p.kv_heads != 0)
    return invalid("heads " + std::to_string(p.heads) + " is not a multiple of kv_heads " + std::to_string(p.kv_heads) +
                   " (q has " + std::to_string(p.heads) + " heads, k_cache and v_cache " + std::to_string(p.kv_heads) +
                   "); supported: heads % kv_heads == 0");
  if (p.paged) {
    if (a.block_table.data == nullptr && p.batch > 0 && a.block_table.shape[1] > 0)
      return invalid("block_table: data is null but the view has shape [" + std::to_string(a.block_table.shape[0]) +
                     ", " + std::to_string(a.block_table.shape[1]) +
                     "]; supported: an int32 matrix [b, max_pages], or no block table (contiguous caches)");
    if (Status s = check_block_table(a.block_table, p.batch); !s.ok()) return s;
    p.num_pages = a.k_cache.shape[kBatch];
    p.page_size = a.k_cache.shape[kSeq];
    p.max_pages = a.block_table.shape[1];
    if (p.page_size < 1 || p.page_size > kMaxPageSize)
      return invalid("k_cache: page size (seq extent of a paged cache) is " + std::to_string(p.page_size) +
                     "; supported: 1 to " + std::to_string(kMaxPageSize) + " tokens per page");
    const i128 cap = static_cast<i128>(p.max_pages) * p.page_size;
    if (cap > std::numeric_limits<std::int32_t>::max())
      return invalid("block_table: " + std::to_string(p.max_pages) + " pages of " + std::to_string(p.page_size) +
                     " tokens exceed 2^31 - 1 tokens per sequence; supported: int32 cache lengths");
    p.capacity = static_cast<i64>(cap);
  } else {
    if (Status s = want_extent("k_cache", a.k_cache, kBatch, p.batch,
                               "q's batch (a contiguous cache holds one row per sequence; give a block_table "
                               "for a paged cache):");
        !s.ok())
      return s;
    p.capacity = a.k_cache.shape[kSeq];
  }
  if (p.appends) {
    const char* what[2] = {"k_new", "v_new"};
    const TensorView* nv[2] = {&a.k_new, &a.v_new};
    for (int i = 0; i < 2; ++i) {
      if (Status s = want_extent(what[i], *nv[i], kBatch, p.batch, "q's"); !s.ok()) return s;
      if (Status s = want_extent(what[i], *nv[i], kHead, p.kv_heads, "k_cache's"); !s.ok()) return s;
    }
    if (Status s = want_extent("k_new", a.k_new, kHeadDim, p.d_qk, "k_cache's head dim"); !s.ok()) return s;
    if (Status s = want_extent("v_new", a.v_new, kHeadDim, p.d_v, "v_cache's head dim"); !s.ok()) return s;
    if (Status s = want_extent("v_new", a.v_new, kSeq, a.k_new.shape[kSeq], "k_new's"); !s.ok()) return s;
    p.s_new = a.k_new.shape[kSeq];
    if (p.s_new > p.capacity)
      return invalid("k_new: " + std::to_string(p.s_new) + " new tokens exceed the cache's capacity of " +
                     std::to_string(p.capacity) +
                     " tokens per sequence; supported: cache_seqlens + s_new <= " + std::to_string(p.capacity));
  }
  if (Status s = check_int32_array("cache_seqlens", a.cache_seqlens, true, p.batch); !s.ok()) return s;
  if (Status s = check_int32_array("seqlens_q", a.seqlens_q, false, p.batch); !s.ok()) return s;

  // Options (and the memory kind), with the default scale.
  p.scale = a.options.scale.value_or(p.d_qk > 0 ? 1.0 / std::sqrt(double(p.d_qk)) : 1.0);
  p.args.options.scale = p.scale;
  {
    Problem opt;
    opt.memory = a.memory;
    opt.mask = a.options.mask;
    opt.window = a.options.window;
    opt.scale = p.scale;
    if (Status s = check_problem_options(opt); !s.ok()) return s;
  }

  if (a.lse.data != nullptr) {
    if (Status s = check_lse_view(a.lse, Pointers::bound); !s.ok()) return s;
    const std::array<i64, 3> want{p.batch, p.heads, p.s_q};
    if (a.lse.shape != want)
      return invalid("lse: shape [" + std::to_string(a.lse.shape[0]) + ", " + std::to_string(a.lse.shape[1]) + ", " +
                     std::to_string(a.lse.shape[2]) + "] differs from [b, h, s_q] = [" + std::to_string(want[0]) +
                     ", " + std::to_string(want[1]) + ", " + std::to_string(want[2]) + "]");
  }
  if (Status s = check_overlaps(p); !s.ok()) return s;
  *out = std::move(p);
  return Status::Ok();
}

Status check_kvcache_lengths(const KvCacheProblem& p, KvCacheLengths* out) {
  const KvCacheArgs& a = p.args;
  KvCacheLengths l;
  l.cache.resize(std::size_t(p.batch));
  l.q.resize(std::size_t(p.batch));
  for (i64 n = 0; n < p.batch; ++n) {
    const i64 c = a.cache_seqlens[n];
    if (c < 0 || c + p.s_new > p.capacity)
      return invalid("kv cache: cache_seqlens[" + std::to_string(n) + "] is " + std::to_string(c) +
                     (p.appends ? " with " + std::to_string(p.s_new) + " new tokens" : std::string()) +
                     "; supported: 0 <= cache_seqlens" + (p.appends ? " and cache_seqlens + s_new" : "") +
                     " <= the cache's capacity of " + std::to_string(p.capacity) + " tokens per sequence");
    l.cache[std::size_t(n)] = c;
    const i64 q = a.seqlens_q ? a.seqlens_q[n] : p.s_q;
    if (q < 0 || q > p.s_q)
      return invalid("kv cache: seqlens_q[" + std::to_string(n) + "] is " + std::to_string(q) +
                     "; supported: 0 to q's " + std::to_string(p.s_q) + " rows");
    l.q[std::size_t(n)] = q;
  }
  if (p.paged) {
    const BlockTableView& t = a.block_table;
    std::vector<i64> written;  // absolute slots (page * page_size + pos) appended to
    for (i64 n = 0; n < p.batch; ++n) {
      const i64 len = l.attended(n, p.s_new);
      const i64 pages = (len + p.page_size - 1) / p.page_size;
      for (i64 j = 0; j < pages; ++j) {
        const i64 e = t.data[n * t.stride[0] + j * t.stride[1]];
        if (e < 0 || e >= p.num_pages)
          return invalid("kv cache: block_table[" + std::to_string(n) + ", " + std::to_string(j) + "] is " +
                         std::to_string(e) + " (sequence " + std::to_string(n) + " holds " + std::to_string(len) +
                         " tokens, pages 0.." + std::to_string(pages - 1) + "); supported: a page index 0 to " +
                         std::to_string(p.num_pages - 1) + " of the cache's " + std::to_string(p.num_pages) + " pages");
      }
      for (i64 tok = l.cache[std::size_t(n)]; tok < len; ++tok)
        written.push_back(i64(t.data[n * t.stride[0] + (tok / p.page_size) * t.stride[1]]) * p.page_size +
                          tok % p.page_size);
    }
    std::sort(written.begin(), written.end());
    const auto dup = std::adjacent_find(written.begin(), written.end());
    if (dup != written.end())
      return invalid("kv cache: two sequences append to slot " + std::to_string(*dup % p.page_size) + " of page " +
                     std::to_string(*dup / p.page_size) +
                     "; supported: appended tokens land in distinct cache slots (pages shared between sequences "
                     "are read-only)");
  }
  *out = std::move(l);
  return Status::Ok();
}

Problem selection_problem(const KvCacheProblem& p) {
  Problem s;
  s.direction = Direction::forward;
  s.dtype = p.dtype;
  s.memory = p.args.memory;
  s.batch = p.batch;
  s.s_q = p.s_q;
  s.s_kv = p.capacity;
  s.heads = p.heads;
  s.kv_heads = p.kv_heads;
  s.d_qk = p.d_qk;
  s.d_v = p.d_v;
  s.mask = p.args.options.mask;
  s.window = p.args.options.window;
  s.scale = p.scale;
  s.cancel = p.args.options.cancel;
  s.lse_out = p.args.lse.data != nullptr;
  s.q = p.args.q;
  s.k = p.args.k_cache;
  s.v = p.args.v_cache;
  s.o = p.args.o;
  s.lse = p.args.lse;
  s.stream = p.args.stream;
  s.workspace = p.args.workspace;
  s.workspace_bytes = p.args.workspace_bytes;
  s.kv_cache = &p;
  return s;
}

std::string describe_kvcache(const KvCacheProblem& p) {
  std::string s =
      p.paged ? "paged cache: " + std::to_string(p.num_pages) + " pages of " + std::to_string(p.page_size) +
                    " tokens, block table [" + std::to_string(p.batch) + ", " + std::to_string(p.max_pages) + "]"
              : "contiguous cache: " + std::to_string(p.batch) + " x " + std::to_string(p.capacity) + " tokens";
  s += ", k_cache " + shape_str(p.args.k_cache.shape) + " strides " + shape_str(p.args.k_cache.stride);
  s += ", q " + shape_str(p.args.q.shape);
  s += p.appends ? ", appends " + std::to_string(p.s_new) + " tokens per sequence" : ", no append";
  if (p.args.seqlens_q) s += ", seqlens_q given";
  return s;
}

}  // namespace strideattn::detail
