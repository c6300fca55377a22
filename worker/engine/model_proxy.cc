// The MX-instability paper's proxy (docs/numerics.md, "The proxy model"): a student
// ResidualMLP(d, L) (x <- x + fc2(GELU(fc1(LN(x)))), fc1 d->4d without bias, fc2
// 4d->d with bias, LN with gamma and beta, no final norm) regressing a frozen
// teacher (L blocks of Linear(d, d) -> GELU -> Linear(d, d), no bias, no
// residual) on fresh N(0, I) batches with target noise 0.005 N(0, 1), MSE loss.
#include <cmath>

#include "worker/engine/model.h"

namespace keel {
namespace {

uint64_t Mix(uint64_t a, uint64_t b) { return RoleSeed(a ^ (b * 0x2545F4914F6CDD1Dull), Role::kFwdX); }

class ProxyModel : public Model {
 public:
  ProxyModel(const RunConfig& config, Backend* backend)
      : Model(backend), d_(config.model.width), batch_(config.batch), eps_(config.model.ln_eps) {
    blocks_ = config.model.layers;
  }

  int64_t items_per_batch() const override { return batch_; }

  Status Build() override {
    for (int l = 0; l < blocks_; ++l) {
      std::string p = "blocks." + std::to_string(l) + ".";
      AddParam(p + "ln.weight", {d_}, l, false, true);
      AddParam(p + "ln.bias", {d_}, l, false);
      AddParam(p + "fc1.weight", {4 * d_, d_}, l, true);
      AddParam(p + "fc2.weight", {d_, 4 * d_}, l, true);
      AddParam(p + "fc2.bias", {d_}, l, false);
      linear_names_.push_back(p + "fc1");
      linear_names_.push_back(p + "fc2");
    }
    KEEL_RETURN_IF_ERROR(AllocateParams());
    const int64_t bd = batch_ * d_;
    KEEL_RETURN_IF_ERROR(Scratch(2 * blocks_ * d_ * d_, &teacher_));
    res_.resize(blocks_ + 1);
    for (float*& r : res_) KEEL_RETURN_IF_ERROR(Scratch(bd, &r));
    normed_.resize(blocks_);
    hidden_.resize(blocks_);
    act_.resize(blocks_);
    mean_.resize(blocks_);
    rstd_.resize(blocks_);
    for (int l = 0; l < blocks_; ++l) {
      KEEL_RETURN_IF_ERROR(Scratch(bd, &normed_[l]));
      KEEL_RETURN_IF_ERROR(Scratch(4 * bd, &hidden_[l]));
      KEEL_RETURN_IF_ERROR(Scratch(4 * bd, &act_[l]));
      KEEL_RETURN_IF_ERROR(Scratch(batch_, &mean_[l]));
      KEEL_RETURN_IF_ERROR(Scratch(batch_, &rstd_[l]));
    }
    KEEL_RETURN_IF_ERROR(Scratch(2 * blocks_ * d_, &ln_affine_));
    KEEL_RETURN_IF_ERROR(Scratch(bd, &target_));
    KEEL_RETURN_IF_ERROR(Scratch(bd, &teacher_a_));
    KEEL_RETURN_IF_ERROR(Scratch(4 * bd, &dhidden_));
    KEEL_RETURN_IF_ERROR(Scratch(4 * bd, &dact_));
    KEEL_RETURN_IF_ERROR(Scratch(bd, &dres_));
    KEEL_RETURN_IF_ERROR(Scratch(bd, &dnormed_));
    return Status::Ok();
  }

  Status Init(uint64_t seed) override {
    std::vector<float> host(param_count_, 0.0f);
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamInfo& p = params_[i];
      float* dst = host.data() + p.offset;
      if (p.ln_gamma) {
        std::fill(dst, dst + p.count, 1.0f);
      } else if (p.name.find("ln.bias") != std::string::npos) {
        std::fill(dst, dst + p.count, 0.0f);
      } else {
        // PyTorch's Linear default: weights and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        int64_t fan_in = p.name.find("fc1") != std::string::npos ? d_ : 4 * d_;
        InitUniform(Mix(seed, i), 1.0f / std::sqrt(static_cast<float>(fan_in)), dst, p.count);
      }
    }
    KEEL_RETURN_IF_ERROR(backend_->Upload(weights_, host.data(), host.size() * sizeof(float)));
    // The teacher: frozen, same default init, its own stream.
    std::vector<float> teacher(2 * blocks_ * d_ * d_);
    InitUniform(Mix(seed, 0x7EAC4E2ull), 1.0f / std::sqrt(static_cast<float>(d_)), teacher.data(),
                static_cast<int64_t>(teacher.size()));
    return backend_->Upload(teacher_, teacher.data(), teacher.size() * sizeof(float));
  }

  Status ForwardBackward(const Batch& batch, const PrecisionScheme& scheme, uint64_t quant_seed,
                         float grad_scale, bool stats, float* grads, double* loss,
                         const GradientReady& ready) override {
    KEEL_RETURN_IF_ERROR(MakeData(batch.data_seed));
    KEEL_RETURN_IF_ERROR(Forward(scheme, quant_seed, stats, loss));
    const int64_t bd = batch_ * d_;
    // d mean((y - t)^2) / dy = 2 (y - t) / (B d); dres_ already holds y - t.
    KEEL_RETURN_IF_ERROR(backend_->Scale(dres_, bd, 2.0f * grad_scale / static_cast<float>(bd)));
    for (int l = blocks_ - 1; l >= 0; --l) {
      LinearQuant fc1 = Quant(scheme, l, 0, quant_seed, stats);
      LinearQuant fc2 = Quant(scheme, l, 1, quant_seed, stats);
      const size_t base = 5 * static_cast<size_t>(l);
      const int i = static_cast<int>(base);  // ln.weight, ln.bias, fc1.weight, fc2.weight, fc2.bias
      KEEL_RETURN_IF_ERROR(backend_->LinearBackward(act_[l], P(base + 3), dres_, dact_,
                                               GradOf(grads, base + 3), GradOf(grads, base + 4),
                                               batch_, 4 * d_, d_, fc2));
      KEEL_RETURN_IF_ERROR(Final(ready, {i + 3, i + 4}));
      KEEL_RETURN_IF_ERROR(backend_->GeluBackward(hidden_[l], dact_, dhidden_, 4 * bd));
      KEEL_RETURN_IF_ERROR(backend_->LinearBackward(normed_[l], P(base + 2), dhidden_, dnormed_,
                                               GradOf(grads, base + 2), nullptr, batch_, d_,
                                               4 * d_, fc1));
      KEEL_RETURN_IF_ERROR(Final(ready, {i + 2}));
      // dres_ carries the residual path's gradient; the LN branch adds to it.
      KEEL_RETURN_IF_ERROR(backend_->LayerNormBackward(res_[l], Gamma(l), mean_[l], rstd_[l], dnormed_,
                                                  dres_, GradOf(grads, base), GradOf(grads, base + 1),
                                                  batch_, d_));
      KEEL_RETURN_IF_ERROR(Final(ready, {i, i + 1}));
    }
    return Status::Ok();
  }

  Status Evaluate(const Batch& batch, const PrecisionScheme& scheme, uint64_t quant_seed,
                  double* loss) override {
    KEEL_RETURN_IF_ERROR(MakeData(batch.data_seed));
    return Forward(scheme, quant_seed, false, loss);
  }

 private:
  // Gradients share the parameters' offsets in their own flat buffer.
  float* GradOf(float* grads, size_t index) const { return grads + params_[index].offset; }
  float* Gamma(int l) const { return ln_affine_ + 2 * l * d_; }
  float* Beta(int l) const { return ln_affine_ + (2 * l + 1) * d_; }

  LinearQuant Quant(const PrecisionScheme& scheme, int block, int which, uint64_t seed,
                    bool stats) const {
    LinearQuant q = scheme.LinearFor(block, blocks_);
    q.seed = Mix(seed, 2 * block + which);
    q.stats_slot = stats ? 2 * block + which : -1;
    q.analytics_slot = 2 * block + which;  // read only on the steps the trainer arms analytics
    return WithHcp(q, scheme, 2 * block + which);
  }

  // x ~ N(0, I) into res_[0]; target = teacher(x) + 0.005 N(0, 1). The teacher
  // runs as side work, beside the student's forward (which reads neither target_
  // nor the teacher's buffers); Forward joins it before the loss.
  Status MakeData(uint64_t data_seed) {
    const int64_t bd = batch_ * d_;
    KEEL_RETURN_IF_ERROR(backend_->RandomNormal(res_[0], bd, data_seed, 0, 1.0f));
    KEEL_RETURN_IF_ERROR(backend_->BeginSideWork());
    const Status teacher = Teacher(data_seed);
    const Status ended = backend_->EndSideWork();
    KEEL_RETURN_IF_ERROR(teacher);
    return ended;
  }

  // target_ = teacher(res_[0]) + noise, in fp32 ops that need no backend scratch.
  Status Teacher(uint64_t data_seed) {
    const int64_t bd = batch_ * d_;
    LinearQuant fp32;  // the teacher is never quantized
    const float* x = res_[0];
    for (int l = 0; l < blocks_; ++l) {
      const float* w1 = teacher_ + 2 * l * d_ * d_;
      const float* w2 = w1 + d_ * d_;
      KEEL_RETURN_IF_ERROR(backend_->LinearForward(x, w1, nullptr, nullptr, teacher_a_, batch_, d_, d_, fp32));
      KEEL_RETURN_IF_ERROR(backend_->GeluForward(teacher_a_, teacher_a_, bd));
      KEEL_RETURN_IF_ERROR(backend_->LinearForward(teacher_a_, w2, nullptr, nullptr, target_, batch_, d_, d_, fp32));
      if (l + 1 < blocks_) {
        // The next teacher block reads from dnormed_ (free until the backward):
        // LinearForward's input and output must not alias.
        KEEL_RETURN_IF_ERROR(backend_->CopyBytes(dnormed_, target_, bd * sizeof(float)));
        x = dnormed_;
      }
    }
    KEEL_RETURN_IF_ERROR(backend_->RandomNormal(teacher_a_, bd, data_seed, static_cast<uint64_t>(bd), 0.005f));
    return backend_->Add(target_, teacher_a_, target_, bd);
  }

  // Forward through the student; leaves y - target in dres_ and the MSE in *loss.
  Status Forward(const PrecisionScheme& scheme, uint64_t quant_seed, bool stats, double* loss) {
    const int64_t bd = batch_ * d_;
    for (int l = 0; l < blocks_; ++l) {
      const size_t base = 5 * static_cast<size_t>(l);
      // Layernorm affine as the scheme treats it (straight-through gradient).
      uint64_t ln_seed = Mix(quant_seed, 1000003ull + l);
      KEEL_RETURN_IF_ERROR(backend_->QuantizeDequantize(P(base), 1, d_, 1, scheme.layernorm, ln_seed, Gamma(l)));
      KEEL_RETURN_IF_ERROR(backend_->QuantizeDequantize(P(base + 1), 1, d_, 1, scheme.layernorm, ln_seed + 1, Beta(l)));
      KEEL_RETURN_IF_ERROR(backend_->LayerNormForward(res_[l], Gamma(l), Beta(l), normed_[l], mean_[l],
                                                 rstd_[l], batch_, d_, eps_));
      KEEL_RETURN_IF_ERROR(backend_->LinearForward(normed_[l], P(base + 2), nullptr, nullptr, hidden_[l], batch_,
                                              d_, 4 * d_, Quant(scheme, l, 0, quant_seed, stats)));
      KEEL_RETURN_IF_ERROR(backend_->GeluForward(hidden_[l], act_[l], 4 * bd));
      // res[l + 1] = res[l] + fc2(act) (the backward reads res[l + 1] only as the
      // next block's input).
      KEEL_RETURN_IF_ERROR(LinearPlusResidual(act_[l], P(base + 3), P(base + 4), res_[l], res_[l + 1], batch_,
                                              4 * d_, d_, Quant(scheme, l, 1, quant_seed, stats)));
    }
    KEEL_RETURN_IF_ERROR(backend_->CopyBytes(dres_, res_[blocks_], bd * sizeof(float)));
    KEEL_RETURN_IF_ERROR(backend_->JoinSideWork());  // the teacher's target_
    KEEL_RETURN_IF_ERROR(backend_->Axpy(-1.0f, target_, dres_, bd));
    std::vector<double> ss;
    KEEL_RETURN_IF_ERROR(backend_->SumSquares({Span{dres_, bd}}, &ss));
    *loss = ss[0] / static_cast<double>(bd);
    return Status::Ok();
  }

  int64_t d_;
  int64_t batch_;
  float eps_;
  float* teacher_ = nullptr;
  std::vector<float*> res_, normed_, hidden_, act_, mean_, rstd_;
  float* ln_affine_ = nullptr;
  float* target_ = nullptr;
  float* teacher_a_ = nullptr;
  float* dhidden_ = nullptr;
  float* dact_ = nullptr;
  float* dres_ = nullptr;
  float* dnormed_ = nullptr;
};

}  // namespace

std::unique_ptr<Model> NewProxyModel(const RunConfig& config, Backend* backend) {
  return std::unique_ptr<Model>(new ProxyModel(config, backend));
}

}  // namespace keel
