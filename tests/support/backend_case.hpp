// Shared by the backend tests (cpu, cuda, cudnn): case builders for dense and varlen
// problems, explicit per-tensor views, and the one "this backend runs the case and passes"
// check through the harness runner (fresh random inputs, poisoned outputs, guard bands,
// written checks, fp64 reference under docs/semantics.md's tolerance). Each test file keeps its own
// seed offsets so its drawn inputs do not depend on another file's.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "harness/runner.hpp"
#include "harness/views.hpp"

namespace strideattn::test_support {

using harness::CaseReport;
using harness::CaseSpec;
using harness::ViewSpec;

// Every backend's status, reason, guard/written flags and per-tensor errors, for failure
// messages.
inline std::string describe(const CaseReport& r) {
  std::ostringstream os;
  for (const auto& b : r.backends) {
    os << to_string(b.backend) << ": " << b.status << " " << b.reason << " guard_ok=" << b.guard_ok
       << " written_ok=" << b.written_ok;
    for (const auto& c : b.checks)
      os << "\n  " << c.name << " max_abs_err " << c.err.max_abs_err << " tol " << c.tol << " non_finite "
         << c.err.non_finite << (c.pass() ? "" : "  FAIL");
    os << "\n";
  }
  return os.str();
}

// Runs `spec` on `backend` and expects "ok": within tolerance, guards intact, every output
// element written, and every check present (forward: o and lse; backward adds dq, dk, dv).
// Views are (re)built from spec.layout_name when it is set. Failure messages carry the
// reproducer command line.
inline void expect_backend_ok(Backend backend, CaseSpec spec) {
  if (!spec.layout_name.empty()) {
    const Status s = harness::make_layout_views(spec.layout_name, spec.sizes, &spec.views);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  CaseReport report;
  const Status s = harness::run_case(spec, {backend}, &report);
  const std::string repro = harness::reproducer(spec, {backend});
  ASSERT_TRUE(s.ok()) << s.message() << "\n  " << repro;
  ASSERT_EQ(report.backends.size(), 1u);
  const auto& r = report.backends[0];
  EXPECT_EQ(r.status, "ok") << describe(report) << "  " << repro;
  EXPECT_TRUE(r.guard_ok) << repro;
  EXPECT_TRUE(r.written_ok) << repro;
  EXPECT_EQ(r.checks.size(), spec.grad ? 5u : 2u) << repro;
}

// Dense case builder: `dense(dtype, b, sq, skv, h, hg, dqk, dv, mask, ...)`. The seed is
// drawn from the sizes and mask plus the file's `seed_offset`.
struct DenseCaseBuilder {
  std::uint64_t seed_offset = 0;

  [[nodiscard]] CaseSpec operator()(DType dtype, std::int64_t b, std::int64_t sq, std::int64_t skv, std::int64_t h,
                                    std::int64_t hg, std::int64_t dqk, std::int64_t dv, MaskKind mask,
                                    std::int64_t left = -1, std::int64_t right = -1, bool grad = true,
                                    const char* layout = "bshd_bshd_bshd") const {
    CaseSpec s;
    s.dtype = dtype;
    s.sizes.batch = b, s.sizes.s_q = sq, s.sizes.s_kv = skv;
    s.sizes.heads = h, s.sizes.kv_heads = hg, s.sizes.d_qk = dqk, s.sizes.d_v = dv;
    s.layout_name = layout;
    s.options.mask = mask;
    s.options.window = {left, right};
    s.grad = grad;
    s.seed = static_cast<std::uint64_t>(sq * 1000003 + skv * 101 + dqk * 7 + h + int(mask)) + seed_offset;
    return s;
  }
};

// Varlen case builder (4 query heads, 2 KV heads, d_qk = d_v = d, backward on):
// `varlen(dtype, seqlens_q, seqlens_kv, offsets_q, offsets_kv, mask, left, right, d, layout)`.
// The seed is seed_base + mask + left + 2 * right, plus d where head_dim_in_seed.
struct VarlenCaseBuilder {
  std::uint64_t seed_base = 4242;
  std::int64_t head_dim = 32;  // d when the call gives none
  bool head_dim_in_seed = false;

  [[nodiscard]] CaseSpec operator()(DType dtype, std::vector<std::int64_t> lq, std::vector<std::int64_t> lk,
                                    std::vector<std::int64_t> oq, std::vector<std::int64_t> ok, MaskKind mask,
                                    std::int64_t left = -1, std::int64_t right = -1,
                                    std::optional<std::int64_t> d = std::nullopt,
                                    const char* layout = "thd_thd_thd") const {
    const std::int64_t dd = d.value_or(head_dim);
    CaseSpec s = DenseCaseBuilder{}(dtype, static_cast<std::int64_t>(lq.size()), 1, 1, 4, 2, dd, dd, mask, left, right,
                                    true, layout);
    s.sizes.seqlens_q = std::move(lq), s.sizes.seqlens_kv = std::move(lk);
    s.sizes.offsets_q = std::move(oq), s.sizes.offsets_kv = std::move(ok);
    s.seed = seed_base + int(mask) + static_cast<std::uint64_t>(left + 2 * right + (head_dim_in_seed ? dd : 0));
    return s;
  }
};

// `c` with its layout name dropped and explicit views from make(buffer name, heads): h heads
// for q, o, do, dq and kv_heads for k, v, dk, dv.
inline CaseSpec with_views(CaseSpec c, const std::function<ViewSpec(const char*, std::int64_t)>& make) {
  c.layout_name.clear();
  auto& v = c.views;
  const std::int64_t h = c.sizes.heads, hg = c.sizes.kv_heads;
  v.q = make("q", h), v.k = make("k", hg), v.v = make("v", hg), v.o = make("o", h);
  v.d_o = make("do", h), v.dq = make("dq", h), v.dk = make("dk", hg), v.dv = make("dv", hg);
  return c;
}

// What a seeded sweep draws from: sequence lengths 1..max_seq (dense) and 0..max_varlen_seq
// (varlen, 1..4 sequences with gaps), windows 0..max_window on either side (or none), one of
// `dtypes`; case c gets seed seed_base + c.
struct SweepRanges {
  std::int64_t max_seq = 160;
  std::int64_t max_varlen_seq = 140;
  std::int64_t max_window = 80;
  std::vector<DType> dtypes;
  std::uint64_t seed_base = 1000;
};

// Case `c` of a seeded sweep: sizes around the tiles, every mask (c % 3) and window kind,
// GQA ratios, head dims 8..256 in steps of 8 (d_qk != d_v every fourth case where the layout
// allows it), every dtype, dense layouts and (every fourth case) varlen; backward on even
// cases. Draws from `rng` in a fixed order, so a sweep's cases depend only on its rng seed.
inline CaseSpec sweep_case(int c, std::mt19937_64& rng, const SweepRanges& ranges, const DenseCaseBuilder& dense,
                           const VarlenCaseBuilder& varlen) {
  static const MaskKind masks[] = {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right};
  static const char* const dense_layouts[] = {"bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd",
                                              "sbhd_sb2hd",     "bshd_bsh2d",     "sb(h+2hg)d"};
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  const std::int64_t hg = pick(1, 2), h = hg * pick(1, 3);
  const std::int64_t dqk = 8 * pick(1, 32);
  const std::int64_t dv = (c % 4 == 0) ? 8 * pick(1, 32) : dqk;
  const MaskKind m = masks[c % 3];
  const std::int64_t left = pick(0, 3) == 0 ? pick(0, ranges.max_window) : -1;
  const std::int64_t right = pick(0, 3) == 0 ? pick(0, ranges.max_window) : -1;
  const DType t = ranges.dtypes[static_cast<std::size_t>(pick(0, static_cast<std::int64_t>(ranges.dtypes.size()) - 1))];
  CaseSpec s;
  if (c % 4 == 3) {
    const std::int64_t n = pick(1, 4);
    std::vector<std::int64_t> lq, lk, oq, ok;
    std::int64_t pq = 0, pk = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      pq += pick(0, 2), pk += pick(0, 2);  // gaps
      lq.push_back(pick(0, 4) == 0 ? 0 : pick(1, ranges.max_varlen_seq));
      lk.push_back(pick(0, 4) == 0 ? 0 : pick(1, ranges.max_varlen_seq));
      oq.push_back(pq), ok.push_back(pk);
      pq += lq.back(), pk += lk.back();
    }
    s = varlen(t, lq, lk, oq, ok, m, left, right);
    s.sizes.heads = h, s.sizes.kv_heads = hg, s.sizes.d_qk = dqk, s.sizes.d_v = dqk;
  } else {
    const std::int64_t sq = pick(1, ranges.max_seq), skv = pick(0, 1) ? sq : pick(1, ranges.max_seq);
    const std::string layout = dense_layouts[pick(0, 5)];
    const bool fused = layout.find("(h") != std::string::npos;
    const bool needs_equal_dims = layout.find('2') != std::string::npos || fused;
    s = dense(t, pick(1, 2), sq, fused ? sq : skv, h, hg, dqk, needs_equal_dims ? dqk : dv, m, left, right, c % 2 == 0,
              layout.c_str());
  }
  s.seed = ranges.seed_base + static_cast<std::uint64_t>(c);
  return s;
}

}  // namespace strideattn::test_support
