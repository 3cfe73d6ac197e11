// The parameter block every CUDA kernel of the `cuda` backend receives: the problem's tensors,
// strides and sizes (kernel::AttentionParams, the varlen tables in device memory) and the
// pieces of the workspace the plan laid out. Data only: which kernel runs is the host's plan
// (plan.hpp), never a field here. Plain types, filled by launch.cu.
#pragma once

#include <cstdint>

#include "backends/cuda/common/kv_cache_rows.hpp"
#include "common/attention_math.hpp"

namespace strideattn::cuda_impl {

using kernel::MaskRule;
using kernel::SequenceSpan;
using kernel::SequenceTable;
using kernel::TileRange;

// Bits of KernelParams::aligned.
enum AlignBits : std::uint32_t {
  // 16-byte cp.async loads are legal: base pointer 16-byte aligned and every stride of an
  // extent > 1 dimension a multiple of 8 elements.
  kVecQ = 1u << 0,
  kVecK = 1u << 1,
  kVecV = 1u << 2,
  kVecDO = 1u << 3,
  kVecO = 1u << 4,
  // 4-byte paired stores are legal: base pointer 4-byte aligned and strides even.
  kPairO = 1u << 8,
  kPairDQ = 1u << 9,
  kPairDK = 1u << 10,
  kPairDV = 1u << 11,
};

// The training features the kernels apply (docs/semantics.md "Training features"): data of
// the call, read only by the kernels' feature variant (Variant::mods) and the helpers around
// it; the plain kernels never look at them. Strides are elements; a broadcast dimension has
// stride 0.
struct FeatureParams {
  float softcap = 0.f;           // c > 0: L = c tanh(T / c); 0: off
  const float* alibi = nullptr;  // ALiBi slopes [1 or b, h] (slope(b, h) = alibi[b sb + h sh]); null: off
  std::int64_t alibi_sb = 0, alibi_sh = 0;
  const float* sinks = nullptr;  // sink logit of each query head (sinks[h sh]); null: off
  std::int64_t sinks_sh = 0;
  float* max_logit = nullptr;  // forward: max L per (sequence, query head); null: not asked
  std::int64_t max_logit_sb = 0, max_logit_sh = 0;
  float* d_sinks = nullptr;  // backward: d_sink per query head; null: not asked
  std::int64_t d_sinks_sh = 0;
  // Additive bias [B, H, SQ, SKV]: element (b, h, i, j) at bias[b st0 + h st1 + i st2 + j st3];
  // bias_kind is the BiasType's value (0 none, 1 post_scale, 2 pre_scale), dtypes DType's.
  const void* bias = nullptr;
  int bias_kind = 0, bias_dtype = 0;
  std::int64_t bias_st[4] = {0, 0, 0, 0};
  // dBias (backward; the bias's logical shape dbias_shape, its own strides and dtype). Where
  // no dimension of extent 1 stands for more than one index of the problem (dbias_direct,
  // plan.hpp) the dK/dV pass stores each pair's value itself (every element written once,
  // launch_zero_dbias zeroes it first); otherwise it adds them by fp32 atomics into
  // dbias_accum, dense over dbias_shape with strides dbias_accum_st (0 on extent-1
  // dimensions), which launch_convert_dbias stores.
  void* dbias = nullptr;
  int dbias_dtype = 0;
  std::int64_t dbias_shape[4] = {0, 0, 0, 0}, dbias_st[4] = {0, 0, 0, 0};
  float* dbias_accum = nullptr;
  std::int64_t dbias_accum_st[4] = {0, 0, 0, 0};
  // Dropout (common/dropout.cuh): keep iff the Philox word >= dropout_threshold, kept values
  // times dropout_scale = 1 / (1 - p) (0: off). The seed and offset are the values, or read
  // by the kernel from the pointers when set (device, managed or pinned host memory).
  float dropout_scale = 0.f;
  std::uint32_t dropout_threshold = 0;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  const std::uint64_t* dropout_seed_ptr = nullptr;
  const std::uint64_t* dropout_offset_ptr = nullptr;
};

struct KernelParams {
  kernel::AttentionParams p;  // tensors, strides, sizes, mask; seq tables in device memory
  float* delta = nullptr;     // backward: rowsum(dO * O), [q batch extent][heads][q tokens]
  std::int64_t q_tokens = 0;  // seq extent of the Q view (rows of one delta plane)
  std::uint32_t aligned = 0;  // AlignBits
  float scale_log2 = 0.f;     // scale * log2(e): the forward's softmax runs in base 2
  // Backward with GQA/MQA and too few KV heads to fill the GPU: the dK/dV pass splits each
  // query-head group over `group_splits` CTAs; split i writes fp32 partial dK (unscaled) and
  // dV rows into plane i of `dkv_partial` ([splits][partial_rows][d_qk], then
  // [splits][partial_rows][d_v]) and launch_reduce_dkv sums the planes in split order
  // (deterministic). nullptr: one split, the pass stores dK and dV itself.
  float* dkv_partial = nullptr;
  int group_splits = 1;
  std::int64_t kv_tokens = 0;     // seq extent of the K view
  std::int64_t partial_rows = 0;  // rows of one plane: kv batch extent * kv_heads * kv_tokens
  // Single-pass backward (deterministic == false): the dK/dV pass adds unscaled dS K into
  // this fp32 accumulator, [q batch extent][heads][q tokens][d_qk] (row delta_index), zeroed
  // before the pass, and launch_convert_dq stores dQ = scale * acc. nullptr: the two-pass
  // path (a separate, deterministic dQ pass).
  float* dq_accum = nullptr;
  // Forward over long key ranges (outer_accumulator.cuh): `outer_count` warp slots of
  // 16 * MT * D fp32 each (MT, D: the forward kernel's) and one int flag per slot (0 free, 1
  // claimed), zeroed before the launch. outer_count == 0: no sequence has more than
  // kFoldKeys keys, every row block accumulates in registers alone.
  float* outer_slots = nullptr;
  int* outer_flags = nullptr;
  int outer_count = 0;
  // Backward over long ranges: every `kv_fold_blocks` iterations of its loop over query
  // blocks a dK/dV pass adds its dK and dV registers into its fp32 partial rows (dkv_partial,
  // zeroed before the pass) and starts them again from zero; every `q_fold_blocks` key blocks
  // the dQ pass does the same with its dQ registers into its dq_accum rows. So no fp32 sum in
  // registers runs over more than that many block products, and the fold sums the blocks'
  // results (a blocked sum, not one running sum over millions of terms). 0: no fold.
  int kv_fold_blocks = 0;
  int q_fold_blocks = 0;
  FeatureParams f;  // the training features (the feature variant's)
  // A KV-cache call through the dense forward (its KvCache instantiation, Variant::kv_cache):
  // each sequence's lengths come from device memory, not from p.q_seq / p.kv_seq, and K and V
  // rows through the cache (paged: its block table); the other instantiations never read it.
  KvCacheParams kv;
};

// The mask of sequence `batch`: the problem's (p.mask), or in a KV-cache instantiation the one
// of its lengths read from device memory (kv_seq_lengths; a broken sequence's: no query rows).
template <bool KvCache>
SA_HD MaskRule mask_of(const KernelParams& kp, std::int64_t batch) {
  if constexpr (KvCache)
    return kv_seq_mask(kv_seq_lengths(kp.kv, batch), kp.p.mask_kind, kp.p.window_left, kp.p.window_right);
  else
    return kp.p.mask(batch);
}

// Keys a forward warp accumulates in registers before folding them into its outer slot.
inline constexpr std::int64_t kFoldKeys = 8192;

// Rows (queries of a dK/dV pass, counted over its GQA heads; keys of the dQ pass) a backward
// pass sums in registers before it folds them (kv_fold_blocks, q_fold_blocks: this over the
// pass's rows per iteration). A register chain then has at most 65,536 / 16 = 4,096 MMA
// k-steps; the wgmma accumulator drifts by about 2^-23 per k-step when every term is alike
// (measured: 2.6e-3 relative after 16,384 k-steps), so 4,096 keep it under the fp16 output's
// rounding. The plan folds only where a CTA's rows exceed this: MHA past 64k queries, GQA-8
// past 8k, dQ past 128k keys (kFoldRows x 2: the single pass's atomics add with rounding to
// nearest and drift less); the fold costs a memset, fp32 partial stores and a reduction
// (well under 1% of such a backward).
inline constexpr int kFoldRows = 65536;

// Row of the delta workspace for (sequence `batch`, head, token).
SA_HD std::int64_t delta_index(const KernelParams& kp, std::int64_t batch, std::int64_t head, std::int64_t token) {
  const kernel::SequenceTable& q = kp.p.q_seq;
  return (q.batch_index(batch) * kp.p.heads + head) * kp.q_tokens + q.first_token(batch) + token;
}

// Row of a dK/dV partial plane for (sequence `batch`, KV head, key token).
SA_HD std::int64_t kv_row_index(const KernelParams& kp, std::int64_t batch, std::int64_t kv_head, std::int64_t token) {
  const kernel::SequenceTable& kv = kp.p.kv_seq;
  return (kv.batch_index(batch) * kp.p.kv_heads + kv_head) * kp.kv_tokens + kv.first_token(batch) + token;
}

}  // namespace strideattn::cuda_impl
