// CpuBackend's causal multi-head softmax attention (nn.h), forward and
// backward. One task per (batch, head): it gathers its head's q, k and v into
// contiguous seq x hd matrices and writes only its own columns of the outputs,
// so no sum is split between threads.
//
// bf16_operands rounds the operands of every product to bf16 (nearest even),
// accumulating in fp32, and nothing else:
//   forward   S = q . k^T      q, k rounded
//             O = P . v        P (the fp32 softmax) and v rounded
//   backward  dP = dO . v^T    dO and v rounded
//             dV = P^T . dO    P and dO rounded
//             dQ = dS . k      dS and k rounded
//             dK = dS^T . q    dS and q rounded
// The softmax and its statistics (m, 1 / l), the backward's P (recomputed from
// them exactly as the forward computed it), D = dout . out (from the unrounded
// fp32 dout and out), dS = P * (dP - D) and the 1/sqrt(hd) scale (applied to
// the fp32 sums S, dQ and dK) stay fp32.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/formats.h"
#include "kernels/nn_cpu.h"
#include "kernels/nn_cpu_internal.h"

namespace keel {

using cpu_internal::CheckPositive;
using cpu_internal::CheckPtrs;

namespace {

float RoundBf16(float x) { return Bf16ToFloat(FloatToBf16(x, Rounding::kNearestEven, 0.0f)); }

Status CheckAttentionShape(const char* op, int64_t batch, int64_t seq, int64_t heads, int64_t dim) {
  KEEL_RETURN_IF_ERROR(CheckPositive(op, {{"batch", batch}, {"seq", seq}, {"heads", heads},
                                          {"dim", dim}}));
  if (dim % heads != 0)
    return Status::Error(std::string(op) + ": heads: " + std::to_string(heads) +
                         " is not allowed; it must divide dim (" + std::to_string(dim) + ")");
  return Status::Ok();
}

// Copies column block `column0 .. column0 + hd` of rows b*seq .. b*seq + seq of
// a matrix with row stride `ld` into dst (seq x hd), rounded to bf16 when asked.
void Gather(const float* src, int64_t ld, int64_t b, int64_t seq, int64_t column0, int64_t hd,
            bool bf16, float* dst) {
  for (int64_t t = 0; t < seq; ++t) {
    const float* row = src + (b * seq + t) * ld + column0;
    for (int64_t d = 0; d < hd; ++d) dst[t * hd + d] = bf16 ? RoundBf16(row[d]) : row[d];
  }
}

// s_j = (q_t . k_j) * scale for j <= t (q, k: seq x hd).
float Score(const float* q, const float* k, int64_t t, int64_t j, int64_t hd, float scale) {
  const float* qt = q + t * hd;
  const float* kj = k + j * hd;
  float dot = 0.0f;
  for (int64_t d = 0; d < hd; ++d) dot += qt[d] * kj[d];
  return dot * scale;
}

// Row t's softmax over j <= t into p[0 .. t], with its max m and 1 / l.
void Probabilities(const float* q, const float* k, int64_t t, int64_t hd, float scale, float* m,
                   float* inv_sum, float* p) {
  float max = -INFINITY;
  for (int64_t j = 0; j <= t; ++j) {
    p[j] = Score(q, k, t, j, hd, scale);
    max = std::max(max, p[j]);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j <= t; ++j) sum += std::exp(p[j] - max);
  *m = max;
  *inv_sum = 1.0f / sum;
  for (int64_t j = 0; j <= t; ++j) p[j] = std::exp(p[j] - max) * *inv_sum;
}

// Row t's P from its stats, as Probabilities computed it.
void Recompute(const float* q, const float* k, int64_t t, int64_t hd, float scale, float m,
               float inv_sum, float* p) {
  for (int64_t j = 0; j <= t; ++j) p[j] = std::exp(Score(q, k, t, j, hd, scale) - m) * inv_sum;
}

}  // namespace

Status CpuBackend::AttentionForward(const float* qkv, float* out, float* stats, int64_t batch,
                                    int64_t seq, int64_t heads, int64_t dim, bool bf16_operands) {
  static const char kOp[] = "AttentionForward";
  KEEL_RETURN_IF_ERROR(CheckAttentionShape(kOp, batch, seq, heads, dim));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"qkv", qkv}, {"out", out}, {"stats", stats}}));
  const int64_t hd = dim / heads;
  const int64_t ld = 3 * dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  pool_.ParallelFor(batch * heads, [&](int64_t task, int) {
    const int64_t b = task / heads, h = task % heads;
    std::vector<float> q(seq * hd), k(seq * hd), v(seq * hd), o(hd), p(seq);
    Gather(qkv, ld, b, seq, h * hd, hd, bf16_operands, q.data());
    Gather(qkv, ld, b, seq, dim + h * hd, hd, bf16_operands, k.data());
    Gather(qkv, ld, b, seq, 2 * dim + h * hd, hd, bf16_operands, v.data());
    for (int64_t t = 0; t < seq; ++t) {
      float* st = stats + 2 * (task * seq + t);
      Probabilities(q.data(), k.data(), t, hd, scale, &st[0], &st[1], p.data());
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t j = 0; j <= t; ++j) {
        const float pj = bf16_operands ? RoundBf16(p[j]) : p[j];
        const float* vj = &v[j * hd];
        for (int64_t d = 0; d < hd; ++d) o[d] += pj * vj[d];
      }
      std::copy(o.begin(), o.end(), out + (b * seq + t) * dim + h * hd);
    }
  });
  return Status::Ok();
}

Status CpuBackend::AttentionBackward(const float* qkv, const float* out, const float* stats,
                                     const float* dout, float* dqkv, int64_t batch, int64_t seq,
                                     int64_t heads, int64_t dim, bool bf16_operands) {
  static const char kOp[] = "AttentionBackward";
  KEEL_RETURN_IF_ERROR(CheckAttentionShape(kOp, batch, seq, heads, dim));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"qkv", qkv}, {"out", out}, {"stats", stats},
                                       {"dout", dout}, {"dqkv", dqkv}}));
  const int64_t hd = dim / heads;
  const int64_t ld = 3 * dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  pool_.ParallelFor(batch * heads, [&](int64_t task, int) {
    const int64_t b = task / heads, h = task % heads;
    const int64_t n = seq * hd;
    std::vector<float> q(n), k(n), v(n), dO(n), dQ(hd), dK(n, 0.0f), dV(n, 0.0f), p(seq), dS(seq);
    Gather(qkv, ld, b, seq, h * hd, hd, bf16_operands, q.data());
    Gather(qkv, ld, b, seq, dim + h * hd, hd, bf16_operands, k.data());
    Gather(qkv, ld, b, seq, 2 * dim + h * hd, hd, bf16_operands, v.data());
    Gather(dout, dim, b, seq, h * hd, hd, bf16_operands, dO.data());
    for (int64_t t = 0; t < seq; ++t) {
      const float* st = stats + 2 * (task * seq + t);
      Recompute(q.data(), k.data(), t, hd, scale, st[0], st[1], p.data());
      // D = dout_t . out_t from the unrounded fp32 values.
      const float* dout_t = dout + (b * seq + t) * dim + h * hd;
      const float* out_t = out + (b * seq + t) * dim + h * hd;
      float delta = 0.0f;
      for (int64_t d = 0; d < hd; ++d) delta += dout_t[d] * out_t[d];
      const float* dOt = &dO[t * hd];
      // dP_tj = dO_t . v_j, dS_tj = P_tj (dP_tj - D) and dV_j += P_tj dO_t (j <= t).
      for (int64_t j = 0; j <= t; ++j) {
        const float* vj = &v[j * hd];
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; ++d) dot += dOt[d] * vj[d];
        const float ds = p[j] * (dot - delta);
        dS[j] = bf16_operands ? RoundBf16(ds) : ds;
        const float pj = bf16_operands ? RoundBf16(p[j]) : p[j];
        float* dVj = &dV[j * hd];
        for (int64_t d = 0; d < hd; ++d) dVj[d] += pj * dOt[d];
      }
      // dQ_t = scale * sum_j dS_tj k_j, dK_j += dS_tj q_t.
      std::fill(dQ.begin(), dQ.end(), 0.0f);
      const float* qt = &q[t * hd];
      for (int64_t j = 0; j <= t; ++j) {
        const float* kj = &k[j * hd];
        float* dKj = &dK[j * hd];
        for (int64_t d = 0; d < hd; ++d) {
          dQ[d] += dS[j] * kj[d];
          dKj[d] += dS[j] * qt[d];
        }
      }
      float* dq_row = dqkv + (b * seq + t) * ld + h * hd;
      for (int64_t d = 0; d < hd; ++d) dq_row[d] = dQ[d] * scale;
    }
    for (int64_t t = 0; t < seq; ++t) {
      float* dk_row = dqkv + (b * seq + t) * ld + dim + h * hd;
      float* dv_row = dk_row + dim;
      for (int64_t d = 0; d < hd; ++d) {
        dk_row[d] = dK[t * hd + d] * scale;
        dv_row[d] = dV[t * hd + d];
      }
    }
  });
  return Status::Ok();
}

}  // namespace keel
