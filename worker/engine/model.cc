// Model base class: the flat parameter buffer, scratch, initialisers, factory.
#include "worker/engine/model.h"

#include <cmath>

#include "kernels/philox.h"

namespace keel {

std::unique_ptr<Model> NewProxyModel(const RunConfig& config, Backend* backend);
std::unique_ptr<Model> NewGptModel(const RunConfig& config, Backend* backend);
std::unique_ptr<Model> NewLlamaModel(const RunConfig& config, Backend* backend);
std::unique_ptr<Model> NewGlaModel(const RunConfig& config, Backend* backend);

Model::~Model() {
  for (void* p : allocations_) backend_->Free(p);
}

void Model::AddParam(const std::string& name, std::vector<int64_t> shape, int block, bool decay,
                     bool ln_gamma) {
  ParamInfo info;
  info.name = name;
  info.count = 1;
  for (int64_t s : shape) info.count *= s;
  info.shape = std::move(shape);
  // Each tensor starts on a 64-float (256-byte) boundary: vectorised kernels and
  // cuBLASLt like aligned operands.
  info.offset = (param_count_ + 63) / 64 * 64;
  info.block = block;
  info.decay = decay;
  info.ln_gamma = ln_gamma;
  param_count_ = info.offset + info.count;
  params_.push_back(std::move(info));
}

Status Model::LinearPlusResidual(const float* x, const float* w, const float* bias, const float* residual,
                                 float* y, int64_t rows, int64_t in, int64_t out, const LinearQuant& q) {
  if (bias == nullptr) return backend_->LinearForward(x, w, nullptr, residual, y, rows, in, out, q);
  KEEL_RETURN_IF_ERROR(backend_->LinearForward(x, w, bias, nullptr, y, rows, in, out, q));
  return backend_->Add(y, residual, y, rows * out);
}

Status Model::Final(const GradientReady& ready, std::initializer_list<int> indices) {
  if (!ready) return Status::Ok();
  for (int i : indices) {
    if (i >= 0) KEEL_RETURN_IF_ERROR(ready(i));
  }
  return Status::Ok();
}

Status Model::UploadTokens(const Batch& batch, const std::string& type, int64_t bt, int32_t* tokens,
                           int32_t* targets, int64_t* valid) {
  if (static_cast<int64_t>(batch.inputs.size()) != bt || static_cast<int64_t>(batch.targets.size()) != bt) {
    return Status::Error(type + ": batch holds " + std::to_string(batch.inputs.size()) +
                         " tokens, expected batch x seq = " + std::to_string(bt));
  }
  *valid = 0;
  for (int32_t t : batch.targets) *valid += t >= 0;
  KEEL_RETURN_IF_ERROR(backend_->Upload(tokens, batch.inputs.data(), bt * sizeof(int32_t)));
  return backend_->Upload(targets, batch.targets.data(), bt * sizeof(int32_t));
}

Status Model::LanguageModelLoss(float* logits, const int32_t* targets, float* losses, int64_t bt,
                                int64_t padded_vocab, int64_t vocab, const float* grad_scale, int64_t valid,
                                const LinearQuant& head, double* loss) {
  dlogits_bf16_ = nullptr;
  if (grad_scale != nullptr && valid > 0) {
    const float scale = *grad_scale / static_cast<float>(valid);
    if (TakesBf16Dy(head)) {
      uint16_t* d = reinterpret_cast<uint16_t*>(logits);
      KEEL_RETURN_IF_ERROR(
          backend_->CrossEntropyFusedBf16(logits, targets, losses, d, 2 * padded_vocab, bt, padded_vocab, vocab, scale));
      dlogits_bf16_ = d;
      dlogits_bf16_ld_ = 2 * padded_vocab;
    } else {
      KEEL_RETURN_IF_ERROR(
          backend_->CrossEntropyFused(logits, targets, losses, logits, bt, padded_vocab, vocab, scale));
    }
  } else {
    KEEL_RETURN_IF_ERROR(backend_->CrossEntropyForward(logits, targets, losses, bt, padded_vocab, vocab));
  }
  std::vector<double> sums;
  KEEL_RETURN_IF_ERROR(backend_->Sums({Span{losses, bt}}, &sums));
  *loss = valid > 0 ? sums[0] / static_cast<double>(valid) : 0.0;
  return Status::Ok();
}

LinearQuant Model::HeadBackward(LinearQuant q) const {
  q.dy_bf16 = dlogits_bf16_;
  q.dy_bf16_ld = dlogits_bf16_ld_;
  return q;
}

LinearQuant Model::XInBf16(LinearQuant q, const float* buffer, int64_t ld) {
  if (!TakesBf16X(q) || q.hcp_fwd.count > 0) return q;
  q.x_bf16 = reinterpret_cast<const uint16_t*>(buffer);
  q.x_bf16_ld = ld;
  return q;
}

Status Model::LayerNormFor(const LinearQuant& q, const float* x, const float* gamma, const float* beta, float* y,
                           float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  if (q.x_bf16 == nullptr) return backend_->LayerNormForward(x, gamma, beta, y, mean, rstd, rows, cols, eps);
  return backend_->LayerNormForwardBf16(x, gamma, beta, reinterpret_cast<uint16_t*>(y), mean, rstd, rows, cols, eps);
}

Status Model::LinearThenResidual(const float* x, const float* w, const float* bias, const float* residual, float* y,
                                 int64_t rows, int64_t in, int64_t out, const LinearQuant& q, const float** pending) {
  *pending = nullptr;
  if (bias == nullptr) return LinearPlusResidual(x, w, bias, residual, y, rows, in, out, q);
  KEEL_RETURN_IF_ERROR(backend_->LinearForward(x, w, bias, nullptr, y, rows, in, out, q));
  *pending = residual;
  return Status::Ok();
}

Status Model::LayerNormAfter(const LinearQuant& q, float* x, const float* pending, const float* gamma,
                             const float* beta, float* y, float* mean, float* rstd, int64_t rows, int64_t cols,
                             float eps) {
  if (pending == nullptr) return LayerNormFor(q, x, gamma, beta, y, mean, rstd, rows, cols, eps);
  if (q.x_bf16 == nullptr) {
    return backend_->AddLayerNormForward(x, pending, x, gamma, beta, y, nullptr, mean, rstd, rows, cols, eps);
  }
  return backend_->AddLayerNormForward(x, pending, x, gamma, beta, nullptr, reinterpret_cast<uint16_t*>(y), mean,
                                       rstd, rows, cols, eps);
}

Status Model::GeluFor(const LinearQuant& q, const float* x, float* y, int64_t count) {
  if (q.x_bf16 == nullptr) return backend_->GeluForward(x, y, count);
  return backend_->GeluForwardBf16(x, reinterpret_cast<uint16_t*>(y), count);
}

Status Model::AllocateParams() {
  param_count_ = (param_count_ + 63) / 64 * 64;
  return Scratch(param_count_, &weights_);
}

Status Model::ScratchBytes(size_t bytes, void** out) {
  KEEL_RETURN_IF_ERROR(backend_->Alloc(bytes, out));
  allocations_.push_back(*out);
  return Status::Ok();
}

void InitUniform(uint64_t seed, float bound, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    out[i] = (2.0f * PhiloxUniform(seed, static_cast<uint64_t>(i)) - 1.0f) * bound;
  }
}

void InitNormal(uint64_t seed, float stddev, float* out, int64_t count) {
  // The Box-Muller form nn.h's RandomNormal uses.
  const float kTwoPi = 6.283185307179586f;
  for (int64_t i = 0; i < count; ++i) {
    uint64_t k = 2 * static_cast<uint64_t>(i);
    float u1 = 1.0f - PhiloxUniform(seed, k);
    float u2 = PhiloxUniform(seed, k + 1);
    out[i] = stddev * std::sqrt(-2.0f * std::log(u1)) * std::cos(kTwoPi * u2);
  }
}

Status MakeModel(const RunConfig& config, Backend* backend, std::unique_ptr<Model>* out) {
  std::unique_ptr<Model> model;
  if (config.model.type == "proxy") {
    model = NewProxyModel(config, backend);
  } else if (config.model.type == "gpt") {
    model = NewGptModel(config, backend);
  } else if (config.model.type == "llama") {
    model = NewLlamaModel(config, backend);
  } else if (config.model.type == "gla") {
    model = NewGlaModel(config, backend);
  } else {
    return Status::Error("model.type: unknown value '" + config.model.type +
                         "' (allowed: proxy, gpt, llama, gla)");
  }
  Status s = model->Build();
  if (!s.ok()) return s;
  *out = std::move(model);
  return Status::Ok();
}

}  // namespace keel
