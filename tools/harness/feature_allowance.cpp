// dBias's summation allowance (feature_allowance.hpp).
#include "harness/feature_allowance.hpp"

#include <cmath>
#include <cstdint>

namespace strideattn::harness::internal {

std::vector<double> dbias_allowance(const detail::Problem& backward, detail::RefBackwardInputs inputs) {
  if (!backward.dbias_on || !backward.bias_on()) return {};
  const auto& shape = backward.bias.shape;
  const std::int64_t full[4] = {backward.batch, backward.heads, backward.s_q, backward.s_kv};
  detail::Problem wide = backward;
  bool broadcast = false;
  double per_pair = 1;
  for (int d = 0; d < 4; ++d) {
    if (shape[std::size_t(d)] == 1 && full[d] > 1) {
      broadcast = true;
      wide.bias.shape[std::size_t(d)] = full[d];
      wide.bias.stride[std::size_t(d)] = 0;  // the same element along the dimension
    }
    per_pair *= double(wide.bias.shape[std::size_t(d)]);
  }
  if (!broadcast || per_pair > double(std::int64_t(1) << 26)) return {};
  wide.dbias.shape = wide.bias.shape;
  const std::vector<double> terms = detail::reference_compute(wide, detail::RefPrecision::exact, inputs).dbias;
  const std::size_t n_out = std::size_t(shape[0] * shape[1] * shape[2] * shape[3]);
  std::vector<double> sum(n_out, 0.0), sum_sq(n_out, 0.0), count(n_out, 0.0);
  const auto& ws = wide.bias.shape;
  std::size_t at = 0;
  for (std::int64_t b = 0; b < ws[0]; ++b)
    for (std::int64_t h = 0; h < ws[1]; ++h)
      for (std::int64_t i = 0; i < ws[2]; ++i)
        for (std::int64_t j = 0; j < ws[3]; ++j, ++at) {
          const std::int64_t e =
              (((shape[0] == 1 ? 0 : b) * shape[1] + (shape[1] == 1 ? 0 : h)) * shape[2] + (shape[2] == 1 ? 0 : i)) *
                  shape[3] +
              (shape[3] == 1 ? 0 : j);
          sum[std::size_t(e)] += terms[at];
          sum_sq[std::size_t(e)] += terms[at] * terms[at];
          count[std::size_t(e)] += 1;
        }
  constexpr double w = 0x1p-23;
  const double per_term = std::sqrt(double(backward.d_qk + backward.d_v + 16));
  for (std::size_t e = 0; e < n_out; ++e) {
    const double l2 = std::sqrt(sum_sq[e]);
    sum[e] = 8 * w * (std::sqrt(count[e]) * (l2 + std::fabs(sum[e])) + per_term * l2);
  }
  return sum;
}

}  // namespace strideattn::harness::internal
