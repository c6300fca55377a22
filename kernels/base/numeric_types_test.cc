#include "kernels/base/numeric_types.h"

#include <set>

#include <gtest/gtest.h>

namespace keel {
namespace {

const QuantFormat kAllFormats[] = {
    QuantFormat::kMxfp8E4M3, QuantFormat::kMxfp8E5M2, QuantFormat::kMxfp6E3M2,
    QuantFormat::kMxfp6E2M3, QuantFormat::kMxfp4,     QuantFormat::kNvfp4,
    QuantFormat::kFp8E4M3,   QuantFormat::kFp8E5M2,   QuantFormat::kBf16,
};

TEST(NumericTypesTest, EveryQuantFormatNameParsesBackToItself) {
  for (QuantFormat format : kAllFormats) {
    QuantFormat parsed = QuantFormat::kBf16;
    ASSERT_TRUE(ParseQuantFormat(QuantFormatName(format), &parsed)) << QuantFormatName(format);
    EXPECT_EQ(parsed, format);
    EXPECT_NE(QuantFormatNames().find(QuantFormatName(format)), std::string::npos);
  }
  QuantFormat untouched = QuantFormat::kMxfp4;
  EXPECT_FALSE(ParseQuantFormat("mxfp8", &untouched));
  EXPECT_EQ(untouched, QuantFormat::kMxfp4);
}

TEST(NumericTypesTest, MxFormatsAndElements) {
  EXPECT_TRUE(IsMx(QuantFormat::kMxfp6E2M3));
  EXPECT_FALSE(IsMx(QuantFormat::kNvfp4));
  EXPECT_FALSE(IsMx(QuantFormat::kFp8E4M3));
  EXPECT_EQ(ElementOf(QuantFormat::kNvfp4), ElemFormat::kE2M1);
  EXPECT_EQ(ElementOf(QuantFormat::kFp8E5M2), ElemFormat::kE5M2);
  EXPECT_EQ(ElementOf(QuantFormat::kMxfp6E3M2), ElemFormat::kE3M2);
}

TEST(NumericTypesTest, RoundingNamesRoundTrip) {
  for (Rounding r : {Rounding::kNearestEven, Rounding::kNearestAway, Rounding::kStochastic}) {
    Rounding parsed = Rounding::kNearestEven;
    ASSERT_TRUE(ParseRounding(RoundingName(r), &parsed));
    EXPECT_EQ(parsed, r);
  }
  Rounding parsed = Rounding::kStochastic;
  EXPECT_FALSE(ParseRounding("nearest", &parsed));
  EXPECT_EQ(RoundingNames(), (std::vector<std::string>{"nearest_even", "nearest_away", "stochastic"}));
}

TEST(NumericTypesTest, RoleNamesAndSeedsAreDistinct) {
  std::set<std::string> names;
  std::set<uint64_t> seeds;
  for (int r = 0; r < kRoleCount; ++r) {
    names.insert(RoleName(static_cast<Role>(r)));
    seeds.insert(RoleSeed(42, static_cast<Role>(r)));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kRoleCount));
  EXPECT_EQ(seeds.size(), static_cast<size_t>(kRoleCount));
  EXPECT_STREQ(RoleName(Role::kDgradDy), "dgrad_dy");
  EXPECT_EQ(RoleSeed(42, Role::kFwdX), RoleSeed(42, Role::kFwdX));
  EXPECT_NE(RoleSeed(42, Role::kFwdX), RoleSeed(43, Role::kFwdX));
}

}  // namespace
}  // namespace keel
