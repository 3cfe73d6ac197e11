// Support rules of the `cuda` backend (no GPU needed): a deterministic dBias that sums over a
// broadcast dimension, host memory, f32, head dims that are not multiples of 8 or exceed 256,
// and a head-dim stride other than 1 are refused with the
// rule's name, the value found and what is supported; cu_seqlens problems reach its rules
// (it reads the arrays), with every mask.
#include <gtest/gtest.h>

#include <string>

#include "dispatch/backend.hpp"

namespace {

using strideattn::DType;
using strideattn::Memory;
using strideattn::detail::Problem;

Problem supported_problem() {
  Problem p;
  p.memory = Memory::device;
  p.dtype = DType::bf16;
  p.batch = 1, p.s_q = p.s_kv = 16, p.heads = p.kv_heads = 1, p.d_qk = p.d_v = 64;
  for (auto* v : {&p.q, &p.k, &p.v, &p.o}) {
    v->shape = {1, 16, 1, 64};
    v->stride = {1024, 64, 64, 1};
  }
  return p;
}

void expect_refused(const Problem& p, const std::string& rule, const std::string& needle) {
  const strideattn::Verdict v = strideattn::detail::cuda_backend()->supports(p);
  EXPECT_FALSE(v.supported);
  EXPECT_EQ(v.rule, rule) << v.reason;
  EXPECT_NE(v.reason.find(needle), std::string::npos) << v.reason;
}

// A dBias summed over a broadcast dimension (fp32 atomics) with deterministic = true; a
// full-shape dBias (stored pair by pair), or the same sum without determinism, passes the rule.
TEST(CudaBackendRules, RefusesDeterministicBroadcastDbias) {
  Problem p = supported_problem();
  p.direction = strideattn::detail::Direction::backward;
  p.batch = 2, p.heads = 2;
  p.bias_type = strideattn::BiasType::post_scale;
  p.dbias_on = true;
  p.bias.shape = p.dbias.shape = {1, 2, 16, 16};
  p.deterministic = true;
  expect_refused(p, "dbias_deterministic", "[1, 2, 16, 16]");
  const strideattn::Verdict full = [&] {
    Problem q = p;
    q.bias.shape = q.dbias.shape = {2, 2, 16, 16};
    return strideattn::detail::cuda_backend()->supports(q);
  }();
  EXPECT_NE(full.rule, "dbias_deterministic") << full.reason;
  p.deterministic = false;
  EXPECT_NE(strideattn::detail::cuda_backend()->supports(p).rule, "dbias_deterministic");
}

TEST(CudaBackendRules, RefusesHostMemory) {
  Problem p = supported_problem();
  p.memory = Memory::host;
  expect_refused(p, "memory", "host");
}

TEST(CudaBackendRules, RefusesF32) {
  Problem p = supported_problem();
  p.dtype = DType::f32;
  expect_refused(p, "dtype", "f32");
}

TEST(CudaBackendRules, RefusesHeadDims) {
  Problem p = supported_problem();
  p.d_qk = 264;
  expect_refused(p, "head_dim", "264");
  p = supported_problem();
  p.d_v = 36;
  expect_refused(p, "head_dim", "36");
}

TEST(CudaBackendRules, RefusesHeadDimStride) {
  Problem p = supported_problem();
  p.k.stride[3] = 2;
  expect_refused(p, "head_dim_stride", "2");
}

TEST(CudaBackendRules, EveryOtherRulePasses) {
  // With no GPU the only failing rule may be `gpu`, and its reason says what was found.
  const strideattn::Verdict v = strideattn::detail::cuda_backend()->supports(supported_problem());
  if (!v.supported) {
    EXPECT_EQ(v.rule, "gpu") << v.reason;
    EXPECT_NE(v.reason.find("8.0"), std::string::npos) << v.reason;
  }
}

TEST(CudaBackendRules, CuSeqlensProblemsReachItsRules) {
  EXPECT_TRUE(strideattn::detail::cuda_backend()->reads_cu_seqlens());
  for (auto mask : {strideattn::MaskKind::none, strideattn::MaskKind::causal_bottom_right}) {
    Problem p = supported_problem();
    p.varlen = p.cu_seqlens = true;
    p.batch = 3;  // count; s_q, s_kv: the bounds
    p.mask = mask;
    p.window = {4, 0};
    const strideattn::Verdict v = strideattn::detail::cuda_backend()->supports(p);
    if (!v.supported) EXPECT_EQ(v.rule, "gpu") << v.reason;  // (no GPU here)
  }
}

}  // namespace
