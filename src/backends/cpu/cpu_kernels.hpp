// The `cpu` backend's inner loops on contiguous fp32 tile buffers: the accumulate-GEMM the
// tiles use (S = Q K^T, O += P V, dP = dO V^T, dV += P^T dO, dK += dS^T Q, dQ += dS K) and
// exp and max over a row segment. Each has a portable version and, on x86-64 with GCC or Clang, an
// AVX2+FMA version chosen once at run time (the library is built for the baseline ISA, so
// no build flag is needed and older CPUs still run the portable code).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <immintrin.h>
#define STRIDEATTN_CPU_AVX2 1
#define SA_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace strideattn::detail::cpu {

// ------------------------------------------------------------------------------ portable

// C[m][0..n) += sum_k A(m, k) * B[k][0..n) for m < rows, k < depth, where
// A(m, k) = a[m * a_row + k * a_col] (a transposed operand needs no copy), B rows `ldb`
// apart and C rows `ldc` apart. Summation order over k is fixed (k ascending) in every
// version, so results do not depend on threads.
inline void gemm_acc_portable(std::int64_t rows, std::int64_t n, std::int64_t depth, const float* a, std::int64_t a_row,
                              std::int64_t a_col, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  for (std::int64_t m = 0; m < rows; ++m) {
    float* __restrict cm = c + m * ldc;
    for (std::int64_t k = 0; k < depth; ++k) {
      const float x = a[m * a_row + k * a_col];
      const float* __restrict bk = b + k * ldb;
      for (std::int64_t j = 0; j < n; ++j) cm[j] += x * bk[j];
    }
  }
}

// x[j] = exp(x[j] - shift) for j < n; returns the sum of the results.
inline float exp_sub_sum_portable(float* x, std::int64_t n, float shift) {
  float sum = 0.f;
  for (std::int64_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - shift);
    sum += x[j];
  }
  return sum;
}

// max(init, x[0..n)), ignoring NaN (a NaN score reaches the output through exp instead).
inline float row_max_portable(const float* x, std::int64_t n, float init) {
  float m = init;
  for (std::int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// True when x[0..n) holds no NaN or infinity (all-ones exponent; an integer OR reduction,
// which the compiler vectorizes). Tiles that the mask cuts use it to decide whether
// masked-out operands must be kept out of the products (0 * NaN would leak into rows that
// do not see them).
inline bool all_finite(const float* x, std::int64_t n) {
  std::uint32_t bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, x + i, sizeof u);
    bad |= static_cast<std::uint32_t>((u & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

// ------------------------------------------------------------------------------ AVX2 + FMA
#ifdef STRIDEATTN_CPU_AVX2

// R rows x (V * 8) columns of C held in registers across the whole k loop.
template <int R, int V>
SA_AVX2 inline void gemm_block_avx2(std::int64_t depth, const float* a, std::int64_t a_row, std::int64_t a_col,
                                    const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  // Fully unrolled so the accumulators live in registers, not on the stack.
  __m256 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_loadu_ps(c + r * ldc + 8 * v);
  for (std::int64_t k = 0; k < depth; ++k) {
    __m256 bv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) bv[v] = _mm256_loadu_ps(b + k * ldb + 8 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + r * a_row + k * a_col);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(x, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(c + r * ldc + 8 * v, acc[r][v]);
}

template <int R>
SA_AVX2 inline void gemm_rows_avx2(std::int64_t n, std::int64_t depth, const float* a, std::int64_t a_row,
                                   std::int64_t a_col, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16) gemm_block_avx2<R, 2>(depth, a, a_row, a_col, b + j, ldb, c + j, ldc);
  for (; j + 8 <= n; j += 8) gemm_block_avx2<R, 1>(depth, a, a_row, a_col, b + j, ldb, c + j, ldc);
  if (j < n) {
    for (int r = 0; r < R; ++r)
      for (std::int64_t k = 0; k < depth; ++k) {
        const float x = a[r * a_row + k * a_col];
        for (std::int64_t t = j; t < n; ++t) c[r * ldc + t] = std::fma(x, b[k * ldb + t], c[r * ldc + t]);
      }
  }
}

SA_AVX2 inline void gemm_acc_avx2(std::int64_t rows, std::int64_t n, std::int64_t depth, const float* a,
                                  std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t ldb, float* c,
                                  std::int64_t ldc) {
  // 6 x 16 blocks keep 12 accumulators in flight (FMA latency x throughput) within the 16
  // ymm registers, with 2 B vectors and 1 broadcast.
  std::int64_t m = 0;
  for (; m + 6 <= rows; m += 6) gemm_rows_avx2<6>(n, depth, a + m * a_row, a_row, a_col, b, ldb, c + m * ldc, ldc);
  for (; m + 4 <= rows; m += 4) gemm_rows_avx2<4>(n, depth, a + m * a_row, a_row, a_col, b, ldb, c + m * ldc, ldc);
  for (; m < rows; ++m) gemm_rows_avx2<1>(n, depth, a + m * a_row, a_row, a_col, b, ldb, c + m * ldc, ldc);
}

// exp for 8 lanes: Cephes' expf (range reduction by ln 2 in two parts, degree-5
// polynomial, 2^n through the exponent bits); about 1 ulp on [-87, 88]. Inputs below
// -87.3 give 0 (the 2^n factor underflows), which is what softmax wants; inputs are
// max-subtracted scores (<= 0) or S - LSE (about <= 0), so the clamp at 88.4 never bites.
// NaN gives NaN (the clamps keep it: max/min return their second operand when one is
// NaN), as std::exp does, so NaN scores reach the outputs.
SA_AVX2 inline __m256 exp_avx2(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-88.3762626647949f);
  x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

SA_AVX2 inline float exp_sub_sum_avx2(float* x, std::int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + j), s));
    _mm256_storeu_ps(x + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  const int rest = static_cast<int>(n - j);  // 0..7
  if (rest > 0) {
    alignas(32) float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int t = 0; t < rest && t < 8; ++t) tail[t] = x[j + t] - shift;
    _mm256_store_ps(tail, exp_avx2(_mm256_load_ps(tail)));
    for (int t = 0; t < rest && t < 8; ++t) {
      x[j + t] = tail[t];
      sum += tail[t];
    }
  }
  return sum;
}

SA_AVX2 inline float row_max_avx2(const float* x, std::int64_t n, float init) {
  __m256 m = _mm256_set1_ps(init);
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + j), m);  // NaN: keeps m
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = init;
  for (float v : lanes) r = v > r ? v : r;
  for (; j < n; ++j) r = x[j] > r ? x[j] : r;
  return r;
}

inline bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#endif  // STRIDEATTN_CPU_AVX2

// ------------------------------------------------------------------------------ dispatch

// Tests set this to run the portable loops on machines that have AVX2.
inline std::atomic<bool>& force_portable_kernels() {
  static std::atomic<bool> force{false};
  return force;
}
inline bool use_avx2() {
#ifdef STRIDEATTN_CPU_AVX2
  return have_avx2() && !force_portable_kernels().load(std::memory_order_relaxed);
#else
  return false;
#endif
}

inline void gemm_acc(std::int64_t rows, std::int64_t n, std::int64_t depth, const float* a, std::int64_t a_row,
                     std::int64_t a_col, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
#ifdef STRIDEATTN_CPU_AVX2
  if (use_avx2()) return gemm_acc_avx2(rows, n, depth, a, a_row, a_col, b, ldb, c, ldc);
#endif
  gemm_acc_portable(rows, n, depth, a, a_row, a_col, b, ldb, c, ldc);
}

inline float row_max(const float* x, std::int64_t n, float init) {
#ifdef STRIDEATTN_CPU_AVX2
  if (use_avx2()) return row_max_avx2(x, n, init);
#endif
  return row_max_portable(x, n, init);
}

inline float exp_sub_sum(float* x, std::int64_t n, float shift) {
#ifdef STRIDEATTN_CPU_AVX2
  if (use_avx2()) return exp_sub_sum_avx2(x, n, shift);
#endif
  return exp_sub_sum_portable(x, n, shift);
}

}  // namespace strideattn::detail::cpu
