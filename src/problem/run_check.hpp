// The checks of one run of a plan: what depends on the run's pointers and nothing else. The
// plan's problem was validated when the plan was made (shapes, strides, options, each view's
// self-overlap, which do not move with a pointer); a run checks its pointers for null, for
// the alignment the plan assumed, for views that would reach past the address space, and for
// outputs that overlap an input or another output. Everything a run needs is worked out at make
// time (per tensor: the bytes a view reaches around its pointer), so a run costs a few
// comparisons; the exact element-wise overlap test (overlap.cpp) runs only where two byte
// ranges meet, and a layout of views already shown disjoint (the split views of one fused
// buffer, at the same distances apart) is not tested again.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "problem/problem.hpp"

namespace strideattn::detail {

// The alignment a plan assumes for a pointer given at make time: what its address has, up to
// 16 bytes; a pointer given at run time (null at make time) is assumed 16-byte aligned.
[[nodiscard]] std::size_t alignment_class(const void* ptr);
inline constexpr std::size_t kAssumedAlignment = 16;

class RunChecks {
 public:
  RunChecks() = default;
  // From the plan's validated problem (its pointers, or null for "given at run time").
  void init(const Problem& plan_problem);
  RunChecks(const RunChecks&) = delete;
  RunChecks& operator=(const RunChecks&) = delete;

  // `run` is the plan's problem with one run's pointers bound. invalid_argument names the
  // tensor, the value found and what the plan supports.
  [[nodiscard]] Status check(const Problem& run) const;

  // Tensors a problem of this direction has, in slot order (q, k, v, o, [dO], lse, [dq, dk, dv]).
  static constexpr std::size_t kMaxSlots = 9;

 private:
  struct Slot {
    const char* name = "";
    std::size_t align = 1;  // a run's pointer must be a multiple of this
    bool present = false;   // the problem has this tensor (the forward's LSE may be absent)
    bool empty = true;      // no element: nothing to check
    bool output = false;
    __int128 lo = 0, hi = 0;      // bytes from the pointer: lowest reached, one past the highest
    std::size_t extent_text = 0;  // index into shapes_ for messages
  };
  std::array<Slot, kMaxSlots> slots_{};
  std::size_t n_ = 0;
  std::array<std::pair<std::uint8_t, std::uint8_t>, kMaxSlots * kMaxSlots> pairs_{};  // (output, other)
  std::size_t n_pairs_ = 0;
  std::vector<std::string> shapes_;  // "[1, 128, 4, 64]" per slot
  // Distances between the pointers of the pairs whose byte ranges met in the last run found
  // disjoint by the exact test (pair index, distance); runs with the same ones skip the test.
  mutable std::mutex mu_;
  mutable std::vector<std::pair<std::size_t, __int128>> proven_;
};

// The data pointers of `p` in slot order (RunChecks); returns how many (5 forward, 9 backward).
std::size_t slot_pointers(const Problem& p, const void** out);
// The data pointer of slot `i` of `p`.
[[nodiscard]] const void* slot_pointer(const Problem& p, std::size_t i);

}  // namespace strideattn::detail
