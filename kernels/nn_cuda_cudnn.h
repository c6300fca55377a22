// cuDNN's fused causal attention, forward and backward (its SDPA operation
// graphs through the backend C API), for the CUDA backend's experiments
// cudnn_attention and cudnn_attention_bwd (KEEL_CUDA_ON). libcudnn.so.9 is
// loaded at run time (dlopen), so Keel builds and runs without cuDNN: Load says
// why it is unavailable, and the backend then keeps its own kernels
// (nn_cuda_flash.h).
//
// The forward graph is the one cuDNN's fused flash-attention engines take (what
// cuDNN's frontend builds for a causal SDPA with statistics): S = Q K^T (fp32),
// S * scale, the causal mask (key index > query index -> -inf), then a softmax
// written as MAX, SUB, EXP, ADD-reduction and DIV, with lse = max + log(sum) as
// an output, P in bf16, O = P V. What the engine computes in that graph is
// cuDNN's: an online softmax over key tiles whose P is rounded to bf16 before it
// is normalized (not nn.h's contract, which rounds the normalized P), and O
// rounded to bf16. The backward graph is described at Backward.
#ifndef KEEL_KERNELS_NN_CUDA_CUDNN_H_
#define KEEL_KERNELS_NN_CUDA_CUDNN_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "kernels/base/status.h"

namespace keel {
namespace nncuda {

struct SdpaShape {
  int64_t batch = 0, heads = 0, seq = 0, hd = 0;
};

class CudnnAttention {
 public:
  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Loads libcudnn.so.9 (else libcudnn.so) and creates a handle on the current
  // device. An error says what was missing; nothing else works after one.
  Status Load();
  // The loaded library's version, "9.14.0".
  std::string Version() const;

  // Builds the causal forward's plan for shape s (once per shape; kept) and says
  // the workspace it needs and which engine it chose.
  Status PrepareForward(const SdpaShape& s, size_t* workspace_bytes, std::string* engine);
  // The causal forward: q, k, v bf16 [b, h, t, d]; o bf16 rows of (b * t) x (h * d)
  // (heads side by side); lse fp32 [b, h, t], each row's log of the sum of
  // exp(scale * q.k) over keys up to its own position. Queued on `stream`.
  Status Forward(const SdpaShape& s, const void* q, const void* k, const void* v, void* o, float* lse, float scale,
                 void* workspace, size_t workspace_bytes, cudaStream_t stream);

  // The causal backward's plan for shape s (once per shape; kept): its workspace and engine.
  Status PrepareBackward(const SdpaShape& s, size_t* workspace_bytes, std::string* engine);
  // The causal backward (cuDNN's SDPA backward graph, the variant that writes dQ with a
  // product over a dS kept in the workspace instead of atomic adds, so that two runs give
  // the same bits): q, k, v, o and dout bf16 [b, h, t, d]; lse fp32 [b, h, t] (the
  // forward's); dqkv bf16 rows of (b * t) x 3 h d, dq | dk | dv side by side, each with
  // head h at column h * d of its part (qkv's layout); row_sums fp32 [b, h, t], cuDNN's
  // scratch for D = dout . o. P is recomputed as exp(scale * q.k - lse), the normalized
  // probabilities.
  Status Backward(const SdpaShape& s, const void* q, const void* k, const void* v, const void* o, const void* dout,
                  const float* lse, float* row_sums, void* dqkv, float scale, void* workspace,
                  size_t workspace_bytes, cudaStream_t stream);

  struct Api;  // the library's entry points (nn_cuda_cudnn.cu)

 private:
  struct Plan;
  std::unique_ptr<Api> api_;
  // The plan of a graph (its operation graph built by `build`) from heuristics mode A, then
  // the fallback list: the first engine configuration that finalizes.
  template <typename Build>
  Status MakePlan(const SdpaShape& s, const char* what, Build build, std::unique_ptr<Plan>* out);
  Status Execute(Plan& plan, const int64_t* uids, void* const* ptrs, int n, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream, const char* what);
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t>;
  // The plan of shape s in `plans`, made (MakePlan with `build`) the first time.
  template <typename Build>
  Status PlanFor(std::map<Key, std::unique_ptr<Plan>>* plans, const SdpaShape& s, const char* what, Build build,
                 Plan** plan);
  // The forward's and the backward's plans of shape s, made the first time.
  Status ForwardPlan(const SdpaShape& s, Plan** plan);
  Status BackwardPlan(const SdpaShape& s, Plan** plan);
  std::map<Key, std::unique_ptr<Plan>> forward_plans_, backward_plans_;
};

}  // namespace nncuda
}  // namespace keel

#endif  // KEEL_KERNELS_NN_CUDA_CUDNN_H_
