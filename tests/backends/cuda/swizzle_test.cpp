// The shared-memory swizzle identity the warp GEMMs rely on (src/backends/cuda/common/smem_swizzle.hpp):
// stepping 16 columns is an XOR of the swizzled offset. Plain arithmetic: runs in every build.
#include <gtest/gtest.h>

#include <cstddef>
#include <set>

#include "backends/cuda/common/smem_swizzle.hpp"

namespace {

using strideattn::cuda_impl::Sw128Blocks;
using strideattn::cuda_impl::Swizzle;

template <int COLS>
void check_every_step() {
  int checked = 0;
  for (int row = 0; row < 512; ++row)
    for (int col = 0; col < COLS; col += 8)
      for (int k = 0; col + 16 * k < COLS; ++k) {
        // the GEMMs step from column 0 or 8 (any k), from 128 or 136 within that split,
        // (gemm_sn) from 64 or 72 within that 64-column half, or (the single pass's dQ
        // GEMM: dS^T's query halves, K's head-dim quarters) within a 32-column group
        const bool used = col < 16 || (col % 128 < 16 && col % 128 + 16 * k < 128) ||
                          (col % 64 < 16 && col % 64 + 16 * k < 64) || (col % 32 < 16 && col % 32 + 16 * k < 32);
        if (!used) continue;
        ASSERT_EQ(Swizzle<COLS>::step(Swizzle<COLS>::offset(row, col), k), Swizzle<COLS>::offset(row, col + 16 * k))
            << "COLS " << COLS << " row " << row << " col " << col << " k " << k;
        ++checked;
      }
  EXPECT_GT(checked, 512 * COLS / 16);
}

TEST(SmemSwizzle, SixteenColumnStepIsAnXorOfTheOffset) {
  check_every_step<64>();
  check_every_step<128>();
  check_every_step<256>();
}

TEST(SmemSwizzle, EightRowsOfOnePhaseHitEightDifferentChunks) {
  // ldmatrix reads one 16-byte chunk from each of 8 consecutive rows: with the swizzle they
  // land in 8 different 16-byte bank groups (offset mod 64 elements = 128 bytes).
  for (int col = 0; col < 128; col += 8)
    for (int row0 = 0; row0 < 64; row0 += 8) {
      std::set<int> groups;
      for (int r = row0; r < row0 + 8; ++r) groups.insert(Swizzle<128>::offset(r, col) % 64 / 8);
      EXPECT_EQ(groups.size(), 8u) << "col " << col << " rows " << row0 << "..";
    }
}

// The wgmma tiles: element (row, col) sits where the hardware's 128-byte swizzle puts the
// canonical layout's byte (column block col / 64 at ROWS * 128 bytes, rows at 128 bytes,
// columns at 2), i.e. that byte address with bits 4..6 XOR-ed by bits 7..9 (tile 1024-byte
// aligned); and the map is one to one over the tile.
template <int ROWS, int COLS>
void check_sw128() {
  std::set<int> seen;
  for (int row = 0; row < ROWS; ++row)
    for (int col = 0; col < COLS; col += 8) {
      const int linear = (col / 64) * ROWS * 128 + row * 128 + (col % 64) * 2;
      const int hardware = linear ^ (((linear >> 7) & 7) << 4);
      const int offset = Sw128Blocks<ROWS, COLS>::offset(row, col);
      ASSERT_EQ(2 * offset, hardware) << ROWS << " x " << COLS << " row " << row << " col " << col;
      seen.insert(offset);
    }
  EXPECT_EQ(seen.size(), std::size_t(ROWS * COLS / 8));
}

TEST(SmemSwizzle, WgmmaTilesMatchTheHardware128ByteSwizzle) {
  check_sw128<64, 64>();
  check_sw128<64, 128>();
  check_sw128<128, 64>();
  check_sw128<128, 128>();
  // at 64 columns it is the mma.sync kernels' layout
  for (int row = 0; row < 128; ++row)
    for (int col = 0; col < 64; col += 8)
      ASSERT_EQ((Sw128Blocks<128, 64>::offset(row, col)), Swizzle<64>::offset(row, col));
}

}  // namespace
