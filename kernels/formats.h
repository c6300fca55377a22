// Element formats (docs/numerics.md, "Element formats"): E4M3, E5M2, E3M2, E2M3,
// E2M1, the E8M0 scale format and BF16. This is the CPU reference: it reads like
// the doc and favours clarity over speed. The CUDA kernels have their own fast
// versions (quant_core.h) which are tested against these, bit for bit.
#ifndef KEEL_KERNELS_FORMATS_H_
#define KEEL_KERNELS_FORMATS_H_

#include <cstdint>
#include <string>

#include "kernels/base/numeric_types.h"

namespace keel {

struct ElemSpec {
  const char* name;    // "e4m3", ...
  int bits;            // total bits including sign
  int ebits;           // exponent bits
  int mbits;           // stored mantissa bits
  int bias;            // exponent bias
  int emax;            // exponent of the largest normal (floor(log2(max_normal)))
  float max_normal;    // largest finite magnitude
  float min_normal;    // 2^(1 - bias)
  float min_subnormal; // 2^(1 - bias - mbits)
  bool has_inf;        // E5M2 only
  bool has_nan;        // E4M3 (S.1111.111) and E5M2
};

const ElemSpec& Spec(ElemFormat format);

// ElemFormat and Rounding (with their names) are in kernels/base/numeric_types.h.

// Rounds n >= 0 (a real number expressed in quanta) to an integer-valued float.
// n must be exact (its fraction is exactly representable); u is used only by
// kStochastic and must lie in [0, 1).
float RoundQuanta(float n, Rounding rounding, float u);

// Rounds x to the nearest value of `format` under `rounding`, saturating to
// +-max_normal (rounding happens first, then the clamp; never Inf).
// NaN stays NaN; +-Inf saturates. The sign of zero results follows x.
// Implements docs/numerics.md, "Rounding" (step 5 of "MX block scaling" for the
// element), with the scale already divided out.
float RoundToElem(float x, ElemFormat format, Rounding rounding, float u);

// Bit code of r, which must be a value of `format` (a result of RoundToElem) or
// NaN (E4M3/E5M2 only; other formats have no NaN and get the max code).
uint8_t EncodeElem(float r, ElemFormat format);
// The value of a bit code (only the low `bits` bits are read).
float DecodeElem(uint8_t code, ElemFormat format);

// E8M0 scale: byte = e + 127 for e in [-127, 127]; 0xFF is NaN.
constexpr uint8_t kE8M0Nan = 0xFF;
uint8_t EncodeE8M0(int e);
float DecodeE8M0(uint8_t byte);  // 2^(byte-127), NaN for 0xFF

// BF16: round fp32 to bf16 (nearest_even, nearest_away or stochastic with the
// supplied u). NaN stays a quiet NaN with the sign kept; overflow goes to Inf as
// IEEE rounding says.
uint16_t FloatToBf16(float x, Rounding rounding, float u);
float Bf16ToFloat(uint16_t bits);

// Bit casts.
uint32_t FloatBits(float x);
float BitsFloat(uint32_t bits);

}  // namespace keel

#endif  // KEEL_KERNELS_FORMATS_H_
