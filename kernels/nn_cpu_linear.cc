// CpuBackend's quantized linear layer (nn.h; docs/numerics.md, "Operand roles and axes"):
// each GEMM operand is rounded by its role's format with the CPU reference
// quantizers, counted into the operand statistics, and multiplied by gemm_cpu.h.
// Also the standalone QuantizeDequantize.
//
// What the GEMM multiplies: the element code's value times its block scale
// (MX: the reference's output; NVFP4: q * float(sf); per-tensor FP8: the code's
// value; BF16: the rounded value), and the two operands' per-tensor decode scales
// (NVFP4 S_dec, FP8 1/scale) multiply the product as the GEMM's alpha, as the
// CUDA backend's BF16 GEMM does (docs/numerics.md, "Emulation on Hopper and CPU").
// The result can differ from a GEMM of fully dequantized operands in the last
// bit, never more.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/formats.h"
#include "kernels/gemm_cpu.h"
#include "kernels/nn_cpu.h"
#include "kernels/nn_cpu_internal.h"

namespace keel {

using cpu_internal::CheckPositive;
using cpu_internal::CheckPtrs;

namespace {

bool IsWgrad(Role role) { return role == Role::kWgradDy || role == Role::kWgradX; }

bool Rotated(const OperandFormat& format) { return format.quantized() && format.rht; }

bool IsFp8Tensor(QuantFormat format) {
  return format == QuantFormat::kFp8E4M3 || format == QuantFormat::kFp8E5M2;
}

Status Prefixed(const std::string& prefix, const Status& status) {
  return status.ok() ? status : Status::Error(prefix + ": " + status.message());
}

// The RHT and statistics-slot rules of nn.h, checked before anything is written.
Status ValidateLinearQuant(const char* op, const LinearQuant& q, int64_t rows, int stats_slots) {
  for (int r = 0; r < kRoleCount; ++r) {
    const Role role = static_cast<Role>(r);
    const OperandFormat& format = q.role[r];
    if (!Rotated(format)) continue;
    if (format.format != QuantFormat::kNvfp4)
      return Status::Error(std::string(op) + ": " + RoleName(role) +
                           ".rht: true is not allowed for " + QuantFormatName(format.format) +
                           "; only nvfp4 takes the random Hadamard transform");
    if (!IsWgrad(role))
      return Status::Error(std::string(op) + ": " + RoleName(role) +
                           ".rht: true is not allowed; the RHT applies only to the two wgrad "
                           "roles (wgrad_dy and wgrad_x, both)");
  }
  const bool rotate_dy = Rotated(q.role[static_cast<int>(Role::kWgradDy)]);
  const bool rotate_x = Rotated(q.role[static_cast<int>(Role::kWgradX)]);
  if (rotate_dy != rotate_x)
    return Status::Error(std::string(op) + ": " + (rotate_dy ? "wgrad_dy" : "wgrad_x") +
                         ".rht: true without " + (rotate_dy ? "wgrad_x" : "wgrad_dy") +
                         ".rht is not allowed; the RHT must be on both wgrad operands (it "
                         "cancels only in dy^T . x)");
  if (rotate_dy && rows % 16 != 0)
    return Status::Error(std::string(op) + ": rows: " + std::to_string(rows) +
                         " is not allowed with the RHT on the wgrad roles; need a multiple of 16 "
                         "(the RHT rotates chunks of 16 tokens)");
  if (q.stats_slot < -1 || q.stats_slot >= stats_slots)
    return Status::Error(std::string(op) + ": stats_slot: " + std::to_string(q.stats_slot) +
                         " is not allowed; need -1" +
                         (stats_slots > 0 ? " or 0.." + std::to_string(stats_slots - 1) +
                                                " (the slots of the last ResetOperandStats)"
                                          : " (no slots: call ResetOperandStats first)"));
  return Status::Ok();
}

// Every code's value, so that per-element loops index a table instead of
// decoding (E2M1 and E4M3 codes fit a byte; NaN codes decode to NaN).
struct DecodeTable {
  explicit DecodeTable(ElemFormat elem) {
    for (int code = 0; code < 256; ++code)
      value[code] = DecodeElem(static_cast<uint8_t>(code), elem);
  }
  float value[256];
};

// Elements whose code has the format's largest magnitude while the input (after
// any RHT) is larger in magnitude than its fully dequantized value.
int64_t CountSaturated(ThreadPool* pool, const float* input, const float* dequantized,
                       const uint8_t* codes, int64_t count, ElemFormat elem) {
  const float largest = Spec(elem).max_normal;
  const DecodeTable table(elem);
  std::atomic<int64_t> saturated{0};  // integer sums: the order does not matter
  pool->ParallelRange(count, 16384, [&](int64_t begin, int64_t end) {
    int64_t local = 0;
    for (int64_t i = begin; i < end; ++i) {
      if (std::fabs(table.value[codes[i]]) == largest &&
          std::fabs(input[i]) > std::fabs(dequantized[i]))
        ++local;
    }
    saturated += local;
  });
  return saturated.load();
}

bool AnyNonFinite(const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(x[i])) return true;
  }
  return false;
}

// Index of element (r, c)'s NVFP4 scale byte (quantize.h layout, blocks of 16).
int64_t Nvfp4ScaleIndex(int64_t r, int64_t c, int64_t cols, int axis) {
  return axis == 1 ? r * (cols / 16) + c / 16 : (r / 16) * cols + c;
}

// NVFP4 blocks (1 x 16 along `axis`) holding a NaN or an Inf.
int64_t CountNonFiniteNvfp4Blocks(const float* y, int64_t rows, int64_t cols, int axis) {
  std::vector<uint8_t> bad(MxScaleCount(rows, cols, 16, axis), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      if (!std::isfinite(y[r * cols + c])) bad[Nvfp4ScaleIndex(r, c, cols, axis)] = 1;
    }
  }
  return std::count(bad.begin(), bad.end(), 1);
}

// The reference MX quantizer, run on bands of rows in parallel when that gives
// the same bytes as one call: blocks never straddle a band (bands are whole
// rows for axis 1, multiples of `block` rows for axis 0) and nothing depends on
// an element's index, which only stochastic rounding reads (Philox counter =
// index in the whole tensor). Stochastic rounding runs as one call.
Status MxQuantizeBands(ThreadPool* pool, const float* x, int64_t rows, int64_t cols,
                       const MxOptions& options, float* out, uint8_t* codes, uint8_t* scales) {
  Status status = ValidateMx(rows, cols, options);
  if (!status.ok() || options.rounding == Rounding::kStochastic)
    return status.ok() ? MxQuantizeRef(x, rows, cols, options, out, codes, scales) : status;
  const int64_t band = options.axis == 1 ? 1 : options.block;  // rows per indivisible band
  const int64_t bands = (rows + band - 1) / band;
  const int64_t scales_per_band =
      options.axis == 1 ? MxScaleCount(1, cols, options.block, 1) : cols;
  std::mutex error_mutex;
  pool->ParallelRange(
      bands, std::max<int64_t>(1, 16384 / (band * cols)), [&](int64_t b0, int64_t b1) {
        const int64_t r0 = b0 * band, r1 = std::min(rows, b1 * band);
        Status piece = MxQuantizeRef(x + r0 * cols, r1 - r0, cols, options, out + r0 * cols,
                                     codes != nullptr ? codes + r0 * cols : nullptr,
                                     scales != nullptr ? scales + b0 * scales_per_band : nullptr);
        if (!piece.ok()) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (status.ok()) status = piece;
        }
      });
  return status;
}

// BF16 rounding, split into pieces unless stochastic (same reason as above).
Status Bf16QuantizeBands(ThreadPool* pool, const float* x, int64_t count, Rounding rounding,
                         uint64_t seed, float* out) {
  if (rounding == Rounding::kStochastic || count < 1)
    return Bf16QuantizeRef(x, count, rounding, seed, out, nullptr);
  Status status;
  std::mutex error_mutex;
  pool->ParallelRange(count, 16384, [&](int64_t begin, int64_t end) {
    Status piece = Bf16QuantizeRef(x + begin, end - begin, rounding, seed, out + begin, nullptr);
    if (!piece.ok()) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (status.ok()) status = piece;
    }
  });
  return status;
}

}  // namespace

Status CpuBackend::PrepareOperand(Role role, const float* x, int64_t rows, int64_t cols, int axis,
                                  const LinearQuant& q, Operand* operand, OperandStats* stats) {
  const OperandFormat& format = q.role[static_cast<int>(role)];
  operand->decode_scale = 1.0f;
  if (!format.quantized()) {
    operand->data = x;  // fp32: the GEMM reads the caller's tensor as is
    return Status::Ok();
  }
  const std::string prefix = RoleName(role);
  const uint64_t seed = RoleSeed(q.seed, role);
  const int64_t count = rows * cols;
  operand->storage.resize(count);
  float* values = operand->storage.data();
  operand->data = values;
  OperandStats local;
  local.elements = count;

  if (IsMx(format.format)) {
    const MxOptions options = MxOptionsOf(format, axis, seed);
    std::vector<uint8_t> codes, scales;
    if (stats != nullptr) {
      codes.resize(count);
      scales.resize(MxScaleCount(rows, cols, options.block, axis));
    }
    Status status =
        MxQuantizeBands(&pool_, x, rows, cols, options, values, stats ? codes.data() : nullptr,
                        stats ? scales.data() : nullptr);
    if (!status.ok()) return Prefixed(prefix, status);
    if (stats != nullptr) {
      local.saturated = CountSaturated(&pool_, x, values, codes.data(), count, options.elem);
      local.blocks = static_cast<int64_t>(scales.size());
      local.nan_blocks = std::count(scales.begin(), scales.end(), kE8M0Nan);
    }
  } else if (format.format == QuantFormat::kNvfp4) {
    const Nvfp4Options options = Nvfp4OptionsOf(format, axis, seed);
    std::vector<uint8_t> codes(count), scales(MxScaleCount(rows, cols, 16, axis));
    std::vector<float> dequantized(stats != nullptr ? count : 0);
    float s_dec = 1.0f;
    Status status = Nvfp4QuantizeRef(x, rows, cols, options, stats ? dequantized.data() : nullptr,
                                     codes.data(), scales.data(), &s_dec);
    if (!status.ok()) return Prefixed(prefix, status);
    // The GEMM operand: q * float(sf), exact in fp32 (at most 2 x 4 significant bits).
    const DecodeTable e2m1(ElemFormat::kE2M1), e4m3(ElemFormat::kE4M3);
    pool_.ParallelRange(rows, std::max<int64_t>(1, 16384 / cols), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r * cols + c;
          values[i] = e2m1.value[codes[i]] * e4m3.value[scales[Nvfp4ScaleIndex(r, c, cols, axis)]];
        }
      }
    });
    operand->decode_scale = s_dec;
    if (stats != nullptr) {
      // Saturation and NaN blocks are judged on what was quantized: x after the RHT.
      std::vector<float> rotated;
      const float* input = x;
      if (options.rht) {
        rotated.resize(count);
        RhtRef(x, rows, cols, axis, rotated.data());
        input = rotated.data();
      }
      local.saturated =
          CountSaturated(&pool_, input, dequantized.data(), codes.data(), count, ElemFormat::kE2M1);
      local.blocks = static_cast<int64_t>(scales.size());
      local.nan_blocks = CountNonFiniteNvfp4Blocks(input, rows, cols, axis);
    }
  } else if (IsFp8Tensor(format.format)) {
    const ElemFormat elem = ElementOf(format.format);
    std::vector<uint8_t> codes(count);
    std::vector<float> dequantized(stats != nullptr ? count : 0);
    float decode_scale = 1.0f;
    Status status =
        Fp8TensorQuantizeRef(x, count, elem, format.rounding, seed,
                             stats ? dequantized.data() : nullptr, codes.data(), &decode_scale);
    if (!status.ok()) return Prefixed(prefix, status);
    const DecodeTable table(elem);
    pool_.ParallelRange(count, 16384, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) values[i] = table.value[codes[i]];
    });
    operand->decode_scale = decode_scale;
    if (stats != nullptr) {
      local.saturated = CountSaturated(&pool_, x, dequantized.data(), codes.data(), count, elem);
      local.blocks = 1;
      local.nan_blocks = AnyNonFinite(x, count) ? 1 : 0;
    }
  } else if (format.format == QuantFormat::kBf16) {
    Status status = Bf16QuantizeBands(&pool_, x, count, format.rounding, seed, values);
    if (!status.ok()) return Prefixed(prefix, status);
    if (stats != nullptr) {
      local.blocks = 1;  // BF16 never saturates: overflow rounds to Inf, not to a clamp
      local.nan_blocks = AnyNonFinite(x, count) ? 1 : 0;
    }
  } else {
    return Status::Error(prefix + ": format: " + std::to_string(static_cast<int>(format.format)) +
                         " is not allowed; use one of " + QuantFormatNames());
  }
  if (stats != nullptr) *stats = local;
  return Status::Ok();
}

void CpuBackend::RecordStats(const LinearQuant& q, const OperandStats* role_stats) {
  if (q.stats_slot < 0) return;
  for (int r = 0; r < kRoleCount; ++r) {
    OperandStats& total = stats_[q.stats_slot * kRoleCount + r];
    total.elements += role_stats[r].elements;
    total.saturated += role_stats[r].saturated;
    total.blocks += role_stats[r].blocks;
    total.nan_blocks += role_stats[r].nan_blocks;
  }
}

Status CpuBackend::ResetOperandStats(int slots) {
  if (slots < 0)
    return Status::Error("ResetOperandStats: slots: " + std::to_string(slots) +
                         " is not allowed; need >= 0");
  std::lock_guard<std::mutex> lock(linear_mutex_);
  stats_slots_ = slots;
  stats_.assign(static_cast<size_t>(slots) * kRoleCount, OperandStats());
  return Status::Ok();
}

Status CpuBackend::ReadOperandStats(std::vector<OperandStats>* stats) {
  if (stats == nullptr) return Status::Error("ReadOperandStats: stats: null is not allowed");
  std::lock_guard<std::mutex> lock(linear_mutex_);
  *stats = stats_;
  return Status::Ok();
}

namespace {

// One linear call's operand statistics by role, kept only when the call records
// them (q.stats_slot >= 0); `of` is what PrepareOperand fills, or null.
struct RoleStats {
  explicit RoleStats(const LinearQuant& q) : record(q.stats_slot >= 0) {}
  OperandStats* of(Role role) { return record ? &stats[static_cast<int>(role)] : nullptr; }
  bool record;
  OperandStats stats[kRoleCount];
};

}  // namespace

void CpuBackend::AddColumnSums(const float* m, int64_t rows, int64_t cols, float* out) {
  pool_.ParallelRange(cols, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> sums(end - begin, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = m + r * cols + begin;
      for (int64_t o = 0; o < end - begin; ++o) sums[o] += row[o];
    }
    for (int64_t o = begin; o < end; ++o) out[o] += sums[o - begin];
  });
}

// The fp32 values of q.x_bf16 (rows x in), after CheckXBf16.
Status CpuBackend::XBf16Values(const char* op, const LinearQuant& q, int64_t rows, int64_t in,
                               std::vector<float>* values) {
  KEEL_RETURN_IF_ERROR(CheckXBf16(op, q, in));
  values->resize(static_cast<size_t>(rows * in));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < in; ++c) (*values)[r * in + c] = Bf16ToFloat(q.x_bf16[r * q.x_bf16_ld + c]);
  }
  return Status::Ok();
}

Status CpuBackend::LinearForward(const float* x, const float* w, const float* bias,
                                 const float* residual, float* y, int64_t rows, int64_t in,
                                 int64_t out, const LinearQuant& q) {
  static const char kOp[] = "LinearForward";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"in", in}, {"out", out}}));
  if (q.x_bf16 != nullptr) {
    // x arrives rounded: its fp32 values, which the BF16 x roles keep as they are.
    std::vector<float> x_values;
    KEEL_RETURN_IF_ERROR(XBf16Values(kOp, q, rows, in, &x_values));
    LinearQuant plain = q;
    plain.x_bf16 = nullptr;
    return LinearForward(x_values.data(), w, bias, residual, y, rows, in, out, plain);
  }
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"w", w}, {"y", y}}));
  if (residual == y)
    return Status::Error(std::string(kOp) +
                         ": residual: the same buffer as y is not allowed; pass a separate "
                         "residual (y receives the product before the residual is added)");
  std::lock_guard<std::mutex> lock(linear_mutex_);
  KEEL_RETURN_IF_ERROR(ValidateLinearQuant(kOp, q, rows, stats_slots_));
  KEEL_RETURN_IF_ERROR(CheckHotChannels(kOp, "hcp_fwd", q.hcp_fwd, in));
  KEEL_RETURN_IF_ERROR(AnalyzeOperand(kOp, Role::kFwdX, x, rows, in, q.analytics_slot));
  KEEL_RETURN_IF_ERROR(AnalyzeOperand(kOp, Role::kFwdW, w, out, in, q.analytics_slot));

  RoleStats role_stats(q);
  const std::string prefix = kOp;
  KEEL_RETURN_IF_ERROR(Prefixed(
      prefix, PrepareOperand(Role::kFwdX, x, rows, in, 1, q, &operand_a_, role_stats.of(Role::kFwdX))));
  KEEL_RETURN_IF_ERROR(Prefixed(
      prefix, PrepareOperand(Role::kFwdW, w, out, in, 1, q, &operand_b_, role_stats.of(Role::kFwdW))));
  const float alpha = operand_a_.decode_scale * operand_b_.decode_scale;
  // y = alpha * x_q . w_q^T: B is w stored out x in, i.e. op(B) = w^T.
  GemmCpu(&pool_, GemmShape{rows, out, in}, false, true, alpha, operand_a_.data, in,
          operand_b_.data, in, false, y, out);
  // The hot input channels' residual products (docs/hcp.md), before bias and residual.
  {
    const HcpSide a{x, &operand_a_, rows, in, 1}, b{w, &operand_b_, out, in, 1};
    AddHcpPatch(a, b, HotSet(a, b, in, q.hcp_fwd), q.hcp_fwd.count, y, out);
  }
  // Then (y + bias) + residual, each a separate fp32 addition: the bits of adding
  // the bias and then calling Add with the residual.
  if (bias != nullptr || residual != nullptr) {
    pool_.ParallelRange(rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float* row = y + r * out;
        if (bias != nullptr) {
          for (int64_t o = 0; o < out; ++o) row[o] += bias[o];
        }
        if (residual != nullptr) {
          const float* skip = residual + r * out;
          for (int64_t o = 0; o < out; ++o) row[o] += skip[o];
        }
      }
    });
  }
  RecordStats(q, role_stats.stats);
  return Status::Ok();
}

Status CpuBackend::LinearBackward(const float* x, const float* w, const float* dy, float* dx,
                                  float* dw, float* dbias, int64_t rows, int64_t in, int64_t out,
                                  const LinearQuant& q) {
  static const char kOp[] = "LinearBackward";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"in", in}, {"out", out}}));
  if (q.dy_bf16 != nullptr) {
    // dy arrives rounded: its fp32 values, which the BF16 dy roles keep as they are.
    KEEL_RETURN_IF_ERROR(CheckDyBf16(kOp, q, out, dbias));
    std::vector<float> dy_values(static_cast<size_t>(rows * out));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < out; ++c) dy_values[r * out + c] = Bf16ToFloat(q.dy_bf16[r * q.dy_bf16_ld + c]);
    }
    LinearQuant plain = q;
    plain.dy_bf16 = nullptr;
    return LinearBackward(x, w, dy_values.data(), dx, dw, dbias, rows, in, out, plain);
  }
  if (q.x_bf16 != nullptr) {
    std::vector<float> x_values;
    KEEL_RETURN_IF_ERROR(XBf16Values(kOp, q, rows, in, &x_values));
    LinearQuant plain = q;
    plain.x_bf16 = nullptr;
    return LinearBackward(x_values.data(), w, dy, dx, dw, dbias, rows, in, out, plain);
  }
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"w", w}, {"dy", dy}, {"dw", dw}}));
  std::lock_guard<std::mutex> lock(linear_mutex_);
  KEEL_RETURN_IF_ERROR(ValidateLinearQuant(kOp, q, rows, stats_slots_));
  KEEL_RETURN_IF_ERROR(CheckHotChannels(kOp, "hcp_dgrad", q.hcp_dgrad, out));
  KEEL_RETURN_IF_ERROR(CheckHcpWgradRows(kOp, q, rows));
  if (dx != nullptr) {  // the dgrad GEMM runs only when dx is wanted
    KEEL_RETURN_IF_ERROR(AnalyzeOperand(kOp, Role::kDgradDy, dy, rows, out, q.analytics_slot));
    KEEL_RETURN_IF_ERROR(AnalyzeOperand(kOp, Role::kDgradW, w, out, in, q.analytics_slot));
  }
  KEEL_RETURN_IF_ERROR(AnalyzeOperand(kOp, Role::kWgradDy, dy, rows, out, q.analytics_slot));
  KEEL_RETURN_IF_ERROR(AnalyzeOperand(kOp, Role::kWgradX, x, rows, in, q.analytics_slot));

  RoleStats role_stats(q);
  const std::string prefix = kOp;
  // All four operands are quantized before any output is touched, so that a
  // format error (say nvfp4 with rows not a multiple of 16) changes nothing.
  if (dx != nullptr) {
    KEEL_RETURN_IF_ERROR(
        Prefixed(prefix, PrepareOperand(Role::kDgradDy, dy, rows, out, 1, q, &operand_a_,
                                        role_stats.of(Role::kDgradDy))));
    KEEL_RETURN_IF_ERROR(Prefixed(
        prefix,
        PrepareOperand(Role::kDgradW, w, out, in, 0, q, &operand_b_, role_stats.of(Role::kDgradW))));
  }
  KEEL_RETURN_IF_ERROR(Prefixed(prefix, PrepareOperand(Role::kWgradDy, dy, rows, out, 0, q,
                                                           &operand_c_, role_stats.of(Role::kWgradDy))));
  KEEL_RETURN_IF_ERROR(Prefixed(prefix, PrepareOperand(Role::kWgradX, x, rows, in, 0, q,
                                                           &operand_d_, role_stats.of(Role::kWgradX))));
  if (dx != nullptr) {
    // dx (rows x in) = dy_q (rows x out) . w_q (out x in).
    GemmCpu(&pool_, GemmShape{rows, in, out}, false, false,
            operand_a_.decode_scale * operand_b_.decode_scale, operand_a_.data, out,
            operand_b_.data, in, false, dx, in);
    // The hot output channels' patch: A = dy along out, B = w read down its columns.
    const HcpSide a{dy, &operand_a_, rows, out, 1}, b{w, &operand_b_, in, 1, in};
    AddHcpPatch(a, b, HotSet(a, b, out, q.hcp_dgrad), q.hcp_dgrad.count, dx, in);
  }
  // dw (out x in) += dy_q^T . x_q: A is dy stored rows x out, i.e. op(A) = dy^T.
  GemmCpu(&pool_, GemmShape{out, in, rows}, true, false,
          operand_c_.decode_scale * operand_d_.decode_scale, operand_c_.data, out, operand_d_.data,
          in, true, dw, in);
  KEEL_RETURN_IF_ERROR(AddWgradHcpPatch(x, dy, rows, in, out, q, dw));
  if (dbias != nullptr) AddColumnSums(dy, rows, out, dbias);
  RecordStats(q, role_stats.stats);
  return Status::Ok();
}

Status CpuBackend::ChannelAbsMax(const float* x, int64_t rows, int64_t cols, int channel_axis, float* out) {
  static const char kOp[] = "ChannelAbsMax";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"cols", cols}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"out", out}}));
  if (channel_axis != 0 && channel_axis != 1)
    return Status::Error(std::string(kOp) + ": channel_axis: " + std::to_string(channel_axis) +
                         " is not allowed; use 1 (channels are columns) or 0 (channels are rows)");
  ChannelAbsMaxRef(x, rows, cols, channel_axis, out);
  return Status::Ok();
}

Status CpuBackend::AddOutlierSums(const float* x, int64_t rows, int64_t cols, int nvfp4_axis,
                                  OutlierSums* sums) {
  static const char kOp[] = "AddOutlierSums";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"cols", cols}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"sums", sums}}));
  if (nvfp4_axis != 0 && nvfp4_axis != 1)
    return Status::Error(std::string(kOp) + ": nvfp4_axis: " + std::to_string(nvfp4_axis) +
                         " is not allowed; use 1 (along rows) or 0 (down columns)");
  AddOutlierSumsRef(x, rows, cols, nvfp4_axis, sums);
  return Status::Ok();
}

Status CpuBackend::AddBlockAbsSums(const float* x, int64_t rows, int64_t cols, const MapGrid& grid,
                                   double* map) {
  static const char kOp[] = "AddBlockAbsSums";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"cols", cols}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"map", map}}));
  const MapGrid expected = MapGridFor(rows, cols);
  if (grid.cell_rows != expected.cell_rows || grid.cell_cols != expected.cell_cols || grid.rows != expected.rows ||
      grid.cols != expected.cols)
    return Status::Error(std::string(kOp) + ": grid: " + std::to_string(grid.rows) + " x " +
                         std::to_string(grid.cols) + " cells is not allowed; use MapGridFor(rows, cols)");
  AddBlockAbsSumsRef(x, rows, cols, grid, map);
  return Status::Ok();
}

namespace {

// A bf16 tensor's values (rows ld apart) as packed fp32, for the reductions.
Status WidenBf16(const char* op, const uint16_t* x, int64_t ld, int64_t rows, int64_t cols,
                 std::vector<float>* out) {
  KEEL_RETURN_IF_ERROR(CheckPositive(op, {{"rows", rows}, {"cols", cols}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(op, {{"x", x}}));
  if (ld < cols)
    return Status::Error(std::string(op) + ": ld: " + std::to_string(ld) + " is not allowed; need >= cols (" +
                         std::to_string(cols) + ")");
  out->resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) (*out)[r * cols + c] = Bf16ToFloat(x[r * ld + c]);
  }
  return Status::Ok();
}

}  // namespace

Status CpuBackend::ChannelAbsMaxBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, int channel_axis,
                                     float* out) {
  std::vector<float> wide;
  KEEL_RETURN_IF_ERROR(WidenBf16("ChannelAbsMaxBf16", x, ld, rows, cols, &wide));
  return ChannelAbsMax(wide.data(), rows, cols, channel_axis, out);
}

Status CpuBackend::AddOutlierSumsBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, int nvfp4_axis,
                                      OutlierSums* sums) {
  std::vector<float> wide;
  KEEL_RETURN_IF_ERROR(WidenBf16("AddOutlierSumsBf16", x, ld, rows, cols, &wide));
  return AddOutlierSums(wide.data(), rows, cols, nvfp4_axis, sums);
}

Status CpuBackend::AddBlockAbsSumsBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols,
                                       const MapGrid& grid, double* map) {
  std::vector<float> wide;
  KEEL_RETURN_IF_ERROR(WidenBf16("AddBlockAbsSumsBf16", x, ld, rows, cols, &wide));
  return AddBlockAbsSums(wide.data(), rows, cols, grid, map);
}

Status CpuBackend::QuantizeDequantize(const float* x, int64_t rows, int64_t cols, int axis,
                                      const OperandFormat& format, uint64_t seed, float* out) {
  static const char kOp[] = "QuantizeDequantize";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"cols", cols}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"out", out}}));
  if (axis != 0 && axis != 1)
    return Status::Error(std::string(kOp) + ": axis: " + std::to_string(axis) +
                         " is not allowed; use 1 (along rows) or 0 (down columns)");
  const int64_t count = rows * cols;
  if (!format.quantized()) {
    if (out != x) std::memcpy(out, x, sizeof(float) * count);
    return Status::Ok();
  }
  // The reference's NVFP4 output with the RHT lies in the rotated domain, which
  // is no approximation of x; the rotation only makes sense inside dy^T . x.
  if (format.rht)
    return Status::Error(std::string(kOp) +
                         ": rht: true is not allowed; the RHT applies only to the two wgrad "
                         "operands of LinearBackward");
  // The reference quantizers read a block before writing it, but out == x is
  // served from a copy so as not to depend on that.
  std::vector<float> copy;
  float* dst = out;
  if (out == x) {
    copy.resize(count);
    dst = copy.data();
  }
  Status status;
  if (IsMx(format.format)) {
    status = MxQuantizeBands(&pool_, x, rows, cols, MxOptionsOf(format, axis, seed), dst, nullptr,
                             nullptr);
  } else if (format.format == QuantFormat::kNvfp4) {
    // format.rht is false here (refused above).
    status = Nvfp4QuantizeRef(x, rows, cols, Nvfp4OptionsOf(format, axis, seed), dst, nullptr,
                              nullptr, nullptr);
  } else if (IsFp8Tensor(format.format)) {
    status = Fp8TensorQuantizeRef(x, count, ElementOf(format.format), format.rounding, seed, dst,
                                  nullptr, nullptr);
  } else if (format.format == QuantFormat::kBf16) {
    status = Bf16QuantizeBands(&pool_, x, count, format.rounding, seed, dst);
  } else {
    status = Status::Error("format: " + std::to_string(static_cast<int>(format.format)) +
                           " is not allowed; use one of " + QuantFormatNames());
  }
  if (!status.ok()) return Prefixed(kOp, status);
  if (dst != out) std::memcpy(out, dst, sizeof(float) * count);
  return Status::Ok();
}

}  // namespace keel
