// CUDA quantizers on device pointers: MX block scaling, NVFP4, per-tensor FP8 and
// BF16 rounding, bit-identical to the CPU reference in quantize.h (every rounding
// mode, stochastic rounding included for the same seed). The trainer calls these
// directly on its activations, weights and gradients; QuantizeCuda (quantizer.h)
// wraps them for host arrays.
//
// Contract shared by every function here:
//   - x, and every output, are device pointers aligned to 16 bytes (cudaMalloc's
//     are); x is row-major rows x cols (count elements for the elementwise ones)
//     of `x_dtype`. A bf16 input quantizes exactly like its float32 value.
//   - Work is queued on `stream` (a cudaStream_t; nullptr is the legacy default
//     stream) and the call returns without waiting; the outputs are ready when
//     the stream reaches this point. Any temporary memory comes from the stream's
//     memory pool (cudaMallocAsync) and is freed in stream order.
//   - Output layouts are those of quantize.h / quantizer.h (see DeviceOutputs).
//   - A failed check or CUDA call returns a Status naming it (with file and line
//     for CUDA errors); nothing throws. Built without CUDA, every function
//     returns an error saying so.
#ifndef KEEL_KERNELS_QUANTIZE_CUDA_H_
#define KEEL_KERNELS_QUANTIZE_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/formats.h"
#include "kernels/quantize.h"
#include "kernels/base/status.h"

namespace keel {

// Element type of a tensor in device memory.
enum class DType { kF32, kBF16 };

// Where a quantizer writes. Every pointer may be null: that output is skipped.
struct DeviceOutputs {
  // Dequantized values, rows x cols of out_dtype. For bf16 this is the float32
  // dequantized value rounded to nearest-even bf16, FloatToBf16's bits except
  // that a NaN is the canonical NaN (exact for MX values unless they fall below
  // bf16's subnormal range; NVFP4 and FP8 values include the per-tensor decode
  // scale and so are rounded in general).
  void* out = nullptr;
  DType out_dtype = DType::kF32;
  // Element codes packed as PackCodes says: FP4 two per byte (element 2i in the
  // low nibble), FP6 and FP8 one per byte; BF16: two bytes per element,
  // little-endian.
  uint8_t* codes = nullptr;
  // Block scales: MX E8M0 bytes, NVFP4 E4M3 bytes, in the quantize.h layout
  // (MxScaleCount(rows, cols, block, axis) bytes; NVFP4 block 16). None for FP8
  // and BF16.
  uint8_t* scales = nullptr;
  // One float: NVFP4's S_dec, or per-tensor FP8's decode scale 1 / scale.
  float* tensor_scale = nullptr;
  // NVFP4 and per-tensor FP8 only: `out` leaves the per-tensor decode scale out
  // (NVFP4: q * block scale; FP8: the code's value), which is exact in bf16, so a
  // GEMM on bf16 operands sees the exact operands and takes the decode scales in
  // its alpha (docs/numerics.md, "Emulation on Hopper and CPU"). Codes, scales and
  // tensor_scale are the same either way; MX and BF16 ignore it.
  bool out_without_tensor_scale = false;
  // When not null, two device counters the quantizer adds the trainer's
  // operand statistics of this call to (nn.h OperandStats), in the same pass:
  // MX: [0] += saturated elements (qcore::MxSaturated), [1] += NaN blocks;
  // NVFP4: the same with qcore::Nvfp4Saturated and 1x16 NaN blocks (16x16 tiles
  // count their 1x16 rows); BF16: [1] += non-finite inputs. FP8 ignores it.
  unsigned long long* counts = nullptr;
};

// MX block quantization (docs/numerics.md, "MX block scaling"), one pass.
Status MxQuantizeCuda(const void* x, DType x_dtype, int64_t rows, int64_t cols,
                      const MxOptions& options, const DeviceOutputs& outputs, void* stream);

// NVFP4 tensor amax: max |y| over the tensor (y = the RHT of x when options.rht,
// else x), NaN-propagating, written to *amax (a device float).
Status Nvfp4AmaxCuda(const void* x, DType x_dtype, int64_t rows, int64_t cols,
                     const Nvfp4Options& options, float* amax, void* stream);

// NVFP4 quantization (docs/numerics.md, "NVFP4") from the tensor amax in *amax (a
// device float, e.g. from Nvfp4AmaxCuda or from an earlier step), so training can
// skip the amax pass. With amax == nullptr the amax pass runs first (two passes
// over x). outputs.tensor_scale receives S_dec; it must not be the amax float
// (other blocks still read the amax while S_dec is written).
Status Nvfp4QuantizeCuda(const void* x, DType x_dtype, int64_t rows, int64_t cols,
                         const Nvfp4Options& options, const float* amax,
                         const DeviceOutputs& outputs, void* stream);

// Per-tensor FP8 amax: max |x| over `count` elements ignoring NaN, to *amax.
Status Fp8TensorAmaxCuda(const void* x, DType x_dtype, int64_t count, float* amax, void* stream);

// Per-tensor FP8 (elem E4M3 or E5M2) from the amax in *amax, or with the amax pass
// first when amax == nullptr. outputs.tensor_scale receives 1 / scale (not aliasing
// *amax); outputs.scales must be null.
Status Fp8TensorQuantizeCuda(const void* x, DType x_dtype, int64_t count, ElemFormat elem,
                             Rounding rounding, uint64_t seed, const float* amax,
                             const DeviceOutputs& outputs, void* stream);

// BF16 rounding of `count` elements. outputs.codes gets the bf16 bits (2 bytes
// each); outputs.scales and outputs.tensor_scale must be null.
Status Bf16QuantizeCuda(const void* x, DType x_dtype, int64_t count, Rounding rounding,
                        uint64_t seed, const DeviceOutputs& outputs, void* stream);

// ---- Device memory, for callers built without CUDA headers (tests, tools) ------
// Thin wrappers of the CUDA runtime calls of the same names, synchronous, on the
// current device; failures come back as a Status with the CUDA error.

Status CudaMalloc(void** device_ptr, size_t bytes);
Status CudaFree(void* device_ptr);
Status CudaMemcpyToDevice(void* device_dst, const void* host_src, size_t bytes);
Status CudaMemcpyToHost(void* host_dst, const void* device_src, size_t bytes);
Status CudaMemset(void* device_ptr, int byte, size_t bytes);
// Waits until the device has finished all queued work (and reports its errors).
Status CudaSynchronize();
// "NVIDIA H100 80GB HBM3, sm_90, 132 SMs" for the current device; an error when
// no GPU is visible.
Status CudaDeviceDescription(std::string* text);

}  // namespace keel

#endif  // KEEL_KERNELS_QUANTIZE_CUDA_H_
