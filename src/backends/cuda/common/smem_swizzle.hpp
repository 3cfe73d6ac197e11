// The XOR swizzle of the CUDA kernels' shared-memory tiles, as plain host-device arithmetic so
// that a CPU test (tests/backends/cuda/swizzle_test.cpp) checks the identity the warp GEMMs
// step their ldmatrix addresses by.
//
// A tile of ROWS x COLS 16-bit elements stores each row contiguously with its 16-byte chunks
// XOR-swizzled by (row % 8), so the 8 row addresses of one ldmatrix phase hit 8 bank groups.
// Moving 16 columns right (one k-step of an m16n8k16 MMA) from a column below 16 flips only
// element-offset bits 4 .. log2(COLS)-1, which the row's own offset (a multiple of COLS) never
// uses: offset(row, col + 16k) == offset(row, col) ^ 16k. The GEMMs compute the swizzled
// offset once per lane and XOR per step instead of redoing the swizzle (about ten integer
// instructions per step in the sm_90a SASS of the d=128 forward).
#pragma once

#include "common/attention_math.hpp"  // SA_HD

namespace strideattn::cuda_impl {

template <int COLS>
struct Swizzle {
  static_assert(COLS % 64 == 0, "swizzle needs rows of at least 128 bytes");
  // Element offset of (row, col), col a multiple of 8.
  SA_HD static int offset(int row, int col) { return row * COLS + (((col >> 3) ^ (row & 7)) << 3); }
  // offset(row, col + 16 * k) from offset(row, col) when col + 16 * k < COLS and either
  // col < 16 (the k-steps of gemm_nt, the column tiles of gemm_rn from column 0) or
  // col % 128 < 16 with col % 128 + 16 * k < 128 (gemm_rn's tiles inside the 128-column
  // split starting at column 128), or col % 64 < 16 with col % 64 + 16 * k < 64 (gemm_sn's
  // tiles inside the head-dim half starting at column 64), or col % 32 < 16 with
  // col % 32 + 16 * k < 32 (the single pass's dQ GEMM: 32-column groups). The CPU test checks every such
  // (row, col, k) for the tile widths the kernels use.
  SA_HD static int step(int offset_at_col, int k) { return offset_at_col ^ (16 * k); }
};

// The tiles of the sm_90a wgmma kernels: ROWS x COLS 16-bit elements stored as COLS / 64
// column blocks of ROWS x 64, each row of a block 128 bytes with its 16-byte chunks XOR-ed
// by (row % 8). With the tile 1024-byte aligned this is the hardware's 128-byte swizzle
// (address bits 4..6 ^= bits 7..9), so a wgmma descriptor with SWIZZLE_128B reads any
// 8-row-aligned slice: K-major (the 64 columns are the contraction; 8-row groups 1024
// bytes apart) or MN-major (the rows are the contraction; column blocks ROWS * 128 bytes
// apart). At COLS == 64 it is Swizzle<64>, the layout the mma.sync kernels use.
// (tests/backends/cuda/swizzle_test.cpp checks it against the hardware formula.)
template <int ROWS, int COLS>
struct Sw128Blocks {
  static_assert(COLS % 64 == 0 && ROWS % 8 == 0, "128-byte swizzle atoms are 8 rows x 64 columns");
  static constexpr int kBlockElems = ROWS * 64;  // one 64-column block
  // Element offset of (row, col), col a multiple of 8.
  SA_HD static int offset(int row, int col) {
    return (col >> 6) * kBlockElems + row * 64 + ((((col & 63) >> 3) ^ (row & 7)) << 3);
  }
};

}  // namespace strideattn::cuda_impl
