// One entry point for every quantization format, on either backend. keel-quant,
// the tests and the benchmarks call this; the trainer calls the lower-level
// functions in quantize.h / quantize_cuda.h directly.
//
// Packed output (the --packed-out file of keel-quant) is the concatenation of
//   1. element codes, row-major, packed as PackCodes says (BF16: 2 bytes each,
//      little-endian);
//   2. block scales (MX: E8M0 bytes; NVFP4: E4M3 bytes) in the layout of
//      quantize.h; none for per-tensor FP8 and BF16;
//   3. the per-tensor decode scale as a little-endian float32 (NVFP4: S_dec;
//      per-tensor FP8: 1/scale); none for MX and BF16.
#ifndef KEEL_KERNELS_QUANTIZER_H_
#define KEEL_KERNELS_QUANTIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/quantize.h"
#include "kernels/base/status.h"

namespace keel {

struct QuantRequest {
  QuantFormat format = QuantFormat::kMxfp8E4M3;
  int64_t rows = 0;
  int64_t cols = 0;
  int axis = 1;
  int block = 32;                              // MX only
  Rounding rounding = Rounding::kNearestEven;  // nvfp4: nearest_even or stochastic
  uint64_t seed = 0;
  bool tile_16x16 = false;                     // nvfp4 only
  bool rht = false;                            // nvfp4 only
};

struct QuantResult {
  std::vector<float> out;             // dequantized, rows * cols
  std::vector<uint8_t> packed_codes;  // part 1 of the packed layout
  std::vector<uint8_t> scales;        // part 2
  bool has_tensor_scale = false;
  float tensor_scale = 0.0f;          // part 3

  // The packed file's bytes: codes, scales, then the tensor scale if any.
  std::vector<uint8_t> PackedFile() const;
};

// The lower-level options a request stands for (MX formats and nvfp4 only).
MxOptions MxOptionsOf(const QuantRequest& request);
Nvfp4Options Nvfp4OptionsOf(const QuantRequest& request);

// Checks every field of the request against the format (block only for MX,
// tile and RHT only for nvfp4, shapes the tile divides, ...).
Status ValidateRequest(const QuantRequest& request);

// CPU reference.
Status QuantizeCpu(const QuantRequest& request, const float* x, QuantResult* result);

// CUDA: copies x to the GPU, quantizes there and copies the results back. Fails
// with a clear message when built without CUDA or when no GPU is visible.
Status QuantizeCuda(const QuantRequest& request, const float* x, QuantResult* result);

}  // namespace keel

#endif  // KEEL_KERNELS_QUANTIZER_H_
