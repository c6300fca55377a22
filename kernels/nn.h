// The neural-network layer kernels the trainer runs, behind one interface with a
// CPU implementation (nn_cpu.h, the reference, plain C++ with threads) and a CUDA
// implementation (nn_cuda_*.cu: own kernels plus cuBLASLt GEMMs). The models in
// worker/ are written once against Backend, so the CPU and CUDA runs execute the
// same sequence of operations and differ only in floating-point summation order.
//
// Contract shared by every operation:
//   - Pointers are backend memory (host memory for the CPU backend, device memory
//     for CUDA) obtained from Alloc, float32 unless said otherwise, row-major.
//   - Work may be queued and run later (CUDA: one stream, in call order); a value
//     returned to the host (SumSquares, Dots, ReadOperandStats, Download) waits
//     for everything queued before it.
//   - Every operation is deterministic: the same inputs give the same bits on the
//     same backend and device, every run (no atomics whose order varies).
//   - "accumulate" outputs (marked +=) add into what is there; all other outputs
//     are overwritten. Inputs and outputs do not alias unless said so.
//   - A failure (bad shape, CUDA error) returns a Status naming it; nothing throws.
#ifndef KEEL_KERNELS_NN_H_
#define KEEL_KERNELS_NN_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/base/numeric_types.h"
#include "kernels/formats.h"
#include "kernels/outliers.h"
#include "kernels/quantize.h"
#include "kernels/base/status.h"

namespace keel {

// Counters of one quantized operand, summed over the calls since the last reset.
// saturated (clipped): elements whose code has the format's largest magnitude
// (E4M3 448, E5M2 57344, E3M2 28, E2M3 7.5, E2M1 6) while |x| is larger than
// |dequantized value| (x after the RHT when one is applied; the dequantized value
// in float32 with every scale applied, as the CPU reference computes it). BF16
// never saturates. blocks: MX/NVFP4 blocks of the layout in quantize.h (a 16x16
// tile counts as its 16 blocks), 1 per call for per-tensor FP8 and BF16;
// nan_blocks: those holding a NaN or Inf input (MX scale byte 0xFF).
struct OperandStats {
  int64_t elements = 0;
  int64_t saturated = 0;
  int64_t blocks = 0;
  int64_t nan_blocks = 0;
};

// One op's time over a profiled interval (Backend::TakeProfile).
struct OpTime {
  std::string op;      // a Backend method, or "Method > part" for a timed part of one
  int64_t calls = 0;
  double ms = 0.0;     // total over the calls
  double host_ms = 0.0;  // host wall time inside the op (launches, checks, waits), total over the calls
};

// A table of `times` (from TakeProfile) per step over `steps` steps: each op,
// longest first, with its parts under it; the share of `step_ms` (the measured
// wall time of a step) when it is > 0, and the ops' total against it; each op's
// host time, and with `step_ms` the host time spent outside every op (the
// caller's own work between ops: where a launch-bound step's GPU waits).
std::string FormatProfile(const std::vector<OpTime>& times, int64_t steps, double step_ms);

// A span of backend floats, for the batched reductions.
struct Span {
  const float* data = nullptr;
  int64_t count = 0;
};

// One tensor of Backend::AdamWTensors: its weights, gradient, moments (count
// floats each, backend memory) and its weight decay.
struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  int64_t count = 0;
  float weight_decay = 0.0f;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda"; Describe gives the device ("cpu: 2 threads", "NVIDIA H200, sm_90, 132 SMs").
  virtual const char* name() const = 0;
  virtual std::string Describe() const = 0;

  // ---- Memory ---------------------------------------------------------------
  // Zero-filled, aligned to 256 bytes. Free(nullptr) is a no-op.
  virtual Status Alloc(size_t bytes, void** ptr) = 0;
  virtual void Free(void* ptr) = 0;
  virtual Status Upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual Status Download(void* host_dst, const void* src, size_t bytes) = 0;
  virtual Status CopyBytes(void* dst, const void* src, size_t bytes) = 0;  // backend to backend
  // Several Downloads at once, with their results: the CUDA backend queues them
  // all and waits once (the analytics read hundreds of small buffers).
  struct DownloadItem {
    void* host_dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  virtual Status DownloadMany(const std::vector<DownloadItem>& items);
  virtual Status Fill(float* x, int64_t count, float value) = 0;
  // Waits for all queued work; reports deferred errors.
  virtual Status Sync() = 0;

  // ---- Elementwise ------------------------------------------------------------
  // out = a + b (out may alias a or b).
  virtual Status Add(const float* a, const float* b, float* out, int64_t count) = 0;
  // y += alpha * x.
  virtual Status Axpy(float alpha, const float* x, float* y, int64_t count) = 0;
  // x *= alpha.
  virtual Status Scale(float* x, int64_t count, float alpha) = 0;
  // dst[r * dst_ld + c] = src[r * src_ld + c] for r < rows, c < cols.
  virtual Status Copy2D(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                        int64_t cols) = 0;
  // x_i = stddev * z_i with z_i = sqrt(-2 ln u1) * cos(2 pi u2),
  // u1 = 1 - PhiloxUniform(seed, 2 (offset + i)), u2 = PhiloxUniform(seed, 2 (offset + i) + 1)
  // (fp32 math; CPU and CUDA may differ in the last bits of log/cos).
  virtual Status RandomNormal(float* x, int64_t count, uint64_t seed, uint64_t offset,
                              float stddev) = 0;

  // ---- Quantization -------------------------------------------------------------
  // out = the dequantized value of x (rows x cols, blocks along `axis` as in
  // quantize.h) in float32, including any per-tensor scale; format.kind == kFp32
  // copies. Used on parameters that a scheme quantizes outside GEMMs (layernorm
  // affine). out may alias x.
  virtual Status QuantizeDequantize(const float* x, int64_t rows, int64_t cols, int axis,
                                    const OperandFormat& format, uint64_t seed, float* out) = 0;

  // ---- Linear layer (docs/numerics.md, "Operand roles and axes") ------------------
  // y (rows x out) = (Q_fwd_x(x) . Q_fwd_w(w)^T + bias) + residual, x: rows x in,
  // w: out x in, bias: out floats or null, residual: rows x out floats or null
  // (a transformer's skip connection, added in the same pass instead of by a
  // separate Add). Quantization of x and w along `in`, FP32 accumulation;
  // NVFP4/FP8 per-tensor decode scales are folded into the GEMM's alpha, so a
  // BF16 GEMM sees exact operands
  // (docs/numerics.md, "Emulation on Hopper and CPU");
  // they scale the product only, never the bias or the residual.
  // residual must not alias y (refused: the CPU writes the product into y before
  // it reads the residual).
  // The CPU computes (acc + bias) + residual, the bits of LinearForward without
  // residual followed by Add; CUDA sums the same three terms in cuBLASLt's
  // epilogue order, (alpha acc + residual) + bias, within the GEMM tolerance of
  // docs/numerics.md.
  virtual Status LinearForward(const float* x, const float* w, const float* bias,
                               const float* residual, float* y, int64_t rows, int64_t in,
                               int64_t out, const LinearQuant& q) = 0;
  // dx (rows x in) = Q_dgrad_dy(dy) . Q_dgrad_w(w) (dy along `out`, w down its
  // columns), written (dx may be null: skipped); dw must not be null;
  // dw (out x in) += Q_wgrad_dy(dy)^T . Q_wgrad_x(x) (both along rows);
  // dbias (out) += column sums of dy (dbias may be null), the same bits whichever
  // formats the roles have (CUDA sums them in the pass that rounds dy when a dy
  // role is BF16, else in a pass of its own, in one fixed order). Operands are
  // quantized afresh from x, w and dy (never reused from the forward; a held
  // w's copy aside: HoldWeight).
  virtual Status LinearBackward(const float* x, const float* w, const float* dy, float* dx,
                                float* dw, float* dbias, int64_t rows, int64_t in, int64_t out,
                                const LinearQuant& q) = 0;
  // HoldWeight(w): until HoldWeight(nullptr), the caller promises that w does
  // not change, so a backend may keep its quantized copies of w (the forward's
  // along rows, the dgrad's down the columns) across the linears that read it
  // instead of quantizing w again for each: a head's chunks (Model::
  // HeadAndLoss). The results keep their bits (nearest rounding, no per-tensor
  // scale or RHT: the held formats; a BF16 w that a forward keeps for its
  // backward, keep_slot, is rounded by the hold's first forward and serves
  // every chunk's forward and backward until the hold ends); the operand
  // statistics count w once instead of once a call (their fractions do not
  // change). The CPU backend quantizes afresh every time; the default does
  // nothing.
  virtual Status HoldWeight(const float* w) {
    (void)w;
    return Status::Ok();
  }
  // Statistics: ResetOperandStats(n) zeroes n slots x 6 roles; ReadOperandStats
  // returns them (slot-major, role-minor, n * 6 entries).
  virtual Status ResetOperandStats(int slots) = 0;
  virtual Status ReadOperandStats(std::vector<OperandStats>* stats) = 0;

  // ---- Hot-Channel Patch (docs/hcp.md) ------------------------------------------------
  // The GEMMs of a linear layer that HCP patches over a fixed channel set.
  enum class HcpGemm { kFwd, kDgrad };
  // scores (backend, K floats, written): HCP's score of each contraction index j
  // of the GEMM: mean over the other axis of |A - Q_A(A)| in channel j plus the
  // same for B, Q the quantize-dequantize of the GEMM's two roles in q (their
  // formats, axes, rounding and RoleSeed(q.seed, role), as LinearForward /
  // LinearBackward quantize them). kFwd: A = x (rows x in), B = w (out x in),
  // K = in; kDgrad: A = dy (rows x out), B = w read down its columns, K = out
  // (x is then dy). A role in fp32 has residual 0.
  virtual Status HcpScores(HcpGemm gemm, const float* x, const float* w, int64_t rows, int64_t in, int64_t out,
                           const LinearQuant& q, float* scores);
  // index (backend, k int32, written): the indices of the k largest of
  // scores[0..count), ascending by index; equal scores go to the lower index,
  // a NaN score ranks above every number. 0 <= k <= count.
  virtual Status HcpTopK(const float* scores, int64_t count, int32_t k, int32_t* index);

  // ---- Outlier analytics (kernels/outliers.h) ------------------------------------
  // The three reductions of outliers.h on backend memory, with the reference's
  // meaning (the CPU backend runs the *Ref functions; CUDA's counts and channel
  // maxima are the same bits, its double sums agree within summation order).
  // out (backend, channels floats): out[ch] = max(out[ch], max |x| over channel
  // ch), NaN winning: the per-channel magnitude reduction, usable on any tensor.
  virtual Status ChannelAbsMax(const float* x, int64_t rows, int64_t cols, int channel_axis, float* out) = 0;
  // *sums (backend memory, one OutlierSums) += x's sums, NVFP4 blocks along nvfp4_axis.
  virtual Status AddOutlierSums(const float* x, int64_t rows, int64_t cols, int nvfp4_axis,
                                OutlierSums* sums) = 0;
  // map (backend, grid.cells() doubles) += sum |x| per cell of grid.
  virtual Status AddBlockAbsSums(const float* x, int64_t rows, int64_t cols, const MapGrid& grid,
                                 double* map) = 0;
  // The same three on a bf16 tensor whose rows lie ld >= cols elements apart,
  // each element read as its exact fp32 value: the results of the fp32
  // reductions on the widened tensor (CUDA: the same bits), without the
  // widened copy (the head's gradient of the logits is 3 GiB in fp32 at GPT-2
  // 124M, batch 16 x 1024).
  virtual Status ChannelAbsMaxBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, int channel_axis,
                                   float* out) = 0;
  virtual Status AddOutlierSumsBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, int nvfp4_axis,
                                    OutlierSums* sums) = 0;
  virtual Status AddBlockAbsSumsBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols,
                                     const MapGrid& grid, double* map) = 0;

  // A step's analytics: BeginOutlierAnalytics arms them for `slots` slots (the
  // model's linear layers; maps: also the block maps). While armed, every
  // LinearForward / LinearBackward whose q.analytics_slot >= 0 adds the
  // reductions of each operand its GEMMs quantize (the roles of outliers.h,
  // whatever their formats, fp32 included) to that slot before quantizing;
  // a slot outside 0..slots-1 is an error. ReadOutlierAnalytics waits for the
  // queued work, returns slots x kRoleCount results (slot-major, role-minor)
  // and disarms. Buffers are allocated on a slot's first use and kept.
  Status BeginOutlierAnalytics(int slots, bool maps);
  Status ReadOutlierAnalytics(std::vector<OperandOutliers>* out);
  bool outlier_analytics_armed() const { return outliers_armed_; }

  // ---- Layers ---------------------------------------------------------------------
  // y = (x - mean) * rstd * gamma + beta per row (cols features), population
  // variance, rstd = 1 / sqrt(var + eps); beta may be null (no bias). mean and
  // rstd (rows floats) are saved for the backward.
  virtual Status LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                                  float* mean, float* rstd, int64_t rows, int64_t cols,
                                  float eps) = 0;
  // LayerNormForward with y rounded to bf16 (nearest even) on the way out
  // (rows x cols bf16 bits; mean and rstd as LayerNormForward gives them), for
  // a linear layer that reads x in bf16 (LinearQuant::x_bf16); the CUDA backend
  // counts the non-finite values as GeluForwardBf16 does.
  virtual Status LayerNormForwardBf16(const float* x, const float* gamma, const float* beta, uint16_t* y,
                                      float* mean, float* rstd, int64_t rows, int64_t cols, float eps);
  // A transformer's residual add and the LayerNorm after it in one call:
  // sum = y + residual (rows x cols; sum may alias y, not residual), then
  // LayerNormForward(sum, ...) into out, or LayerNormForwardBf16(sum, ...) into
  // out_bf16 (exactly one of the two is given). The same bits as Add followed
  // by the LayerNorm, which is what this default does; the CUDA backend fuses
  // them into one pass over the rows.
  virtual Status AddLayerNormForward(const float* y, const float* residual, float* sum, const float* gamma,
                                     const float* beta, float* out, uint16_t* out_bf16, float* mean, float* rstd,
                                     int64_t rows, int64_t cols, float eps);
  // dx += ..., dgamma += ..., dbeta += ... (dbeta may be null).
  virtual Status LayerNormBackward(const float* x, const float* gamma, const float* mean,
                                   const float* rstd, const float* dy, float* dx, float* dgamma,
                                   float* dbeta, int64_t rows, int64_t cols) = 0;

  // Exact GELU: y = x * 0.5 * (1 + erf(x / sqrt(2))) (y may alias x). Backward:
  // dx = dy * gelu'(x) (written).
  virtual Status GeluForward(const float* x, float* y, int64_t count) = 0;
  // GeluForward with y rounded to bf16 (nearest even) on the way out: count
  // bf16 bits, the rounding of GeluForward's values, for a linear layer that
  // reads x in bf16 (LinearQuant::x_bf16). The CUDA backend counts the
  // non-finite values for the statistics of the linear calls that read them.
  virtual Status GeluForwardBf16(const float* x, uint16_t* y, int64_t count);
  virtual Status GeluBackward(const float* x, const float* dy, float* dx, int64_t count) = 0;
  // GeluBackward with dx rounded to bf16 (nearest even) on the way out, for the
  // linear layer before GELU when its backward reads dy in bf16
  // (LinearQuant::dy_bf16): x, dy rows x cols fp32; dx rows x cols bf16 bits.
  // column_sums (cols floats, may be null) += the column sums of the unrounded
  // dx, summed exactly as that backend's LinearBackward sums dbias (the same
  // bits), so that layer's backward takes no dbias. The CUDA backend counts the
  // non-finite values for the statistics, as GeluForwardBf16 does.
  virtual Status GeluBackwardBf16(const float* x, const float* dy, uint16_t* dx, int64_t rows, int64_t cols,
                                  float* column_sums);

  // SwiGLU on x (rows x 2h: gate in columns [0, h), up in [h, 2h)):
  // y (rows x h) = silu(gate) * up, silu(a) = a / (1 + exp(-a)). Backward writes dx (rows x 2h).
  virtual Status SwigluForward(const float* x, float* y, int64_t rows, int64_t h) = 0;
  virtual Status SwigluBackward(const float* x, const float* dy, float* dx, int64_t rows,
                                int64_t h) = 0;

  // RMSNorm (llama): y = x * rstd * gain per row (cols features), rstd = 1 /
  // sqrt(mean(x^2) + eps), the mean of squares summed in double; no bias and no
  // centring. rstd (rows floats) is saved for the backward.
  virtual Status RmsNormForward(const float* x, const float* gain, float* y, float* rstd,
                                int64_t rows, int64_t cols, float eps) = 0;
  // With g = dy * gain and xhat = x * rstd: dx += rstd * (g - xhat * mean(g * xhat))
  // (the mean summed in double), dgain += sum over rows of dy * xhat.
  virtual Status RmsNormBackward(const float* x, const float* gain, const float* rstd,
                                 const float* dy, float* dx, float* dgain, int64_t rows,
                                 int64_t cols) = 0;

  // Rotary position embedding (RoPE), the rotate-half convention of GPT-NeoX and
  // Hugging Face's Llama. x holds batch*seq rows, `ld` floats apart; each row's
  // columns [0, heads * hd) are `heads` heads of hd (even) features, and row r is
  // at position t = r % seq. Within a head, feature i < hd/2 pairs with
  // i + hd/2 and turns by the angle whose cos and sin are
  // cos[t * hd/2 + i], sin[t * hd/2 + i] (RopeTables):
  //   y[i]        = x[i] * cos - x[i + hd/2] * sin
  //   y[i + hd/2] = x[i + hd/2] * cos + x[i] * sin
  // Columns from heads * hd on are not touched. y may alias x (in place).
  // RopeBackward is the rotation by minus the angle (the transpose):
  //   dx[i] = dy[i] * cos + dy[i + hd/2] * sin,  dx[i + hd/2] = dy[i + hd/2] * cos - dy[i] * sin.
  // The same fp32 products and sums on both backends: the same bits.
  virtual Status RopeForward(const float* x, float* y, const float* cos, const float* sin,
                             int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                             int64_t ld) = 0;
  virtual Status RopeBackward(const float* dy, float* dx, const float* cos, const float* sin,
                              int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                              int64_t ld) = 0;

  // Token + learned position embedding: out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :],
  // tokens: batch x seq int32 in backend memory. Backward: dwte, dwpe += (deterministic).
  // wpe null: no position term (out = wte[token], llama); dwpe null: not computed.
  // Token ids and targets live in backend memory, so only the CPU backend can
  // refuse one out of range; callers check ids on the host (the trainer checks
  // its shards against the vocabulary when it opens them).
  virtual Status EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe,
                                  float* out, int64_t batch, int64_t seq, int64_t dim) = 0;
  virtual Status EmbeddingBackward(const int32_t* tokens, const float* dout, float* dwte,
                                   float* dwpe, int64_t batch, int64_t seq, int64_t dim) = 0;

  // Causal multi-head softmax attention. qkv: (batch*seq) x 3*dim, q in columns
  // [0, dim), k in [dim, 2 dim), v in [2 dim, 3 dim), head h in columns
  // [h*hd, (h+1)*hd) of each, hd = dim / heads. out: (batch*seq) x dim, heads
  // side by side. For row t of head (b, h): s_j = (q_t . k_j) / sqrt(hd) for
  // j <= t, m = max_j s_j, l = sum_j exp(s_j - m), P_tj = exp(s_j - m) * (1 / l)
  // (0 for j > t), out_t = sum_j P_tj v_j. stats: batch*heads*seq pairs
  // (m, 1 / l), row (b, h, t) at index (b * heads + h) * seq + t: all the
  // backward keeps of the softmax (no seq x seq matrix is stored).
  // bf16_operands: q, k, v and P are rounded to bf16 (nearest even) before
  // their products, accumulation stays fp32 (what the GPU's BF16 path does);
  // false: fp32 throughout.
  virtual Status AttentionForward(const float* qkv, float* out, float* stats, int64_t batch,
                                  int64_t seq, int64_t heads, int64_t dim,
                                  bool bf16_operands) = 0;
  // dqkv (written) from dout, given the forward's out and stats: P is recomputed
  // from the stats, dP_tj = dout_t . v_j, dS = P (dP - D) with D_t = dout_t . out_t
  // (fp32, unrounded), dQ = dS k / sqrt(hd), dK = dS^T q / sqrt(hd), dV = P^T dout;
  // with bf16_operands dout, v, P and dS are rounded to bf16 for their products.
  virtual Status AttentionBackward(const float* qkv, const float* out, const float* stats,
                                   const float* dout, float* dqkv, int64_t batch, int64_t seq,
                                   int64_t heads, int64_t dim, bool bf16_operands) = 0;
  // The same pair with q, k and v kept between them in the form the backend's
  // kernels read (its heads): AttentionForwardKeep also writes them to `kept`
  // (3 * batch * seq * dim bf16 values, half of qkv's bytes; the layout is the
  // backend's: kept heads always have bf16 operands),
  // and AttentionBackwardKept reads them from there instead of taking them from
  // qkv again, so the caller need not keep qkv between the passes. Results are
  // AttentionForward's and AttentionBackward's on that qkv, bit for bit. Only
  // where KeepsAttentionHeads(hd, bf16_operands) says so (the defaults: never;
  // the calls then fail).
  virtual bool KeepsAttentionHeads(int64_t head_dim, bool bf16_operands) const;
  virtual Status AttentionForwardKeep(const float* qkv, float* kept, float* out, float* stats,
                                      int64_t batch, int64_t seq, int64_t heads, int64_t dim,
                                      bool bf16_operands);
  virtual Status AttentionBackwardKept(const float* kept, const float* out, const float* stats,
                                       const float* dout, float* dqkv, int64_t batch, int64_t seq,
                                       int64_t heads, int64_t dim, bool bf16_operands);

  // ---- Gated linear attention (GLA, the gla model; docs/train.md) --------------------
  // y = scale * logsigmoid(x) = -scale * log(1 + exp(-x)), computed as
  // min(x, 0) - log1p(exp(-|x|)) so that no exp overflows (y may alias x).
  // Backward: dx = dy * scale * sigmoid(-x) = dy * scale / (1 + exp(x)) (written).
  virtual Status LogSigmoidForward(const float* x, float* y, int64_t count, float scale) = 0;
  virtual Status LogSigmoidBackward(const float* x, const float* dy, float* dx, int64_t count,
                                    float scale) = 0;

  // Swish gating: y[r, c] = x[r, c] * silu(g[r, c]), silu(a) = a / (1 + exp(-a)); x
  // and y are rows x cols (row-major, cols apart), g's rows are g_ld >= cols floats
  // apart (a column block of a wider matrix). Backward (both written):
  // dx = dy * silu(g), dg = dy * x * silu'(g), silu'(a) = s (1 + a (1 - s)) with
  // s = 1 / (1 + exp(-a)); dg's rows are g_ld apart and its other columns are
  // not touched.
  virtual Status SiluGateForward(const float* x, const float* g, int64_t g_ld, float* y,
                                 int64_t rows, int64_t cols) = 0;
  virtual Status SiluGateBackward(const float* x, const float* g, int64_t g_ld, const float* dy,
                                  float* dx, float* dg, int64_t rows, int64_t cols) = 0;

  // The gated recurrence of GLA. qkv holds batch*seq rows `ld` floats apart
  // (row r at position t = r % seq); in each, q in columns [0, dk), k in
  // [dk, 2 dk), v in [2 dk, 2 dk + dv); head h owns q, k columns
  // [h dk/H, (h+1) dk/H) and v columns [h dv/H, (h+1) dv/H) (H = heads, dividing
  // dk and dv). gk (batch*seq x dk, row-major) holds the log forget gates, <= 0.
  // Per (batch, head), with the state S (dk/H x dv/H) zero before position 0:
  //   S_t = diag(exp(gk_t)) S_{t-1} + k_t^T v_t,   o_t = (q_t / sqrt(dk/H)) S_t,
  // out (batch*seq x dv, heads side by side) = o. Nothing is saved for the
  // backward: it recomputes the states.
  // The CPU runs the recurrence as written (in fp32, position by position); CUDA
  // runs the equivalent chunked form (nn_cuda_gla.cu, gla_cpu.h), whose sums go
  // in another order: the results agree to fp32 rounding, not bit for bit.
  // CUDA accepts dk/H <= 128 (kGlaMaxKeyHead).
  virtual Status GlaForward(const float* qkv, int64_t ld, const float* gk, float* out,
                            int64_t batch, int64_t seq, int64_t heads, int64_t dk,
                            int64_t dv) = 0;
  // From dout (batch*seq x dv): dq, dk, dv written into columns [0, 2 dk + dv) of
  // dqkv (rows ld apart; its other columns are not touched) and dgk (batch*seq x
  // dk) written, the gradients of the forward above.
  virtual Status GlaBackward(const float* qkv, int64_t ld, const float* gk, const float* dout,
                             float* dqkv, float* dgk, int64_t batch, int64_t seq, int64_t heads,
                             int64_t dk, int64_t dv) = 0;

  // Softmax cross-entropy over the first `vocab` of `padded_vocab` columns of
  // logits (rows x padded_vocab): losses[r] = logsumexp - logit[target[r]].
  // targets: rows int32 in backend memory; a target < 0 is ignored (loss 0).
  virtual Status CrossEntropyForward(const float* logits, const int32_t* targets, float* losses,
                                     int64_t rows, int64_t padded_vocab, int64_t vocab) = 0;
  // dlogits (written) = scale * (softmax - onehot(target)) in the first `vocab`
  // columns, 0 in the padding and for ignored rows. dlogits may alias logits.
  virtual Status CrossEntropyBackward(const float* logits, const int32_t* targets, float* dlogits,
                                      int64_t rows, int64_t padded_vocab, int64_t vocab,
                                      float scale) = 0;
  // The losses of CrossEntropyForward and the dlogits of CrossEntropyBackward,
  // bit for bit the same as those two calls give, in one pass over logits (the
  // training step, which needs both). dlogits may alias logits (the same
  // pointer): each row's target logit is read before its gradient is written.
  virtual Status CrossEntropyFused(const float* logits, const int32_t* targets, float* losses,
                                   float* dlogits, int64_t rows, int64_t padded_vocab,
                                   int64_t vocab, float scale) = 0;

  // CrossEntropyFused with the gradient rounded to bf16 (nearest even) on the
  // way out: the same losses, and dlogits (rows x padded_vocab bf16 bits, rows
  // ld >= padded_vocab elements apart) = the bf16 rounding of CrossEntropyFused's
  // dlogits, for a head that reads dy in bf16 (LinearQuant::dy_bf16). dlogits
  // may alias logits only as (uint16_t*) logits with ld = 2 * padded_vocab
  // (row r in the first half of logits' row r). The CUDA backend counts the
  // non-finite gradients for the statistics of the LinearBackward that reads
  // them (LinearQuant::stats_slot there).
  // row0 >= 0: logits, targets and losses hold this call's rows; dlogits is the
  // whole pass's buffer, this call's row r at dlogits + (row0 + r) * ld. A pass
  // in row chunks (the head's, Model::HeadAndLoss) calls it with row0 = 0 first,
  // then the later chunks; the CUDA backend counts every chunk's non-finite
  // gradients into the statistics of dlogits that the first call opened.
  // Aliasing logits needs row0 = 0.
  virtual Status CrossEntropyFusedBf16(const float* logits, const int32_t* targets, float* losses,
                                       uint16_t* dlogits, int64_t ld, int64_t rows, int64_t padded_vocab,
                                       int64_t vocab, float scale, int64_t row0);

  // ---- Optimizer --------------------------------------------------------------------
  // Adam(W) with bias correction at step t (1-based), on fp32 master weights:
  // g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
  // p -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * p)
  // (decoupled decay; weight_decay 0 is plain Adam).
  virtual Status AdamW(float* param, const float* grad, float* m, float* v, int64_t count,
                       float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                       float grad_scale) = 0;
  // AdamW on every tensor, the other arguments shared: the same bits as one
  // AdamW call per tensor, in any order (tensors must not overlap). The default
  // makes those calls; the CUDA backend updates all tensors in one launch.
  // delta_squares (null: not wanted) gets one entry per tensor: the sum over
  // its elements of (p before - p after)^2 in double, in a fixed order (the
  // update ratio's numerator, without a copy of the weights).
  virtual Status AdamWTensors(const std::vector<AdamWTensor>& tensors, float lr, float beta1, float beta2,
                              float eps, int step, float grad_scale, std::vector<double>* delta_squares);

  // ---- Reductions (return to the host, in double) -------------------------------
  // out[i] = sum of squares of spans[i]; sums() = sum of a; dots: sum a_i * b_i.
  virtual Status SumSquares(const std::vector<Span>& spans, std::vector<double>* out) = 0;
  virtual Status Sums(const std::vector<Span>& spans, std::vector<double>* out) = 0;
  virtual Status Dots(const std::vector<Span>& a, const std::vector<Span>& b,
                      std::vector<double>* out) = 0;

  // ---- Device memory ------------------------------------------------------------------
  // The memory this process holds on the backend's device as the driver counts it
  // (the CUDA backend: cudaMemGetInfo's total - free, the figure llm.c prints as
  // "device memory usage": context, cuBLASLt workspace and the memory pool's cache
  // included). False where there is no such figure (the CPU backend).
  virtual bool DeviceMemoryInUse(int64_t* bytes) const;

  // ---- Native stream ----------------------------------------------------------------
  // The stream this backend queues all its work on (CUDA: its cudaStream_t), so
  // that a communicator can queue collectives in order with it
  // (kernels/comm/nccl_comm.h); it lives as long as the backend. nullptr where
  // there is none (the CPU backend).
  virtual void* NativeStream() const { return nullptr; }

  // ---- Side work ----------------------------------------------------------------------
  // Work that may run beside the work queued around it (the proxy's teacher beside
  // the student's forward). Between BeginSideWork and EndSideWork the ops queue on a
  // second stream that first waits for everything queued before BeginSideWork; the
  // work queued after EndSideWork runs beside it until JoinSideWork (or Sync) makes
  // the later work wait for it. The side must not touch what the main queue writes
  // meanwhile, nor write what it reads, and may use only ops that need no backend
  // scratch (elementwise ops, copies, RandomNormal, fp32 linear layers); a CUDA op
  // that needs scratch fails there. The CPU backend runs everything in order.
  virtual Status BeginSideWork() { return Status::Ok(); }
  virtual Status EndSideWork() { return Status::Ok(); }
  virtual Status JoinSideWork() { return Status::Ok(); }

  // ---- Profiling (off by default) ---------------------------------------------------
  // The CUDA backend times each op's work on its stream with CUDA events (and the
  // main parts of the linear layer separately); parts are timed inside their op,
  // so an op's time includes them. It costs a little host time per op and a
  // fold of the finished events at each Sync. A backend without a timer refuses
  // SetProfiling(true).
  virtual Status SetProfiling(bool on);
  // The times since profiling was turned on or last taken (which resets them),
  // longest first; waits for the work queued so far.
  virtual Status TakeProfile(std::vector<OpTime>* out);

 protected:
  // The linear layers call this for each operand they quantize, before
  // quantizing it (nothing unless armed and slot >= 0); op names the caller in
  // errors. x: rows x cols as the role's GEMM reads it (outliers.h's table).
  Status AnalyzeOperand(const char* op, Role role, const float* x, int64_t rows, int64_t cols, int slot);
  // The same for an operand that arrives in bf16 (LinearQuant's x_bf16 or
  // dy_bf16: rows ld elements apart), read in place.
  Status AnalyzeOperandBf16(const char* op, Role role, const uint16_t* x, int64_t ld, int64_t rows, int64_t cols,
                            int slot);
  // Frees the analytics buffers; a backend's destructor calls it while Free works.
  void ReleaseOutlierAnalytics();

 private:
  // The analytics buffers are carved from arenas, a few large allocations
  // zeroed when made, so that BeginOutlierAnalytics zeroes all of them with one
  // Fill per arena and ReadOutlierAnalytics downloads them with one copy per
  // arena: two or three of each per analysed operand before, which at the
  // proxy's size cost more than the analyses themselves.
  struct OutlierArena {
    char* base = nullptr;
    size_t bytes = 0, used = 0;
  };
  // `bytes` of zeros from the arenas (a new arena when none has room).
  Status CarveOutlierBuffer(size_t bytes, void** out);
  // One slot and role's device buffers (carved; null until first used) and shape.
  struct OutlierBuffers {
    OutlierSums* sums = nullptr;
    float* channel_max = nullptr;
    double* map = nullptr;
    int64_t rows = 0, cols = 0, calls = 0;
  };
  // The buffers of (slot, role) for an operand of rows x cols, carved when new;
  // null (and Ok) when nothing is to be analysed (not armed, slot < 0). *map:
  // whether this role's block map is drawn.
  Status OutlierBuffersFor(const char* op, Role role, int64_t rows, int64_t cols, int slot, OutlierBuffers** out,
                           bool* map);
  bool outliers_armed_ = false;
  bool outlier_maps_ = false;
  int outlier_slots_ = 0;
  std::vector<OutlierBuffers> outlier_buffers_;  // outlier_slots_ x kRoleCount, kept between steps
  std::vector<OutlierArena> outlier_arenas_;     // kept between steps; a shape change leaves its old buffers unused
};

// RopeForward's tables for `positions` positions and head size hd (even), on the
// host: for t < positions and i < hd/2, angle = t * theta^(-2i / hd) computed in
// double, cos[t * hd/2 + i] and sin[t * hd/2 + i] its cosine and sine rounded to
// float. Every backend reads the same table, so RoPE's bits do not depend on a
// device's libm. Llama uses theta 10000.
void RopeTables(double theta, int64_t positions, int64_t hd, std::vector<float>* cos,
                std::vector<float>* sin);

// The largest key head size (dk / heads) the CUDA backend's GlaForward and
// GlaBackward accept: a block keeps a chunk's q, k and cumulative gates of one
// head in shared memory (nn_cuda_gla.cu).
constexpr int64_t kGlaMaxKeyHead = 128;

// Whether a linear layer's backward can read dy already rounded to bf16
// (LinearQuant::dy_bf16): all four backward roles quantized and both dy roles
// BF16 with nearest-even rounding.
bool TakesBf16Dy(const LinearQuant& q);
// Whether a linear layer can read x already rounded to bf16
// (LinearQuant::x_bf16): fwd_x and wgrad_x BF16 with nearest-even rounding and
// fwd_w, wgrad_dy quantized (both GEMMs that read x run in BF16).
bool TakesBf16X(const LinearQuant& q);
// LinearForward's and LinearBackward's check of q.x_bf16 (every backend runs
// it): OK when it is null, else an error naming what is not allowed (roles,
// x_bf16_ld < in, a forward Hot-Channel Patch).
Status CheckXBf16(const char* op, const LinearQuant& q, int64_t in);
// LinearBackward's check of q.dy_bf16 (every backend runs it): OK when it is
// null, else an error naming what is not allowed (roles, dbias, dy_bf16_ld < out).
Status CheckDyBf16(const char* op, const LinearQuant& q, int64_t out, const float* dbias);
// The Hot-Channel Patch checks every backend runs without reading backend
// memory: a GEMM's hot set has count 0..k_count and, when count > 0, an index
// or a choose_into; hcp_wgrad_rows is 0..rows. Errors name the field, the
// value and what is allowed. (The CPU also checks the indices themselves.)
Status CheckHotChannelCounts(const char* op, const char* field, const HotChannels& hot, int64_t k_count);
Status CheckHcpWgradRows(const char* op, const LinearQuant& q, int64_t rows);

// Factories (nn_cpu.cc, nn_cuda_backend.cu; the CUDA one fails without CUDA or a GPU).
Status MakeCpuBackend(int threads, std::unique_ptr<Backend>* out);
Status MakeCudaBackend(std::unique_ptr<Backend>* out);

// "cpu" or "cuda" (CUDA fails with a clear error when built without CUDA or
// when no GPU is visible). threads: CPU worker threads (0: hardware concurrency).
Status MakeBackend(const std::string& name, int threads, std::unique_ptr<Backend>* out);

}  // namespace keel

#endif  // KEEL_KERNELS_NN_H_
