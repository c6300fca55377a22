// CpuBackend's factory and its simple operations: memory, elementwise, random
// normals, AdamW and the double-precision reductions (nn.h). The layers live
// in nn_cpu_layers.cc, nn_cpu_attention.cc and nn_cpu_linear.cc.
#include "kernels/nn_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "kernels/nn_cpu_internal.h"
#include "kernels/philox.h"

namespace keel {

using cpu_internal::CheckMin;
using cpu_internal::CheckPtr;
using cpu_internal::CheckPtrs;

namespace {

constexpr size_t kAlignment = 256;
// Elementwise loops hand out pieces of at least this many floats: below it the
// pool's wake-up costs more than the work.
constexpr int64_t kGrain = 1 << 14;
// Reductions sum fixed 64 Ki-element chunks in double and add the chunks in
// order: the same bits for any thread count.
constexpr int64_t kReduceChunk = 1 << 16;

}  // namespace

Status MakeCpuBackend(int threads, std::unique_ptr<Backend>* out) {
  if (out == nullptr) return Status::Error("MakeCpuBackend: out: null is not allowed");
  if (threads < 0)
    return Status::Error("threads: " + std::to_string(threads) +
                         " is not allowed; need >= 1, or 0 for the hardware concurrency");
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  out->reset(new CpuBackend(threads));
  return Status::Ok();
}

CpuBackend::CpuBackend(int threads) : pool_(threads) {}

std::string CpuBackend::Describe() const {
  int threads = pool_.threads();
  return "cpu: " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
}

// ---- Memory -------------------------------------------------------------------

Status CpuBackend::Alloc(size_t bytes, void** ptr) {
  if (ptr == nullptr) return Status::Error("Alloc: ptr: null is not allowed");
  // aligned_alloc wants a multiple of the alignment; 0 bytes still gets a
  // distinct pointer so that Free and pointer comparisons behave.
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  if (rounded < bytes)
    return Status::Error("Alloc: bytes: " + std::to_string(bytes) + " is too large");
  void* memory = std::aligned_alloc(kAlignment, rounded);
  if (memory == nullptr)
    return Status::Error("Alloc: bytes: " + std::to_string(bytes) +
                         " could not be allocated (out of host memory)");
  std::memset(memory, 0, rounded);
  *ptr = memory;
  return Status::Ok();
}

void CpuBackend::Free(void* ptr) { std::free(ptr); }

Status CpuBackend::Upload(void* dst, const void* host_src, size_t bytes) {
  return CopyBytes(dst, host_src, bytes);
}

Status CpuBackend::Download(void* host_dst, const void* src, size_t bytes) {
  return CopyBytes(host_dst, src, bytes);
}

Status CpuBackend::CopyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (dst == nullptr || src == nullptr)
    return Status::Error("CopyBytes: a null pointer is not allowed for " + std::to_string(bytes) +
                         " bytes");
  std::memcpy(dst, src, bytes);
  return Status::Ok();
}

Status CpuBackend::Fill(float* x, int64_t count, float value) {
  KEEL_RETURN_IF_ERROR(CheckMin("Fill", "count", count, 0));
  KEEL_RETURN_IF_ERROR(CheckPtr("Fill", "x", x, count));
  pool_.ParallelRange(count, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] = value;
  });
  return Status::Ok();
}

// ---- Elementwise ----------------------------------------------------------------

Status CpuBackend::Add(const float* a, const float* b, float* out, int64_t count) {
  KEEL_RETURN_IF_ERROR(CheckMin("Add", "count", count, 0));
  KEEL_RETURN_IF_ERROR(CheckPtrs("Add", {{"a", a}, {"b", b}, {"out", out}}, count));
  pool_.ParallelRange(count, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
  });
  return Status::Ok();
}

Status CpuBackend::Axpy(float alpha, const float* x, float* y, int64_t count) {
  KEEL_RETURN_IF_ERROR(CheckMin("Axpy", "count", count, 0));
  KEEL_RETURN_IF_ERROR(CheckPtrs("Axpy", {{"x", x}, {"y", y}}, count));
  pool_.ParallelRange(count, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] += alpha * x[i];
  });
  return Status::Ok();
}

Status CpuBackend::Scale(float* x, int64_t count, float alpha) {
  KEEL_RETURN_IF_ERROR(CheckMin("Scale", "count", count, 0));
  KEEL_RETURN_IF_ERROR(CheckPtr("Scale", "x", x, count));
  pool_.ParallelRange(count, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] *= alpha;
  });
  return Status::Ok();
}

Status CpuBackend::Copy2D(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                          int64_t rows, int64_t cols) {
  KEEL_RETURN_IF_ERROR(CheckMin("Copy2D", "rows", rows, 0));
  KEEL_RETURN_IF_ERROR(CheckMin("Copy2D", "cols", cols, 0));
  if (rows == 0 || cols == 0) return Status::Ok();
  KEEL_RETURN_IF_ERROR(CheckMin("Copy2D", "src_ld", src_ld, cols));
  KEEL_RETURN_IF_ERROR(CheckMin("Copy2D", "dst_ld", dst_ld, cols));
  KEEL_RETURN_IF_ERROR(CheckPtrs("Copy2D", {{"src", src}, {"dst", dst}}));
  pool_.ParallelRange(rows, std::max<int64_t>(1, kGrain / cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      std::memcpy(dst + r * dst_ld, src + r * src_ld, sizeof(float) * cols);
  });
  return Status::Ok();
}

Status CpuBackend::RandomNormal(float* x, int64_t count, uint64_t seed, uint64_t offset,
                                float stddev) {
  KEEL_RETURN_IF_ERROR(CheckMin("RandomNormal", "count", count, 0));
  KEEL_RETURN_IF_ERROR(CheckPtr("RandomNormal", "x", x, count));
  const float two_pi = 6.28318530717958647692f;
  pool_.ParallelRange(count, kGrain / 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // Box-Muller as nn.h writes it; 1 - u keeps the logarithm's argument in (0, 1].
      uint64_t pair = 2 * (offset + static_cast<uint64_t>(i));
      float u1 = 1.0f - PhiloxUniform(seed, pair);
      float u2 = PhiloxUniform(seed, pair + 1);
      float z = std::sqrt(-2.0f * std::log(u1)) * std::cos(two_pi * u2);
      x[i] = stddev * z;
    }
  });
  return Status::Ok();
}

// ---- Optimizer --------------------------------------------------------------------

Status CpuBackend::AdamW(float* param, const float* grad, float* m, float* v, int64_t count,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         int step, float grad_scale) {
  KEEL_RETURN_IF_ERROR(CheckMin("AdamW", "count", count, 0));
  KEEL_RETURN_IF_ERROR(CheckMin("AdamW", "step", step, 1));
  KEEL_RETURN_IF_ERROR(CheckPtrs("AdamW", {{"param", param}, {"grad", grad}, {"m", m},
                                           {"v", v}}, count));
  // The bias corrections in double (beta2^t for large t loses digits in float),
  // rounded once; everything per element is fp32.
  const float correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step));
  const float correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step));
  pool_.ParallelRange(count, kGrain / 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float g = grad[i] * grad_scale;
      float mi = beta1 * m[i] + (1.0f - beta1) * g;
      float vi = beta2 * v[i] + (1.0f - beta2) * (g * g);
      m[i] = mi;
      v[i] = vi;
      float m_hat = mi / correction1;
      float v_hat = vi / correction2;
      param[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * param[i]);
    }
  });
  return Status::Ok();
}

// ---- Reductions ---------------------------------------------------------------------

namespace {

enum class ReduceKind { kSum, kSumSquares, kDot };

// out[i] = the reduction of a[i] (and b[i] for kDot). Each span is cut into
// kReduceChunk pieces summed in double in index order; the pieces' partial
// sums are added in order afterwards.
Status Reduce(ThreadPool* pool, const char* op, ReduceKind kind, const std::vector<Span>& a,
              const std::vector<Span>* b, std::vector<double>* out) {
  if (out == nullptr) return Status::Error(std::string(op) + ": out: null is not allowed");
  if (b != nullptr && b->size() != a.size())
    return Status::Error(std::string(op) + ": b: " + std::to_string(b->size()) +
                         " spans is not allowed; need as many as a (" + std::to_string(a.size()) +
                         ")");
  struct Chunk {
    size_t span;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (size_t s = 0; s < a.size(); ++s) {
    const std::string field = "spans[" + std::to_string(s) + "].count";
    KEEL_RETURN_IF_ERROR(CheckMin(op, field.c_str(), a[s].count, 0));
    KEEL_RETURN_IF_ERROR(CheckPtr(op, "spans[].data", a[s].data, a[s].count));
    if (b != nullptr) {
      if ((*b)[s].count != a[s].count)
        return Status::Error(std::string(op) + ": b[" + std::to_string(s) + "].count: " +
                             std::to_string((*b)[s].count) + " is not allowed; need a[" +
                             std::to_string(s) + "].count (" + std::to_string(a[s].count) + ")");
      KEEL_RETURN_IF_ERROR(CheckPtr(op, "b[].data", (*b)[s].data, (*b)[s].count));
    }
    for (int64_t begin = 0; begin < a[s].count; begin += kReduceChunk)
      chunks.push_back({s, begin, std::min(a[s].count, begin + kReduceChunk)});
  }
  std::vector<double> partial(chunks.size(), 0.0);
  pool->ParallelFor(static_cast<int64_t>(chunks.size()), [&](int64_t c, int) {
    const Chunk& chunk = chunks[c];
    const float* x = a[chunk.span].data;
    double sum = 0.0;
    if (kind == ReduceKind::kSum) {
      for (int64_t i = chunk.begin; i < chunk.end; ++i) sum += x[i];
    } else if (kind == ReduceKind::kSumSquares) {
      for (int64_t i = chunk.begin; i < chunk.end; ++i) sum += static_cast<double>(x[i]) * x[i];
    } else {
      const float* y = (*b)[chunk.span].data;
      for (int64_t i = chunk.begin; i < chunk.end; ++i) sum += static_cast<double>(x[i]) * y[i];
    }
    partial[c] = sum;
  });
  out->assign(a.size(), 0.0);
  for (size_t c = 0; c < chunks.size(); ++c) (*out)[chunks[c].span] += partial[c];
  return Status::Ok();
}

}  // namespace

Status CpuBackend::SumSquares(const std::vector<Span>& spans, std::vector<double>* out) {
  return Reduce(&pool_, "SumSquares", ReduceKind::kSumSquares, spans, nullptr, out);
}

Status CpuBackend::Sums(const std::vector<Span>& spans, std::vector<double>* out) {
  return Reduce(&pool_, "Sums", ReduceKind::kSum, spans, nullptr, out);
}

Status CpuBackend::Dots(const std::vector<Span>& a, const std::vector<Span>& b,
                        std::vector<double>* out) {
  return Reduce(&pool_, "Dots", ReduceKind::kDot, a, &b, out);
}

}  // namespace keel
