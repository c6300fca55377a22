// CpuBackend: the reference implementation of nn.h's Backend in plain C++ on a
// persistent ThreadPool (MakeCpuBackend in nn.h is its factory). Work is split
// so that no sum is ever divided between threads: every output is computed by
// one task, in a fixed order, and the results are the same bits for any thread
// count. The GEMM is gemm_cpu.h; quantization calls the CPU reference
// quantizers of quantize.h.
//
// The methods are spread over one file per concern: nn_cpu.cc (memory,
// elementwise, random numbers, optimizer, reductions), nn_cpu_linear.cc
// (quantized operands, their statistics, the linear layer), nn_cpu_layers.cc
// (layernorm, RMSNorm, RoPE, GELU, SwiGLU, embedding, cross-entropy),
// nn_cpu_attention.cc and nn_cpu_gla.cc (logsigmoid, swish gating, the gated
// recurrence of gla_cpu.h).
//
// Like the CUDA backend's single stream, the object expects one caller at a
// time; the linear layer's scratch and the statistics sit behind linear_mutex_
// so that a second caller waits rather than corrupting them.
#ifndef KEEL_KERNELS_NN_CPU_H_
#define KEEL_KERNELS_NN_CPU_H_

#include <mutex>
#include <string>
#include <vector>

#include "kernels/nn.h"
#include "kernels/thread_pool_cpu.h"

namespace keel {

class CpuBackend : public Backend {
 public:
  // threads >= 1 (MakeCpuBackend maps 0 to the hardware concurrency).
  explicit CpuBackend(int threads);
  ~CpuBackend() override { ReleaseOutlierAnalytics(); }

  const char* name() const override { return "cpu"; }
  std::string Describe() const override;

  Status Alloc(size_t bytes, void** ptr) override;
  void Free(void* ptr) override;
  Status Upload(void* dst, const void* host_src, size_t bytes) override;
  Status Download(void* host_dst, const void* src, size_t bytes) override;
  Status CopyBytes(void* dst, const void* src, size_t bytes) override;
  Status Fill(float* x, int64_t count, float value) override;
  Status Sync() override { return Status::Ok(); }  // every call completes before it returns

  Status Add(const float* a, const float* b, float* out, int64_t count) override;
  Status Axpy(float alpha, const float* x, float* y, int64_t count) override;
  Status Scale(float* x, int64_t count, float alpha) override;
  Status Copy2D(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                int64_t cols) override;
  Status RandomNormal(float* x, int64_t count, uint64_t seed, uint64_t offset,
                      float stddev) override;

  Status QuantizeDequantize(const float* x, int64_t rows, int64_t cols, int axis,
                            const OperandFormat& format, uint64_t seed, float* out) override;

  Status LinearForward(const float* x, const float* w, const float* bias, const float* residual,
                       float* y, int64_t rows, int64_t in, int64_t out,
                       const LinearQuant& q) override;
  Status LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                        float* dbias, int64_t rows, int64_t in, int64_t out,
                        const LinearQuant& q) override;
  Status ResetOperandStats(int slots) override;
  Status ReadOperandStats(std::vector<OperandStats>* stats) override;
  // Hot-Channel Patch (nn_cpu_hcp.cc; docs/hcp.md): fp32 patch columns.
  Status HcpScores(HcpGemm gemm, const float* x, const float* w, int64_t rows, int64_t in, int64_t out,
                   const LinearQuant& q, float* scores) override;
  Status HcpTopK(const float* scores, int64_t count, int32_t k, int32_t* index) override;
  // The reference reductions of outliers.h (ChannelAbsMaxRef, ...), serial.
  Status ChannelAbsMax(const float* x, int64_t rows, int64_t cols, int channel_axis, float* out) override;
  Status AddOutlierSums(const float* x, int64_t rows, int64_t cols, int nvfp4_axis,
                        OutlierSums* sums) override;
  Status AddBlockAbsSums(const float* x, int64_t rows, int64_t cols, const MapGrid& grid,
                         double* map) override;
  // On a bf16 tensor: its values widened, then the fp32 reductions above.
  Status ChannelAbsMaxBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, int channel_axis,
                           float* out) override;
  Status AddOutlierSumsBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, int nvfp4_axis,
                            OutlierSums* sums) override;
  Status AddBlockAbsSumsBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, const MapGrid& grid,
                             double* map) override;

  Status LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                          float* mean, float* rstd, int64_t rows, int64_t cols, float eps) override;
  Status LayerNormForwardBf16(const float* x, const float* gamma, const float* beta, uint16_t* y, float* mean,
                              float* rstd, int64_t rows, int64_t cols, float eps) override;
  Status LayerNormBackward(const float* x, const float* gamma, const float* mean, const float* rstd,
                           const float* dy, float* dx, float* dgamma, float* dbeta, int64_t rows,
                           int64_t cols) override;
  Status RmsNormForward(const float* x, const float* gain, float* y, float* rstd, int64_t rows,
                        int64_t cols, float eps) override;
  Status RmsNormBackward(const float* x, const float* gain, const float* rstd, const float* dy,
                         float* dx, float* dgain, int64_t rows, int64_t cols) override;
  Status RopeForward(const float* x, float* y, const float* cos, const float* sin, int64_t batch,
                     int64_t seq, int64_t heads, int64_t hd, int64_t ld) override;
  Status RopeBackward(const float* dy, float* dx, const float* cos, const float* sin,
                      int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                      int64_t ld) override;
  Status GeluForward(const float* x, float* y, int64_t count) override;
  Status GeluForwardBf16(const float* x, uint16_t* y, int64_t count) override;
  Status GeluBackwardBf16(const float* x, const float* dy, uint16_t* dx, int64_t rows, int64_t cols,
                          float* column_sums) override;
  Status GeluBackward(const float* x, const float* dy, float* dx, int64_t count) override;
  Status SwigluForward(const float* x, float* y, int64_t rows, int64_t h) override;
  Status SwigluBackward(const float* x, const float* dy, float* dx, int64_t rows,
                        int64_t h) override;
  Status EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* out,
                          int64_t batch, int64_t seq, int64_t dim) override;
  Status EmbeddingBackward(const int32_t* tokens, const float* dout, float* dwte, float* dwpe,
                           int64_t batch, int64_t seq, int64_t dim) override;
  Status AttentionForward(const float* qkv, float* out, float* stats, int64_t batch, int64_t seq,
                          int64_t heads, int64_t dim, bool bf16_operands) override;
  Status AttentionBackward(const float* qkv, const float* out, const float* stats,
                           const float* dout, float* dqkv, int64_t batch, int64_t seq,
                           int64_t heads, int64_t dim, bool bf16_operands) override;
  Status LogSigmoidForward(const float* x, float* y, int64_t count, float scale) override;
  Status LogSigmoidBackward(const float* x, const float* dy, float* dx, int64_t count,
                            float scale) override;
  Status SiluGateForward(const float* x, const float* g, int64_t g_ld, float* y, int64_t rows,
                         int64_t cols) override;
  Status SiluGateBackward(const float* x, const float* g, int64_t g_ld, const float* dy, float* dx,
                          float* dg, int64_t rows, int64_t cols) override;
  Status GlaForward(const float* qkv, int64_t ld, const float* gk, float* out, int64_t batch,
                    int64_t seq, int64_t heads, int64_t dk, int64_t dv) override;
  Status GlaBackward(const float* qkv, int64_t ld, const float* gk, const float* dout,
                     float* dqkv, float* dgk, int64_t batch, int64_t seq, int64_t heads,
                     int64_t dk, int64_t dv) override;
  Status CrossEntropyForward(const float* logits, const int32_t* targets, float* losses,
                             int64_t rows, int64_t padded_vocab, int64_t vocab) override;
  Status CrossEntropyBackward(const float* logits, const int32_t* targets, float* dlogits,
                              int64_t rows, int64_t padded_vocab, int64_t vocab,
                              float scale) override;
  Status CrossEntropyFusedBf16(const float* logits, const int32_t* targets, float* losses, uint16_t* dlogits,
                               int64_t ld, int64_t rows, int64_t padded_vocab, int64_t vocab, float scale,
                               int64_t row0) override;
  Status CrossEntropyFused(const float* logits, const int32_t* targets, float* losses,
                           float* dlogits, int64_t rows, int64_t padded_vocab, int64_t vocab,
                           float scale) override;

  Status AdamW(float* param, const float* grad, float* m, float* v, int64_t count, float lr,
               float beta1, float beta2, float eps, float weight_decay, int step,
               float grad_scale) override;

  Status SumSquares(const std::vector<Span>& spans, std::vector<double>* out) override;
  Status Sums(const std::vector<Span>& spans, std::vector<double>* out) override;
  Status Dots(const std::vector<Span>& a, const std::vector<Span>& b,
              std::vector<double>* out) override;

 private:
  // out = the nearest-even bf16 bits of count values (the bf16 producers).
  void RoundToBf16(const float* values, int64_t count, uint16_t* out);
  // out[c] += the sum of column c of m (rows x cols), each in row order: dbias's sums.
  void AddColumnSums(const float* m, int64_t rows, int64_t cols, float* out);
  Status XBf16Values(const char* op, const LinearQuant& q, int64_t rows, int64_t in, std::vector<float>* values);
  // One GEMM operand after its role's rounding: the values the GEMM multiplies
  // (x itself for kFp32, else code times block scale in `storage`) and the
  // per-tensor decode scale that multiplies the product instead.
  struct Operand {
    const float* data = nullptr;
    float decode_scale = 1.0f;
    std::vector<float> storage;
  };
  Status PrepareOperand(Role role, const float* x, int64_t rows, int64_t cols, int axis,
                        const LinearQuant& q, Operand* operand, OperandStats* stats);
  // Adds the six roles' counters of one call to slot q.stats_slot (no-op for -1).
  void RecordStats(const LinearQuant& q, const OperandStats* role_stats);
  // Hot-Channel Patch helpers (nn_cpu_hcp.cc), called with linear_mutex_ held.
  // One operand of a patched GEMM as the patch reads it: element (i, j), i
  // along the GEMM's output axis (n of them) and j along its contraction, of
  // the unquantized tensor at x[i * si + j * sj] and of its quantized values at
  // q->data[same index] (times q->decode_scale: Q(x) as the GEMM sees it).
  struct HcpSide {
    const float* x;
    const Operand* q;
    int64_t n, si, sj;
    float At(int64_t i, int64_t j) const { return x[i * si + j * sj]; }
    float Q(int64_t i, int64_t j) const { return q->decode_scale * q->data[i * si + j * sj]; }
  };
  void HcpScoresOf(const HcpSide& a, const HcpSide& b, int64_t k_count, float* scores);
  void AddHcpPatch(const HcpSide& a, const HcpSide& b, const int32_t* hot, int32_t k, float* c, int64_t ldc);
  // The set a GEMM patches: hot.index, or with choose_into the hot.count best
  // scores of a and b (over k_count indices), chosen now and written there.
  const int32_t* HotSet(const HcpSide& a, const HcpSide& b, int64_t k_count, const HotChannels& hot);
  static Status CheckHotChannels(const char* op, const char* field, const HotChannels& hot, int64_t k_count);
  // dw += the wgrad GEMM's patch over its q.hcp_wgrad_rows best-scoring tokens
  // (operand_c_ and operand_d_ hold that GEMM's quantized operands).
  Status AddWgradHcpPatch(const float* x, const float* dy, int64_t rows, int64_t in, int64_t out,
                          const LinearQuant& q, float* dw);

  ThreadPool pool_;

  std::mutex linear_mutex_;  // guards the members below
  // Scratch for the quantized operands, kept between calls: a and b feed the
  // forward or the dgrad GEMM, c and d the wgrad GEMM.
  Operand operand_a_, operand_b_, operand_c_, operand_d_;
  int stats_slots_ = 0;
  std::vector<OperandStats> stats_;  // stats_slots_ x kRoleCount, slot-major
};

}  // namespace keel

#endif  // KEEL_KERNELS_NN_CPU_H_
