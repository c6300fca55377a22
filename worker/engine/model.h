// The models keel-train trains, written once against the Backend interface
// (kernels/nn.h) so the CPU and CUDA runs execute the same operations:
//   - ProxyModel: the MX-instability paper's student ResidualMLP(d, L) learning a
//     frozen teacher on fresh Gaussian batches (docs/numerics.md, "The proxy model");
//   - GptModel: a GPT-2-style decoder LM (pre-LN, causal softmax attention, GELU or
//     SwiGLU MLP, final LN, head tied to the token embedding; optional QK-LN and
//     no biases);
//   - the llama model: a Llama-style decoder LM (RMSNorm, RoPE, causal softmax
//     attention, SwiGLU, no biases, head tied to the token embedding), written
//     as DecoderModel (model_decoder.h), whose sequence mixer is the one part a
//     model of that family supplies (model_llama.cc: softmax attention);
//   - the gla model: the same decoder with gated linear attention as the mixer
//     (model_gla.cc).
// Parameters live in one flat backend buffer (so the optimizer, clipping and
// checkpoints see one array); ParamInfo says where each tensor sits.
#ifndef KEEL_WORKER_ENGINE_MODEL_H_
#define KEEL_WORKER_ENGINE_MODEL_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kernels/nn.h"
#include "kernels/base/status.h"
#include "worker/config/run_config.h"
#include "worker/config/scheme.h"

namespace keel {

struct ParamInfo {
  std::string name;            // "blocks.0.fc1.weight", safetensors tensor name
  std::vector<int64_t> shape;
  int64_t offset = 0;          // floats from the start of the flat buffer
  int64_t count = 0;
  int block = -1;              // residual/transformer block, -1 outside blocks
  bool decay = false;          // matrices take AdamW weight decay
  bool ln_gamma = false;       // a layernorm gain (gamma mean/std are logged)
};

// One micro-batch. gpt, llama, gla: batch x seq tokens and next-token targets. proxy:
// data_seed draws x ~ N(0, I) and the target noise.
struct Batch {
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
  uint64_t data_seed = 0;
};

// Told during a backward that the gradient of parameter `index` (into
// param_info()) is final: nothing later in that ForwardBackward writes its part
// of grads. The trainer starts reducing a bucket of gradients once all its
// tensors are final (trainer.h). A failure ends the backward with it.
using GradientReady = std::function<Status(int index)>;

class Model {
 public:
  virtual ~Model();

  const std::vector<ParamInfo>& param_info() const { return params_; }
  int64_t param_count() const { return param_count_; }
  // Bytes held now by the activations whose size follows the step's scheme
  // (GrowActivation): bf16 ones take half an fp32 one's.
  int64_t scheme_sized_bytes() const { return scheme_sized_bytes_; }
  // Bytes held now by a language model's head buffers (HeadAndLoss): fp32
  // logits of every row, or of one chunk of rows plus every row's bf16 dlogits.
  int64_t head_bytes() const { return static_cast<int64_t>(head_bytes_); }
  // Whether the last forward pass ran the head's backward too (an MX head in
  // chunks, HeadAndLoss), which the model's backward then skipped.
  bool head_backward_done() const { return head_backward_done_; }
  // The most fp32 logits HeadAndLoss holds at once when it runs in chunks
  // (default kHeadChunkFloats); for tests and benchmarks.
  void SetHeadChunkFloats(int64_t floats) { head_chunk_floats_ = floats; }
  // 1 GiB of fp32 logits: 4 chunks at GPT-2 124M B16 (+0.5% step time, 754 MiB
  // less peak on an H200); 256 MiB saved 1,374 MiB for +3.0%, as each chunk
  // rounds the whole head weight to bf16 again (docs/benchmarks.md, session 32).
  static constexpr int64_t kHeadChunkFloats = int64_t{256} << 20;
  float* params() const { return weights_; }  // backend memory
  int blocks() const { return blocks_; }
  // Names of the quantized linear layers, in statistics-slot order.
  const std::vector<std::string>& linear_names() const { return linear_names_; }
  // Samples (proxy) or tokens (gpt, llama, gla) one micro-batch holds.
  virtual int64_t items_per_batch() const = 0;

  // Registers the parameters and allocates parameters and activations (MakeModel
  // calls it once).
  virtual Status Build() = 0;
  // Writes the initial weights (drawn on the host from `seed`, so every backend
  // starts from the same bits).
  virtual Status Init(uint64_t seed) = 0;
  // One micro-batch: *loss = its mean loss; grads (param_count floats, backend)
  // += grad_scale * d loss / d params. quant_seed feeds stochastic rounding.
  // stats: record operand statistics into the linear layers' slots.
  // ready (when set) is called for each tensor once its gradient is written for
  // good, right after the layer that writes it (on CUDA: once its kernels are
  // queued), in the order the backward finishes them: every tensor once, unless
  // the backward writes nothing (a batch without a target that counts). It
  // changes nothing in what is computed.
  virtual Status ForwardBackward(const Batch& batch, const PrecisionScheme& scheme,
                                 uint64_t quant_seed, float grad_scale, bool stats, float* grads,
                                 double* loss, const GradientReady& ready) = 0;
  // Forward only (evaluation): *loss = the mean loss.
  virtual Status Evaluate(const Batch& batch, const PrecisionScheme& scheme, uint64_t quant_seed,
                          double* loss) = 0;

  // ---- Hot-Channel Patch state (docs/hcp.md) ----
  // The hot sets of the patched linear layers are model state: chosen by the
  // GEMMs themselves (HotChannels::choose_into) in a step that chooses, held
  // in between, saved in checkpoints. The trainer brackets each training
  // step's ForwardBackward calls with BeginHcpStep / EndHcpStep:
  //   - choose: the step re-chooses (the run's first step, then every
  //     scheme.hcp_every steps). It also chooses when no sets are held, or
  //     when `scheme` differs from the one they were chosen under (a switch).
  //     Every micro-batch of a choosing step chooses; the last one's sets
  //     are held.
  // Outside a bracket (evaluation, the probe) the held sets are used and
  // nothing is chosen; with none held, nothing is patched.
  // Every ForwardBackward inside a bracket is passed BeginHcpStep's scheme.
  Status BeginHcpStep(const PrecisionScheme& scheme, bool choose);
  void EndHcpStep();
  // Whether the current (or last) bracket chose: the trainer then broadcasts
  // rank 0's sets (hot_set_buffer) so that every rank holds the same.
  bool hcp_choosing() const { return hcp_choosing_; }
  // The device buffer of every patched layer's sets, and its length in int32s
  // (null, 0 before the first patched step).
  int32_t* hot_set_buffer() const { return hot_index_; }
  int64_t hot_set_ints() const { return hot_capacity_; }
  // The held sets as checkpoint text ("" when none are held), and back. The
  // text names the scheme they were chosen under (sets of another scheme are
  // dropped: chosen again). CheckHotSetsText refuses text whose layers, counts
  // or indices do not fit this model, naming what does not, and changes
  // nothing; HotSetsFromText checks the same before it changes anything.
  Status HotSetsToText(std::string* out) const;
  Status CheckHotSetsText(const std::string& text, const PrecisionScheme& scheme) const;
  Status HotSetsFromText(const std::string& text, const PrecisionScheme& scheme);

 protected:
  explicit Model(Backend* backend) : backend_(backend) {}
  // Registers a parameter tensor (call in order, before AllocateParams).
  void AddParam(const std::string& name, std::vector<int64_t> shape, int block, bool decay,
                bool ln_gamma = false);
  Status AllocateParams();
  // Room for a copy of each parameter `copied` selects (the norms' affine
  // parameters or gains, which the scheme rounds every pass), packed 64 floats
  // apart, rather than a buffer the size of every parameter (0.5 GB at GPT-2
  // 124M for some 40 KB of copies). Call once, after AllocateParams.
  Status AllocateParamCopies(const std::function<bool(size_t index)>& copied);
  // Parameter `index`'s copy; null for index < 0 or a parameter not selected.
  float* ParamCopy(int index) const;
  // Backend scratch of `count` Ts (float, int32_t) that lives as long as the model.
  template <typename T>
  Status Scratch(int64_t count, T** out) {
    void* p = nullptr;
    KEEL_RETURN_IF_ERROR(ScratchBytes(static_cast<size_t>(count) * sizeof(T), &p));
    *out = static_cast<T*>(p);
    return Status::Ok();
  }
  Status ScratchBytes(size_t bytes, void** out);
  // y = linear(x) + residual (rows x out). Without a bias the residual rides in
  // the GEMM (LinearForward's residual: CPU and CUDA add it in the same order).
  // With a bias it is a separate Add: cuBLASLt's epilogue adds the bias after C,
  // so folding it would change CUDA's order from the CPU's (acc + bias) +
  // residual, and with it the free-running trajectory of 4-bit runs.
  Status LinearPlusResidual(const float* x, const float* w, const float* bias, const float* residual, float* y,
                            int64_t rows, int64_t in, int64_t out, const LinearQuant& q);
  float* P(size_t index) const { return weights_ + params_[index].offset; }
  // A language model's batch: refused ("TYPE: batch holds ...") unless it holds
  // bt tokens and bt targets; both uploaded; *valid = the targets that count
  // (>= 0).
  Status UploadTokens(const Batch& batch, const std::string& type, int64_t bt, int32_t* tokens, int32_t* targets,
                      int64_t* valid);
  // *loss = the mean cross-entropy over the `valid` targets that count, of
  // logits (bt x padded_vocab, the first `vocab` columns real; losses: bt
  // scratch). Training (grad_scale set, valid > 0): the fused pass also leaves
  // dlogits = grad_scale / valid * d(sum of losses)/d logits in `logits`.
  // head: the head's LinearQuant. When its backward takes dy in bf16
  // (TakesBf16Dy), dlogits are written rounded to bf16 over logits instead
  // (row r in the first half of logits' row r), and HeadBackward points the
  // head's backward at them: the same bits, half the bytes, no rounding pass.
  Status LanguageModelLoss(float* logits, const int32_t* targets, float* losses, int64_t bt, int64_t padded_vocab,
                           int64_t vocab, const float* grad_scale, int64_t valid, const LinearQuant& head,
                           double* loss);
  // *loss = the sum of the bt per-row losses over `valid` (0 when none counts).
  Status MeanLoss(const float* losses, int64_t bt, int64_t valid, double* loss);
  // A language model's head and loss: logits = x w^T (bt x padded_vocab; x the
  // final norm's d-wide output, w the tied embedding) and LanguageModelLoss.
  // A head that HeadChunkMultiple allows (BF16 nearest-even in all six roles:
  // chunks of any rows; MX roles with nearest rounding and no RHT, the rest
  // BF16 nearest-even or fp32: a multiple of 32 rows; never a Hot-Channel
  // Patch) runs in chunks: the largest divisor of bt of that multiple whose
  // fp32 logits fit head_chunk_floats_, unless that is under 64 rows or the
  // whole. Each chunk's logits, loss and, when training with SetHeadGradients
  // given, dlogits in place (bf16 over the logits when the head reads dy in
  // bf16) and the head's backward on them (dx of the chunk's rows written, the
  // weight's gradient added to), so that no pass holds every row's fp32 logits
  // or every row's dlogits; head_backward_done() then says the caller's
  // backward must skip the head. A row's logits, loss, dlogits and dx are
  // those of the one-piece pass; the weight's gradient is summed chunk by
  // chunk. Otherwise in one piece: every row's fp32 logits, dlogits over them.
  // The buffer grows with the pass's need and never shrinks (head_bytes()).
  Status HeadAndLoss(const float* x, const float* w, const int32_t* targets, float* losses, int64_t bt, int64_t d,
                     int64_t padded_vocab, int64_t vocab, const LinearQuant& head, const float* grad_scale,
                     int64_t valid, double* loss);
  // The head's logits chunk by chunk (rows of x at a time into `logits`), each followed by
  // after_chunk(r0), its first row, with w held (Backend::HoldWeight) throughout: w does not
  // change across the chunks, so the backend may quantize it once for all of them.
  Status HeadChunks(const float* x, const float* w, float* logits, int64_t bt, int64_t rows, int64_t d,
                    int64_t padded_vocab, const LinearQuant& head, const std::function<Status(int64_t r0)>& after_chunk);
  // The head backward's fp32 dy: the one-piece pass's dlogits (not read when
  // HeadBackward gives the backward its dy in bf16).
  float* head_dy() const { return static_cast<float*>(head_buf_); }
  // The head's backward LinearQuant: q, with dy_bf16 set when the last
  // LanguageModelLoss wrote dlogits in bf16.
  LinearQuant HeadBackward(LinearQuant q) const;
  // Where HeadAndLoss may run the head's backward (a training pass's dx, bt x d
  // written, and the tied weight's gradient, added to); null: it may not. A
  // ForwardBackward sets them around its forward pass.
  void SetHeadGradients(float* dx, float* dw) {
    head_dx_ = dx;
    head_dw_ = dw;
  }

  // Activations in bf16 where the scheme allows it. XInBf16: q reading its x
  // from `buffer` as bf16 rows (ld apart) when the layer takes x in bf16
  // (TakesBf16X), else q unchanged; a layer's forward and backward both call it
  // on the same buffer. The producers then write into that buffer what q reads:
  // bf16 (the rounding the layer's x roles would apply, so the same bits, half
  // the bytes and no rounding pass) when q.x_bf16 is set, else fp32.
  static LinearQuant XInBf16(LinearQuant q, const float* buffer, int64_t ld);
  // Whether XInBf16 gives q its x in bf16.
  static bool XBf16(const LinearQuant& q);
  // Makes *buffer hold `count` elements of what XInBf16(q, ...) reads (bf16 or
  // fp32), reallocating it (contents not kept) when it is smaller; *bytes is
  // its size. Such a buffer grows when a later step's scheme needs fp32, and
  // never shrinks.
  Status GrowActivation(const LinearQuant& q, int64_t count, float** buffer, size_t* bytes);
  // The buffer a block saves its attention's q, k and v in between the passes (count = batch * seq *
  // 3 * width values): where `may_keep` and the backend keeps the heads (Backend::KeepsAttentionHeads(
  // head_dim, bf16)), *kept is set and the buffer holds their bf16 copy, half of qkv's fp32 bytes;
  // else *kept is cleared and it holds q, k and v in fp32. Grown as GrowActivation grows, counted in
  // scheme_sized_bytes.
  Status GrowSavedQkv(int64_t count, int64_t head_dim, bool bf16, bool may_keep, bool* kept, float** buffer,
                      size_t* bytes);
  // Makes *buffer (model scratch) hold `need` bytes, reallocating it (contents
  // not kept) when it is smaller; *bytes is its size.
  Status GrowScratch(size_t need, void** buffer, size_t* bytes);
  // q with the Hot-Channel Patch of `scheme` for linear layer `slot`
  // (linear_names() order): none when the scheme patches nothing or the layer
  // has no role below BF16; else the layer's held sets, or (in a choosing
  // step) choose_into them. Every model's LinearQuant helper calls it.
  LinearQuant WithHcp(LinearQuant q, const PrecisionScheme& scheme, int slot) const;
  Status LayerNormFor(const LinearQuant& q, const float* x, const float* gamma, const float* beta, float* y,
                      float* mean, float* rstd, int64_t rows, int64_t cols, float eps);
  // A residual block's output y = linear(x) + residual when a LayerNorm reads
  // it next: without a bias, LinearPlusResidual (the residual in the GEMM) and
  // *pending = null; with one, y = linear(x) alone and *pending = residual,
  // which that LayerNorm adds in its own pass (LayerNormAfter): the bits of a
  // separate Add, without writing y and reading it back once more.
  Status LinearThenResidual(const float* x, const float* w, const float* bias, const float* residual, float* y,
                            int64_t rows, int64_t in, int64_t out, const LinearQuant& q, const float** pending);
  // LayerNormFor(q, x, ...) when pending is null, else x = x + pending and the
  // LayerNorm of that in one pass (Backend::AddLayerNormForward).
  Status LayerNormAfter(const LinearQuant& q, float* x, const float* pending, const float* gamma,
                        const float* beta, float* y, float* mean, float* rstd, int64_t rows, int64_t cols, float eps);
  Status GeluFor(const LinearQuant& q, const float* x, float* y, int64_t count);
  // ready(i) for each i of `indices` that is a tensor (>= 0; an absent one is
  // -1), in order; nothing when ready is not set.
  static Status Final(const GradientReady& ready, std::initializer_list<int> indices);

  Backend* backend_;
  std::vector<ParamInfo> params_;
  // Where the last LanguageModelLoss left bf16 dlogits (null: fp32 in logits).
  const uint16_t* dlogits_bf16_ = nullptr;
  int64_t dlogits_bf16_ld_ = 0;
  int64_t param_count_ = 0;
  float* weights_ = nullptr;
  int blocks_ = 0;
  std::vector<std::string> linear_names_;
  std::vector<void*> allocations_;
  int64_t scheme_sized_bytes_ = 0;
  float* param_copies_ = nullptr;
  void* head_buf_ = nullptr;
  size_t head_bytes_ = 0;
  int64_t head_chunk_floats_ = kHeadChunkFloats;
  float* head_dx_ = nullptr;  // SetHeadGradients
  float* head_dw_ = nullptr;
  bool head_backward_done_ = false;
  std::vector<int64_t> param_copy_at_;  // per parameter: its copy's offset in param_copies_, or -1

 private:
  // GrowActivation's and GrowSavedQkv's growth for a buffer of `need` bytes.
  Status GrowActivationBytes(size_t need, float** buffer, size_t* bytes);
  // The contraction widths of linear layer `slot`'s forward (in) and dgrad
  // (out) GEMMs, from its weight tensor (NAME.weight, or the tied embedding
  // for lm_head).
  void LinearShape(int slot, int64_t* in, int64_t* out) const;
  // The parsed sets of HotSetsToText's text (held false: another scheme's).
  struct ParsedHotSets {
    bool held = false;
    std::vector<int32_t> index, fwd, dgrad;  // index: layers x 2 x channels
  };
  Status ParseHotSets(const std::string& text, const PrecisionScheme& scheme, ParsedHotSets* out) const;
  // hot_index_ sized for `channels` per set (allocated when it is not yet).
  Status HotIndexFor(int channels);
  // Hot sets: per layer, hcp_channels_ int32s for the forward and as many for
  // the dgrad, in one device buffer (layer-major), with the counts used.
  int32_t* hot_index_ = nullptr;
  int64_t hot_capacity_ = 0;
  int hot_channels_ = 0;                 // per set, as allocated
  // Counts per layer (0: not patched), set by the GEMMs that choose.
  mutable std::vector<int32_t> hot_fwd_, hot_dgrad_;
  std::vector<int32_t> hot_k_;           // a choosing step's set size per layer (LinearShape)
  bool hot_held_ = false;
  std::string hot_scheme_;               // DescribeScheme of what they were chosen under
  bool hcp_in_step_ = false, hcp_choosing_ = false;
};

// Builds the model config.model describes, sized for config.batch x config.seq.
Status MakeModel(const RunConfig& config, Backend* backend, std::unique_ptr<Model>* out);

// Host-side initialisers shared by the models (Philox-based, deterministic):
// uniform in [-bound, bound) and normal(0, stddev), element i from (seed, i).
void InitUniform(uint64_t seed, float bound, float* out, int64_t count);
void InitNormal(uint64_t seed, float stddev, float* out, int64_t count);

}  // namespace keel

#endif  // KEEL_WORKER_ENGINE_MODEL_H_
