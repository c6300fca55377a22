// The gated recurrence of GLA (nn.h GlaForward / GlaBackward) on the host, for
// one (batch, head) at a time, in two forms:
//   - sequential: the definition, position by position,
//       S_t = diag(exp(gk_t)) S_{t-1} + k_t^T v_t,  o_t = (q_t / sqrt(dkh)) S_t,
//     its backward the plain chain rule through the stored states. The CPU
//     backend runs this form.
//   - chunked: what nn_cuda_gla.cu computes, written out in plain loops so that
//     the math is tested on the host before a GPU runs it (gla_cpu_test in
//     nn_cpu_test.cc: both forms agree to fp32 rounding). Within a chunk of C
//     positions starting at c0, B_t = gk_c0 + ... + gk_t (cumulative log gates
//     relative to the chunk start, <= 0), S_in the state before the chunk:
//       o_t = scale [ (q_t * exp(B_t)) S_in + sum_{s<=t} A_ts v_s ],
//       A_ts = sum_i q_t[i] k_s[i] exp(B_t[i] - B_s[i]),
//       S_out = diag(exp(B_end)) S_in + sum_s diag(exp(B_end - B_s)) k_s^T v_s.
//     Every exp() argument is <= 0 (B_t - B_s with s <= t, B_end - B_s, B_t), so
//     none overflows, whatever the gates; very negative ones underflow to 0,
//     which is the right limit. The backward goes over the chunks in reverse
//     with dS, the gradient of the state after the chunk:
//       dq_t = scale [ exp(B_t) * (S_in do_t) + sum_{s<=t} (do_t . v_s) k_s * exp(B_t - B_s) ]
//       dk_s = scale sum_{t>=s} (do_t . v_s) q_t * exp(B_t - B_s) + exp(B_end - B_s) * (dS v_s)
//       dv_s = scale sum_{t>=s} A_ts do_t + (k_s * exp(B_end - B_s)) dS
//       dS  <- diag(exp(B_end)) dS + scale sum_t (q_t * exp(B_t))^T do_t
//     and the gates' gradient from the identity dL/dG_t = q_t * dq_t - k_t * dk_t
//     for the global cumulative gates G, so dgk_t = sum_{u>=t} (q_u dq_u - k_u dk_u)
//     (a reverse cumulative sum over the whole sequence).
// Layouts as nn.h's GlaForward: qkv rows ld apart (q [0, dk), k [dk, 2dk), v
// [2dk, 2dk + dv)), gk and dgk batch*seq x dk, out and dout batch*seq x dv.
#ifndef KEEL_KERNELS_GLA_CPU_H_
#define KEEL_KERNELS_GLA_CPU_H_

#include <cstdint>

#include "kernels/base/status.h"

namespace keel {
namespace gla_cpu {

struct Shape {
  int64_t batch = 0, seq = 0, heads = 0;
  int64_t dk = 0, dv = 0;  // all heads' key and value widths
  int64_t ld = 0;          // floats between qkv rows (and dqkv rows)
  int64_t dkh() const { return dk / heads; }
  int64_t dvh() const { return dv / heads; }
};

// "op: field: value is not allowed; need ..." for a bad shape (batch >= 0, seq,
// heads, dk, dv >= 1, heads dividing dk and dv, ld >= 2 dk + dv), else Ok.
Status CheckShape(const char* op, const Shape& shape);

// Head h of batch b; the other heads' columns are not touched.
void ForwardSequential(const float* qkv, const float* gk, float* out, const Shape& shape, int64_t b,
                       int64_t h);
void BackwardSequential(const float* qkv, const float* gk, const float* dout, float* dqkv, float* dgk,
                        const Shape& shape, int64_t b, int64_t h);
// chunk >= 1 positions a chunk (the last one may be shorter).
void ForwardChunked(const float* qkv, const float* gk, float* out, const Shape& shape, int64_t b, int64_t h,
                    int64_t chunk);
void BackwardChunked(const float* qkv, const float* gk, const float* dout, float* dqkv, float* dgk,
                     const Shape& shape, int64_t b, int64_t h, int64_t chunk);

}  // namespace gla_cpu
}  // namespace keel

#endif  // KEEL_KERNELS_GLA_CPU_H_
