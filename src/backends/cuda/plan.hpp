// The plan of one `cuda` call: which kernel of the table runs each pass, its grid, the group
// splits, single- or two-pass backward, and the layout of the workspace. make_cuda_plan is a
// pure function of the problem (sizes, dims, mask, options; no pointers) and the device's
// DeviceCaps, so a plan can be made once and run many times with other pointers (launch.hpp
// runs it). The choices are made here once, on the host, and travel as this value: the
// kernels receive data (KernelParams), never a choice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "backends/cuda/common/arch.hpp"
#include "backends/cuda/device_caps.hpp"
#include "backends/cuda/dispatch.hpp"
#include "problem/problem.hpp"

namespace strideattn::cuda_impl {

// Choices tests force, to run paths the automatic choice would not take on this GPU on the
// same inputs (set through ScopedCudaPlanForcing, test_hook.hpp; never from the environment).
struct PlanForcing {
  std::optional<Arch> arch;         // run this architecture's kernels (sm80 on a 9.0 GPU)
  int smem_optin = 0;               // > 0: plan as for a GPU that grants at most this much
                                    // shared memory per block (the 4-warp dK/dV pass at d 128)
  int group_splits = 0;             // > 0: split each GQA group over this many CTAs (at most
                                    // one per query head) whatever the grid size
  std::optional<bool> single_pass;  // the single-pass (true) or two-pass (false) backward
                                    // whatever `deterministic` says, where the pass adds dQ
  int fold_blocks = 0;              // backward: > 0 folds every that many iterations whatever
                                    // the lengths (the dQ pass too where it runs); < 0 never
  // The warp-specialized TMA forward (sm90/ws_forward.cuh): unset, the plan's choice (it,
  // wherever it covers the problem: ws_forward_refusal); false keeps the bucket's other forward
  // (mma.sync at d <= 64, wgmma above), so a test can compare the two.
  std::optional<bool> ws_forward;
  // With the warp-specialized forward: the instantiation of this consumer schedule (unset: the
  // plan's choice by the key count, kWsPingPongMaxKeys in common/tiles.hpp).
  std::optional<WsSchedule> ws_schedule;
  // The warp-specialized dK/dV pass (sm90/ws_backward.cuh): unset, the plan's choice (it,
  // wherever it covers the problem: ws_backward_refusal); false keeps the wgmma pass.
  std::optional<bool> ws_backward;
  // KV-cache calls: the dense forward (true) or the decode kernels (false) whatever the shape
  // (decode/decode_host.hpp, kv_cache_dense); unset: the shape decides.
  std::optional<bool> kv_cache_dense;
};

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
  [[nodiscard]] bool empty() const { return x == 0 || y == 0 || z == 0; }
};

// One launch of a table entry's kernel.
struct KernelLaunch {
  const KernelEntry* entry = nullptr;
  Variant variant = Variant::guarded;
  Dim3 grid;
  [[nodiscard]] const void* kernel() const { return entry->kernel(variant); }
};

// The workspace, in order, each piece aligned to kWorkspacePieceAlign: byte offsets from its
// start and the total. A piece the call does not use has no bytes.
struct WorkspaceLayout {
  std::size_t tables = 0;       // varlen: 4 x batch int64: seqlens_q, offsets_q, seqlens_kv, offsets_kv
  std::size_t delta = 0;        // backward: fp32 [q batch extent][heads][q tokens]
  std::size_t partial = 0;      // backward, group splits > 1 or the fold: fp32 dK/dV partial planes
  std::size_t dq_accum = 0;     // single pass or dQ fold: fp32 [q batch extent][heads][q tokens][d_qk]
  std::size_t outer_slots = 0;  // forward fold: the outer accumulator's slots, then
  std::size_t outer_flags = 0;  //   one int flag per slot
  std::size_t dbias_accum = 0;  // backward, dBias summed over a broadcast: fp32, dense over its shape
  std::size_t total = 0;
};
inline constexpr std::size_t kWorkspacePieceAlign = 256;

struct CudaPlan {
  std::string error;  // why this problem has no plan on this device; empty when it has one
  int device = -1;    // the device it was made for (DeviceCaps::device)
  Arch arch = Arch::sm80;
  int bucket = 0;
  DType dtype = DType::f16;
  bool backward = false;
  KernelLaunch main;  // the forward kernel, or the dK/dV pass
  KernelLaunch dq;    // the two-pass backward's dQ pass (entry nullptr otherwise)
  int group_splits = 1;
  bool single_pass = false;       // the dK/dV pass adds dQ into dq_accum; a conversion stores it
  std::int64_t partial_rows = 0;  // rows of one dK/dV partial plane (group splits > 1 or the fold)
  std::size_t partial_bytes = 0;  // the planes' bytes (unrounded, for the fold's memset)
  // backward over long ranges: fold every this many iterations (kernel_params.hpp); 0: never
  int kv_fold_blocks = 0;  // the dK/dV pass (into the partial planes)
  int q_fold_blocks = 0;   // the two-pass backward's dQ pass (into dq_accum)
  int outer_count = 0;     // forward fold: slots of the outer accumulator (0: no fold)
  std::size_t outer_slot_floats = 0;
  std::size_t dq_accum_bytes = 0;     // (unrounded, for the memset)
  std::size_t dbias_accum_bytes = 0;  // (unrounded, for the memset)
  WorkspaceLayout workspace;
  // On sm90a: why the warp-specialized forward (or, in a backward at d <= 128, dK/dV pass)
  // does not run (its rule, the value found), "" when it does; then `main` is its entry and
  // ws_fallback the other kernel (forward: mma.sync at d <= 64, wgmma above; backward: the
  // wgmma pass), which runs instead if its tensor maps cannot be made (prepare_launch).
  std::string ws_note;
  KernelLaunch ws_fallback;
  [[nodiscard]] bool ok() const { return error.empty(); }
};

// Whether the dK/dV pass stores dBias itself (KernelParams::f): no dimension of extent 1 of
// the dBias view stands for more than one index of the problem (batch, heads, s_q, s_kv), so
// every element gets the value of one pair (or none: 0). Otherwise the pairs' values are
// summed by fp32 atomics in the workspace (not bitwise reproducible: the `dbias_deterministic`
// rule refuses that with deterministic = true).
[[nodiscard]] bool dbias_direct(const detail::Problem& problem);

// Why the warp-specialized forward does not cover `problem` under `forcing` with the kernels
// of `plan` (arch, bucket, dtype chosen), or "" when it does: rule `forced_off` (a
// test's PlanForcing), then `direction`, `arch`, `head_dim`, `varlen`, `features` (a training
// feature on in a schedule other than overlapped, the only one with the features'
// instantiation, or past kFoldKeys keys: fold and features together stay on the wgmma
// forward), `schedule` (no instantiation of the chosen one), `long_keys` (the fold, past
// kFoldKeys keys: only the overlapped schedule has it), `shared_memory`, `tma` (a view TMA
// cannot read: tma_maps.hpp). Pure.
[[nodiscard]] std::string ws_forward_refusal(const detail::Problem& problem, const CudaPlan& plan,
                                             const DeviceCaps& caps, const PlanForcing& forcing);

// Why the warp-specialized dK/dV pass does not cover the backward `problem` under `forcing`
// with the kernels of `plan` (arch, bucket, dtype, single pass and folds chosen), or "" when
// it does: rule `forced_off` (a test's PlanForcing), then `direction`, `arch`, `head_dim`,
// `varlen`, `features` (a feature that changes the scores, outside ws_backward_features' bucket),
// `deterministic` (the two-pass backward asked for), `two_pass` (the plan's two-pass
// backward otherwise: over 2 kFoldRows keys, or forced), `fold` (long query ranges: the
// plan's kv_fold_blocks), `shared_memory`, `tma` (a view of q, k, v, d_o TMA cannot read).
// Pure.
[[nodiscard]] std::string ws_backward_refusal(const detail::Problem& problem, const CudaPlan& plan,
                                              const DeviceCaps& caps, const PlanForcing& forcing);

// The problem's training features that change the scores, as common/feature_set.hpp's bits;
// pass_features adds the forward's own (sinks, the max logit) for a forward pass.
[[nodiscard]] int score_features(const detail::Problem& problem);
[[nodiscard]] int pass_features(const detail::Problem& problem, Pass pass);
// The instantiation of `entry` that runs a problem with training features (pass_features
// of its pass): the single-feature one (Variant::mods_bias ...) where exactly one is on and
// the entry has it, else the one with every feature (Variant::mods). Pure.
[[nodiscard]] Variant feature_variant(const detail::Problem& problem, const KernelEntry& entry);

[[nodiscard]] CudaPlan make_cuda_plan(const detail::Problem& problem, const DeviceCaps& caps,
                                      const PlanForcing& forcing = {});

// Why make_cuda_plan would refuse the problem (no kernel of a pass it runs fits the device),
// or nullopt: its kernel choice alone, without grids or a workspace layout, for the support
// rule `shared_memory`. Allocates only for a refusal's message.
[[nodiscard]] std::optional<std::string> cuda_plan_refusal(const detail::Problem& problem, const DeviceCaps& caps,
                                                           const PlanForcing& forcing = {});

}  // namespace strideattn::cuda_impl
