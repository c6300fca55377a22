// The Backend methods with a default (nn.h), for backends without a device
// memory figure or a per-op timer, and FormatProfile.
#include "kernels/nn.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace keel {

Status Backend::SetProfiling(bool on) {
  if (!on) return Status::Ok();
  return Status::Error(std::string("profile: the ") + name() +
                       " backend has no per-op timer (the cuda backend has)");
}

Status Backend::AdamWTensors(const std::vector<AdamWTensor>& tensors, float lr, float beta1, float beta2,
                             float eps, int step, float grad_scale, std::vector<double>* delta_squares) {
  if (delta_squares != nullptr) delta_squares->assign(tensors.size(), 0.0);
  std::vector<float> before, after;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensor& t = tensors[i];
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(t.count, 0)) * sizeof(float);
    if (delta_squares != nullptr && bytes > 0) {
      before.resize(static_cast<size_t>(t.count));
      KEEL_RETURN_IF_ERROR(Download(before.data(), t.param, bytes));
    }
    KEEL_RETURN_IF_ERROR(AdamW(t.param, t.grad, t.m, t.v, t.count, lr, beta1, beta2, eps, t.weight_decay, step,
                               grad_scale));
    if (delta_squares == nullptr || bytes == 0) continue;
    after.resize(static_cast<size_t>(t.count));
    KEEL_RETURN_IF_ERROR(Download(after.data(), t.param, bytes));
    double sum = 0.0;
    for (int64_t j = 0; j < t.count; ++j) {
      const double d = static_cast<double>(before[static_cast<size_t>(j)] - after[static_cast<size_t>(j)]);
      sum += d * d;
    }
    (*delta_squares)[i] = sum;
  }
  return Status::Ok();
}

void RopeTables(double theta, int64_t positions, int64_t hd, std::vector<float>* cos,
                std::vector<float>* sin) {
  const int64_t half = hd / 2;
  cos->assign(static_cast<size_t>(positions * half), 0.0f);
  sin->assign(static_cast<size_t>(positions * half), 0.0f);
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    for (int64_t t = 0; t < positions; ++t) {
      const double angle = static_cast<double>(t) * inv_freq;
      (*cos)[t * half + i] = static_cast<float>(std::cos(angle));
      (*sin)[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

Status Backend::HcpScores(HcpGemm, const float*, const float*, int64_t, int64_t, int64_t, const LinearQuant&,
                          float*) {
  return Status::Error(std::string("HcpScores: not implemented by the ") + name() + " backend");
}

Status Backend::HcpTopK(const float*, int64_t, int32_t, int32_t*) {
  return Status::Error(std::string("HcpTopK: not implemented by the ") + name() + " backend");
}

Status Backend::DownloadMany(const std::vector<DownloadItem>& items) {
  for (const DownloadItem& item : items) KEEL_RETURN_IF_ERROR(Download(item.host_dst, item.src, item.bytes));
  return Status::Ok();
}

Status Backend::CrossEntropyFusedBf16(const float*, const int32_t*, float*, uint16_t*, int64_t, int64_t, int64_t,
                                      int64_t, float, int64_t) {
  return Status::Error(std::string("CrossEntropyFusedBf16: not implemented by the ") + name() + " backend");
}

bool Backend::KeepsAttentionHeads(int64_t, bool) const { return false; }

Status Backend::AttentionForwardKeep(const float*, float*, float*, float*, int64_t, int64_t, int64_t, int64_t,
                                     bool) {
  return Status::Error(std::string("AttentionForwardKeep: not implemented by the ") + name() + " backend");
}

Status Backend::AttentionBackwardKept(const float*, const float*, const float*, const float*, float*, int64_t,
                                      int64_t, int64_t, int64_t, bool) {
  return Status::Error(std::string("AttentionBackwardKept: not implemented by the ") + name() + " backend");
}

Status Backend::GeluForwardBf16(const float*, uint16_t*, int64_t) {
  return Status::Error(std::string("GeluForwardBf16: not implemented by the ") + name() + " backend");
}

Status Backend::GeluBackwardBf16(const float*, const float*, uint16_t*, int64_t, int64_t, float*) {
  return Status::Error(std::string("GeluBackwardBf16: not implemented by the ") + name() + " backend");
}

Status Backend::LayerNormForwardBf16(const float*, const float*, const float*, uint16_t*, float*, float*, int64_t,
                                     int64_t, float) {
  return Status::Error(std::string("LayerNormForwardBf16: not implemented by the ") + name() + " backend");
}

Status Backend::AddLayerNormForward(const float* y, const float* residual, float* sum, const float* gamma,
                                    const float* beta, float* out, uint16_t* out_bf16, float* mean, float* rstd,
                                    int64_t rows, int64_t cols, float eps) {
  if ((out == nullptr) == (out_bf16 == nullptr)) {
    return Status::Error("AddLayerNormForward: out and out_bf16: give exactly one");
  }
  if (residual == nullptr || sum == nullptr || residual == sum) {
    return Status::Error("AddLayerNormForward: residual or sum: null, or sum aliases residual");
  }
  if (rows < 0 || cols < 1) {
    return Status::Error("AddLayerNormForward: shape: rows " + std::to_string(rows) + ", cols " +
                         std::to_string(cols) + " is not allowed; need rows >= 0, cols >= 1");
  }
  KEEL_RETURN_IF_ERROR(Add(y, residual, sum, rows * cols));
  if (out != nullptr) return LayerNormForward(sum, gamma, beta, out, mean, rstd, rows, cols, eps);
  return LayerNormForwardBf16(sum, gamma, beta, out_bf16, mean, rstd, rows, cols, eps);
}

bool TakesBf16X(const LinearQuant& q) {
  for (Role r : {Role::kFwdX, Role::kFwdW, Role::kWgradDy, Role::kWgradX}) {
    if (!q.role[static_cast<int>(r)].quantized()) return false;
  }
  for (Role r : {Role::kFwdX, Role::kWgradX}) {
    const OperandFormat& f = q.role[static_cast<int>(r)];
    if (f.format != QuantFormat::kBf16 || f.rounding != Rounding::kNearestEven) return false;
  }
  return true;
}

Status CheckXBf16(const char* op, const LinearQuant& q, int64_t in) {
  if (q.x_bf16 == nullptr) return Status::Ok();
  if (!TakesBf16X(q))
    return Status::Error(std::string(op) + ": x_bf16: given is not allowed with these roles; it needs fwd_x, fwd_w, "
                         "wgrad_dy and wgrad_x quantized and fwd_x, wgrad_x bf16 nearest_even");
  if (q.x_bf16_ld < in)
    return Status::Error(std::string(op) + ": x_bf16_ld: " + std::to_string(q.x_bf16_ld) +
                         " is not allowed; need >= in (" + std::to_string(in) + ")");
  if (q.hcp_fwd.count > 0)
    return Status::Error(std::string(op) + ": hcp_fwd: " + std::to_string(q.hcp_fwd.count) +
                         " hot channels are not allowed with x_bf16 (the patch needs x's fp32 residual)");
  if (q.hcp_wgrad_rows > 0)
    return Status::Error(std::string(op) + ": hcp_wgrad_rows: " + std::to_string(q.hcp_wgrad_rows) +
                         " is not allowed with x_bf16 (the patch needs x's fp32 residual)");
  return Status::Ok();
}

bool TakesBf16Dy(const LinearQuant& q) {
  for (Role r : {Role::kDgradDy, Role::kDgradW, Role::kWgradDy, Role::kWgradX}) {
    if (!q.role[static_cast<int>(r)].quantized()) return false;
  }
  for (Role r : {Role::kDgradDy, Role::kWgradDy}) {
    const OperandFormat& f = q.role[static_cast<int>(r)];
    if (f.format != QuantFormat::kBf16 || f.rounding != Rounding::kNearestEven) return false;
  }
  return true;
}

Status CheckDyBf16(const char* op, const LinearQuant& q, int64_t out, const float* dbias) {
  if (q.dy_bf16 == nullptr) return Status::Ok();
  if (!TakesBf16Dy(q))
    return Status::Error(std::string(op) + ": dy_bf16: given is not allowed with these roles; it needs all four "
                         "backward roles quantized and dgrad_dy, wgrad_dy bf16 nearest_even");
  if (dbias != nullptr)
    return Status::Error(std::string(op) + ": dbias: not allowed with dy_bf16 (the bias gradient sums the fp32 dy)");
  if (q.dy_bf16_ld < out)
    return Status::Error(std::string(op) + ": dy_bf16_ld: " + std::to_string(q.dy_bf16_ld) +
                         " is not allowed; need >= out (" + std::to_string(out) + ")");
  if (q.hcp_dgrad.count > 0 || q.hcp_wgrad_rows > 0)
    return Status::Error(std::string(op) + ": hcp_dgrad / hcp_wgrad_rows: not allowed with dy_bf16 (the patch needs "
                         "dy's fp32 residual)");
  return Status::Ok();
}

Status CheckHotChannelCounts(const char* op, const char* field, const HotChannels& hot, int64_t k_count) {
  if (hot.count < 0 || hot.count > k_count) {
    return Status::Error(std::string(op) + ": " + field + ".count: " + std::to_string(hot.count) +
                         " is not allowed; need 0.." + std::to_string(k_count) + " (the GEMM's contraction)");
  }
  if (hot.count > 0 && hot.index == nullptr && hot.choose_into == nullptr) {
    return Status::Error(std::string(op) + ": " + field + ".index: null is not allowed with count " +
                         std::to_string(hot.count));
  }
  return Status::Ok();
}

Status CheckHcpWgradRows(const char* op, const LinearQuant& q, int64_t rows) {
  if (q.hcp_wgrad_rows >= 0 && q.hcp_wgrad_rows <= rows) return Status::Ok();
  return Status::Error(std::string(op) + ": hcp_wgrad_rows: " + std::to_string(q.hcp_wgrad_rows) +
                       " is not allowed; need 0.." + std::to_string(rows) + " (the wgrad GEMM's tokens)");
}

bool Backend::DeviceMemoryInUse(int64_t* bytes) const {
  *bytes = 0;
  return false;
}

Status Backend::TakeProfile(std::vector<OpTime>* out) {
  out->clear();
  return Status::Ok();
}

std::string FormatProfile(const std::vector<OpTime>& times, int64_t steps, double step_ms) {
  const double n = static_cast<double>(std::max<int64_t>(steps, 1));
  const std::string kPart = " > ";
  std::vector<const OpTime*> ops;
  double total_ms = 0.0, total_host_ms = 0.0;
  for (const OpTime& t : times) {
    if (t.op.find(kPart) != std::string::npos) continue;
    ops.push_back(&t);
    total_ms += t.ms;
    total_host_ms += t.host_ms;
  }
  auto longest = [](const OpTime* a, const OpTime* b) { return a->ms > b->ms; };
  std::sort(ops.begin(), ops.end(), longest);
  char line[256];
  std::string out;
  std::snprintf(line, sizeof(line), "  %-44s %11s %10s %8s %10s\n", "op (device time; parts under their op)",
                "calls/step", "ms/step", step_ms > 0 ? "% step" : "% ops", "host ms");
  out += line;
  const double whole = step_ms > 0 ? step_ms : total_ms / n;
  auto row = [&](const std::string& name, const OpTime& t) {
    const double per_step = t.ms / n;
    std::snprintf(line, sizeof(line), "  %-44s %11.1f %10.3f %7.1f%% %10.3f\n", name.c_str(), t.calls / n, per_step,
                  whole > 0 ? 100.0 * per_step / whole : 0.0, t.host_ms / n);
    out += line;
  };
  for (const OpTime* op : ops) {
    row(op->op, *op);
    std::vector<const OpTime*> parts;
    for (const OpTime& t : times) {
      if (t.op.size() > op->op.size() + kPart.size() && t.op.compare(0, op->op.size(), op->op) == 0 &&
          t.op.compare(op->op.size(), kPart.size(), kPart) == 0) {
        parts.push_back(&t);
      }
    }
    std::sort(parts.begin(), parts.end(), longest);
    for (const OpTime* part : parts) row("  > " + part->op.substr(op->op.size() + kPart.size()), *part);
  }
  std::snprintf(line, sizeof(line), "  %-44s %11s %10.3f %7.1f%% %10.3f\n", "all ops", "", total_ms / n,
                whole > 0 ? 100.0 * total_ms / n / whole : 0.0, total_host_ms / n);
  out += line;
  if (step_ms > 0) {
    std::snprintf(line, sizeof(line), "  %-44s %11s %10.3f\n", "step (wall clock)", "", step_ms);
    out += line;
    // The caller's own host work between the ops (and the profiler's): while it
    // runs, no new work reaches the GPU.
    std::snprintf(line, sizeof(line), "  %-44s %11s %10s %8s %10.3f\n", "host outside the ops (wall - ops' host)", "",
                  "", "", step_ms - total_host_ms / n);
    out += line;
  }
  return out;
}

}  // namespace keel
