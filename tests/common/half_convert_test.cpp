// The public fp16/bf16 conversion helpers, over all 65,536 bit patterns of each format,
// against an independent formula: 16-bit -> float from sign * 2^e * (1 + m / 2^k) in double;
// float -> 16-bit round-trips every pattern, rounds each midpoint between neighbours to the
// even one and the floats just beside it to the nearer one, and matches a nearest-value
// search over a sorted table for random floats of every magnitude.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "strideattn/strideattn.hpp"

namespace strideattn {
namespace {

struct Format {
  const char* name;
  int exp_bits, man_bits;  // f16: 5, 10; bf16: 8, 7
  std::uint16_t (*from_float)(float);
  float (*to_float)(std::uint16_t);
};

// The value of a 16-bit pattern by the textbook formula (NaN for NaN patterns).
double formula(const Format& f, std::uint16_t bits) {
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const int e = (bits >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int m = bits & ((1 << f.man_bits) - 1);
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  if (e == (1 << f.exp_bits) - 1) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, 1 - bias - f.man_bits);
  return sign * std::ldexp(1.0 + std::ldexp(m, -f.man_bits), e - bias);
}

const Format kFormats[] = {
    {"f16", 5, 10, [](float x) { return half_from_float(x); }, [](std::uint16_t b) { return float_from_half(b); }},
    {"bf16", 8, 7, [](float x) { return bf16_from_float(x); }, [](std::uint16_t b) { return float_from_bf16(b); }},
};

TEST(HalfConvert, EveryPatternToFloatMatchesTheFormula) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    for (std::uint32_t b = 0; b < 65536; ++b) {
      const auto bits = static_cast<std::uint16_t>(b);
      const double want = formula(f, bits);
      const float got = f.to_float(bits);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << b;
        ASSERT_EQ(std::signbit(got), (b & 0x8000) != 0) << b;
      } else {
        ASSERT_EQ(static_cast<double>(got), want) << b;
        ASSERT_EQ(std::signbit(got), (b & 0x8000) != 0) << b;  // -0 stays -0
      }
    }
  }
}

TEST(HalfConvert, EveryPatternRoundTripsAndNaNStaysNaN) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    for (std::uint32_t b = 0; b < 65536; ++b) {
      const auto bits = static_cast<std::uint16_t>(b);
      const std::uint16_t back = f.from_float(f.to_float(bits));
      if (std::isnan(formula(f, bits))) {
        ASSERT_TRUE(std::isnan(formula(f, back))) << b;
        ASSERT_EQ(back & 0x8000, bits & 0x8000) << b;
      } else {
        ASSERT_EQ(back, bits) << b;
      }
    }
  }
}

// Between each finite pattern and the next larger magnitude (the top one's neighbour is
// infinity, reached by overflow): the midpoint rounds to the even mantissa, one float
// step either side to the nearer value.
TEST(HalfConvert, MidpointsTieToEvenAndNeighboursRoundToNearer) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    const std::uint16_t inf = static_cast<std::uint16_t>(((1u << f.exp_bits) - 1) << f.man_bits);
    for (std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000}}) {
      for (std::uint32_t mag = 0; mag < inf; ++mag) {
        const auto lo = static_cast<std::uint16_t>(sign | mag);
        const auto hi = static_cast<std::uint16_t>(sign | (mag + 1));
        const double a = formula(f, lo);
        // the top finite value's upper neighbour, for rounding, is one step further on
        const double b = mag + 1 == inf ? a + (a - formula(f, static_cast<std::uint16_t>(lo - 1))) : formula(f, hi);
        const float mid = static_cast<float>((a + b) / 2);
        ASSERT_EQ(static_cast<double>(mid), (a + b) / 2) << "midpoint not exact in float";
        const std::uint16_t even = (mag & 1) ? hi : lo;
        ASSERT_EQ(f.from_float(mid), even) << std::hex << lo;
        const float toward_lo = std::nextafter(mid, static_cast<float>(a));
        const float toward_hi = std::nextafter(mid, INFINITY * (sign ? -1.0f : 1.0f));
        ASSERT_EQ(f.from_float(toward_lo), lo) << std::hex << lo;
        ASSERT_EQ(f.from_float(toward_hi), hi) << std::hex << lo;
      }
    }
    EXPECT_EQ(f.from_float(INFINITY), inf);
    EXPECT_EQ(f.from_float(-INFINITY), inf | 0x8000);
    EXPECT_EQ(f.from_float(std::numeric_limits<float>::max()), inf);
  }
}

// Random floats of every magnitude against the nearest value in a sorted table.
TEST(HalfConvert, RandomFloatsMatchANearestValueSearch) {
  std::mt19937 rng(20260);
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    const std::uint16_t inf = static_cast<std::uint16_t>(((1u << f.exp_bits) - 1) << f.man_bits);
    std::vector<double> table;  // non-negative finite values, increasing with the pattern
    for (std::uint32_t b = 0; b < inf; ++b) table.push_back(formula(f, static_cast<std::uint16_t>(b)));
    const double top = table.back(), step = top - table[table.size() - 2];
    for (int i = 0; i < 400000; ++i) {
      const float x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
      if (std::isnan(x)) continue;
      const double ax = std::fabs(static_cast<double>(x));
      std::uint16_t want;
      if (ax >= top + step / 2) {
        want = inf;
      } else if (ax >= top) {
        want = static_cast<std::uint16_t>(inf - 1);
      } else {
        const auto it = std::upper_bound(table.begin(), table.end(), ax);  // table[j] > ax
        const auto j = static_cast<std::uint16_t>(it - table.begin());
        const double below = table[j - 1u], above = table[j];
        if (ax - below < above - ax)
          want = static_cast<std::uint16_t>(j - 1u);
        else if (ax - below > above - ax)
          want = j;
        else
          want = ((j - 1u) & 1u) ? j : static_cast<std::uint16_t>(j - 1u);
      }
      if (std::signbit(x)) want |= 0x8000;
      ASSERT_EQ(f.from_float(x), want) << x;
    }
  }
}

static_assert(half_from_float(1.0f) == 0x3c00 && float_from_half(0xc000) == -2.0f);
static_assert(bf16_from_float(1.0f) == 0x3f80 && float_from_bf16(0xc000) == -2.0f);

}  // namespace
}  // namespace strideattn
