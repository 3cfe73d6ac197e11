// The roundings of the cuda backward's P (src/backends/cuda/common/lse.hpp), plain C++ on
// the host with the kernels' own functions: for random row maxes from 1e-3 to 1e30 and scales
// that are powers of two and that are not (1 / sqrt(128), 1 / sqrt(40), ...), a one-hot row's
// stored LSE is exactly its rounded max score and the backward's P of the max is exactly 1;
// P never exceeds 1 for a key below the max; and on rows with l > 1, P of the max is 1 / l to
// the LSE's half ulp (docs/semantics.md, "Backward").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "backends/cuda/common/lse.hpp"

namespace {

using strideattn::cuda_impl::lse_of_row;
using strideattn::cuda_impl::p_exponent_log2;

const double kScales[] = {1.0,
                          0.125,
                          0.0625,
                          1 / std::sqrt(128.0),
                          1 / std::sqrt(40.0),
                          1 / std::sqrt(96.0),
                          1 / std::sqrt(192.0),
                          1 / std::sqrt(8.0),
                          1e-3,
                          3.7};

// A raw score whose scaled value lies near `logits` in magnitude, of either sign.
float draw_score(std::mt19937_64& rng, double logits, double scale) {
  std::uniform_real_distribution<double> u(0.5, 1.0);
  const double s = u(rng) * logits / scale;
  return static_cast<float>(rng() & 1 ? s : -s);
}

TEST(CudaLse, OneHotRowsGetPOfExactlyOneAtAnyMagnitudeAndScale) {
  std::mt19937_64 rng(20240611);
  for (double scale_d : kScales) {
    const auto scale = static_cast<float>(scale_d);
    for (double logits : {1e-3, 1.0, 1e3, 1e5, 1e7, 1e12, 1e20, 1e30}) {
      int wrong = 0;
      float first = 0.f;
      for (int i = 0; i < 20000; ++i) {
        const float m = draw_score(rng, logits, scale);
        const float lse = lse_of_row(m, 0.f, scale);  // l = 1: log2 l = 0
        // the stored LSE is round(m scale), one rounding of the exact product
        ASSERT_EQ(lse, static_cast<float>(double(m) * double(scale))) << "m " << m << " scale " << scale;
        if (p_exponent_log2(m, lse, scale) != 0.f && wrong++ == 0) first = m;
      }
      EXPECT_EQ(wrong, 0) << "scale " << scale << " logits " << logits << ": P of the max != 1 on " << wrong
                          << " of 20000 one-hot rows, first m = " << first;
    }
  }
}

TEST(CudaLse, PNeverExceedsOneBelowTheMax) {
  std::mt19937_64 rng(7);
  for (double scale_d : kScales) {
    const auto scale = static_cast<float>(scale_d);
    for (double logits : {1.0, 1e4, 1e20}) {
      for (int i = 0; i < 20000; ++i) {
        const float m = draw_score(rng, logits, scale);
        const float s = std::nextafter(m, -INFINITY) - (rng() & 1 ? 0.f : std::fabs(m) * 1e-6f);
        const float lse = lse_of_row(m, 0.f, scale);
        ASSERT_LE(p_exponent_log2(s, lse, scale), 0.f) << "s " << s << " m " << m << " scale " << scale;
      }
    }
  }
}

TEST(CudaLse, RowsWithSeveralKeysGetOneOverLToTheLsesHalfUlp) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> ul(1.0, 64.0);
  for (double scale_d : kScales) {
    const auto scale = static_cast<float>(scale_d);
    for (double logits : {1.0, 1e3, 1e6}) {
      for (int i = 0; i < 5000; ++i) {
        const float m = draw_score(rng, logits, scale);
        const auto l = static_cast<float>(ul(rng));
        const float lse = lse_of_row(m, std::log2(l), scale);
        const double p = std::exp2(double(p_exponent_log2(m, lse, scale)));
        // |log(P l)|: the LSE's rounding (half an ulp), that of log l and of the exponent
        const double half_ulp = 0.5 * (std::nextafter(std::fabs(lse), INFINITY) - std::fabs(lse));
        const double bound = half_ulp + 8 * 0x1p-24 * std::log(double(l)) + 4 * 0x1p-24;
        ASSERT_LE(std::fabs(std::log(p * l)), bound) << "m " << m << " l " << l << " scale " << scale;
      }
    }
  }
}

}  // namespace
