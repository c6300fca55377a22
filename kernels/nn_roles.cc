// Role names and per-role seeds of nn.h.
#include "kernels/nn.h"

namespace keel {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kFwdX: return "fwd_x";
    case Role::kFwdW: return "fwd_w";
    case Role::kDgradDy: return "dgrad_dy";
    case Role::kDgradW: return "dgrad_w";
    case Role::kWgradDy: return "wgrad_dy";
    case Role::kWgradX: return "wgrad_x";
  }
  return "?";
}

uint64_t RoleSeed(uint64_t seed, Role role) {
  // splitmix64 finaliser over (seed, role): distinct roles get unrelated streams.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(role) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace keel
