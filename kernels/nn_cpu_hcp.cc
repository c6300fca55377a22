// CpuBackend's Hot-Channel Patch (docs/hcp.md): scores, the top-k choice, and
// the patch columns the linear layer's GEMMs add, all in fp32 on the values
// PrepareOperand gives the GEMM (so k = 0 is the unpatched call, bit for bit).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/gemm_cpu.h"
#include "kernels/nn_cpu.h"
#include "kernels/nn_cpu_internal.h"
#include "kernels/quantize.h"

namespace keel {

using cpu_internal::CheckPositive;
using cpu_internal::CheckPtrs;

// score_j (j < k_count) = mean_i |A(i, j) - Q(A)(i, j)| + mean_n |B(n, j) - Q(B)(n, j)|,
// each mean a double sum in index order.
void CpuBackend::HcpScoresOf(const HcpSide& a, const HcpSide& b, int64_t k_count, float* scores) {
  pool_.ParallelRange(k_count, 16, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      double sa = 0.0, sb = 0.0;
      for (int64_t i = 0; i < a.n; ++i) sa += std::fabs(static_cast<double>(a.At(i, j)) - a.Q(i, j));
      for (int64_t i = 0; i < b.n; ++i) sb += std::fabs(static_cast<double>(b.At(i, j)) - b.Q(i, j));
      scores[j] = static_cast<float>(sa / static_cast<double>(a.n) + sb / static_cast<double>(b.n));
    }
  });
}

// c (a.n x b.n, row stride ldc) += [dA_H | Q(A)_H] . [B_H | dB_H]^T over the
// contraction indices hot[0..k): the patch of docs/hcp.md, in fp32, after the
// unpatched product is in c.
void CpuBackend::AddHcpPatch(const HcpSide& a, const HcpSide& b, const int32_t* hot, int32_t k, float* c,
                             int64_t ldc) {
  if (k == 0) return;
  const int64_t w = 2 * static_cast<int64_t>(k);
  std::vector<float> pa(static_cast<size_t>(a.n * w)), pb(static_cast<size_t>(b.n * w));
  for (int64_t i = 0; i < a.n; ++i) {
    for (int32_t h = 0; h < k; ++h) {
      const float qa = a.Q(i, hot[h]);
      pa[i * w + h] = a.At(i, hot[h]) - qa;
      pa[i * w + k + h] = qa;
    }
  }
  for (int64_t i = 0; i < b.n; ++i) {
    for (int32_t h = 0; h < k; ++h) {
      const float bv = b.At(i, hot[h]);
      pb[i * w + h] = bv;
      pb[i * w + k + h] = bv - b.Q(i, hot[h]);
    }
  }
  GemmCpu(&pool_, GemmShape{a.n, b.n, w}, false, true, 1.0f, pa.data(), w, pb.data(), w, true, c, ldc);
}

namespace {

// The indices of the k largest scores, ascending (nn.h HcpTopK's order).
std::vector<int32_t> TopK(const float* scores, int64_t count, int32_t k) {
  std::vector<int32_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), 0);
  auto before = [scores](int32_t i, int32_t j) {
    const float a = scores[i], b = scores[j];
    const bool na = std::isnan(a), nb = std::isnan(b);
    if (na != nb) return na;  // NaN ranks above every number
    if (!na && a != b) return a > b;
    return i < j;  // equal (or both NaN): the lower index first
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

}  // namespace

// The hot set of one GEMM (K contraction indices): the counts every backend
// checks, and when count > 0 indices in [0, K), ascending and distinct (CPU
// memory is host memory).
Status CpuBackend::CheckHotChannels(const char* op, const char* field, const HotChannels& hot, int64_t k_count) {
  KEEL_RETURN_IF_ERROR(CheckHotChannelCounts(op, field, hot, k_count));
  if (hot.count == 0 || hot.choose_into != nullptr) return Status::Ok();
  for (int32_t h = 0; h < hot.count; ++h) {
    const int32_t v = hot.index[h];
    if (v < 0 || v >= k_count || (h > 0 && v <= hot.index[h - 1])) {
      return Status::Error(std::string(op) + ": " + field + ".index[" + std::to_string(h) + "]: " +
                           std::to_string(v) + " is not allowed; need ascending, distinct indices in 0.." +
                           std::to_string(k_count - 1));
    }
  }
  return Status::Ok();
}

const int32_t* CpuBackend::HotSet(const HcpSide& a, const HcpSide& b, int64_t k_count, const HotChannels& hot) {
  if (hot.choose_into == nullptr || hot.count == 0) return hot.index;
  std::vector<float> scores(static_cast<size_t>(k_count));
  HcpScoresOf(a, b, k_count, scores.data());
  const std::vector<int32_t> top = TopK(scores.data(), k_count, hot.count);
  std::copy(top.begin(), top.end(), hot.choose_into);
  return hot.choose_into;
}

Status CpuBackend::HcpScores(HcpGemm gemm, const float* x, const float* w, int64_t rows, int64_t in, int64_t out,
                             const LinearQuant& q, float* scores) {
  static const char kOp[] = "HcpScores";
  KEEL_RETURN_IF_ERROR(CheckPositive(kOp, {{"rows", rows}, {"in", in}, {"out", out}}));
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"x", x}, {"w", w}, {"scores", scores}}));
  std::lock_guard<std::mutex> lock(linear_mutex_);
  Operand qa, qb;
  if (gemm == HcpGemm::kFwd) {
    // A = x (rows x in), B = w (out x in), both along in; j over in.
    KEEL_RETURN_IF_ERROR(PrepareOperand(Role::kFwdX, x, rows, in, 1, q, &qa, nullptr).WithPrefix("HcpScores: "));
    KEEL_RETURN_IF_ERROR(PrepareOperand(Role::kFwdW, w, out, in, 1, q, &qb, nullptr).WithPrefix("HcpScores: "));
    HcpScoresOf(HcpSide{x, &qa, rows, in, 1}, HcpSide{w, &qb, out, in, 1}, in, scores);
  } else {
    // A = dy (rows x out) along out, B = w read down its columns (along out); j over out.
    KEEL_RETURN_IF_ERROR(PrepareOperand(Role::kDgradDy, x, rows, out, 1, q, &qa, nullptr).WithPrefix("HcpScores: "));
    KEEL_RETURN_IF_ERROR(PrepareOperand(Role::kDgradW, w, out, in, 0, q, &qb, nullptr).WithPrefix("HcpScores: "));
    HcpScoresOf(HcpSide{x, &qa, rows, out, 1}, HcpSide{w, &qb, in, 1, in}, out, scores);
  }
  return Status::Ok();
}

Status CpuBackend::HcpTopK(const float* scores, int64_t count, int32_t k, int32_t* index) {
  static const char kOp[] = "HcpTopK";
  if (count < 0 || k < 0 || k > count) {
    return Status::Error(std::string(kOp) + ": k: " + std::to_string(k) + " of count " + std::to_string(count) +
                         " is not allowed; need 0 <= k <= count");
  }
  if (k == 0) return Status::Ok();
  KEEL_RETURN_IF_ERROR(CheckPtrs(kOp, {{"scores", scores}, {"index", index}}));
  const std::vector<int32_t> top = TopK(scores, count, k);
  std::copy(top.begin(), top.end(), index);
  return Status::Ok();
}

// The wgrad GEMM's patch: A = dy^T (out x rows), B = x^T (in x rows) in the
// space the wgrad roles quantize (RHT-rotated along the tokens when they take
// it); its hot rows are the k tokens with the highest scores, chosen here.
Status CpuBackend::AddWgradHcpPatch(const float* x, const float* dy, int64_t rows, int64_t in, int64_t out,
                                    const LinearQuant& q, float* dw) {
  const int32_t k = q.hcp_wgrad_rows;
  if (k == 0) return Status::Ok();
  const float* a = dy;
  const float* b = x;
  std::vector<float> rotated_dy, rotated_x;
  if (q.role[static_cast<int>(Role::kWgradDy)].quantized() && q.role[static_cast<int>(Role::kWgradDy)].rht) {
    // The roles quantize the rotated tensors (ValidateLinearQuant: both or neither).
    rotated_dy.resize(static_cast<size_t>(rows * out));
    rotated_x.resize(static_cast<size_t>(rows * in));
    RhtRef(dy, rows, out, 0, rotated_dy.data());
    RhtRef(x, rows, in, 0, rotated_x.data());
    a = rotated_dy.data();
    b = rotated_x.data();
  }
  const HcpSide sa{a, &operand_c_, out, 1, out}, sb{b, &operand_d_, in, 1, in};
  std::vector<float> scores(static_cast<size_t>(rows));
  HcpScoresOf(sa, sb, rows, scores.data());
  const std::vector<int32_t> hot = TopK(scores.data(), rows, k);
  AddHcpPatch(sa, sb, hot.data(), k, dw, in);
  return Status::Ok();
}

}  // namespace keel
