// The kernel table of the `cuda` backend: one entry per (dtype, architecture, head-dim
// bucket, pass) kernel, with what the host needs to plan a launch of it (threads, shared
// memory, grid shape, whether it adds dQ, its group-split target) and its instantiations.
// The entries are built in the kernels' translation units (sm80/*_{f16,bf16}.cu,
// sm90/*_{f16,bf16}.cu) from the same tile functions the kernels use (common/tiles.hpp) and
// gathered by dispatch.cu. Plain C++ (no CUDA header): make_cuda_plan (plan.cpp) picks from
// it and a CPU test checks it covers every key.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "backends/cuda/common/arch.hpp"
#include "backends/cuda/common/feature_set.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::cuda_impl {

// The attention passes that have a kernel per bucket. (The memory-bound helpers around them,
// common/aux_kernels.cu, depend on the dtype alone: they are not in the table.)
enum class Pass : int {
  forward = 0,  // O and LSE
  dkdv = 1,     // the backward's dK/dV pass (the single-pass backward's dQ too, where adds_dq)
  dq = 2,       // the two-pass backward's dQ pass
};
inline constexpr int kPassCount = 3;
constexpr const char* to_string(Pass p) { return p == Pass::forward ? "forward" : p == Pass::dkdv ? "dK/dV" : "dQ"; }

// Which instantiation of an entry's kernel runs.
enum class Variant : int {
  guarded = 0,        // any head dims of the bucket (zero-padded columns skipped at run time)
  full_d = 1,         // d_qk == d_v == bucket, known at compile time (no guards)
  fold = 2,           // forward over more than kFoldKeys keys (common/outer_accumulator.cuh), a
                      // backward pass over more than kFoldRows rows (kernel_params.hpp)
  mods = 3,           // the training features (common/score_mod.cuh; KernelParams::f), any head
                      // dims of the bucket, folding where the plan says so
  kv_cache = 4,       // forward: a KV-cache call (KernelParams::kv: lengths from device
                      // memory, K and V through the contiguous or paged cache), any head dims
  kv_cache_fold = 5,  // the same over caches of more than kFoldKeys tokens, with the fold
  // the training features' variant with one feature alone compiled in (common/feature_set.hpp:
  // kSingleFeatures, in this order), where an entry has it (KernelEntry::mods_single)
  mods_bias = 6,
  mods_softcap = 7,
  mods_alibi = 8,
  mods_dropout = 9,
  mods_sinks = 10,
  mods_max_logit = 11,
};
inline constexpr int kVariantCount = 12;
// Whether v runs a training-feature instantiation (mods or a single-feature one).
constexpr bool is_feature_variant(Variant v) { return v == Variant::mods || int(v) >= int(Variant::mods_bias); }

// How the consumer warpgroups of the warp-specialized forward (sm90/ws_forward.cuh) order
// their GEMMs.
enum class WsSchedule : int {
  plain = 0,       // S = Q K^T, softmax, O += P V, block after block
  overlapped = 1,  // block j + 1's S issued before block j's P V, its softmax under that GEMM
  ping_pong = 2,   // overlapped, and the two consumers take turns to issue their GEMMs, so one's
                   // softmax runs while the other's GEMMs hold the tensor cores
};
constexpr const char* to_string(WsSchedule s) {
  return s == WsSchedule::plain ? "plain" : s == WsSchedule::overlapped ? "overlapped" : "ping-pong";
}

// How a pass's grid is laid out (x, y, z).
enum class GridShape : int {
  query_blocks = 0,  // (query block of block_rows, head, sequence)
  key_blocks = 1,    // (key block of block_rows x dim_splits, KV head x group split, sequence)
};

struct KernelEntry {
  const char* name = "";  // in the debug log, e.g. "sm90a wgmma dK/dV pass"
  DType dtype = DType::f16;
  Arch arch = Arch::sm80;
  int bucket = 0;
  Pass pass = Pass::forward;
  int threads = 0;
  int smem_bytes = 0;  // dynamic shared memory per CTA
  GridShape grid = GridShape::query_blocks;
  int block_rows = 0;  // queries (query_blocks) or keys (key_blocks) per CTA
  int dim_splits = 1;  // key_blocks: CTAs per key block, each a share of the head dim
  // backward passes: rows one iteration of a CTA's loop covers (queries in a dK/dV pass,
  // keys in the dQ pass), which the plan's fold decision counts (kernel_params.hpp)
  int loop_rows = 0;
  // dK/dV pass: it can also add dQ (the single-pass backward); split_target: the group splits
  // aim at this many CTAs per SM (plan.cpp says why each).
  bool adds_dq = false;
  int split_target = 0;
  int warp_rows = 0;  // forward: query rows of O one warp owns (the outer accumulator's slot)
  // The warp-specialized kernels (sm90/ws_forward.cuh, sm90/ws_backward.cuh): the kernel
  // takes WsForwardParams or WsBackwardParams (TMA tensor maps, then KernelParams) instead of
  // KernelParams, and find_kernel skips it: the plan asks for it with find_ws_forward (one
  // entry per schedule) or find_ws_backward where it covers the problem.
  bool tma = false;
  WsSchedule ws_schedule = WsSchedule::plain;  // tma: how its consumers order their GEMMs
  // Instantiations (__global__ function addresses for cudaLaunchKernel); nullptr where the
  // entry has none (full_d where unguarded_full_d is false).
  const void* guarded = nullptr;
  const void* full_d = nullptr;
  const void* fold = nullptr;
  const void* mods = nullptr;
  const void* kv_cache = nullptr;
  const void* kv_cache_fold = nullptr;
  const void* mods_single[kSingleFeatureCount] = {};  // Variant::mods_bias + i
  [[nodiscard]] const void* kernel(Variant v) const {
    if (int(v) >= int(Variant::mods_bias)) return mods_single[int(v) - int(Variant::mods_bias)];
    return v == Variant::full_d          ? full_d
           : v == Variant::fold          ? fold
           : v == Variant::mods          ? mods
           : v == Variant::kv_cache      ? kv_cache
           : v == Variant::kv_cache_fold ? kv_cache_fold
                                         : guarded;
  }
};

// Sets entry->mods_single[i] for the first `Count` single features (kSingleFeatures) to
// make.template operator()<kSingleFeatures[i]>(): the address of the kernel instantiated
// with that feature alone, or nullptr where the entry leaves it out.
template <int Count, class Make>
void set_single_features(KernelEntry* entry, Make&& make) {
  static_assert(Count <= kSingleFeatureCount);
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((entry->mods_single[I] = make.template operator()<kSingleFeatures[I]>()), ...);
  }
  (std::make_integer_sequence<int, Count>{});
}

// Every entry (the tma ones last), in preference order per key: where two entries share a key (the sm80 dK/dV
// pass at d <= 128: 8 warps, then 4), the first whose shared memory the GPU grants runs.
[[nodiscard]] std::span<const KernelEntry> kernel_table();

// The first entry of the key whose shared memory fits `smem_limit` bytes per block; nullptr
// when none does, with *smem_needed the least any entry of the key needs (0: no entry).
[[nodiscard]] const KernelEntry* find_kernel(DType dtype, Arch arch, int bucket, Pass pass, int smem_limit,
                                             int* smem_needed = nullptr);

// The warp-specialized forward's entry for (dtype, bucket), plain or with its consumers'
// blocks overlapped, or nullptr where there is none.
[[nodiscard]] const KernelEntry* find_ws_forward(DType dtype, int bucket, WsSchedule schedule);

// The warp-specialized dK/dV pass's entry for (dtype, bucket), or nullptr where there is none.
[[nodiscard]] const KernelEntry* find_ws_backward(DType dtype, int bucket);

// The entries each kernel translation unit contributes.
std::span<const KernelEntry> sm80_forward_entries_f16();
std::span<const KernelEntry> sm80_forward_entries_bf16();
std::span<const KernelEntry> sm80_backward_entries_f16();
std::span<const KernelEntry> sm80_backward_entries_bf16();
std::span<const KernelEntry> sm90_forward_entries_f16();
std::span<const KernelEntry> sm90_forward_entries_bf16();
std::span<const KernelEntry> sm90_ws_forward_entries_f16();
std::span<const KernelEntry> sm90_ws_forward_entries_bf16();
std::span<const KernelEntry> sm90_backward_entries_f16();
std::span<const KernelEntry> sm90_backward_entries_bf16();
std::span<const KernelEntry> sm90_ws_backward_entries_f16();
std::span<const KernelEntry> sm90_ws_backward_entries_bf16();

}  // namespace strideattn::cuda_impl
