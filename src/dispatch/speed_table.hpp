// The measured speeds `auto` orders `cuda` and `cudnn` by on sm90+ devices: one row per shape
// of the benchmark's full list (bench/compare_sdpa.py), generated into speed_table.inc by
// bench/gen_speed_table.py from a data file in bench/results/. A problem takes the row nearest
// to it (mask class, head dim, length, window, GQA ratio, dtype), and the faster backend of
// that row for its direction goes first (docs/backends.md, "The speed table").
#pragma once

#include <span>
#include <string>

#include "problem/problem.hpp"

namespace strideattn::detail {

struct SpeedRow {
  const char* shape;  // the benchmark's shape name
  DType dtype;
  bool causal;
  std::int64_t window;  // left window with causal, -1 for none
  std::int64_t d, s, heads, kv_heads;
  double fwd_cuda, fwd_cudnn;    // TFLOP/s of the forward
  double both_cuda, both_cudnn;  // TFLOP/s of forward + backward (3.5x the forward's FLOPs)

  // Whether cuda is the faster of the two for the direction (the backward's time is the
  // forward+backward time less the forward's: proportional to 3.5 / both - 1 / fwd).
  [[nodiscard]] bool cuda_faster(Direction dir) const;
  // "<shape> (<mask>): <direction> cuda X vs cudnn Y ..." with the numbers behind the choice.
  [[nodiscard]] std::string describe(Direction dir) const;
};

[[nodiscard]] std::span<const SpeedRow> speed_rows();
// The data file, GPU, commit and cuDNN version of the measurements.
[[nodiscard]] const char* speed_table_source();

// The row nearest to the problem (never null while the table has rows).
[[nodiscard]] const SpeedRow* nearest_speed_row(const Problem& p);

// How far a row is from the problem: 0 for the same class, head dim, length, window, ratio
// and dtype; mask class differences weigh most, then head dim, then length.
[[nodiscard]] double speed_row_distance(const SpeedRow& r, const Problem& p);

}  // namespace strideattn::detail
