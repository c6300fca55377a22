// Tests of SplitMix64: the reference stream (its published first outputs), and
// the ranges and rough uniformity of Uniform01 and Below.
#include "kernels/base/splitmix64.h"

#include <vector>

#include <gtest/gtest.h>

namespace keel {
namespace {

TEST(SplitMix64Test, MatchesTheReferenceStream) {
  // The reference implementation's first three outputs from seed 0 and seed 1.
  SplitMix64 zero(0);
  EXPECT_EQ(zero.Next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(zero.Next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(zero.Next(), 0x06C45D188009454Full);
  SplitMix64 one(1);
  EXPECT_EQ(one.Next(), 0x910A2DEC89025CC1ull);
}

TEST(SplitMix64Test, Uniform01AndBelowStayInRangeAndSpreadEvenly) {
  SplitMix64 rng(42);
  std::vector<int> tenths(10, 0), sevens(7, 0);
  for (int i = 0; i < 70000; ++i) {
    const double u = rng.Uniform01();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ++tenths[static_cast<size_t>(u * 10)];
    const uint64_t b = rng.Below(7);
    ASSERT_LT(b, 7u);
    ++sevens[static_cast<size_t>(b)];
  }
  // 7000 and 10000 expected per bucket; 5 sigma is under 500.
  for (int n : tenths) EXPECT_NEAR(n, 7000, 500);
  for (int n : sevens) EXPECT_NEAR(n, 10000, 500);
  EXPECT_EQ(SplitMix64(5).Below(1), 0u);
}

}  // namespace
}  // namespace keel
