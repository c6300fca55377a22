// For the scheme and run-config tests: a scheme's operand format by role, and
// the operand options of the NVFP4 recipe, which the preset nvfp4_recipe and
// the three nvfp4_* flags on nvfp4 must both give.
#ifndef KEEL_WORKER_CONFIG_SCHEME_TESTING_H_
#define KEEL_WORKER_CONFIG_SCHEME_TESTING_H_

#include <gtest/gtest.h>

#include "worker/config/scheme.h"

namespace keel {

inline const OperandFormat& RoleOf(const PrecisionScheme& s, Role role) {
  return s.roles[static_cast<int>(role)];
}

// 16x16 weight tiles (fwd_w, dgrad_w), the random Hadamard transform on the
// wgrad operands and stochastic rounding of the gradients (dgrad_dy,
// wgrad_dy); the forward activations keep 1x16 blocks, no RHT and
// round-to-nearest-even.
inline void ExpectNvfp4RecipeOptions(const PrecisionScheme& s) {
  EXPECT_TRUE(RoleOf(s, Role::kFwdW).tile_16x16);
  EXPECT_TRUE(RoleOf(s, Role::kDgradW).tile_16x16);
  EXPECT_FALSE(RoleOf(s, Role::kFwdX).tile_16x16);
  EXPECT_TRUE(RoleOf(s, Role::kWgradDy).rht);
  EXPECT_TRUE(RoleOf(s, Role::kWgradX).rht);
  EXPECT_FALSE(RoleOf(s, Role::kFwdX).rht);
  EXPECT_EQ(RoleOf(s, Role::kDgradDy).rounding, Rounding::kStochastic);
  EXPECT_EQ(RoleOf(s, Role::kWgradDy).rounding, Rounding::kStochastic);
  EXPECT_EQ(RoleOf(s, Role::kFwdX).rounding, Rounding::kNearestEven);
}

}  // namespace keel

#endif  // KEEL_WORKER_CONFIG_SCHEME_TESTING_H_
