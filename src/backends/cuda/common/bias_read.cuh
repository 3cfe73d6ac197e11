// How the feature variant reads the additive bias into a warp's C fragment (score_mod.cuh's
// add_bias): x += mul * bias(i, j) for each entry inside the sequence (the tiles' padding rows
// and keys get none), the bias element (i, j) at bias[bias_off + i si + j sj].
//
// The fragment (for_each_pair's layout): a thread holds rows row0 + 16 mt + g (+8) and
// columns col0 + 8 n + 2 t (+1). Three ways to read it, the first that applies:
//   - pairs (rows are queries, sj == 1, the tile inside the sequence, every pair's offset
//     even and the base aligned to a pair): per row one pointer, then columns 2 t, 2 t + 1 of
//     each 8-column block as ONE 32-bit (f16, bf16) or 64-bit (f32) load at an immediate
//     offset from it, a row's loads issued together before their use (loaded ahead of
//     the S GEMM, the pairs of a wgmma forward's tile held 32 more registers there, which
//     spilled);
//   - key pairs (rows are keys, as in the dK/dV passes; a 16-bit bias, sj == 1, the tile
//     inside the sequence, pairs aligned): each 8 x 8 block read the way the bias lies, two
//     keys of one query as one 32-bit load, then transposed in registers (movmatrix);
//   - key rows (rows are keys, sj == 1, the tile inside the sequence; f32 or unaligned pairs):
//     per query column one pointer, the thread's keys at immediate offsets from it;
//   - elements (any strides: a broadcast's 0, a transposed or odd-offset view, a tile at the
//     sequence's end): per row one offset and per column one pointer, each entry tested
//     against the sequence's lengths.
// None computes a 64-bit index product per element (the element-wise read with one did cost
// the forward four times its plain time).
#pragma once

#include <cstdint>
#include <type_traits>

#include "backends/cuda/common/element.cuh"
#include "backends/cuda/common/kernel_params.hpp"

namespace strideattn::cuda_impl {

__device__ __forceinline__ float as_float(float x) { return x; }
__device__ __forceinline__ float as_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Where the bias of a (sequence, head) slab is and which of its entries exist.
struct BiasRef {
  const void* data = nullptr;  // null: no bias
  int dtype = 0;               // DType's value
  int64_t off = 0, si = 0, sj = 0;
  int64_t s_q = 0, s_kv = 0;  // entries (i, j) with i < s_q, j < s_kv have a bias
};

// Whether the tile rows [row0, row0 + rows) (queries) x columns [col0, col0 + cols) (keys)
// reads by pairs: every entry inside the sequence, sj == 1, and every pair (col0 + 2 k,
// + 1) of every row at an even element offset from a base aligned to a pair's bytes.
__device__ __forceinline__ bool bias_pairs_apply(const BiasRef& b, int64_t row0, int64_t col0, int rows, int cols) {
  const unsigned pair_bytes = b.dtype == int(DType::f32) ? 8u : 4u;
  return b.sj == 1 && ((b.off | b.si | col0) & 1) == 0 &&
         (reinterpret_cast<uintptr_t>(b.data) & (pair_bytes - 1)) == 0 && row0 + rows <= b.s_q && col0 + cols <= b.s_kv;
}

// The pairs read at their use, row by row (bias_pairs_apply holds; E: the bias's dtype).
template <class E, int MT, int N>
__device__ __forceinline__ void add_bias_pairs(float (&c)[MT][N / 8][4], const BiasRef& b, int64_t row0, int64_t col0,
                                               float mul) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const E* const base = static_cast<const E*>(b.data) + b.off + col0 + 2 * t;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const E* const row = base + (row0 + mt * 16 + g + 8 * h) * b.si;
      if constexpr (std::is_same_v<E, float>) {
        float2 v[N / 8];
#pragma unroll
        for (int n = 0; n < N / 8; ++n) v[n] = __ldg(reinterpret_cast<const float2*>(row + 8 * n));
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
          c[mt][n][2 * h] += mul * v[n].x;
          c[mt][n][2 * h + 1] += mul * v[n].y;
        }
      } else {
        uint32_t v[N / 8];
#pragma unroll
        for (int n = 0; n < N / 8; ++n) v[n] = __ldg(reinterpret_cast<const uint32_t*>(row + 8 * n));
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
          const float2 f = ElementTraits<E>::unpack(v[n]);
          c[mt][n][2 * h] += mul * f.x;
          c[mt][n][2 * h + 1] += mul * f.y;
        }
      }
    }
}

// The transpose of an 8 x 8 matrix of 16-bit values held in the MMA fragment layout (thread
// (g, t): row g, columns 2 t, 2 t + 1): the same thread gets row g, columns 2 t, 2 t + 1 of
// the transpose. Every lane of the warp must call it.
__device__ __forceinline__ uint32_t transpose_8x8_b16(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}

// Whether a tile whose rows are keys [row0, row0 + rows) and columns queries [col0, col0 +
// cols) reads by transposed pairs: every entry inside the sequence, a 16-bit bias with sj ==
// 1, every key pair (row0 + 2 k, + 1) of every query at an even element offset from a 4-byte
// aligned base.
__device__ __forceinline__ bool bias_key_pairs_apply(const BiasRef& b, int64_t row0, int64_t col0, int rows, int cols) {
  return b.dtype != int(DType::f32) && b.sj == 1 && ((b.off | b.si | row0) & 1) == 0 &&
         (reinterpret_cast<uintptr_t>(b.data) & 3u) == 0 && row0 + rows <= b.s_kv && col0 + cols <= b.s_q;
}

// Rows are keys, columns queries (bias_key_pairs_apply holds; E __half or __nv_bfloat16): each
// 8 x 8 block (queries i0 + r, keys j0 + c) is read the way the bias lies, thread (g, t) loading
// keys j0 + 2 t, + 1 of query i0 + g as one 32-bit load (per query one pointer, the blocks'
// keys at immediate offsets from it), then transposed in registers (movmatrix) into the
// fragment's layout: keys j0 + g, queries i0 + 2 t, + 1.
template <class E, int MT, int N>
__device__ __forceinline__ void add_bias_key_pairs(float (&c)[MT][N / 8][4], const BiasRef& b, int64_t row0,
                                                   int64_t col0, float mul) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint16_t* const base = static_cast<const uint16_t*>(b.data) + b.off + row0 + 2 * t;
#pragma unroll
  for (int n = 0; n < N / 8; ++n) {
    const uint32_t* const query = reinterpret_cast<const uint32_t*>(base + (col0 + 8 * n + g) * b.si);
    uint32_t v[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) v[mt][h] = __ldg(query + 8 * mt + 4 * h);  // keys 16 mt + 8 h + 2 t
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 f = ElementTraits<E>::unpack(transpose_8x8_b16(v[mt][h]));
        c[mt][n][2 * h] += mul * f.x;
        c[mt][n][2 * h + 1] += mul * f.y;
      }
  }
}

// Rows are keys row0 + ... (sj == 1, every key of the tile below s_kv), columns queries
// col0 + ... (all below s_q): per query column one pointer, the thread's keys g + 16 mt + 8 h
// at immediate offsets from it.
template <class E, int MT, int N>
__device__ __forceinline__ void add_bias_key_rows(float (&c)[MT][N / 8][4], const BiasRef& b, int64_t row0,
                                                  int64_t col0, float mul) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const E* const base = static_cast<const E*>(b.data) + b.off + row0 + g;
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const E* const col = base + (col0 + 8 * n + 2 * t + e) * b.si;
      E v[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) v[mt][h] = col[16 * mt + 8 * h];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) c[mt][n][2 * h + e] += mul * as_float(v[mt][h]);
    }
}

// Any strides, any tile: per fragment row one offset (its index times the stride along
// rows) and its test against the sequence, per column one pointer and its test.
template <class E, int MT, int N>
__device__ __forceinline__ void add_bias_elements(float (&c)[MT][N / 8][4], const BiasRef& b, int64_t row0,
                                                  int64_t col0, bool rows_are_queries, float mul) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const E* const base = static_cast<const E*>(b.data) + b.off;
  const int64_t row_st = rows_are_queries ? b.si : b.sj, col_st = rows_are_queries ? b.sj : b.si;
  const int64_t row_end = rows_are_queries ? b.s_q : b.s_kv, col_end = rows_are_queries ? b.s_kv : b.s_q;
  int64_t row_off[MT][2];
  bool row_in[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row0 + mt * 16 + g + 8 * h;
      row_off[mt][h] = r * row_st;
      row_in[mt][h] = r < row_end;
    }
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t cix = col0 + 8 * n + 2 * t + e;
      if (cix >= col_end) continue;
      const E* const col = base + cix * col_st;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (row_in[mt][h]) c[mt][n][2 * h + e] += mul * as_float(col[row_off[mt][h]]);
    }
}

// x += mul * bias(i, j) over a warp's fragment, the bias read as E (the first way that
// applies, header comment).
template <class E, int MT, int N>
__device__ __forceinline__ void add_bias_as(float (&c)[MT][N / 8][4], const BiasRef& b, int64_t row0, int64_t col0,
                                            bool rows_are_queries, float mul) {
  if (rows_are_queries) {
    if (bias_pairs_apply(b, row0, col0, 16 * MT, N))
      add_bias_pairs<E, MT, N>(c, b, row0, col0, mul);
    else
      add_bias_elements<E, MT, N>(c, b, row0, col0, true, mul);
    return;
  }
  if constexpr (!std::is_same_v<E, float>)
    if (bias_key_pairs_apply(b, row0, col0, 16 * MT, N)) {
      add_bias_key_pairs<E, MT, N>(c, b, row0, col0, mul);
      return;
    }
  if (b.sj == 1 && row0 + 16 * MT <= b.s_kv && col0 + N <= b.s_q)
    add_bias_key_rows<E, MT, N>(c, b, row0, col0, mul);
  else
    add_bias_elements<E, MT, N>(c, b, row0, col0, false, mul);
}

// add_bias_as for the bias's dtype.
template <int MT, int N>
__device__ __forceinline__ void add_bias(float (&c)[MT][N / 8][4], const BiasRef& b, int64_t row0, int64_t col0,
                                         bool rows_are_queries, float mul) {
  if (b.dtype == int(DType::f32))
    add_bias_as<float, MT, N>(c, b, row0, col0, rows_are_queries, mul);
  else if (b.dtype == int(DType::f16))
    add_bias_as<__half, MT, N>(c, b, row0, col0, rows_are_queries, mul);
  else
    add_bias_as<__nv_bfloat16, MT, N>(c, b, row0, col0, rows_are_queries, mul);
}

}  // namespace strideattn::cuda_impl
