// The gla model (model.type gla): DecoderModel's skeleton (model_decoder.h) with
// gated linear attention (GLA, Yang et al. 2024) as the mixer, so that it
// differs from the llama model in the mixer alone. With d the width, H heads,
// dk = d/2 the key width (key head dk/H) and d the value width (value head d/H):
//   [q | k | v | g] = x . Wqkvg^T   (one [3d, d] matrix: q rows [0, d/2), k [d/2, d),
//                                    v [d, 2d), g [2d, 3d))
//   gk = logsigmoid(gk_proj.1(gk_proj.0(x))) / 16     (Linear(d -> 16), no bias,
//        then Linear(16 -> d/2) with a bias: the low-rank forget gate, <= 0)
//   o  = the gated recurrence per head (nn.h GlaForward):
//        S_t = diag(exp(gk_t)) S_{t-1} + k_t^T v_t,  o_t = (q_t / sqrt(dk/H)) S_t
//   a  = RMSNorm_per_head(o) * silu(g)   (RMSNorm over each head's d/H features,
//        one gain of d/H shared by the heads, eps model.ln_eps)
//   out = residual + a . Wo^T
// No RoPE: the decay of the gates carries position. As in the reference GLA
// implementation (flash-linear-attention), gk_proj's second linear has a bias
// (initialised to 0, so the gates start at logsigmoid(~0) / 16 ~ -0.043, a
// decay of ~0.96 per position) and nothing else has one.
// Parameters per block: layers.<l>.attn.qkvg.weight, attn.gk_proj.0.weight,
// attn.gk_proj.1.weight, attn.gk_proj.1.bias, attn.g_norm.weight,
// attn.o_proj.weight. The linear layers, in statistics-slot order: attn.qkvg,
// attn.gk_proj.0, attn.gk_proj.1, attn.o_proj (stable names: o_proj and the
// gk_proj pair are the post-QK sensitive layers a scheme may address).
#include <string>
#include <vector>

#include "worker/engine/model_decoder.h"

namespace keel {
namespace {

class GlaModel : public DecoderModel {
 public:
  GlaModel(const RunConfig& config, Backend* backend)
      : DecoderModel(config, backend), dk_(config.model.width / 2), dvh_(config.model.width / config.model.heads) {}

 protected:
  // Statistics slots within a block.
  enum Slot { kQkvg = 0, kGkDown = 1, kGkUp = 2, kOProj = 3 };

  std::vector<std::string> MixerLinears() const override {
    return {"attn.qkvg", "attn.gk_proj.0", "attn.gk_proj.1", "attn.o_proj"};
  }
  // CHON's post-QK layers of GLA: the gate projection (both halves) and o_proj.
  bool PostQkLinear(int which) const override { return which == kGkDown || which == kGkUp || which == kOProj; }

  void AddMixerParams(int block, const std::string& prefix) override {
    Mixer m;
    m.qkvg = AddTensor(prefix + "attn.qkvg.weight", {3 * d_, d_}, block, Kind::kMatrix);
    m.gk_down = AddTensor(prefix + "attn.gk_proj.0.weight", {kGlaGateRank, d_}, block, Kind::kMatrix);
    m.gk_up = AddTensor(prefix + "attn.gk_proj.1.weight", {dk_, kGlaGateRank}, block, Kind::kMatrix);
    m.gk_bias = AddTensor(prefix + "attn.gk_proj.1.bias", {dk_}, block, Kind::kBias);
    m.g_norm = AddTensor(prefix + "attn.g_norm.weight", {dvh_}, block, Kind::kGain);
    m.o_proj = AddTensor(prefix + "attn.o_proj.weight", {d_, d_}, block, Kind::kOutput);
    mixers_.push_back(m);
  }

  Status BuildMixer() override {
    if (std::string(backend_->name()) == "cuda" && dk_ / m_.heads > kGlaMaxKeyHead) {
      return Status::InvalidField("model.heads", std::to_string(m_.heads) + " with model.width " +
                                                     std::to_string(d_) + " gives a key head of " +
                                                     std::to_string(dk_ / m_.heads) +
                                                     " (allowed on cuda: at most " + std::to_string(kGlaMaxKeyHead) +
                                                     ", width / 2 / heads)");
    }
    for (Mixer& m : mixers_) {
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * 3 * d_, &m.qkvg_act));
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * kGlaGateRank, &m.gk_low));
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * dk_, &m.gk_logit));
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * dk_, &m.gk));
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &m.o));
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * m_.heads, &m.rstd));
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &m.normed));
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &m.gated));
    }
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &dgated_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &dnormed_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &do_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * 3 * d_, &dqkvg_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * dk_, &dgk_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * dk_, &dgk_logit_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * kGlaGateRank, &dgk_low_));
    return Scratch(bt_ * d_, &dx_gate_);
  }

  Status MixerForward(int block, const float* x, const float* residual, float* out, const Pass& pass) override {
    const Mixer& m = mixers_[block];
    KEEL_RETURN_IF_ERROR(backend_->LinearForward(x, P(m.qkvg), nullptr, nullptr, m.qkvg_act, bt_, d_, 3 * d_,
                                                 Quant(pass, block, kQkvg)));
    KEEL_RETURN_IF_ERROR(backend_->LinearForward(x, P(m.gk_down), nullptr, nullptr, m.gk_low, bt_, d_, kGlaGateRank,
                                                 Quant(pass, block, kGkDown)));
    KEEL_RETURN_IF_ERROR(backend_->LinearForward(m.gk_low, P(m.gk_up), P(m.gk_bias), nullptr, m.gk_logit, bt_,
                                                 kGlaGateRank, dk_, Quant(pass, block, kGkUp)));
    KEEL_RETURN_IF_ERROR(backend_->LogSigmoidForward(m.gk_logit, m.gk, bt_ * dk_, 1.0f / kGlaGateNormalizer));
    // q, k, v are the first 2 dk + d columns of each qkvg row.
    KEEL_RETURN_IF_ERROR(backend_->GlaForward(m.qkvg_act, 3 * d_, m.gk, m.o, batch_, seq_, m_.heads, dk_, d_));
    // Each (token, head) is a row of d/H features for the per-head RMSNorm.
    KEEL_RETURN_IF_ERROR(
        backend_->RmsNormForward(m.o, Gain(m.g_norm), m.normed, m.rstd, bt_ * m_.heads, dvh_, m_.ln_eps));
    KEEL_RETURN_IF_ERROR(backend_->SiluGateForward(m.normed, m.qkvg_act + 2 * d_, 3 * d_, m.gated, bt_, d_));
    return backend_->LinearForward(m.gated, P(m.o_proj), nullptr, residual, out, bt_, d_, d_,
                                   Quant(pass, block, kOProj));
  }

  Status MixerBackward(int block, const float* x, const float* dout, float* dx, const Pass& pass, float* grads,
                       const GradientReady& ready) override {
    const Mixer& m = mixers_[block];
    KEEL_RETURN_IF_ERROR(backend_->LinearBackward(m.gated, P(m.o_proj), dout, dgated_, Grad(grads, m.o_proj), nullptr,
                                                  bt_, d_, d_, Quant(pass, block, kOProj)));
    KEEL_RETURN_IF_ERROR(Final(ready, {m.o_proj}));
    // dg goes straight into g's columns of dqkvg; GlaBackward fills the rest.
    KEEL_RETURN_IF_ERROR(
        backend_->SiluGateBackward(m.normed, m.qkvg_act + 2 * d_, 3 * d_, dgated_, dnormed_, dqkvg_ + 2 * d_, bt_, d_));
    KEEL_RETURN_IF_ERROR(backend_->Fill(do_, bt_ * d_, 0.0f));  // RmsNormBackward adds into dx
    KEEL_RETURN_IF_ERROR(backend_->RmsNormBackward(m.o, Gain(m.g_norm), m.rstd, dnormed_, do_, Grad(grads, m.g_norm),
                                                   bt_ * m_.heads, dvh_));
    KEEL_RETURN_IF_ERROR(Final(ready, {m.g_norm}));
    KEEL_RETURN_IF_ERROR(
        backend_->GlaBackward(m.qkvg_act, 3 * d_, m.gk, do_, dqkvg_, dgk_, batch_, seq_, m_.heads, dk_, d_));
    KEEL_RETURN_IF_ERROR(
        backend_->LogSigmoidBackward(m.gk_logit, dgk_, dgk_logit_, bt_ * dk_, 1.0f / kGlaGateNormalizer));
    KEEL_RETURN_IF_ERROR(backend_->LinearBackward(m.gk_low, P(m.gk_up), dgk_logit_, dgk_low_, Grad(grads, m.gk_up),
                                                  Grad(grads, m.gk_bias), bt_, kGlaGateRank, dk_,
                                                  Quant(pass, block, kGkUp)));
    KEEL_RETURN_IF_ERROR(Final(ready, {m.gk_up, m.gk_bias}));
    KEEL_RETURN_IF_ERROR(backend_->LinearBackward(x, P(m.gk_down), dgk_low_, dx_gate_, Grad(grads, m.gk_down), nullptr,
                                                  bt_, d_, kGlaGateRank, Quant(pass, block, kGkDown)));
    KEEL_RETURN_IF_ERROR(Final(ready, {m.gk_down}));
    KEEL_RETURN_IF_ERROR(backend_->LinearBackward(x, P(m.qkvg), dqkvg_, dx, Grad(grads, m.qkvg), nullptr, bt_, d_,
                                                  3 * d_, Quant(pass, block, kQkvg)));
    KEEL_RETURN_IF_ERROR(Final(ready, {m.qkvg}));
    // x feeds both qkvg and the gate: its gradient is the sum of the two.
    return backend_->Add(dx, dx_gate_, dx, bt_ * d_);
  }

 private:
  // One block's mixer: parameter indices and saved activations.
  struct Mixer {
    int qkvg = -1, gk_down = -1, gk_up = -1, gk_bias = -1, g_norm = -1, o_proj = -1;
    float* qkvg_act = nullptr;  // q, k, v, g: bt x 3d
    float* gk_low = nullptr;    // gk_proj.0's output, bt x 16
    float* gk_logit = nullptr;  // gk_proj.1's output, bt x dk
    float* gk = nullptr;        // the log gates, bt x dk
    float* o = nullptr;         // the recurrence's output, bt x d
    float* rstd = nullptr;      // the per-head RMSNorm's 1 / rms, bt x heads
    float* normed = nullptr;    // RMSNorm(o), bt x d
    float* gated = nullptr;     // normed * silu(g): o_proj's input, bt x d
  };

  const int64_t dk_, dvh_;
  std::vector<Mixer> mixers_;
  float *dgated_ = nullptr, *dnormed_ = nullptr, *do_ = nullptr, *dqkvg_ = nullptr;
  float *dgk_ = nullptr, *dgk_logit_ = nullptr, *dgk_low_ = nullptr, *dx_gate_ = nullptr;
};

}  // namespace

std::unique_ptr<Model> NewGlaModel(const RunConfig& config, Backend* backend) {
  return std::unique_ptr<Model>(new GlaModel(config, backend));
}

}  // namespace keel
