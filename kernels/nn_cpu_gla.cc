// CpuBackend's gated-linear-attention ops (nn.h): logsigmoid, swish gating and
// the gated recurrence, forward and backward. The recurrence runs its
// sequential definition (gla_cpu.h), one task per (batch, head); the per-element
// maps are fp32.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/gla_cpu.h"
#include "kernels/nn_cpu.h"
#include "kernels/nn_cpu_internal.h"

namespace keel {

using cpu_internal::CheckMin;
using cpu_internal::CheckPtrs;

namespace {

constexpr int64_t kElementGrain = 4096;

Status CheckGate(const char* op, int64_t rows, int64_t cols, int64_t g_ld) {
  KEEL_RETURN_IF_ERROR(CheckMin(op, "rows", rows, 0));
  KEEL_RETURN_IF_ERROR(CheckMin(op, "cols", cols, 1));
  return CheckMin(op, "g_ld", g_ld, cols);
}

}  // namespace

Status CpuBackend::LogSigmoidForward(const float* x, float* y, int64_t count, float scale) {
  static const char kOp[] = "LogSigmoidForward";
  KEEL_RETURN_IF_ERROR(CheckMin(kOp, "count", count, 0));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"y", y}}, count));
  pool_.ParallelRange(count, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float a = x[i];
      y[i] = scale * (std::min(a, 0.0f) - std::log1p(std::exp(-std::fabs(a))));
    }
  });
  return Status::Ok();
}

Status CpuBackend::LogSigmoidBackward(const float* x, const float* dy, float* dx, int64_t count, float scale) {
  static const char kOp[] = "LogSigmoidBackward";
  KEEL_RETURN_IF_ERROR(CheckMin(kOp, "count", count, 0));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"dy", dy}, {"dx", dx}}, count));
  pool_.ParallelRange(count, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dx[i] = dy[i] * scale / (1.0f + std::exp(x[i]));
  });
  return Status::Ok();
}

Status CpuBackend::SiluGateForward(const float* x, const float* g, int64_t g_ld, float* y, int64_t rows,
                                   int64_t cols) {
  static const char kOp[] = "SiluGateForward";
  KEEL_RETURN_IF_ERROR(CheckGate(kOp, rows, cols, g_ld));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"g", g}, {"y", y}}, rows));
  pool_.ParallelRange(rows, std::max<int64_t>(1, kElementGrain / cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gr = g + r * g_ld;
      for (int64_t c = 0; c < cols; ++c) {
        const float a = gr[c];
        y[r * cols + c] = x[r * cols + c] * (a / (1.0f + std::exp(-a)));
      }
    }
  });
  return Status::Ok();
}

Status CpuBackend::SiluGateBackward(const float* x, const float* g, int64_t g_ld, const float* dy, float* dx,
                                    float* dg, int64_t rows, int64_t cols) {
  static const char kOp[] = "SiluGateBackward";
  KEEL_RETURN_IF_ERROR(CheckGate(kOp, rows, cols, g_ld));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"g", g}, {"dy", dy}, {"dx", dx}, {"dg", dg}}, rows));
  pool_.ParallelRange(rows, std::max<int64_t>(1, kElementGrain / cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float a = g[r * g_ld + c];
        const float sigmoid = 1.0f / (1.0f + std::exp(-a));
        const float d = dy[r * cols + c];
        dx[r * cols + c] = d * (a * sigmoid);
        dg[r * g_ld + c] = d * x[r * cols + c] * (sigmoid * (1.0f + a * (1.0f - sigmoid)));
      }
    }
  });
  return Status::Ok();
}

Status CpuBackend::GlaForward(const float* qkv, int64_t ld, const float* gk, float* out, int64_t batch,
                              int64_t seq, int64_t heads, int64_t dk, int64_t dv) {
  static const char kOp[] = "GlaForward";
  const gla_cpu::Shape shape{batch, seq, heads, dk, dv, ld};
  KEEL_RETURN_IF_ERROR(gla_cpu::CheckShape(kOp, shape));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"qkv", qkv}, {"gk", gk}, {"out", out}}, batch));
  pool_.ParallelRange(batch * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) gla_cpu::ForwardSequential(qkv, gk, out, shape, bh / heads, bh % heads);
  });
  return Status::Ok();
}

Status CpuBackend::GlaBackward(const float* qkv, int64_t ld, const float* gk, const float* dout, float* dqkv,
                               float* dgk, int64_t batch, int64_t seq, int64_t heads, int64_t dk, int64_t dv) {
  static const char kOp[] = "GlaBackward";
  const gla_cpu::Shape shape{batch, seq, heads, dk, dv, ld};
  KEEL_RETURN_IF_ERROR(gla_cpu::CheckShape(kOp, shape));
  KEEL_RETURN_IF_ERROR(
      CheckPtrs(kOp, {{"qkv", qkv}, {"gk", gk}, {"dout", dout}, {"dqkv", dqkv}, {"dgk", dgk}}, batch));
  pool_.ParallelRange(batch * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      gla_cpu::BackwardSequential(qkv, gk, dout, dqkv, dgk, shape, bh / heads, bh % heads);
    }
  });
  return Status::Ok();
}

}  // namespace keel
