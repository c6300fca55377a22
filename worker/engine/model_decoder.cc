// DecoderModel (model_decoder.h): the embedding, the blocks' RMSNorms and SwiGLU
// MLPs, the final RMSNorm, the tied head and the loss, around a subclass's mixer.
#include "worker/engine/model_decoder.h"

#include <algorithm>
#include <cmath>

namespace keel {
namespace {

uint64_t Mix(uint64_t a, uint64_t b) { return RoleSeed(a ^ (b * 0x2545F4914F6CDD1Dull), Role::kDgradW); }

}  // namespace

DecoderModel::DecoderModel(const RunConfig& config, Backend* backend)
    : Model(backend),
      m_(config.model),
      batch_(config.batch),
      seq_(config.seq),
      bt_(static_cast<int64_t>(config.batch) * config.seq),
      d_(config.model.width),
      hd_(config.model.width / config.model.heads),
      hidden_(config.model.mlp_hidden) {
  blocks_ = m_.layers;
}

int DecoderModel::AddTensor(const std::string& name, std::vector<int64_t> shape, int block, Kind kind) {
  AddParam(name, std::move(shape), block, kind == Kind::kMatrix || kind == Kind::kOutput, kind == Kind::kGain);
  kinds_.push_back(kind);
  return static_cast<int>(params_.size()) - 1;
}

LinearQuant DecoderModel::QuantAs(const Pass& pass, int block, int which, bool post_qk) const {
  LinearQuant q = pass.scheme->LinearFor(block, blocks_, post_qk);
  const int slot = block < 0 ? slots_per_block_ * blocks_ : slots_per_block_ * block + which;
  q.seed = Mix(pass.quant_seed, slot);
  q.stats_slot = pass.stats ? slot : -1;
  q.analytics_slot = slot;  // read only on the steps the trainer arms analytics
  q.keep_slot = slot;       // each layer's x and w are untouched between its forward and backward
  return WithHcp(q, *pass.scheme, slot);
}

Status DecoderModel::Build() {
  const std::vector<std::string> mixer = MixerLinears();
  slots_per_block_ = static_cast<int>(mixer.size()) + 2;
  embed_ = AddTensor("embed.weight", {m_.padded_vocab, d_}, -1, Kind::kMatrix);
  bp_.resize(blocks_);
  for (int l = 0; l < blocks_; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    BlockParams& q = bp_[l];
    q.attn_norm = AddTensor(p + "attn_norm.weight", {d_}, l, Kind::kGain);
    AddMixerParams(l, p);
    q.mlp_norm = AddTensor(p + "mlp_norm.weight", {d_}, l, Kind::kGain);
    q.gate_up = AddTensor(p + "mlp.gate_up.weight", {2 * hidden_, d_}, l, Kind::kMatrix);
    q.down = AddTensor(p + "mlp.down.weight", {d_, hidden_}, l, Kind::kOutput);
    for (const std::string& n : mixer) linear_names_.push_back(p + n);
    linear_names_.push_back(p + "mlp.gate_up");
    linear_names_.push_back(p + "mlp.down");
  }
  norm_ = AddTensor("norm.weight", {d_}, -1, Kind::kGain);
  linear_names_.push_back("lm_head");
  KEEL_RETURN_IF_ERROR(AllocateParams());

  res_.resize(blocks_ + 1);
  for (float*& r : res_) KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &r));
  acts_.resize(blocks_);
  for (BlockActs& a : acts_) {
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &a.norm1));
    KEEL_RETURN_IF_ERROR(Scratch(bt_, &a.rstd1));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &a.mid));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &a.norm2));
    KEEL_RETURN_IF_ERROR(Scratch(bt_, &a.rstd2));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * 2 * hidden_, &a.gate_up));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * hidden_, &a.act));
  }
  KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &final_norm_));
  KEEL_RETURN_IF_ERROR(Scratch(bt_, &final_rstd_));
  KEEL_RETURN_IF_ERROR(Scratch(bt_, &losses_));
  KEEL_RETURN_IF_ERROR(Scratch(bt_, &tokens_));
  KEEL_RETURN_IF_ERROR(Scratch(bt_, &targets_));
  KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &dres_));
  KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &dnorm_));
  KEEL_RETURN_IF_ERROR(Scratch(bt_ * 2 * hidden_, &dgate_up_));
  KEEL_RETURN_IF_ERROR(Scratch(bt_ * hidden_, &dact_));
  KEEL_RETURN_IF_ERROR(AllocateParamCopies([this](size_t i) { return kinds_[i] == Kind::kGain; }));
  return BuildMixer();
}

Status DecoderModel::Init(uint64_t seed) {
  std::vector<float> host(param_count_, 0.0f);
  const float output_std = 0.02f / std::sqrt(2.0f * blocks_);
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    float* dst = host.data() + p.offset;
    if (kinds_[i] == Kind::kGain) {
      std::fill(dst, dst + p.count, 1.0f);
      continue;
    }
    if (kinds_[i] == Kind::kBias) continue;  // zeros
    InitNormal(Mix(seed, i), kinds_[i] == Kind::kOutput ? output_std : 0.02f, dst, p.count);
    if (static_cast<int>(i) == embed_) {
      // Padded vocabulary rows never see a target; keep them zero.
      std::fill(dst + m_.vocab * d_, dst + p.count, 0.0f);
    }
  }
  return backend_->Upload(weights_, host.data(), host.size() * sizeof(float));
}

Status DecoderModel::QuantizeGains(const Pass& pass) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (kinds_[i] != Kind::kGain) continue;
    KEEL_RETURN_IF_ERROR(backend_->QuantizeDequantize(P(i), 1, params_[i].count, 1, pass.scheme->layernorm,
                                                      Mix(pass.quant_seed, 1000003ull + i),
                                                      Gain(static_cast<int>(i))));
  }
  return Status::Ok();
}

Status DecoderModel::Forward(const Batch& batch, const Pass& pass, const float* grad_scale, double* loss,
                             int64_t* valid) {
  KEEL_RETURN_IF_ERROR(UploadTokens(batch, m_.type, bt_, tokens_, targets_, valid));
  KEEL_RETURN_IF_ERROR(QuantizeGains(pass));
  KEEL_RETURN_IF_ERROR(backend_->EmbeddingForward(tokens_, P(embed_), nullptr, res_[0], batch_, seq_, d_));
  const int mlp = slots_per_block_ - 2;  // the MLP's first linear slot within a block
  for (int l = 0; l < blocks_; ++l) {
    const BlockParams& q = bp_[l];
    BlockActs& a = acts_[l];
    KEEL_RETURN_IF_ERROR(
        backend_->RmsNormForward(res_[l], Gain(q.attn_norm), a.norm1, a.rstd1, bt_, d_, m_.ln_eps));
    KEEL_RETURN_IF_ERROR(MixerForward(l, a.norm1, res_[l], a.mid, pass));
    KEEL_RETURN_IF_ERROR(backend_->RmsNormForward(a.mid, Gain(q.mlp_norm), a.norm2, a.rstd2, bt_, d_, m_.ln_eps));
    KEEL_RETURN_IF_ERROR(backend_->LinearForward(a.norm2, P(q.gate_up), nullptr, nullptr, a.gate_up, bt_, d_,
                                                 2 * hidden_, Quant(pass, l, mlp)));
    KEEL_RETURN_IF_ERROR(backend_->SwigluForward(a.gate_up, a.act, bt_, hidden_));
    // res[l + 1] = mid + down(act): the residual rides in the GEMM (no bias).
    KEEL_RETURN_IF_ERROR(backend_->LinearForward(a.act, P(q.down), nullptr, a.mid, res_[l + 1], bt_, hidden_, d_,
                                                 Quant(pass, l, mlp + 1)));
  }
  KEEL_RETURN_IF_ERROR(
      backend_->RmsNormForward(res_[blocks_], Gain(norm_), final_norm_, final_rstd_, bt_, d_, m_.ln_eps));
  return HeadAndLoss(final_norm_, P(embed_), targets_, losses_, bt_, d_, m_.padded_vocab, m_.vocab, Quant(pass, -1, 0),
                     grad_scale, *valid, loss);
}

Status DecoderModel::ForwardBackward(const Batch& batch, const PrecisionScheme& scheme, uint64_t quant_seed,
                                     float grad_scale, bool stats, float* grads, double* loss,
                                     const GradientReady& ready) {
  const Pass pass{&scheme, quant_seed, stats};
  int64_t valid = 0;
  SetHeadGradients(dnorm_, Grad(grads, embed_));  // an MX head runs its backward in the forward's chunks
  const Status forward = Forward(batch, pass, &grad_scale, loss, &valid);
  SetHeadGradients(nullptr, nullptr);
  KEEL_RETURN_IF_ERROR(forward);
  if (valid == 0) return Status::Ok();
  // The tied head, from the dlogits HeadAndLoss left, unless it ran the head's
  // backward itself. The embedding's gradient is final only after the
  // embedding's backward, at the end.
  if (!head_backward_done()) {
    KEEL_RETURN_IF_ERROR(backend_->LinearBackward(final_norm_, P(embed_), head_dy(), dnorm_, Grad(grads, embed_),
                                                  nullptr, bt_, d_, m_.padded_vocab, HeadBackward(Quant(pass, -1, 0))));
  }
  KEEL_RETURN_IF_ERROR(backend_->Fill(dres_, bt_ * d_, 0.0f));
  KEEL_RETURN_IF_ERROR(backend_->RmsNormBackward(res_[blocks_], Gain(norm_), final_rstd_, dnorm_, dres_,
                                                 Grad(grads, norm_), bt_, d_));
  KEEL_RETURN_IF_ERROR(Final(ready, {norm_}));
  const int mlp = slots_per_block_ - 2;
  for (int l = blocks_ - 1; l >= 0; --l) {
    const BlockParams& q = bp_[l];
    const BlockActs& a = acts_[l];
    // MLP: dres_ is d loss / d res[l + 1], which also flows straight to mid.
    KEEL_RETURN_IF_ERROR(backend_->LinearBackward(a.act, P(q.down), dres_, dact_, Grad(grads, q.down), nullptr, bt_,
                                                  hidden_, d_, Quant(pass, l, mlp + 1)));
    KEEL_RETURN_IF_ERROR(Final(ready, {q.down}));
    KEEL_RETURN_IF_ERROR(backend_->SwigluBackward(a.gate_up, dact_, dgate_up_, bt_, hidden_));
    KEEL_RETURN_IF_ERROR(backend_->LinearBackward(a.norm2, P(q.gate_up), dgate_up_, dnorm_, Grad(grads, q.gate_up),
                                                  nullptr, bt_, d_, 2 * hidden_, Quant(pass, l, mlp)));
    KEEL_RETURN_IF_ERROR(Final(ready, {q.gate_up}));
    KEEL_RETURN_IF_ERROR(backend_->RmsNormBackward(a.mid, Gain(q.mlp_norm), a.rstd2, dnorm_, dres_,
                                                   Grad(grads, q.mlp_norm), bt_, d_));
    KEEL_RETURN_IF_ERROR(Final(ready, {q.mlp_norm}));
    // Mixer: dres_ is now d loss / d mid, which also flows straight to res[l].
    KEEL_RETURN_IF_ERROR(MixerBackward(l, a.norm1, dres_, dnorm_, pass, grads, ready));
    KEEL_RETURN_IF_ERROR(backend_->RmsNormBackward(res_[l], Gain(q.attn_norm), a.rstd1, dnorm_, dres_,
                                                   Grad(grads, q.attn_norm), bt_, d_));
    KEEL_RETURN_IF_ERROR(Final(ready, {q.attn_norm}));
  }
  KEEL_RETURN_IF_ERROR(
      backend_->EmbeddingBackward(tokens_, dres_, Grad(grads, embed_), nullptr, batch_, seq_, d_));
  return Final(ready, {embed_});
}

Status DecoderModel::Evaluate(const Batch& batch, const PrecisionScheme& scheme, uint64_t quant_seed,
                              double* loss) {
  const Pass pass{&scheme, quant_seed, false};
  int64_t valid = 0;
  return Forward(batch, pass, nullptr, loss, &valid);
}

}  // namespace keel
