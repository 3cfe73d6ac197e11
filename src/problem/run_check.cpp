// The per-run pointer checks of a plan (run_check.hpp). Each view's reach around its pointer
// is computed once from its shape and strides; a run compares addresses against it.
#include "problem/run_check.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "problem/validate.hpp"

namespace strideattn::detail {

namespace {

using i64 = std::int64_t;
using i128 = __int128;

constexpr i128 kI64Max = std::numeric_limits<i64>::max();

Status invalid(const std::string& message) { return Status(StatusCode::invalid_argument, message); }

template <std::size_t N>
std::string shape_text(const std::array<i64, N>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < N; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

template <std::size_t N>
void reach(const std::array<i64, N>& shape, const std::array<i64, N>& stride, i64 elem, i128* lo, i128* hi,
           bool* empty) {
  *empty = false;
  for (std::size_t i = 0; i < N; ++i) *empty = *empty || shape[i] <= 0;
  i128 low = 0, high = 0;
  if (!*empty)
    for (std::size_t i = 0; i < N; ++i) {
      if (shape[i] <= 1) continue;  // size-1 dims may carry any stride
      const i128 step = static_cast<i128>(shape[i] - 1) * stride[i];
      (step < 0 ? low : high) += step;
    }
  *lo = low * elem;
  *hi = (high + 1) * elem;
}

}  // namespace

std::size_t alignment_class(const void* ptr) {
  const auto a = reinterpret_cast<std::uintptr_t>(ptr);
  if (a == 0) return kAssumedAlignment;
  std::size_t c = 1;
  while (c < kAssumedAlignment && a % (2 * c) == 0) c *= 2;
  return c;
}

std::size_t slot_pointers(const Problem& p, const void** out) {
  const bool bwd = p.is_backward();
  out[0] = p.q.data, out[1] = p.k.data, out[2] = p.v.data, out[3] = p.o.data;
  if (!bwd) {
    out[4] = p.lse.data;
    return 5;
  }
  out[4] = p.d_o.data, out[5] = p.lse.data, out[6] = p.dq.data, out[7] = p.dk.data, out[8] = p.dv.data;
  return 9;
}

const void* slot_pointer(const Problem& p, std::size_t i) {
  const void* ptrs[RunChecks::kMaxSlots];
  return i < slot_pointers(p, ptrs) ? ptrs[i] : nullptr;
}

void RunChecks::init(const Problem& p) {
  struct T {
    const char* name;
    const TensorView* view;
    bool output;
  };
  std::vector<T> views;
  const bool bwd = p.is_backward();
  views = {{"q", &p.q, false}, {"k", &p.k, false}, {"v", &p.v, false}, {"o", &p.o, !bwd}};
  if (bwd) views.push_back({"dO", &p.d_o, false});
  n_ = views.size() + 1 + (bwd ? 3 : 0);
  shapes_.resize(n_);
  auto fill_view = [&](std::size_t i, const T& t) {
    Slot& s = slots_[i];
    s.name = t.name;
    s.present = true;
    s.output = t.output;
    const i64 elem = static_cast<i64>(size_of(t.view->dtype));
    reach(t.view->shape, t.view->stride, elem, &s.lo, &s.hi, &s.empty);
    s.align = std::max<std::size_t>(std::size_t(elem), alignment_class(t.view->data));
    shapes_[i] = shape_text(t.view->shape);
  };
  for (std::size_t i = 0; i < views.size(); ++i) fill_view(i, views[i]);
  {
    Slot& s = slots_[views.size()];
    s.name = "lse";
    s.present = bwd || p.writes_lse();
    s.output = !bwd;
    reach(p.lse.shape, p.lse.stride, 4, &s.lo, &s.hi, &s.empty);
    s.empty = s.empty || !s.present;
    s.align = std::max<std::size_t>(4, alignment_class(p.lse.data));
    shapes_[views.size()] = shape_text(p.lse.shape);
  }
  if (bwd) {
    fill_view(6, {"dq", &p.dq, true});
    fill_view(7, {"dk", &p.dk, true});
    fill_view(8, {"dv", &p.dv, true});
  }
  // The pairs a run compares: each output against every other non-empty tensor, each pair of
  // outputs once.
  n_pairs_ = 0;
  for (std::size_t i = 0; i < n_; ++i) {
    if (!slots_[i].output || slots_[i].empty) continue;
    for (std::size_t j = 0; j < n_; ++j)
      if (j != i && !slots_[j].empty && !(slots_[j].output && j < i))
        pairs_[n_pairs_++] = {std::uint8_t(i), std::uint8_t(j)};
  }
}

Status RunChecks::check(const Problem& run) const {
  const void* ptrs[kMaxSlots];
  slot_pointers(run, ptrs);
  // Each view's bytes [begin, end) as addresses (they fit: checked below).
  std::uint64_t begin[kMaxSlots], end[kMaxSlots];
  for (std::size_t i = 0; i < n_; ++i) {
    const Slot& s = slots_[i];
    if (s.empty) continue;
    const auto addr = reinterpret_cast<std::uintptr_t>(ptrs[i]);
    if (addr == 0)
      return invalid(std::string(s.name) + ": data is null but the plan's " + s.name + " has shape " + shapes_[i] +
                     "; supported: a pointer to the view's element 0");
    if (addr % s.align != 0)
      return invalid(std::string(s.name) + ": data pointer is " + std::to_string(addr % s.align) + " bytes past a " +
                     std::to_string(s.align) + "-byte boundary; this plan assumes " + s.name + " " +
                     std::to_string(s.align) +
                     "-byte aligned (a pointer given at run time is assumed 16-byte aligned, one given when the "
                     "plan is made keeps its own alignment); supported: a plan made with a pointer of this "
                     "alignment");
    const i128 base = static_cast<i128>(addr);
    if (base + s.lo < 0)
      return invalid(std::string(s.name) + ": negative strides reach " + std::to_string(i64(-s.lo)) +
                     " bytes below the data pointer, past address 0; supported: views whose every element lies at a "
                     "valid address");
    if (base + s.hi - 1 > kI64Max)
      return invalid(std::string(s.name) + ": view extent overflows int64 (pointer plus " + std::to_string(i64(s.hi)) +
                     " bytes); supported: views whose last byte fits in int64");
    begin[i] = static_cast<std::uint64_t>(base + s.lo);
    end[i] = static_cast<std::uint64_t>(base + s.hi);
  }
  // Outputs against every other tensor: byte ranges first. (Uninitialised: only the first
  // n_met entries are written and read.)
  struct Met {
    std::size_t pair;
    i128 distance;
  };
  Met met[kMaxSlots * kMaxSlots];
  std::size_t n_met = 0;
  for (std::size_t k = 0; k < n_pairs_; ++k) {
    const std::size_t i = pairs_[k].first, j = pairs_[k].second;
    if (end[i] <= begin[j] || end[j] <= begin[i]) continue;
    met[n_met++] = {k, static_cast<i128>(reinterpret_cast<std::uintptr_t>(ptrs[j])) -
                           static_cast<i128>(reinterpret_cast<std::uintptr_t>(ptrs[i]))};
  }
  if (n_met == 0) return Status::Ok();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (proven_.size() == n_met) {
      bool same = true;
      for (std::size_t k = 0; k < n_met && same; ++k)
        same = proven_[k].first == met[k].pair && proven_[k].second == met[k].distance;
      if (same) return Status::Ok();
    }
  }
  if (Status s = check_overlap(run); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  proven_.clear();
  for (std::size_t k = 0; k < n_met; ++k) proven_.emplace_back(met[k].pair, met[k].distance);
  return Status::Ok();
}

}  // namespace strideattn::detail
