// Test helper for KV-cache attention on a GPU backend: a KvCase (kv_case.hpp) copied to the
// device, run on the backend asked for, its O and LSE judged against the fp64 reference under the
// correctness rule (NaN-filled before the call: every element must be written), the caches
// compared byte for byte with the expected appends, guard elements checked. Shared by the cuda
// and cudnn KV-cache tests.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backends/reference/reference_kvcache.hpp"
#include "harness/compare.hpp"
#include "problem/kv_cache.hpp"
#include "support/kv_case.hpp"

namespace strideattn::test_support {

// How Q and O are laid out: the case's dense [b, s_q, h, d], or head-major [b, h, s_q, d] over
// the same buffers (strides that are not the dense ones).
enum class QoLayout { dense, head_major };

inline TensorView with_layout(TensorView v, QoLayout l) {
  if (l == QoLayout::head_major) {
    const i64 s = v.shape[kSeq], h = v.shape[kHead], d = v.shape[kHeadDim];
    v.stride = {s * h * d, d, s * d, 1};
  }
  return v;
}

// Device copies of a KvCase's buffers (guard elements included), freed at scope exit.
struct DeviceBuffers {
  std::map<const void*, std::pair<void*, std::size_t>> map;  // host base -> device base, bytes
  ~DeviceBuffers() {
    for (auto& [h, d] : map) (void)cudaFree(d.first);
  }
  void* add(const void* host, std::size_t bytes) {
    void* dev = nullptr;
    if (bytes == 0) return nullptr;
    EXPECT_EQ(cudaMalloc(&dev, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    map[host] = {dev, bytes};
    return dev;
  }
  // The device address of a host pointer inside one of the copied buffers.
  template <class P>
  P* at(P* host) const {
    if (host == nullptr) return nullptr;
    const auto* h = reinterpret_cast<const unsigned char*>(host);
    for (const auto& [base, d] : map) {
      const auto* b = static_cast<const unsigned char*>(base);
      if (h >= b && h < b + d.second) return reinterpret_cast<P*>(static_cast<unsigned char*>(d.first) + (h - b));
    }
    ADD_FAILURE() << "pointer outside the copied buffers";
    return nullptr;
  }
  void back(void* host) const {
    const auto& d = map.at(host);
    EXPECT_EQ(cudaMemcpy(host, d.first, d.second, cudaMemcpyDeviceToHost), cudaSuccess);
  }
};

struct RunOptions {
  QoLayout qo = QoLayout::dense;
  bool odd_q_offset = false;  // Q one element past a 16-byte boundary: the element-wise Q path
  // A planted error: this cache element (K when plant_k, else V) gets +plant after the
  // reference ran, before the device copy: the comparison must catch it.
  i64 plant_index = -1;
  bool plant_k = false;
  float plant = 0.f;
};

struct RunResult {
  Status status;
  harness::TensorCheck o, lse;
  bool written = false;  // no O / LSE element holds the poison
  bool caches = false;   // caches equal the expected ones, byte for byte (guards included)
  bool guards = false;   // O and LSE guard elements untouched
  std::vector<double> o_out, lse_out;
};

// O [b, s_q, h, dv] (logical order) read through the view `v` of host bytes `base`.
inline std::vector<double> read_o(const KvCase& c, const TensorView& v, const unsigned char* base) {
  std::vector<double> out(std::size_t(c.b * c.s_q * c.h * c.dv));
  for (i64 n = 0; n < c.b; ++n)
    for (i64 i = 0; i < c.s_q; ++i)
      for (i64 hh = 0; hh < c.h; ++hh)
        for (i64 e = 0; e < c.dv; ++e)
          out[std::size_t(((n * c.s_q + i) * c.h + hh) * c.dv + e)] = detail::load_as_float(
              base, c.dtype, n * v.stride[0] + i * v.stride[1] + hh * v.stride[2] + e * v.stride[3]);
  return out;
}

// Runs `c` on `backend` (device copies of everything) and judges it against the fp64
// reference run on the host copies.
inline RunResult run_on(Backend backend, KvCase& c, const RunOptions& ro = {}) {
  RunResult r;
  // The odd Q offset: a copy of Q one element further into a larger buffer.
  Buf q_odd = c.q;
  if (ro.odd_q_offset) {
    q_odd.guard = c.q.guard + 1;
    q_odd.resize(c.q.size(), KvCase::kPoison);
    for (i64 i = 0; i < c.q.size(); ++i) q_odd.set(i, c.q.get(i));
  }
  KvCacheArgs host = c.args(Backend::reference);
  if (ro.odd_q_offset) host.q.data = q_odd.data();
  host.q = with_layout(host.q, ro.qo);
  host.o = with_layout(host.o, ro.qo);
  detail::KvCacheProblem p;
  r.status = detail::make_kvcache_problem(host, &p);
  if (!r.status.ok()) return r;
  detail::ReferenceOutputs exact, naive;
  r.status = detail::reference_kvcache_compute(p, detail::RefPrecision::exact, &exact);
  if (!r.status.ok()) return r;
  r.status = detail::reference_kvcache_compute(p, detail::RefPrecision::naive_lowp, &naive);
  if (!r.status.ok()) return r;
  std::vector<unsigned char> want_k, want_v;
  c.expected_caches(&want_k, &want_v);
  if (ro.plant_index >= 0) {
    Buf& x = ro.plant_k ? c.kc : c.vc;
    x.set(ro.plant_index, x.get(ro.plant_index) + ro.plant);
  }

  // O and LSE NaN-filled before the call (their guards keep the case's poison): an element the
  // call does not write stays NaN, which the written check and the rule's non-finite count catch.
  for (i64 i = 0; i < c.o.size(); ++i) c.o.set(i, NAN);
  for (std::size_t i = 8; i + 8 < c.lse.size(); ++i) c.lse[i] = NAN;

  DeviceBuffers dev;
  Buf& q_src = ro.odd_q_offset ? q_odd : c.q;
  for (Buf* b : {&q_src, &c.kc, &c.vc, &c.kn, &c.vn, &c.o}) dev.add(b->bytes.data(), b->bytes.size());
  dev.add(c.lse.data(), c.lse.size() * sizeof(float));
  dev.add(c.cache_seqlens.data(), c.cache_seqlens.size() * 4);
  if (!c.seqlens_q.empty()) dev.add(c.seqlens_q.data(), c.seqlens_q.size() * 4);
  if (c.paged) dev.add(c.table.data(), c.table.size() * 4);
  KvCacheArgs a = host;
  a.q.data = dev.at(a.q.data);
  a.k_cache.data = dev.at(a.k_cache.data);
  a.v_cache.data = dev.at(a.v_cache.data);
  a.k_new.data = dev.at(a.k_new.data);
  a.v_new.data = dev.at(a.v_new.data);
  a.o.data = dev.at(a.o.data);
  a.lse.data = dev.at(a.lse.data);
  a.block_table.data = dev.at(a.block_table.data);
  a.cache_seqlens = dev.at(a.cache_seqlens);
  a.seqlens_q = dev.at(a.seqlens_q);
  a.memory = Memory::device;
  a.backend = backend;
  r.status = forward_with_kvcache(a);
  if (!r.status.ok()) return r;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (Buf* b : {&c.kc, &c.vc, &c.o}) dev.back(b->bytes.data());
  dev.back(c.lse.data());

  r.o_out = read_o(c, host.o, c.o.bytes.data() + c.o.guard * i64(size_of(c.dtype)));
  r.lse_out.resize(exact.lse.size());
  r.written = true;
  const float poison = c.poison();
  for (std::size_t i = 0; i < r.o_out.size(); ++i)
    r.written = r.written && r.o_out[i] != double(poison) && !std::isnan(r.o_out[i]);
  for (std::size_t i = 0; i < r.lse_out.size(); ++i) {
    r.lse_out[i] = c.lse[i + 8];
    r.written = r.written && c.lse[i + 8] != KvCase::kPoison && !std::isnan(c.lse[i + 8]);
  }
  r.o = harness::check_tensor("o", c.dtype, r.o_out, naive.o, exact.o);
  r.lse = harness::check_tensor("lse", DType::f32, r.lse_out, naive.lse, exact.lse);
  r.caches = c.kc.bytes == want_k && c.vc.bytes == want_v;
  r.guards = c.guards_intact();
  return r;
}

inline std::string describe(const KvCase& c) {
  std::string s = c.paged ? "paged, page " + std::to_string(c.page_size) + " x " + std::to_string(c.max_pages)
                          : "contiguous, s_max " + std::to_string(c.s_max);
  s += ", lens";
  for (auto x : c.cache_seqlens) s += " " + std::to_string(x);
  s += ", s_new " + std::to_string(c.s_new) + ", s_q " + std::to_string(c.s_q) + ", h " + std::to_string(c.h) + "/" +
       std::to_string(c.hg) + ", d " + std::to_string(c.d) + "/" + std::to_string(c.dv) + ", " +
       std::string(to_string(c.dtype)) + ", mask " + std::string(to_string(c.options.mask)) + " window " +
       std::to_string(c.options.window.left) + "," + std::to_string(c.options.window.right) + ", seed " +
       std::to_string(c.seed);
  return s;
}

inline void expect_ok_on(Backend backend, KvCase& c, const RunOptions& ro = {}) {
  SCOPED_TRACE(describe(c));
  const RunResult r = run_on(backend, c, ro);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_TRUE(r.o.pass()) << "o: max abs err " << r.o.err.max_abs_err << " tol " << r.o.tol << " non-finite "
                          << r.o.err.non_finite;
  EXPECT_TRUE(r.lse.pass()) << "lse: max abs err " << r.lse.err.max_abs_err << " tol " << r.lse.tol << " non-finite "
                            << r.lse.err.non_finite;
  EXPECT_TRUE(r.written) << "an O or LSE element still holds the NaN it was filled with (or the poison)";
  EXPECT_TRUE(r.caches) << "the caches differ from the appended slots' expected bytes";
  EXPECT_TRUE(r.guards) << "a guard element of O or LSE was written";
}

// A case with the sizes given and fresh inputs.
inline KvCase make_case(std::uint64_t seed, DType dt, bool paged, i64 page, std::vector<std::int32_t> lens, i64 s_new,
                        i64 s_q, i64 h, i64 hg, i64 d, i64 dv, MaskKind mask = MaskKind::causal_bottom_right,
                        Window w = {}) {
  KvCase c;
  c.dtype = dt;
  c.b = i64(lens.size());
  c.paged = paged;
  c.cache_seqlens = std::move(lens);
  c.s_new = s_new;
  c.s_q = s_q;
  c.h = h, c.hg = hg, c.d = d, c.dv = dv;
  i64 longest = 1;
  for (auto x : c.cache_seqlens) longest = std::max<i64>(longest, x + s_new);
  if (paged) {
    c.page_size = page;
    c.max_pages = (longest + page - 1) / page + 1;  // one unused entry (-1) past every sequence's pages
  } else {
    c.s_max = longest + 3;
  }
  c.options.mask = mask;
  c.options.window = w;
  c.seed = seed;
  return c;
}

// Every cache slot that holds no token of any sequence (past each attended length, and whole
// unused pages) set to NaN, in the caches and their "before" copies: a backend that lets a
// slot it must not read reach O (0 * NaN) shows. Call after build().
inline void poison_unused_slots(KvCase& c, float poison = NAN) {
  std::vector<char> held(std::size_t(c.rows() * c.slots()), 0);
  for (i64 n = 0; n < c.b; ++n)
    for (i64 t = 0; t < c.cache_seqlens[std::size_t(n)] + c.s_new; ++t) {
      const i64 row = c.paged ? c.table[std::size_t(c.table_at(n, t / c.page_size))] : n;
      held[std::size_t(row * c.slots() + (c.paged ? t % c.page_size : t))] = 1;
    }
  for (auto [buf, dd] : {std::pair<Buf*, i64>{&c.kc, c.d}, {&c.vc, c.dv}}) {
    const Dims4 st = c.cache_stride(dd);
    for (i64 row = 0; row < c.rows(); ++row)
      for (i64 slot = 0; slot < c.slots(); ++slot)
        if (!held[std::size_t(row * c.slots() + slot)])
          for (i64 hh = 0; hh < c.hg; ++hh)
            for (i64 e = 0; e < dd; ++e) buf->set(row * st[0] + slot * st[1] + hh * st[2] + e, poison);
  }
  c.kc_before = c.kc.bytes;
  c.vc_before = c.vc.bytes;
}

}  // namespace strideattn::test_support
