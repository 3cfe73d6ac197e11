// make_problem(): copy the caller's arguments into a Problem, resolve defaults (scale,
// packed varlen offsets, sizes from the views), then apply every validation rule
// (validate.cpp). Resolution never indexes past what the caller gave, so validation can run
// on any input without crashing.
#include "problem/problem.hpp"

#include <cmath>
#include <limits>

#include "common/attention_math.hpp"
#include "problem/validate.hpp"

namespace strideattn::detail {

std::string_view to_string(Direction d) { return d == Direction::forward ? "forward" : "backward"; }

namespace {

std::vector<std::int64_t> packed_offsets(const std::vector<std::int64_t>& seqlens) {
  std::vector<std::int64_t> offsets(seqlens.size(), 0);
  std::int64_t next = 0;
  for (std::size_t i = 0; i < seqlens.size(); ++i) {
    offsets[i] = next;
    // Saturate: garbage lengths must reach validation (which names them), not overflow here.
    const std::int64_t len = seqlens[i] > 0 ? seqlens[i] : 0;
    next =
        len > std::numeric_limits<std::int64_t>::max() - next ? std::numeric_limits<std::int64_t>::max() : next + len;
  }
  return offsets;
}

// A feature table is used when its data is given, or (a plan) its shape.
bool used(const HeadView& v, Pointers mode) {
  return v.data != nullptr || (mode == Pointers::deferred && (v.shape[0] != 0 || v.shape[1] != 0));
}
bool used(const BiasView& v, Pointers mode) {
  bool shaped = false;
  for (auto x : v.shape) shaped = shaped || x != 0;
  return v.data != nullptr || (mode == Pointers::deferred && shaped);
}

std::int64_t max_of(const std::vector<std::int64_t>& v) {
  std::int64_t m = 0;
  for (auto x : v) m = x > m ? x : m;
  return m;
}

template <class Args>
void resolve_common(const Args& args, Direction direction, Problem* p) {
  p->direction = direction;
  p->dtype = args.q.dtype;
  p->memory = args.memory;
  p->q = args.q;
  p->k = args.k;
  p->v = args.v;
  p->o = args.o;
  p->lse = args.lse;
  p->heads = args.q.shape[kHead];
  p->kv_heads = args.k.shape[kHead];
  p->d_qk = args.q.shape[kHeadDim];
  p->d_v = args.v.shape[kHeadDim];
  p->mask = args.options.mask;
  p->window = args.options.window;
  p->deterministic = args.options.deterministic;
  p->cancel = args.options.cancel;
  p->scale = args.options.scale.value_or(p->d_qk > 0 ? 1.0 / std::sqrt(double(p->d_qk)) : 1.0);
  p->stream = args.stream;
  p->workspace = args.workspace;
  p->workspace_bytes = args.workspace_bytes;
  p->softcap = args.options.softcap;
  p->bias_type = args.options.bias_type;
  p->dropout_p = args.options.dropout.p;
  p->dropout_seed = args.options.dropout.seed;
  p->dropout_offset = args.options.dropout.offset;
  p->dropout_seed_ptr = args.options.dropout.seed_ptr;
  p->dropout_offset_ptr = args.options.dropout.offset_ptr;
  p->bias = args.bias;
  p->alibi = args.alibi_slopes;
  p->sinks = args.sinks;
  p->varlen = args.varlen.enabled();
  if (args.varlen.cu_seqlens()) {
    // Host lists given too are refused by validation; the bounds stand in for the lengths.
    p->cu_seqlens = true;
    p->batch = args.varlen.count;
    p->s_q = args.varlen.max_seqlen_q;
    p->s_kv = args.varlen.max_seqlen_kv;
    p->cu_seqlens_q = args.varlen.cu_seqlens_q;
    p->cu_seqlens_kv = args.varlen.cu_seqlens_kv;
    p->seq_offsets_q = args.varlen.seq_offsets_q;
    p->seq_offsets_kv = args.varlen.seq_offsets_kv;
  } else if (p->varlen) {
    p->seqlens_q = args.varlen.seqlens_q;
    p->seqlens_kv = args.varlen.seqlens_kv;
    p->offsets_q = args.varlen.offsets_q.empty() ? packed_offsets(p->seqlens_q) : args.varlen.offsets_q;
    p->offsets_kv = args.varlen.offsets_kv.empty() ? packed_offsets(p->seqlens_kv) : args.varlen.offsets_kv;
    p->batch = static_cast<std::int64_t>(p->seqlens_q.size());
    p->s_q = max_of(p->seqlens_q);
    p->s_kv = max_of(p->seqlens_kv);
  } else {
    p->batch = args.q.shape[kBatch];
    p->s_q = args.q.shape[kSeq];
    p->s_kv = args.k.shape[kSeq];
  }
}

}  // namespace

double Problem::visible_pairs() const {
  double pairs = 0;
  // Unread cu_seqlens arrays: every sequence at its bounds (an upper bound).
  const bool lists = varlen && lengths_known();
  for (std::int64_t b = 0; b < batch; ++b) {
    kernel::MaskRule m;
    m.s_q = lists ? seqlens_q[b] : s_q;
    m.s_kv = lists ? seqlens_kv[b] : s_kv;
    m.kind = static_cast<int>(mask);
    m.left = window.left;
    m.right = window.right;
    for (std::int64_t i = 0; i < m.s_q; ++i) pairs += double(m.key_end(i) - m.key_begin(i));
  }
  return pairs * double(heads);
}

double Problem::flops() const {
  const double fwd = 2.0 * visible_pairs() * double(d_qk + d_v);
  return is_backward() ? 2.5 * fwd : fwd;
}

Status make_problem(const ForwardArgs& args, Problem* out, Pointers mode) {
  Problem p;
  resolve_common(args, Direction::forward, &p);
  const auto& ls = args.lse.shape;
  p.lse_out = args.lse.data != nullptr || (mode == Pointers::deferred && (ls[0] != 0 || ls[1] != 0 || ls[2] != 0));
  p.alibi_on = used(args.alibi_slopes, mode);
  p.sinks_on = used(args.sinks, mode);
  p.max_logit = args.max_logit;
  p.max_logit_on = used(args.max_logit, mode);
  Status s = validate_problem(p, mode, args.varlen);
  if (!s.ok()) return s;
  *out = std::move(p);
  return Status::Ok();
}

Status make_problem(const BackwardArgs& args, Problem* out, Pointers mode) {
  Problem p;
  resolve_common(args, Direction::backward, &p);
  p.d_o = args.d_o;
  p.dq = args.dq;
  p.dk = args.dk;
  p.dv = args.dv;
  p.alibi_on = used(args.alibi_slopes, mode);
  p.sinks_on = used(args.sinks, mode);
  p.dbias = args.dbias;
  p.dbias_on = used(args.dbias, mode);
  p.d_sinks = args.d_sinks;
  p.d_sinks_on = used(args.d_sinks, mode);
  Status s = validate_problem(p, mode, args.varlen);
  if (!s.ok()) return s;
  *out = std::move(p);
  return Status::Ok();
}

}  // namespace strideattn::detail
