// Warp-level building blocks of the mma.sync kernels: the m16n8k16 tensor-core MMA (fp32
// accumulate), ldmatrix, the swizzled shared-memory tile layout and the three warp GEMM
// shapes the kernels are made of:
//   gemm_nt: C[16*MT x N] += A[16*MT x K] * B[N x K]^T, A and B rows in shared memory
//   gemm_rn: C[16*MT x N] += A[16*MT x K] * B[K x N],   A in registers, B rows in smem
//   gemm_sn: C[16*MT x N] += A[16*MT x K] * B[K x N],   A rows and B rows in smem
// Fragment layouts follow the PTX ISA for mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A: a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B: b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C: c0,c1 (g, 2t..2t+1)  c2,c3 (g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backends/cuda/common/copy.cuh"
#include "backends/cuda/common/element.cuh"
#include "backends/cuda/common/fragment.cuh"
#include "backends/cuda/common/smem_swizzle.hpp"

namespace strideattn::cuda_impl {

// D = A * B + D, m16n8k16, fp32 accumulate.
template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ------------------------------------------------------------------ shared-memory tiles

// A tile of ROWS x COLS 16-bit elements, rows contiguous, 16-byte chunks XOR-swizzled by
// (row % 8) so that the 8 row addresses of one ldmatrix phase hit 8 different bank groups
// (smem_swizzle.hpp, where a CPU test checks the arithmetic).
template <int ROWS, int COLS>
struct SmemTile {
  using Swz = Swizzle<COLS>;
  static constexpr int kRows = ROWS, kCols = COLS, kElems = ROWS * COLS;
  uint16_t* base;
  // Element offset of (row, col) where col is a multiple of 8.
  __device__ __forceinline__ static int offset(int row, int col) { return Swz::offset(row, col); }
  __device__ __forceinline__ uint16_t* chunk(int row, int col) const { return base + offset(row, col); }
  // Shared-memory byte address of the element at swizzled offset `off`.
  __device__ __forceinline__ uint32_t addr_at(int off) const {
    return smem_addr(base) + 2u * static_cast<uint32_t>(off);
  }
};

// ------------------------------------------------------------------ warp GEMMs

// C[MT][N/8][4] += A * B^T. A: rows a_row0 + 16*mt + (0..15) of `sa`, B: rows b_row0 + (0..N-1)
// of `sb`, both with the contraction along columns [0, k_end) (k_end a multiple of 8; the
// columns up to the next multiple of 16 must be zero in shared memory).
// Software-pipelined: the fragments of k-step kk+1 are requested from shared memory before
// the MMAs of step kk issue, so ldmatrix latency hides behind tensor-core work (two warps
// per scheduler cannot hide it otherwise). The sum over k runs in the same order as a plain
// loop: results are bitwise those of the unpipelined GEMM.
// Prefetch = false: the plain loop (fewer live fragments, for kernels where the pipelined
// one spills; common/tiles.hpp says where), same sums in the same order.
template <class T, int MT, int N, int KMAX, bool Prefetch = true, class TileA, class TileB>
__device__ __forceinline__ void gemm_nt(float (&c)[MT][N / 8][4], const TileA& sa, int a_row0, const TileB& sb,
                                        int b_row0, int k_end) {
  static_assert(N % 16 == 0, "N must be a multiple of 16");
  constexpr int kSteps = KMAX / 16;
  const int lane = threadIdx.x & 31;
  const int a_r = lane & 15, a_c = (lane >> 4) * 8;
  const int b_r = (lane & 7) + ((lane >> 4) << 3), b_c = ((lane >> 3) & 1) * 8;
  // Each lane's swizzled offsets at k-step 0 (columns a_c, b_c < 16): k-step kk is an XOR
  // (Swizzle::step), the m and n tiles 16 rows apart add 16 rows, which keeps row % 8.
  const int a_off = TileA::offset(a_row0 + a_r, a_c), b_off = TileB::offset(b_row0 + b_r, b_c);
  auto a_addr = [&](int mt, int kk) { return sa.addr_at(TileA::Swz::step(a_off, kk) + mt * 16 * TileA::kCols); };
  auto b_addr = [&](int nn, int kk) { return sb.addr_at(TileB::Swz::step(b_off, kk) + nn * 16 * TileB::kCols); };
  // Prefetch: double-buffered A of the whole k-step and the first kPreB 16-column B tiles
  // (all of B when N <= 32; for wider N the rest is loaded inside the step, where the
  // compiler may hoist it above earlier MMAs, to keep registers for the accumulators).
  // Without: one buffer, A loaded at the top of its own step, all of B inside it.
  constexpr int kBufs = Prefetch ? 2 : 1;
  constexpr int kPreB = !Prefetch ? 0 : N / 16 <= 2 ? N / 16 : 1;
  uint32_t a[kBufs][MT][4], bp[kBufs][kPreB > 0 ? kPreB : 1][4];
  auto load = [&](int kk, int buf) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[buf][mt], a_addr(mt, kk));
#pragma unroll
    for (int nn = 0; nn < kPreB; ++nn) ldmatrix_x4(bp[buf][nn], b_addr(nn, kk));
  };
  if constexpr (Prefetch) load(0, 0);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const bool more = kk + 1 < kSteps && (kk + 1) * 16 < k_end;
    if constexpr (Prefetch) {
      if (more) load(kk + 1, (kk + 1) & 1);
    } else {
      load(kk, 0);
    }
    const int buf = Prefetch ? (kk & 1) : 0;
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      uint32_t bt[4];
      if (nn < kPreB) {
#pragma unroll
        for (int e = 0; e < 4; ++e) bt[e] = bp[buf][nn][e];
      } else {
        ldmatrix_x4(bt, b_addr(nn, kk));
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816<T>(c[mt][2 * nn], a[buf][mt], bt[0], bt[1]);
        mma16816<T>(c[mt][2 * nn + 1], a[buf][mt], bt[2], bt[3]);
      }
    }
    if (!more) break;
  }
}

// of tile nn+1 are requested before the MMAs of tile nn. Each C element still sums over k in
// increasing order, so the results are bitwise those of a plain loop.
template <class T, int MT, int K, int N, bool Prefetch = true, class TileB>
__device__ __forceinline__ void gemm_rn(float (&c)[MT][N / 8][4], const uint32_t (&a)[MT][K / 16][4], const TileB& sb,
                                        int b_col0, int n_end) {
  static_assert(N % 16 == 0, "N must be a multiple of 16");
  constexpr int kTiles = N / 16;
  const int lane = threadIdx.x & 31;
  const int b_r = (lane & 7) + (((lane >> 3) & 1) << 3), b_c = (lane >> 4) * 8;
  // Swizzled offset of column tile 0 (b_col0 is 0 or 128, b_c < 16): column tile nn is an
  // XOR (Swizzle::step), k-step kk 16 rows further down.
  const int b_off = TileB::offset(b_r, b_col0 + b_c);
  // Prefetch: tile nn+1's fragments load before tile nn's MMAs (two buffers); without, each
  // tile loads its own at the top of its step (one buffer).
  constexpr int kBufs = Prefetch ? 2 : 1;
  uint32_t b[kBufs][K / 16][4];
  auto load = [&](int nn, int buf) {
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk)
      ldmatrix_x4_trans(b[buf][kk], sb.addr_at(TileB::Swz::step(b_off, nn) + kk * 16 * TileB::kCols));
  };
  if (n_end <= 0) return;
  if constexpr (Prefetch) load(0, 0);
#pragma unroll
  for (int nn = 0; nn < kTiles; ++nn) {
    const bool more = nn + 1 < kTiles && (nn + 1) * 16 < n_end;
    if constexpr (Prefetch) {
      if (more) load(nn + 1, (nn + 1) & 1);
    } else {
      load(nn, 0);
    }
    const int buf = Prefetch ? (nn & 1) : 0;
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816<T>(c[mt][2 * nn], a[mt][kk], b[buf][kk][0], b[buf][kk][1]);
        mma16816<T>(c[mt][2 * nn + 1], a[mt][kk], b[buf][kk][2], b[buf][kk][3]);
      }
    if (!more) break;
  }
}

// C[MT][N/8][4] += A * B with both operands in shared memory: A[m][k] is element
// (a_row0 + m, k) of `sa` (rows = C's rows, loaded with ldmatrix as in gemm_nt), B[k][n] is
// element (k, b_col0 + n) of `sb` (rows = contraction, loaded with ldmatrix.trans as in
// gemm_rn). The contraction runs over all K columns of A (the tile rows of B past the data
// must be zero, or A's columns there zero); column tiles of C at or beyond n_end (a multiple
// of 8) are skipped. For an A that another warp wrote (the 8-warp dK/dV pass: P^T and dS^T
// shared by the warps of a key slice): gemm_rn would need all K/16 A fragments in registers
// at once, this loads one k-step's at a time.
// b_col0 must be 0 or a multiple of N that is at least 64 (a head-dim half), so that the
// 16-column steps from it are XORs of its swizzled offset (smem_swizzle.hpp). Each C element
// sums over k in increasing order, as gemm_rn does, so with the same A values the results
// are bitwise gemm_rn's. Prefetch: the next k-step's A fragments load before this step's
// MMAs, and each B tile before the previous tile's MMAs.
//
// TransA: A is stored transposed, A[m][k] = element (k, a_row0 + m) of `sa` (rows =
// contraction; a_row0 is then a column, with the same 16-column step rule as b_col0), and
// loaded with ldmatrix.trans: dQ = dS K in the single-pass backward, where the shared tile
// holds dS^T. Lane l addresses row (l % 8) + 8 (l / 16) and column 8 ((l / 8) % 2) of its
// 16 x 16 block, so the four 8 x 8 matrices come back as a0..a3 of the fragment layout.
template <class T, int MT, int K, int N, bool Prefetch = true, bool TransA = false, class TileA, class TileB>
__device__ __forceinline__ void gemm_sn(float (&c)[MT][N / 8][4], const TileA& sa, int a_row0, const TileB& sb,
                                        int b_col0, int n_end) {
  static_assert(N % 16 == 0 && K % 16 == 0, "N and K must be multiples of 16");
  constexpr int kSteps = K / 16, kTiles = N / 16;
  if (n_end <= 0) return;
  const int lane = threadIdx.x & 31;
  const int b_r = (lane & 7) + (((lane >> 3) & 1) << 3), b_c = (lane >> 4) * 8;
  const int b_off = TileB::offset(b_r, b_col0 + b_c);
  int a_off;
  if constexpr (TransA)
    a_off = TileA::offset((lane & 7) + ((lane >> 4) << 3), a_row0 + ((lane >> 3) & 1) * 8);
  else
    a_off = TileA::offset(a_row0 + (lane & 15), (lane >> 4) * 8);
  auto a_addr = [&](int mt, int kk) {
    if constexpr (TransA)
      return sa.addr_at(TileA::Swz::step(a_off, mt) + kk * 16 * TileA::kCols);
    else
      return sa.addr_at(TileA::Swz::step(a_off, kk) + mt * 16 * TileA::kCols);
  };
  auto b_addr = [&](int nn, int kk) { return sb.addr_at(TileB::Swz::step(b_off, nn) + kk * 16 * TileB::kCols); };
  constexpr int kBufs = Prefetch ? 2 : 1;
  uint32_t a[kBufs][MT][4];
  auto load_a = [&](int kk, int buf) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (TransA)
        ldmatrix_x4_trans(a[buf][mt], a_addr(mt, kk));
      else
        ldmatrix_x4(a[buf][mt], a_addr(mt, kk));
    }
  };
  if constexpr (Prefetch) load_a(0, 0);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const int buf = Prefetch ? (kk & 1) : 0;
    if constexpr (Prefetch) {
      if (kk + 1 < kSteps) load_a(kk + 1, (kk + 1) & 1);
    } else {
      load_a(kk, 0);
    }
    uint32_t b[kBufs][4];
    if constexpr (Prefetch) ldmatrix_x4_trans(b[0], b_addr(0, kk));
#pragma unroll
    for (int nn = 0; nn < kTiles; ++nn) {
      const bool more = nn + 1 < kTiles && (nn + 1) * 16 < n_end;
      const int bb = Prefetch ? (nn & 1) : 0;
      if constexpr (Prefetch) {
        if (more) ldmatrix_x4_trans(b[(nn + 1) & 1], b_addr(nn + 1, kk));
      } else {
        ldmatrix_x4_trans(b[0], b_addr(nn, kk));
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816<T>(c[mt][2 * nn], a[buf][mt], b[bb][0], b[bb][1]);
        mma16816<T>(c[mt][2 * nn + 1], a[buf][mt], b[bb][2], b[bb][3]);
      }
      if (!more) break;
    }
  }
}

}  // namespace strideattn::cuda_impl
