// Problem -> kernel::AttentionParams.
#include "problem/params.hpp"

namespace strideattn::detail {

namespace {
kernel::Strides strides_of(const TensorView& t) {
  // A head dim of extent 1 may carry any stride (never used): step 1 then.
  return {t.stride[kBatch], t.stride[kSeq], t.stride[kHead], t.shape[kHeadDim] > 1 ? t.stride[kHeadDim] : 1};
}
}  // namespace

kernel::AttentionParams make_params(const Problem& p) {
  kernel::AttentionParams a;
  a.batch = p.batch;
  a.heads = p.heads;
  a.kv_heads = p.kv_heads;
  a.d_qk = p.d_qk;
  a.d_v = p.d_v;
  a.q_seq.max_len = p.s_q;
  a.kv_seq.max_len = p.s_kv;
  if (p.varlen) {
    a.q_seq.seqlens = p.seqlens_q.data();
    a.q_seq.offsets = p.offsets_q.data();
    a.kv_seq.seqlens = p.seqlens_kv.data();
    a.kv_seq.offsets = p.offsets_kv.data();
  }
  a.mask_kind = static_cast<int>(p.mask);
  a.window_left = p.window.left;
  a.window_right = p.window.right;
  a.scale = static_cast<float>(p.scale);
  a.q = p.q.data;
  a.k = p.k.data;
  a.v = p.v.data;
  a.o = p.o.data;
  a.lse = p.lse.data;
  a.d_o = p.d_o.data;
  a.dq = p.dq.data;
  a.dk = p.dk.data;
  a.dv = p.dv.data;
  a.q_st = strides_of(p.q);
  a.k_st = strides_of(p.k);
  a.v_st = strides_of(p.v);
  a.o_st = strides_of(p.o);
  a.do_st = strides_of(p.d_o);
  a.dq_st = strides_of(p.dq);
  a.dk_st = strides_of(p.dk);
  a.dv_st = strides_of(p.dv);
  a.lse_st = {p.lse.stride[0], p.lse.stride[1], p.lse.stride[2]};
  return a;
}

}  // namespace strideattn::detail
