// The llama model (model.type llama): DecoderModel's skeleton (model_decoder.h)
// with causal softmax attention as the mixer:
//   qkv = x . Wqkv^T            (one [3d, d] matrix: q rows [0, d), k [d, 2d), v [2d, 3d))
//   q, k <- RoPE(q), RoPE(k)    (per head, rotate-half pairs (i, i + hd/2), theta 10000, nn.h RopeForward)
//   a = softmax attention(q, k, v), causal, scale 1 / sqrt(hd)   (nn.h AttentionForward)
//   out = residual + a . Wo^T
// Parameters per block: layers.<l>.attn.qkv.weight, layers.<l>.attn.o_proj.weight
// (besides the skeleton's norms and MLP).
#include <vector>

#include "worker/engine/model_decoder.h"

namespace keel {
namespace {

// Llama's RoPE base.
constexpr double kRopeTheta = 10000.0;

class LlamaModel : public DecoderModel {
 public:
  LlamaModel(const RunConfig& config, Backend* backend) : DecoderModel(config, backend) {}

 protected:
  std::vector<std::string> MixerLinears() const override { return {"attn.qkv", "attn.o_proj"}; }

  void AddMixerParams(int block, const std::string& prefix) override {
    Attention a;
    a.qkv = AddTensor(prefix + "attn.qkv.weight", {3 * d_, d_}, block, Kind::kMatrix);
    a.o_proj = AddTensor(prefix + "attn.o_proj.weight", {d_, d_}, block, Kind::kOutput);
    attn_.push_back(a);
  }

  Status BuildMixer() override {
    const int64_t heads = m_.heads;
    for (Attention& a : attn_) {
      KEEL_RETURN_IF_ERROR(Scratch(static_cast<int64_t>(batch_) * heads * seq_ * 2, &a.stats));
      KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &a.att));
    }
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * 3 * d_, &dqkv_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &datt_));
    // The rotation tables for positions 0 .. seq - 1, made once on the host.
    std::vector<float> cos, sin;
    RopeTables(kRopeTheta, seq_, hd_, &cos, &sin);
    KEEL_RETURN_IF_ERROR(Scratch(static_cast<int64_t>(cos.size()), &rope_cos_));
    KEEL_RETURN_IF_ERROR(Scratch(static_cast<int64_t>(sin.size()), &rope_sin_));
    KEEL_RETURN_IF_ERROR(backend_->Upload(rope_cos_, cos.data(), cos.size() * sizeof(float)));
    return backend_->Upload(rope_sin_, sin.data(), sin.size() * sizeof(float));
  }

  Status MixerForward(int block, const float* x, const float* residual, float* out, const Pass& pass) override {
    Attention& a = attn_[block];
    // Where the backend keeps the attention's heads, q, k (rotated) and v are made in dqkv_ (free until the
    // backward) and the heads kept in qkv_act (bf16: half its fp32 size), which the backward reads.
    const bool bf16 = pass.scheme->attention_bf16;
    KEEL_RETURN_IF_ERROR(GrowSavedQkv(bt_ * 3 * d_, hd_, bf16, true, &a.kept, &a.qkv_act, &a.qkv_act_bytes));
    float* qkv = a.kept ? dqkv_ : a.qkv_act;
    if (pass.scheme->post_qk_bf16) {
      KEEL_RETURN_IF_ERROR(QkvForwardVInBf16(x, a, qkv, Quant(pass, block, 0), VQuant(pass, block)));
    } else {
      KEEL_RETURN_IF_ERROR(
          backend_->LinearForward(x, P(a.qkv), nullptr, nullptr, qkv, bt_, d_, 3 * d_, Quant(pass, block, 0)));
    }
    // q and k are 2 x heads heads side by side at the start of each qkv row:
    // one in-place rotation for both. The backward needs only the rotated ones.
    KEEL_RETURN_IF_ERROR(backend_->RopeForward(qkv, qkv, rope_cos_, rope_sin_, batch_, seq_, 2 * m_.heads, hd_, 3 * d_));
    if (a.kept) {
      KEEL_RETURN_IF_ERROR(
          backend_->AttentionForwardKeep(qkv, a.qkv_act, a.att, a.stats, batch_, seq_, m_.heads, d_, bf16));
    } else {
      KEEL_RETURN_IF_ERROR(backend_->AttentionForward(qkv, a.att, a.stats, batch_, seq_, m_.heads, d_, bf16));
    }
    return backend_->LinearForward(a.att, P(a.o_proj), nullptr, residual, out, bt_, d_, d_, Quant(pass, block, 1));
  }

  Status MixerBackward(int block, const float* x, const float* dout, float* dx, const Pass& pass, float* grads,
                       const GradientReady& ready) override {
    const Attention& a = attn_[block];
    KEEL_RETURN_IF_ERROR(backend_->LinearBackward(a.att, P(a.o_proj), dout, datt_, Grad(grads, a.o_proj), nullptr,
                                                  bt_, d_, d_, Quant(pass, block, 1)));
    KEEL_RETURN_IF_ERROR(Final(ready, {a.o_proj}));
    if (a.kept) {
      KEEL_RETURN_IF_ERROR(backend_->AttentionBackwardKept(a.qkv_act, a.att, a.stats, datt_, dqkv_, batch_, seq_,
                                                           m_.heads, d_, pass.scheme->attention_bf16));
    } else {
      KEEL_RETURN_IF_ERROR(backend_->AttentionBackward(a.qkv_act, a.att, a.stats, datt_, dqkv_, batch_, seq_,
                                                       m_.heads, d_, pass.scheme->attention_bf16));
    }
    // d/d(q, k before RoPE) = the rotation by minus the angle of d/d(rotated q, k).
    KEEL_RETURN_IF_ERROR(
        backend_->RopeBackward(dqkv_, dqkv_, rope_cos_, rope_sin_, batch_, seq_, 2 * m_.heads, hd_, 3 * d_));
    if (pass.scheme->post_qk_bf16) {
      KEEL_RETURN_IF_ERROR(
          QkvBackwardVInBf16(x, a, dx, Grad(grads, a.qkv), Quant(pass, block, 0), VQuant(pass, block)));
    } else {
      KEEL_RETURN_IF_ERROR(backend_->LinearBackward(x, P(a.qkv), dqkv_, dx, Grad(grads, a.qkv), nullptr, bt_, d_,
                                                    3 * d_, Quant(pass, block, 0)));
    }
    return Final(ready, {a.qkv});
  }

 private:
  // One block's attention: parameter indices and saved activations.
  struct Attention {
    int qkv = -1, o_proj = -1;
    float* qkv_act = nullptr;  // q and k rotated, v; or, when kept, the attention's bf16 heads
    size_t qkv_act_bytes = 0;  // scheme-sized (GrowSavedQkv)
    bool kept = false;         // whether the last forward kept the heads (Backend::KeepsAttentionHeads)
    float* stats = nullptr;    // the softmax's (max, 1 / sum) per row and head
    float* att = nullptr;      // the heads' outputs, bt x d
  };

  // CHON's post-QK protection for softmax attention: W_v in BF16. attn.qkv's
  // weight holds q, k, v as rows 0..d, d..2d, 2d..3d, so its v rows run as a
  // GEMM of their own, post-QK (every role BF16), beside the q, k GEMM in the
  // scheme's formats, both into the columns of qkv's rows. The v GEMM keeps its
  // operand statistics in attn.qkv's slot and runs no outlier analytics.
  LinearQuant VQuant(const Pass& pass, int block) const {
    LinearQuant v = QuantAs(pass, block, 0, /*post_qk=*/true);
    v.analytics_slot = -1;
    v.keep_slot = -1;
    return v;
  }
  Status SplitScratch() {
    if (qk_tmp_ != nullptr) return Status::Ok();
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * 2 * d_, &qk_tmp_));
    KEEL_RETURN_IF_ERROR(Scratch(bt_ * d_, &v_tmp_));
    return Scratch(bt_ * d_, &dx_v_);
  }
  Status QkvForwardVInBf16(const float* x, const Attention& a, float* qkv_out, const LinearQuant& qkv,
                           const LinearQuant& v) {
    KEEL_RETURN_IF_ERROR(SplitScratch());
    KEEL_RETURN_IF_ERROR(backend_->LinearForward(x, P(a.qkv), nullptr, nullptr, qk_tmp_, bt_, d_, 2 * d_, qkv));
    KEEL_RETURN_IF_ERROR(
        backend_->LinearForward(x, P(a.qkv) + 2 * d_ * d_, nullptr, nullptr, v_tmp_, bt_, d_, d_, v));
    KEEL_RETURN_IF_ERROR(backend_->Copy2D(qk_tmp_, 2 * d_, qkv_out, 3 * d_, bt_, 2 * d_));
    return backend_->Copy2D(v_tmp_, d_, qkv_out + 2 * d_, 3 * d_, bt_, d_);
  }
  // Its backward from dqkv_: dx = the q, k GEMM's plus the v GEMM's; each
  // adds its rows of the weight's gradient.
  Status QkvBackwardVInBf16(const float* x, const Attention& a, float* dx, float* dw, const LinearQuant& qkv,
                            const LinearQuant& v) {
    KEEL_RETURN_IF_ERROR(SplitScratch());
    KEEL_RETURN_IF_ERROR(backend_->Copy2D(dqkv_, 3 * d_, qk_tmp_, 2 * d_, bt_, 2 * d_));
    KEEL_RETURN_IF_ERROR(backend_->Copy2D(dqkv_ + 2 * d_, 3 * d_, v_tmp_, d_, bt_, d_));
    KEEL_RETURN_IF_ERROR(backend_->LinearBackward(x, P(a.qkv), qk_tmp_, dx, dw, nullptr, bt_, d_, 2 * d_, qkv));
    KEEL_RETURN_IF_ERROR(backend_->LinearBackward(x, P(a.qkv) + 2 * d_ * d_, v_tmp_, dx_v_, dw + 2 * d_ * d_,
                                                  nullptr, bt_, d_, d_, v));
    return backend_->Add(dx, dx_v_, dx, bt_ * d_);
  }

  std::vector<Attention> attn_;
  float *dqkv_ = nullptr, *datt_ = nullptr;
  float *rope_cos_ = nullptr, *rope_sin_ = nullptr;
  // post_qk_bf16's scratch, made at its first use: q, k (bt x 2d), v (bt x d),
  // and the v GEMM's dx.
  float *qk_tmp_ = nullptr, *v_tmp_ = nullptr, *dx_v_ = nullptr;
};

}  // namespace

std::unique_ptr<Model> NewLlamaModel(const RunConfig& config, Backend* backend) {
  return std::unique_ptr<Model>(new LlamaModel(config, backend));
}

}  // namespace keel
