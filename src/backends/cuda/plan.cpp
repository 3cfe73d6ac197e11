// make_cuda_plan (plan.hpp): every kernel choice of the `cuda` backend, made once per call
// on the host from the kernel table and the device's caps. Pure: no CUDA call, no pointer
// read, so CPU tests check its choices for any GPU they describe.
#include "backends/cuda/plan.hpp"

#include <algorithm>
#include <utility>

#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/common/tiles.hpp"
#include "backends/cuda/tma_maps.hpp"

namespace strideattn::cuda_impl {

namespace {

using detail::Problem;

constexpr std::int64_t kMaxGridYZ = 65535;

std::size_t round_up(std::size_t x) {
  return (x + kWorkspacePieceAlign - 1) / kWorkspacePieceAlign * kWorkspacePieceAlign;
}

unsigned ceil_div_u(std::int64_t a, std::int64_t b) { return unsigned((a + b - 1) / b); }

std::string kib(int bytes) { return std::to_string(bytes) + " bytes (" + std::to_string(bytes / 1024) + " KiB)"; }

// The entry of `pass`, or nullptr with plan->error saying why there is none.
const KernelEntry* pick(CudaPlan* plan, Pass pass, int smem_limit, const DeviceCaps& caps) {
  int needed = 0;
  const KernelEntry* e = find_kernel(plan->dtype, plan->arch, plan->bucket, pass, smem_limit, &needed);
  if (e == nullptr && plan->error.empty())
    plan->error = needed == 0 ? std::string("no ") + to_string(plan->arch) + " kernel for the " + to_string(pass) +
                                    " pass of head-dim bucket " + std::to_string(plan->bucket)
                              : std::string("the ") + to_string(plan->arch) + " " + to_string(pass) +
                                    " pass of head-dim bucket " + std::to_string(plan->bucket) + " needs " +
                                    kib(needed) + " of shared memory per block; device " + std::to_string(caps.device) +
                                    " (compute capability " + std::to_string(caps.major) + "." +
                                    std::to_string(caps.minor) + ") grants " + kib(smem_limit);
  return e;
}

// An upper bound of the forward kernel's warps resident on the GPU at once: the size of the
// outer accumulator's slot pool (common/outer_accumulator.cuh), which must never run dry.
// CTAs per SM are bounded by threads (2,048), the 32-CTA limit and shared memory; registers
// only lower the real count. 0 when the caps hold no SM count (no fold then).
int resident_warps(const KernelEntry& e, const DeviceCaps& caps) {
  int ctas = std::min(32, 2048 / e.threads);
  if (caps.smem_per_sm > 0) ctas = std::max(1, std::min(ctas, caps.smem_per_sm / e.smem_bytes));
  return caps.sms * ctas * (e.threads / 32);
}

// Splits of each query-head group over CTAs of the dK/dV pass (tiles.hpp, "Group splits"):
// enough to bring the grid to about split_target CTAs per SM, none past one head per split;
// `forced` (tests) asks for that many whatever the grid size.
int group_splits(const Problem& p, const KernelEntry& e, const DeviceCaps& caps, int forced) {
  const std::int64_t group = p.group_size();
  if (group <= 1) return 1;
  std::int64_t splits = 0;
  if (forced > 0) {
    splits = std::min<std::int64_t>(forced, group);
  } else {
    const std::int64_t ctas = (p.s_kv + e.block_rows - 1) / e.block_rows * e.dim_splits * p.kv_heads * p.batch;
    const std::int64_t target = std::int64_t(e.split_target) * caps.sms;
    if (ctas <= 0 || ctas >= target) return 1;
    splits = std::min(group, (target + ctas - 1) / ctas);
  }
  const std::int64_t per_split = (group + splits - 1) / splits;
  splits = (group + per_split - 1) / per_split;  // no split left without heads
  return p.kv_heads * splits > kMaxGridYZ ? 1 : int(splits);
}

Dim3 grid_of(const KernelEntry& e, const Problem& p, int splits) {
  if (e.grid == GridShape::query_blocks) return {ceil_div_u(p.s_q, e.block_rows), unsigned(p.heads), unsigned(p.batch)};
  return {ceil_div_u(p.s_kv, e.block_rows) * unsigned(e.dim_splits), unsigned(p.kv_heads * splits), unsigned(p.batch)};
}

bool dims_fill_bucket(const Problem& p, int bucket) { return p.d_qk == bucket && p.d_v == bucket; }

// The kernel of each pass the call runs (what can refuse a problem), into `plan`; false with
// plan->error set when one has none.
bool choose_kernels(const Problem& p, const DeviceCaps& caps, const PlanForcing& forcing, CudaPlan* plan) {
  plan->device = caps.device;
  plan->dtype = p.dtype;
  plan->backward = p.is_backward();
  plan->bucket = head_dim_bucket(p.d_qk, p.d_v);
  plan->arch = forcing.arch.value_or(caps.arch());
  if (plan->arch == Arch::sm90a && caps.arch() != Arch::sm90a) {
    plan->error = "the sm90a kernels need a GPU of compute capability 9.0 and a build with sm_90a code; device " +
                  std::to_string(caps.device) + " has " + std::to_string(caps.major) + "." + std::to_string(caps.minor);
    return false;
  }
  const int smem_limit = forcing.smem_optin > 0 ? std::min(forcing.smem_optin, caps.smem_optin) : caps.smem_optin;
  plan->main.entry = pick(plan, plan->backward ? Pass::dkdv : Pass::forward, smem_limit, caps);
  if (plan->main.entry == nullptr) return false;
  if (!plan->backward) return true;
  // The single-pass backward (dQ by fp32 atomics in the dK/dV pass, 5 GEMMs instead of 7)
  // where the pass can add dQ and the caller does not ask for bitwise reproducibility;
  // otherwise the deterministic two-pass backward.
  // Over more keys than the single pass's atomics should sum one after another (kFoldRows x 2,
  // kernel_params.hpp) the two-pass backward runs, whose dQ pass folds.
  const bool long_keys = p.s_kv > std::int64_t(kFoldRows) * 2;
  plan->single_pass = plan->main.entry->adds_dq && forcing.single_pass.value_or(!p.deterministic && !long_keys);
  if (plan->single_pass) return true;
  plan->dq.entry = pick(plan, Pass::dq, smem_limit, caps);
  return plan->dq.entry != nullptr;
}

}  // namespace

bool dbias_direct(const Problem& p) {
  const std::int64_t full[4] = {p.batch, p.heads, p.s_q, p.s_kv};
  for (int d = 0; d < 4; ++d)
    if (p.dbias.shape[std::size_t(d)] == 1 && full[d] > 1) return false;
  return true;
}

int score_features(const Problem& p) {
  return (p.bias_on() || p.dbias_on ? kFeatBias : 0) | (p.softcap_on() ? kFeatSoftcap : 0) |
         (p.alibi_on ? kFeatAlibi : 0) | (p.dropout_on() ? kFeatDropout : 0);
}

int pass_features(const Problem& p, Pass pass) {
  if (pass != Pass::forward) return score_features(p);
  return score_features(p) | (p.sinks_on ? kFeatSinks : 0) | (p.max_logit_on ? kFeatMaxLogit : 0);
}

Variant feature_variant(const Problem& p, const KernelEntry& e) {
  const int bits = pass_features(p, e.pass);
  for (int i = 0; i < kSingleFeatureCount; ++i)
    if (bits == kSingleFeatures[i] && e.mods_single[i] != nullptr) return Variant(int(Variant::mods_bias) + i);
  return Variant::mods;
}

// The warp-specialized forward's consumer schedule (step 31 of bench/cuda-notes.md): ping-pong
// up to kWsPingPongMaxKeys keys, overlapped beyond and with a training feature on (only its
// entry has the features' instantiation); a test may force one.
static WsSchedule ws_schedule_for(const Problem& p, const PlanForcing& forcing) {
  return forcing.ws_schedule.value_or(p.s_kv <= kWsPingPongMaxKeys && !p.any_feature() ? WsSchedule::ping_pong
                                                                                       : WsSchedule::overlapped);
}

std::string ws_forward_refusal(const Problem& p, const CudaPlan& plan, const DeviceCaps& caps,
                               const PlanForcing& forcing) {
  if (!forcing.ws_forward.value_or(true)) return "forced_off: a test keeps the other forward (PlanForcing::ws_forward)";
  if (p.is_backward()) return "direction: backward (a forward kernel)";
  if (plan.arch != Arch::sm90a) return std::string("arch: ") + to_string(plan.arch) + " kernels (needs sm90a)";
  if (!has_ws_forward(plan.bucket) || find_ws_forward(plan.dtype, plan.bucket, WsSchedule::plain) == nullptr)
    return "head_dim: bucket " + std::to_string(plan.bucket) + " (supported: the 64, 128 and 256 buckets)";
  if (p.varlen) return "varlen: variable-length sequences (supported: fixed-length batches)";
  const WsSchedule schedule = ws_schedule_for(p, forcing);
  const KernelEntry* e = find_ws_forward(plan.dtype, plan.bucket, schedule);
  if (p.any_feature() && e != nullptr && e->mods == nullptr)
    return std::string("features: a training feature is on, which the ") + to_string(schedule) +
           " schedule has no instantiation for (supported: the overlapped schedule)";
  if (p.any_feature() && p.s_kv > kFoldKeys)
    return "features: a training feature is on over " + std::to_string(p.s_kv) +
           " keys, which need the fold (supported: up to " + std::to_string(kFoldKeys) +
           " keys with features; the fold without them)";
  if (e == nullptr) return std::string("schedule: no ") + to_string(schedule) + " instantiation";
  if (p.s_kv > kFoldKeys && e->fold == nullptr)
    return "long_keys: " + std::to_string(p.s_kv) + " keys need the fold, which the " + to_string(schedule) +
           " schedule lacks (supported: up to " + std::to_string(kFoldKeys) + " keys, or the overlapped schedule)";
  const int smem_limit = forcing.smem_optin > 0 ? std::min(forcing.smem_optin, caps.smem_optin) : caps.smem_optin;
  if (ws_forward_tile(plan.bucket).smem_bytes > smem_limit)
    return "shared_memory: needs " + kib(ws_forward_tile(plan.bucket).smem_bytes) + ", the device grants " +
           kib(smem_limit);
  for (auto [view, name] : {std::pair{&p.q, "q"}, std::pair{&p.k, "k"}, std::pair{&p.v, "v"}})
    if (std::string r = tma_view_refusal(*view, name); !r.empty()) return "tma: " + r;
  return "";
}

std::string ws_backward_refusal(const Problem& p, const CudaPlan& plan, const DeviceCaps& caps,
                                const PlanForcing& forcing) {
  if (!forcing.ws_backward.value_or(true))
    return "forced_off: a test keeps the wgmma dK/dV pass (PlanForcing::ws_backward)";
  if (!p.is_backward()) return "direction: forward (a backward pass)";
  if (plan.arch != Arch::sm90a) return std::string("arch: ") + to_string(plan.arch) + " kernels (needs sm90a)";
  if (!has_ws_backward(plan.bucket) || find_ws_backward(plan.dtype, plan.bucket) == nullptr)
    return "head_dim: bucket " + std::to_string(plan.bucket) +
           " (supported: the 128 bucket, the larger head dim 72..128; the 64 bucket where forced)";
  if (!ws_backward_by_default(plan.bucket) && !forcing.ws_backward.value_or(false))
    return "head_dim: bucket " + std::to_string(plan.bucket) +
           " runs the wgmma pass unless a test forces this one (PlanForcing::ws_backward; by default: the 128 "
           "bucket, the larger head dim 72..128)";
  if (p.varlen) return "varlen: variable-length sequences (supported: fixed-length batches)";
  if (p.score_feature() && !ws_backward_features(plan.bucket))
    return "features: the bias, ALiBi, softcap or dropout is on in bucket " + std::to_string(plan.bucket) +
           " (supported: in the 128 bucket; the wgmma pass's features variant runs them)";
  if (p.deterministic)
    return "deterministic: deterministic = true asks for the two-pass backward (supported: the single-pass "
           "backward, dQ by fp32 atomics)";
  if (!plan.single_pass)
    return "two_pass: the two-pass backward runs (" + std::to_string(p.s_kv) + " keys, more than " +
           std::to_string(std::int64_t(kFoldRows) * 2) +
           ", or forced) (supported: the single-pass backward, dQ by fp32 atomics)";
  if (plan.kv_fold_blocks > 0)
    return "fold: the dK/dV pass folds every " + std::to_string(plan.kv_fold_blocks) +
           " query blocks over a long query range (supported: up to " + std::to_string(kFoldRows) +
           " query rows times heads per CTA, no fold)";
  const int smem_limit = forcing.smem_optin > 0 ? std::min(forcing.smem_optin, caps.smem_optin) : caps.smem_optin;
  if (ws_backward_tile(plan.bucket).smem_bytes > smem_limit)
    return "shared_memory: needs " + kib(ws_backward_tile(plan.bucket).smem_bytes) + ", the device grants " +
           kib(smem_limit);
  for (auto [view, name] : {std::pair{&p.q, "q"}, std::pair{&p.k, "k"}, std::pair{&p.v, "v"}, std::pair{&p.d_o, "d_o"}})
    if (std::string r = tma_view_refusal(*view, name); !r.empty()) return "tma: " + r;
  return "";
}

std::optional<std::string> cuda_plan_refusal(const Problem& p, const DeviceCaps& caps, const PlanForcing& forcing) {
  CudaPlan plan;
  if (choose_kernels(p, caps, forcing, &plan)) return std::nullopt;
  return std::move(plan.error);
}

CudaPlan make_cuda_plan(const Problem& p, const DeviceCaps& caps, const PlanForcing& forcing) {
  CudaPlan plan;
  if (!choose_kernels(p, caps, forcing, &plan)) return plan;
  WorkspaceLayout& ws = plan.workspace;
  std::size_t end = 0;
  auto piece = [&](std::size_t bytes) {
    const std::size_t at = end;
    end += round_up(bytes);
    return at;
  };
  ws.tables = piece(p.varlen ? 4 * std::size_t(p.batch) * sizeof(std::int64_t) : 0);
  const std::size_t q_rows = std::size_t(p.q.shape[kBatch]) * std::size_t(p.heads) * std::size_t(p.q.shape[kSeq]);

  if (!plan.backward) {
    const KernelEntry* e = plan.main.entry;
    // More keys than one register accumulator sums well (common/outer_accumulator.cuh): the
    // fold instantiation, with a slot pool sized for every warp that can be resident.
    if (p.s_kv > kFoldKeys) plan.outer_count = resident_warps(*e, caps);
    plan.main.variant = p.any_feature()                                            ? feature_variant(p, *e)
                        : plan.outer_count > 0                                     ? Variant::fold
                        : e->full_d != nullptr && dims_fill_bucket(p, plan.bucket) ? Variant::full_d
                                                                                   : Variant::guarded;
    plan.main.grid = grid_of(*e, p, 1);
    // The warp-specialized forward where it covers the problem; the bucket's other forward
    // (mma.sync at d <= 64, wgmma above) stays as its fallback (a view the driver
    // cannot map, launch.cpp).
    if (plan.arch == Arch::sm90a && has_ws_forward(plan.bucket)) {
      plan.ws_note = ws_forward_refusal(p, plan, caps, forcing);
      if (plan.ws_note.empty()) {
        plan.ws_fallback = plan.main;
        plan.main.entry = find_ws_forward(plan.dtype, plan.bucket, ws_schedule_for(p, forcing));
        // (the slot pool covers the warps of either kernel that can be resident)
        if (plan.outer_count > 0) plan.outer_count = std::max(plan.outer_count, resident_warps(*plan.main.entry, caps));
        // (features: never with the fold, ws_forward_refusal)
        plan.main.variant = p.any_feature()        ? feature_variant(p, *plan.main.entry)
                            : plan.outer_count > 0 ? Variant::fold
                                                   : Variant::guarded;
        plan.main.grid = grid_of(*plan.main.entry, p, 1);
      }
    }
    plan.outer_slot_floats = std::size_t(e->warp_rows) * std::size_t(plan.bucket);
    ws.delta = ws.partial = ws.dq_accum = end;
    ws.outer_slots = piece(std::size_t(plan.outer_count) * plan.outer_slot_floats * sizeof(float));
    ws.outer_flags = piece(std::size_t(plan.outer_count) * sizeof(int));
    ws.dbias_accum = end;
    ws.total = end;
    return plan;
  }

  const KernelEntry* e = plan.main.entry;
  plan.main.variant = e->full_d != nullptr && dims_fill_bucket(p, plan.bucket) ? Variant::full_d : Variant::guarded;
  plan.group_splits = group_splits(p, *e, caps, forcing.group_splits);
  plan.main.grid = grid_of(*e, p, plan.group_splits);
  if (!plan.single_pass) plan.dq.grid = grid_of(*plan.dq.entry, p, 1);
  ws.delta = piece(q_rows * sizeof(float));
  // Folds (kernel_params.hpp): every kFoldRows / (rows per iteration) iterations, where a
  // CTA's loop runs over more (a dK/dV pass: query blocks times its share of the GQA group;
  // the dQ pass: key blocks).
  auto fold_of = [&](const KernelEntry& pass, std::int64_t iterations) {
    if (forcing.fold_blocks != 0) return std::max(forcing.fold_blocks, 0);
    const int every = kFoldRows / pass.loop_rows;
    return iterations > every ? every : 0;
  };
  const std::int64_t group = p.group_size(), heads_per_split = (group + plan.group_splits - 1) / plan.group_splits;
  plan.kv_fold_blocks = fold_of(*e, (p.s_q + e->loop_rows - 1) / e->loop_rows * heads_per_split + heads_per_split);
  if (!plan.single_pass)
    plan.q_fold_blocks =
        fold_of(*plan.dq.entry, (p.s_kv + plan.dq.entry->loop_rows - 1) / plan.dq.entry->loop_rows + 1);
  // (the folding instantiations: the others keep their registers free of the fold's code)
  if (plan.kv_fold_blocks > 0) plan.main.variant = Variant::fold;
  if (plan.q_fold_blocks > 0) plan.dq.variant = Variant::fold;
  // The training features that change the scores: their variant of each pass, which folds
  // where the fold counts above say so (the plain kernels stay free of the features' code).
  // Sinks alone run the plain passes: P comes from the LSE, which holds them, and d_sinks is
  // its own reduction (launch_d_sinks).
  if (p.score_feature()) {
    plan.main.variant = feature_variant(p, *plan.main.entry);
    plan.dq.variant = Variant::mods;
  }
  // The warp-specialized dK/dV pass where it covers the problem (the same grid, group splits
  // and workspace as the wgmma pass); the wgmma pass stays as its fallback (a view the driver
  // cannot map, launch.cpp). (A bucket it runs on only where forced keeps its plans' notes
  // empty otherwise.)
  if (plan.arch == Arch::sm90a && has_ws_backward(plan.bucket) &&
      (ws_backward_by_default(plan.bucket) || forcing.ws_backward.value_or(false))) {
    plan.ws_note = ws_backward_refusal(p, plan, caps, forcing);
    if (plan.ws_note.empty()) {
      plan.ws_fallback = plan.main;
      plan.main.entry = find_ws_backward(plan.dtype, plan.bucket);
      plan.main.variant = p.score_feature() ? feature_variant(p, *plan.main.entry) : Variant::guarded;
      plan.main.grid = grid_of(*plan.main.entry, p, plan.group_splits);
    }
  }
  if (plan.group_splits > 1 || plan.kv_fold_blocks > 0)
    plan.partial_rows = p.k.shape[kBatch] * p.kv_heads * p.k.shape[kSeq];
  plan.partial_bytes = std::size_t(plan.partial_rows > 0 ? plan.group_splits : 0) * std::size_t(plan.partial_rows) *
                       std::size_t(p.d_qk + p.d_v) * sizeof(float);
  ws.partial = piece(plan.partial_bytes);
  if (plan.single_pass || plan.q_fold_blocks > 0) plan.dq_accum_bytes = q_rows * std::size_t(p.d_qk) * sizeof(float);
  ws.dq_accum = piece(plan.dq_accum_bytes);
  ws.outer_slots = ws.outer_flags = end;
  if (p.dbias_on && !dbias_direct(p)) {
    std::size_t n = sizeof(float);
    for (std::int64_t e : p.dbias.shape) n *= std::size_t(e);
    plan.dbias_accum_bytes = n;
  }
  ws.dbias_accum = piece(plan.dbias_accum_bytes);
  ws.total = end;
  return plan;
}

}  // namespace strideattn::cuda_impl
