// Named problems for `--preset`, and the CLI's usage text.
#include "cli_args.hpp"

namespace strideattn::cli {

namespace {

harness::ProblemSizes dense(std::int64_t b, std::int64_t sq, std::int64_t skv, std::int64_t h, std::int64_t hg,
                            std::int64_t d, std::int64_t dv) {
  harness::ProblemSizes z;
  z.batch = b, z.s_q = sq, z.s_kv = skv, z.heads = h, z.kv_heads = hg, z.d_qk = d, z.d_v = dv;
  return z;
}

AttentionOptions mask(MaskKind m, Window w = {}) {
  AttentionOptions o;
  o.mask = m;
  o.window = w;
  return o;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> kPresets = [] {
    std::vector<Preset> p;
    // The seed case: Q, K, V split from one fused [s, b, h + 2hg, d] fp16 buffer, MQA 16/1,
    // d = 64, s = 2048, causal. Batch 1 (the original had more) so that the fp64 reference
    // on a 2-core CPU keeps the demo and `check --preset seed --grad` short.
    p.push_back({"seed", "the seed case: split views of a fused sb(h+2hg)d fp16 buffer",
                 dense(1, 2048, 2048, 16, 1, 64, 64), DType::f16, "sb(h+2hg)d", mask(MaskKind::causal)});
    p.push_back({"small", "a small causal GQA problem in bshd", dense(2, 100, 100, 4, 2, 64, 64), DType::bf16,
                 "bshd_bshd_bshd", mask(MaskKind::causal)});
    p.push_back({"gqa", "GQA 8/2, d=128, s_q < s_kv, bottom-right causal, sbhd", dense(2, 192, 256, 8, 2, 128, 128),
                 DType::bf16, "sbhd_sbhd_sbhd", mask(MaskKind::causal_bottom_right)});
    p.push_back({"mqa", "MQA 8/1 split of a fused bs(h+2hg)d buffer, no mask", dense(1, 300, 300, 8, 1, 64, 64),
                 DType::f16, "bs(h+2hg)d", mask(MaskKind::none)});
    p.push_back({"mla", "MLA head dims 192/128, causal, bshd", dense(1, 256, 256, 8, 8, 192, 128), DType::bf16,
                 "bshd_bshd_bshd", mask(MaskKind::causal)});
    p.push_back({"window", "sliding window (128, 0), MQA, bshd", dense(1, 512, 512, 4, 1, 64, 64), DType::bf16,
                 "bshd_bshd_bshd", mask(MaskKind::none, Window{.left = 128, .right = 0})});
    p.push_back({"decode", "decode: s_q = 1 against 1000 keys, GQA 8/2, d=128", dense(4, 1, 1000, 8, 2, 128, 128),
                 DType::f16, "bshd_bshd_bshd", mask(MaskKind::causal_bottom_right)});
    Preset v{"varlen",
             "THD with an empty sequence and padding between sequences",
             dense(4, 128, 128, 4, 2, 64, 64),
             DType::bf16,
             "thd_thd_thd",
             mask(MaskKind::causal_bottom_right)};
    v.sizes.seqlens_q = {37, 0, 128, 5};
    v.sizes.seqlens_kv = {50, 10, 128, 0};
    v.sizes.offsets_q = {0, 40, 40, 200};
    v.sizes.offsets_kv = {0, 64, 80, 210};
    p.push_back(v);
    return p;
  }();
  return kPresets;
}

std::string usage() {
  std::string presets_list;
  for (const Preset& p : presets())
    presets_list +=
        "    " + p.name + std::string(10 - std::min<std::size_t>(p.name.size(), 9), ' ') + p.description + "\n";
  return R"(strideattn - fused attention for any strided view: check, explain, benchmark, fuzz

usage:
  strideattn                      demo: the preset 'seed' on every available backend
  strideattn check   PROBLEM [--backends a,b] [--grad] [--seed N] [--json] [--cu-seqlens] [--via-plan]
  strideattn explain PROBLEM [--grad] [--json]
  strideattn bench   PROBLEM [--backends a,b] [--grad] [--runs N] [--json] [--cu-seqlens]
  strideattn fuzz    --cases N [--min-ran M] [--seed S] [--backends a,b] [--grad] [--json]
                     [--cu-seqlens] [--via-plan] [--features]
  strideattn check   KVCACHE [--backends a,b] [--seed N] [--json]   (default backends reference,cpu)
  strideattn explain KVCACHE [--json]
  strideattn fuzz    --kv-cache [--cases N] [--min-ran M] [--seed S] [--backends a,b] [--paged]
                     [--require-gpu] [--require-ran]
  strideattn help | --help | --version

PROBLEM:
  --preset NAME                  a named problem (other options override its fields):
)" + presets_list +
         R"(  --dtype f16|bf16|f32           (default f16)
  --batch B --seqlen-q SQ --seqlen-kv SKV --heads H --kv-heads HG --head-dim D [--head-dim-v DV]
                                 defaults 1, 128, =SQ, 4, =H, 64, =D
  --layout NAME                  bshd_bshd_bshd (default), sbhd_sbhd_sbhd, bhsd_bhsd_bhsd, sb3hd,
                                 sbh3d, bs3hd, bsh3d, sbhd_sb2hd, sbhd_sbh2d, bshd_bs2hd,
                                 bshd_bsh2d, thd_thd_thd (default when varlen), t3hd, th3d,
                                 thd_t2hd, thd_th2d, sb(h+2hg)d, bs(h+2hg)d, t(h+2hg)d
  --q|--k|--v|--o|--do|--dq|--dk|--dv  BUF+OFFSET:SHAPE:STRIDES
                                 an explicit view: buffer name, element offset, logical shape
                                 b,s,h,d and strides b,s,h,d, e.g. qkv+16:1,2048,1,64:1152,1152,64,1
                                 (views naming the same buffer alias the same memory; explicit
                                 views override the layout's; sizes not given come from them,
                                 sizes given must agree with them). Each option at most once.
  --seqlens-q L0,L1,...  --seqlens-kv L0,L1,...   varlen (THD) token counts
  --offsets-q O0,O1,...  --offsets-kv O0,O1,...   first token of each sequence (default packed)
  --mask none|causal|causal_bottom_right   causal is top-left (key j <= query i); bottom-right:
                                 j <= i + s_kv - s_q; aliases no_mask, top_left, causal_top_left,
                                 bottom_right
  --window LEFT,RIGHT  --scale X  --deterministic
  --input-scale F                the random inputs times F (large F: logits up to fp32 overflow)
  --plant-input T:I:V,...        set logical element I of input T (q, k, v, do) to V (nan, inf,
                                 -inf) after the draw; non-finite inputs propagate as
                                 docs/semantics.md says
Training features (docs/semantics.md "Training features"; reference, cpu and cuda run all, cudnn
  the post_scale bias and sinks within cuDNN's limits: each refusal is reported as unsupported
  with its rule):
  --softcap C                    logits become C * tanh(logit / C) (0: off)
  --dropout P [--rng-seed S] [--rng-offset O]   dropout on P, Philox of (S, O), default 0, 0
  --bias BUF+OFFSET:SHAPE:STRIDES   an additive bias of logical shape b,h,s_q,s_kv, each extent
                                 full or 1 (broadcast), any strides (0 too); random values
  --bias-type post_scale|pre_scale  (default post_scale)   --bias-dtype f16|bf16|f32 (default
                                 --dtype; a bias buffer shared with Q/K/V/... has --dtype)
  --dbias BUF+OFFSET:SHAPE:STRIDES  with --grad: where dBias goes (default contiguous)
  --alibi | --alibi-per-batch    ALiBi with random positive slopes [1, h] | [b, h]
  --sinks                        random per-head sink logits [1, h] (d_sinks with --grad)
  --max-logit                    the forward also writes the max logit [b, h]
  Every output (max_logit, dbias, d_sinks too) is judged by the correctness rule.

KVCACHE (attention over a KV cache, docs/semantics.md "KV cache"; any of the first five options
  makes check / explain a KV-cache command):
  --cache-seqlens L0,L1,...      tokens already in each sequence's cache (one per sequence)
  --page-size P                  a paged cache of pages of P tokens (default: contiguous)
  --block-table shuffled|identity|transposed|shared|ROWS   pages of each sequence; ROWS is
                                 explicit page indices, e.g. '0,3;1,2' (default shuffled)
  --k-cache|--v-cache BUF+OFFSET:SHAPE:STRIDES   explicit cache views [pages or batch, slots,
                                 kv heads, d] (default packed, --pad N extra elements per row)
  --new-tokens N                 append N new keys / values per sequence before attending
  --max-pages M --num-pages N --cache-capacity C   table width, page count, contiguous slots
  --seqlen-q SQ --seqlens-q L0,... --heads H --kv-heads HG --head-dim D --head-dim-v DV
  --dtype --mask --window --scale   as for PROBLEM; defaults 1, -, 8, 2, 64, =D, f16
  O and LSE are judged by the correctness rule, the caches after the append must equal the
  reference's byte for byte.
--backends: reference, cpu, cuda, cudnn, auto. Default: every backend this build has and this
  machine can run, except 'reference', which is the fp64 yardstick every backend is compared
  with (name it to check the reference backend's own API path too).
--grad: also run and check the backward (each backend's backward uses its own forward O, LSE).
--min-ran M (fuzz): keep drawing past --cases until every listed backend ran M cases (compared
  with the reference, not refused); at most --cases + 50 M draws, exit 1 if still short.
--logit-limit L (fuzz): cap the numerical-edge draws so that a typical scaled logit
  (input scale^2 * scale * sqrt(d_qk)) and the input scale^2 stay at most L: to study a backend
  within a range of its own (docs/backends.md, "Numerical envelope and the exact recompute").
--cu-seqlens: pass varlen lengths as int32 cu_seqlens (and seq_offsets) arrays in the tensors'
  memory, device memory for GPU backends (FlashAttention's form), instead of host lists.
--via-plan: run each backend through plans made without pointers (make_plan, then run).
--features (fuzz): also draw the training features (softcap, dropout, post/pre-scale bias of
  any broadcast shape, strides and dtype with a strided dBias, ALiBi, sinks, max logit), at
  least one per case, of those every backend of --backends runs; cases whose features change
  the logits keep typical logits <= 10.
Inputs are fresh random values (normal(0,1), from --seed); outputs are poisoned with NaN before
each run; every output element must be written and nothing outside the output views may change.

exit codes: 0 every compared backend agrees with the fp64 reference within tolerance
  (unsupported is not a failure; its reason is printed); 1 some backend disagrees or failed
  (the report names it and the worst element); 2 invalid input or environment (one line on
  stderr; under --json also {"error": {"code", "message"}, "exit_code"} on stdout).
A progress line goes to stderr for fuzz and long check/bench runs when it is a terminal
  (never under --json).
)";
}

}  // namespace strideattn::cli
