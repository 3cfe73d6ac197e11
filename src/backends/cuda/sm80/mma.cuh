// Warp-level building blocks of the sm80+ kernels: the m16n8k16 tensor-core MMA (fp32
// accumulate), ldmatrix, cp.async, the swizzled shared-memory tile layout, the strided
// global->shared tile loader (16-byte cp.async fast path, element-wise slow path) and the
// three warp GEMM shapes the kernels are made of:
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

#include "backends/cuda/common/smem_swizzle.hpp"

namespace strideattn::cuda_impl {

// ------------------------------------------------------------------ element types

template <class T>
struct ElementTraits;
template <>
struct ElementTraits<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t u) {
    __half2 h = *reinterpret_cast<__half2*>(&u);
    return __half22float2(h);
  }
  static __device__ __forceinline__ uint16_t from_float(float x) { return __half_as_ushort(__float2half_rn(x)); }
  static __device__ __forceinline__ float to_float(uint16_t u) { return __half2float(__ushort_as_half(u)); }
};
template <>
struct ElementTraits<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t u) {
    __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&u);
    return __bfloat1622float2(h);
  }
  static __device__ __forceinline__ uint16_t from_float(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
  static __device__ __forceinline__ float to_float(uint16_t u) { return __bfloat162float(__ushort_as_bfloat16(u)); }
};

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

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
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

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
// 4-byte copy (through L1): the per-row LSE and delta of a query block, so that their
// latency, like the tiles', hides behind the current block's work.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// sm_90 bulk reductions (the TMA unit): global[dst, dst + bytes) += shared[src, src + bytes)
// as fp32, both 16-byte aligned, bytes a multiple of 16. The shared source must not change
// until bulk_wait_read (per thread: the issuing thread waits for its own operations), and
// generic-proxy writes to it must be made visible first (fence_async_shared by each writer,
// then a barrier). Only the sm_90 build calls these (kBulkReduce); elsewhere they are empty.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
inline constexpr bool kBulkReduce = true;
#else
inline constexpr bool kBulkReduce = false;
#endif
__device__ __forceinline__ void fence_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Until this thread's bulk operations have read their shared source / have completed.
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
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

// Where a tile's rows come from in global memory: row r of the tile is token (row0 + r) of
// a sequence; its element 0 is at gptr + base + (row0 + r) * s_stride. `rows` tokens are
// valid, `cols` elements of each row (a multiple of 8). `aligned` selects 16-byte cp.async
// (base pointer and every used stride a multiple of 8 elements); otherwise element loads.
struct GlobalRows {
  const uint16_t* ptr = nullptr;  // already offset to (sequence, head, token row0)
  int64_t s_stride = 0;
  int rows = 0;
  int cols = 0;
  bool aligned = false;
};

// Copy a tile from global memory into shared memory; rows >= src.rows and columns >=
// src.cols are zero-filled, so padded rows and head-dim columns contribute nothing.
// Full tiles with 16-byte-aligned rows (the common case: every row valid, the head dim equal
// to the tile width) take a path with no per-chunk test: each thread owns one column chunk
// and every kRowsPerPass-th row, so its global address steps by a fixed stride and, where
// kRowsPerPass is a multiple of 8 (the swizzle repeats every 8 rows), its shared-memory
// offset by an immediate. The general loop below costs about 40 instructions per chunk in
// the sm_90a SASS (bounds, alignment branch, swizzle); this one a few.
template <int NTHREADS, class Tile>
__device__ __forceinline__ void load_tile(const Tile& tile, const GlobalRows& src) {
  constexpr int kChunksPerRow = Tile::kCols / 8;
  constexpr int kChunks = Tile::kRows * kChunksPerRow;
  static_assert(kChunks % NTHREADS == 0, "tile chunks must divide evenly among threads");
  static_assert(NTHREADS % kChunksPerRow == 0, "a thread keeps one column chunk");
  if (src.aligned && src.rows >= Tile::kRows && src.cols >= Tile::kCols) {
    constexpr int kRowsPerPass = NTHREADS / kChunksPerRow;
    const int row0 = threadIdx.x / kChunksPerRow, col = (threadIdx.x % kChunksPerRow) * 8;
    const uint16_t* g = src.ptr + row0 * src.s_stride + col;
    const int64_t step = int64_t(kRowsPerPass) * src.s_stride;
#pragma unroll
    for (int i = 0; i < kChunks / NTHREADS; ++i)
      cp_async_16(smem_addr(tile.chunk(row0 + i * kRowsPerPass, col)), g + i * step);
    return;
  }
#pragma unroll
  for (int i = 0; i < kChunks / NTHREADS; ++i) {
    const int idx = i * NTHREADS + threadIdx.x;
    const int row = idx / kChunksPerRow;
    const int col = (idx % kChunksPerRow) * 8;
    uint16_t* dst = tile.chunk(row, col);
    if (row < src.rows && col < src.cols) {
      const uint16_t* g = src.ptr + row * src.s_stride + col;
      if (src.aligned) {
        cp_async_16(smem_addr(dst), g);
      } else {
        uint16_t v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = g[e];
        uint4 packed;
        packed.x = uint32_t(v[0]) | (uint32_t(v[1]) << 16);
        packed.y = uint32_t(v[2]) | (uint32_t(v[3]) << 16);
        packed.z = uint32_t(v[4]) | (uint32_t(v[5]) << 16);
        packed.w = uint32_t(v[6]) | (uint32_t(v[7]) << 16);
        *reinterpret_cast<uint4*>(dst) = packed;
      }
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
}

// ------------------------------------------------------------------ warp GEMMs

// C[MT][N/8][4] += A * B^T. A: rows a_row0 + 16*mt + (0..15) of `sa`, B: rows b_row0 + (0..N-1)
// of `sb`, both with the contraction along columns [0, k_end) (k_end a multiple of 8; the
// columns up to the next multiple of 16 must be zero in shared memory).
// Software-pipelined: the fragments of k-step kk+1 are requested from shared memory before
// the MMAs of step kk issue, so ldmatrix latency hides behind tensor-core work (two warps
// per scheduler cannot hide it otherwise). The sum over k runs in the same order as a plain
// loop: results are bitwise those of the unpipelined GEMM.
// Prefetch = false: the plain loop (fewer live fragments, for kernels where the pipelined
// one spills; kernel_traits.cuh says where), same sums in the same order.
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

// ------------------------------------------------------------------ global stores

// Store two adjacent elements (cols col, col+1) of one row; 4-byte store when the target is
// 4-byte aligned (`pair_aligned`: base pointer and strides even), two 2-byte stores otherwise.
template <class T>
__device__ __forceinline__ void store_pair(uint16_t* row_ptr, int col, float x0, float x1, bool pair_aligned) {
  if (pair_aligned) {
    *reinterpret_cast<uint32_t*>(row_ptr + col) = ElementTraits<T>::pack(x0, x1);
  } else {
    row_ptr[col] = ElementTraits<T>::from_float(x0);
    row_ptr[col + 1] = ElementTraits<T>::from_float(x1);
  }
}

}  // namespace strideattn::cuda_impl
