// The problems the CPU-runnable plan tests describe (plan_test.cpp, ws_plan_test.cpp): dense
// [b, s, h, d] views with contiguous strides, forward or backward, and a launch's kernel name.
#pragma once

#include <cstdint>
#include <string>

#include "backends/cuda/dispatch.hpp"
#include "backends/cuda/plan.hpp"
#include "problem/problem.hpp"

namespace strideattn::cuda_impl::test_problems {

using strideattn::DType;
using strideattn::detail::Direction;
using strideattn::detail::Problem;

// A dense problem [b, s, h, d] with contiguous views.
inline Problem problem(Direction dir, DType t, std::int64_t b, std::int64_t s_q, std::int64_t s_kv, std::int64_t h,
                       std::int64_t hg, std::int64_t d_qk, std::int64_t d_v, bool deterministic = false) {
  Problem p;
  p.direction = dir;
  p.dtype = t;
  p.memory = strideattn::Memory::device;
  p.batch = b, p.s_q = s_q, p.s_kv = s_kv, p.heads = h, p.kv_heads = hg, p.d_qk = d_qk, p.d_v = d_v;
  p.deterministic = deterministic;
  p.scale = 0.125;
  auto view = [&](std::int64_t s, std::int64_t heads, std::int64_t d) {
    strideattn::TensorView v;
    v.dtype = t;
    v.shape = {b, s, heads, d};
    v.stride = {s * heads * d, heads * d, d, 1};
    return v;
  };
  p.q = p.d_o = p.dq = view(s_q, h, d_qk);
  p.o = view(s_q, h, d_v);
  p.k = p.dk = view(s_kv, hg, d_qk);
  p.v = p.dv = view(s_kv, hg, d_v);
  return p;
}
inline Problem fwd(DType t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t hg, std::int64_t d) {
  return problem(Direction::forward, t, b, s, s, h, hg, d, d);
}
inline Problem bwd(DType t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t hg, std::int64_t d,
                   bool deterministic = false) {
  return problem(Direction::backward, t, b, s, s, h, hg, d, d, deterministic);
}

inline std::string name_of(const KernelLaunch& l) { return l.entry == nullptr ? "(none)" : l.entry->name; }

}  // namespace strideattn::cuda_impl::test_problems
