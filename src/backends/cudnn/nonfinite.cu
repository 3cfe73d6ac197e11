// Kernels of nonfinite.hpp. Which rows and keys exist and which keys a row sees come from the
// library's own mask (common/attention_math.hpp: MaskRule, SequenceTable, row_offset), so a
// row is judged exactly as docs/semantics.md defines it. The backward clears its group marks
// and runs two kernels:
//   rows   a few lanes per (sequence, head, row), 16 bytes each: reads the row's LSE, O and
//          dO once, writes a flag byte (bit 0: poisons dQ and dK, bit 1: poisons dV too),
//          NaN into dQ of a bad row, and marks the row's (sequence, KV head) group as bad;
//   keys   one block per marked (sequence, KV head) group: a warp per query head of the group
//          takes prefix counts of the two flags, then a thread per key: key j is seen
//          exactly by the rows [query_begin(j), query_end(j)) (the mask's ends are
//          non-decreasing in the row), so "a bad row of the group sees j" is a difference of
//          prefix counts, summed over the group's query heads.
// On finite inputs no group is marked: the keys kernel reads one int per block and stops.
// Groups outside cuDNN's envelope (a row's LSE or |O| |dO| beyond ExactRecomputeLimits) are
// recomputed between the two (exact_backward.cuh): an exact rows kernel writes dQ and each
// row's fp64 LSE and D, and the key kernel's blocks recompute dK and dV of their keys, NaN
// included.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "backends/cudnn/exact_backward.cuh"
#include "backends/cudnn/nonfinite.hpp"

namespace strideattn::detail::cudnn {

namespace {

using kernel::AttentionParams;
using kernel::MaskRule;

constexpr int kThreads = 256;  // 8 warps per block
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr std::uint16_t kNanBf16 = 0x7fc0, kNanF16 = 0x7e00;
constexpr int kScanPerLane = 8;  // rows each lane of the scan warp sums serially

int blocks_for(std::int64_t work_items, int per_block) {
  const std::int64_t b = (work_items + per_block - 1) / per_block;
  return static_cast<int>(b < 65535 ? (b > 0 ? b : 1) : 65535);  // the loops stride over the rest
}

std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

std::string last_error(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// Bit tests, not isfinite(): they hold under any fast-math flag.
__device__ __forceinline__ bool finite(float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }

__device__ __forceinline__ float to_float(std::uint32_t bits16, bool bf16) {
  return bf16 ? __uint_as_float(bits16 << 16) : __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

// Row `row` of a sequence exists and sees at least one key.
__device__ __forceinline__ bool sees_key(const MaskRule& m, std::int64_t row) {
  return row < m.s_q && m.key_end(row) > m.key_begin(row);
}

__device__ __forceinline__ void fill_nan(void* base, std::int64_t offset, std::int64_t n, std::int64_t step,
                                         std::uint16_t nan, int first, int stride) {
  std::uint16_t* p = static_cast<std::uint16_t*>(base) + offset;
  for (std::int64_t c = first; c < n; c += stride) p[c * step] = nan;
}

// ------------------------------------------------------------------ forward

__global__ void forward_rows_kernel(NonFiniteFix f) {
  const AttentionParams& a = f.a;
  const std::int64_t s_max = a.q_seq.max_len;
  const std::int64_t total = a.batch * a.heads * s_max;
  const std::uint16_t nan = f.bf16 ? kNanBf16 : kNanF16;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t row = i % s_max;
    const std::int64_t h = (i / s_max) % a.heads;
    const std::int64_t b = i / (s_max * a.heads);
    if (!sees_key(a.mask(b), row)) continue;  // no such row, or the "no key" answer is right
    if (finite(f.stats[i])) continue;
    f.stats[i] = __uint_as_float(0x7fc00000u);
    fill_nan(a.o, kernel::row_offset(a.q_seq.span(a.o_st, b), a.o_st, row, h), a.d_v, a.o_st.d, nan, 0, 1);
  }
}

// ------------------------------------------------------------------ backward

// Scratch of the backward, in this order, each part 256-byte aligned. The marks (any_far,
// group_far, group_bad) are one int array, cleared by one memset.
struct BackwardScratch {
  int* any_far = nullptr;         // 1 when some group is recomputed exactly
  int* group_far = nullptr;       // [batch, kv_heads]: 1 when the group is recomputed exactly
  int* group_bad = nullptr;       // [batch, kv_heads]: 1 when some row of the group is bad
  std::uint8_t* flags = nullptr;  // [batch, heads, s_max]
  int* count_k = nullptr;         // [batch, heads, s_max + 1]: bit-0 rows in [0, r)
  int* count_v = nullptr;         // same for bit 1
  double* lse = nullptr;          // [batch, heads, s_max]: fp64 LSE of recomputed rows
  double* dd = nullptr;           // same for D = rowsum(dO * O)
  std::size_t marks = 0;          // ints in the marks array
  std::size_t bytes = 0;
};

BackwardScratch layout(const AttentionParams& a, void* base) {
  auto* p = static_cast<std::byte*>(base);
  BackwardScratch s;
  const std::size_t groups = std::size_t(a.batch * a.kv_heads);
  const std::size_t rows = std::size_t(a.batch * a.heads * a.q_seq.max_len);
  const std::size_t counts = std::size_t(a.batch * a.heads * (a.q_seq.max_len + 1));
  s.marks = 1 + 2 * groups;
  const std::size_t at_flags = align256(s.marks * sizeof(int));
  const std::size_t at_k = at_flags + align256(rows);
  const std::size_t at_v = at_k + align256(counts * sizeof(int));
  const std::size_t at_lse = at_v + align256(counts * sizeof(int));
  const std::size_t at_dd = at_lse + align256(rows * sizeof(double));
  s.bytes = at_dd + align256(rows * sizeof(double));
  if (p) {
    s.any_far = reinterpret_cast<int*>(p);
    s.group_far = s.any_far + 1;
    s.group_bad = s.group_far + groups;
    s.flags = reinterpret_cast<std::uint8_t*>(p + at_flags);
    s.count_k = reinterpret_cast<int*>(p + at_k);
    s.count_v = reinterpret_cast<int*>(p + at_v);
    s.lse = reinterpret_cast<double*>(p + at_lse);
    s.dd = reinterpret_cast<double*>(p + at_dd);
  }
  return s;
}

// One row's share of this lane: the partial dot(dO, O), whether dO holds a non-finite value,
// and the largest |O| and |dO| it read. kLanes lanes read a row; kVec reads 8 elements (16
// bytes) per lane and step.
template <int kLanes, bool kVec>
__device__ __forceinline__ void row_terms(const std::uint16_t* o, std::int64_t o_step, const std::uint16_t* g,
                                          std::int64_t g_step, std::int64_t n, bool bf16, int sub_lane, float* dot,
                                          bool* g_bad, float* o_max, float* g_max) {
  float d = 0.f, om = 0.f, gm = 0.f;
  bool bad = false;
  auto take = [&](float ov, float gv) {
    d += ov * gv;
    bad |= !finite(gv);
    om = fmaxf(om, fabsf(ov));
    gm = fmaxf(gm, fabsf(gv));
  };
  if constexpr (kVec) {
    for (std::int64_t c = std::int64_t(sub_lane) * 8; c < n; c += kLanes * 8) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
      const uint4 gv = *reinterpret_cast<const uint4*>(g + c);
      const std::uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, gw[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        take(to_float(ow[w] & 0xffffu, bf16), to_float(gw[w] & 0xffffu, bf16));
        take(to_float(ow[w] >> 16, bf16), to_float(gw[w] >> 16, bf16));
      }
    }
  } else {
    for (std::int64_t c = sub_lane; c < n; c += kLanes)
      take(to_float(o[c * o_step], bf16), to_float(g[c * g_step], bf16));
  }
  *dot = d;
  *g_bad = bad;
  *o_max = om;
  *g_max = gm;
}

// Grid: x strides over blocks of rows, y over (sequence, head); each block's loops are
// uniform over its threads, so every lane reaches the shuffles. A row is read by kLanes
// consecutive lanes (32 / kLanes rows per warp).
template <int kLanes, bool kVec>
__global__ void backward_rows_kernel(NonFiniteFix f, BackwardScratch s) {
  const AttentionParams& a = f.a;
  constexpr int kRowsPerWarp = 32 / kLanes;
  const int lane = int(threadIdx.x & 31), sub_lane = lane % kLanes;
  const std::int64_t s_max = a.q_seq.max_len;
  const std::int64_t rows_per_block = std::int64_t(kRowsPerWarp) * (blockDim.x / 32);
  const std::int64_t my_row = std::int64_t(threadIdx.x / 32) * kRowsPerWarp + lane / kLanes;
  const std::uint16_t nan = f.bf16 ? kNanBf16 : kNanF16;
  for (std::int64_t bh = blockIdx.y; bh < a.batch * a.heads; bh += gridDim.y) {
    const std::int64_t b = bh / a.heads, h = bh % a.heads;
    const MaskRule m = a.mask(b);
    const kernel::SequenceSpan o_span = a.q_seq.span(a.o_st, b), g_span = a.q_seq.span(a.do_st, b);
    const std::int64_t group = b * a.kv_heads + kernel::kv_head_of(h, a.heads, a.kv_heads);
    for (std::int64_t r0 = std::int64_t(blockIdx.x) * rows_per_block; r0 < s_max;
         r0 += std::int64_t(gridDim.x) * rows_per_block) {
      const std::int64_t row = r0 + my_row;
      const bool live = row < s_max && sees_key(m, row);
      float d = 0.f, lse = 0.f, o_max = 0.f, g_max = 0.f;
      bool g_bad = false;
      if (live) {
        lse = f.stats[bh * s_max + row];
        const auto* o = static_cast<const std::uint16_t*>(a.o) + kernel::row_offset(o_span, a.o_st, row, h);
        const auto* g = static_cast<const std::uint16_t*>(a.d_o) + kernel::row_offset(g_span, a.do_st, row, h);
        row_terms<kLanes, kVec>(o, a.o_st.d, g, a.do_st.d, a.d_v, f.bf16, sub_lane, &d, &g_bad, &o_max, &g_max);
      }
      // Sums within each group of kLanes lanes (xor offsets below kLanes stay in the group).
      int any_bad = g_bad ? 1 : 0;
#pragma unroll
      for (int off = kLanes / 2; off > 0; off >>= 1) {
        d += __shfl_xor_sync(kFull, d, off);
        any_bad |= __shfl_xor_sync(kFull, any_bad, off);
        o_max = fmaxf(o_max, __shfl_xor_sync(kFull, o_max, off));
        g_max = fmaxf(g_max, __shfl_xor_sync(kFull, g_max, off));
      }
      // P = exp(S - LSE) and dO reach dV; D reaches dS (dQ, dK) only.
      const bool bad_v = live && (!finite(lse) || any_bad != 0);
      const bool bad_k = bad_v || (live && !finite(d));
      const std::uint8_t flag = std::uint8_t((bad_k ? 1 : 0) | (bad_v ? 2 : 0));
      // Outside the envelope: a large or very negative LSE, or large values of O and dO (the
      // size of dP = dO V^T and of D, which the graph's 16-bit dS must hold). A row whose O
      // alone is not finite still counts (its dV contributions are finite by definition);
      // rows with a non-finite LSE or dO reach every key they see as NaN anyway.
      const bool far = live && finite(lse) && !g_bad &&
                       (lse > f.exact.lse_above || lse < f.exact.lse_below || o_max * g_max > f.exact.od_above);
      if (row < s_max && sub_lane == 0) {
        s.flags[bh * s_max + row] = flag;
        if (flag) atomicOr(&s.group_bad[group], 1);
        if (far) {
          atomicOr(&s.group_far[group], 1);
          atomicOr(s.any_far, 1);
        }
      }
      if (flag)
        fill_nan(a.dq, kernel::row_offset(a.q_seq.span(a.dq_st, b), a.dq_st, row, h), a.d_qk, a.dq_st.d, nan, sub_lane,
                 kLanes);
    }
  }
}

// One warp: count_k[r + 1] = number of rows in [0, r] whose flag has bit 0 (count_v: bit
// 1), count[0] = 0, for the s_max flags of one (sequence, head).
__device__ void scan_flags(const std::uint8_t* fl, int* ck, int* cv, std::int64_t s_max, int lane) {
  if (lane == 0) ck[0] = cv[0] = 0;
  int carry_k = 0, carry_v = 0;
  for (std::int64_t base = 0; base < s_max; base += 32 * kScanPerLane) {
    const std::int64_t r0 = base + std::int64_t(lane) * kScanPerLane;
    int k[kScanPerLane], v[kScanPerLane], sk = 0, sv = 0;
#pragma unroll
    for (int e = 0; e < kScanPerLane; ++e) {
      const int x = r0 + e < s_max ? fl[r0 + e] : 0;
      sk += x & 1;
      sv += (x >> 1) & 1;
      k[e] = sk;  // inclusive within the lane
      v[e] = sv;
    }
    int ik = sk, iv = sv;  // inclusive over lanes
    for (int off = 1; off < 32; off <<= 1) {
      const int tk = __shfl_up_sync(kFull, ik, off), tv = __shfl_up_sync(kFull, iv, off);
      if (lane >= off) ik += tk, iv += tv;
    }
    const int before_k = carry_k + ik - sk, before_v = carry_v + iv - sv;  // rows before r0
#pragma unroll
    for (int e = 0; e < kScanPerLane; ++e)
      if (r0 + e < s_max) {
        ck[r0 + e + 1] = before_k + k[e];
        cv[r0 + e + 1] = before_v + v[e];
      }
    carry_k += __shfl_sync(kFull, ik, 31);
    carry_v += __shfl_sync(kFull, iv, 31);
  }
}

// The exact rows (exact_backward.cuh) of the groups outside the envelope: a warp per row;
// the blocks stride over (sequence, head, block of kWarpsPerBlock rows). Stops at once when
// no group is marked.
__global__ void exact_rows_kernel(NonFiniteFix f, BackwardScratch s) {
  __shared__ float q_sh[kWarpsPerBlock][exact::kMaxHeadDim], g_sh[kWarpsPerBlock][exact::kMaxHeadDim];
  if (*s.any_far == 0) return;
  const AttentionParams& a = f.a;
  const int warp = int(threadIdx.x / 32);
  const std::int64_t s_max = a.q_seq.max_len;
  const std::int64_t row_blocks = (s_max + kWarpsPerBlock - 1) / kWarpsPerBlock;
  for (std::int64_t item = blockIdx.x; item < a.batch * a.heads * row_blocks; item += gridDim.x) {
    const std::int64_t bh = item / row_blocks, b = bh / a.heads, h = bh % a.heads;
    if (s.group_far[b * a.kv_heads + kernel::kv_head_of(h, a.heads, a.kv_heads)] == 0) continue;
    const std::int64_t row = (item % row_blocks) * kWarpsPerBlock + warp;
    const MaskRule m = a.mask(b);
    if (row >= s_max || !sees_key(m, row)) continue;  // the same for the whole warp
    exact::recompute_row(a, f.bf16, b, h, row, m, s.flags[bh * s_max + row] != 0, q_sh[warp], g_sh[warp],
                         &s.lse[bh * s_max + row], &s.dd[bh * s_max + row]);
    __syncwarp();  // the warp's shared rows are rewritten by its next row
  }
}

// Blocks (x: (sequence, KV head) groups, y: parts of the keys). A group outside the envelope:
// the blocks of every y recompute their keys exactly, a warp per key (exact_backward.cuh; the
// NaN of bad rows included). Another group with a bad row: its y = 0 block's warps scan the
// flags of the group's query heads, then its threads walk the keys. The rest stop at once.
__global__ void backward_keys_kernel(NonFiniteFix f, BackwardScratch s) {
  __shared__ float k_sh[kWarpsPerBlock][exact::kMaxHeadDim], v_sh[kWarpsPerBlock][exact::kMaxHeadDim];
  const AttentionParams& a = f.a;
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
  const std::int64_t s_max = a.q_seq.max_len, kv_max = a.kv_seq.max_len;
  const std::int64_t group = a.heads / a.kv_heads;
  const std::uint16_t nan = f.bf16 ? kNanBf16 : kNanF16;
  if (blockIdx.y > 0 && *s.any_far == 0) return;
  for (std::int64_t bk = blockIdx.x; bk < a.batch * a.kv_heads; bk += gridDim.x) {
    if (s.group_far[bk] != 0) {  // the same value for the whole block
      const std::int64_t b = bk / a.kv_heads, hk = bk % a.kv_heads;
      const MaskRule m = a.mask(b);
      for (std::int64_t j = std::int64_t(blockIdx.y) * warps + warp; j < m.s_kv; j += std::int64_t(gridDim.y) * warps) {
        exact::recompute_key(a, f.bf16, b, hk, j, m, s.flags, s.lse, s.dd, k_sh[warp], v_sh[warp]);
        __syncwarp();
      }
      continue;
    }
    if (blockIdx.y > 0 || s.group_bad[bk] == 0) continue;
    const std::int64_t b = bk / a.kv_heads, hk = bk % a.kv_heads;
    const std::int64_t bh0 = b * a.heads + hk * group;  // (sequence, first query head of the group)
    for (std::int64_t g = warp; g < group; g += warps)
      scan_flags(s.flags + (bh0 + g) * s_max, s.count_k + (bh0 + g) * (s_max + 1), s.count_v + (bh0 + g) * (s_max + 1),
                 s_max, lane);
    __syncthreads();
    const MaskRule m = a.mask(b);
    for (std::int64_t j = threadIdx.x; j < kv_max; j += blockDim.x) {
      const kernel::TileRange rows = kernel::queries_seeing_key(m, j);  // empty past s_kv
      if (rows.end <= rows.begin) continue;
      int bad_k = 0, bad_v = 0;
      for (std::int64_t g = 0; g < group; ++g) {
        const std::int64_t at = (bh0 + g) * (s_max + 1);
        bad_k += s.count_k[at + rows.end] - s.count_k[at + rows.begin];
        bad_v += s.count_v[at + rows.end] - s.count_v[at + rows.begin];
      }
      if (bad_k > 0)
        fill_nan(a.dk, kernel::row_offset(a.kv_seq.span(a.dk_st, b), a.dk_st, j, hk), a.d_qk, a.dk_st.d, nan, 0, 1);
      if (bad_v > 0)
        fill_nan(a.dv, kernel::row_offset(a.kv_seq.span(a.dv_st, b), a.dv_st, j, hk), a.d_v, a.dv_st.d, nan, 0, 1);
    }
    __syncthreads();  // the next group's scan reuses no memory, but keeps the warps together
  }
}

// Whether O and dO rows can be read 16 bytes at a time: unit head-dim stride, d_v a multiple
// of 8, 16-byte aligned pointers and strides (a stride whose extent is 1 is never used).
bool rows_vectorizable(const AttentionParams& a) {
  auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  auto ok = [&](const kernel::Strides& st) {
    const bool b_used = !a.q_seq.varlen() && a.batch > 1;
    const bool s_used = a.q_seq.varlen() || a.q_seq.max_len > 1;
    const bool h_used = a.heads > 1;
    return st.d == 1 && (!b_used || st.b % 8 == 0) && (!s_used || st.s % 8 == 0) && (!h_used || st.h % 8 == 0);
  };
  return a.d_v % 8 == 0 && aligned(a.o) && aligned(a.d_o) && ok(a.o_st) && ok(a.do_st);
}

// The row kernel for this problem: 16-byte reads with as few lanes per row as cover d_v
// (8 elements a lane), else one element per lane and step over the whole warp.
void launch_rows(const NonFiniteFix& f, const BackwardScratch& s, cudaStream_t st) {
  const AttentionParams& a = f.a;
  auto grid = [&](int lanes) {
    const std::int64_t rows_per_block = std::int64_t(32 / lanes) * kWarpsPerBlock;
    const std::int64_t bh = a.batch * a.heads;
    return dim3(unsigned(blocks_for(a.q_seq.max_len, int(rows_per_block))), unsigned(bh < 65535 ? bh : 65535));
  };
  if (!rows_vectorizable(a)) {
    backward_rows_kernel<32, false><<<grid(32), kThreads, 0, st>>>(f, s);
  } else if (a.d_v <= 32) {
    backward_rows_kernel<4, true><<<grid(4), kThreads, 0, st>>>(f, s);
  } else if (a.d_v <= 64) {
    backward_rows_kernel<8, true><<<grid(8), kThreads, 0, st>>>(f, s);
  } else if (a.d_v <= 128) {
    backward_rows_kernel<16, true><<<grid(16), kThreads, 0, st>>>(f, s);
  } else {
    backward_rows_kernel<32, true><<<grid(32), kThreads, 0, st>>>(f, s);
  }
}

// Blocks of the launches that stop at once on problems inside the envelope: enough to keep
// the GPU busy when they do recompute, few enough that stopping costs about a microsecond.
constexpr std::int64_t kExactBlocks = 1024;

std::atomic<const ExactRecomputeLimits*> g_limits{nullptr};

}  // namespace

ExactRecomputeLimits exact_recompute_limits() {
  const ExactRecomputeLimits* l = g_limits.load(std::memory_order_acquire);
  return l ? *l : ExactRecomputeLimits{};
}

ScopedExactRecomputeLimits::ScopedExactRecomputeLimits(ExactRecomputeLimits limits)
    : limits_(limits), previous_(g_limits.exchange(&limits_, std::memory_order_acq_rel)) {}

ScopedExactRecomputeLimits::~ScopedExactRecomputeLimits() { g_limits.store(previous_, std::memory_order_release); }

std::size_t nonfinite_backward_scratch(const AttentionParams& a) { return layout(a, nullptr).bytes; }

std::string nonfinite_forward(const NonFiniteFix& f, void* stream) {
  const std::int64_t rows = f.a.batch * f.a.heads * f.a.q_seq.max_len;
  if (rows <= 0 || f.a.d_v <= 0) return {};
  forward_rows_kernel<<<blocks_for(rows, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(f);
  return last_error("non-finite forward fix-up kernel");
}

std::string nonfinite_backward(const NonFiniteFix& f, void* scratch, void* stream) {
  const AttentionParams& a = f.a;
  const std::int64_t rows = a.batch * a.heads * a.q_seq.max_len;
  if (rows <= 0 || a.kv_heads <= 0) return {};
  auto st = static_cast<cudaStream_t>(stream);
  const BackwardScratch s = layout(a, scratch);
  if (a.d_qk > exact::kMaxHeadDim || a.d_v > exact::kMaxHeadDim)
    return "the cudnn backward fix-up takes head dims up to " + std::to_string(exact::kMaxHeadDim) + ", got " +
           std::to_string(a.d_qk) + " / " + std::to_string(a.d_v);
  if (cudaError_t e = cudaMemsetAsync(s.any_far, 0, s.marks * sizeof(int), st); e != cudaSuccess)
    return std::string("clearing the fix-up's group marks: ") + cudaGetErrorString(e);
  launch_rows(f, s, st);
  if (auto e = last_error("non-finite backward row kernel"); !e.empty()) return e;
  const std::int64_t row_items = a.batch * a.heads * ((a.q_seq.max_len + kWarpsPerBlock - 1) / kWarpsPerBlock);
  exact_rows_kernel<<<unsigned(std::min(row_items, kExactBlocks)), kThreads, 0, st>>>(f, s);
  if (auto e = last_error("exact backward row kernel"); !e.empty()) return e;
  const std::int64_t groups = a.batch * a.kv_heads;
  const std::int64_t key_parts = std::clamp<std::int64_t>(
      std::min(kExactBlocks / groups, (a.kv_seq.max_len + kWarpsPerBlock - 1) / kWarpsPerBlock), 1, 65535);
  backward_keys_kernel<<<dim3(unsigned(blocks_for(groups, 1)), unsigned(key_parts)), kThreads, 0, st>>>(f, s);
  return last_error("non-finite backward key kernel");
}

}  // namespace strideattn::detail::cudnn
