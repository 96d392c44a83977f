// bf16 and fp16 patterns: every finite pattern survives float and back, and rounding from
// float is to nearest with ties to even, checked at every midpoint between neighbours.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "emu/numeric_formats.hpp"

namespace ringattn::emu {
namespace {

struct Format {
  const char* name;
  float (*decode)(std::uint16_t);
  std::uint16_t (*encode)(float);
  std::uint16_t inf;
};
const Format kFormats[] = {{"bf16", bf16_to_float, float_to_bf16, 0x7f80},
                           {"fp16", f16_to_float, float_to_f16, 0x7c00}};

TEST(NumericFormats, EveryPatternRoundTrips) {
  for (const Format& f : kFormats) {
    for (std::uint32_t p = 0; p <= 0xffff; ++p) {
      const auto bits = static_cast<std::uint16_t>(p);
      const float x = f.decode(bits);
      if (std::isnan(x)) {
        EXPECT_TRUE(std::isnan(f.decode(f.encode(x)))) << f.name << " " << p;
      } else {
        ASSERT_EQ(f.encode(x), bits) << f.name << " " << p;
      }
    }
  }
}

TEST(NumericFormats, RoundsToNearestTiesToEven) {
  for (const Format& f : kFormats) {
    for (std::uint16_t p = 0; p + 1 < f.inf; ++p) {  // up to the largest finite
      const auto next = static_cast<std::uint16_t>(p + 1);
      const float lo = f.decode(p), hi = f.decode(next);
      const float mid = lo + (hi - lo) / 2;  // exact: one more bit than the format holds
      ASSERT_EQ(f.encode(mid), (p & 1) == 0 ? p : next) << f.name << " tie above " << p;
      ASSERT_EQ(f.encode(std::nextafter(mid, 0.0f)), p) << f.name << " below the tie " << p;
      ASSERT_EQ(f.encode(std::nextafter(mid, INFINITY)), next) << f.name << " above " << p;
      ASSERT_EQ(f.encode(-mid), static_cast<std::uint16_t>(f.encode(mid) | 0x8000u));
    }
  }
}

TEST(NumericFormats, KnownValues) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(float_to_f16(-1e6f), 0xfc00);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x7f7fffffu)), 0x7f80) << "rounds up to inf";
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_EQ(pack_halves(0x1234, 0xabcd), 0xabcd1234u);
  EXPECT_EQ(half_of(0xabcd1234u, 0), 0x1234);
  EXPECT_EQ(half_of(0xabcd1234u, 1), 0xabcd);
}

}  // namespace
}  // namespace ringattn::emu
