// The dQ step of the single-pass backward (deterministic == false), which backward_kv_kernel
// runs after its dK GEMM when KernelParams::dq_accum is set:
//   store dS^T (the dK GEMM's A operand, already rounded to T) into a shared tile; barrier;
//   dQ_partial = dS K over this CTA's keys; dq_accum += dQ_partial (fp32 global atomics).
// Summation order across CTAs is whatever order the atomics land in: not bitwise
// reproducible, which is why deterministic == true keeps the two-pass path.
// The warp layout of the dQ GEMM and the shared-memory budget: kernel_traits.cuh
// (BackwardFusedDq).
#pragma once

#include "backends/cuda/device_primitives.cuh"
#include "backends/cuda/kernel_params.hpp"
#include "backends/cuda/kernel_traits.cuh"

namespace strideattn::cuda_impl {

// dS^T of one iteration: ROWS keys x COLS queries of 16-bit elements, rows padded by 8
// elements. Row strides of 80 or 144 bytes put the 8 rows of one ldmatrix phase and the 8
// rows of one fragment store in 8 different bank groups (COLS = 32 is too narrow for the
// swizzled SmemTile).
template <int ROWS, int COLS>
struct PaddedTile {
  static constexpr int kStride = COLS + 8, kElems = ROWS * kStride;
  uint16_t* base;
  __device__ __forceinline__ uint16_t* at(int row, int col) const { return base + row * kStride + col; }
  __device__ __forceinline__ uint32_t addr(int row, int col) const { return smem_addr(at(row, col)); }
};

// Write this warp's dS^T fragments (rows warp_row0 + 16 * mt + (0..15), every query column)
// into the tile: the A fragment layout of device_primitives.cuh, four 4-byte words per k16.
template <int MT, int BR, class Tile>
__device__ __forceinline__ void store_ds_t(const Tile& sds, const uint32_t (&ds)[MT][BR / 16][4],
                                           int warp_row0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      const int r = warp_row0 + mt * 16 + g, c = kk * 16 + 2 * t;
      *reinterpret_cast<uint32_t*>(sds.at(r, c)) = ds[mt][kk][0];
      *reinterpret_cast<uint32_t*>(sds.at(r + 8, c)) = ds[mt][kk][1];
      *reinterpret_cast<uint32_t*>(sds.at(r, c + 8)) = ds[mt][kk][2];
      *reinterpret_cast<uint32_t*>(sds.at(r + 8, c + 8)) = ds[mt][kk][3];
    }
}

// dQ_partial[16 x N] += dS[16 x BC] * K[BC x N]: this warp's queries q0 .. q0+15, dQ
// columns n0 .. n0+N-1 (tiles at or past n_end, relative to n0, skipped). Both operands are
// k-major in shared memory (dS^T: keys x queries; K: keys x head dim), so both come through
// ldmatrix.trans; fragments load at the top of each k-step (few live registers: dK and dV
// are held across this step).
template <class T, int BC, int N, class DsTile, class KTile>
__device__ __forceinline__ void gemm_dq(float (&c)[N / 8][4], const DsTile& sds, int q0,
                                        const KTile& sk, int n0, int n_end) {
  static_assert(N % 16 == 0 && BC % 16 == 0, "dQ GEMM works on 16 x 16 tiles");
  const int lane = threadIdx.x & 31;
  // A (m = query, k = key) from dS^T rows k: matrices (m 0-7, k 0-7), (m 8-15, k 0-7),
  // (m 0-7, k 8-15), (m 8-15, k 8-15) = a0..a3.
  const int a_k = (lane & 7) + ((lane >> 4) << 3), a_m = ((lane >> 3) & 1) * 8;
  // B (k = key, n = column) from K rows k, as gemm_rn loads it.
  const int b_k = (lane & 7) + (((lane >> 3) & 1) << 3), b_n = (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, sds.addr(kk * 16 + a_k, q0 + a_m));
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      if (nn * 16 >= n_end) break;
      uint32_t b[4];
      ldmatrix_x4_trans(b, sk.addr_at(KTile::offset(kk * 16 + b_k, n0 + nn * 16 + b_n)));
      mma16816<T>(c[2 * nn], a, b[0], b[1]);
      mma16816<T>(c[2 * nn + 1], a, b[2], b[3]);
    }
  }
}

// dq_accum[row][col], [col + 1] += (x0, x1); col even, the row 8-byte aligned (d_qk % 8 == 0).
__device__ __forceinline__ void atomic_add_pair(float* dst, float x0, float x1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x0, x1));
#else
  atomicAdd(dst, x0);
  atomicAdd(dst + 1, x1);
#endif
}

// The whole dQ step of one iteration of backward_kv_kernel, after the dS^T tile is written
// and a barrier: the warp's slice of dQ_partial = dS K (unscaled), added into
// kp.dq_accum for query rows [r0, r1) of `head`, head-dim columns [col0, col0 + DAcc) of the
// CTA's split cut at d_qk.
template <class T, int D, class DsTile, class KTile>
__device__ __forceinline__ void accumulate_dq(const KernelParams& kp, const DsTile& sds,
                                              const KTile& sk, int64_t batch, int64_t head,
                                              int64_t r0, int64_t r1, int col0) {
  using Fused = BackwardFusedDq<D>;
  constexpr int N = Fused::kChunkCols;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int q0 = (warp % Fused::kRowWarps) * 16;
  const int w0 = col0 + (warp / Fused::kRowWarps) * Fused::kCols;  // the warp's first column
  if (r0 + q0 >= r1) return;  // rows past the sequence end
#pragma unroll
  for (int chunk = 0; chunk < Fused::kCols / N; ++chunk) {
    const int n0 = w0 + chunk * N;
    const int n_end = int(kp.p.d_qk) - n0;
    if (n_end <= 0) break;  // columns past d_qk
    // dQ += dS K
    float dq[1][N / 8][4];
    zero<1, N>(dq);
    gemm_dq<T, BackwardKvTile<D>::kBc, N>(dq[0], sds, q0, sk, n0, n_end);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = r0 + q0 + g + 8 * h;
      if (row >= r1) continue;
      float* dst = kp.dq_accum + delta_index(kp, batch, head, row) * kp.p.d_qk + n0;
#pragma unroll
      for (int n = 0; n < N / 8; ++n) {
        const int col = n * 8 + 2 * t;
        if (col < n_end) atomic_add_pair(dst + col, dq[0][n][2 * h], dq[0][n][2 * h + 1]);
      }
    }
  }
}

}  // namespace strideattn::cuda_impl
