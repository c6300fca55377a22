// Quantizers for MX block scaling and NVFP4 plus the per-tensor FP8 and BF16
// roundings that precision schemes mix in (docs/numerics.md, "MX block scaling",
// "NVFP4", "Per-tensor FP8" and "BF16"). The functions here are the CPU
// reference; quantize_cuda.h has the CUDA kernels, which must agree with these
// bit for bit in every mode (stochastic rounding included, for the same seed).
//
// Layout conventions shared by both implementations:
//   - x is row-major, rows x cols, float32.
//   - axis 1: blocks of consecutive elements within a row; axis 0: blocks
//     running down a column.
//   - codes: one element code per byte, row-major like x (pack with PackCodes).
//   - MX scales: E8M0 bytes, rows x ceil(cols/block) for axis 1 and
//     ceil(rows/block) x cols for axis 0, row-major.
//   - NVFP4 scales: E4M3 bytes, one per 16-element block, same layout rule as
//     MX with block 16 (a 16x16 tile repeats its scale in each of its 16 blocks).
//   - An exact zero input (+0 or -0) quantizes to +0 in MX and NVFP4, as in both
//     references; a nonzero value that rounds to zero keeps its sign (-0).
//   - Stochastic rounding draws element i's uniform from Philox4x32-10 keyed by
//     the seed, counter i (i = row * cols + col, the row-major index in x).
#ifndef KEEL_KERNELS_QUANTIZE_H_
#define KEEL_KERNELS_QUANTIZE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/base/numeric_types.h"
#include "kernels/formats.h"
#include "kernels/base/status.h"

namespace keel {

// QuantFormat and its names are in kernels/base/numeric_types.h.

struct MxOptions {
  ElemFormat elem = ElemFormat::kE4M3;
  int block = 32;                       // elements per block, >= 1
  int axis = 1;                         // 1: along rows, 0: down columns
  Rounding rounding = Rounding::kNearestEven;
  uint64_t seed = 0;                    // stochastic rounding only
  bool bump_exponent = false;           // the paper's fix (docs/numerics.md, "MX block scaling")
};

struct Nvfp4Options {
  bool tile_16x16 = false;              // one amax per 16x16 tile (weights)
  bool rht = false;                     // random Hadamard transform first
  int axis = 1;
  Rounding rounding = Rounding::kNearestEven;  // or kStochastic; nothing else
  uint64_t seed = 0;
};

// The options an operand format (numeric_types.h) asks for when its role quantizes
// along `axis` with `seed`: for an MX format, and for NVFP4.
MxOptions MxOptionsOf(const OperandFormat& format, int axis, uint64_t seed);
Nvfp4Options Nvfp4OptionsOf(const OperandFormat& format, int axis, uint64_t seed);

// Number of scale bytes the layout rules above give.
int64_t MxScaleCount(int64_t rows, int64_t cols, int block, int axis);

// Checks shape and options; the message names the field, value and what is
// allowed. Every quantizer (CPU and CUDA) calls these first.
Status ValidateMx(int64_t rows, int64_t cols, const MxOptions& options);
Status ValidateNvfp4(int64_t rows, int64_t cols, const Nvfp4Options& options);

// MX block quantization. out (rows*cols floats) receives the dequantized
// values; codes (rows*cols) and scales (MxScaleCount) may be null.
Status MxQuantizeRef(const float* x, int64_t rows, int64_t cols, const MxOptions& options,
                     float* out, uint8_t* codes, uint8_t* scales);

// NVFP4. out: dequantized (in the rotated domain when options.rht); codes: E2M1
// codes; scales: E4M3 block scales (MxScaleCount(rows, cols, 16, axis));
// s_dec: the per-tensor decode scale. Any output pointer may be null.
Status Nvfp4QuantizeRef(const float* x, int64_t rows, int64_t cols, const Nvfp4Options& options,
                        float* out, uint8_t* codes, uint8_t* scales, float* s_dec);

// The 16-point random Hadamard transform (docs/numerics.md, "Random Hadamard transform")
// applied to each 16-element chunk along `axis` (cols or rows must be a multiple of 16):
// y_j = sum_{i=0..15} x_i * s_i * H16[i][j] / 4, summed in fp32 in index order.
void RhtRef(const float* x, int64_t rows, int64_t cols, int axis, float* y);

// Per-tensor FP8: scale = max_normal / amax (1 when amax is 0 or not finite,
// FLT_MAX when the quotient overflows); code = round(x * scale) saturating;
// dequantized = decode(code) * (1 / scale). scale may be null.
Status Fp8TensorQuantizeRef(const float* x, int64_t count, ElemFormat elem, Rounding rounding,
                            uint64_t seed, float* out, uint8_t* codes, float* scale);

// BF16 rounding of every element. bits may be null.
Status Bf16QuantizeRef(const float* x, int64_t count, Rounding rounding, uint64_t seed,
                       float* out, uint16_t* bits);

// Packs one-code-per-byte element codes: 8-bit formats one per byte, FP6 one per
// byte (low 6 bits), FP4 two per byte (element 2i in the low nibble, 2i+1 in the
// high nibble; an odd count leaves the last high nibble zero).
std::vector<uint8_t> PackCodes(const uint8_t* codes, int64_t count, ElemFormat elem);

}  // namespace keel

#endif  // KEEL_KERNELS_QUANTIZE_H_
