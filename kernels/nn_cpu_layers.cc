// CpuBackend's pointwise and per-row layers (nn.h): layernorm, RMSNorm, RoPE,
// exact GELU, SwiGLU, token + position embedding and softmax cross-entropy,
// forward and backward. Row statistics (layernorm's mean and variance, RMSNorm's
// mean square, the softmax's
// normaliser) are summed in double in index order; everything per element is
// fp32. Sums over rows (dgamma, dbeta, the embedding gradients) are split
// across threads by column, so each one still runs over the rows in order.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/formats.h"
#include "kernels/nn_cpu.h"
#include "kernels/nn_cpu_internal.h"

namespace keel {

using cpu_internal::CheckMin;
using cpu_internal::CheckPositive;
using cpu_internal::CheckPtr;
using cpu_internal::CheckPtrs;

namespace {

// Rows (or elements) per piece handed to a thread: enough work to pay for the hand-off.
int64_t RowGrain(int64_t cols) { return std::max<int64_t>(1, 8192 / std::max<int64_t>(cols, 1)); }
constexpr int64_t kElementGrain = 4096;
constexpr float kSqrt2 = 1.41421356237309504880f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // 1 / sqrt(2 pi)

}  // namespace

// ---- LayerNorm ----------------------------------------------------------------------

// Producers that hand a linear layer its x in bf16 (LinearQuant::x_bf16) round
// the values they computed in fp32, as that layer's BF16 rounding would have.
void CpuBackend::RoundToBf16(const float* values, int64_t count, uint16_t* out) {
  pool_.ParallelRange(count, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = FloatToBf16(values[i], Rounding::kNearestEven, 0.0f);
  });
}

Status CpuBackend::LayerNormForwardBf16(const float* x, const float* gamma, const float* beta, uint16_t* y,
                                        float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  static const char kOp[] = "LayerNormForwardBf16";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"cols", cols}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"y", y}}));
  std::vector<float> values(static_cast<size_t>(rows * cols));
  KEEL_RETURN_IF_ERROR(LayerNormForward(x, gamma, beta, values.data(), mean, rstd, rows, cols, eps));
  RoundToBf16(values.data(), rows * cols, y);
  return Status::Ok();
}

Status CpuBackend::LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                                    float* mean, float* rstd, int64_t rows, int64_t cols,
                                    float eps) {
  static const char kOp[] = "LayerNormForward";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"cols", cols}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"gamma", gamma}, {"y", y}, {"mean", mean},
                                       {"rstd", rstd}}));
  if (!(eps >= 0.0f))
    return Status::Error(std::string(kOp) + ": eps: " + std::to_string(eps) +
                         " is not allowed; need >= 0");
  pool_.ParallelRange(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      double sum = 0.0;
      for (int64_t c = 0; c < cols; ++c) sum += xr[c];
      const float m = static_cast<float>(sum / cols);
      // Two passes (population variance around the rounded mean): no cancellation.
      double squares = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        double d = static_cast<double>(xr[c]) - m;
        squares += d * d;
      }
      const float var = static_cast<float>(squares / cols);
      const float s = 1.0f / std::sqrt(var + eps);
      for (int64_t c = 0; c < cols; ++c) {
        float normalized = (xr[c] - m) * s;
        yr[c] = beta != nullptr ? normalized * gamma[c] + beta[c] : normalized * gamma[c];
      }
      mean[r] = m;
      rstd[r] = s;
    }
  });
  return Status::Ok();
}

Status CpuBackend::LayerNormBackward(const float* x, const float* gamma, const float* mean,
                                     const float* rstd, const float* dy, float* dx, float* dgamma,
                                     float* dbeta, int64_t rows, int64_t cols) {
  static const char kOp[] = "LayerNormBackward";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"cols", cols}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"gamma", gamma}, {"mean", mean}, {"rstd", rstd},
                                       {"dy", dy}, {"dx", dx}, {"dgamma", dgamma}}));
  // dx, per row: with n = (x - mean) * rstd and g = dy * gamma,
  // dx += (g - mean(g) - n * mean(g * n)) * rstd.
  pool_.ParallelRange(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      float* dxr = dx + r * cols;
      const float m = mean[r], s = rstd[r];
      double g_sum = 0.0, gn_sum = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        float n = (xr[c] - m) * s;
        float g = dyr[c] * gamma[c];
        g_sum += g;
        gn_sum += static_cast<double>(g) * n;
      }
      const float g_mean = static_cast<float>(g_sum / cols);
      const float gn_mean = static_cast<float>(gn_sum / cols);
      for (int64_t c = 0; c < cols; ++c) {
        float n = (xr[c] - m) * s;
        float g = dyr[c] * gamma[c];
        dxr[c] += ((g - g_mean) - n * gn_mean) * s;
      }
    }
  });
  // dgamma += sum over rows of dy * n, dbeta += sum over rows of dy; split by column.
  pool_.ParallelRange(cols, 64, [&](int64_t begin, int64_t end) {
    const int64_t width = end - begin;
    std::vector<float> g_acc(width, 0.0f), b_acc(width, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols + begin;
      const float* dyr = dy + r * cols + begin;
      const float m = mean[r], s = rstd[r];
      for (int64_t c = 0; c < width; ++c) {
        float n = (xr[c] - m) * s;
        g_acc[c] += dyr[c] * n;
        b_acc[c] += dyr[c];
      }
    }
    for (int64_t c = 0; c < width; ++c) {
      dgamma[begin + c] += g_acc[c];
      if (dbeta != nullptr) dbeta[begin + c] += b_acc[c];
    }
  });
  return Status::Ok();
}

// ---- RMSNorm ------------------------------------------------------------------------

Status CpuBackend::RmsNormForward(const float* x, const float* gain, float* y, float* rstd,
                                  int64_t rows, int64_t cols, float eps) {
  static const char kOp[] = "RmsNormForward";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"cols", cols}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"gain", gain}, {"y", y}, {"rstd", rstd}}));
  if (!(eps >= 0.0f))
    return Status::Error(std::string(kOp) + ": eps: " + std::to_string(eps) +
                         " is not allowed; need >= 0");
  pool_.ParallelRange(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      double squares = 0.0;
      for (int64_t c = 0; c < cols; ++c) squares += static_cast<double>(xr[c]) * xr[c];
      const float mean_square = static_cast<float>(squares / cols);
      const float s = 1.0f / std::sqrt(mean_square + eps);
      for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] * s * gain[c];
      rstd[r] = s;
    }
  });
  return Status::Ok();
}

Status CpuBackend::RmsNormBackward(const float* x, const float* gain, const float* rstd,
                                   const float* dy, float* dx, float* dgain, int64_t rows,
                                   int64_t cols) {
  static const char kOp[] = "RmsNormBackward";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"cols", cols}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"gain", gain}, {"rstd", rstd}, {"dy", dy},
                                       {"dx", dx}, {"dgain", dgain}}));
  // dx, per row: with xhat = x * rstd and g = dy * gain (d y / d x through rstd
  // is -rstd^3 x / cols), dx += (g - xhat * mean(g * xhat)) * rstd.
  pool_.ParallelRange(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      float* dxr = dx + r * cols;
      const float s = rstd[r];
      double gx_sum = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        float xhat = xr[c] * s;
        float g = dyr[c] * gain[c];
        gx_sum += static_cast<double>(g) * xhat;
      }
      const float gx_mean = static_cast<float>(gx_sum / cols);
      for (int64_t c = 0; c < cols; ++c) {
        float xhat = xr[c] * s;
        float g = dyr[c] * gain[c];
        dxr[c] += (g - xhat * gx_mean) * s;
      }
    }
  });
  // dgain += sum over rows of dy * xhat; split by column, rows in order.
  pool_.ParallelRange(cols, 64, [&](int64_t begin, int64_t end) {
    const int64_t width = end - begin;
    std::vector<float> acc(width, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols + begin;
      const float* dyr = dy + r * cols + begin;
      const float s = rstd[r];
      for (int64_t c = 0; c < width; ++c) acc[c] += dyr[c] * (xr[c] * s);
    }
    for (int64_t c = 0; c < width; ++c) dgain[begin + c] += acc[c];
  });
  return Status::Ok();
}

// ---- RoPE -----------------------------------------------------------------------------

namespace {

// RopeForward (sign +1) or RopeBackward (sign -1, the rotation by minus the angle).
Status RopeRows(ThreadPool& pool, const char* op, const float* x, float* y, const float* cos,
                const float* sin, int64_t batch, int64_t seq, int64_t heads, int64_t hd, int64_t ld,
                bool inverse) {
  KEEL_RETURN_IF_ERROR(CheckPositive(op, {{"batch", batch}, {"seq", seq}, {"heads", heads}, {"hd", hd}}));
  if (hd % 2 != 0)
    return Status::Error(std::string(op) + ": hd: " + std::to_string(hd) +
                         " is not allowed; need an even head size");
  KEEL_RETURN_IF_ERROR(CheckMin(op, "ld", ld, heads * hd));
  KEEL_RETURN_IF_ERROR(CheckPtrs(op, {{"x", x}, {"y", y}, {"cos", cos}, {"sin", sin}}));
  const int64_t half = hd / 2;
  pool.ParallelRange(batch * seq, RowGrain(heads * hd), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* c_row = cos + (r % seq) * half;
      const float* s_row = sin + (r % seq) * half;
      for (int64_t h = 0; h < heads; ++h) {
        const float* xh = x + r * ld + h * hd;
        float* yh = y + r * ld + h * hd;
        for (int64_t i = 0; i < half; ++i) {
          const float a = xh[i], b = xh[i + half], c = c_row[i], s = s_row[i];
          // Both outputs from a and b read first: y may alias x.
          if (inverse) {
            yh[i] = a * c + b * s;
            yh[i + half] = b * c - a * s;
          } else {
            yh[i] = a * c - b * s;
            yh[i + half] = b * c + a * s;
          }
        }
      }
    }
  });
  return Status::Ok();
}

}  // namespace

Status CpuBackend::RopeForward(const float* x, float* y, const float* cos, const float* sin,
                               int64_t batch, int64_t seq, int64_t heads, int64_t hd, int64_t ld) {
  return RopeRows(pool_, "RopeForward", x, y, cos, sin, batch, seq, heads, hd, ld, false);
}

Status CpuBackend::RopeBackward(const float* dy, float* dx, const float* cos, const float* sin,
                                int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                                int64_t ld) {
  return RopeRows(pool_, "RopeBackward", dy, dx, cos, sin, batch, seq, heads, hd, ld, true);
}

// ---- GELU -----------------------------------------------------------------------------

Status CpuBackend::GeluForward(const float* x, float* y, int64_t count) {
  static const char kOp[] = "GeluForward";
  KEEL_RETURN_IF_ERROR(CheckMin(kOp, "count", count, 0));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"y", y}}, count));
  pool_.ParallelRange(count, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float v = x[i];
      y[i] = v * 0.5f * (1.0f + std::erf(v / kSqrt2));
    }
  });
  return Status::Ok();
}

Status CpuBackend::GeluForwardBf16(const float* x, uint16_t* y, int64_t count) {
  static const char kOp[] = "GeluForwardBf16";
  KEEL_RETURN_IF_ERROR(CheckMin(kOp, "count", count, 0));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"y", y}}, count));
  std::vector<float> values(static_cast<size_t>(count));
  KEEL_RETURN_IF_ERROR(GeluForward(x, values.data(), count));
  RoundToBf16(values.data(), count, y);
  return Status::Ok();
}

Status CpuBackend::GeluBackward(const float* x, const float* dy, float* dx, int64_t count) {
  static const char kOp[] = "GeluBackward";
  KEEL_RETURN_IF_ERROR(CheckMin(kOp, "count", count, 0));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"dy", dy}, {"dx", dx}}, count));
  pool_.ParallelRange(count, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // gelu'(x) = Phi(x) + x * phi(x), Phi the normal CDF and phi its density.
      float v = x[i];
      float cdf = 0.5f * (1.0f + std::erf(v / kSqrt2));
      float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
      dx[i] = dy[i] * (cdf + v * pdf);
    }
  });
  return Status::Ok();
}

// ---- SwiGLU ---------------------------------------------------------------------------

Status CpuBackend::GeluBackwardBf16(const float* x, const float* dy, uint16_t* dx, int64_t rows, int64_t cols,
                                    float* column_sums) {
  static const char kOp[] = "GeluBackwardBf16";
  KEEL_RETURN_IF_ERROR(CheckMin(kOp, "rows", rows, 0));
  KEEL_RETURN_IF_ERROR(CheckMin(kOp, "cols", cols, 0));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"dx", dx}}, rows * cols));
  std::vector<float> values(static_cast<size_t>(rows * cols));
  KEEL_RETURN_IF_ERROR(GeluBackward(x, dy, values.data(), rows * cols));
  if (column_sums != nullptr) AddColumnSums(values.data(), rows, cols, column_sums);
  RoundToBf16(values.data(), rows * cols, dx);
  return Status::Ok();
}

Status CpuBackend::SwigluForward(const float* x, float* y, int64_t rows, int64_t h) {
  static const char kOp[] = "SwigluForward";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"h", h}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"y", y}}));
  pool_.ParallelRange(rows, RowGrain(h), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = x + r * 2 * h;
      const float* up = gate + h;
      float* yr = y + r * h;
      for (int64_t c = 0; c < h; ++c) {
        float a = gate[c];
        yr[c] = a / (1.0f + std::exp(-a)) * up[c];
      }
    }
  });
  return Status::Ok();
}

Status CpuBackend::SwigluBackward(const float* x, const float* dy, float* dx, int64_t rows,
                                  int64_t h) {
  static const char kOp[] = "SwigluBackward";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"h", h}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"dy", dy}, {"dx", dx}}));
  pool_.ParallelRange(rows, RowGrain(h), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = x + r * 2 * h;
      const float* up = gate + h;
      const float* dyr = dy + r * h;
      float* dgate = dx + r * 2 * h;
      float* dup = dgate + h;
      for (int64_t c = 0; c < h; ++c) {
        // silu'(a) = sigmoid(a) * (1 + a * (1 - sigmoid(a))).
        float a = gate[c];
        float sigmoid = 1.0f / (1.0f + std::exp(-a));
        float silu = a * sigmoid;
        dgate[c] = dyr[c] * up[c] * (sigmoid * (1.0f + a * (1.0f - sigmoid)));
        dup[c] = dyr[c] * silu;
      }
    }
  });
  return Status::Ok();
}

// ---- Embedding --------------------------------------------------------------------------

namespace {

// What both embedding passes check, in this order: the sizes, the pointers
// (tokens first), then the token ids (nn.h passes no vocabulary size, so only
// negative ids can be caught here).
Status CheckEmbedding(const char* op, const int32_t* tokens, int64_t batch, int64_t seq, int64_t dim,
                      std::initializer_list<std::pair<const char*, const void*>> arrays) {
  KEEL_RETURN_IF_ERROR(CheckPositive(op, {{"batch", batch}, {"seq", seq}, {"dim", dim}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(op, {{"tokens", tokens}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(op, arrays));
  for (int64_t i = 0; i < batch * seq; ++i) {
    if (tokens[i] < 0)
      return Status::Error(std::string(op) + ": tokens[" + std::to_string(i) + "]: " +
                           std::to_string(tokens[i]) + " is not allowed; need a token id >= 0");
  }
  return Status::Ok();
}

}  // namespace

Status CpuBackend::EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe,
                                    float* out, int64_t batch, int64_t seq, int64_t dim) {
  KEEL_RETURN_IF_ERROR(
      CheckEmbedding("EmbeddingForward", tokens, batch, seq, dim, {{"wte", wte}, {"out", out}}));
  pool_.ParallelRange(batch * seq, RowGrain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const float* token_row = wte + static_cast<int64_t>(tokens[bt]) * dim;
      float* o = out + bt * dim;
      if (wpe == nullptr) {
        std::copy(token_row, token_row + dim, o);
        continue;
      }
      const float* position_row = wpe + (bt % seq) * dim;
      for (int64_t c = 0; c < dim; ++c) o[c] = token_row[c] + position_row[c];
    }
  });
  return Status::Ok();
}

Status CpuBackend::EmbeddingBackward(const int32_t* tokens, const float* dout, float* dwte,
                                     float* dwpe, int64_t batch, int64_t seq, int64_t dim) {
  KEEL_RETURN_IF_ERROR(
      CheckEmbedding("EmbeddingBackward", tokens, batch, seq, dim, {{"dout", dout}, {"dwte", dwte}}));
  // A token may repeat, so rows of dwte are shared between positions: split by
  // column instead, and walk the positions in order within each column range.
  pool_.ParallelRange(dim, 64, [&](int64_t begin, int64_t end) {
    for (int64_t bt = 0; bt < batch * seq; ++bt) {
      const float* d = dout + bt * dim;
      float* token_row = dwte + static_cast<int64_t>(tokens[bt]) * dim;
      for (int64_t c = begin; c < end; ++c) token_row[c] += d[c];
      if (dwpe == nullptr) continue;
      float* position_row = dwpe + (bt % seq) * dim;
      for (int64_t c = begin; c < end; ++c) position_row[c] += d[c];
    }
  });
  return Status::Ok();
}

// ---- Cross-entropy ------------------------------------------------------------------------

namespace {

Status CheckCrossEntropy(const char* op, const float* logits, const int32_t* targets, int64_t rows,
                         int64_t padded_vocab, int64_t vocab) {
  KEEL_RETURN_IF_ERROR(CheckPositive(op, {{"rows", rows}, {"vocab", vocab}}));
  KEEL_RETURN_IF_ERROR(CheckMin(op, "padded_vocab", padded_vocab, vocab));
  KEEL_RETURN_IF_ERROR(CheckPtrs(op, {{"logits", logits}, {"targets", targets}}));
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] >= vocab)
      return Status::Error(std::string(op) + ": targets[" + std::to_string(r) +
                           "]: " + std::to_string(targets[r]) + " is not allowed; need < vocab (" +
                           std::to_string(vocab) + "), or < 0 to ignore the row");
  }
  return Status::Ok();
}

// The softmax normaliser of one row: max and sum of exp(logit - max) (the sum
// in double, in column order).
void SoftmaxStats(const float* row, int64_t vocab, float* max_out, double* sum_out) {
  float max = row[0];
  for (int64_t c = 1; c < vocab; ++c) max = std::max(max, row[c]);
  double sum = 0.0;
  for (int64_t c = 0; c < vocab; ++c) sum += std::exp(row[c] - max);
  *max_out = max;
  *sum_out = sum;
}

// One row of cross-entropy, the formulas of all three ops: *loss (when not
// null) = logsumexp - logit[target], formed in double and rounded once; d (when
// not null) = scale * (softmax - onehot(target)) in the first `vocab` columns, 0
// in the padding. An ignored row (target < 0) has loss 0 and d all 0. d may be
// row itself: the target's logit is read before the gradient, and each element
// is read before it is written.
void CrossEntropyRow(const float* row, int32_t target, int64_t padded_vocab, int64_t vocab,
                     float scale, float* loss, float* d) {
  if (target < 0) {
    if (loss != nullptr) *loss = 0.0f;
    if (d != nullptr) std::fill(d, d + padded_vocab, 0.0f);
    return;
  }
  float max;
  double sum;
  SoftmaxStats(row, vocab, &max, &sum);
  if (loss != nullptr)
    *loss = static_cast<float>(static_cast<double>(max) + std::log(sum) -
                               static_cast<double>(row[target]));
  if (d == nullptr) return;
  const float inv_sum = static_cast<float>(1.0 / sum);
  for (int64_t c = 0; c < vocab; ++c) {
    float p = std::exp(row[c] - max) * inv_sum;
    d[c] = scale * (c == target ? p - 1.0f : p);
  }
  std::fill(d + vocab, d + padded_vocab, 0.0f);
}

// CrossEntropyForward (dlogits null), CrossEntropyBackward (losses null) or
// both at once, a row at a time.
void CrossEntropyRows(ThreadPool& pool, const float* logits, const int32_t* targets,
                      float* losses, float* dlogits, int64_t rows, int64_t padded_vocab,
                      int64_t vocab, float scale) {
  pool.ParallelRange(rows, RowGrain(vocab), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      CrossEntropyRow(logits + r * padded_vocab, targets[r], padded_vocab, vocab, scale,
                      losses == nullptr ? nullptr : losses + r,
                      dlogits == nullptr ? nullptr : dlogits + r * padded_vocab);
    }
  });
}

}  // namespace

Status CpuBackend::CrossEntropyForward(const float* logits, const int32_t* targets, float* losses,
                                       int64_t rows, int64_t padded_vocab, int64_t vocab) {
  static const char kOp[] = "CrossEntropyForward";
  KEEL_RETURN_IF_ERROR(CheckCrossEntropy(kOp, logits, targets, rows, padded_vocab, vocab));
  KEEL_RETURN_IF_ERROR(CheckPtr(kOp, "losses", losses));
  CrossEntropyRows(pool_, logits, targets, losses, nullptr, rows, padded_vocab, vocab, 0.0f);
  return Status::Ok();
}

Status CpuBackend::CrossEntropyBackward(const float* logits, const int32_t* targets, float* dlogits,
                                        int64_t rows, int64_t padded_vocab, int64_t vocab,
                                        float scale) {
  static const char kOp[] = "CrossEntropyBackward";
  KEEL_RETURN_IF_ERROR(CheckCrossEntropy(kOp, logits, targets, rows, padded_vocab, vocab));
  KEEL_RETURN_IF_ERROR(CheckPtr(kOp, "dlogits", dlogits));
  CrossEntropyRows(pool_, logits, targets, nullptr, dlogits, rows, padded_vocab, vocab, scale);
  return Status::Ok();
}

Status CpuBackend::CrossEntropyFused(const float* logits, const int32_t* targets, float* losses,
                                     float* dlogits, int64_t rows, int64_t padded_vocab,
                                     int64_t vocab, float scale) {
  static const char kOp[] = "CrossEntropyFused";
  KEEL_RETURN_IF_ERROR(CheckCrossEntropy(kOp, logits, targets, rows, padded_vocab, vocab));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"losses", losses}, {"dlogits", dlogits}}));
  CrossEntropyRows(pool_, logits, targets, losses, dlogits, rows, padded_vocab, vocab, scale);
  return Status::Ok();
}

Status CpuBackend::CrossEntropyFusedBf16(const float* logits, const int32_t* targets, float* losses,
                                         uint16_t* dlogits, int64_t ld, int64_t rows, int64_t padded_vocab,
                                         int64_t vocab, float scale, int64_t row0) {
  static const char kOp[] = "CrossEntropyFusedBf16";
  KEEL_RETURN_IF_ERROR(CheckCrossEntropy(kOp, logits, targets, rows, padded_vocab, vocab));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"losses", losses}, {"dlogits", dlogits}}));
  if (ld < padded_vocab)
    return Status::Error(std::string(kOp) + ": ld: " + std::to_string(ld) + " is not allowed; need >= padded_vocab (" +
                         std::to_string(padded_vocab) + ")");
  if (row0 < 0 || (row0 > 0 && static_cast<const void*>(dlogits) == static_cast<const void*>(logits)))
    return Status::Error(std::string(kOp) + ": row0: " + std::to_string(row0) +
                         " is not allowed; need >= 0, and 0 when dlogits is logits");
  dlogits += row0 * ld;
  // Each row's gradient goes through a row of its own before it is rounded, so
  // dlogits may hold row r in logits' row r (ld = 2 padded_vocab).
  pool_.ParallelRange(rows, RowGrain(vocab), [&](int64_t begin, int64_t end) {
    std::vector<float> d(static_cast<size_t>(padded_vocab));
    for (int64_t r = begin; r < end; ++r) {
      CrossEntropyRow(logits + r * padded_vocab, targets[r], padded_vocab, vocab, scale, losses + r, d.data());
      uint16_t* out = dlogits + r * ld;
      for (int64_t c = 0; c < padded_vocab; ++c) out[c] = FloatToBf16(d[c], Rounding::kNearestEven, 0.0f);
    }
  });
  return Status::Ok();
}

}  // namespace keel
