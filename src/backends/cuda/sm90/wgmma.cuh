// sm_90a warpgroup MMA (wgmma.mma_async) for the Hopper kernels: shared-memory matrix
// descriptors for the 128-byte-swizzled tiles of smem_swizzle.hpp (Sw128Blocks), the
// m64nNk16 instruction for N = 32 / 64 / 128 with fp32 accumulators and A from shared memory
// or (wgmma_rs_m64k16, N = 64 / 128) from registers, and the fences around it. Everything here compiles
// to nothing outside an sm_90a build (SA_WGMMA == 0); the host only launches the kernels
// that use it on a 9.0 GPU of an sm_90a build.
//
// Accumulator fragment of one warpgroup (128 threads, warp w = 0..3 of the group), c[N/8][4]:
// c[n][e] is row 16 w + g + 8 (e / 2), column 8 n + 2 t + (e % 2) (g = lane / 4, t = lane %
// 4), the m16n8k16 C layout of sm80/mma.cuh for 16 rows per warp, so the
// mma.sync kernels' epilogue and mask helpers take a warp's slice as a [1][N/8][4] tile.
// Operands (PTX ISA, "asynchronous warpgroup level matrix shared memory layout"): A is
// 64 x 16 and B is 16 x N, both read from shared memory through 64-bit descriptors;
// TransA = 0 means A is K-major (its rows, of the contraction, are contiguous),
// TransA = 1 M-major; TransB = 0 means B is K-major (stored N x K), 1 N-major (stored K x N).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backends/cuda/common/copy.cuh"
#include "backends/cuda/common/smem_swizzle.hpp"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SA_WGMMA 1
#else
#define SA_WGMMA 0
#endif

namespace strideattn::cuda_impl {

// Descriptor of a 128-byte-swizzled operand starting at shared byte address `addr` (inside
// a 1024-byte aligned tile; moving the start by whole 16-byte chunks inside a swizzle row is
// how K-steps and column offsets are taken, the hardware swizzles the final address).
// K-major: `sbo` = bytes between 8-row groups (1024), `lbo` unused (16).
// MN-major: `lbo` = bytes between 64-element column blocks, `sbo` = bytes between groups of
// 8 contraction rows (1024).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) |
         (uint64_t(1) << 62);  // layout type 1: SWIZZLE_128B
}

// A ROWS x COLS tile of 16-bit elements in the 128-byte swizzle (smem_swizzle.hpp,
// Sw128Blocks): the load_tile / store_accum interface of SmemTile plus wgmma descriptors.
template <int ROWS, int COLS>
struct Sw128Tile {
  using Layout = Sw128Blocks<ROWS, COLS>;
  static constexpr int kRows = ROWS, kCols = COLS, kElems = ROWS * COLS;
  static constexpr uint32_t kBlockBytes = 2u * Layout::kBlockElems;  // one 64-column block
  uint16_t* base;
  __device__ __forceinline__ static int offset(int row, int col) { return Layout::offset(row, col); }
  __device__ __forceinline__ uint16_t* chunk(int row, int col) const { return base + offset(row, col); }
  // The unswizzled byte offset of (row, col): what a descriptor's start address is given.
  SA_HD static constexpr uint32_t linear(int row, int col) {
    return uint32_t(col / 64) * kBlockBytes + uint32_t(row) * 128u + uint32_t(col % 64) * 2u;
  }
  // Operand whose contraction runs along the columns (K-major): rows row0.., k-step kk.
  __device__ __forceinline__ uint64_t k_major(int row0, int kk) const {
    return sw128_desc(smem_addr(base) + linear(row0, 16 * kk), 16, 1024);
  }
  // Operand whose contraction runs along the rows (M- or N-major): columns col0.., k-step kk.
  __device__ __forceinline__ uint64_t mn_major(int col0, int kk) const {
    return sw128_desc(smem_addr(base) + linear(16 * kk, col0), kBlockBytes, 1024);
  }
};

// Orders this thread's register and shared-memory accesses before the next wgmma
// (required before the first one and after any other instruction touched its registers).
__device__ __forceinline__ void wgmma_fence() {
#if SA_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if SA_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Until at most N committed groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if SA_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Keeps the compiler from moving reads or writes of wgmma registers across a wgmma fence,
// commit or wait (the asm statements above do not name the registers they order): fp32
// accumulators, and A fragments in registers (wgmma_rs_m64k16), whose writes must precede
// the wgmma_fence ahead of the MMAs that read them.
template <class E, int N>
__device__ __forceinline__ void fence_operands(E (&r)[N][4]) {
  static_assert(std::is_same_v<E, float> || std::is_same_v<E, uint32_t>, "fp32 or packed 16-bit registers");
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (std::is_same_v<E, float>)
        asm volatile("" : "+f"(r[n][e])::"memory");
      else
        asm volatile("" : "+r"(r[n][e])::"memory");
    }
}

// The asm of one wgmma: the accumulator registers %0 .. %(N/2 - 1) ("{" SA_D<N> "}"), then
// the operands numbered after them, the accumulator constraints last (they hold commas).
// The kernels use N = 32, 64 and 128 (from shared memory) and 64, 128 (A from registers).
// Hand-aligned asm operand lists: clang-format does not reach a fixed point on them.
// clang-format off
#define SA_D32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define SA_D64                                                                                  \
  SA_D32 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SA_D128                                                                                      \
  SA_D64 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
         "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SA_ACC4(n) "+f"(c[n][0]), "+f"(c[n][1]), "+f"(c[n][2]), "+f"(c[n][3])
#define SA_ACC32 SA_ACC4(0), SA_ACC4(1), SA_ACC4(2), SA_ACC4(3)
#define SA_ACC64 SA_ACC32, SA_ACC4(4), SA_ACC4(5), SA_ACC4(6), SA_ACC4(7)
#define SA_ACC128 \
  SA_ACC64, SA_ACC4(8), SA_ACC4(9), SA_ACC4(10), SA_ACC4(11), SA_ACC4(12), SA_ACC4(13), SA_ACC4(14), SA_ACC4(15)
// A and B from shared memory: operands desc_a = %A, desc_b = %B, accumulate = %P, TransA = %TA,
// TransB = %TB.
#define SA_WGMMA_SS(N, TY, A, B, P, TA, TB, ...)                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                      \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" SA_D##N "}, %" #A    \
               ", %" #B ", p, 1, 1, %" #TA ", %" #TB ";\n}\n"                                        \
               : __VA_ARGS__                                                                     \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TransA), "n"(TransB))
// A from registers a[0..3] = %A0 .. %A0 + 3, desc_b = %B, accumulate = %P, TransB = %TB.
#define SA_WGMMA_RS(N, TY, A0, A1, A2, A3, B, P, TB, ...)                                         \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                      \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" SA_D##N "}, {%" #A0   \
               ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1, %" #TB ";\n}\n"                      \
               : __VA_ARGS__                                                                     \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TransB))
#define SA_WGMMA_M64N32K16(TY) SA_WGMMA_SS(32, TY, 16, 17, 18, 19, 20, SA_ACC32)
#define SA_WGMMA_M64N64K16(TY) SA_WGMMA_SS(64, TY, 32, 33, 34, 35, 36, SA_ACC64)
#define SA_WGMMA_M64N128K16(TY) SA_WGMMA_SS(128, TY, 64, 65, 66, 67, 68, SA_ACC128)
#define SA_WGMMA_RS_M64N64K16(TY) SA_WGMMA_RS(64, TY, 32, 33, 34, 35, 36, 37, 38, SA_ACC64)
#define SA_WGMMA_RS_M64N128K16(TY) SA_WGMMA_RS(128, TY, 64, 65, 66, 67, 68, 69, 70, SA_ACC128)
// clang-format on

// c (+)= A * B for one k16 step: accumulate = 0 overwrites c (the first step of a GEMM).
template <class T, int TransA, int TransB, int NT>
__device__ __forceinline__ void wgmma_m64k16(float (&c)[NT][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if SA_WGMMA
  static_assert(NT == 4 || NT == 8 || NT == 16, "N = 32, 64 or 128");
  if constexpr (std::is_same_v<T, __half>) {
    if constexpr (NT == 4) SA_WGMMA_M64N32K16("f16");
    if constexpr (NT == 8) SA_WGMMA_M64N64K16("f16");
    if constexpr (NT == 16) SA_WGMMA_M64N128K16("f16");
  } else {
    if constexpr (NT == 4) SA_WGMMA_M64N32K16("bf16");
    if constexpr (NT == 8) SA_WGMMA_M64N64K16("bf16");
    if constexpr (NT == 16) SA_WGMMA_M64N128K16("bf16");
  }
#endif
}

// c (+)= A * B for one k16 step with A in registers: a[4] is this thread's A fragment of
// the warp's 16 rows, the m16n8k16 A layout of sm80/mma.cuh (accum_to_a builds it
// from an accumulator: the forward's P). B from shared memory as above.
template <class T, int TransB, int NT>
__device__ __forceinline__ void wgmma_rs_m64k16(float (&c)[NT][4], const uint32_t (&a)[4], uint64_t desc_b,
                                                int accumulate) {
#if SA_WGMMA
  static_assert(NT == 8 || NT == 16, "N = 64 or 128 (the forwards' O += P V: d <= 64, and 128 columns of a wider O)");
  if constexpr (std::is_same_v<T, __half>) {
    if constexpr (NT == 8) SA_WGMMA_RS_M64N64K16("f16");
    if constexpr (NT == 16) SA_WGMMA_RS_M64N128K16("f16");
  } else {
    if constexpr (NT == 8) SA_WGMMA_RS_M64N64K16("bf16");
    if constexpr (NT == 16) SA_WGMMA_RS_M64N128K16("bf16");
  }
#endif
}

#undef SA_WGMMA_M64N32K16
#undef SA_WGMMA_M64N64K16
#undef SA_WGMMA_M64N128K16
#undef SA_WGMMA_RS_M64N64K16
#undef SA_WGMMA_RS_M64N128K16
#undef SA_WGMMA_SS
#undef SA_WGMMA_RS
#undef SA_ACC128
#undef SA_ACC64
#undef SA_ACC32
#undef SA_ACC4
#undef SA_D128
#undef SA_D64
#undef SA_D32

}  // namespace strideattn::cuda_impl
