// The CUDA quantizers in a build without CUDA (no toolkit at /usr/local/cuda, or
// --config=nocuda): every entry point reports that, so callers fall back to the
// CPU reference or tell the user.
#include "kernels/quantize_cuda.h"
#include "kernels/quantizer.h"

namespace keel {
namespace {

Status NoCuda(const char* what) {
  return Status::Error(std::string(what) +
                       ": keel was built without CUDA (no /usr/local/cuda at build time)");
}

}  // namespace

Status MxQuantizeCuda(const void*, DType, int64_t, int64_t, const MxOptions&, const DeviceOutputs&,
                      void*) {
  return NoCuda("MxQuantizeCuda");
}

Status Nvfp4AmaxCuda(const void*, DType, int64_t, int64_t, const Nvfp4Options&, float*, void*) {
  return NoCuda("Nvfp4AmaxCuda");
}

Status Nvfp4QuantizeCuda(const void*, DType, int64_t, int64_t, const Nvfp4Options&, const float*,
                         const DeviceOutputs&, void*) {
  return NoCuda("Nvfp4QuantizeCuda");
}

Status Fp8TensorAmaxCuda(const void*, DType, int64_t, float*, void*) {
  return NoCuda("Fp8TensorAmaxCuda");
}

Status Fp8TensorQuantizeCuda(const void*, DType, int64_t, ElemFormat, Rounding, uint64_t,
                             const float*, const DeviceOutputs&, void*) {
  return NoCuda("Fp8TensorQuantizeCuda");
}

Status Bf16QuantizeCuda(const void*, DType, int64_t, Rounding, uint64_t, const DeviceOutputs&,
                        void*) {
  return NoCuda("Bf16QuantizeCuda");
}

Status CudaMalloc(void**, size_t) { return NoCuda("CudaMalloc"); }
Status CudaFree(void*) { return NoCuda("CudaFree"); }
Status CudaMemcpyToDevice(void*, const void*, size_t) { return NoCuda("CudaMemcpyToDevice"); }
Status CudaMemcpyToHost(void*, const void*, size_t) { return NoCuda("CudaMemcpyToHost"); }
Status CudaMemset(void*, int, size_t) { return NoCuda("CudaMemset"); }
Status CudaSynchronize() { return NoCuda("CudaSynchronize"); }
Status CudaDeviceDescription(std::string*) { return NoCuda("CudaDeviceDescription"); }

Status QuantizeCuda(const QuantRequest&, const float*, QuantResult*) {
  return Status::Error("keel was built without CUDA (no /usr/local/cuda at build time)");
}

}  // namespace keel
