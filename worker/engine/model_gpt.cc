// GPT-2-style decoder LM: token + learned position embeddings, pre-LN blocks
// (LN -> c_attn (q, k, v) -> [QK-LayerNorm per head] -> causal softmax attention
// -> c_proj, residual; LN -> c_fc -> GELU or SwiGLU -> c_proj, residual), final
// LN, LM head tied to the token embedding, softmax cross-entropy over the real
// vocabulary (padded columns never count). Weights are [out, in] (the transpose
// of Hugging Face GPT-2's Conv1D layout); names follow GPT-2's.
#include <cmath>

#include "worker/engine/model.h"

namespace keel {
namespace {

uint64_t Mix(uint64_t a, uint64_t b) { return RoleSeed(a ^ (b * 0x2545F4914F6CDD1Dull), Role::kFwdW); }

// Indices of one block's parameters in params_ (-1 when absent).
struct BlockParams {
  int ln1_w = -1, ln1_b = -1, attn_w = -1, attn_b = -1, qln_w = -1, qln_b = -1, kln_w = -1,
      kln_b = -1, proj_w = -1, proj_b = -1, ln2_w = -1, ln2_b = -1, fc_w = -1, fc_b = -1,
      fcproj_w = -1, fcproj_b = -1;
};

// One block's saved activations.
struct BlockActs {
  float *ln1_mean, *ln1_rstd, *qkv = nullptr, *qkv_normed = nullptr, *q_raw = nullptr,
      *k_raw = nullptr, *q_mean = nullptr, *q_rstd = nullptr, *k_mean = nullptr,
      *k_rstd = nullptr, *att_stats, *att, *mid, *ln2_mean, *ln2_rstd, *fc;
  // The inputs of qkv, fc and the MLP's projection: bf16 or fp32 as the layer
  // reads them (XInBf16), so sized by the step's scheme (GrowActivation).
  float *ln1 = nullptr, *ln2 = nullptr, *act = nullptr;
  size_t ln1_bytes = 0, ln2_bytes = 0, act_bytes = 0;
  // Whether the last forward kept the attention's heads in qkv's place (Backend::KeepsAttentionHeads):
  // qkv then holds them instead of q, k and v, and the backward reads them with AttentionBackwardKept.
  bool kept = false;
  // qkv's bytes: batch * seq * 3 * width bf16 heads when kept, else fp32 (GrowSavedQkv).
  size_t qkv_bytes = 0;
};

class GptModel : public Model {
 public:
  GptModel(const RunConfig& config, Backend* backend)
      : Model(backend),
        m_(config.model),
        batch_(config.batch),
        seq_(config.seq),
        bt_(static_cast<int64_t>(config.batch) * config.seq) {
    blocks_ = m_.layers;
    d_ = m_.width;
    hd_ = d_ / m_.heads;
    hidden_ = m_.mlp_hidden;
    fc_out_ = m_.mlp == "swiglu" ? 2 * hidden_ : hidden_;
  }

  int64_t items_per_batch() const override { return bt_; }

  Status Build() override {
    const bool b = m_.bias;
    wte_ = Add("wte", {m_.padded_vocab, d_}, -1, true);
    wpe_ = Add("wpe", {m_.context, d_}, -1, true);
    bp_.resize(blocks_);
    for (int l = 0; l < blocks_; ++l) {
      std::string p = "h." + std::to_string(l) + ".";
      BlockParams& q = bp_[l];
      q.ln1_w = Add(p + "ln_1.weight", {d_}, l, false, true);
      if (b) q.ln1_b = Add(p + "ln_1.bias", {d_}, l, false);
      q.attn_w = Add(p + "attn.c_attn.weight", {3 * d_, d_}, l, true);
      if (b) q.attn_b = Add(p + "attn.c_attn.bias", {3 * d_}, l, false);
      if (m_.qk_layernorm) {
        q.qln_w = Add(p + "attn.q_ln.weight", {hd_}, l, false, true);
        if (b) q.qln_b = Add(p + "attn.q_ln.bias", {hd_}, l, false);
        q.kln_w = Add(p + "attn.k_ln.weight", {hd_}, l, false, true);
        if (b) q.kln_b = Add(p + "attn.k_ln.bias", {hd_}, l, false);
      }
      q.proj_w = Add(p + "attn.c_proj.weight", {d_, d_}, l, true);
      if (b) q.proj_b = Add(p + "attn.c_proj.bias", {d_}, l, false);
      q.ln2_w = Add(p + "ln_2.weight", {d_}, l, false, true);
      if (b) q.ln2_b = Add(p + "ln_2.bias", {d_}, l, false);
      q.fc_w = Add(p + "mlp.c_fc.weight", {fc_out_, d_}, l, true);
      if (b) q.fc_b = Add(p + "mlp.c_fc.bias", {fc_out_}, l, false);
      q.fcproj_w = Add(p + "mlp.c_proj.weight", {d_, hidden_}, l, true);
      if (b) q.fcproj_b = Add(p + "mlp.c_proj.bias", {d_}, l, false);
      for (const char* n : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
        linear_names_.push_back(p + n);
      }
    }
    lnf_w_ = Add("ln_f.weight", {d_}, -1, false, true);
    if (b) lnf_b_ = Add("ln_f.bias", {d_}, -1, false);
    linear_names_.push_back("lm_head");
    KEEL_RETURN_IF_ERROR(AllocateParams());

    // Activations (what the backward needs) and gradient scratch.
    const int64_t heads = m_.heads;
    res_.resize(blocks_ + 1);
    for (float*& r : res_) KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &r));
    acts_.resize(blocks_);
    for (BlockActs& a : acts_) {
      KEEL_RETURN_IF_ERROR(Scratch(bt_, &a.ln1_mean));
      KEEL_RETURN_IF_ERROR(Scratch(bt_, &a.ln1_rstd));
      if (m_.qk_layernorm) {
        KEEL_RETURN_IF_ERROR(Scratch(bt_ * 3 * d_, &a.qkv_normed));
        KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &a.q_raw));
        KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &a.k_raw));
        KEEL_RETURN_IF_ERROR(Scratch(bt_ * heads, &a.q_mean));
        KEEL_RETURN_IF_ERROR(Scratch(bt_ * heads, &a.q_rstd));
        KEEL_RETURN_IF_ERROR(Scratch(bt_ * heads, &a.k_mean));
        KEEL_RETURN_IF_ERROR(Scratch(bt_ * heads, &a.k_rstd));
      }
      KEEL_RETURN_IF_ERROR(Scratch(static_cast<int64_t>(batch_) * heads * seq_ * 2, &a.att_stats));
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &a.att));
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &a.mid));
      KEEL_RETURN_IF_ERROR(Scratch(bt_, &a.ln2_mean));
      KEEL_RETURN_IF_ERROR(Scratch(bt_, &a.ln2_rstd));
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * fc_out_, &a.fc));
    }
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &lnf_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_, &lnf_mean_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_, &lnf_rstd_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_, &losses_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_, &tokens_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_, &targets_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &dres_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &dln_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * 3 * d_, &dqkv_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &datt_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * fc_out_, &dfc_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * hidden_, &dact_));
    if (m_.qk_layernorm) {
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &dhead_in_));
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &dhead_out_));
    }
    // The layernorms' affine parameters, rounded to the scheme's layernorm format every pass.
    KEEL_RETURN_IF_ERROR(AllocateParamCopies([this](size_t i) {
      const ParamInfo& p = params_[i];
      return p.shape.size() == 1 &&
             (p.name.find("ln_") != std::string::npos || p.name.find("_ln.") != std::string::npos);
    }));
    return Status::Ok();
  }

  Status Init(uint64_t seed) override {
    // GPT-2's init: N(0, 0.02) matrices, residual projections scaled by
    // 1/sqrt(2 L), position embeddings N(0, 0.01), zero biases, unit LN gains.
    std::vector<float> host(param_count_, 0.0f);
    const float proj_std = 0.02f / std::sqrt(2.0f * blocks_);
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamInfo& p = params_[i];
      float* dst = host.data() + p.offset;
      if (p.ln_gamma) {
        std::fill(dst, dst + p.count, 1.0f);
      } else if (p.shape.size() == 2) {
        bool proj = p.name.find("c_proj.weight") != std::string::npos;
        float stddev = p.name == "wpe" ? 0.01f : proj ? proj_std : 0.02f;
        InitNormal(Mix(seed, i), stddev, dst, p.count);
        if (p.name == "wte") {
          // Padded vocabulary rows never see a target; keep them zero.
          std::fill(dst + m_.vocab * d_, dst + p.count, 0.0f);
        }
      }
    }
    return backend_->Upload(weights_, host.data(), host.size() * sizeof(float));
  }

  Status ForwardBackward(const Batch& batch, const PrecisionScheme& scheme, uint64_t quant_seed,
                         float grad_scale, bool stats, float* grads, double* loss,
                         const GradientReady& ready) override {
    int64_t valid = 0;
    auto G = [&](int index) { return index < 0 ? nullptr : grads + params_[index].offset; };
    SetHeadGradients(dln_, G(wte_));  // an MX head runs its backward in the forward's chunks
    const Status forward = Forward(batch, scheme, quant_seed, stats, &grad_scale, loss, &valid);
    SetHeadGradients(nullptr, nullptr);
    KEEL_RETURN_IF_ERROR(forward);
    if (valid == 0) return Status::Ok();
    // Head (tied to wte) and final layernorm. The forward's fused cross-entropy
    // left dlogits (HeadAndLoss), unless it ran the head's backward itself.
    // wte's gradient is final only after the embedding's backward, at the end.
    if (!head_backward_done()) {
      KEEL_RETURN_IF_ERROR(backend_->LinearBackward(lnf_, P(wte_), head_dy(), dln_, G(wte_), nullptr, bt_, d_,
                                                    m_.padded_vocab,
                                                    HeadBackward(Quant(scheme, -1, 0, quant_seed, stats))));
    }
    KEEL_RETURN_IF_ERROR(backend_->Fill(dres_, bt_ * d_, 0.0f));
    KEEL_RETURN_IF_ERROR(backend_->LayerNormBackward(res_[blocks_], Affine(lnf_w_), lnf_mean_, lnf_rstd_,
                                                dln_, dres_, G(lnf_w_), G(lnf_b_), bt_, d_));
    KEEL_RETURN_IF_ERROR(Final(ready, {lnf_w_, lnf_b_}));
    for (int l = blocks_ - 1; l >= 0; --l) {
      const BlockParams& q = bp_[l];
      const BlockActs& a = acts_[l];
      // MLP.
      KEEL_RETURN_IF_ERROR(backend_->LinearBackward(a.act, P(q.fcproj_w), dres_, dact_, G(q.fcproj_w),
                                               G(q.fcproj_b), bt_, hidden_, d_,
                                               FcProjQuant(scheme, l, quant_seed, stats, a)));
      KEEL_RETURN_IF_ERROR(Final(ready, {q.fcproj_w, q.fcproj_b}));
      LinearQuant fc_q = XInBf16(Quant(scheme, l, 2, quant_seed, stats), a.ln2, d_);
      if (m_.mlp == "swiglu") {
        KEEL_RETURN_IF_ERROR(backend_->SwigluBackward(a.fc, dact_, dfc_, bt_, hidden_));
      } else if (TakesBf16Dy(fc_q)) {
        // GELU's backward writes fc's dy rounded to bf16 (into dfc_) and sums
        // its bias gradient, both as fc's backward would have: the same bits.
        KEEL_RETURN_IF_ERROR(backend_->GeluBackwardBf16(a.fc, dact_, reinterpret_cast<uint16_t*>(dfc_), bt_, hidden_,
                                                        G(q.fc_b)));
        fc_q.dy_bf16 = reinterpret_cast<const uint16_t*>(dfc_);
        fc_q.dy_bf16_ld = hidden_;
      } else {
        KEEL_RETURN_IF_ERROR(backend_->GeluBackward(a.fc, dact_, dfc_, bt_ * hidden_));
      }
      KEEL_RETURN_IF_ERROR(backend_->LinearBackward(a.ln2, P(q.fc_w), fc_q.dy_bf16 ? nullptr : dfc_, dln_,
                                               G(q.fc_w), fc_q.dy_bf16 ? nullptr : G(q.fc_b), bt_, d_, fc_out_,
                                               fc_q));
      KEEL_RETURN_IF_ERROR(Final(ready, {q.fc_w, q.fc_b}));
      KEEL_RETURN_IF_ERROR(backend_->LayerNormBackward(a.mid, Affine(q.ln2_w), a.ln2_mean, a.ln2_rstd,
                                                  dln_, dres_, G(q.ln2_w), G(q.ln2_b), bt_, d_));
      KEEL_RETURN_IF_ERROR(Final(ready, {q.ln2_w, q.ln2_b}));
      // Attention.
      KEEL_RETURN_IF_ERROR(backend_->LinearBackward(a.att, P(q.proj_w), dres_, datt_, G(q.proj_w),
                                               G(q.proj_b), bt_, d_, d_,
                                               Quant(scheme, l, 1, quant_seed, stats)));
      KEEL_RETURN_IF_ERROR(Final(ready, {q.proj_w, q.proj_b}));
      if (a.kept) {
        KEEL_RETURN_IF_ERROR(backend_->AttentionBackwardKept(a.qkv, a.att, a.att_stats, datt_, dqkv_, batch_, seq_,
                                                             m_.heads, d_, AttentionBf16(scheme, l)));
      } else {
        const float* qkv_used = m_.qk_layernorm ? a.qkv_normed : a.qkv;
        KEEL_RETURN_IF_ERROR(backend_->AttentionBackward(qkv_used, a.att, a.att_stats, datt_, dqkv_, batch_,
                                                         seq_, m_.heads, d_, AttentionBf16(scheme, l)));
      }
      if (m_.qk_layernorm) {
        KEEL_RETURN_IF_ERROR(HeadNormBackward(a.q_raw, q.qln_w, q.qln_b, a.q_mean, a.q_rstd, 0, grads));
        KEEL_RETURN_IF_ERROR(Final(ready, {q.qln_w, q.qln_b}));
        KEEL_RETURN_IF_ERROR(HeadNormBackward(a.k_raw, q.kln_w, q.kln_b, a.k_mean, a.k_rstd, d_, grads));
        KEEL_RETURN_IF_ERROR(Final(ready, {q.kln_w, q.kln_b}));
      }
      KEEL_RETURN_IF_ERROR(backend_->LinearBackward(a.ln1, P(q.attn_w), dqkv_, dln_, G(q.attn_w),
                                               G(q.attn_b), bt_, d_, 3 * d_,
                                               XInBf16(Quant(scheme, l, 0, quant_seed, stats), a.ln1, d_)));
      KEEL_RETURN_IF_ERROR(Final(ready, {q.attn_w, q.attn_b}));
      KEEL_RETURN_IF_ERROR(backend_->LayerNormBackward(res_[l], Affine(q.ln1_w), a.ln1_mean, a.ln1_rstd,
                                                  dln_, dres_, G(q.ln1_w), G(q.ln1_b), bt_, d_));
      KEEL_RETURN_IF_ERROR(Final(ready, {q.ln1_w, q.ln1_b}));
    }
    KEEL_RETURN_IF_ERROR(backend_->EmbeddingBackward(tokens_, dres_, G(wte_), G(wpe_), batch_, seq_, d_));
    return Final(ready, {wte_, wpe_});
  }

  Status Evaluate(const Batch& batch, const PrecisionScheme& scheme, uint64_t quant_seed,
                  double* loss) override {
    int64_t valid = 0;
    return Forward(batch, scheme, quant_seed, false, nullptr, loss, &valid);
  }

 private:
  int Add(const std::string& name, std::vector<int64_t> shape, int block, bool decay,
          bool ln_gamma = false) {
    AddParam(name, std::move(shape), block, decay, ln_gamma);
    return static_cast<int>(params_.size()) - 1;
  }

  // The (possibly quantized) copy of a layernorm affine parameter; null stays null.
  float* Affine(int index) const { return ParamCopy(index); }

  bool AttentionBf16(const PrecisionScheme& scheme, int block) const {
    (void)block;
    return scheme.attention_bf16;
  }

  // The MLP's output projection reads act in bf16 when act is GELU's (SwiGLU
  // writes fp32).
  LinearQuant FcProjQuant(const PrecisionScheme& scheme, int block, uint64_t seed, bool stats,
                          const BlockActs& a) const {
    const LinearQuant q = Quant(scheme, block, 3, seed, stats);
    return m_.mlp == "swiglu" ? q : XInBf16(q, a.act, hidden_);
  }

  LinearQuant Quant(const PrecisionScheme& scheme, int block, int which, uint64_t seed,
                    bool stats) const {
    LinearQuant q = scheme.LinearFor(block, blocks_);
    int slot = block < 0 ? 4 * blocks_ : 4 * block + which;
    q.seed = Mix(seed, slot);
    q.stats_slot = stats ? slot : -1;
    q.analytics_slot = slot;  // read only on the steps the trainer arms analytics
    q.keep_slot = slot;       // each layer's x and w are untouched between its forward and backward
    return WithHcp(q, scheme, slot);
  }

  Status QuantizeAffine(const PrecisionScheme& scheme, uint64_t seed) {
    for (size_t i = 0; i < params_.size(); ++i) {
      float* copy = Affine(static_cast<int>(i));
      if (copy == nullptr) continue;  // not a layernorm affine parameter
      KEEL_RETURN_IF_ERROR(backend_->QuantizeDequantize(P(i), 1, params_[i].count, 1, scheme.layernorm,
                                                   Mix(seed, 1000003ull + i), copy));
    }
    return Status::Ok();
  }

  // QK-LayerNorm forward on the q (col0 = 0) or k (col0 = d) part of qkv: per
  // token and head, over hd features.
  Status HeadNormForward(const float* qkv, float* qkv_normed, float* raw, int w, int b, float* mean,
                         float* rstd, int64_t col0) {
    KEEL_RETURN_IF_ERROR(backend_->Copy2D(qkv + col0, 3 * d_, raw, d_, bt_, d_));
    KEEL_RETURN_IF_ERROR(backend_->LayerNormForward(raw, Affine(w), Affine(b), dhead_out_, mean, rstd,
                                               bt_ * m_.heads, hd_, m_.ln_eps));
    return backend_->Copy2D(dhead_out_, d_, qkv_normed + col0, 3 * d_, bt_, d_);
  }

  // Its backward: dqkv_'s q or k part (the gradient w.r.t. the normed values)
  // becomes the gradient w.r.t. the raw values.
  Status HeadNormBackward(const float* raw, int w, int b, const float* mean, const float* rstd,
                          int64_t col0, float* grads) {
    auto G = [&](int index) { return index < 0 ? nullptr : grads + params_[index].offset; };
    KEEL_RETURN_IF_ERROR(backend_->Copy2D(dqkv_ + col0, 3 * d_, dhead_in_, d_, bt_, d_));
    KEEL_RETURN_IF_ERROR(backend_->Fill(dhead_out_, bt_ * d_, 0.0f));
    KEEL_RETURN_IF_ERROR(backend_->LayerNormBackward(raw, Affine(w), mean, rstd, dhead_in_, dhead_out_,
                                                G(w), G(b), bt_ * m_.heads, hd_));
    return backend_->Copy2D(dhead_out_, d_, dqkv_ + col0, 3 * d_, bt_, d_);
  }

  // The forward pass: *loss = the mean loss over the *valid targets that count.
  // Training (grad_scale not null, and some target counts): the cross-entropy
  // also leaves dlogits = grad_scale / valid * d(sum of losses)/d logits for the
  // backward, in the same pass (HeadAndLoss; nothing reads the logits
  // themselves after it).
  Status Forward(const Batch& batch, const PrecisionScheme& scheme, uint64_t quant_seed, bool stats,
                 const float* grad_scale, double* loss, int64_t* valid) {
    KEEL_RETURN_IF_ERROR(UploadTokens(batch, "gpt", bt_, tokens_, targets_, valid));
    KEEL_RETURN_IF_ERROR(QuantizeAffine(scheme, quant_seed));
    KEEL_RETURN_IF_ERROR(backend_->EmbeddingForward(tokens_, P(wte_), P(wpe_), res_[0], batch_, seq_, d_));
    // The residual the next LayerNorm adds to its input first (LinearThenResidual).
    const float* pending = nullptr;
    for (int l = 0; l < blocks_; ++l) {
      const BlockParams& q = bp_[l];
      BlockActs& a = acts_[l];
      // ln1, ln2 and act are written in bf16 when the linear layer they feed
      // reads them so (XInBf16), into buffers of that size.
      const LinearQuant attn_plain = Quant(scheme, l, 0, quant_seed, stats);
      KEEL_RETURN_IF_ERROR(GrowActivation(attn_plain, bt_ * d_, &a.ln1, &a.ln1_bytes));
      const LinearQuant attn_q = XInBf16(attn_plain, a.ln1, d_);
      KEEL_RETURN_IF_ERROR(LayerNormAfter(attn_q, res_[l], pending, Affine(q.ln1_w), Affine(q.ln1_b), a.ln1,
                                          a.ln1_mean, a.ln1_rstd, bt_, d_, m_.ln_eps));
      // Where the backend keeps the attention's heads (their bf16 copy is what its backward reads), q, k
      // and v go to dqkv_ (free until the backward) and the heads to a.qkv: nothing packs qkv a second time.
      const bool att_bf16 = AttentionBf16(scheme, l);
      KEEL_RETURN_IF_ERROR(
          GrowSavedQkv(bt_ * 3 * d_, d_ / m_.heads, att_bf16, !m_.qk_layernorm, &a.kept, &a.qkv, &a.qkv_bytes));
      float* qkv_out = a.kept ? dqkv_ : a.qkv;
      KEEL_RETURN_IF_ERROR(backend_->LinearForward(a.ln1, P(q.attn_w), q.attn_b < 0 ? nullptr : P(q.attn_b),
                                              nullptr, qkv_out, bt_, d_, 3 * d_, attn_q));
      if (a.kept) {
        KEEL_RETURN_IF_ERROR(backend_->AttentionForwardKeep(qkv_out, a.qkv, a.att, a.att_stats, batch_, seq_,
                                                            m_.heads, d_, att_bf16));
      } else {
        const float* qkv_used = a.qkv;
        if (m_.qk_layernorm) {
          KEEL_RETURN_IF_ERROR(backend_->CopyBytes(a.qkv_normed, a.qkv, bt_ * 3 * d_ * sizeof(float)));
          KEEL_RETURN_IF_ERROR(
              HeadNormForward(a.qkv, a.qkv_normed, a.q_raw, q.qln_w, q.qln_b, a.q_mean, a.q_rstd, 0));
          KEEL_RETURN_IF_ERROR(
              HeadNormForward(a.qkv, a.qkv_normed, a.k_raw, q.kln_w, q.kln_b, a.k_mean, a.k_rstd, d_));
          qkv_used = a.qkv_normed;
        }
        KEEL_RETURN_IF_ERROR(backend_->AttentionForward(qkv_used, a.att, a.att_stats, batch_, seq_, m_.heads, d_,
                                                        att_bf16));
      }
      // mid = res + proj(att), the add done by ln2 when proj has a bias.
      // Nothing reads the projection without the residual (its backward needs
      // att, the weight and dmid).
      KEEL_RETURN_IF_ERROR(LinearThenResidual(a.att, P(q.proj_w), q.proj_b < 0 ? nullptr : P(q.proj_b), res_[l],
                                              a.mid, bt_, d_, d_, Quant(scheme, l, 1, quant_seed, stats), &pending));
      const LinearQuant fc_plain = Quant(scheme, l, 2, quant_seed, stats);
      KEEL_RETURN_IF_ERROR(GrowActivation(fc_plain, bt_ * d_, &a.ln2, &a.ln2_bytes));
      const LinearQuant fc_q = XInBf16(fc_plain, a.ln2, d_);
      KEEL_RETURN_IF_ERROR(LayerNormAfter(fc_q, a.mid, pending, Affine(q.ln2_w), Affine(q.ln2_b), a.ln2,
                                          a.ln2_mean, a.ln2_rstd, bt_, d_, m_.ln_eps));
      KEEL_RETURN_IF_ERROR(backend_->LinearForward(a.ln2, P(q.fc_w), q.fc_b < 0 ? nullptr : P(q.fc_b), nullptr,
                                              a.fc, bt_, d_, fc_out_, fc_q));
      // SwiGLU writes act in fp32: an fp32-sized buffer (LinearQuant() takes no bf16 x).
      KEEL_RETURN_IF_ERROR(GrowActivation(m_.mlp == "swiglu" ? LinearQuant() : Quant(scheme, l, 3, quant_seed, stats),
                                          bt_ * hidden_, &a.act, &a.act_bytes));
      const LinearQuant fcproj_q = FcProjQuant(scheme, l, quant_seed, stats, a);
      if (m_.mlp == "swiglu") {
        KEEL_RETURN_IF_ERROR(backend_->SwigluForward(a.fc, a.act, bt_, hidden_));
      } else {
        KEEL_RETURN_IF_ERROR(GeluFor(fcproj_q, a.fc, a.act, bt_ * hidden_));
      }
      // res[l + 1] = mid + fcproj(act), the same way (the add done by the
      // next block's ln1, or by ln_f).
      KEEL_RETURN_IF_ERROR(LinearThenResidual(a.act, P(q.fcproj_w), q.fcproj_b < 0 ? nullptr : P(q.fcproj_b),
                                              a.mid, res_[l + 1], bt_, hidden_, d_, fcproj_q, &pending));
    }
    KEEL_RETURN_IF_ERROR(LayerNormAfter(LinearQuant(), res_[blocks_], pending, Affine(lnf_w_), Affine(lnf_b_), lnf_,
                                        lnf_mean_, lnf_rstd_, bt_, d_, m_.ln_eps));
    return HeadAndLoss(lnf_, P(wte_), targets_, losses_, bt_, d_, m_.padded_vocab, m_.vocab,
                       Quant(scheme, -1, 0, quant_seed, stats), grad_scale, *valid, loss);
  }

  ModelConfig m_;
  int batch_, seq_;
  int64_t bt_, d_, hd_, hidden_, fc_out_;
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  std::vector<BlockParams> bp_;
  std::vector<BlockActs> acts_;
  std::vector<float*> res_;
  float *lnf_, *lnf_mean_, *lnf_rstd_, *losses_;
  int32_t *tokens_, *targets_;
  float *dres_, *dln_, *dqkv_, *datt_, *dfc_, *dact_, *dhead_in_ = nullptr, *dhead_out_ = nullptr;
};

}  // namespace

std::unique_ptr<Model> NewGptModel(const RunConfig& config, Backend* backend) {
  return std::unique_ptr<Model>(new GptModel(config, backend));
}

}  // namespace keel
