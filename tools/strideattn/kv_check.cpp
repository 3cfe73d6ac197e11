// KV-cache commands of the CLI (kv_check.hpp). A case is its sizes, the cache layout (paged with
// a page size, or contiguous; default layouts or explicit --k-cache / --v-cache views
// BUF+OFFSET:SHAPE:STRIDES over named buffers), a block table (shuffled, identity, transposed,
// shared prefix, or explicit rows), lengths and options. Each backend gets the same fresh inputs
// (poisoned outputs); O and LSE are judged by the correctness rule (exact and naive from the
// reference's KV-cache computation), the caches after the call against the reference's.
#include "kv_check.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>

#include "backends/reference/reference_kvcache.hpp"
#include "cli_args.hpp"
#include "cli_json.hpp"
#include "common/dtype.hpp"
#include "harness/compare.hpp"
#include "harness/device_mirror.hpp"
#include "harness/runner.hpp"
#include "problem/kv_cache.hpp"

namespace strideattn::cli {
namespace {

using i64 = std::int64_t;

struct KvCliCase {
  DType dtype = DType::f16;
  i64 s_q = 1, heads = 8, kv_heads = 2, d = 64, dv = 64, s_new = 0;
  std::vector<i64> cache_seqlens, seqlens_q;
  i64 page_size = 0;  // 0: contiguous
  i64 max_pages = 0, num_pages = 0, capacity = 0;
  std::string table = "shuffled";  // shuffled | identity | transposed | shared | explicit rows
  AttentionOptions options{};
  std::uint64_t seed = 1;
  bool k_view_given = false, v_view_given = false;
  harness::ViewSpec k_view, v_view;
  i64 pad = 0;  // default views: extra elements per head row
  [[nodiscard]] i64 batch() const { return i64(cache_seqlens.size()); }
};

Status bad(const std::string& m) { return Status(StatusCode::invalid_argument, m); }

Status parse_list(const std::string& opt, const std::string& text, std::vector<i64>* out) {
  out->clear();
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      out->push_back(std::stoll(item, &used));
      if (used != item.size()) throw 0;
    } catch (...) {
      return bad("--" + opt + " '" + text + "': expected integers separated by commas");
    }
  }
  if (out->empty()) return bad("--" + opt + " '" + text + "': expected integers separated by commas");
  return Status::Ok();
}

Status parse_int(const std::string& opt, const std::string& text, i64* out) {
  std::vector<i64> v;
  if (Status s = parse_list(opt, text, &v); !s.ok() || v.size() != 1)
    return bad("--" + opt + " '" + text + "': expected an integer");
  *out = v[0];
  return Status::Ok();
}

// What O and LSE hold before a run: exact in every dtype, and far from any attention output.
constexpr float kPoison = 12288.f;

// Everything a run needs, allocated for one backend: named byte buffers and the views into them.
struct Buffers {
  std::map<std::string, std::vector<unsigned char>> named;
  std::vector<unsigned char> q, kn, vn, o;
  std::vector<float> lse;
  std::vector<std::int32_t> table, lens, qlens;
  TensorView k_cache, v_cache;
  i64 table_stride[2] = {0, 0};
};

// The default cache view: [rows, slots, hg, dd] with `pad` extra elements per head row.
harness::ViewSpec default_cache_view(const KvCliCase& c, const char* buffer, i64 dd) {
  const i64 rows = c.page_size ? c.num_pages : c.batch(), slots = c.page_size ? c.page_size : c.capacity;
  const i64 row = dd + c.pad;
  return {buffer, 0, {rows, slots, c.kv_heads, dd}, {slots * c.kv_heads * row, c.kv_heads * row, row, 1}};
}

Status build(const KvCliCase& c, Buffers* b, KvCacheArgs* a) {
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  const i64 es = i64(size_of(c.dtype)), n = c.batch();
  auto fill = [&](std::vector<unsigned char>& x, i64 count) {
    x.assign(std::size_t(count * es), 0);
    for (i64 i = 0; i < count; ++i) detail::store_from_float(x.data(), c.dtype, i, dist(rng));
  };
  const harness::ViewSpec kv = c.k_view_given ? c.k_view : default_cache_view(c, "k_cache", c.d);
  const harness::ViewSpec vv = c.v_view_given ? c.v_view : default_cache_view(c, "v_cache", c.dv);
  std::map<std::string, i64> need;
  for (const harness::ViewSpec* v : {&kv, &vv}) {
    i64 hi = v->offset, lo = v->offset;
    bool empty = false;
    for (int i = 0; i < 4; ++i) {
      empty = empty || v->shape[i] == 0;
      if (v->shape[i] > 1) (v->stride[i] < 0 ? lo : hi) += (v->shape[i] - 1) * v->stride[i];
    }
    if (!empty && lo < 0)
      return bad("--k-cache/--v-cache: view of buffer '" + v->buffer + "' reaches element " + std::to_string(lo) +
                 " before the buffer; give an offset that keeps every element inside it");
    if (hi > (i64(1) << 32)) return bad("--k-cache/--v-cache: buffer '" + v->buffer + "' would need > 2^32 elements");
    need[v->buffer] = std::max(need[v->buffer], empty ? 0 : hi + 1);
  }
  for (const auto& [name, count] : need) fill(b->named[name], count);
  fill(b->q, n * c.s_q * c.heads * c.d);
  fill(b->kn, n * c.s_new * c.kv_heads * c.d);
  fill(b->vn, n * c.s_new * c.kv_heads * c.dv);
  b->o.assign(std::size_t(n * c.s_q * c.heads * c.dv * es), 0);
  for (i64 i = 0; i < n * c.s_q * c.heads * c.dv; ++i) detail::store_from_float(b->o.data(), c.dtype, i, kPoison);
  b->lse.assign(std::size_t(n * c.heads * c.s_q), kPoison);
  for (i64 x : c.cache_seqlens) b->lens.push_back(std::int32_t(x));
  for (i64 x : c.seqlens_q) b->qlens.push_back(std::int32_t(x));
  auto view = [&](const harness::ViewSpec& v) {
    return TensorView{b->named[v.buffer].data() + v.offset * es, c.dtype, v.shape, v.stride};
  };
  b->k_cache = view(kv);
  b->v_cache = view(vv);
  if (c.page_size) {
    const i64 pages = c.max_pages, rows = b->k_cache.shape[kBatch];
    b->table.assign(std::size_t(n * pages), -1);
    const bool transposed = c.table == "transposed";
    b->table_stride[0] = transposed ? 1 : pages;
    b->table_stride[1] = transposed ? n : 1;
    auto at = [&](i64 s, i64 j) -> std::int32_t& {
      return b->table[std::size_t(s * b->table_stride[0] + j * b->table_stride[1])];
    };
    if (c.table != "shuffled" && c.table != "identity" && c.table != "transposed" && c.table != "shared") {
      std::stringstream rows_text(c.table);  // explicit: rows separated by ';'
      std::string row;
      i64 s = 0;
      while (std::getline(rows_text, row, ';')) {
        std::vector<i64> entries;
        if (Status st = parse_list("block-table", row, &entries); !st.ok()) return st;
        if (s >= n || i64(entries.size()) > pages)
          return bad("--block-table '" + c.table + "': expected " + std::to_string(n) + " rows of at most " +
                     std::to_string(pages) + " page indices (one row per sequence, rows separated by ';')");
        for (std::size_t j = 0; j < entries.size(); ++j) at(s, i64(j)) = std::int32_t(entries[j]);
        ++s;
      }
    } else {
      std::vector<std::int32_t> order(static_cast<std::size_t>(rows));
      std::iota(order.begin(), order.end(), 0);
      if (c.table != "identity") std::shuffle(order.begin(), order.end(), rng);
      std::size_t next = 0;
      for (i64 s = 0; s < n; ++s) {
        const i64 used = (c.cache_seqlens[std::size_t(s)] + c.s_new + c.page_size - 1) / c.page_size;
        for (i64 j = 0; j < used && next < order.size(); ++j) at(s, j) = order[next++];
      }
      // shared: sequence 1 reads sequence 0's first page when both fill it and append past it
      if (c.table == "shared" && n > 1 && c.cache_seqlens[0] >= c.page_size && c.cache_seqlens[1] >= c.page_size)
        at(1, 0) = at(0, 0);
    }
    a->block_table = {b->table.data(), {n, pages}, {b->table_stride[0], b->table_stride[1]}};
  }
  a->q = {b->q.data(), c.dtype, {n, c.s_q, c.heads, c.d}, {c.s_q * c.heads * c.d, c.heads * c.d, c.d, 1}};
  a->k_cache = b->k_cache;
  a->v_cache = b->v_cache;
  if (c.s_new > 0) {
    a->k_new = {
        b->kn.data(), c.dtype, {n, c.s_new, c.kv_heads, c.d}, {c.s_new * c.kv_heads * c.d, c.kv_heads * c.d, c.d, 1}};
    a->v_new = {b->vn.data(),
                c.dtype,
                {n, c.s_new, c.kv_heads, c.dv},
                {c.s_new * c.kv_heads * c.dv, c.kv_heads * c.dv, c.dv, 1}};
  }
  a->cache_seqlens = b->lens.data();
  a->seqlens_q = b->qlens.empty() ? nullptr : b->qlens.data();
  a->o = {b->o.data(), c.dtype, {n, c.s_q, c.heads, c.dv}, {c.s_q * c.heads * c.dv, c.heads * c.dv, c.dv, 1}};
  a->lse = {b->lse.data(), {n, c.heads, c.s_q}, {c.heads * c.s_q, c.s_q, 1}};
  a->options = c.options;
  return Status::Ok();
}

// Device copies of a case's buffers for a GPU backend: every host buffer the views point into
// is copied (the caches whole, so bytes outside the appended slots can be compared), the
// arguments are rebased onto the copies, and after the run O, LSE and the caches come back.
class KvDeviceCopy {
 public:
  KvDeviceCopy() = default;
  KvDeviceCopy(const KvDeviceCopy&) = delete;
  KvDeviceCopy& operator=(const KvDeviceCopy&) = delete;
#ifdef STRIDEATTN_HARNESS_CUDA
  ~KvDeviceCopy() {
    for (auto& [host, d] : copies_) (void)cudaFree(d.dev);
  }
  Status upload(Buffers& b, KvCacheArgs* a) {
    for (auto& [name, bytes] : b.named)
      if (Status s = add(bytes.data(), bytes.size()); !s.ok()) return s;
    for (std::vector<unsigned char>* v : {&b.q, &b.kn, &b.vn, &b.o})
      if (Status s = add(v->data(), v->size()); !s.ok()) return s;
    if (Status s = add(b.lse.data(), b.lse.size() * 4); !s.ok()) return s;
    for (std::vector<std::int32_t>* v : {&b.table, &b.lens, &b.qlens})
      if (Status s = add(v->data(), v->size() * 4); !s.ok()) return s;
    a->q.data = at(a->q.data);
    a->k_cache.data = at(a->k_cache.data);
    a->v_cache.data = at(a->v_cache.data);
    a->k_new.data = at(a->k_new.data);
    a->v_new.data = at(a->v_new.data);
    a->o.data = at(a->o.data);
    a->lse.data = at(a->lse.data);
    a->block_table.data = at(a->block_table.data);
    a->cache_seqlens = at(a->cache_seqlens);
    a->seqlens_q = at(a->seqlens_q);
    a->memory = Memory::device;
    return Status::Ok();
  }
  // Waits for the device, then copies the written buffers back.
  Status download(Buffers& b) {
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
      return Status(StatusCode::backend_error, harness::internal::cuda_msg("running the case", e));
    for (auto& [name, bytes] : b.named)
      if (Status s = back(bytes.data()); !s.ok()) return s;
    if (Status s = back(b.o.data()); !s.ok()) return s;
    return back(b.lse.data());
  }

 private:
  struct Copy {
    void* dev;
    std::size_t bytes;
  };
  std::map<const void*, Copy> copies_;
  Status add(const void* host, std::size_t bytes) {
    if (bytes == 0 || copies_.count(host)) return Status::Ok();
    void* dev = nullptr;
    if (cudaError_t e = cudaMalloc(&dev, bytes); e != cudaSuccess)
      return Status(StatusCode::backend_error, harness::internal::cuda_msg("allocating a device buffer", e));
    copies_[host] = {dev, bytes};
    if (cudaError_t e = cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice); e != cudaSuccess)
      return Status(StatusCode::backend_error, harness::internal::cuda_msg("copying a buffer to the device", e));
    return Status::Ok();
  }
  Status back(void* host) {
    const auto it = copies_.find(host);
    if (it == copies_.end()) return Status::Ok();
    if (cudaError_t e = cudaMemcpy(host, it->second.dev, it->second.bytes, cudaMemcpyDeviceToHost); e != cudaSuccess)
      return Status(StatusCode::backend_error, harness::internal::cuda_msg("copying a buffer back", e));
    return Status::Ok();
  }
  // The device address of a host pointer inside one of the copies (null stays null).
  template <class P>
  P* at(P* host) const {
    if (host == nullptr) return nullptr;
    const auto* h = reinterpret_cast<const unsigned char*>(host);
    for (const auto& [base, c] : copies_) {
      const auto* lo = static_cast<const unsigned char*>(base);
      if (h >= lo && h < lo + c.bytes) return reinterpret_cast<P*>(static_cast<unsigned char*>(c.dev) + (h - lo));
    }
    return host;
  }
#else
  Status upload(Buffers&, KvCacheArgs*) {
    return Status(StatusCode::unsupported, "this build has no CUDA: GPU backends cannot run");
  }
  Status download(Buffers&) { return Status::Ok(); }
#endif
};

// One backend's run of a case: what the text line and the --json entry are made of.
struct BackendRow {
  Backend backend = Backend::reference;
  std::optional<Backend> chosen;  // what `auto` ran
  std::string status;             // ok | mismatch | unsupported | error | invalid
  std::string reason;             // the library's message where it did not run
  bool ran = false;
  harness::TensorCheck o, lse;
  bool written_ok = false;  // every element of O and LSE was written (none holds the poison)
  bool caches_ok = false;   // the caches equal the reference backend's after its run
  double time_ms = 0;
};

struct Outcome {
  int exit = 0;  // 0 agree (or skipped), 1 disagree / failed, 2 invalid
  std::string text;
  std::string layout;
  std::vector<BackendRow> rows;
};

// FLOPs of the case as run: each sequence's query rows against its attended keys.
double case_flops(const KvCliCase& c) {
  double f = 0;
  for (i64 n = 0; n < c.batch(); ++n) {
    const double rows = c.seqlens_q.empty() ? double(c.s_q) : double(c.seqlens_q[std::size_t(n)]);
    f += 2.0 * rows * double(c.cache_seqlens[std::size_t(n)] + c.s_new) * double(c.heads) * double(c.d + c.dv);
  }
  return f;
}

// One case on every backend. `quiet`: only failures are described.
Outcome run_case(const KvCliCase& c, const std::vector<Backend>& backends, bool quiet) {
  Outcome out;
  Buffers ref_b;
  KvCacheArgs ref_a;
  if (Status s = build(c, &ref_b, &ref_a); !s.ok()) return {2, s.message(), "", {}};
  detail::KvCacheProblem p;
  if (Status s = detail::make_kvcache_problem(ref_a, &p); !s.ok()) return {2, s.message(), "", {}};
  detail::ReferenceOutputs exact, naive;
  if (Status s = detail::reference_kvcache_compute(p, detail::RefPrecision::exact, &exact); !s.ok())
    return {s.code() == StatusCode::invalid_argument ? 2 : 1, s.message(), "", {}};
  if (Status s = detail::reference_kvcache_compute(p, detail::RefPrecision::naive_lowp, &naive); !s.ok())
    return {1, s.message(), "", {}};
  // The caches the append must leave: the reference backend's run on its own copy.
  ref_a.backend = Backend::reference;
  if (Status s = forward_with_kvcache(ref_a); !s.ok()) return {1, "reference: " + s.message(), "", {}};
  out.layout = detail::describe_kvcache(p);
  out.text = quiet ? "" : "layout:  " + out.layout + "\n";
  for (Backend backend : backends) {
    Buffers b;
    KvCacheArgs a;
    (void)build(c, &b, &a);
    a.backend = backend;
    BackendRow row;
    row.backend = backend;
    std::string line = std::string(to_string(backend)) + ": ";
    // GPU backends (and `auto` with a GPU present) run on device copies of the buffers.
    KvDeviceCopy device;
    const bool on_device = harness::internal::on_device(backend);
    if (on_device) {
      const std::string why = harness::internal::unavailable_reason(backend);
      Status up = why.empty() ? device.upload(b, &a) : Status(StatusCode::unsupported, why);
      if (!up.ok()) {
        row.status = up.code() == StatusCode::unsupported ? "unsupported" : "error";
        row.reason = up.message();
        if (up.code() != StatusCode::unsupported) out.exit = std::max(out.exit, 1);
        if (!quiet || up.code() != StatusCode::unsupported) out.text += line + row.reason + "\n";
        out.rows.push_back(std::move(row));
        continue;
      }
    }
    if (backend == Backend::automatic) row.chosen = explain(a).chosen;
    const auto t0 = std::chrono::steady_clock::now();
    Status s = forward_with_kvcache(a);
    if (s.ok() && on_device) s = device.download(b);
    row.time_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s.code() == StatusCode::unsupported) {
      row.status = "unsupported";
      row.reason = s.message();
      if (!quiet) out.text += line + "skipped: " + s.message() + "\n";
      out.rows.push_back(std::move(row));
      continue;
    }
    if (!s.ok()) {
      const bool invalid = s.code() == StatusCode::invalid_argument;
      row.status = invalid ? "invalid" : "error";
      row.reason = std::string(to_string(s.code())) + ": " + s.message();
      out.exit = std::max(out.exit, invalid ? 2 : 1);
      out.text += line + row.reason + "\n";
      out.rows.push_back(std::move(row));
      continue;
    }
    std::vector<double> o(exact.o.size()), lse(exact.lse.size());
    row.written_ok = true;
    for (std::size_t i = 0; i < o.size(); ++i) {
      o[i] = detail::load_as_float(b.o.data(), c.dtype, i64(i));
      row.written_ok = row.written_ok && o[i] != double(kPoison);
    }
    for (std::size_t i = 0; i < lse.size(); ++i) {
      lse[i] = b.lse[i];
      row.written_ok = row.written_ok && b.lse[i] != kPoison;
    }
    row.ran = true;
    row.o = harness::check_tensor("o", c.dtype, o, naive.o, exact.o);
    row.lse = harness::check_tensor("lse", DType::f32, lse, naive.lse, exact.lse);
    row.caches_ok = b.named == ref_b.named;
    const bool pass = row.o.pass() && row.lse.pass() && row.caches_ok;
    row.status = pass ? "ok" : "mismatch";
    if (!pass)
      row.reason = !row.caches_ok ? "the caches differ from the reference's after the call"
                                  : "O or LSE exceeds its tolerance against the fp64 reference";
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s  o err %.3g (tol %.3g)  lse err %.3g (tol %.3g)  caches %s",
                  pass ? "agree" : "MISMATCH", row.o.err.max_abs_err, row.o.tol, row.lse.err.max_abs_err, row.lse.tol,
                  row.caches_ok ? "match the reference's" : "DIFFER from the reference's");
    if (!pass) out.exit = std::max(out.exit, 1);
    if (!quiet || !pass) out.text += line + buf + "\n";
    out.rows.push_back(std::move(row));
  }
  return out;
}

// A random case for the fuzzer: paged (page sizes 1 .. 256, not only powers of two) or
// contiguous, lengths 0 .. capacity with appends that cross pages, decode (s_q 1 .. 24) to
// chunked prefill (s_q 64 .. 160: the dense forward on `cuda`).
KvCliCase random_case(std::uint64_t seed, bool paged_only) {
  std::mt19937_64 rng(seed);
  auto pick = [&](i64 lo, i64 hi) { return std::uniform_int_distribution<i64>(lo, hi)(rng); };
  KvCliCase c;
  c.seed = seed;
  const DType dts[3] = {DType::f16, DType::bf16, DType::f32};
  c.dtype = dts[pick(0, 2)];
  c.kv_heads = pick(1, 3);
  c.heads = c.kv_heads * pick(1, 4);
  const i64 dims[6] = {8, 16, 24, 40, 64, 128};
  c.d = dims[pick(0, 5)];
  c.dv = pick(0, 3) == 0 ? dims[pick(0, 5)] : c.d;
  c.s_q = pick(0, 2) == 0 ? pick(1, 24) : 1;
  c.s_new = pick(0, 2) == 0 ? 0 : pick(1, 4);
  const i64 b = pick(1, 4);
  const i64 pages[10] = {1, 2, 3, 5, 7, 16, 31, 64, 100, 256};
  c.page_size = pick(0, 4) == 0 && !paged_only ? 0 : pages[pick(0, 9)];
  const i64 cap_target = pick(c.s_new, c.s_new + 300);
  if (c.page_size) {
    c.max_pages = std::max<i64>(1, (cap_target + c.page_size - 1) / c.page_size);
    c.num_pages = b * c.max_pages + pick(0, 3);
    c.capacity = c.max_pages * c.page_size;
    const char* tables[4] = {"shuffled", "identity", "transposed", "shared"};
    c.table = tables[pick(0, 3)];
  } else {
    c.capacity = std::max<i64>(cap_target, c.s_new);
  }
  for (i64 n = 0; n < b; ++n) {
    const i64 r = pick(0, 5);
    c.cache_seqlens.push_back(r == 0 ? 0 : r == 1 ? c.capacity - c.s_new : pick(0, c.capacity - c.s_new));
  }
  if (pick(0, 2) == 0)
    for (i64 n = 0; n < b; ++n) c.seqlens_q.push_back(pick(0, c.s_q));
  c.pad = pick(0, 2) == 0 ? pick(1, 5) : 0;
  const MaskKind masks[3] = {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right};
  c.options.mask = pick(0, 3) == 0 ? masks[pick(0, 2)] : MaskKind::causal_bottom_right;
  if (pick(0, 3) == 0) c.options.window = {pick(-1, 40), pick(0, 2) ? 0 : pick(-1, 8)};
  // chunked prefill: a quarter of the cases get 64..160 query rows, which `cuda` runs through
  // the dense forward (drawn last, so the earlier draws of a seed are what they were)
  if (pick(0, 3) == 0) {
    c.s_q = pick(64, 160);
    for (i64& x : c.seqlens_q) x = pick(0, c.s_q);
  }
  return c;
}

const std::vector<std::string> kCheckOptions = {
    "cache-seqlens", "page-size", "max-pages", "num-pages", "cache-capacity", "block-table", "k-cache",    "v-cache",
    "new-tokens",    "seqlens-q", "seqlen-q",  "heads",     "kv-heads",       "head-dim",    "head-dim-v", "dtype",
    "mask",          "window",    "scale",     "seed",      "backends",       "pad"};

// The problem under --json: the keys of the attention commands' "problem" (seqlen_kv is the
// cache's capacity per sequence, what backend selection sees) and a "kv_cache" object.
json problem_json(const KvCliCase& c) {
  const i64 capacity = c.page_size ? c.max_pages * c.page_size : c.capacity;
  json p = {{"dtype", std::string(to_string(c.dtype))},
            {"batch", c.batch()},
            {"seqlen_q", c.s_q},
            {"seqlen_kv", capacity},
            {"heads", c.heads},
            {"kv_heads", c.kv_heads},
            {"head_dim", c.d},
            {"head_dim_v", c.dv},
            {"mask", std::string(to_string(c.options.mask))},
            {"window", {c.options.window.left, c.options.window.right}},
            {"scale", c.options.scale ? json(*c.options.scale) : json(nullptr)},
            {"deterministic", false},
            {"grad", false},
            {"seed", c.seed},
            {"layout_name", ""},
            {"features", nullptr}};  // (KV-cache attention takes no training features)
  p["kv_cache"] = {{"cache_seqlens", c.cache_seqlens},
                   {"seqlens_q", c.seqlens_q.empty() ? json(nullptr) : json(c.seqlens_q)},
                   {"new_tokens", c.s_new},
                   {"paged", c.page_size > 0},
                   {"page_size", c.page_size ? json(c.page_size) : json(nullptr)},
                   {"max_pages", c.page_size ? json(c.max_pages) : json(nullptr)},
                   {"num_pages", c.page_size ? json(c.num_pages) : json(nullptr)},
                   {"capacity", capacity},
                   {"block_table", c.page_size ? json(c.table) : json(nullptr)}};
  p["views"] = {{"k_cache", format_view(c.k_view_given ? c.k_view : default_cache_view(c, "k_cache", c.d))},
                {"v_cache", format_view(c.v_view_given ? c.v_view : default_cache_view(c, "v_cache", c.dv))}};
  return p;
}

json row_json(const BackendRow& r, double flops) {
  json j = {{"backend", std::string(to_string(r.backend))},
            {"chosen", r.chosen ? json(std::string(to_string(*r.chosen))) : json(nullptr)},
            {"status", r.status},
            {"reason", r.reason},
            {"max_abs_err", num_or_null(r.o.err.max_abs_err, r.ran)},
            {"max_rel_err", num_or_null(r.o.err.max_rel_err, r.ran)},
            {"tolerance", num_or_null(r.o.tol, r.ran)},
            {"time_ms", num_or_null(r.time_ms, r.ran)},
            {"tflops", num_or_null(r.time_ms > 0 ? flops / (r.time_ms * 1e9) : 0, r.ran)},
            {"written_ok", r.written_ok},
            {"guard_ok", r.caches_ok},  // the caches are the only memory a call may write besides O/LSE
            {"caches_ok", r.caches_ok}};
  if (r.ran) j["lse"] = check_json(r.lse);
  return j;
}

// The command line that repeats this one (without --json), with the seed it used.
std::string reproducer(const std::vector<std::string>& args, bool seed_given, i64 seed) {
  std::string again = "strideattn";
  for (const std::string& a : args) {
    if (a == "--json") continue;
    again += " " + (a.find_first_of("; ") == std::string::npos ? a : "'" + a + "'");
  }
  if (!seed_given) again += " --seed " + std::to_string(seed);
  return again;
}

}  // namespace

bool is_kvcache_command(const std::vector<std::string>& args) {
  if (args.empty()) return false;
  const bool fuzz = args[0] == "fuzz", check = args[0] == "check" || args[0] == "explain";
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string a = args[i].substr(0, args[i].find('='));
    if (fuzz && a == "--kv-cache") return true;
    if (check &&
        (a == "--cache-seqlens" || a == "--page-size" || a == "--k-cache" || a == "--v-cache" || a == "--block-table"))
      return true;
  }
  return false;
}

int run_kvcache_cli(const std::vector<std::string>& args) {
  const bool fuzz = args[0] == "fuzz", explain_only = args[0] == "explain";
  // --json (check and explain): the report, and every error, as one JSON object on stdout.
  const bool as_json = !fuzz && std::find(args.begin() + 1, args.end(), "--json") != args.end();
  auto fail = [as_json](int code, const std::string& m) {
    std::string line = m;
    while (!line.empty() && line.back() == '\n') line.pop_back();
    for (char& ch : line)
      if (ch == '\n') ch = ' ';
    std::fprintf(stderr, "strideattn: error: %s\n", line.c_str());
    if (as_json) print_error_json(code == 2 ? StatusCode::invalid_argument : StatusCode::internal, line, code);
    std::fflush(stdout);
    return code;
  };
  std::map<std::string, std::string> v;
  for (std::size_t i = 1; i < args.size(); ++i) {
    std::string name = args[i];
    if (name.rfind("--", 0) != 0) return fail(2, "unexpected argument '" + name + "'; options start with --");
    name = name.substr(2);
    std::string value;
    const std::size_t eq = name.find('=');
    if (eq != std::string::npos) value = name.substr(eq + 1), name = name.substr(0, eq);
    if (fuzz && name == "kv-cache" && eq == std::string::npos) continue;
    if (!fuzz && name == "json" && eq == std::string::npos) continue;
    // fuzz flags: --paged (every case paged), --require-gpu (exit 77 without a GPU),
    // --require-ran (fail when a backend ran no case)
    if (fuzz && (name == "paged" || name == "require-gpu" || name == "require-ran") && eq == std::string::npos) {
      v[name] = "1";
      continue;
    }
    const bool known = fuzz ? (name == "cases" || name == "seed" || name == "backends" || name == "min-ran")
                            : std::find(kCheckOptions.begin(), kCheckOptions.end(), name) != kCheckOptions.end();
    if (!known)
      return fail(2,
                  "unknown option --" + name + " for a KV-cache " + args[0] +
                      (fuzz ? " (takes --cases, --seed, --backends, --min-ran, --paged, --require-gpu, --require-ran)"
                            : " (see the KVCACHE options of `strideattn help`)"));
    if (eq == std::string::npos) {
      if (i + 1 >= args.size()) return fail(2, "option --" + name + " needs a value");
      value = args[++i];
    }
    if (v.count(name)) return fail(2, "option --" + name + " given twice");
    v[name] = value;
  }
  std::vector<Backend> backends = {Backend::reference, Backend::cpu};
  if (v.count("backends")) {
    backends.clear();
    std::stringstream ss(v["backends"]);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const auto b = backend_from_string(item);
      if (!b) return fail(2, "--backends '" + v["backends"] + "': '" + item + "' is not a backend");
      backends.push_back(*b);
    }
  }
  i64 seed = 1;
  if (v.count("seed"))
    if (Status s = parse_int("seed", v["seed"], &seed); !s.ok() || seed < 0) return fail(2, "--seed: expected >= 0");

  if (fuzz) {
    i64 cases = 200;
    if (v.count("cases"))
      if (Status s = parse_int("cases", v["cases"], &cases); !s.ok() || cases < 0)
        return fail(2, "--cases: expected >= 0");
    i64 min_ran = 0;
    if (v.count("min-ran"))
      if (Status s = parse_int("min-ran", v["min-ran"], &min_ran); !s.ok() || min_ran < 0)
        return fail(2, "--min-ran: expected >= 0");
    if (v.count("require-gpu") && !harness::gpu_available()) {
      std::printf("skipped: no usable CUDA GPU in this process (--require-gpu)\n");
      return 77;
    }
    // --min-ran N: draw cases past --cases until every backend ran N of them (at most 10x as
    // many cases as asked), so refusals (f32 on a GPU backend, say) do not thin the run.
    std::vector<i64> ran(backends.size(), 0);
    auto least_ran = [&] { return ran.empty() ? i64(0) : *std::min_element(ran.begin(), ran.end()); };
    const i64 limit = std::max(cases, min_ran) * 10;
    i64 mismatches = 0, drawn = 0;
    for (i64 i = 0; i < cases || (least_ran() < min_ran && i < limit); ++i, ++drawn) {
      const std::uint64_t case_seed = std::uint64_t(seed) * 1000003u + std::uint64_t(i);
      const Outcome r = run_case(random_case(case_seed, v.count("paged") > 0), backends, true);
      for (std::size_t k = 0; k < r.rows.size() && k < ran.size(); ++k) ran[k] += r.rows[k].ran ? 1 : 0;
      if (r.exit != 0) {
        ++mismatches;
        std::printf("case %lld (case seed %llu; rerun with --cases %lld --seed %lld%s):\n%s", static_cast<long long>(i),
                    static_cast<unsigned long long>(case_seed), static_cast<long long>(i + 1),
                    static_cast<long long>(seed), v.count("paged") ? " --paged" : "", r.text.c_str());
      }
    }
    std::string counts;
    bool idle = false;
    for (std::size_t k = 0; k < backends.size(); ++k) {
      counts += std::string(k ? ", " : "; ") + std::string(to_string(backends[k])) + " ran " + std::to_string(ran[k]);
      idle = idle || ran[k] == 0 || ran[k] < min_ran;
    }
    std::printf("fuzz kv cache: %lld cases, %lld mismatches%s\n", static_cast<long long>(drawn),
                static_cast<long long>(mismatches), counts.c_str());
    if (v.count("require-ran") && idle && drawn > 0) {
      std::printf("strideattn: a backend ran fewer cases than required (--require-ran, --min-ran %lld)\n",
                  static_cast<long long>(min_ran));
      return 1;
    }
    return mismatches ? 1 : 0;
  }

  KvCliCase c;
  c.seed = std::uint64_t(seed);
  if (!v.count("cache-seqlens")) return fail(2, "a KV-cache check needs --cache-seqlens L0,L1,... (one per sequence)");
  if (Status s = parse_list("cache-seqlens", v["cache-seqlens"], &c.cache_seqlens); !s.ok())
    return fail(2, s.message());
  struct IntOpt {
    const char* name;
    i64* field;
  };
  for (IntOpt o : {IntOpt{"seqlen-q", &c.s_q}, IntOpt{"heads", &c.heads}, IntOpt{"kv-heads", &c.kv_heads},
                   IntOpt{"head-dim", &c.d}, IntOpt{"new-tokens", &c.s_new}, IntOpt{"page-size", &c.page_size},
                   IntOpt{"max-pages", &c.max_pages}, IntOpt{"num-pages", &c.num_pages},
                   IntOpt{"cache-capacity", &c.capacity}, IntOpt{"pad", &c.pad}})
    if (v.count(o.name))
      if (Status s = parse_int(o.name, v[o.name], o.field); !s.ok()) return fail(2, s.message());
  c.dv = c.d;
  if (v.count("head-dim-v"))
    if (Status s = parse_int("head-dim-v", v["head-dim-v"], &c.dv); !s.ok()) return fail(2, s.message());
  if (v.count("seqlens-q"))
    if (Status s = parse_list("seqlens-q", v["seqlens-q"], &c.seqlens_q); !s.ok()) return fail(2, s.message());
  if (v.count("dtype")) {
    const std::string& t = v["dtype"];
    if (t == "f16" || t == "fp16")
      c.dtype = DType::f16;
    else if (t == "bf16")
      c.dtype = DType::bf16;
    else if (t == "f32" || t == "fp32")
      c.dtype = DType::f32;
    else
      return fail(2, "--dtype '" + t + "': expected f16, bf16 or f32");
  }
  if (v.count("mask")) {
    const auto m = mask_from_string(v["mask"]);
    if (!m) return fail(2, "--mask '" + v["mask"] + "': expected none, causal or causal_bottom_right");
    c.options.mask = *m;
  }
  if (v.count("window")) {
    std::vector<i64> w;
    if (Status s = parse_list("window", v["window"], &w); !s.ok() || w.size() != 2)
      return fail(2, "--window '" + v["window"] + "': expected LEFT,RIGHT");
    c.options.window = {w[0], w[1]};
  }
  if (v.count("scale")) {
    const std::string& t = v["scale"];
    char* end = nullptr;
    const double x = std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0' || t.find_first_of("xXnN") != std::string::npos)
      return fail(2, "--scale '" + t + "': expected a decimal number");
    c.options.scale = x;
  }
  if (v.count("page-size") && c.page_size < 1)
    return fail(
        2, "--page-size " + v["page-size"] + ": expected >= 1 tokens per page (leave it out for a contiguous cache)");
  if (v.count("block-table")) c.table = v["block-table"];
  for (const char* name : {"k-cache", "v-cache"})
    if (v.count(name)) {
      harness::ViewSpec spec;
      if (Status s = parse_view(name, v[name], &spec); !s.ok()) return fail(2, s.message());
      (name[0] == 'k' ? c.k_view : c.v_view) = spec;
      (name[0] == 'k' ? c.k_view_given : c.v_view_given) = true;
    }
  // Sizes the views fix; defaults for the rest: room for every sequence's attended tokens.
  // A size option given next to a view must agree with it.
  auto from_view = [&](const char* opt, const char* view, i64 view_value, i64* field) {
    if (v.count(opt) && *field != view_value)
      return fail(2, std::string("--") + opt + " " + v[opt] + " disagrees with --" + view + " '" + v[view] +
                         "', which has " + std::to_string(view_value) + "; give one of them, or make them agree");
    *field = view_value;
    return 0;
  };
  int e = 0;
  if (c.k_view_given) {
    const Dims4& sh = c.k_view.shape;
    if (!e) e = from_view("kv-heads", "k-cache", sh[kHead], &c.kv_heads);
    if (!e) e = from_view("head-dim", "k-cache", sh[kHeadDim], &c.d);
    if (!e && c.page_size) e = from_view("page-size", "k-cache", sh[kSeq], &c.page_size);
    if (!e && c.page_size) e = from_view("num-pages", "k-cache", sh[kBatch], &c.num_pages);
    if (!e && !c.page_size) e = from_view("cache-capacity", "k-cache", sh[kSeq], &c.capacity);
  }
  if (!e && c.v_view_given) e = from_view("head-dim-v", "v-cache", c.v_view.shape[kHeadDim], &c.dv);
  if (e) return e;
  i64 longest = 0;
  for (i64 x : c.cache_seqlens) longest = std::max(longest, x + c.s_new);
  if (c.page_size > 0) {
    if (!c.max_pages) c.max_pages = std::max<i64>(1, (longest + c.page_size - 1) / c.page_size);
    if (!c.num_pages) c.num_pages = c.batch() * c.max_pages + 1;
  } else if (!c.capacity) {
    c.capacity = std::max<i64>(longest, 1);
  }
  if (explain_only) {
    Buffers b;
    KvCacheArgs a;
    if (Status s = build(c, &b, &a); !s.ok()) return fail(2, s.message());
    const Explanation ex = explain(a);
    if (!ex.validation.ok()) return fail(2, ex.validation.message());
    if (as_json) {
      const json j = {{"problem", problem_json(c)}, {"layout", ex.layout}, {"forward", verdicts_json(ex)}};
      std::printf("%s\n", j.dump(2).c_str());
      return 0;
    }
    // the layout of `explain`'s text output
    std::printf("layout:  %s\n", ex.layout.c_str());
    std::printf("forward:\n");
    for (const Verdict& vd : ex.verdicts)
      std::printf("  %-10s %-12s %s%s\n", std::string(to_string(vd.backend)).c_str(),
                  vd.supported ? "supported" : "unsupported", vd.rule.empty() ? "" : ("[" + vd.rule + "] ").c_str(),
                  vd.reason.c_str());
    std::printf("  auto chooses: %s\n", ex.chosen ? std::string(to_string(*ex.chosen)).c_str() : "nothing (see above)");
    return 0;
  }
  const Outcome r = run_case(c, backends, false);
  if (r.exit == 2) return fail(2, r.text);
  const std::string again = reproducer(args, v.count("seed") > 0, seed);
  if (as_json) {
    json j = {{"problem", problem_json(c)}, {"layout", r.layout}, {"exit_code", r.exit}, {"reproducer", again}};
    json arr = json::array();
    for (const BackendRow& row : r.rows) arr.push_back(row_json(row, case_flops(c)));
    j["backends"] = arr;
    std::printf("%s\n", j.dump(2).c_str());
    return r.exit;
  }
  std::fputs(r.text.c_str(), stdout);
  // the closing lines of `check`: the verdict, and on disagreement the command that repeats it
  if (r.exit == 0)
    std::printf("strideattn: every compared backend agrees with the fp64 reference\n");
  else
    std::printf("strideattn: DISAGREES (see above)\nreproduce: %s\n", again.c_str());
  return r.exit;
}

}  // namespace strideattn::cli
