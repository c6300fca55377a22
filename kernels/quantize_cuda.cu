// The CUDA quantizers' shared host code: the launch helpers of
// quantize_cuda_internal.h (CUDA errors as Status, the occupancy cache, the checks
// every entry point makes), the device memory helpers of quantize_cuda.h, and
// QuantizeCuda of quantizer.h, which runs the device-pointer API on host arrays.
// The kernels are in quantize_cuda_mx.cu, quantize_cuda_nvfp4.cu and
// quantize_cuda_fp8.cu. They agree bit for bit with the CPU reference in
// quantize.cc: every number is computed by a quant_core.h function, which
// quant_core_test.cc checks against that reference on the CPU.
#include "kernels/quantize_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/formats.h"
#include "kernels/quantize.h"
#include "kernels/quantize_cuda_internal.h"
#include "kernels/quantizer.h"

namespace keel {
namespace qcuda {

// ============================================================================
// Launch helpers (quantize_cuda_internal.h)
// ============================================================================

namespace {

// Resident CTAs per SM for each kernel, per device, and SMs per device.
std::mutex g_occupancy_mutex;
std::map<std::pair<const void*, int>, int> g_occupancy;  // guarded by g_occupancy_mutex
std::map<int, int> g_sm_count;                           // guarded by g_occupancy_mutex

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

Status ResidentCtas(const void* kernel, int64_t* resident) {
  int device = 0;
  KEEL_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_occupancy_mutex);
  auto sm = g_sm_count.find(device);
  if (sm == g_sm_count.end()) {
    int count = 0;
    KEEL_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    sm = g_sm_count.emplace(device, count).first;
  }
  const auto key = std::make_pair(kernel, device);
  auto found = g_occupancy.find(key);
  if (found == g_occupancy.end()) {
    int per_sm = 0;
    KEEL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
    found = g_occupancy.emplace(key, std::max(per_sm, 1)).first;
  }
  *resident = static_cast<int64_t>(found->second) * sm->second;
  return Status::Ok();
}

Status CheckIo(const void* x, DType x_dtype, const DeviceOutputs& o, bool scales_allowed,
               bool tensor_scale_allowed, const char* what) {
  const std::string prefix = std::string(what) + ": ";
  if (x == nullptr) return Status::Error(prefix + "x: null; need a device pointer");
  if (x_dtype != DType::kF32 && x_dtype != DType::kBF16)
    return Status::Error(prefix + "x_dtype: " + std::to_string(static_cast<int>(x_dtype)) +
                         " is not allowed; use DType::kF32 or DType::kBF16");
  if (o.out != nullptr && o.out_dtype != DType::kF32 && o.out_dtype != DType::kBF16)
    return Status::Error(prefix + "outputs.out_dtype: " + std::to_string(static_cast<int>(o.out_dtype)) +
                         " is not allowed; use DType::kF32 or DType::kBF16");
  if (!scales_allowed && o.scales != nullptr)
    return Status::Error(prefix + "outputs.scales: must be null; this format has no block scales");
  if (!tensor_scale_allowed && o.tensor_scale != nullptr)
    return Status::Error(prefix + "outputs.tensor_scale: must be null; this format has no tensor scale");
  const std::pair<const void*, const char*> pointers[] = {
      {x, "x"}, {o.out, "outputs.out"}, {o.codes, "outputs.codes"}, {o.scales, "outputs.scales"}};
  for (const auto& p : pointers) {
    if (p.first != nullptr && !Aligned16(p.first))
      return Status::Error(prefix + p.second + ": not 16-byte aligned; the kernels load and store 16 bytes at a time");
  }
  return Status::Ok();
}

Status CheckCount(int64_t count, const char* what) {
  if (count < 1 || count > (int64_t{1} << 40))
    return Status::Error(std::string(what) + ": count: " + std::to_string(count) +
                         " is not allowed; need 1..2^40");
  return Status::Ok();
}

}  // namespace qcuda

// ============================================================================
// Device memory helpers (quantize_cuda.h)
// ============================================================================

Status CudaMalloc(void** device_ptr, size_t bytes) {
  if (device_ptr == nullptr) return Status::Error("CudaMalloc: device_ptr: null");
  KEEL_CUDA_CHECK(cudaMalloc(device_ptr, bytes));
  return Status::Ok();
}

Status CudaFree(void* device_ptr) {
  KEEL_CUDA_CHECK(cudaFree(device_ptr));
  return Status::Ok();
}

Status CudaMemcpyToDevice(void* device_dst, const void* host_src, size_t bytes) {
  KEEL_CUDA_CHECK(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status CudaMemcpyToHost(void* host_dst, const void* device_src, size_t bytes) {
  KEEL_CUDA_CHECK(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status CudaMemset(void* device_ptr, int byte, size_t bytes) {
  KEEL_CUDA_CHECK(cudaMemset(device_ptr, byte, bytes));
  return Status::Ok();
}

Status CudaSynchronize() {
  KEEL_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

Status CudaDeviceDescription(std::string* text) {
  int device = 0;
  KEEL_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  KEEL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  *text = std::string(prop.name) + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
          std::to_string(prop.multiProcessorCount) + " SMs";
  return Status::Ok();
}

// ============================================================================
// QuantizeCuda (quantizer.h): host arrays in and out
// ============================================================================

namespace {

// cudaMalloc'd memory, freed when it goes out of scope.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  Status Allocate(size_t bytes) {
    KEEL_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)));
    bytes_ = bytes;
    return Status::Ok();
  }
  template <typename T> T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

Status CopyToHost(const DeviceBuffer& from, std::vector<uint8_t>* to) {
  to->resize(from.bytes());
  if (from.bytes() > 0) KEEL_CUDA_CHECK(cudaMemcpy(to->data(), from.get<void>(), from.bytes(), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

}  // namespace

Status QuantizeCuda(const QuantRequest& request, const float* x, QuantResult* result) {
  KEEL_RETURN_IF_ERROR(ValidateRequest(request));
  if (x == nullptr) return Status::Error("QuantizeCuda: x: null; need rows x cols floats");
  if (result == nullptr) return Status::Error("QuantizeCuda: result: null");
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear it: the caller may fall back to the CPU
    return Status::Error(std::string("no CUDA GPU visible: ") +
                         (probe != cudaSuccess ? cudaGetErrorString(probe) : "cudaGetDeviceCount found none"));
  }

  const int64_t count = request.rows * request.cols;
  const bool bf16 = request.format == QuantFormat::kBf16;
  const bool mx = IsMx(request.format);
  const bool nvfp4 = request.format == QuantFormat::kNvfp4;
  const ElemFormat elem = ElementOf(request.format);
  size_t code_bytes = static_cast<size_t>(count);
  if (bf16) code_bytes = static_cast<size_t>(count) * 2;
  else if (Spec(elem).bits == 4) code_bytes = static_cast<size_t>((count + 1) / 2);
  size_t scale_bytes = 0;
  if (mx) scale_bytes = static_cast<size_t>(MxScaleCount(request.rows, request.cols, request.block, request.axis));
  if (nvfp4) scale_bytes = static_cast<size_t>(MxScaleCount(request.rows, request.cols, 16, request.axis));
  const bool has_tensor_scale = !mx && !bf16;

  DeviceBuffer d_x, d_out, d_codes, d_scales, d_tensor_scale;
  KEEL_RETURN_IF_ERROR(d_x.Allocate(static_cast<size_t>(count) * sizeof(float)));
  KEEL_RETURN_IF_ERROR(d_out.Allocate(static_cast<size_t>(count) * sizeof(float)));
  KEEL_RETURN_IF_ERROR(d_codes.Allocate(code_bytes));
  if (scale_bytes > 0) KEEL_RETURN_IF_ERROR(d_scales.Allocate(scale_bytes));
  if (has_tensor_scale) KEEL_RETURN_IF_ERROR(d_tensor_scale.Allocate(sizeof(float)));
  KEEL_CUDA_CHECK(cudaMemcpy(d_x.get<void>(), x, static_cast<size_t>(count) * sizeof(float), cudaMemcpyHostToDevice));

  DeviceOutputs o;
  o.out = d_out.get<void>();
  o.out_dtype = DType::kF32;
  o.codes = d_codes.get<uint8_t>();
  o.scales = scale_bytes > 0 ? d_scales.get<uint8_t>() : nullptr;
  o.tensor_scale = has_tensor_scale ? d_tensor_scale.get<float>() : nullptr;
  cudaStream_t stream = nullptr;  // the legacy default stream: cudaMemcpy below waits for it
  if (bf16) {
    KEEL_RETURN_IF_ERROR(
        Bf16QuantizeCuda(d_x.get<void>(), DType::kF32, count, request.rounding, request.seed, o, stream));
  } else if (mx) {
    KEEL_RETURN_IF_ERROR(MxQuantizeCuda(d_x.get<void>(), DType::kF32, request.rows, request.cols,
                                        MxOptionsOf(request), o, stream));
  } else if (nvfp4) {
    KEEL_RETURN_IF_ERROR(Nvfp4QuantizeCuda(d_x.get<void>(), DType::kF32, request.rows, request.cols,
                                           Nvfp4OptionsOf(request), nullptr, o, stream));
  } else {
    KEEL_RETURN_IF_ERROR(Fp8TensorQuantizeCuda(d_x.get<void>(), DType::kF32, count, elem, request.rounding,
                                               request.seed, nullptr, o, stream));
  }
  KEEL_CUDA_CHECK(cudaStreamSynchronize(stream));

  QuantResult r;
  r.out.resize(static_cast<size_t>(count));
  KEEL_CUDA_CHECK(cudaMemcpy(r.out.data(), d_out.get<void>(), static_cast<size_t>(count) * sizeof(float),
                             cudaMemcpyDeviceToHost));
  KEEL_RETURN_IF_ERROR(CopyToHost(d_codes, &r.packed_codes));
  if (scale_bytes > 0) KEEL_RETURN_IF_ERROR(CopyToHost(d_scales, &r.scales));
  if (has_tensor_scale) {
    r.has_tensor_scale = true;
    KEEL_CUDA_CHECK(cudaMemcpy(&r.tensor_scale, d_tensor_scale.get<void>(), sizeof(float), cudaMemcpyDeviceToHost));
  }
  *result = std::move(r);
  return Status::Ok();
}

}  // namespace keel
