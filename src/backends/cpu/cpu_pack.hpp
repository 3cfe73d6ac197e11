// fp32 copies of the operands a call re-reads many times, made once per call (in parallel)
// so the tile loops read contiguous fp32 instead of converting f16/bf16 strided rows again
// for every (query tile, key tile) pair; that conversion cost as much as the tile GEMMs.
// Per (sequence, head) the pack holds, for the heads and operands asked for:
//   K^T per key tile  [tile][d_qk][kBlockKeys]  (S = Q K^T rows are contiguous)
//   K rows            [key][d_qk]               (dQ += dS K)
//   V rows            [key][d_v]                (O += P V)
//   V^T per key tile  [tile][d_v][kBlockKeys]   (dP = dO V^T)
//   Q rows (scaled)   [row][d_qk], dO rows [row][d_v]   (backward)
// Key tiles start at multiples of kBlockKeys; entries past a sequence's end are 0. When the
// pack would exceed pack_budget() the caller converts tile by tile instead.
#pragma once

#include <algorithm>
#include <atomic>
#include <new>
#include <cstdint>
#include <vector>

#include "backends/cpu/cpu_common.hpp"

namespace strideattn::detail::cpu {

// Up to 1 GiB of fp32 copies (a few times the inputs): far below the host memory of any
// machine that runs attention this large on a CPU, and beyond it the per-tile path is used.
inline constexpr std::int64_t kPackBudgetBytes = std::int64_t{1} << 30;

// The budget in force; tests lower it to 0 to run the per-tile path on any problem.
inline std::atomic<std::int64_t>& pack_budget() {
  static std::atomic<std::int64_t> budget{kPackBudgetBytes};
  return budget;
}

struct PackRequest {
  bool k_t = false, k_rows = false, v_rows = false, v_t = false;  // per KV head
  bool q_rows = false, do_rows = false;                           // per query head
};

class Pack {
 public:
  // Builds the requested copies with up to `threads` threads. Returns false (holding
  // nothing) when they would exceed the budget or a worker failed.
  [[nodiscard]] bool build(const kernel::AttentionParams& a, DType dt, PackRequest what, int threads) {
    a_ = &a;
    const std::int64_t dq = a.d_qk, dv = a.d_v;
    const std::int64_t kv_unit =
        (what.k_t ? dq : 0) + (what.k_rows ? dq : 0) + (what.v_rows ? dv : 0) + (what.v_t ? dv : 0);
    const std::int64_t q_unit = (what.q_rows ? dq : 0) + (what.do_rows ? dv : 0);
    seq_.assign(static_cast<std::size_t>(a.batch), {});
    std::int64_t total = 0;
    for (std::int64_t b = 0; b < a.batch; ++b) {
      Seq& s = seq_[static_cast<std::size_t>(b)];
      const std::int64_t kp = kernel::ceil_div(a.kv_seq.length(b), kBlockKeys) * kBlockKeys;
      const std::int64_t rows = a.q_seq.length(b);
      s.kv_start = total;
      s.kv_per_head = kp * kv_unit;
      std::int64_t off = 0;
      if (what.k_t) s.k_t = off, off += kp * dq;
      if (what.k_rows) s.k_rows = off, off += kp * dq;
      if (what.v_rows) s.v_rows = off, off += kp * dv;
      if (what.v_t) s.v_t = off, off += kp * dv;
      total += s.kv_per_head * a.kv_heads;
      s.q_start = total;
      s.q_per_head = rows * q_unit;
      off = 0;
      if (what.q_rows) s.q_rows = off, off += rows * dq;
      if (what.do_rows) s.do_rows = off, off += rows * dv;
      total += s.q_per_head * a.heads;
      if (total * std::int64_t(sizeof(float)) > pack_budget().load()) return false;
    }
    try {
      data_.assign(static_cast<std::size_t>(total), 0.f);
    } catch (const std::bad_alloc&) {
      return false;  // the per-tile path needs far less memory
    }
    what_ = what;
    // One job per (sequence, KV head) and per (sequence, query head).
    const std::int64_t kv_jobs = a.batch * a.kv_heads, jobs = kv_jobs + a.batch * a.heads;
    std::atomic<std::int64_t> next{0};
    const int n = static_cast<int>(kernel::max64(1, kernel::min64(threads, jobs)));
    return run_threads(n, [&](int) {
      std::vector<float> row(static_cast<std::size_t>(kernel::max64(dq, dv)));
      for (std::int64_t j = next++; j < jobs; j = next++) {
        if (j < kv_jobs)
          fill_kv(j / a.kv_heads, j % a.kv_heads, dt, row.data());
        else
          fill_q((j - kv_jobs) / a.heads, (j - kv_jobs) % a.heads, dt);
      }
    });
  }

  // Sequence b, KV head kvh, key tile starting at key c0 (a multiple of kBlockKeys); or
  // query head h, row r.
  [[nodiscard]] const float* k_t(std::int64_t b, std::int64_t kvh, std::int64_t c0) const {
    return kv(b, kvh) + seq(b).k_t + c0 * a_->d_qk;
  }
  [[nodiscard]] const float* k_rows(std::int64_t b, std::int64_t kvh, std::int64_t c0) const {
    return kv(b, kvh) + seq(b).k_rows + c0 * a_->d_qk;
  }
  [[nodiscard]] const float* v_rows(std::int64_t b, std::int64_t kvh, std::int64_t c0) const {
    return kv(b, kvh) + seq(b).v_rows + c0 * a_->d_v;
  }
  [[nodiscard]] const float* v_t(std::int64_t b, std::int64_t kvh, std::int64_t c0) const {
    return kv(b, kvh) + seq(b).v_t + c0 * a_->d_v;
  }
  [[nodiscard]] const float* q_rows(std::int64_t b, std::int64_t h, std::int64_t r) const {
    return qh(b, h) + seq(b).q_rows + r * a_->d_qk;
  }
  [[nodiscard]] const float* do_rows(std::int64_t b, std::int64_t h, std::int64_t r) const {
    return qh(b, h) + seq(b).do_rows + r * a_->d_v;
  }

 private:
  struct Seq {
    std::int64_t kv_start = 0, kv_per_head = 0, q_start = 0, q_per_head = 0;
    std::int64_t k_t = 0, k_rows = 0, v_rows = 0, v_t = 0, q_rows = 0, do_rows = 0;
  };
  [[nodiscard]] const Seq& seq(std::int64_t b) const { return seq_[static_cast<std::size_t>(b)]; }
  [[nodiscard]] const float* kv(std::int64_t b, std::int64_t kvh) const {
    return data_.data() + seq(b).kv_start + kvh * seq(b).kv_per_head;
  }
  [[nodiscard]] const float* qh(std::int64_t b, std::int64_t h) const {
    return data_.data() + seq(b).q_start + h * seq(b).q_per_head;
  }

  void fill_kv(std::int64_t b, std::int64_t kvh, DType dt, float* row) {
    const kernel::AttentionParams& a = *a_;
    const Seq& s = seq(b);
    float* base = data_.data() + s.kv_start + kvh * s.kv_per_head;
    const kernel::SequenceSpan k_span = a.kv_seq.span(a.k_st, b);
    const kernel::SequenceSpan v_span = a.kv_seq.span(a.v_st, b);
    const std::int64_t dq = a.d_qk, dv = a.d_v;
    for (std::int64_t j = 0; j < a.kv_seq.length(b); ++j) {
      const std::int64_t tile = j / kBlockKeys * kBlockKeys, col = j % kBlockKeys;
      if (what_.k_t || what_.k_rows) {
        load_row(a.k, dt, kernel::row_offset(k_span, a.k_st, j, kvh), a.k_st.d, dq, row);
        if (what_.k_rows) std::copy_n(row, dq, base + s.k_rows + j * dq);
        if (what_.k_t) {
          float* t = base + s.k_t + tile * dq + col;
          for (std::int64_t x = 0; x < dq; ++x) t[x * kBlockKeys] = row[x];
        }
      }
      if (what_.v_rows || what_.v_t) {
        load_row(a.v, dt, kernel::row_offset(v_span, a.v_st, j, kvh), a.v_st.d, dv, row);
        if (what_.v_rows) std::copy_n(row, dv, base + s.v_rows + j * dv);
        if (what_.v_t) {
          float* t = base + s.v_t + tile * dv + col;
          for (std::int64_t x = 0; x < dv; ++x) t[x * kBlockKeys] = row[x];
        }
      }
    }
  }

  void fill_q(std::int64_t b, std::int64_t h, DType dt) {
    const kernel::AttentionParams& a = *a_;
    const Seq& s = seq(b);
    float* base = data_.data() + s.q_start + h * s.q_per_head;
    const kernel::SequenceSpan q_span = a.q_seq.span(a.q_st, b);
    const kernel::SequenceSpan do_span = a.q_seq.span(a.do_st, b);
    for (std::int64_t i = 0; i < a.q_seq.length(b); ++i) {
      if (what_.q_rows)
        load_row(a.q, dt, kernel::row_offset(q_span, a.q_st, i, h), a.q_st.d, a.d_qk,
                 base + s.q_rows + i * a.d_qk);  // unscaled, like the tile path
      if (what_.do_rows)
        load_row(a.d_o, dt, kernel::row_offset(do_span, a.do_st, i, h), a.do_st.d, a.d_v, base + s.do_rows + i * a.d_v);
    }
  }

  const kernel::AttentionParams* a_ = nullptr;
  PackRequest what_{};
  std::vector<float> data_;
  std::vector<Seq> seq_;
};

}  // namespace strideattn::detail::cpu
