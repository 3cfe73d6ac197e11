// The conditioning allowances of the correctness rule (conditioning.hpp; docs/semantics.md
// "Correctness rule", "Conditioning"), in fp64 over (sequence, KV head) tasks. For query row i
// with visible keys j (exact scores S_j, softmax P_j, LSE, row max m; A_j = scale sum_d
// |Q_id K_jd|):
//   E_j   = gamma(d_qk) A_j + gamma(4) (A_j + max A): no fp32 evaluation of S_j errs by more
//           (the dot product's d roundings; the scale, its own fp32 rounding, a base-2 factor
//           and the subtraction of the row max or LSE, each a rounding of a value up to
//           A_j + max A). Rows with max E_j < kGate get no allowance at all.
//   a_j   = the largest change of P_j under such score errors, exactly: the softmax of key j
//           lies between 1 / (1 + R+_j e^{E_j}) and 1 / (1 + R-_j e^{-E_j}),
//           R+-_j = sum_{k != j} P_k e^{+-E_k} / P_j (0 for a key that leads the others by far
//           more than the E's: one-hot rows are exact at any magnitude);
//   O_c   : sum_j a_j |V_jc - O_c| (the changes of P sum to 0); LSE: log sum_j P_j e^{E_j}.
// Backward, where P = exp(S - LSE) is formed from the forward's own scores and its fp32 LSE:
//   t_j   = the exponent's own error: the LSE's rounding to fp32 (at most half an ulp, and
//           never more than log l, since the row max is representable), the error of the fp32
//           row sum l, and the rounding of S - LSE; Lambda, the largest log l the backend's
//           scores can give, bounds the first two: 0 on a row whose largest score leads by
//           more than 2 E + 40, at any magnitude;
//   pi_j  = a_j + (P_j + a_j) expm1(t_j), the bound on the change of P_j;
//   dS_j  = P_j (dP_j - D): |change| <= pi_j |dP_j - D| + (P_j + pi_j) gamma(d_v + 2)
//           (sum_c |dO_c V_jc| + sum_c |dO_c O_c|), the last the fp32 errors of dP and D, which
//           are all of dS where the two cancel (a row that sees one key);
//   dQ_c  : scale sum_j |change of dS_j| |K_jc|; dK_jc: scale sum_i (...) |Q_ic|;
//   dV_jc : sum_i pi_ij |dO_ic|; dK and dV summed over the GQA group.
// The overflow flags bound every fp32 intermediate the same way: the scores' partial sums
// (sum_d |q_d k_d|, times the scale and a base-2 factor when those exceed 1), the softmax
// accumulators, dP, D, dS and the gradients' partial sums.
#include "harness/conditioning.hpp"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include "common/attention_math.hpp"
#include "common/dtype.hpp"
#include "problem/params.hpp"

namespace strideattn::harness {

double fp32_gamma(double n, double w) {
  return n * w >= 1 ? std::numeric_limits<double>::infinity() : n * w / (1 - n * w);
}

namespace {

constexpr double kU = 0x1p-24;  // fp32 unit roundoff
constexpr double kFltMax = FLT_MAX;
constexpr double kLog2e = 1.4426950408889634;
constexpr double kInf = std::numeric_limits<double>::infinity();
// Score error bound below which a row keeps the tensor's tolerance (docs/semantics.md,
// "Conditioning"): weights move by less than 0.1% in any evaluation order.
constexpr double kGate = 0x1p-10;

using detail::Problem;

struct Logical4 {
  std::int64_t n0 = 0, n1 = 0, n2 = 0, n3 = 0;
  [[nodiscard]] std::int64_t size() const { return n0 * n1 * n2 * n3; }
  [[nodiscard]] std::size_t at(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) const {
    return std::size_t(((a * n1 + b) * n2 + c) * n3 + d);
  }
};
Logical4 logical_of(const TensorView& t) { return {t.shape[kBatch], t.shape[kSeq], t.shape[kHead], t.shape[kHeadDim]}; }

void load_row(const void* base, DType dt, std::int64_t offset, std::int64_t step, std::int64_t n, double* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = double(detail::load_as_float(base, dt, offset + i * step));
}

double dot(const double* a, const double* b, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
double abs_dot(const double* a, const double* b, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += std::fabs(a[i] * b[i]);
  return s;
}

// 1 / (1 + exp(x)) without overflow.
double logistic_neg(double x) {
  if (x > 0) {
    const double e = std::exp(-x);
    return e / (1 + e);
  }
  return 1 / (1 + std::exp(x));
}

// log sum_k exp(x_k) over a row's keys with x_k = S_k - m + sign E_k (finite S only), and the
// same sum without one key, without cancellation: for the key of the largest x it is kept
// apart; for any other key the total is at least twice what is subtracted.
struct LogSums {
  double shift = -kInf, total = 0, total_ex_top = 0;
  std::int64_t top = -1;
  double log_total_at_zero = 0;  // log sum_k exp(S_k - m) (sign 0 not needed: set by +1 too)
  [[nodiscard]] double log_others(std::int64_t j, double xj) const {
    const double rest = j == top ? total_ex_top : total - std::exp(xj - shift);
    return shift + std::log(std::max(rest, 0.0));
  }
};
LogSums log_sums(const std::vector<double>& s, const std::vector<double>& e, std::int64_t j0, std::int64_t j1, double m,
                 int sign) {
  LogSums r;
  double plain = 0;
  for (std::int64_t j = j0; j < j1; ++j) {
    const double sj = s[std::size_t(j)];
    if (!std::isfinite(sj)) continue;
    plain += std::exp(sj - m);
    const double x = sj - m + sign * e[std::size_t(j)];
    if (x > r.shift) r.shift = x, r.top = j;
  }
  for (std::int64_t j = j0; j < j1; ++j) {
    const double sj = s[std::size_t(j)];
    if (!std::isfinite(sj)) continue;
    const double t = std::exp(sj - m + sign * e[std::size_t(j)] - r.shift);
    r.total += t;
    if (j != r.top) r.total_ex_top += t;
  }
  r.log_total_at_zero = std::log(plain);
  return r;
}

// NaN (a non-finite input reached the bound) -> 0: the non-finite rules decide there.
double clean(double x) { return std::isnan(x) ? 0.0 : x; }

// Runs task(t) for t in [0, n) on up to hardware_concurrency threads (one when `work` is small).
template <class Fn>
void parallel_for(std::int64_t n, double work, Fn&& task) {
  const std::int64_t hw = std::max<std::int64_t>(1, std::int64_t(std::thread::hardware_concurrency()));
  const std::int64_t threads = work < 4e6 ? 1 : std::min(hw, n);
  if (threads <= 1) {
    for (std::int64_t t = 0; t < n; ++t) task(t);
    return;
  }
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (std::int64_t t = next++; t < n; t = next++) {
      try {
        task(t);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  try {
    for (std::int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  } catch (...) {
    // fewer threads than asked: the ones started and this one do the work
  }
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

class Pass {
 public:
  Pass(const Problem& p, bool forward, bool backward, bool given_o)
      : p_(p),
        a_(detail::make_params(p)),
        forward_(forward),
        backward_(backward && p.is_backward()),
        given_o_(given_o) {}

  Conditioning run() {
    Conditioning c;
    o_shape_ = logical_of(p_.o);
    lse_shape_ = {p_.q.shape[kBatch], p_.heads, p_.q.shape[kSeq], 1};
    c.o.assign(std::size_t(o_shape_.size()), 0.0);
    c.o_overflow.assign(c.o.size(), 0);
    c.lse.assign(std::size_t(lse_shape_.size()), 0.0);
    c.lse_overflow.assign(c.lse.size(), 0);
    if (backward_) {
      dq_shape_ = logical_of(p_.dq), dk_shape_ = logical_of(p_.dk), dv_shape_ = logical_of(p_.dv);
      c.dq.assign(std::size_t(dq_shape_.size()), 0.0);
      c.dq_overflow.assign(c.dq.size(), 0);
      c.dk.assign(std::size_t(dk_shape_.size()), 0.0);
      c.dk_overflow.assign(c.dk.size(), 0);
      c.dv.assign(std::size_t(dv_shape_.size()), 0.0);
      c.dv_overflow.assign(c.dv.size(), 0);
    }
    out_ = &c;
    if (a_.heads <= 0 || a_.kv_heads <= 0 || a_.heads % a_.kv_heads != 0) return c;
    const double work = p_.visible_pairs() * double(p_.d_qk + p_.d_v) * (backward_ ? 3.0 : 1.0);
    parallel_for(a_.batch * a_.kv_heads, work, [&](std::int64_t t) { run_group(t / a_.kv_heads, t % a_.kv_heads); });
    return c;
  }

 private:
  // One (sequence, KV head): its K and V rows once, every query head of the group, then the
  // group's dK / dV allowances (summed over the heads, as the gradients are).
  void run_group(std::int64_t b, std::int64_t hk) {
    const kernel::MaskRule mask = a_.mask(b);
    const std::int64_t lk = mask.s_kv, dqk = a_.d_qk, dv = a_.d_v;
    const DType dt = p_.dtype;
    const kernel::SequenceSpan k_span = a_.kv_seq.span(a_.k_st, b), v_span = a_.kv_seq.span(a_.v_st, b);
    Group g;
    g.k.assign(std::size_t(lk * dqk), 0.0);
    g.v.assign(std::size_t(lk * dv), 0.0);
    for (std::int64_t j = 0; j < lk; ++j) {
      load_row(a_.k, dt, kernel::row_offset(k_span, a_.k_st, j, hk), a_.k_st.d, dqk, &g.k[std::size_t(j * dqk)]);
      load_row(a_.v, dt, kernel::row_offset(v_span, a_.v_st, j, hk), a_.v_st.d, dv, &g.v[std::size_t(j * dv)]);
    }
    for (std::int64_t j = 0; j < lk; ++j) {
      const double* kj = &g.k[std::size_t(j * dqk)];
      const double* vj = &g.v[std::size_t(j * dv)];
      const double k_norm = std::sqrt(dot(kj, kj, dqk)), v_norm = std::sqrt(dot(vj, vj, dv));
      g.finite = g.finite && std::isfinite(k_norm) && std::isfinite(v_norm);
      g.k_norm_max = std::max(g.k_norm_max, k_norm);
      g.v_norm_max = std::max(g.v_norm_max, v_norm);
      for (std::int64_t d = 0; d < dqk; ++d) g.k_abs_max = std::max(g.k_abs_max, std::fabs(kj[d]));
      for (std::int64_t d = 0; d < dv; ++d) g.v_abs_max = std::max(g.v_abs_max, std::fabs(vj[d]));
    }
    if (backward_) {
      g.wdk.assign(g.k.size(), 0.0), g.mdk.assign(g.k.size(), 0.0);
      g.wdv.assign(g.v.size(), 0.0), g.mdv.assign(g.v.size(), 0.0);
      g.coarse_dk.assign(std::size_t(lk), 0.0), g.coarse_dv.assign(std::size_t(lk), 0.0);
      g.ovf.assign(std::size_t(lk), 0);
    }
    const std::int64_t group = p_.group_size();
    for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) run_head(b, h, mask, g);
    if (!backward_) return;
    const std::int64_t first_k = a_.kv_seq.first_token(b), bk = a_.kv_seq.batch_index(b);
    for (std::int64_t j = 0; j < lk; ++j) {
      for (std::int64_t d = 0; d < dqk; ++d) {
        const std::size_t at = dk_shape_.at(bk, first_k + j, hk, d), src = std::size_t(j * dqk + d);
        out_->dk[at] = clean(g.wdk[src]);
        out_->dk_overflow[at] = g.ovf[std::size_t(j)] || g.mdk[src] + g.coarse_dk[std::size_t(j)] >= kFltMax;
      }
      for (std::int64_t d = 0; d < dv; ++d) {
        const std::size_t at = dv_shape_.at(bk, first_k + j, hk, d), src = std::size_t(j * dv + d);
        out_->dv[at] = clean(g.wdv[src]);
        out_->dv_overflow[at] = g.ovf[std::size_t(j)] || g.mdv[src] + g.coarse_dv[std::size_t(j)] >= kFltMax;
      }
    }
  }

  struct Group {
    std::vector<double> k, v;                  // [lk][d_qk], [lk][d_v]
    std::vector<double> wdk, mdk, wdv, mdv;    // dK / dV allowances and magnitude bounds
    std::vector<double> coarse_dk, coarse_dv;  // per key: the magnitude bounds of skipped rows
    std::vector<std::uint8_t> ovf;             // per key: a pair that sees it may overflow
    double k_norm_max = 0, v_norm_max = 0, k_abs_max = 0, v_abs_max = 0;  // over the keys
    bool finite = true;                                                   // every K and V element is finite
  };

  // A row that needs no element-wise work: by Cauchy-Schwarz (sum_d |q_d k_d| <= |q| |k|) its
  // every score bound is below kGate, so it has no allowance, and no fp32 intermediate of it
  // can come near FLT_MAX (weights P and their bounds stay below 2 in such rows). Its share
  // of the dK / dV magnitude bounds goes into the per-key coarse bounds.
  bool skip_row(const std::vector<double>& q, std::int64_t j0, std::int64_t j1, double gamma_s, double gamma_4,
                double gamma_v, const std::vector<double>& d_o, const std::vector<double>& od, Group& g) const {
    const std::int64_t dqk = a_.d_qk, dv = a_.d_v;
    const double scale = p_.scale, n = double(j1 - j0), limit = kFltMax / 4;
    const double q_norm = std::sqrt(dot(q.data(), q.data(), dqk));
    const double a_bound = scale * q_norm * g.k_norm_max;
    // written as "!(x < bound)" so that a NaN bound never skips
    if (!g.finite || !(gamma_s * a_bound + gamma_4 * 2 * a_bound < kGate)) return false;
    if (!((1 + fp32_gamma(double(dqk + 8))) * std::max(1.0, scale * kLog2e) * q_norm * g.k_norm_max < limit))
      return false;
    if (!(n * g.v_abs_max < limit)) return false;
    if (!backward_) return true;
    if (!(fp32_gamma(2 * n + 8) < 0.5)) return false;
    const double do_norm = std::sqrt(dot(d_o.data(), d_o.data(), dv));
    const double o_norm = std::sqrt(dot(od.data(), od.data(), dv));
    const double ds_bound = 2 * (1 + gamma_v) * do_norm * (g.v_norm_max + o_norm);
    double q_abs = 0, do_abs = 0;
    for (std::int64_t c = 0; c < dqk; ++c) q_abs = std::max(q_abs, std::fabs(q[std::size_t(c)]));
    for (std::int64_t c = 0; c < dv; ++c) do_abs = std::max(do_abs, std::fabs(d_o[std::size_t(c)]));
    const double grow = std::max(1.0, scale);
    if (!(grow * n * ds_bound * g.k_abs_max < limit) || !(ds_bound * q_abs < limit) || !(do_abs < limit)) return false;
    for (std::int64_t j = j0; j < j1; ++j) {
      g.coarse_dk[std::size_t(j)] += grow * ds_bound * q_abs;
      g.coarse_dv[std::size_t(j)] += 2 * do_abs;
    }
    return true;
  }

  // The forward's allowances of row `token` (head h): O, sum_j a_j |V_jc - O_c|; LSE,
  // log sum_j P_j e^{E_j} (`lse_err`); the overflow flags (the softmax accumulators hold sums
  // of weights <= 1 times V).
  void write_forward(std::int64_t bq, std::int64_t token, std::int64_t h, std::int64_t j0, std::int64_t j1,
                     const std::vector<double>& o, const std::vector<double>& a, double lse_err, bool conditioned,
                     bool row_ovf, const Group& g) {
    const std::int64_t dv = a_.d_v;
    std::vector<double> wo(static_cast<std::size_t>(dv), 0.0), mo(static_cast<std::size_t>(dv), 0.0);
    for (std::int64_t j = j0; j < j1; ++j) {
      const double aj = a[std::size_t(j)];
      const double* vj = &g.v[std::size_t(j * dv)];
      for (std::int64_t c = 0; c < dv; ++c) {
        if (aj > 0) wo[std::size_t(c)] += aj * std::fabs(vj[c] - o[std::size_t(c)]);
        mo[std::size_t(c)] += std::fabs(vj[c]);
      }
    }
    for (std::int64_t c = 0; c < dv; ++c) {
      const std::size_t at = o_shape_.at(bq, token, h, c);
      out_->o[at] = clean(wo[std::size_t(c)]);
      out_->o_overflow[at] = row_ovf || mo[std::size_t(c)] >= kFltMax;
    }
    const std::size_t lse_at = lse_shape_.at(bq, h, token, 0);
    out_->lse[lse_at] = conditioned ? clean(lse_err) : 0.0;
    out_->lse_overflow[lse_at] = row_ovf;
  }

  void run_head(std::int64_t b, std::int64_t h, const kernel::MaskRule& mask, Group& g) {
    const std::int64_t lq = mask.s_q, dqk = a_.d_qk, dv = a_.d_v;
    const DType dt = p_.dtype;
    const double scale = p_.scale;
    const double w = p_.dtype == DType::f32 ? kU : 2 * kU;  // see fp32_gamma
    const double gamma_s = fp32_gamma(double(dqk), w), gamma_4 = fp32_gamma(4, w);
    const double gamma_v = fp32_gamma(double(dv + 2));
    const kernel::SequenceSpan q_span = a_.q_seq.span(a_.q_st, b);
    const std::int64_t first_q = a_.q_seq.first_token(b), bq = a_.q_seq.batch_index(b);
    const auto nqk = static_cast<std::size_t>(dqk), nv = static_cast<std::size_t>(dv);
    const auto nk = static_cast<std::size_t>(mask.s_kv);
    std::vector<double> q(nqk), o(nv), od(nv), d_o(nv), s(nk), e(nk), a(nk), prob(nk), wdq(nqk), mdq(nqk);

    for (std::int64_t i = 0; i < lq; ++i) {
      const std::int64_t j0 = mask.key_begin(i), j1 = mask.key_end(i);
      if (j1 <= j0) continue;  // sees no key: every output is exact (0, -inf)
      load_row(a_.q, dt, kernel::row_offset(q_span, a_.q_st, i, h), a_.q_st.d, dqk, q.data());
      if (backward_) {
        load_row(a_.d_o, dt, kernel::row_offset(a_.q_seq.span(a_.do_st, b), a_.do_st, i, h), a_.do_st.d, dv,
                 d_o.data());
        if (given_o_) {
          load_row(a_.o, dt, kernel::row_offset(a_.q_seq.span(a_.o_st, b), a_.o_st, i, h), a_.o_st.d, dv, od.data());
        } else {
          std::fill(od.begin(), od.end(), g.v_norm_max / std::sqrt(double(dv)));  // |O| <= max_j |V_j|
        }
      }
      if (skip_row(q, j0, j1, gamma_s, gamma_4, gamma_v, d_o, od, g)) continue;

      // Scores S_j, their bounds E_j and the row max; keys whose score is -inf (an infinite
      // input) have P = 0 in every evaluation and are left out.
      double m = -kInf, amax = 0, raw = 0;
      bool row_finite = true;
      std::int64_t jstar = -1;
      for (std::int64_t j = j0; j < j1; ++j) {
        const double* kj = &g.k[std::size_t(j * dqk)];
        const double sj = scale * dot(q.data(), kj, dqk);
        s[std::size_t(j)] = sj;
        if (std::isnan(sj) || sj == kInf) row_finite = false;
        if (!std::isfinite(sj)) continue;
        const double r = abs_dot(q.data(), kj, dqk);
        e[std::size_t(j)] = scale * r;  // the |scale q.k| term sum for now
        raw = std::max(raw, r);
        amax = std::max(amax, scale * r);
        if (sj > m) m = sj, jstar = j;
      }
      if (!row_finite || jstar < 0) continue;  // the reference is NaN (or the row has no finite score)
      const bool row_ovf = (1 + fp32_gamma(double(dqk + 8))) * std::max(1.0, scale * kLog2e) * raw >= kFltMax;
      // E_j: the dot product's d roundings of terms up to scale |q||k_j|, and 4 more of a value
      // up to |S_j| + max|S| (the scale and its own fp32 rounding, a base-2 factor, the
      // subtraction of the row max or LSE).
      double e_max = 0;
      for (std::int64_t j = j0; j < j1; ++j)
        if (std::isfinite(s[std::size_t(j)])) {
          double& ej = e[std::size_t(j)];
          ej = gamma_s * ej + gamma_4 * (ej + amax);
          e_max = std::max(e_max, ej);
        }
      // Rows whose every score bound is below kGate keep the tensor's tolerance: no allowance.
      const bool conditioned = e_max >= kGate;
      const LogSums up = log_sums(s, e, j0, j1, m, +1), down = log_sums(s, e, j0, j1, m, -1);
      const double lse = m + up.log_total_at_zero;
      // Lambda: the largest log l the backend's own scores (S_k + sigma_k, |sigma_k| <= E_k)
      // can give: its row max m' >= m - E_{j*}.
      double lambda_sum = 0, lse_up = 0;
      for (std::int64_t j = j0; j < j1; ++j) {
        const double sj = s[std::size_t(j)];
        if (!std::isfinite(sj)) continue;
        lse_up += std::exp(sj - lse + e[std::size_t(j)] - e_max);
        if (j != jstar) lambda_sum += std::exp(std::min(0.0, sj - m + e[std::size_t(j)] + e[std::size_t(jstar)]));
      }
      const double lambda = std::log1p(lambda_sum);
      // The softmax of key j under scores moved by sigma: between
      //   lo = 1 / (1 + R+_j e^{E_j}) and hi = 1 / (1 + R-_j e^{-E_j}),
      // R+-_j = sum_{k != j} P_k e^{+-E_k} / P_j.
      for (std::int64_t j = j0; j < j1; ++j) {
        const double sj = s[std::size_t(j)];
        if (!std::isfinite(sj)) {
          prob[std::size_t(j)] = a[std::size_t(j)] = 0;
          continue;
        }
        const double pj = std::exp(sj - lse);
        const double ej = e[std::size_t(j)];
        const double hi = logistic_neg(down.log_others(j, sj - m - ej) - (sj - m) - ej);
        const double lo = logistic_neg(up.log_others(j, sj - m + ej) - (sj - m) + ej);
        prob[std::size_t(j)] = pj;
        a[std::size_t(j)] = conditioned ? std::max({0.0, hi - pj, pj - lo}) : 0.0;
      }

      // O (exact), when the forward's allowances or D need it.
      const bool need_o = forward_ || !given_o_;
      std::fill(o.begin(), o.end(), 0.0);
      for (std::int64_t j = j0; j < j1 && need_o; ++j) {
        const double pj = prob[std::size_t(j)];
        if (pj == 0) continue;
        const double* vj = &g.v[std::size_t(j * dv)];
        for (std::int64_t c = 0; c < dv; ++c) o[std::size_t(c)] += pj * vj[c];
      }
      if (forward_) write_forward(bq, first_q + i, h, j0, j1, o, a, e_max + std::log(lse_up), conditioned, row_ovf, g);
      if (!backward_) continue;

      // Backward (dO and the given O were loaded above).
      if (!given_o_) od = o;
      const double delta = dot(d_o.data(), od.data(), dv);
      const double delta_abs = abs_dot(d_o.data(), od.data(), dv);
      const double d_bound = (1 + gamma_v) * delta_abs;
      // the backend's row max exceeds key j's score by at most lead_j
      double top = -kInf, top_other = -kInf;
      for (std::int64_t j = j0; j < j1; ++j) {
        const double sj = s[std::size_t(j)];
        if (!std::isfinite(sj)) continue;
        top = std::max(top, sj + e[std::size_t(j)]);
        if (j != jstar) top_other = std::max(top_other, sj + e[std::size_t(j)]);
      }
      const double n = double(j1 - j0);
      const double t_row =
          std::min(4 * kU * (std::fabs(lse) + e_max), 2 * lambda) + std::min(fp32_gamma(2 * n + 8), 4 * lambda);
      const double grow = std::max(1.0, scale);  // a gradient sum may be scaled after it is formed
      std::fill(wdq.begin(), wdq.end(), 0.0);
      std::fill(mdq.begin(), mdq.end(), 0.0);
      bool dq_ovf = false;
      for (std::int64_t j = j0; j < j1; ++j) {
        const double sj = s[std::size_t(j)];
        if (!std::isfinite(sj)) continue;
        const double* vj = &g.v[std::size_t(j * dv)];
        const double* kj = &g.k[std::size_t(j * dqk)];
        const double pj = prob[std::size_t(j)], aj = a[std::size_t(j)];
        const double dp = dot(d_o.data(), vj, dv);
        const double dp_abs = abs_dot(d_o.data(), vj, dv);
        // |S - LSE| as the backend forms it: its own row max leads key j by at most `lead`
        const double ej = e[std::size_t(j)];
        const double lead = std::max(0.0, (j == jstar ? top_other : top) - sj + ej);
        const double t = t_row + 2 * kU * (lead + 2 * lambda + 1);
        const double pi = !conditioned ? 0.0 : pj + aj > 0 ? aj + (pj + aj) * std::expm1(t) : aj;
        const double pb = pj + aj > 0 ? aj + (pj + aj) * std::expm1(t) : aj;  // for the bounds
        // dS = P (dP - D): the change of P times |dP - D|, and the fp32 errors of dP and D (where
        // the two cancel, on a row that sees one key, dS is 0 and its fp32 value their noise)
        const double ds_err =
            conditioned ? pi * std::fabs(dp - delta) + (pj + pi) * gamma_v * (dp_abs + delta_abs) : 0.0;
        const double ds_bound = (pj + pb) * ((1 + gamma_v) * dp_abs + d_bound);
        const bool pair_ovf = row_ovf || (1 + gamma_v) * dp_abs >= kFltMax || d_bound >= kFltMax || ds_bound >= kFltMax;
        if (pair_ovf) {
          dq_ovf = true;
          g.ovf[std::size_t(j)] = 1;
        }
        double* wdk = &g.wdk[std::size_t(j * dqk)];
        double* mdk = &g.mdk[std::size_t(j * dqk)];
        for (std::int64_t c = 0; c < dqk; ++c) {
          wdq[std::size_t(c)] += scale * ds_err * std::fabs(kj[c]);
          mdq[std::size_t(c)] += grow * ds_bound * std::fabs(kj[c]);
          wdk[c] += scale * ds_err * std::fabs(q[std::size_t(c)]);
          mdk[c] += grow * ds_bound * std::fabs(q[std::size_t(c)]);
        }
        double* wdv = &g.wdv[std::size_t(j * dv)];
        double* mdv = &g.mdv[std::size_t(j * dv)];
        for (std::int64_t c = 0; c < dv; ++c) {
          wdv[c] += pi * std::fabs(d_o[std::size_t(c)]);
          mdv[c] += (pj + pb) * std::fabs(d_o[std::size_t(c)]);
        }
      }
      for (std::int64_t c = 0; c < dqk; ++c) {
        const std::size_t at = dq_shape_.at(bq, first_q + i, h, c);
        out_->dq[at] = clean(wdq[std::size_t(c)]);
        out_->dq_overflow[at] = dq_ovf || mdq[std::size_t(c)] >= kFltMax;
      }
    }
  }

  const Problem& p_;
  const kernel::AttentionParams a_;
  const bool forward_, backward_, given_o_;
  Logical4 o_shape_, lse_shape_, dq_shape_, dk_shape_, dv_shape_;
  Conditioning* out_ = nullptr;
};

}  // namespace

Conditioning conditioning(const detail::Problem& problem, bool forward, bool backward, bool given_o) {
  return Pass(problem, forward, backward, given_o && problem.is_backward() && problem.o.data != nullptr).run();
}

}  // namespace strideattn::harness
