// Format dispatch for the CPU reference, the request validation shared with the
// CUDA backend, and the packed-file layout of quantizer.h.
#include "kernels/quantizer.h"

#include <cstring>

namespace keel {

std::vector<uint8_t> QuantResult::PackedFile() const {
  std::vector<uint8_t> file(packed_codes);
  file.insert(file.end(), scales.begin(), scales.end());
  if (has_tensor_scale) {
    uint8_t bytes[4];
    std::memcpy(bytes, &tensor_scale, 4);  // x86-64 and aarch64 are little-endian
    file.insert(file.end(), bytes, bytes + 4);
  }
  return file;
}

// The fields every format's options share: axis, rounding, seed.
template <typename Options>
Options WithCommon(Options options, const QuantRequest& request) {
  options.axis = request.axis;
  options.rounding = request.rounding;
  options.seed = request.seed;
  return options;
}

MxOptions MxOptionsOf(const QuantRequest& request) {
  MxOptions options;
  options.elem = ElementOf(request.format);
  options.block = request.block;
  return WithCommon(options, request);
}

Nvfp4Options Nvfp4OptionsOf(const QuantRequest& request) {
  Nvfp4Options options;
  options.tile_16x16 = request.tile_16x16;
  options.rht = request.rht;
  return WithCommon(options, request);
}

Status ValidateRequest(const QuantRequest& request) {
  const char* name = QuantFormatName(request.format);
  if (!IsMx(request.format) && request.block != 32)
    return Status::Error("block: " + std::to_string(request.block) + " is not allowed for " + name +
                         "; --block applies to MX formats only");
  if (request.format != QuantFormat::kNvfp4 && request.tile_16x16)
    return Status::Error(std::string("tile: 16x16 is not allowed for ") + name +
                         "; tiles apply to nvfp4 only");
  if (request.format != QuantFormat::kNvfp4 && request.rht)
    return Status::Error(std::string("rht: not allowed for ") + name + "; RHT applies to nvfp4 only");
  if (IsMx(request.format)) return ValidateMx(request.rows, request.cols, MxOptionsOf(request));
  if (request.format == QuantFormat::kNvfp4)
    return ValidateNvfp4(request.rows, request.cols, Nvfp4OptionsOf(request));
  // Per-tensor FP8 and BF16 are elementwise: the axis changes nothing but must be valid.
  if (request.axis != 0 && request.axis != 1)
    return Status::Error("axis: " + std::to_string(request.axis) + " is not allowed; use 1 or 0");
  if (request.rows < 1 || request.cols < 1)
    return Status::Error("rows x cols: " + std::to_string(request.rows) + " x " +
                         std::to_string(request.cols) + " is not allowed; both need >= 1");
  return Status::Ok();
}

Status QuantizeCpu(const QuantRequest& request, const float* x, QuantResult* result) {
  Status status = ValidateRequest(request);
  if (!status.ok()) return status;
  const int64_t count = request.rows * request.cols;
  QuantResult r;
  r.out.resize(count);
  if (request.format == QuantFormat::kBf16) {
    std::vector<uint16_t> bits(count);
    status = Bf16QuantizeRef(x, count, request.rounding, request.seed, r.out.data(), bits.data());
    if (!status.ok()) return status;
    r.packed_codes.resize(count * 2);
    for (int64_t i = 0; i < count; ++i) {
      r.packed_codes[2 * i] = static_cast<uint8_t>(bits[i] & 0xFF);
      r.packed_codes[2 * i + 1] = static_cast<uint8_t>(bits[i] >> 8);
    }
    *result = std::move(r);
    return Status::Ok();
  }
  const ElemFormat elem = ElementOf(request.format);
  std::vector<uint8_t> codes(count);
  if (IsMx(request.format)) {
    r.scales.resize(MxScaleCount(request.rows, request.cols, request.block, request.axis));
    status = MxQuantizeRef(x, request.rows, request.cols, MxOptionsOf(request), r.out.data(),
                           codes.data(), r.scales.data());
  } else if (request.format == QuantFormat::kNvfp4) {
    r.scales.resize(MxScaleCount(request.rows, request.cols, 16, request.axis));
    r.has_tensor_scale = true;
    status = Nvfp4QuantizeRef(x, request.rows, request.cols, Nvfp4OptionsOf(request), r.out.data(),
                              codes.data(), r.scales.data(), &r.tensor_scale);
  } else {
    r.has_tensor_scale = true;
    status = Fp8TensorQuantizeRef(x, count, elem, request.rounding, request.seed, r.out.data(),
                                  codes.data(), &r.tensor_scale);
  }
  if (!status.ok()) return status;
  r.packed_codes = PackCodes(codes.data(), count, elem);
  *result = std::move(r);
  return Status::Ok();
}

}  // namespace keel
