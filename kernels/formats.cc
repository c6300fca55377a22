// CPU reference for the element formats. Written to be read beside
// docs/numerics.md, "Element formats" and "Rounding": every value is computed
// with frexp/ldexp/floor, no bit tricks.
#include "kernels/formats.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace keel {
namespace {

// name, bits, ebits, mbits, bias, emax, max_normal, min_normal, min_subnormal, inf, nan
const ElemSpec kSpecs[] = {
    {"e4m3", 8, 4, 3, 7, 8, 448.0f, 0x1p-6f, 0x1p-9f, false, true},
    {"e5m2", 8, 5, 2, 15, 15, 57344.0f, 0x1p-14f, 0x1p-16f, true, true},
    {"e3m2", 6, 3, 2, 3, 4, 28.0f, 0x1p-2f, 0x1p-4f, false, false},
    {"e2m3", 6, 2, 3, 1, 2, 7.5f, 1.0f, 0x1p-3f, false, false},
    {"e2m1", 4, 2, 1, 1, 2, 6.0f, 1.0f, 0.5f, false, false},
};

// floor(log2(|x|)) for finite x != 0, exactly (frexp gives x = f * 2^k, f in [0.5, 1)).
int ExactExponent(float x) {
  int k = 0;
  std::frexp(x, &k);
  return k - 1;
}

}  // namespace

const ElemSpec& Spec(ElemFormat format) { return kSpecs[static_cast<int>(format)]; }

float RoundQuanta(float n, Rounding rounding, float u) {
  float whole = std::floor(n);
  float fraction = n - whole;  // exact: n and whole share a binade or whole is 0
  switch (rounding) {
    case Rounding::kNearestAway:
      return fraction >= 0.5f ? whole + 1.0f : whole;
    case Rounding::kNearestEven:
      if (fraction > 0.5f) return whole + 1.0f;
      if (fraction < 0.5f) return whole;
      return std::fmod(whole, 2.0f) == 0.0f ? whole : whole + 1.0f;
    case Rounding::kStochastic:
      return u < fraction ? whole + 1.0f : whole;
  }
  return whole;
}

float RoundToElem(float x, ElemFormat format, Rounding rounding, float u) {
  const ElemSpec& spec = Spec(format);
  if (std::isnan(x)) return x;
  if (std::isinf(x)) return std::copysign(spec.max_normal, x);
  float magnitude = std::fabs(x);
  // p = max(floor(log2|x|), 1 - bias): the exponent whose quantum applies here;
  // below the smallest normal the subnormal quantum 2^(1 - bias - mbits) holds.
  int p = 1 - spec.bias;
  if (magnitude != 0.0f && ExactExponent(magnitude) > p) p = ExactExponent(magnitude);
  int quantum_exp = p - spec.mbits;
  float quanta = std::ldexp(magnitude, -quantum_exp);  // exact: a power-of-two scaling
  float rounded = std::ldexp(RoundQuanta(quanta, rounding, u), quantum_exp);
  if (rounded > spec.max_normal) rounded = spec.max_normal;  // round first, then clamp
  return std::copysign(rounded, x);
}

uint8_t EncodeElem(float r, ElemFormat format) {
  const ElemSpec& spec = Spec(format);
  uint8_t sign = std::signbit(r) ? static_cast<uint8_t>(1u << (spec.bits - 1)) : 0;
  if (std::isnan(r)) {
    // E4M3: S.1111.111; E5M2: S.11111.10 (a quiet NaN). Others have no NaN:
    // give the largest magnitude, as saturating conversions do.
    if (format == ElemFormat::kE4M3) return sign | 0x7F;
    if (format == ElemFormat::kE5M2) return sign | 0x7E;
    return sign | static_cast<uint8_t>((1u << (spec.bits - 1)) - 1);
  }
  float magnitude = std::fabs(r);
  if (std::isinf(r)) {
    if (spec.has_inf) return sign | 0x7C;
    magnitude = spec.max_normal;
  }
  if (magnitude == 0.0f) return sign;
  int exponent = ExactExponent(magnitude);
  int field, mantissa;
  if (exponent < 1 - spec.bias) {  // subnormal: value = mantissa * min_subnormal
    field = 0;
    mantissa = static_cast<int>(magnitude / spec.min_subnormal);
  } else {
    field = exponent + spec.bias;
    float significand = std::ldexp(magnitude, -exponent);  // in [1, 2)
    mantissa = static_cast<int>((significand - 1.0f) * static_cast<float>(1 << spec.mbits));
  }
  return sign | static_cast<uint8_t>((field << spec.mbits) | mantissa);
}

float DecodeElem(uint8_t code, ElemFormat format) {
  const ElemSpec& spec = Spec(format);
  code &= static_cast<uint8_t>((1u << spec.bits) - 1);
  bool negative = (code >> (spec.bits - 1)) & 1;
  int field = (code >> spec.mbits) & ((1 << spec.ebits) - 1);
  int mantissa = code & ((1 << spec.mbits) - 1);
  float magnitude;
  if (format == ElemFormat::kE4M3 && field == 15 && mantissa == 7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (format == ElemFormat::kE5M2 && field == 31) {
    magnitude = mantissa == 0 ? std::numeric_limits<float>::infinity()
                              : std::numeric_limits<float>::quiet_NaN();
  } else if (field == 0) {
    magnitude = static_cast<float>(mantissa) * spec.min_subnormal;
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / static_cast<float>(1 << spec.mbits),
                           field - spec.bias);
  }
  return negative ? -magnitude : magnitude;
}

uint8_t EncodeE8M0(int e) {
  if (e < -127 || e > 127) return kE8M0Nan;
  return static_cast<uint8_t>(e + 127);
}

float DecodeE8M0(uint8_t byte) {
  if (byte == kE8M0Nan) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(byte) - 127);
}

uint32_t FloatBits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

float BitsFloat(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

uint16_t FloatToBf16(float x, Rounding rounding, float u) {
  uint32_t bits = FloatBits(x);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // keep it quiet
  // BF16 keeps the top 16 bits; the low 16 are the fraction of one bf16 ulp.
  uint32_t upper = bits >> 16;
  uint32_t lower = bits & 0xFFFF;
  float fraction = static_cast<float>(lower) / 65536.0f;  // exact: 16 bits
  float whole = static_cast<float>(upper & 1);            // parity is all RoundQuanta needs
  bool up = RoundQuanta(whole + fraction, rounding, u) > whole;
  // Carrying into the exponent field is right: it moves to the next binade or to Inf.
  return static_cast<uint16_t>(upper + (up ? 1 : 0));
}

float Bf16ToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

}  // namespace keel
