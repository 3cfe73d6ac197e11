// The measured speed table (speed_table.hpp): the generated rows and the nearest-row rule.
#include "dispatch/speed_table.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace strideattn::detail {

namespace {

#include "dispatch/speed_table.inc"

double log2_ratio(double a, double b) { return std::fabs(std::log2(std::max(a, 1.0) / std::max(b, 1.0))); }

// The backward's time relative to the forward's FLOPs, from the two measured rates.
double backward_cost(double fwd, double both) { return 3.5 / both - 1.0 / fwd; }

}  // namespace

bool SpeedRow::cuda_faster(Direction dir) const {
  if (dir == Direction::forward) return fwd_cuda > fwd_cudnn;
  return backward_cost(fwd_cuda, both_cuda) < backward_cost(fwd_cudnn, both_cudnn);
}

std::string SpeedRow::describe(Direction dir) const {
  char buf[256];
  const std::string mask = window >= 0 ? "causal, window " + std::to_string(window) : causal ? "causal" : "no mask";
  if (dir == Direction::forward) {
    std::snprintf(buf, sizeof buf, "forward cuda %.0f vs cudnn %.0f TFLOP/s", fwd_cuda, fwd_cudnn);
  } else {
    // backward alone, from forward+backward less forward, in the forward's TFLOP/s units
    std::snprintf(buf, sizeof buf, "backward cuda %.0f vs cudnn %.0f TFLOP/s (2.5x forward FLOPs)",
                  2.5 / backward_cost(fwd_cuda, both_cuda), 2.5 / backward_cost(fwd_cudnn, both_cudnn));
  }
  return std::string(shape) + " (" + mask + ", d " + std::to_string(d) + ", s " + std::to_string(s) + ", h " +
         std::to_string(heads) + "/" + std::to_string(kv_heads) + "): " + buf;
}

std::span<const SpeedRow> speed_rows() { return kSpeedRows; }
const char* speed_table_source() { return kSpeedTableSource; }

double speed_row_distance(const SpeedRow& r, const Problem& p) {
  const bool windowed = p.window.left >= 0 || p.window.right >= 0;
  const bool causal = p.mask != MaskKind::none;
  double dist = 0;
  if (windowed != (r.window >= 0)) dist += 8;
  if (!windowed && r.window < 0 && causal != r.causal) dist += 4;
  if (windowed && r.window >= 0) {
    // the visible span decides the work: compare window widths (an open side spans the keys)
    const double left = p.window.left >= 0 ? double(p.window.left) : double(p.s_kv);
    const double right = p.window.right >= 0 ? double(p.window.right) : (causal ? 0.0 : double(p.s_kv));
    dist += log2_ratio(left + right + 1, double(r.window) + 1);
  }
  dist += 2 * log2_ratio(double(std::max(p.d_qk, p.d_v)), double(r.d));
  dist += log2_ratio(double(std::max(p.s_q, p.s_kv)), double(r.s));
  const double group = p.kv_heads > 0 ? double(p.heads) / double(p.kv_heads) : 1.0;
  dist += 0.5 * log2_ratio(group, double(r.heads) / double(r.kv_heads));
  if (p.dtype != r.dtype) dist += 0.25;
  return dist;
}

const SpeedRow* nearest_speed_row(const Problem& p) {
  const SpeedRow* best = nullptr;
  double best_dist = 0;
  for (const SpeedRow& r : speed_rows()) {
    const double d = speed_row_distance(r, p);
    if (!best || d < best_dist) best = &r, best_dist = d;
  }
  return best;
}

}  // namespace strideattn::detail
