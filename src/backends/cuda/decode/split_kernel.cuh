// The attention kernel of KV-cache calls (flash-decoding, decode_tiles.hpp): one CTA per (KV
// head, row tile, split of the keys) of a sequence. The row tile packs the GQA group's query
// heads times the query rows, query-major (row r: query row r / group, head kv_head * group +
// r % group), into the 16 rows of one m16n8k16 tile, so every K and V row loaded serves the
// whole group. K and V rows stream through a ring of cp.async stages (decode_tile: stages - 1
// in flight while one is used): the sequence's rows of a contiguous cache, or in a paged
// cache each page's rows from its block-table entry (any page size). The 4 warps take the
// stage's 16-key slabs in turn, each with its own online softmax (common/softmax.cuh) over
// S = Q K^T and O += P V (sm80/mma.cuh, mma.sync: sm_80 and sm_90), and merge their rows in
// shared memory at the end. One split: O and LSE are written here; several: each writes its
// normalised fp32 partial O and natural-log LSE rows for combine.cuh.
// Lengths come from device memory (decode_params.hpp: seq_lengths); a sequence whose lengths
// or block-table entries break the caller's promises reads nothing out of bounds and gets NaN
// rows (docs/semantics.md "KV cache").
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/cuda/common/element.cuh"
#include "backends/cuda/common/fragment.cuh"
#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/lse.hpp"
#include "backends/cuda/common/softmax.cuh"
#include "backends/cuda/decode/decode_params.hpp"
#include "backends/cuda/decode/decode_tiles.hpp"
#include "backends/cuda/sm80/mma.cuh"

namespace strideattn::cuda_impl {

// 8 elements of a row into a 16-byte shared-memory chunk: cp.async when the source is 16-byte
// aligned (Vec), element loads otherwise; zeros where there is no source (!have: rows past the
// keys, columns past the head dim, rows of an invalid page).
template <bool Vec>
__device__ __forceinline__ void load_chunk(uint16_t* dst, const uint16_t* src, bool have) {
  if (!have) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  } else if constexpr (Vec) {
    cp_async_16(smem_addr(dst), src);
  } else {
    uint32_t w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = uint32_t(src[2 * e]) | (uint32_t(src[2 * e + 1]) << 16);
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <class T, int D, bool Vec, bool Paged>
__device__ __forceinline__ void decode_split_body(const DecodeParams& p) {
  constexpr DecodeTile kTile = decode_tile(D);
  constexpr int Stage = kTile.stage_keys, Stages = kTile.stages, Slabs = Stage / kDecodeSlab;
  using QTile = SmemTile<kDecodeRows, D>;
  using StageTile = SmemTile<Stage, D>;
  using SlabTile = SmemTile<kDecodeSlab, D>;
  static_assert((QTile::kElems + Stages * 2 * StageTile::kElems) * 2 == kTile.smem_bytes,
                "the shared memory the host grants");
  static_assert(Stage % kDecodeSlab == 0 && Stages >= 3, "whole slabs; at least two stages in flight");
  // The warps' merge reuses the ring: 16 rows x D fp32 per warp.
  static_assert(kDecodeWarps * kDecodeRows * D * 4 <= Stages * 2 * StageTile::kElems * 2, "merge fits the ring");
  constexpr int kCpr = D / 8, kRpp = kDecodeThreads / kCpr;  // chunks per row, rows per pass
  static_assert(Stage % kRpp == 0 && kDecodeRows % kRpp == 0, "loads in whole passes");

  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float s_m[kDecodeWarps][kDecodeRows], s_l[kDecodeWarps][kDecodeRows];
  __shared__ float s_alpha[kDecodeWarps][kDecodeRows], s_row_m[kDecodeRows], s_row_l[kDecodeRows];
  const QTile sQ{reinterpret_cast<uint16_t*>(smem)};
  uint16_t* const ring = sQ.base + QTile::kElems;
  auto sK = [&](int b) { return StageTile{ring + b * 2 * StageTile::kElems}; };
  auto sV = [&](int b) { return StageTile{ring + (b * 2 + 1) * StageTile::kElems}; };

  const int64_t n = blockIdx.y;
  const int64_t kv_head = int64_t(blockIdx.x) % p.kv_heads;
  const int64_t tile_split = int64_t(blockIdx.x) / p.kv_heads;
  const int64_t row_tile = tile_split % p.row_tiles, split = tile_split / p.row_tiles;
  const int64_t rows = p.group * p.s_q, r0 = row_tile * kDecodeRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const SeqLengths len = seq_lengths(p, n);
  const MaskRule mask = seq_mask(p, len);
  const bool partial = p.splits > 1;

  // Where the tile's row r goes: query row and head (valid: a row of the problem).
  auto row_query = [&](int r) { return (r0 + r) / p.group; };
  auto row_head = [&](int r) { return kv_head * p.group + (r0 + r) % p.group; };
  auto o_row = [&](int r) {
    return static_cast<uint16_t*>(p.o) + n * p.o_st.b + row_query(r) * p.o_st.s + row_head(r) * p.o_st.h;
  };
  auto lse_index = [&](int r) { return n * p.lse_st.b + row_head(r) * p.lse_st.h + row_query(r) * p.lse_st.s; };
  auto part_index = [&](int r) { return ((split * p.batch + n) * p.heads + row_head(r)) * p.s_q + row_query(r); };

  if (len.broken) {  // every row of the sequence NaN (the combine writes them when split)
    if (!partial)
      for (int idx = threadIdx.x; idx < kDecodeRows * D; idx += kDecodeThreads) {
        const int r = idx / D, col = idx % D;
        if (r0 + r >= rows || col >= p.d_v) continue;
        o_row(r)[col] = ElementTraits<T>::from_float(NAN);
        if (col == 0 && p.lse != nullptr) p.lse[lse_index(r)] = NAN;
      }
    return;
  }

  // The tile's query rows [i0, i1) and the keys any of them sees, within this split's share
  // (stage-aligned, from the attended length read above).
  const int64_t i0 = r0 / p.group;
  const int64_t i1 = kernel::min64(kernel::ceil_div(kernel::min64(r0 + kDecodeRows, rows), p.group), len.q_rows);
  const TileRange keys = i1 > i0 ? kernel::key_range_for_rows(mask, i0, i1) : TileRange{0, 0};
  const int64_t chunk = kernel::ceil_div(kernel::ceil_div(len.attended, p.splits), Stage) * Stage;
  const int64_t split_begin = split * chunk, split_end = kernel::min64(split_begin + chunk, len.attended);
  const int64_t kb = kernel::max64(keys.begin, split_begin), ke = kernel::min64(keys.end, split_end);
  const int n_stages = ke > kb ? int(kernel::ceil_div(ke - kb, Stage)) : 0;
  // Slabs inside [full_lo, full_hi) are visible to every row of the tile: no mask.
  const int64_t full_lo = i1 > i0 ? kernel::max64(mask.key_begin(i1 - 1), kb) : 0;
  const int64_t full_hi = i1 > i0 ? kernel::min64(mask.key_end(i0), ke) : 0;
  // This thread's two rows (g, g + 8): their keys within the share ([0, 0) for rows past the
  // problem's, which are computed on zeros and never stored).
  int64_t row_lo[2], row_hi[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    const bool valid = r0 + r < rows && row_query(r) < len.q_rows;
    row_lo[h] = valid ? kernel::max64(mask.key_begin(row_query(r)), kb) : 0;
    row_hi[h] = valid ? kernel::min64(mask.key_end(row_query(r)), ke) : 0;
  }

  const int d_qk = int(p.d_qk), d_v = int(p.d_v);
  const bool vec_q = (p.aligned & kVecQ) != 0;
  const int col = (threadIdx.x % kCpr) * 8, pass_row = threadIdx.x / kCpr;
  const bool k_col = col < d_qk, v_col = col < d_v;
  const uint16_t* const k_head = static_cast<const uint16_t*>(p.k) + kv_head * p.k_st.h + col;
  const uint16_t* const v_head = static_cast<const uint16_t*>(p.v) + kv_head * p.v_st.h + col;

  // This thread's rows of the stages. Contiguous caches: tokens kb + pass_row, then every
  // kRpp-th; stages are loaded in order, each exactly once, so the next row's address is an
  // increment. Paged caches: the thread takes kPasses consecutive tokens of each stage (row
  // pass_row * kPasses + pass), so one page usually serves all of them: a stage divides once
  // to find its first token's page, reads that page's block-table entry and computes one
  // address, then moves by a token per row and reads the next entry only where it crosses
  // into the next page. (Addressing every row through the table, as the contiguous rows'
  // order would need, made the paged kernel execute 1.7x the contiguous one's instructions
  // and run at 0.75x its speed.)
  constexpr int kPasses = Stage / kRpp;
  const int64_t k_step = int64_t(kRpp) * p.k_st.s, v_step = int64_t(kRpp) * p.v_st.s;
  const uint16_t *kp = nullptr, *vp = nullptr;
  if constexpr (!Paged) {
    kp = k_head + n * p.k_st.b + (kb + pass_row) * p.k_st.s;
    vp = v_head + n * p.v_st.b + (kb + pass_row) * p.v_st.s;
  }

  // Keys [c0, c0 + Stage) of the share into ring buffer `buf`; rows past ke and rows of an
  // invalid page are zero-filled (the latter flagged in this thread's bad_page, which the CTA
  // ORs at the end). A page's entry is read only for a row the share covers.
  bool bad_page = false;
  auto load_stage = [&](int stage, int buf) {
    const int64_t c0 = kb + int64_t(stage) * Stage;
    const int valid = int(kernel::min64(Stage, ke - c0));
    if constexpr (Paged) {
      const std::uint32_t page_size = std::uint32_t(p.page_size);
      const std::uint32_t tok = std::uint32_t(c0) + std::uint32_t(pass_row * kPasses);
      std::uint32_t column = tok / page_size, slot = tok - column * page_size;
      bool look_up = true, ok = false;  // the current page's entry is still to read; it is valid
      const uint16_t *kr = k_head, *vr = v_head;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int row = pass_row * kPasses + pass;
        const bool in = row < valid;
        if (in && look_up) {
          const int64_t page = p.block_table[n * p.bt_b + int64_t(column) * p.bt_p];
          ok = page >= 0 && page < p.num_pages;
          kr = k_head + page * p.k_st.b + int64_t(slot) * p.k_st.s;
          vr = v_head + page * p.v_st.b + int64_t(slot) * p.v_st.s;
          look_up = false;
        }
        bad_page |= in && !ok;
        load_chunk<Vec>(sK(buf).chunk(row, col), kr, in && ok && k_col);
        load_chunk<Vec>(sV(buf).chunk(row, col), vr, in && ok && v_col);
        if (++slot == page_size) {
          slot = 0, ++column, look_up = true;
        } else {
          kr += p.k_st.s;
          vr += p.v_st.s;
        }
      }
    } else {
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int row = pass * kRpp + pass_row;
        const bool have = row < valid;
        load_chunk<Vec>(sK(buf).chunk(row, col), kp, have && k_col);
        load_chunk<Vec>(sV(buf).chunk(row, col), vp, have && v_col);
        kp += k_step;
        vp += v_step;
      }
    }
  };

  if (n_stages > 0) {
    const uint16_t* const q = static_cast<const uint16_t*>(p.q) + n * p.q_st.b;
#pragma unroll
    for (int pass = 0; pass < kDecodeRows / kRpp; ++pass) {
      const int r = pass * kRpp + pass_row;
      const bool have = r0 + r < rows && row_query(r) < len.q_rows && col < d_qk;
      const uint16_t* src = have ? q + row_query(r) * p.q_st.s + row_head(r) * p.q_st.h + col : nullptr;
      if (vec_q)
        load_chunk<true>(sQ.chunk(r, col), src, have);
      else
        load_chunk<false>(sQ.chunk(r, col), src, have);
    }
  }
#pragma unroll
  for (int s = 0; s < Stages - 1; ++s) {
    if (s < n_stages) load_stage(s, s);
    cp_async_commit();
  }

  float o_acc[1][D / 8][4];
  zero<1, D>(o_acc);
  float row_max[1][2] = {{-INFINITY, -INFINITY}}, row_sum[1][2] = {{0.f, 0.f}};

  for (int it = 0; it < n_stages; ++it) {
    // Stage `it` has landed and every warp is done with stage it - 1, whose buffer the load
    // of stage it + Stages - 1 refills.
    cp_async_wait<Stages - 2>();
    __syncthreads();
    if (it + Stages - 1 < n_stages) load_stage(it + Stages - 1, (it + Stages - 1) % Stages);
    cp_async_commit();
    const int buf = it % Stages;
    const int64_t c0 = kb + int64_t(it) * Stage;
#pragma unroll
    for (int s = 0; s < Slabs; ++s) {
      if ((it * Slabs + s) % kDecodeWarps != warp) continue;
      const int64_t c = c0 + s * kDecodeSlab;
      if (c >= ke) break;
      const SlabTile sKs{sK(buf).base + s * kDecodeSlab * D}, sVs{sV(buf).base + s * kDecodeSlab * D};
      float sc[1][kDecodeSlab / 8][4];
      zero<1, kDecodeSlab>(sc);
      gemm_nt<T, 1, kDecodeSlab, D>(sc, sQ, 0, sKs, 0, d_qk);
      if (c < full_lo || c + kDecodeSlab > full_hi) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int nt = 0; nt < kDecodeSlab / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int64_t j = c + nt * 8 + 2 * t + e;
              if (j < row_lo[h] || j >= row_hi[h]) sc[0][nt][2 * h + e] = -INFINITY;
            }
      }
      online_softmax_step<1, kDecodeSlab, D>(sc, o_acc, row_max, row_sum, p.scale_log2);
      uint32_t pf[1][kDecodeSlab / 16][4];
      accum_to_a<T, 1, kDecodeSlab>(pf, sc);
      gemm_rn<T, 1, kDecodeSlab, D>(o_acc, pf, sVs, 0, d_v);
    }
  }
  cp_async_wait<0>();
  const bool bad = __syncthreads_or(bad_page) != 0;  // (also the barrier before the ring's reuse)

  // Merge the warps' rows: each warp's O (unnormalised), max and sum into shared memory, then
  // per row the common max, each warp's factor 2^(round(m_w c) - round(m c)) and the sum.
  float* const red = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = row_sum[0][h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = g + 8 * h;
    if (t == 0) s_m[warp][r] = row_max[0][h], s_l[warp][r] = l;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
      *reinterpret_cast<float2*>(red + (warp * kDecodeRows + r) * D + nt * 8 + 2 * t) =
          make_float2(o_acc[0][nt][2 * h], o_acc[0][nt][2 * h + 1]);
  }
  __syncthreads();
  if (threadIdx.x < kDecodeRows) {
    const int r = threadIdx.x;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) m = fmaxf(m, s_m[w][r]);
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float mw = s_m[w][r];
      const float a = mw == -INFINITY ? 0.f : exp2f(scaled_log2(mw, p.scale_log2) - scaled_log2(m, p.scale_log2));
      s_alpha[w][r] = a;
      l += a * s_l[w][r];
    }
    s_row_m[r] = m, s_row_l[r] = l;
  }
  __syncthreads();

  // Store: one split, O and LSE (rows past seqlens_q and rows whose mask leaves no key: 0 and
  // -inf; a row that sees keys but sums to 0 or NaN: NaN, as the dense epilogue); several, the
  // split's partial rows (rows past seqlens_q are the combine's alone).
  for (int idx = threadIdx.x; idx < kDecodeRows * D; idx += kDecodeThreads) {
    const int r = idx / D, c = idx % D;
    if (r0 + r >= rows || c >= d_v) continue;
    const int64_t i = row_query(r);
    const float l = s_row_l[r];
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) acc += s_alpha[w][r] * red[(w * kDecodeRows + r) * D + c];
    float o, lse;
    if (i >= len.q_rows) {
      if (partial) continue;
      o = 0.f, lse = -INFINITY;
    } else if (bad) {
      o = NAN, lse = NAN;
    } else if (l == 0.f) {
      const bool no_key = partial || mask.key_end(i) <= mask.key_begin(i);
      o = no_key ? 0.f : NAN, lse = no_key ? -INFINITY : NAN;
    } else {
      o = acc / l, lse = lse_of_row(s_row_m[r], log2f(l), p.scale);
    }
    if (partial) {
      const int64_t at = part_index(r);
      p.part_o[at * p.d_v + c] = o;
      if (c == 0) p.part_lse[at] = lse;
    } else {
      o_row(r)[c] = ElementTraits<T>::from_float(o);
      if (c == 0 && p.lse != nullptr) p.lse[lse_index(r)] = lse;
    }
  }
}

// Vec: K and V are both 16-byte loadable (kVecK and kVecV), the cp.async path without a
// per-row test; otherwise element loads. Paged: the caches are paged (p.block_table set).
template <class T, int D, bool Vec, bool Paged>
__global__ void __launch_bounds__(kDecodeThreads) decode_split_kernel(const DecodeParams p) {
  decode_split_body<T, D, Vec, Paged>(p);
}

}  // namespace strideattn::cuda_impl
