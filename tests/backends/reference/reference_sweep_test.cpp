// A seeded sweep of small random problems through the reference backend: every dtype,
// mask, window, GQA ratio, s_q != s_kv both ways, s = 1, head dims 8..512, varlen with
// empty sequences and gaps, non-canonical strides. Each case runs forward then backward (on
// the forward's own O and LSE) and must write every output element, leave the memory around
// the views untouched, and pass the correctness rule (docs/semantics.md) against reference_compute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "harness/compare.hpp"
#include "ref_case.hpp"

namespace reftest {
namespace {

using strideattn::MaskKind;
using strideattn::detail::reference_compute;
using strideattn::detail::ReferenceOutputs;
using strideattn::detail::RefPrecision;
namespace harness = strideattn::harness;

CaseSpec random_spec(std::mt19937_64& rng) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  CaseSpec s;
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  s.dtype = dtypes[pick(0, 2)];
  const std::int64_t ratios[][2] = {{1, 1}, {2, 2}, {4, 2}, {6, 3}, {4, 1}, {3, 1}};
  const auto& r = ratios[pick(0, 5)];
  s.h = r[0], s.hg = r[1];
  s.dqk = 8 * pick(1, 12);
  s.dv = pick(0, 2) == 0 ? 8 * pick(1, 12) : s.dqk;
  const MaskKind masks[] = {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right};
  s.options.mask = masks[pick(0, 2)];
  if (pick(0, 1)) s.options.window = {pick(-1, 6), pick(-1, 6)};
  if (pick(0, 3) == 0) s.options.scale = 0.05 * double(pick(1, 40));
  const Order orders[] = {Order::bshd, Order::sbhd, Order::bhsd};
  s.order = orders[pick(0, 2)];
  s.pad = pick(0, 1) ? 0 : pick(1, 9);
  if (pick(0, 2) == 0) {  // varlen: empty sequences, gaps, a tail
    const std::int64_t n = pick(1, 4);
    std::int64_t tq = pick(0, 2), tk = pick(0, 2);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t lq = pick(0, 3) == 0 ? 0 : pick(1, 12), lk = pick(0, 3) == 0 ? 0 : pick(1, 12);
      s.varlen.seqlens_q.push_back(lq);
      s.varlen.seqlens_kv.push_back(lk);
      s.varlen.offsets_q.push_back(tq);
      s.varlen.offsets_kv.push_back(tk);
      tq += lq + pick(0, 2);
      tk += lk + pick(0, 2);
    }
    s.b = 1, s.sq = tq + pick(0, 2), s.skv = tk + pick(0, 2);
  } else {
    s.b = pick(1, 3);
    s.sq = pick(0, 4) == 0 ? 1 : pick(1, 19);
    s.skv = pick(0, 4) == 0 ? 1 : pick(1, 19);
  }
  return s;
}

std::string describe(const CaseSpec& s) {
  std::string d = std::string(strideattn::to_string(s.dtype)) + " b" + std::to_string(s.b) + " sq" +
                  std::to_string(s.sq) + " skv" + std::to_string(s.skv) + " h" + std::to_string(s.h) + "/" +
                  std::to_string(s.hg) + " d" + std::to_string(s.dqk) + "/" + std::to_string(s.dv) + " " +
                  std::string(strideattn::to_string(s.options.mask)) + " window(" +
                  std::to_string(s.options.window.left) + "," + std::to_string(s.options.window.right) + ")";
  if (s.varlen.enabled()) d += " varlen x" + std::to_string(s.varlen.seqlens_q.size());
  return d;
}

void check_case(const CaseSpec& spec, std::uint64_t seed) {
  SCOPED_TRACE(describe(spec));
  Case c(spec, seed);
  c.run_both();
  if (testing::Test::HasFatalFailure()) return;
  for (const Tensor* t : {&c.o, &c.dq, &c.dk, &c.dv}) EXPECT_TRUE(written_and_guarded(*t));
  const auto problem = c.problem(true);
  // The backward ran on the forward's O and LSE (in the views); its targets are those
  // docs/semantics.md "Correctness rule" names for the dtype.
  const auto targets = strideattn::detail::backward_targets(spec.dtype);
  const ReferenceOutputs exact = reference_compute(problem, RefPrecision::exact, targets);
  const ReferenceOutputs naive = reference_compute(problem, RefPrecision::naive_lowp, targets);
  std::vector<double> lse(c.lse.data.begin(), c.lse.data.begin() + std::ptrdiff_t(exact.lse.size()));
  for (double x : lse) EXPECT_FALSE(std::isnan(x));  // every LSE element written
  double max_lse = 0;
  for (double x : exact.lse)
    if (std::isfinite(x)) max_lse = std::max(max_lse, std::fabs(x));
  struct Item {
    const char* name;
    std::vector<double> got;
    const std::vector<double>* exact;
    const std::vector<double>* naive;
    bool is_lse;
  };
  const Item items[] = {{"o", c.o.logical(), &exact.o, &naive.o, false},
                        {"lse", lse, &exact.lse, &naive.lse, true},
                        {"dq", c.dq.logical(), &exact.dq, &naive.dq, false},
                        {"dk", c.dk.logical(), &exact.dk, &naive.dk, false},
                        {"dv", c.dv.logical(), &exact.dv, &naive.dv, false}};
  for (const Item& it : items) {
    const harness::ErrorStats naive_err = harness::compare(*it.naive, *it.exact);
    EXPECT_EQ(naive_err.non_finite, 0) << it.name << ": the naive model disagrees on -inf/NaN";
    const harness::TensorCheck check =
        harness::check_tensor(it.name, it.is_lse ? DType::f32 : spec.dtype, it.got, *it.naive, *it.exact);
    EXPECT_TRUE(check.pass()) << it.name << ": err " << check.err.max_abs_err << " tol " << check.tol << " non-finite "
                              << check.err.non_finite << " worst index " << check.err.worst_index;
  }
}

TEST(ReferenceSweep, RandomSmallProblems) {
  std::mt19937_64 rng(2024);
  for (int n = 0; n < 300; ++n) {
    const CaseSpec spec = random_spec(rng);
    check_case(spec, 1000 + std::uint64_t(n));
    if (HasFailure()) return;
  }
}

TEST(ReferenceSweep, LargeHeadDims) {
  for (std::int64_t d : {256, 512}) {
    CaseSpec s;
    s.dtype = DType::bf16;
    s.b = 1, s.sq = 5, s.skv = 9, s.h = 2, s.hg = 1, s.dqk = d, s.dv = d;
    s.options.mask = MaskKind::causal_bottom_right;
    check_case(s, 77);
    s.dv = 64;
    s.options.window = {2, 2};
    check_case(s, 78);
  }
}

}  // namespace
}  // namespace reftest
