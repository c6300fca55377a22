// cuDNN's fused causal attention through the backend C API (nn_cuda_cudnn.h).
// Host code only. cudnn.h is used for its types and constants; every function
// comes from dlsym, so the binaries do not link cuDNN.
#include "kernels/nn_cuda_cudnn.h"

#include <dlfcn.h>

#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#if __has_include(<cudnn.h>)
#include <cudnn.h>
#define KEEL_HAVE_CUDNN_H 1
#else
#define KEEL_HAVE_CUDNN_H 0
#endif

namespace keel {
namespace nncuda {

#if KEEL_HAVE_CUDNN_H

struct CudnnAttention::Api {
  void* lib = nullptr;
  cudnnHandle_t handle = nullptr;
  size_t version = 0;
  decltype(&cudnnGetVersion) get_version = nullptr;
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnDestroy) destroy = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnGetLastErrorString) last_error = nullptr;
  decltype(&cudnnBackendCreateDescriptor) create_desc = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) destroy_desc = nullptr;
  decltype(&cudnnBackendSetAttribute) set = nullptr;
  decltype(&cudnnBackendGetAttribute) get = nullptr;
  decltype(&cudnnBackendFinalize) finalize = nullptr;
  decltype(&cudnnBackendExecute) execute = nullptr;

  // "what: <status> (<cuDNN's last message>)", or Ok.
  Status Check(cudnnStatus_t st, const std::string& what) const {
    if (st == CUDNN_STATUS_SUCCESS) return Status::Ok();
    char last[512] = {0};
    if (last_error != nullptr) last_error(last, sizeof(last));
    return Status::Error("cuDNN: " + what + ": " + (error_string != nullptr ? error_string(st) : "error") +
                         (last[0] != 0 ? std::string(" (") + last + ")" : std::string()));
  }
};

namespace {

// A backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc() = default;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc(Desc&& o) noexcept : api_(o.api_), d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    if (this != &o) {
      if (d_ != nullptr) api_->destroy_desc(d_);
      api_ = o.api_;
      d_ = o.d_;
      o.d_ = nullptr;
    }
    return *this;
  }
  ~Desc() {
    if (d_ != nullptr) api_->destroy_desc(d_);
  }
  Status Create(const CudnnAttention::Api* api, cudnnBackendDescriptorType_t type, const char* what) {
    api_ = api;
    return api->Check(api->create_desc(type, &d_), std::string("create ") + what);
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* address() { return &d_; }

 private:
  const CudnnAttention::Api* api_ = nullptr;
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::vector<int64_t>;

}  // namespace

struct CudnnAttention::Plan {
  std::vector<Desc> keep;  // every descriptor the plan was built from
  Desc plan;
  int64_t workspace = 0;
  std::string engine;
  // The by-value scalars' host storage (their uids: kScaleUid, kNegInfUid, kOneUid).
  float scale = 1.0f, neg_inf = -std::numeric_limits<float>::infinity(), one = 1.0f;
};

namespace {

enum : int64_t {
  kQ = 1, kK, kV, kO, kLse, kScaleUid, kNegInfUid,  // the forward's (and the backward's)
  kDout, kDq, kDk, kDv, kRowSums, kOneUid,           // the backward's
  kVirtual = 100
};

// Builds descriptors onto one list (they must outlive the graph's finalize).
class GraphBuilder {
 public:
  GraphBuilder(const CudnnAttention::Api* api, std::vector<Desc>* keep) : api_(api), keep_(keep) {}

  Status Tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides, bool is_virtual,
                bool by_value, cudnnBackendDescriptor_t* out) {
    Desc d;
    KEEL_RETURN_IF_ERROR(d.Create(api_, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor"));
    const int64_t align = 16;
    const std::string what = "tensor " + std::to_string(uid);
    KEEL_RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what));
    KEEL_RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.size(), dims.data(), what));
    KEEL_RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.size(), strides.data(), what));
    KEEL_RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what));
    KEEL_RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, what));
    KEEL_RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, what));
    if (by_value) KEEL_RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, what));
    KEEL_RETURN_IF_ERROR(api_->Check(api_->finalize(d.get()), "finalize " + what));
    *out = d.get();
    keep_->push_back(std::move(d));
    return Status::Ok();
  }
  // A virtual tensor with the next free uid.
  Status Virtual(cudnnDataType_t type, const Dims& dims, const Dims& strides, cudnnBackendDescriptor_t* out) {
    return Tensor(next_virtual_++, type, dims, strides, true, false, out);
  }

  Status Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    Desc mm;
    KEEL_RETURN_IF_ERROR(mm.Create(api_, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul"));
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    KEEL_RETURN_IF_ERROR(Set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul"));
    KEEL_RETURN_IF_ERROR(api_->Check(api_->finalize(mm.get()), "finalize matmul"));
    Desc op;
    KEEL_RETURN_IF_ERROR(op.Create(api_, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation"));
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul A"));
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "matmul B"));
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul C"));
    cudnnBackendDescriptor_t m = mm.get();
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m, "matmul"));
    KEEL_RETURN_IF_ERROR(api_->Check(api_->finalize(op.get()), "finalize matmul operation"));
    keep_->push_back(std::move(mm));
    return AddOp(std::move(op));
  }

  // y = mode(x[, b[, t]]) in `prec`; axis >= 0 for GEN_INDEX.
  Status Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                   int64_t axis = -1) {
    const std::string what = "pointwise " + std::to_string(static_cast<int>(mode));
    Desc pw;
    KEEL_RETURN_IF_ERROR(pw.Create(api_, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what.c_str()));
    KEEL_RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what));
    KEEL_RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what));
    if (mode == CUDNN_POINTWISE_GEN_INDEX) {
      KEEL_RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what));
    }
    KEEL_RETURN_IF_ERROR(api_->Check(api_->finalize(pw.get()), "finalize " + what));
    Desc op;
    KEEL_RETURN_IF_ERROR(op.Create(api_, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what.c_str()));
    cudnnBackendDescriptor_t p = pw.get();
    KEEL_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p, what));
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what));
    if (b != nullptr) {
      KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what));
    }
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what));
    if (t != nullptr) {
      KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, what));
    }
    const float one = 1.0f;
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, what));
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, what));
    KEEL_RETURN_IF_ERROR(api_->Check(api_->finalize(op.get()), "finalize " + what + " operation"));
    keep_->push_back(std::move(pw));
    return AddOp(std::move(op));
  }

  Status Reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    const std::string what = "reduction " + std::to_string(static_cast<int>(mode));
    Desc red;
    KEEL_RETURN_IF_ERROR(red.Create(api_, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what.c_str()));
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    KEEL_RETURN_IF_ERROR(Set(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, what));
    KEEL_RETURN_IF_ERROR(Set(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what));
    KEEL_RETURN_IF_ERROR(api_->Check(api_->finalize(red.get()), "finalize " + what));
    Desc op;
    KEEL_RETURN_IF_ERROR(op.Create(api_, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what.c_str()));
    cudnnBackendDescriptor_t r = red.get();
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r, what));
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what));
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what));
    KEEL_RETURN_IF_ERROR(api_->Check(api_->finalize(op.get()), "finalize " + what + " operation"));
    keep_->push_back(std::move(red));
    return AddOp(std::move(op));
  }

  // y: x's elements under y's own dims and strides (a transposed view).
  Status Reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc op;
    KEEL_RETURN_IF_ERROR(op.Create(api_, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape"));
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape"));
    KEEL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape"));
    KEEL_RETURN_IF_ERROR(api_->Check(api_->finalize(op.get()), "finalize reshape operation"));
    return AddOp(std::move(op));
  }

  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }

 private:
  template <typename T>
  Status Set(const Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
             const T* value, const std::string& what) {
    return api_->Check(api_->set(d.get(), name, type, count, const_cast<T*>(value)),
                       what + ": attribute " + std::to_string(static_cast<int>(name)));
  }
  Status AddOp(Desc op) {
    ops_.push_back(op.get());
    keep_->push_back(std::move(op));
    return Status::Ok();
  }

  const CudnnAttention::Api* api_;
  std::vector<Desc>* keep_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kVirtual;
};

// y = scale * q k^T (fp32) where the key index (column) is at most the query
// index (row), else -inf: the causal scores both graphs start from.
Status MaskedScores(GraphBuilder& g, cudnnBackendDescriptor_t q, cudnnBackendDescriptor_t kt,
                    cudnnBackendDescriptor_t scale, cudnnBackendDescriptor_t neg_inf, const Dims& dims,
                    const Dims& strides, cudnnBackendDescriptor_t* y) {
  cudnnBackendDescriptor_t s0, x, ri, ci, keep;
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, dims, strides, &s0));
  KEEL_RETURN_IF_ERROR(g.Matmul(q, kt, s0));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, dims, strides, &x));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s0, scale, nullptr, x));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_INT32, dims, strides, &ri));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, nullptr, nullptr, ri, 2));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_INT32, dims, strides, &ci));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, nullptr, nullptr, ci, 3));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_BOOLEAN, dims, strides, &keep));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, ri, ci, nullptr, keep));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, dims, strides, y));
  return g.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neg_inf, keep, *y);
}

// The causal forward's operation graph (nn_cuda_cudnn.h's comment) for shape s.
Status BuildForwardGraph(GraphBuilder& g, const SdpaShape& s) {
  const int64_t b = s.batch, h = s.heads, t = s.seq, d = s.hd, dim = h * d;
  const Dims bhtd{b, h, t, d}, packed{h * t * d, t * d, d, 1};
  const Dims scores{b, h, t, t}, scores_strides{h * t * t, t * t, t, 1};
  const Dims row{b, h, t, 1}, row_strides{h * t, t, 1, 1};
  const Dims scalar{1, 1, 1, 1};
  cudnnBackendDescriptor_t q, kt, v, o, lse, scale, neg_inf;
  KEEL_RETURN_IF_ERROR(g.Tensor(kQ, CUDNN_DATA_BFLOAT16, bhtd, packed, false, false, &q));
  // K as K^T: [b, h, d, t] over the same bytes.
  KEEL_RETURN_IF_ERROR(g.Tensor(kK, CUDNN_DATA_BFLOAT16, {b, h, d, t}, {h * t * d, t * d, 1, d}, false, false, &kt));
  KEEL_RETURN_IF_ERROR(g.Tensor(kV, CUDNN_DATA_BFLOAT16, bhtd, packed, false, false, &v));
  // O: heads side by side in rows of b * t.
  KEEL_RETURN_IF_ERROR(g.Tensor(kO, CUDNN_DATA_BFLOAT16, bhtd, {t * dim, d, dim, 1}, false, false, &o));
  KEEL_RETURN_IF_ERROR(g.Tensor(kLse, CUDNN_DATA_FLOAT, row, row_strides, false, false, &lse));
  KEEL_RETURN_IF_ERROR(g.Tensor(kScaleUid, CUDNN_DATA_FLOAT, scalar, scalar, false, true, &scale));
  KEEL_RETURN_IF_ERROR(g.Tensor(kNegInfUid, CUDNN_DATA_FLOAT, scalar, scalar, false, true, &neg_inf));

  cudnnBackendDescriptor_t s2, mx, sub, ex, sum, lg, p;
  KEEL_RETURN_IF_ERROR(MaskedScores(g, q, kt, scale, neg_inf, scores, scores_strides, &s2));
  // Softmax with its statistics.
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, row, row_strides, &mx));
  KEEL_RETURN_IF_ERROR(g.Reduction(CUDNN_REDUCE_TENSOR_MAX, s2, mx));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, scores, scores_strides, &sub));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s2, mx, nullptr, sub));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, scores, scores_strides, &ex));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, nullptr, nullptr, ex));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, row, row_strides, &sum));
  KEEL_RETURN_IF_ERROR(g.Reduction(CUDNN_REDUCE_TENSOR_ADD, ex, sum));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, row, row_strides, &lg));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, nullptr, nullptr, lg));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, lg, nullptr, lse));
  // P in bf16 (the second product's A must be in the i/o type).
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_BFLOAT16, scores, scores_strides, &p));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, ex, sum, nullptr, p));
  return g.Matmul(p, v, o);
}

// The backward graph of cuDNN's SDPA (what its frontend builds for a causal
// backward without dropout or bias, with dQ written by a product rather than
// accumulated): D = rowsum(dout * o) into row_sums; P = exp(mask(scale * q k^T) -
// lse); dV = P^T dout; dP = dout v^T; dS = P (dP - D) * scale; dK = dS^T q; dQ = dS k.
Status BuildBackwardGraph(GraphBuilder& g, const SdpaShape& s) {
  const int64_t b = s.batch, h = s.heads, t = s.seq, d = s.hd, ld = 3 * h * d;  // rows of dq | dk | dv
  const Dims bhtd{b, h, t, d}, packed{h * t * d, t * d, d, 1}, bhdt{b, h, d, t}, transposed{h * t * d, t * d, 1, d};
  const Dims scores{b, h, t, t}, scores_strides{h * t * t, t * t, t, 1}, scores_t{h * t * t, t * t, 1, t};
  const Dims row{b, h, t, 1}, row_strides{h * t, t, 1, 1};
  const Dims scalar{1, 1, 1, 1}, out_strides{t * ld, d, ld, 1};
  cudnnBackendDescriptor_t q, kt, vt, o, dout, lse, dq, dk, dv, row_sums, scale, neg_inf, one;
  KEEL_RETURN_IF_ERROR(g.Tensor(kQ, CUDNN_DATA_BFLOAT16, bhtd, packed, false, false, &q));
  KEEL_RETURN_IF_ERROR(g.Tensor(kK, CUDNN_DATA_BFLOAT16, bhdt, transposed, false, false, &kt));
  KEEL_RETURN_IF_ERROR(g.Tensor(kV, CUDNN_DATA_BFLOAT16, bhdt, transposed, false, false, &vt));
  KEEL_RETURN_IF_ERROR(g.Tensor(kO, CUDNN_DATA_BFLOAT16, bhtd, packed, false, false, &o));
  KEEL_RETURN_IF_ERROR(g.Tensor(kDout, CUDNN_DATA_BFLOAT16, bhtd, packed, false, false, &dout));
  KEEL_RETURN_IF_ERROR(g.Tensor(kLse, CUDNN_DATA_FLOAT, row, row_strides, false, false, &lse));
  KEEL_RETURN_IF_ERROR(g.Tensor(kDq, CUDNN_DATA_BFLOAT16, bhtd, out_strides, false, false, &dq));
  KEEL_RETURN_IF_ERROR(g.Tensor(kDk, CUDNN_DATA_BFLOAT16, bhtd, out_strides, false, false, &dk));
  KEEL_RETURN_IF_ERROR(g.Tensor(kDv, CUDNN_DATA_BFLOAT16, bhtd, out_strides, false, false, &dv));
  KEEL_RETURN_IF_ERROR(g.Tensor(kRowSums, CUDNN_DATA_FLOAT, row, row_strides, false, false, &row_sums));
  KEEL_RETURN_IF_ERROR(g.Tensor(kScaleUid, CUDNN_DATA_FLOAT, scalar, scalar, false, true, &scale));
  KEEL_RETURN_IF_ERROR(g.Tensor(kNegInfUid, CUDNN_DATA_FLOAT, scalar, scalar, false, true, &neg_inf));
  KEEL_RETURN_IF_ERROR(g.Tensor(kOneUid, CUDNN_DATA_FLOAT, scalar, scalar, false, true, &one));

  // D = rowsum(dout * o).
  cudnnBackendDescriptor_t prod, dsum;
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, bhtd, packed, &prod));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dout, o, nullptr, prod));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, row, row_strides, &dsum));
  KEEL_RETURN_IF_ERROR(g.Reduction(CUDNN_REDUCE_TENSOR_ADD, prod, dsum));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dsum, one, nullptr, row_sums));
  // P from the statistics.
  cudnnBackendDescriptor_t masked, s3, p, pt;
  KEEL_RETURN_IF_ERROR(MaskedScores(g, q, kt, scale, neg_inf, scores, scores_strides, &masked));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, scores, scores_strides, &s3));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, masked, lse, nullptr, s3));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, scores, scores_strides, &p));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, s3, nullptr, nullptr, p));
  // dV = P^T dout (P^T a bf16 view of P).
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_BFLOAT16, scores, scores_t, &pt));
  KEEL_RETURN_IF_ERROR(g.Reshape(p, pt));
  KEEL_RETURN_IF_ERROR(g.Matmul(pt, dout, dv));
  // dS = P (dout v^T - D) * scale.
  cudnnBackendDescriptor_t dp, dp1, dp2, ds, dst, k;
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, scores, scores_strides, &dp));
  KEEL_RETURN_IF_ERROR(g.Matmul(dout, vt, dp));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, scores, scores_strides, &dp1));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, row_sums, nullptr, dp1));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, scores, scores_strides, &dp2));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp1, p, nullptr, dp2));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, scores, scores_strides, &ds));
  KEEL_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp2, scale, nullptr, ds));
  // dK = dS^T q; dQ = dS k (k a view of k^T).
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_BFLOAT16, scores, scores_t, &dst));
  KEEL_RETURN_IF_ERROR(g.Reshape(ds, dst));
  KEEL_RETURN_IF_ERROR(g.Matmul(dst, q, dk));
  KEEL_RETURN_IF_ERROR(g.Virtual(CUDNN_DATA_FLOAT, bhtd, packed, &k));
  KEEL_RETURN_IF_ERROR(g.Reshape(kt, k));
  return g.Matmul(ds, k, dq);
}

}  // namespace

CudnnAttention::CudnnAttention() = default;

CudnnAttention::~CudnnAttention() {
  forward_plans_.clear();
  if (api_ != nullptr) {
    if (api_->handle != nullptr) api_->destroy(api_->handle);
    // The library stays loaded: cuDNN's own threads and atexit handlers may still refer to it.
  }
}

Status CudnnAttention::Load() {
  if (api_ != nullptr) return Status::Ok();
  auto api = std::make_unique<Api>();
  const char* tried[] = {"libcudnn.so.9", "libcudnn.so"};
  std::string errors;
  for (const char* name : tried) {
    api->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (api->lib != nullptr) break;
    const char* e = dlerror();
    errors += std::string(errors.empty() ? "" : "; ") + (e != nullptr ? e : name);
  }
  if (api->lib == nullptr) return Status::Error("cuDNN: not loaded (" + errors + ")");
  auto sym = [&](const char* name, auto* fn) -> bool {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(api->lib, name));
    if (*fn == nullptr) errors = std::string("cuDNN: ") + name + " not found in the library";
    return *fn != nullptr;
  };
  if (!sym("cudnnGetVersion", &api->get_version) || !sym("cudnnCreate", &api->create) ||
      !sym("cudnnDestroy", &api->destroy) || !sym("cudnnSetStream", &api->set_stream) ||
      !sym("cudnnGetErrorString", &api->error_string) || !sym("cudnnGetLastErrorString", &api->last_error) ||
      !sym("cudnnBackendCreateDescriptor", &api->create_desc) ||
      !sym("cudnnBackendDestroyDescriptor", &api->destroy_desc) || !sym("cudnnBackendSetAttribute", &api->set) ||
      !sym("cudnnBackendGetAttribute", &api->get) || !sym("cudnnBackendFinalize", &api->finalize) ||
      !sym("cudnnBackendExecute", &api->execute)) {
    return Status::Error(errors);
  }
  api->version = api->get_version();
  if (api->version < 90000) {
    return Status::Error("cuDNN: version " + std::to_string(api->version) + " is too old; need 9.0 or later");
  }
  KEEL_RETURN_IF_ERROR(api->Check(api->create(&api->handle), "cudnnCreate"));
  api_ = std::move(api);
  return Status::Ok();
}

std::string CudnnAttention::Version() const {
  if (api_ == nullptr) return "not loaded";
  const size_t v = api_->version;  // major * 10000 + minor * 100 + patch (cuDNN 9)
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

template <typename Build>
Status CudnnAttention::MakePlan(const SdpaShape& s, const char* what, Build build, std::unique_ptr<Plan>* out) {
  auto plan = std::make_unique<Plan>();
  GraphBuilder g(api_.get(), &plan->keep);
  KEEL_RETURN_IF_ERROR(build(g));
  Desc graph;
  KEEL_RETURN_IF_ERROR(graph.Create(api_.get(), CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph"));
  KEEL_RETURN_IF_ERROR(api_->Check(
      api_->set(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &api_->handle), "graph handle"));
  std::vector<cudnnBackendDescriptor_t> ops = g.ops();
  KEEL_RETURN_IF_ERROR(api_->Check(api_->set(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                             static_cast<int64_t>(ops.size()), ops.data()),
                                   "graph operations"));
  KEEL_RETURN_IF_ERROR(api_->Check(api_->finalize(graph.get()), std::string("finalize the ") + what + " graph"));
  std::string failures;
  int tried = 0;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur;
    KEEL_RETURN_IF_ERROR(heur.Create(api_.get(), CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics"));
    cudnnBackendDescriptor_t gd = graph.get();
    KEEL_RETURN_IF_ERROR(api_->Check(
        api_->set(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &gd),
        "heuristics graph"));
    KEEL_RETURN_IF_ERROR(api_->Check(
        api_->set(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode), "heuristics mode"));
    const Status fin = api_->Check(api_->finalize(heur.get()), "finalize heuristics");
    if (!fin.ok()) {
      failures += std::string(failures.empty() ? "" : "; ") + fin.message();
      continue;
    }
    int64_t count = 0;
    KEEL_RETURN_IF_ERROR(api_->Check(
        api_->get(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
        "heuristics result count"));
    std::vector<Desc> cfgs(static_cast<size_t>(count));
    std::vector<cudnnBackendDescriptor_t> raw;
    for (Desc& c : cfgs) {
      KEEL_RETURN_IF_ERROR(c.Create(api_.get(), CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
      raw.push_back(c.get());
    }
    int64_t got = 0;
    if (count > 0) {
      KEEL_RETURN_IF_ERROR(api_->Check(api_->get(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
                                       "heuristics results"));
    }
    failures += std::string(failures.empty() ? "" : "; ") +
                (mode == CUDNN_HEUR_MODE_A ? "heuristics A: " : "fallback: ") + std::to_string(got) + " configs";
    for (int64_t i = 0; i < got; ++i) {
      ++tried;
      Desc p;
      KEEL_RETURN_IF_ERROR(p.Create(api_.get(), CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan"));
      cudnnBackendDescriptor_t cfg = raw[static_cast<size_t>(i)];
      Status st = api_->Check(
          api_->set(p.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &api_->handle), "plan handle");
      if (st.ok()) {
        st = api_->Check(
            api_->set(p.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg),
            "plan engine config");
      }
      if (st.ok()) st = api_->Check(api_->finalize(p.get()), "finalize plan");
      if (!st.ok()) {
        if (i < 3) failures += "; config " + std::to_string(i) + ": " + st.message();
        continue;
      }
      int64_t ws = 0, n = 0;
      KEEL_RETURN_IF_ERROR(api_->Check(
          api_->get(p.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws),
          "plan workspace size"));
      // The engine's global index, for the record.
      Desc eng;
      int64_t index = -1;
      if (eng.Create(api_.get(), CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine").ok() &&
          api_->get(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, eng.address()) ==
              CUDNN_STATUS_SUCCESS) {
        api_->get(eng.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
      }
      plan->engine = "engine " + std::to_string(index) + (mode == CUDNN_HEUR_MODE_A ? "" : " (fallback list)");
      plan->workspace = ws;
      plan->plan = std::move(p);
      for (Desc& c : cfgs) plan->keep.push_back(std::move(c));
      break;
    }
    if (plan->plan.get() != nullptr) break;
  }
  if (plan->plan.get() == nullptr) {
    return Status::Error("cuDNN " + Version() + ": no engine built a plan for the causal attention " + what + " (b " +
                         std::to_string(s.batch) + ", h " + std::to_string(s.heads) + ", t " + std::to_string(s.seq) +
                         ", d " + std::to_string(s.hd) + "; " + std::to_string(tried) + " configs tried: " + failures +
                         ")");
  }
  plan->keep.push_back(std::move(graph));
  *out = std::move(plan);
  return Status::Ok();
}

template <typename Build>
Status CudnnAttention::PlanFor(std::map<Key, std::unique_ptr<Plan>>* plans, const SdpaShape& s, const char* what,
                               Build build, Plan** plan) {
  if (api_ == nullptr) return Status::Error("cuDNN: not loaded");
  const Key key(s.batch, s.heads, s.seq, s.hd);
  auto found = plans->find(key);
  if (found == plans->end()) {
    std::unique_ptr<Plan> made;
    KEEL_RETURN_IF_ERROR(MakePlan(s, what, build, &made));
    found = plans->emplace(key, std::move(made)).first;
  }
  *plan = found->second.get();
  return Status::Ok();
}

Status CudnnAttention::ForwardPlan(const SdpaShape& s, Plan** plan) {
  return PlanFor(&forward_plans_, s, "forward", [&](GraphBuilder& g) { return BuildForwardGraph(g, s); }, plan);
}

Status CudnnAttention::BackwardPlan(const SdpaShape& s, Plan** plan) {
  return PlanFor(&backward_plans_, s, "backward", [&](GraphBuilder& g) { return BuildBackwardGraph(g, s); }, plan);
}

Status CudnnAttention::PrepareForward(const SdpaShape& s, size_t* workspace_bytes, std::string* engine) {
  Plan* plan = nullptr;
  KEEL_RETURN_IF_ERROR(ForwardPlan(s, &plan));
  *workspace_bytes = static_cast<size_t>(plan->workspace);
  if (engine != nullptr) *engine = plan->engine;
  return Status::Ok();
}

Status CudnnAttention::PrepareBackward(const SdpaShape& s, size_t* workspace_bytes, std::string* engine) {
  Plan* plan = nullptr;
  KEEL_RETURN_IF_ERROR(BackwardPlan(s, &plan));
  *workspace_bytes = static_cast<size_t>(plan->workspace);
  if (engine != nullptr) *engine = plan->engine;
  return Status::Ok();
}

Status CudnnAttention::Execute(Plan& plan, const int64_t* uids, void* const* ptrs, int n, void* workspace,
                               size_t workspace_bytes, cudaStream_t stream, const char* what) {
  if (workspace_bytes < static_cast<size_t>(plan.workspace)) {
    return Status::Error(std::string("cuDNN attention ") + what + ": workspace of " + std::to_string(workspace_bytes) +
                         " bytes; the plan needs " + std::to_string(plan.workspace));
  }
  KEEL_RETURN_IF_ERROR(api_->Check(api_->set_stream(api_->handle, stream), "cudnnSetStream"));
  Desc pack;
  KEEL_RETURN_IF_ERROR(pack.Create(api_.get(), CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack"));
  KEEL_RETURN_IF_ERROR(
      api_->Check(api_->set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids), "uids"));
  KEEL_RETURN_IF_ERROR(api_->Check(
      api_->set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs), "pointers"));
  KEEL_RETURN_IF_ERROR(api_->Check(
      api_->set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace), "workspace"));
  KEEL_RETURN_IF_ERROR(api_->Check(api_->finalize(pack.get()), "finalize the variant pack"));
  return api_->Check(api_->execute(api_->handle, plan.plan.get(), pack.get()),
                     std::string("execute the attention ") + what);
}

Status CudnnAttention::Forward(const SdpaShape& s, const void* q, const void* k, const void* v, void* o, float* lse,
                               float scale, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  Plan* p = nullptr;
  KEEL_RETURN_IF_ERROR(ForwardPlan(s, &p));
  Plan& plan = *p;
  plan.scale = scale;
  const int64_t uids[] = {kQ, kK, kV, kO, kLse, kScaleUid, kNegInfUid};
  void* const ptrs[] = {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), o, lse, &plan.scale,
                        &plan.neg_inf};
  return Execute(plan, uids, ptrs, 7, workspace, workspace_bytes, stream, "forward");
}

Status CudnnAttention::Backward(const SdpaShape& s, const void* q, const void* k, const void* v, const void* o,
                                const void* dout, const float* lse, float* row_sums, void* dqkv, float scale,
                                void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  Plan* p = nullptr;
  KEEL_RETURN_IF_ERROR(BackwardPlan(s, &p));
  Plan& plan = *p;
  plan.scale = scale;
  // dq, dk and dv: columns 0, h * d and 2 h * d of the same rows (bf16, 2 bytes each).
  char* rows = static_cast<char*>(dqkv);
  const int64_t part = s.heads * s.hd * 2;
  void* dq = rows;
  void* dk = rows + part;
  void* dv = rows + 2 * part;
  const int64_t uids[] = {kQ, kK, kV, kO, kDout, kLse, kDq, kDk, kDv, kRowSums, kScaleUid, kNegInfUid, kOneUid};
  void* const ptrs[] = {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), const_cast<void*>(o),
                        const_cast<void*>(dout), const_cast<float*>(lse), dq, dk, dv, row_sums, &plan.scale,
                        &plan.neg_inf, &plan.one};
  return Execute(plan, uids, ptrs, 13, workspace, workspace_bytes, stream, "backward");
}

#else  // no cudnn.h at build time

struct CudnnAttention::Api {};
struct CudnnAttention::Plan {};
CudnnAttention::CudnnAttention() = default;
CudnnAttention::~CudnnAttention() = default;
Status CudnnAttention::Load() { return Status::Error("cuDNN: this build had no cudnn.h"); }
std::string CudnnAttention::Version() const { return "not built"; }
Status CudnnAttention::PrepareForward(const SdpaShape&, size_t*, std::string*) { return Load(); }
Status CudnnAttention::Forward(const SdpaShape&, const void*, const void*, const void*, void*, float*, float, void*,
                               size_t, cudaStream_t) {
  return Load();
}
Status CudnnAttention::PrepareBackward(const SdpaShape&, size_t*, std::string*) { return Load(); }
Status CudnnAttention::Backward(const SdpaShape&, const void*, const void*, const void*, const void*, const void*,
                                const float*, float*, void*, float, void*, size_t, cudaStream_t) {
  return Load();
}

#endif

}  // namespace nncuda
}  // namespace keel
