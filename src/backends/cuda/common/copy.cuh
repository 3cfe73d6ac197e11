// Global -> shared copies both architectures use: cp.async (16 and 4 bytes), the strided
// tile loader with its 16-byte fast path and element-wise slow path, and the proxy fence the
// sm_90a kernels put between those writes and their wgmma reads.
#pragma once

#include <cstdint>

#include "backends/cuda/common/kv_cache_rows.hpp"
#include "backends/cuda/common/tensor_ref.hpp"

namespace strideattn::cuda_impl {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
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

// Makes this thread's generic-proxy writes to shared memory (st.shared, cp.async) visible to
// the async proxy (the sm_90a wgmma operand reads); sm_90 only, empty elsewhere.
__device__ __forceinline__ void fence_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

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
// Tokens [token0, token0 + rows) of `head` of a sequence's tensor, `cols` elements of each.
__device__ __forceinline__ GlobalRows rows_of(const TensorRef<const uint16_t>& t, int64_t token0, int64_t head,
                                              int rows, int cols, bool aligned) {
  return {t.row(token0, head), t.token_stride(), rows, cols, aligned};
}

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

// CacheRows::first_page when the loader reads the block table itself.
inline constexpr int32_t kLookUpPage = INT32_MIN;

// Rows of a KV cache (CacheRef): tokens [token0, token0 + rows) of `head`. A contiguous cache
// is rows at a fixed stride (the loader above); a paged one has each row's address looked up
// through the block table, and a row whose page is outside the pool gets `ref.missing` in
// every element instead of a read. `first_page`: the table entry of this thread's first row
// if it was read ahead (page_ahead), else kLookUpPage.
struct CacheRows {
  CacheRef<const uint16_t> ref;
  int64_t token0 = 0, head = 0;
  int rows = 0;
  int cols = 0;
  bool aligned = false;
  int32_t first_page = kLookUpPage;
};
__device__ __forceinline__ CacheRows rows_of(const CacheRef<const uint16_t>& t, int64_t token0, int64_t head, int rows,
                                             int cols, bool aligned) {
  return {t, token0, head, rows, cols, aligned};
}

// `src` with its first table entry read ahead (a cache's rows), or as it is (a tensor's rows).
__device__ __forceinline__ CacheRows with_first_page(CacheRows src, int32_t page) {
  src.first_page = page;
  return src;
}
__device__ __forceinline__ const GlobalRows& with_first_page(const GlobalRows& src, int32_t) { return src; }

// The paged loader's thread layout (load_tile of CacheRows below): each thread keeps one
// column chunk of kPerThread consecutive rows, its first one is row first_row().
template <int NTHREADS, class Tile>
struct PagedLayout {
  static constexpr int kChunksPerRow = Tile::kCols / 8;
  static constexpr int kChunks = Tile::kRows * kChunksPerRow;
  static_assert(kChunks % NTHREADS == 0, "tile chunks must divide evenly among threads");
  static_assert(NTHREADS % kChunksPerRow == 0, "a thread keeps one column chunk");
  static constexpr int kPerThread = kChunks / NTHREADS;
  __device__ __forceinline__ static int first_row() { return int(threadIdx.x / kChunksPerRow) * kPerThread; }
};

// The block-table entry of this thread's first row of a paged tile of `rows` tokens from
// `token0` (kLookUpPage for a contiguous cache or a row past `rows`). A forward reads it one
// key block before it loads the tile, so the dependent table read is off the load path,
// which runs on the warps that also issue the GEMMs; K and V share it (same tokens, table and
// tile shape).
template <int NTHREADS, class Tile>
__device__ __forceinline__ int32_t page_ahead(const CacheRef<const uint16_t>& ref, int64_t token0, int rows) {
  const int row0 = PagedLayout<NTHREADS, Tile>::first_row();
  const KvCacheParams& kv = *ref.kv;
  if (kv.block_table == nullptr || row0 >= rows) return kLookUpPage;
  const uint32_t column = kv.page.div(uint32_t(token0 + row0));
  return kv.block_table[ref.batch * kv.bt_b + int64_t(column) * kv.bt_p];
}

// load_tile of cache rows: contiguous, the strided loader (its fast path included); paged, each
// thread keeps one column chunk of kPerThread consecutive rows (tokens), so one block-table
// lookup (a multiply-shift divide, one table load, one 64-bit address) serves every row of a
// page it meets, and the next row's address is an increment; a row that starts a new page
// looks that page up (the first one's entry may come read ahead, src.first_page). (Looking
// up every row on its own costs a divide, a table load and a 64-bit address per row, on the
// warps that also run the GEMMs.)
template <int NTHREADS, class Tile>
__device__ __forceinline__ void load_tile(const Tile& tile, const CacheRows& src) {
  if (src.ref.kv->block_table == nullptr) {
    load_tile<NTHREADS>(
        tile, GlobalRows{src.ref.row(src.token0, src.head), src.ref.strides->s, src.rows, src.cols, src.aligned});
    return;
  }
  using L = PagedLayout<NTHREADS, Tile>;
  constexpr int kPerThread = L::kPerThread;
  const uint32_t fill = uint32_t(src.ref.missing) * 0x10001u;
  const KvCacheParams& kv = *src.ref.kv;
  const kernel::Strides& st = *src.ref.strides;
  const int col = (threadIdx.x % L::kChunksPerRow) * 8;
  const int row0 = L::first_row();
  const uint32_t t0 = uint32_t(src.token0 + row0);
  uint32_t column = kv.page.div(t0), slot = kv.page.mod(t0, column);
  // The common case, a whole column chunk of kPerThread rows inside one page (pages of a
  // multiple of kPerThread rows), 16-byte aligned: one entry, then rows at a fixed stride,
  // with none of the general loop's per-row tests (about 60 instructions a row in the
  // sm_90a SASS, most of them the predicated element path).
  if (src.aligned && col < src.cols && row0 + kPerThread <= src.rows && slot + uint32_t(kPerThread) <= kv.page.d) {
    const int32_t page = src.first_page != kLookUpPage
                             ? src.first_page
                             : kv.block_table[src.ref.batch * kv.bt_b + int64_t(column) * kv.bt_p];
    if (page >= 0 && page < kv.num_pages) {
      const int64_t step = st.s;
      const uint16_t* g = src.ref.data + (int64_t(page) * st.b + int64_t(slot) * step + src.head * st.h) + col;
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) cp_async_16(smem_addr(tile.chunk(row0 + i, col)), g + i * step);
    } else {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i)
        *reinterpret_cast<uint4*>(tile.chunk(row0 + i, col)) = make_uint4(fill, fill, fill, fill);
    }
    return;
  }
  bool look_up = true, ok = false;  // the current page's entry is still to read; it is valid
  const uint16_t* g = nullptr;
  auto enter_page = [&](int32_t page) {
    ok = page >= 0 && page < kv.num_pages;
    g = src.ref.data + (int64_t(page) * st.b + int64_t(slot) * st.s + src.head * st.h);
    look_up = false;
  };
  if (src.first_page != kLookUpPage) enter_page(src.first_page);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int row = row0 + i;
    uint16_t* dst = tile.chunk(row, col);
    const bool in = row < src.rows;
    if (in && look_up) enter_page(kv.block_table[src.ref.batch * kv.bt_b + int64_t(column) * kv.bt_p]);
    if (!in || col >= src.cols) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    } else if (!ok) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(fill, fill, fill, fill);
    } else if (src.aligned) {
      cp_async_16(smem_addr(dst), g + col);
    } else {
      uint16_t v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = g[col + e];
      uint4 packed;
      packed.x = uint32_t(v[0]) | (uint32_t(v[1]) << 16);
      packed.y = uint32_t(v[2]) | (uint32_t(v[3]) << 16);
      packed.z = uint32_t(v[4]) | (uint32_t(v[5]) << 16);
      packed.w = uint32_t(v[6]) | (uint32_t(v[7]) << 16);
      *reinterpret_cast<uint4*>(dst) = packed;
    }
    if (++slot == kv.page.d) {
      slot = 0, ++column, look_up = true;
    } else {
      g += st.s;
    }
  }
}

}  // namespace strideattn::cuda_impl
