// The exact backward of the `cudnn` fix-ups (nonfinite.hpp): for the (sequence, KV head) groups
// the row pass marks as outside cuDNN's numerical envelope, dQ, dK and dV are recomputed from
// Q, K, V, O and dO with fp64 scores, LSE, D = rowsum(dO * O) and sums, then rounded once to
// the output dtype. The math is the definition's, written out per row and per key:
//   S_ij = scale q_i . k_j,   LSE_i = log sum_j exp(S_ij),   P_ij = exp(S_ij - LSE_i),
//   dS_ij = P_ij (dO_i . v_j - D_i),
//   dQ_i = scale sum_j dS_ij k_j,   dK_j = scale sum_i dS_ij q_i,   dV_j = sum_i P_ij dO_i,
// over the keys row i sees (MaskRule) and the rows of every query head of the group that see
// key j. It is slow (plain fp64 arithmetic, a warp per row or key) and runs only there.
//   rows  a warp per row: LSE_i and D_i into the scratch (the keys part reads them), then
//         dQ_i; rows the NaN pass marked bad keep the NaN it wrote;
//   keys  a warp per key: dK_j and dV_j, or NaN where a bad row of the group sees the key
//         (the flags of the rows it visits; the same rule as the NaN pass's prefix counts).
// Included by nonfinite.cu (one translation unit: the keys part runs inside its key kernel).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/attention_math.hpp"

namespace strideattn::detail::cudnn::exact {

constexpr int kMaxHeadDim = 256;            // cuDNN's limit (rules.cpp: head_dim)
constexpr int kPerLane = kMaxHeadDim / 32;  // accumulator columns per lane
constexpr unsigned kAll = 0xffffffffu;

__device__ __forceinline__ float load(const void* base, std::int64_t at, bool bf16) {
  const std::uint16_t bits = static_cast<const std::uint16_t*>(base)[at];
  return bf16 ? __uint_as_float(std::uint32_t(bits) << 16) : __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ void store(void* base, std::int64_t at, double x, bool bf16) {
  auto* p = static_cast<std::uint16_t*>(base) + at;
  const float f = float(x);
  *p = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(f)) : __half_as_ushort(__float2half_rn(f));
}

__device__ __forceinline__ double warp_sum(double x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(kAll, x, off);
  return x;
}

// Column c of the row at element offset `at` whose columns are `step` apart.
__device__ __forceinline__ float col(const void* base, std::int64_t at, std::int64_t step, std::int64_t c, bool bf16) {
  return load(base, at + c * step, bf16);
}

// dot(x, row) with x a float vector in shared memory and row a tensor row, in fp64.
__device__ __forceinline__ double dot(const float* x, const void* base, std::int64_t at, std::int64_t step,
                                      std::int64_t n, bool bf16) {
  double d = 0;
  for (std::int64_t c = 0; c < n; ++c) d += double(x[c]) * double(col(base, at, step, c, bf16));
  return d;
}

// A score: the product rounded on its own, never fused into the subtraction of the LSE that
// follows (an FMA would meet the rounded max with the exact product: at |S| ~ 1e20 the max's
// exponent is then off by up to half an ulp of 1e20, thousands, and P is inf).
__device__ __forceinline__ double scaled(double scale, double qk) { return __dmul_rn(scale, qk); }

// The rows part for row `row` of query head `h` in sequence `b` (a whole warp). `q_sh`, `g_sh`:
// this warp's shared rows of d_qk and d_v floats. `bad`: the NaN pass's flag of the row.
__device__ void recompute_row(const kernel::AttentionParams& a, bool bf16, std::int64_t b, std::int64_t h,
                              std::int64_t row, const kernel::MaskRule& m, bool bad, float* q_sh, float* g_sh,
                              double* lse_out, double* d_out) {
  const int lane = int(threadIdx.x & 31);
  const std::int64_t hk = kernel::kv_head_of(h, a.heads, a.kv_heads);
  const std::int64_t q_at = kernel::row_offset(a.q_seq.span(a.q_st, b), a.q_st, row, h);
  const std::int64_t g_at = kernel::row_offset(a.q_seq.span(a.do_st, b), a.do_st, row, h);
  const std::int64_t o_at = kernel::row_offset(a.q_seq.span(a.o_st, b), a.o_st, row, h);
  const kernel::SequenceSpan k_span = a.kv_seq.span(a.k_st, b), v_span = a.kv_seq.span(a.v_st, b);
  for (std::int64_t c = lane; c < a.d_qk; c += 32) q_sh[c] = col(a.q, q_at, a.q_st.d, c, bf16);
  double dd = 0;
  for (std::int64_t c = lane; c < a.d_v; c += 32) {
    g_sh[c] = col(a.d_o, g_at, a.do_st.d, c, bf16);
    dd += double(g_sh[c]) * double(col(a.o, o_at, a.o_st.d, c, bf16));
  }
  dd = warp_sum(dd);
  __syncwarp();
  const double scale = a.scale;
  const std::int64_t kb = m.key_begin(row), ke = m.key_end(row);
  auto score = [&](std::int64_t j) {
    return scaled(scale, dot(q_sh, a.k, kernel::row_offset(k_span, a.k_st, j, hk), a.k_st.d, a.d_qk, bf16));
  };

  // LSE: each lane keeps a running max and sum over its keys; the warp combines them.
  double mx = -INFINITY, l = 0;
  bool nan = false;
  for (std::int64_t j = kb + lane; j < ke; j += 32) {
    const double s = score(j);
    if (s != s) {
      nan = true;
    } else if (s > mx) {
      l = l * exp(mx - s) + 1;  // exp(-inf) = 0 for the first key
      mx = s;
    } else if (s > -INFINITY) {
      l += exp(s - mx);
    }
  }
  double big = mx;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) big = fmax(big, __shfl_xor_sync(kAll, big, off));
  const double sum = warp_sum(mx > -INFINITY ? l * exp(mx - big) : 0.0);
  const bool any_nan = __any_sync(kAll, nan);
  // All scores -inf: l = 0 and the definition's 0 / 0 (LSE = -inf, P = NaN).
  const double lse = any_nan ? NAN : big + log(sum);
  if (lane == 0) *lse_out = lse, *d_out = dd;
  if (bad) return;  // dQ keeps the NaN pass's NaN

  double acc[kPerLane];
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) acc[t] = 0;
  for (std::int64_t j0 = kb; j0 < ke; j0 += 32) {
    const std::int64_t j = j0 + lane;
    double ds = 0;
    if (j < ke) {
      const double p = exp(score(j) - lse);
      const double dp = dot(g_sh, a.v, kernel::row_offset(v_span, a.v_st, j, hk), a.v_st.d, a.d_v, bf16);
      ds = p * (dp - dd);
    }
    const int n = int(ke - j0 < 32 ? ke - j0 : 32);
    for (int jj = 0; jj < n; ++jj) {
      const double dsj = __shfl_sync(kAll, ds, jj);
      const std::int64_t k_at = kernel::row_offset(k_span, a.k_st, j0 + jj, hk);
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const std::int64_t c = lane + 32 * t;
        if (c < a.d_qk) acc[t] += dsj * double(col(a.k, k_at, a.k_st.d, c, bf16));
      }
    }
  }
  const std::int64_t dq_at = kernel::row_offset(a.q_seq.span(a.dq_st, b), a.dq_st, row, h);
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const std::int64_t c = lane + 32 * t;
    if (c < a.d_qk) store(a.dq, dq_at + c * a.dq_st.d, acc[t] * scale, bf16);
  }
}

// The keys part for key `j` of KV head `hk` in sequence `b` (a whole warp). `k_sh`, `v_sh`:
// this warp's shared rows of d_qk and d_v floats. `flags`, `lse`, `dd`: [batch, heads, s_max]
// from the NaN pass and the rows part.
__device__ void recompute_key(const kernel::AttentionParams& a, bool bf16, std::int64_t b, std::int64_t hk,
                              std::int64_t j, const kernel::MaskRule& m, const std::uint8_t* flags, const double* lse,
                              const double* dd, float* k_sh, float* v_sh) {
  const int lane = int(threadIdx.x & 31);
  const std::int64_t s_max = a.q_seq.max_len, group = a.heads / a.kv_heads;
  const std::int64_t k_at = kernel::row_offset(a.kv_seq.span(a.k_st, b), a.k_st, j, hk);
  const std::int64_t v_at = kernel::row_offset(a.kv_seq.span(a.v_st, b), a.v_st, j, hk);
  for (std::int64_t c = lane; c < a.d_qk; c += 32) k_sh[c] = col(a.k, k_at, a.k_st.d, c, bf16);
  for (std::int64_t c = lane; c < a.d_v; c += 32) v_sh[c] = col(a.v, v_at, a.v_st.d, c, bf16);
  __syncwarp();
  const double scale = a.scale;
  const kernel::SequenceSpan q_span = a.q_seq.span(a.q_st, b), g_span = a.q_seq.span(a.do_st, b);
  const kernel::TileRange rows = kernel::queries_seeing_key(m, j);
  double acc_k[kPerLane], acc_v[kPerLane];
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) acc_k[t] = acc_v[t] = 0;
  int bad = 0;  // bit 0: NaN into dK, bit 1: into dV (the flag bits of nonfinite.cu)
  for (std::int64_t g = 0; g < group; ++g) {
    const std::int64_t h = hk * group + g, bh = b * a.heads + h;
    for (std::int64_t i0 = rows.begin; i0 < rows.end; i0 += 32) {
      const std::int64_t i = i0 + lane;
      double p = 0, ds = 0;
      if (i < rows.end) {
        bad |= flags[bh * s_max + i];
        const double s =
            scaled(scale, dot(k_sh, a.q, kernel::row_offset(q_span, a.q_st, i, h), a.q_st.d, a.d_qk, bf16));
        p = exp(s - lse[bh * s_max + i]);
        const double dp = dot(v_sh, a.d_o, kernel::row_offset(g_span, a.do_st, i, h), a.do_st.d, a.d_v, bf16);
        ds = p * (dp - dd[bh * s_max + i]);
      }
      const int n = int(rows.end - i0 < 32 ? rows.end - i0 : 32);
      for (int ii = 0; ii < n; ++ii) {
        const double pi = __shfl_sync(kAll, p, ii), dsi = __shfl_sync(kAll, ds, ii);
        const std::int64_t q_at = kernel::row_offset(q_span, a.q_st, i0 + ii, h);
        const std::int64_t g_at = kernel::row_offset(g_span, a.do_st, i0 + ii, h);
#pragma unroll
        for (int t = 0; t < kPerLane; ++t) {
          const std::int64_t c = lane + 32 * t;
          if (c < a.d_qk) acc_k[t] += dsi * double(col(a.q, q_at, a.q_st.d, c, bf16));
          if (c < a.d_v) acc_v[t] += pi * double(col(a.d_o, g_at, a.do_st.d, c, bf16));
        }
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) bad |= __shfl_xor_sync(kAll, bad, off);
  const std::int64_t dk_at = kernel::row_offset(a.kv_seq.span(a.dk_st, b), a.dk_st, j, hk);
  const std::int64_t dv_at = kernel::row_offset(a.kv_seq.span(a.dv_st, b), a.dv_st, j, hk);
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const std::int64_t c = lane + 32 * t;
    if (c < a.d_qk) store(a.dk, dk_at + c * a.dk_st.d, (bad & 1) ? NAN : acc_k[t] * scale, bf16);
    if (c < a.d_v) store(a.dv, dv_at + c * a.dv_st.d, (bad & 2) ? NAN : acc_v[t], bf16);
  }
}

}  // namespace strideattn::detail::cudnn::exact
