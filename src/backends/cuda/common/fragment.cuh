// Register fragments in the m16n8k16 accumulator (C) layout that both architectures' MMAs
// produce (a wgmma warp's 16 rows are the same layout): zeroing, rounding an accumulator
// into A operand fragments, and storing one into a shared-memory tile.
#pragma once

#include <cstdint>

#include "backends/cuda/common/element.cuh"

namespace strideattn::cuda_impl {

// A operand fragments of a 16*MT x K matrix held in registers: a[mt][k16][4].
// Built from an fp32 accumulator C[MT][K/8][4] by rounding to T (the FA2 register reuse:
// two adjacent n8 accumulator tiles form one k16 A fragment).
template <class T, int MT, int K>
__device__ __forceinline__ void accum_to_a(uint32_t (&a)[MT][K / 16][4], const float (&c)[MT][K / 8][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
      a[mt][kk][0] = ElementTraits<T>::pack(c[mt][2 * kk][0], c[mt][2 * kk][1]);
      a[mt][kk][1] = ElementTraits<T>::pack(c[mt][2 * kk][2], c[mt][2 * kk][3]);
      a[mt][kk][2] = ElementTraits<T>::pack(c[mt][2 * kk + 1][0], c[mt][2 * kk + 1][1]);
      a[mt][kk][3] = ElementTraits<T>::pack(c[mt][2 * kk + 1][2], c[mt][2 * kk + 1][3]);
    }
}

// C[MT][N/8][4] += A * B with A in registers (a[mt][k16]) and B stored k-major in shared
// memory: B[k][n] is element (k, b_col0 + n) of `sb` (rows = contraction). Column tiles
// at or beyond n_end (a multiple of 8) are skipped.
// Pipelined over the 16-column tiles of C (the loop that n_end cuts short): the B fragments

// Store a warp's fp32 accumulator tile C[MT][N/8][4] (rows row0 + 16 * mt + g (+8), columns
// col0 + 8 * n + 2t (+1)) into a shared-memory tile, rounded to T: the exchange of P^T and
// dS^T between the warps of the 8-warp dK/dV pass. One 4-byte store per pair; the 8 rows of
// a store instruction land in 8 different chunks of the swizzle, so 32 different banks.
template <class T, int MT, int N, class Tile>
__device__ __forceinline__ void store_accum(const Tile& tile, int row0, int col0, const float (&c)[MT][N / 8][4]) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<uint32_t*>(tile.chunk(row0 + mt * 16 + g + 8 * h, col0 + n * 8) + 2 * t) =
            ElementTraits<T>::pack(c[mt][n][2 * h], c[mt][n][2 * h + 1]);
}

template <int MT, int N>
__device__ __forceinline__ void zero(float (&c)[MT][N / 8][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[mt][n][e] = 0.f;
}

}  // namespace strideattn::cuda_impl
