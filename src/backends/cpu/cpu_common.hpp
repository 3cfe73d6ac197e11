// Shared pieces of the `cpu` backend: tile sizes, the thread pool, cancellation, strided row
// loads/stores through the dtype, and the varlen padding bookkeeping (the fp32 inner loops
// are in cpu_kernels.hpp, the fp32 operand copies in cpu_pack.hpp). All mask, tile-range and
// index arithmetic comes from src/common/attention_math.hpp (the functions the CUDA kernels
// use); this file only adds host-side plumbing.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.hpp"
#include "common/attention_math.hpp"
#include "common/dtype.hpp"
#include "problem/problem.hpp"

namespace strideattn::detail::cpu {

// ------------------------------------------------------------------------------ tiles
// Query rows per tile. Every K/V tile read is reused by 64 rows (ten 6-row GEMM blocks and
// one 4-row block), and the per-thread working set (Q/O tiles 64 x d, S/P 64 x 64 fp32:
// 16 KiB each at d = 64) stays in L2 up to d = 256; more rows per tile would also leave
// too few work items to balance 2-16 threads on s = 1-2k problems.
inline constexpr std::int64_t kBlockRows = 64;
// Keys per tile. 64 keys are four 16-column blocks of the AVX2 GEMM for S = Q K^T and
// amortize the online-softmax rescale of O over 64 keys; larger tiles waste more work on
// the masked diagonal of causal and windowed problems.
inline constexpr std::int64_t kBlockKeys = 64;

// ------------------------------------------------------------------------------ threads

// Worker threads: STRIDEATTN_CPU_THREADS when set to a positive integer, otherwise
// std::thread::hardware_concurrency() (at least 1).
[[nodiscard]] int thread_count();

// Calls below this many FLOPs (Problem::flops()) run on the calling thread alone: waking the
// pool costs more than it saves (a 16 x 16 call took 37 us on 2 threads, 17 us on 1).
inline constexpr double kSmallWorkFlops = 4e6;

// Threads for a call of `flops` FLOPs split into `items` independent work items.
[[nodiscard]] inline int threads_for(double flops, std::size_t items) {
  if (flops < kSmallWorkFlops || items <= 1) return 1;
  return static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(thread_count()), items));
}

// Runs body(slot) for slots 0..threads-1 on the persistent pool (cpu_pool.cpp); the caller
// runs slot 0. Slots no worker has claimed when the caller's slot returns are dropped, so
// bodies must pull their work from a shared counter (then the result does not depend on how
// many slots ran). Returns false when a body threw (e.g. out of memory for its scratch); the
// output is then incomplete.
[[nodiscard]] bool run_threads(int threads, const std::function<void(int)>& body);

// ------------------------------------------------------------------------------ cancellation

// True once the caller's cancel flag (AttentionOptions::cancel) is set. Work loops check it
// between tiles and work items; a cancelled call returns cancelled_status().
[[nodiscard]] inline bool cancelled(const Problem& p) {
  return p.cancel != nullptr && p.cancel->load(std::memory_order_relaxed);
}
[[nodiscard]] inline Status cancelled_status(const char* what) {
  return Status(StatusCode::cancelled, std::string("cpu ") + what +
                                           ": cancelled by the caller's cancel flag; the "
                                           "outputs are incomplete");
}

// ------------------------------------------------------------------------------ work items

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One unit of pool work: rows (forward, dQ) or keys (dK/dV) [r0, r1) of sequence `batch`
// for one query head or KV head.
struct WorkItem {
  std::int64_t batch = 0, head = 0, r0 = 0, r1 = 0;
  std::int64_t cost = 0;  // visible span times rows: for heaviest-first ordering
};

// Heaviest first (causal and windowed tiles differ in work); stable keeps the order
// deterministic, though results do not depend on it (each item owns its outputs).
inline void heaviest_first(std::vector<WorkItem>& items) {
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& x, const WorkItem& y) { return x.cost > y.cost; });
}

// ------------------------------------------------------------------------------ rows

// A row of the head dim: element k is `offset + k * step` of `base` (step is the head-dim
// stride, 1 or -1 for a reversed head dim). The unit-stride loops stay separate so that they
// vectorise.

// dst[0..n) = row elements (dtype `dt`) as fp32, times `mul`.
inline void load_row(const void* base, DType dt, std::int64_t offset, std::int64_t step, std::int64_t n, float* dst,
                     float mul = 1.f) {
  switch (dt) {
    case DType::f32: {
      const float* s = static_cast<const float*>(base) + offset;
      if (step == 1)
        for (std::int64_t k = 0; k < n; ++k) dst[k] = s[k] * mul;
      else
        for (std::int64_t k = 0; k < n; ++k) dst[k] = s[k * step] * mul;
      return;
    }
    case DType::bf16: {
      const std::uint16_t* s = static_cast<const std::uint16_t*>(base) + offset;
      if (step == 1)
        for (std::int64_t k = 0; k < n; ++k) dst[k] = bf16_to_float(s[k]) * mul;
      else
        for (std::int64_t k = 0; k < n; ++k) dst[k] = bf16_to_float(s[k * step]) * mul;
      return;
    }
    case DType::f16: {
      const std::uint16_t* s = static_cast<const std::uint16_t*>(base) + offset;
      if (step == 1)
        for (std::int64_t k = 0; k < n; ++k) dst[k] = f16_to_float(s[k]) * mul;
      else
        for (std::int64_t k = 0; k < n; ++k) dst[k] = f16_to_float(s[k * step]) * mul;
      return;
    }
  }
}

// Row elements = src[k] * mul rounded to `dt` (round to nearest even).
inline void store_row(void* base, DType dt, std::int64_t offset, std::int64_t step, std::int64_t n, const float* src,
                      float mul = 1.f) {
  switch (dt) {
    case DType::f32: {
      float* d = static_cast<float*>(base) + offset;
      if (step == 1)
        for (std::int64_t k = 0; k < n; ++k) d[k] = src[k] * mul;
      else
        for (std::int64_t k = 0; k < n; ++k) d[k * step] = src[k] * mul;
      return;
    }
    case DType::bf16: {
      std::uint16_t* d = static_cast<std::uint16_t*>(base) + offset;
      if (step == 1)
        for (std::int64_t k = 0; k < n; ++k) d[k] = float_to_bf16(src[k] * mul);
      else
        for (std::int64_t k = 0; k < n; ++k) d[k * step] = float_to_bf16(src[k] * mul);
      return;
    }
    case DType::f16: {
      std::uint16_t* d = static_cast<std::uint16_t*>(base) + offset;
      if (step == 1)
        for (std::int64_t k = 0; k < n; ++k) d[k] = float_to_f16(src[k] * mul);
      else
        for (std::int64_t k = 0; k < n; ++k) d[k * step] = float_to_f16(src[k] * mul);
      return;
    }
  }
}

// Scores of at least this magnitude (in fp32) are recomputed in fp64 and rounded once. The
// fp32 dot product errs by up to gamma(d) sum_d |q_d k_d|, and at large logits that rounding
// is the largest error of the whole softmax: at input scale 6, f32, d = 56 (logits near 100)
// it made dQ 1.2x the correctness rule's tolerance in 1 of 2,000 fuzz cases, and rounding the
// exact scores once cuts the gradients' error 2-3x on such problems. The keys that decide a
// row's softmax are those near its largest score, so when that score is large they are all
// recomputed; keys further than 17 below it weigh less than 4e-8. Unit-scale inputs give
// scores below 4 but for a tail of about 6e-5 of them, so their tiles keep the fp32 path.
inline constexpr float kExactScore = 4.f;

// Scales the raw dot products q.k in the first `cols` entries of `rows` rows of a
// [rows][kBlockKeys] tile by `scale`, giving S. An entry of magnitude kExactScore or more, or
// that comes out non-finite, is recomputed in fp64 from its operands (q: rows of `d` floats;
// k_t: [d][kBlockKeys]) and rounded once. The choice is a function of that entry's own fp32
// value alone, never of the tile's other rows or keys, so every pass that recomputes a score
// (the forward and each backward pass, whatever their tiles) gets the same float, and
// P = exp(S - LSE) stays consistent with the forward's LSE. Overflow: an fp32 partial sum that
// overflows keeps the sign of the first term that overflowed, not that of the sum, and a
// softcap or a sink would turn that wrong infinity into a finite wrong answer
// (docs/semantics.md "Non-finite values, overflow and the scale"). fp64 holds every product
// of two fp32 numbers exactly, so the recomputed score is the definition's: +-inf where it
// lies beyond fp32 (with the right sign), finite where the scale brings it back into range,
// NaN where the definition is NaN.
inline void scale_scores(float* tile, std::int64_t rows, std::int64_t cols, float scale, const float* q, std::int64_t d,
                         const float* k_t) {
  double exact[kBlockKeys];
  for (std::int64_t r = 0; r < rows; ++r) {
    float* sr = tile + r * kBlockKeys;
    bool any = false;
    for (std::int64_t j = 0; j < cols; ++j) {
      sr[j] *= scale;
      any |= !(std::fabs(sr[j]) < kExactScore);  // NaN too
    }
    if (!any) continue;
    const float* qr = q + r * d;
    for (std::int64_t j = 0; j < cols; ++j) exact[j] = 0;
    for (std::int64_t x = 0; x < d; ++x) {
      const double qx = qr[x];
      const float* kx = k_t + x * kBlockKeys;
      for (std::int64_t j = 0; j < cols; ++j) exact[j] += qx * double(kx[j]);
    }
    for (std::int64_t j = 0; j < cols; ++j)
      if (!(std::fabs(sr[j]) < kExactScore)) sr[j] = static_cast<float>(double(scale) * exact[j]);
  }
}

// Zero the `n` row elements.
inline void zero_row(void* base, DType dt, std::int64_t offset, std::int64_t step, std::int64_t n) {
  for (std::int64_t k = 0; k < n; ++k) {
    if (dt == DType::f32)
      static_cast<float*>(base)[offset + k * step] = 0.f;
    else
      static_cast<std::uint16_t*>(base)[offset + k * step] = std::uint16_t{0};  // +0 in f16/bf16
  }
}

// ------------------------------------------------------------------------------ varlen

// covered[t] = 1 when token t of a tensor's seq dimension belongs to some sequence of
// `table` (dense tables cover every token). Tokens outside are varlen padding.
[[nodiscard]] std::vector<unsigned char> covered_tokens(const kernel::SequenceTable& table, std::int64_t batch,
                                                        std::int64_t tokens);

// ------------------------------------------------------------------------------ entry points

[[nodiscard]] Status forward(const Problem& problem);
[[nodiscard]] Status backward(const Problem& problem);
// KV-cache attention (cpu_kvcache.cpp): appends, then attends each sequence's gathered keys.
[[nodiscard]] Status forward_kvcache(const KvCacheProblem& problem);

}  // namespace strideattn::detail::cpu
