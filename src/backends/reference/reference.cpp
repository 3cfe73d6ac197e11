// The `reference` backend and reference_compute(): the executable specification of
// docs/semantics.md. Plain loops over (sequence, query head), reading every tensor through
// its real strides (make_params + the shared MaskRule / SequenceTable / row_offset /
// kv_head_of of common/attention_math.hpp). Two precisions share one engine, templated on
// the accumulation type: double (exact) and float (the naive low-precision model of
// docs/semantics.md, with the dtype roundings at the points it names).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <new>
#include <thread>
#include <type_traits>

#include "backends/reference/reference.hpp"
#include "backends/reference/reference_features.hpp"
#include "backends/reference/reference_kvcache.hpp"
#include "common/attention_math.hpp"
#include "common/dtype.hpp"
#include "dispatch/backend.hpp"
#include "dispatch/select.hpp"
#include "problem/params.hpp"

namespace strideattn::detail {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Where the backward pass takes O (for D = rowsum(dO * O)) from.
enum class BackwardSource {
  recompute,  // this engine's own forward O (fp64 exact, or the naive model's rounded O)
  given_o,    // O as the caller passed it (docs/semantics.md "Backward")
};

// Row-major index into a logical [n0, n1, n2, n3] array.
struct Logical4 {
  std::int64_t n0 = 0, n1 = 0, n2 = 0, n3 = 0;
  [[nodiscard]] std::int64_t size() const { return n0 * n1 * n2 * n3; }
  [[nodiscard]] std::int64_t at(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) const {
    return ((a * n1 + b) * n2 + c) * n3 + d;
  }
};
Logical4 logical_of(const TensorView& t) { return {t.shape[kBatch], t.shape[kSeq], t.shape[kHead], t.shape[kHeadDim]}; }

// Dot product with four independent partial sums (the order is irrelevant for the fp64
// reference, and the naive fp32 model does not prescribe one; this keeps the loop fast).
template <class Acc>
Acc dot(const Acc* a, const Acc* b, std::int64_t n) {
  Acc s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

template <class Acc>
Acc dot_reversed(const Acc* a, const Acc* b, std::int64_t n) {
  Acc s = 0;
  for (std::int64_t i = n - 1; i >= 0; --i) s += a[i] * b[i];
  return s;
}

template <class Acc>
void axpy(Acc alpha, const Acc* x, Acc* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Loads `n` elements of a row, `step` (the head-dim stride) apart, as Acc.
template <class Acc>
void load_row(const void* base, DType dtype, std::int64_t offset, std::int64_t step, std::int64_t n, Acc* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<Acc>(load_as_float(base, dtype, offset + i * step));
}

// Runs task(i) for i in [0, n) on up to hardware_concurrency threads. Exceptions (out of
// memory) are caught in the workers and rethrown on the caller's thread.
template <class Fn>
void parallel_for(std::int64_t n, double work, Fn&& task) {
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  std::int64_t threads = std::min<std::int64_t>(hw, n);
  if (work < 2e6) threads = 1;  // small problems: thread start-up would dominate
  if (threads <= 1) {
    for (std::int64_t i = 0; i < n; ++i) task(i);
    return;
  }
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (;;) {
      const std::int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        task(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(std::size_t(threads - 1));
  try {
    for (std::int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  } catch (...) {
    // Could not start more threads: the ones started plus this one do the work.
  }
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

template <class Acc>
class Engine {
 public:
  Engine(const Problem& p, BackwardSource source) : p_(p), a_(make_params(p)), source_(source), f_(p) {}

  ReferenceOutputs run() {
    ReferenceOutputs out;
    const Logical4 o_shape = logical_of(p_.o);
    out.o.assign(std::size_t(o_shape.size()), 0.0);
    lse_shape_ = {p_.q.shape[kBatch], p_.heads, p_.q.shape[kSeq], 1};
    out.lse.assign(std::size_t(lse_shape_.size()), kNegInf);
    if (p_.is_backward()) {
      out.dq.assign(std::size_t(logical_of(p_.dq).size()), 0.0);
      out.dk.assign(std::size_t(logical_of(p_.dk).size()), 0.0);
      out.dv.assign(std::size_t(logical_of(p_.dv).size()), 0.0);
    }
    if (p_.max_logit_on) out.max_logit.assign(std::size_t(a_.batch * a_.heads), kNegInf);
    const bool bwd = p_.is_backward();
    if (bwd && p_.dbias_on) out.dbias.assign(std::size_t(f_.dbias_size()), 0.0);
    if (bwd && p_.d_sinks_on) out.d_sinks.assign(std::size_t(a_.heads), 0.0);
    out_ = &out;
    if (a_.heads <= 0 || a_.kv_heads <= 0 || a_.heads % a_.kv_heads != 0) return out;  // no heads

    // Tasks ordered (sequence, kv head, query head of the group) so that the members of a
    // GQA group finish close together and their dK/dV partials can be reduced and freed.
    const std::int64_t group = p_.group_size();
    const std::int64_t groups = a_.batch * a_.kv_heads;
    const std::int64_t tasks = groups * group;
    if (bwd && p_.dbias_on) dbias_parts_.assign(std::size_t(tasks), {});
    if (bwd && p_.d_sinks_on) sink_parts_.assign(std::size_t(tasks), Acc(0));
    if (p_.is_backward()) {
      partials_.assign(std::size_t(tasks), {});
      remaining_ = std::vector<std::atomic<std::int64_t>>(std::size_t(groups));
      for (auto& r : remaining_) r.store(group);
    }
    const double work = p_.visible_pairs() * double(p_.d_qk + p_.d_v) * (p_.is_backward() ? 3.0 : 1.0);
    parallel_for(tasks, work, [&](std::int64_t t) {
      if (cancelled()) return;
      const std::int64_t g = t / group;
      const std::int64_t b = g / a_.kv_heads;
      const std::int64_t hk = g % a_.kv_heads;
      const std::int64_t h = hk * group + t % group;
      run_head(b, h, t);
      if (p_.is_backward() && remaining_[std::size_t(g)].fetch_sub(1) == 1) reduce_group(b, hk);
    });
    reduce_features(tasks, group);
    return out;
  }

  // True once the caller's cancel flag is set; the outputs are then incomplete.
  [[nodiscard]] bool cancelled() const { return p_.cancel != nullptr && p_.cancel->load(std::memory_order_relaxed); }

 private:
  struct Partial {
    std::vector<Acc> dk, dv;  // [L_kv, d_qk], [L_kv, d_v], unscaled sum of dS^T Q / P^T dO
  };

  // (sequence, query head) of task t, as run() orders the tasks.
  void task_head(std::int64_t t, std::int64_t group, std::int64_t* b, std::int64_t* h) const {
    const std::int64_t g = t / group;
    *b = g / a_.kv_heads;
    *h = (g % a_.kv_heads) * group + t % group;
  }

  // dBias and d_sink: the tasks' partials summed in task order (deterministic), rounded once.
  void reduce_features(std::int64_t tasks, std::int64_t group) {
    if (!dbias_parts_.empty()) {
      const std::int64_t slab = f_.slab_size();
      std::vector<Acc> sum(std::size_t(f_.dbias_size()), Acc(0));
      for (std::int64_t t = 0; t < tasks; ++t) {
        const auto& part = dbias_parts_[std::size_t(t)];
        if (part.empty()) continue;
        std::int64_t b = 0, h = 0;
        task_head(t, group, &b, &h);
        Acc* dst = &sum[std::size_t(f_.dbias_slab(b, h) * slab)];
        for (std::int64_t e = 0; e < slab; ++e) dst[e] += part[std::size_t(e)];
      }
      for (std::size_t e = 0; e < sum.size(); ++e) out_->dbias[e] = double(round_as(p_.dbias.dtype, sum[e]));
    }
    if (!sink_parts_.empty()) {
      std::vector<Acc> sum(std::size_t(a_.heads), Acc(0));
      for (std::int64_t t = 0; t < tasks; ++t) {
        std::int64_t b = 0, h = 0;
        task_head(t, group, &b, &h);
        sum[std::size_t(h)] += sink_parts_[std::size_t(t)];
      }
      for (std::int64_t h = 0; h < a_.heads; ++h) out_->d_sinks[std::size_t(h)] = double(sum[std::size_t(h)]);
    }
  }

  // The naive model rounds a feature output to its own dtype; exact never does.
  [[nodiscard]] static Acc round_as(DType dtype, Acc x) {
    if constexpr (std::is_same_v<Acc, float>) return round_to(dtype, x);
    return x;
  }

  static std::vector<Acc> zeros(std::int64_t n) { return std::vector<Acc>(std::size_t(n), Acc(0)); }

  // The naive model rounds to the dtype at the points docs/semantics.md names; exact never does.
  [[nodiscard]] Acc round(Acc x) const {
    if constexpr (std::is_same_v<Acc, float>) return round_to(p_.dtype, x);
    return x;
  }

  void run_head(std::int64_t b, std::int64_t h, std::int64_t task) {
    const kernel::MaskRule mask = a_.mask(b);
    const std::int64_t lq = mask.s_q, lk = mask.s_kv;
    const std::int64_t dqk = a_.d_qk, dv = a_.d_v;
    const std::int64_t hk = kernel::kv_head_of(h, a_.heads, a_.kv_heads);
    const kernel::SequenceSpan q_span = a_.q_seq.span(a_.q_st, b);
    const kernel::SequenceSpan k_span = a_.kv_seq.span(a_.k_st, b);
    const kernel::SequenceSpan v_span = a_.kv_seq.span(a_.v_st, b);
    const bool backward = p_.is_backward();
    const DType dt = p_.dtype;

    // K and V of this sequence and KV head, contiguous.
    std::vector<Acc> k = zeros(lk * dqk), v = zeros(lk * dv);
    for (std::int64_t j = 0; j < lk; ++j) {
      load_row(a_.k, dt, kernel::row_offset(k_span, a_.k_st, j, hk), a_.k_st.d, dqk, &k[std::size_t(j * dqk)]);
      load_row(a_.v, dt, kernel::row_offset(v_span, a_.v_st, j, hk), a_.v_st.d, dv, &v[std::size_t(j * dv)]);
    }
    Partial* part = nullptr;
    if (backward) {
      part = &partials_[std::size_t(task)];
      part->dk.assign(std::size_t(lk * dqk), Acc(0));
      part->dv.assign(std::size_t(lk * dv), Acc(0));
    }

    const Acc scale = static_cast<Acc>(p_.scale);
    std::vector<Acc> q = zeros(dqk), o = zeros(dv), d_o = zeros(dv), dq = zeros(dqk), s = zeros(lk), prob = zeros(lk);
    std::vector<Acc> th = zeros(f_.softcap() ? lk : 0);  // tanh(T / c) of each key (softcap)
    std::vector<Acc>* dbias = nullptr;
    if (!dbias_parts_.empty()) {
      dbias = &dbias_parts_[std::size_t(task)];
      dbias->assign(std::size_t(f_.slab_size()), Acc(0));
    }
    const Acc cap = static_cast<Acc>(f_.cap());
    const Acc sink = f_.sinks() ? static_cast<Acc>(f_.sink(h)) : Acc(0);
    Acc max_logit = -std::numeric_limits<Acc>::infinity();
    const Logical4 o_shape = logical_of(p_.o);
    const std::int64_t first_q = a_.q_seq.first_token(b), bq = a_.q_seq.batch_index(b);

    for (std::int64_t i = 0; i < lq; ++i) {
      if (cancelled()) return;  // the caller's cancel flag: checked once per query row
      const std::int64_t j0 = mask.key_begin(i), j1 = mask.key_end(i);
      if (j1 <= j0) continue;  // sees no key: O = 0, LSE = -inf, dQ = 0 (pre-filled)
      load_row(a_.q, dt, kernel::row_offset(q_span, a_.q_st, i, h), a_.q_st.d, dqk, q.data());

      // The logit L of docs/semantics.md "Training features": T = scale (q.k + pre-scale
      // bias), U = c tanh(T / c) with a softcap, L = U + post-scale bias + ALiBi. Then the
      // softmax (max-subtracted, the sink in the denominator), LSE natural log.
      Acc m = -std::numeric_limits<Acc>::infinity();
      for (std::int64_t j = j0; j < j1; ++j) {
        const Acc qk = dot(q.data(), &k[std::size_t(j * dqk)], dqk);
        Acc t = f_.pre_bias() ? scale * (qk + static_cast<Acc>(f_.bias(b, h, i, j))) : scale * qk;
        if (f_.softcap()) {
          th[std::size_t(j)] = std::tanh(t / cap);
          t = cap * th[std::size_t(j)];
        }
        if (f_.post_bias()) t += static_cast<Acc>(f_.bias(b, h, i, j));
        if (f_.alibi()) t += static_cast<Acc>(f_.alibi_term(b, h, i, j, lq, lk));
        s[std::size_t(j)] = t;
        m = std::max(m, t);
        if (!std::isnan(t)) max_logit = std::max(max_logit, t);
      }
      if (f_.sinks()) m = std::max(m, sink);
      Acc l = f_.sinks() ? std::exp(sink - m) : Acc(0);
      for (std::int64_t j = j0; j < j1; ++j) {
        prob[std::size_t(j)] = std::exp(s[std::size_t(j)] - m);
        l += prob[std::size_t(j)];
      }
      const Acc lse = m + std::log(l);
      for (std::int64_t j = j0; j < j1; ++j) prob[std::size_t(j)] /= l;

      // O = round(Z P) . V, rounded (naive model); exact: O = Z P . V (Z: dropout's weight).
      std::fill(o.begin(), o.end(), Acc(0));
      for (std::int64_t j = j0; j < j1; ++j)
        axpy(round(prob[std::size_t(j)] * keep_weight(b, h, i, j)), &v[std::size_t(j * dv)], o.data(), dv);
      for (auto& x : o) x = round(x);
      for (std::int64_t d = 0; d < dv; ++d)
        out_->o[std::size_t(o_shape.at(bq, first_q + i, h, d))] = double(o[std::size_t(d)]);
      out_->lse[std::size_t(lse_shape_.at(bq, h, first_q + i, 0))] = double(lse);

      if (!backward) continue;

      // Backward. P is this row's softmax from above (what the given LSE reproduces; taking P
      // from a given fp32 LSE would make the target inherit that LSE's error as a
      // normalization error). O, for D, is this row's O from above or the caller's.
      if (source_ == BackwardSource::given_o)
        load_row(a_.o, dt, kernel::row_offset(a_.q_seq.span(a_.o_st, b), a_.o_st, i, h), a_.o_st.d, dv, o.data());
      load_row(a_.d_o, dt, kernel::row_offset(a_.q_seq.span(a_.do_st, b), a_.do_st, i, h), a_.do_st.d, dv, d_o.data());
      // rowsum(dO * O); naive: summed last to first, because no backward computes it in the
      // order of its dP = dO V^T (a separate pass and a GEMM): where O equals a V row (rows
      // that see one key) dP - D cancels exactly only in a shared order, and the model's
      // error must show the fp32 noise of that cancellation, which grows with the inputs
      const Acc delta =
          std::is_same_v<Acc, float> ? dot_reversed(d_o.data(), o.data(), dv) : dot(d_o.data(), o.data(), dv);
      std::fill(dq.begin(), dq.end(), Acc(0));
      if (!sink_parts_.empty()) sink_parts_[std::size_t(task)] -= std::exp(sink - lse) * delta;  // -P_sink D
      for (std::int64_t j = j0; j < j1; ++j) {
        // naive: P from the fp32 LSE, as any backward must that takes LSE as its input (at
        // large logits the LSE's rounding is most of this model's error, and of a backend's)
        const Acc pj = std::is_same_v<Acc, float> ? std::exp(s[std::size_t(j)] - lse) : prob[std::size_t(j)];
        const Acc zj = keep_weight(b, h, i, j);
        axpy(round(pj * zj), d_o.data(), &part->dv[std::size_t(j * dv)], dv);  // dV += (Z P)^T dO
        const Acc dp = dot(d_o.data(), &v[std::size_t(j * dv)], dv);           // dP = dO V^T
        const Acc dl = pj * (zj * dp - delta);                                 // dL, the logit's gradient
        const Acc dt = f_.softcap() ? dl * (Acc(1) - th[std::size_t(j)] * th[std::size_t(j)]) : dl;
        if (dbias) (*dbias)[std::size_t(f_.dbias_row(i, j))] += f_.pre_bias() ? scale * dt : dl;
        const Acc ds = round(dt);                                  // dS
        axpy(ds, &k[std::size_t(j * dqk)], dq.data(), dqk);        // dQ += dS K
        axpy(ds, q.data(), &part->dk[std::size_t(j * dqk)], dqk);  // dK += dS^T Q
      }
      const Logical4 dq_shape = logical_of(p_.dq);
      for (std::int64_t d = 0; d < dqk; ++d)
        out_->dq[std::size_t(dq_shape.at(bq, first_q + i, h, d))] = double(round(scale * dq[std::size_t(d)]));
    }
    if (!out_->max_logit.empty()) out_->max_logit[std::size_t(b * a_.heads + h)] = double(max_logit);
  }

  // Dropout's weight Z of P[b, h, i, j]: 1 / (1 - p) kept, 0 dropped; 1 without dropout.
  [[nodiscard]] Acc keep_weight(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    if (!f_.dropout()) return Acc(1);
    return f_.keep(b, h, i, j) ? static_cast<Acc>(f_.keep_scale()) : Acc(0);
  }

  // dK/dV of one KV head: the group's per-head partials summed in head order (in Acc),
  // scaled, rounded once. Keys no query saw stay 0.
  void reduce_group(std::int64_t b, std::int64_t hk) {
    const std::int64_t group = p_.group_size();
    const std::int64_t lk = a_.kv_seq.length(b);
    const std::int64_t dqk = a_.d_qk, dv = a_.d_v;
    const std::int64_t first_k = a_.kv_seq.first_token(b), bk = a_.kv_seq.batch_index(b);
    const std::int64_t t0 = (b * a_.kv_heads + hk) * group;
    const Acc scale = static_cast<Acc>(p_.scale);
    const Logical4 dk_shape = logical_of(p_.dk), dv_shape = logical_of(p_.dv);
    std::vector<Acc> sum_k = zeros(dqk), sum_v = zeros(dv);
    for (std::int64_t j = 0; j < lk; ++j) {
      std::fill(sum_k.begin(), sum_k.end(), Acc(0));
      std::fill(sum_v.begin(), sum_v.end(), Acc(0));
      for (std::int64_t g = 0; g < group; ++g) {
        const Partial& pt = partials_[std::size_t(t0 + g)];
        axpy(Acc(1), &pt.dk[std::size_t(j * dqk)], sum_k.data(), dqk);
        axpy(Acc(1), &pt.dv[std::size_t(j * dv)], sum_v.data(), dv);
      }
      for (std::int64_t d = 0; d < dqk; ++d)
        out_->dk[std::size_t(dk_shape.at(bk, first_k + j, hk, d))] = double(round(scale * sum_k[std::size_t(d)]));
      for (std::int64_t d = 0; d < dv; ++d)
        out_->dv[std::size_t(dv_shape.at(bk, first_k + j, hk, d))] = double(round(sum_v[std::size_t(d)]));
    }
    for (std::int64_t g = 0; g < group; ++g) partials_[std::size_t(t0 + g)] = Partial{};
  }

  const Problem& p_;
  const kernel::AttentionParams a_;
  const BackwardSource source_;
  Logical4 lse_shape_;
  ReferenceOutputs* out_ = nullptr;
  std::vector<Partial> partials_;                     // one per (sequence, query head) task
  std::vector<std::atomic<std::int64_t>> remaining_;  // tasks left per (sequence, kv head)
  const RefFeatures f_;
  std::vector<std::vector<Acc>> dbias_parts_;  // per task: its [b, h] slab of dBias
  std::vector<Acc> sink_parts_;                // per task: its part of d_sink[h]
};

// `*cancelled` (when given) tells whether the caller's cancel flag stopped the computation.
ReferenceOutputs compute(const Problem& problem, RefPrecision precision, BackwardSource source,
                         bool* cancelled = nullptr) {
  if (source == BackwardSource::given_o && (!problem.is_backward() || problem.o.data == nullptr))
    source = BackwardSource::recompute;
  if (precision == RefPrecision::naive_lowp) {
    Engine<float> engine(problem, source);
    ReferenceOutputs out = engine.run();
    if (cancelled) *cancelled = engine.cancelled();
    return out;
  }
  Engine<double> engine(problem, source);
  ReferenceOutputs out = engine.run();
  if (cancelled) *cancelled = engine.cancelled();
  return out;
}

Status cancelled_status(const char* what) {
  return Status(StatusCode::cancelled, std::string("reference ") + what +
                                           ": cancelled by the caller's cancel flag; nothing "
                                           "was written");
}

// Writes a logical row-major array into a strided output view, rounding to its dtype.
void store_view(const std::vector<double>& values, const TensorView& view) {
  const Logical4 shape = logical_of(view);
  for (std::int64_t b = 0; b < shape.n0; ++b)
    for (std::int64_t s = 0; s < shape.n1; ++s)
      for (std::int64_t h = 0; h < shape.n2; ++h) {
        const std::int64_t base = b * view.stride[kBatch] + s * view.stride[kSeq] + h * view.stride[kHead];
        for (std::int64_t d = 0; d < shape.n3; ++d)
          store_from_float(view.data, view.dtype, base + d * view.stride[kHeadDim],
                           static_cast<float>(values[std::size_t(shape.at(b, s, h, d))]));
      }
}

// dBias: the logical [B, H, SQ, SKV] array into its strided view.
void store_bias(const std::vector<double>& values, const BiasView& view) {
  const auto& n = view.shape;
  std::size_t e = 0;
  for (std::int64_t b = 0; b < n[0]; ++b)
    for (std::int64_t h = 0; h < n[1]; ++h)
      for (std::int64_t i = 0; i < n[2]; ++i)
        for (std::int64_t j = 0; j < n[3]; ++j, ++e)
          store_from_float(view.data, view.dtype,
                           b * view.stride[0] + h * view.stride[1] + i * view.stride[2] + j * view.stride[3],
                           static_cast<float>(values[e]));
}

// A logical [rows, h] fp32 table into its strided view.
void store_head(const std::vector<double>& values, const HeadView& view) {
  for (std::int64_t r = 0; r < view.shape[0]; ++r)
    for (std::int64_t h = 0; h < view.shape[1]; ++h)
      view.data[r * view.stride[0] + h * view.stride[1]] =
          static_cast<float>(values[std::size_t(r * view.shape[1] + h)]);
}

void store_lse(const std::vector<double>& values, const LseView& view) {
  const std::int64_t n0 = view.shape[0], n1 = view.shape[1], n2 = view.shape[2];
  for (std::int64_t b = 0; b < n0; ++b)
    for (std::int64_t h = 0; h < n1; ++h)
      for (std::int64_t s = 0; s < n2; ++s)
        view.data[b * view.stride[0] + h * view.stride[1] + s * view.stride[2]] =
            static_cast<float>(values[std::size_t((b * n1 + h) * n2 + s)]);
}

class ReferenceBackend final : public BackendImpl {
 public:
  [[nodiscard]] Backend id() const override { return Backend::reference; }
  // Host memory: a plan's run reads cu_seqlens arrays into the lists (problem/cu_seqlens.cpp).
  [[nodiscard]] bool reads_cu_seqlens() const override { return true; }
  [[nodiscard]] bool runs_kv_cache() const override { return true; }
  [[nodiscard]] Status forward_kvcache(const KvCacheProblem& problem) override {
    return reference_kvcache_forward(problem);
  }

  [[nodiscard]] Verdict supports(const Problem& problem) const override {
    // fp64 loops, ~13 GFLOP/s on the 2-core CI machine (bench/README.md): 1e14 is ~2 hours.
    static const std::vector<SupportRule> rules{memory_rule(Memory::host), work_rule(1e14, 1.3e10)};
    return evaluate_rules(Backend::reference, rules, problem);
  }

  [[nodiscard]] Status forward(const Problem& problem) override {
    try {
      bool stopped = false;
      ReferenceOutputs out = compute(problem, RefPrecision::exact, BackwardSource::recompute, &stopped);
      if (stopped) return cancelled_status("forward");
      store_view(out.o, problem.o);
      if (problem.writes_lse()) store_lse(out.lse, problem.lse);
      if (problem.max_logit_on) store_head(out.max_logit, problem.max_logit);
      return Status::Ok();
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::backend_error, "reference: out of host memory");
    }
  }

  [[nodiscard]] Status backward(const Problem& problem) override {
    if (problem.lse.data == nullptr)
      return Status(StatusCode::invalid_argument,
                    "reference backward: lse is null; the backward needs the forward's LSE");
    try {
      bool stopped = false;
      ReferenceOutputs out = compute(problem, RefPrecision::exact, BackwardSource::given_o, &stopped);
      if (stopped) return cancelled_status("backward");
      store_view(out.dq, problem.dq);
      store_view(out.dk, problem.dk);
      store_view(out.dv, problem.dv);
      if (problem.dbias_on) store_bias(out.dbias, problem.dbias);
      if (problem.d_sinks_on) store_head(out.d_sinks, problem.d_sinks);
      return Status::Ok();
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::backend_error, "reference: out of host memory");
    }
  }
};

}  // namespace

ReferenceOutputs reference_compute(const Problem& problem, RefPrecision precision) {
  return compute(problem, precision, BackwardSource::recompute);
}

ReferenceOutputs reference_compute(const Problem& problem, RefPrecision precision, RefBackwardInputs inputs) {
  return compute(problem, precision,
                 inputs == RefBackwardInputs::given_o ? BackwardSource::given_o : BackwardSource::recompute);
}

RefBackwardInputs backward_targets(DType dtype) {
  return dtype == DType::f32 ? RefBackwardInputs::recompute : RefBackwardInputs::given_o;
}

BackendImpl* reference_backend() {
  static ReferenceBackend instance;
  return &instance;
}

}  // namespace strideattn::detail
