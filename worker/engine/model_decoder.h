// DecoderModel: the decoder LM skeleton that the llama model (model_llama.cc)
// fills with causal softmax attention and the gla model (model_gla.cc) with
// gated linear attention, so that the two differ in the sequence mixer alone:
//   token embedding (no learned positions)
//   per block:  x <- x + Mixer(RMSNorm(x))
//               x <- x + down(silu(gate(h)) * up(h)),  h = RMSNorm(x)
//   final RMSNorm, LM head tied to the token embedding, softmax cross-entropy
//   over the real vocabulary (padded columns never count).
// No biases in the skeleton (a mixer may register its own: gla's gate has one).
// RMSNorm: eps model.ln_eps, a learned gain, no centring
// (nn.h RmsNormForward). gate and up are one [2h, d] matrix (rows [0, h) gate,
// [h, 2h) up) feeding nn.h's SwigluForward; h = model.mlp_hidden. Every matrix
// multiply is a Backend linear layer, so every precision scheme applies to it;
// the RMSNorm gains are quantized by the scheme's `layernorm` format, as GPT's
// layernorm affine is.
#ifndef KEEL_WORKER_ENGINE_MODEL_DECODER_H_
#define KEEL_WORKER_ENGINE_MODEL_DECODER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "worker/engine/model.h"

namespace keel {

class DecoderModel : public Model {
 public:
  int64_t items_per_batch() const override { return bt_; }
  Status Build() override;
  // Matrices N(0, 0.02), the residual outputs (kOutput: the mixer's output
  // projection, the MLP's down) N(0, 0.02 / sqrt(2 layers)), gains 1, biases 0,
  // the embedding's padded vocabulary rows 0; tensor i from seed and i.
  Status Init(uint64_t seed) override;
  Status ForwardBackward(const Batch& batch, const PrecisionScheme& scheme, uint64_t quant_seed,
                         float grad_scale, bool stats, float* grads, double* loss,
                         const GradientReady& ready) override;
  Status Evaluate(const Batch& batch, const PrecisionScheme& scheme, uint64_t quant_seed,
                  double* loss) override;

 protected:
  DecoderModel(const RunConfig& config, Backend* backend);

  // What one forward or backward pass hands the mixer.
  struct Pass {
    const PrecisionScheme* scheme = nullptr;
    uint64_t quant_seed = 0;
    bool stats = false;
  };
  // kBias: a linear layer's bias (no weight decay, not quantized, init 0).
  enum class Kind { kMatrix, kOutput, kGain, kBias };

  // ---- The mixer: what a subclass supplies ------------------------------------------
  // Names of one block's mixer linear layers in their statistics-slot order
  // ("attn.qkv", ...); the block's MLP layers take the two slots after them.
  virtual std::vector<std::string> MixerLinears() const = 0;
  // Registers block `block`'s mixer parameters under `prefix` ("layers.3.")
  // with AddTensor.
  virtual void AddMixerParams(int block, const std::string& prefix) = 0;
  // Allocates the mixer's activations and scratch (the parameters exist).
  virtual Status BuildMixer() = 0;
  // out (bt x d) = residual + Mixer(x) for block `block`; x (the normed input,
  // bt x d) stays unchanged until the backward.
  virtual Status MixerForward(int block, const float* x, const float* residual, float* out,
                              const Pass& pass) = 0;
  // From dout (bt x d, d loss / d out): dx (bt x d) written with the gradient
  // through the mixer, the mixer's parameter gradients added into grads, each
  // reported to ready (Final) once written for good.
  virtual Status MixerBackward(int block, const float* x, const float* dout, float* dx,
                               const Pass& pass, float* grads, const GradientReady& ready) = 0;

  // ---- For the mixer ----------------------------------------------------------------
  // Registers a tensor (matrices decay, gains are logged as layernorm gains,
  // biases neither);
  // returns its index in params_.
  int AddTensor(const std::string& name, std::vector<int64_t> shape, int block, Kind kind);
  // The linear layer `which` of block `block` (mixer layers first, then gate_up
  // and down); block -1 is the LM head. A mixer layer that PostQkLinear names
  // is BF16 in every role when the scheme has post_qk_bf16
  // (PrecisionScheme::LinearFor's post_qk).
  LinearQuant Quant(const Pass& pass, int block, int which) const {
    return QuantAs(pass, block, which, block >= 0 && PostQkLinear(which));
  }
  // Quant with post_qk given (a part of a layer that is post-QK on its own).
  LinearQuant QuantAs(const Pass& pass, int block, int which, bool post_qk) const;
  // Whether mixer layer `which` follows the query-key product (CHON's post-QK
  // protection keeps it in BF16): none by default.
  virtual bool PostQkLinear(int which) const { return false; }
  float* Grad(float* grads, int index) const { return grads + params_[index].offset; }
  // A gain (Kind::kGain) as this pass uses it: the scheme's layernorm-format copy.
  float* Gain(int index) const { return ParamCopy(index); }  // the gain as this pass rounded it

  const ModelConfig m_;
  const int batch_, seq_;
  const int64_t bt_, d_, hd_, hidden_;

 private:
  struct BlockParams {
    int attn_norm = -1, mlp_norm = -1, gate_up = -1, down = -1;
  };
  struct BlockActs {
    float *norm1, *rstd1, *mid, *norm2, *rstd2, *gate_up, *act;
  };

  // The scheme's copy of every gain (QuantizeDequantize by scheme.layernorm).
  Status QuantizeGains(const Pass& pass);
  // The forward pass (GptModel's contract): *loss = the mean loss over the
  // *valid targets that count; training (grad_scale set, some target counts)
  // leaves dlogits for the head's backward (HeadAndLoss).
  Status Forward(const Batch& batch, const Pass& pass, const float* grad_scale, double* loss,
                 int64_t* valid);

  int slots_per_block_ = 0;
  std::vector<Kind> kinds_;  // per tensor
  int embed_ = -1, norm_ = -1;
  std::vector<BlockParams> bp_;
  std::vector<BlockActs> acts_;
  std::vector<float*> res_;  // the residual stream before each block and after the last
  float *final_norm_ = nullptr, *final_rstd_ = nullptr, *losses_ = nullptr;
  int32_t *tokens_ = nullptr, *targets_ = nullptr;
  float *dres_ = nullptr, *dnorm_ = nullptr, *dgate_up_ = nullptr, *dact_ = nullptr;
};

}  // namespace keel

#endif  // KEEL_WORKER_ENGINE_MODEL_DECODER_H_
