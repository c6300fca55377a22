// Names of the numeric formats, operand roles and the per-role seed.
#include "kernels/base/numeric_types.h"

namespace keel {
namespace {

struct FormatName {
  QuantFormat format;
  const char* name;
};

const FormatName kFormatNames[] = {
    {QuantFormat::kMxfp8E4M3, "mxfp8_e4m3"}, {QuantFormat::kMxfp8E5M2, "mxfp8_e5m2"},
    {QuantFormat::kMxfp6E3M2, "mxfp6_e3m2"}, {QuantFormat::kMxfp6E2M3, "mxfp6_e2m3"},
    {QuantFormat::kMxfp4, "mxfp4"},          {QuantFormat::kNvfp4, "nvfp4"},
    {QuantFormat::kFp8E4M3, "fp8_e4m3"},     {QuantFormat::kFp8E5M2, "fp8_e5m2"},
    {QuantFormat::kBf16, "bf16"},
};

}  // namespace

namespace {
constexpr Rounding kRoundings[] = {Rounding::kNearestEven, Rounding::kNearestAway, Rounding::kStochastic};
}  // namespace

bool ParseRounding(const std::string& text, Rounding* out) {
  for (Rounding rounding : kRoundings) {
    if (text == RoundingName(rounding)) {
      *out = rounding;
      return true;
    }
  }
  return false;
}

const char* RoundingName(Rounding rounding) {
  switch (rounding) {
    case Rounding::kNearestEven: return "nearest_even";
    case Rounding::kNearestAway: return "nearest_away";
    case Rounding::kStochastic: return "stochastic";
  }
  return "?";
}

std::vector<std::string> RoundingNames() {
  std::vector<std::string> names;
  for (Rounding rounding : kRoundings) names.push_back(RoundingName(rounding));
  return names;
}

bool ParseQuantFormat(const std::string& text, QuantFormat* out) {
  for (const FormatName& entry : kFormatNames) {
    if (text == entry.name) {
      *out = entry.format;
      return true;
    }
  }
  return false;
}

const char* QuantFormatName(QuantFormat format) {
  for (const FormatName& entry : kFormatNames) {
    if (entry.format == format) return entry.name;
  }
  return "?";
}

std::string QuantFormatNames() {
  std::string names;
  for (const FormatName& entry : kFormatNames) {
    if (!names.empty()) names += ", ";
    names += entry.name;
  }
  return names;
}

bool IsMx(QuantFormat format) {
  return format == QuantFormat::kMxfp8E4M3 || format == QuantFormat::kMxfp8E5M2 ||
         format == QuantFormat::kMxfp6E3M2 || format == QuantFormat::kMxfp6E2M3 ||
         format == QuantFormat::kMxfp4;
}

ElemFormat ElementOf(QuantFormat format) {
  switch (format) {
    case QuantFormat::kMxfp8E4M3: case QuantFormat::kFp8E4M3: return ElemFormat::kE4M3;
    case QuantFormat::kMxfp8E5M2: case QuantFormat::kFp8E5M2: return ElemFormat::kE5M2;
    case QuantFormat::kMxfp6E3M2: return ElemFormat::kE3M2;
    case QuantFormat::kMxfp6E2M3: return ElemFormat::kE2M3;
    case QuantFormat::kMxfp4: case QuantFormat::kNvfp4: return ElemFormat::kE2M1;
    case QuantFormat::kBf16: break;
  }
  return ElemFormat::kE4M3;  // BF16 has no element format; callers check first
}

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
