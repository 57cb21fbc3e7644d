#include "core/dtype.h"

#include <cmath>

#include "gtest/gtest.h"

namespace lair {
namespace {

TEST(DTypeTest, BF16RoundTripsRepresentableValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 0.15625f, 65536.0f}) {
    EXPECT_EQ(BF16ToFloat(FloatToBF16(v)), v);
  }
}

TEST(DTypeTest, BF16RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to even (1).
  EXPECT_EQ(BF16ToFloat(FloatToBF16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(BF16ToFloat(FloatToBF16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
}

TEST(DTypeTest, F16RoundTripsNormalAndSubnormal) {
  for (float v : {0.0f, 1.0f, -3.140625f, 65504.0f, std::ldexp(1.0f, -24), std::ldexp(3.0f, -20)}) {
    EXPECT_EQ(F16ToFloat(FloatToF16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(F16ToFloat(FloatToF16(1e6f))));
}

}  // namespace
}  // namespace lair
