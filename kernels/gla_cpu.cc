// The gated recurrence of GLA on the host: the sequential definition and the
// chunked form (gla_cpu.h has the formulas). All arithmetic is fp32; sums run in
// index order.
#include "kernels/gla_cpu.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace keel {
namespace gla_cpu {
namespace {

// One head's rows of the operands.
struct Head {
  const float* qkv;
  const float* gk;
  const Shape& s;
  int64_t b, h;
  int64_t Row(int64_t t) const { return b * s.seq + t; }
  const float* Q(int64_t t) const { return qkv + Row(t) * s.ld + h * s.dkh(); }
  const float* K(int64_t t) const { return qkv + Row(t) * s.ld + s.dk + h * s.dkh(); }
  const float* V(int64_t t) const { return qkv + Row(t) * s.ld + 2 * s.dk + h * s.dvh(); }
  const float* G(int64_t t) const { return gk + Row(t) * s.dk + h * s.dkh(); }
  float Scale() const { return 1.0f / std::sqrt(static_cast<float>(s.dkh())); }
};

// B (n x dkh): the cumulative log gates of positions c0 .. c0 + n - 1 from c0.
void CumulativeGates(const Head& hd, int64_t c0, int64_t n, std::vector<float>* cum) {
  const int64_t dkh = hd.s.dkh();
  cum->assign(n * dkh, 0.0f);
  for (int64_t i = 0; i < dkh; ++i) {
    float run = 0.0f;
    for (int64_t t = 0; t < n; ++t) {
      run += hd.G(c0 + t)[i];
      (*cum)[t * dkh + i] = run;
    }
  }
}

}  // namespace

Status CheckShape(const char* op, const Shape& s) {
  const auto bad = [&](const std::string& field, int64_t value, const std::string& need) {
    return Status::Error(std::string(op) + ": " + field + ": " + std::to_string(value) + " is not allowed; need " +
                         need);
  };
  if (s.batch < 0) return bad("batch", s.batch, ">= 0");
  if (s.seq < 1) return bad("seq", s.seq, ">= 1");
  if (s.heads < 1) return bad("heads", s.heads, ">= 1");
  if (s.dk < 1 || s.dk % s.heads != 0) return bad("dk", s.dk, "a positive multiple of heads " + std::to_string(s.heads));
  if (s.dv < 1 || s.dv % s.heads != 0) return bad("dv", s.dv, "a positive multiple of heads " + std::to_string(s.heads));
  if (s.ld < 2 * s.dk + s.dv) return bad("ld", s.ld, ">= 2 dk + dv = " + std::to_string(2 * s.dk + s.dv));
  return Status::Ok();
}

void ForwardSequential(const float* qkv, const float* gk, float* out, const Shape& s, int64_t b, int64_t h) {
  const Head hd{qkv, gk, s, b, h};
  const int64_t dkh = s.dkh(), dvh = s.dvh();
  const float scale = hd.Scale();
  std::vector<float> state(dkh * dvh, 0.0f);
  for (int64_t t = 0; t < s.seq; ++t) {
    const float *q = hd.Q(t), *k = hd.K(t), *v = hd.V(t), *g = hd.G(t);
    for (int64_t i = 0; i < dkh; ++i) {
      const float decay = std::exp(g[i]);
      float* row = state.data() + i * dvh;
      for (int64_t j = 0; j < dvh; ++j) row[j] = decay * row[j] + k[i] * v[j];
    }
    float* o = out + hd.Row(t) * s.dv + h * dvh;
    for (int64_t j = 0; j < dvh; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < dkh; ++i) acc += (q[i] * scale) * state[i * dvh + j];
      o[j] = acc;
    }
  }
}

void BackwardSequential(const float* qkv, const float* gk, const float* dout, float* dqkv, float* dgk,
                        const Shape& s, int64_t b, int64_t h) {
  const Head hd{qkv, gk, s, b, h};
  const int64_t dkh = s.dkh(), dvh = s.dvh(), size = dkh * dvh;
  const float scale = hd.Scale();
  // states[t] = S_t, recomputed as the forward does; S_{-1} = 0.
  std::vector<float> states(s.seq * size, 0.0f);
  for (int64_t t = 0; t < s.seq; ++t) {
    const float *k = hd.K(t), *v = hd.V(t), *g = hd.G(t);
    float* now = states.data() + t * size;
    const float* before = t > 0 ? now - size : nullptr;
    for (int64_t i = 0; i < dkh; ++i) {
      const float decay = std::exp(g[i]);
      for (int64_t j = 0; j < dvh; ++j) {
        now[i * dvh + j] = decay * (before != nullptr ? before[i * dvh + j] : 0.0f) + k[i] * v[j];
      }
    }
  }
  // dS = d loss / d S_t, carried from t + 1 back to t.
  std::vector<float> ds(size, 0.0f);
  for (int64_t t = s.seq - 1; t >= 0; --t) {
    const float *q = hd.Q(t), *k = hd.K(t), *v = hd.V(t), *g = hd.G(t);
    const float* d_o = dout + hd.Row(t) * s.dv + h * dvh;
    const float* now = states.data() + t * size;
    const float* before = t > 0 ? now - size : nullptr;
    float* dq = dqkv + hd.Row(t) * s.ld + h * dkh;
    float* dk = dq + s.dk;
    float* dv = dqkv + hd.Row(t) * s.ld + 2 * s.dk + h * dvh;
    float* dg = dgk + hd.Row(t) * s.dk + h * dkh;
    // o_t = (q_t scale) S_t: dS_t += (q_t scale)^T do_t, dq_t = scale S_t do_t.
    for (int64_t i = 0; i < dkh; ++i) {
      float acc = 0.0f;
      for (int64_t j = 0; j < dvh; ++j) {
        ds[i * dvh + j] += (q[i] * scale) * d_o[j];
        acc += now[i * dvh + j] * d_o[j];
      }
      dq[i] = scale * acc;
    }
    // S_t = diag(a_t) S_{t-1} + k_t^T v_t with a_t = exp(gk_t).
    for (int64_t i = 0; i < dkh; ++i) {
      float acc_k = 0.0f, acc_g = 0.0f;
      for (int64_t j = 0; j < dvh; ++j) {
        acc_k += ds[i * dvh + j] * v[j];
        if (before != nullptr) acc_g += ds[i * dvh + j] * before[i * dvh + j];
      }
      dk[i] = acc_k;
      dg[i] = std::exp(g[i]) * acc_g;
    }
    for (int64_t j = 0; j < dvh; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < dkh; ++i) acc += k[i] * ds[i * dvh + j];
      dv[j] = acc;
    }
    for (int64_t i = 0; i < dkh; ++i) {
      const float decay = std::exp(g[i]);
      for (int64_t j = 0; j < dvh; ++j) ds[i * dvh + j] *= decay;
    }
  }
}

void ForwardChunked(const float* qkv, const float* gk, float* out, const Shape& s, int64_t b, int64_t h,
                    int64_t chunk) {
  const Head hd{qkv, gk, s, b, h};
  const int64_t dkh = s.dkh(), dvh = s.dvh();
  const float scale = hd.Scale();
  std::vector<float> state(dkh * dvh, 0.0f), cum;
  for (int64_t c0 = 0; c0 < s.seq; c0 += chunk) {
    const int64_t n = std::min(chunk, s.seq - c0);
    CumulativeGates(hd, c0, n, &cum);
    for (int64_t t = 0; t < n; ++t) {
      const float* q = hd.Q(c0 + t);
      const float* bt = cum.data() + t * dkh;
      float* o = out + hd.Row(c0 + t) * s.dv + h * dvh;
      // Inter-chunk: (q_t * exp(B_t)) S_in.
      for (int64_t j = 0; j < dvh; ++j) {
        float acc = 0.0f;
        for (int64_t i = 0; i < dkh; ++i) acc += q[i] * std::exp(bt[i]) * state[i * dvh + j];
        o[j] = acc;
      }
      // Intra-chunk: sum_{s<=t} A_ts v_s.
      for (int64_t u = 0; u <= t; ++u) {
        const float* k = hd.K(c0 + u);
        const float* bs = cum.data() + u * dkh;
        float a = 0.0f;
        for (int64_t i = 0; i < dkh; ++i) a += q[i] * k[i] * std::exp(bt[i] - bs[i]);
        const float* v = hd.V(c0 + u);
        for (int64_t j = 0; j < dvh; ++j) o[j] += a * v[j];
      }
      for (int64_t j = 0; j < dvh; ++j) o[j] *= scale;
    }
    // S_out = diag(exp(B_end)) S_in + sum_s diag(exp(B_end - B_s)) k_s^T v_s.
    const float* end = cum.data() + (n - 1) * dkh;
    for (int64_t i = 0; i < dkh; ++i) {
      for (int64_t j = 0; j < dvh; ++j) {
        float acc = std::exp(end[i]) * state[i * dvh + j];
        for (int64_t u = 0; u < n; ++u) {
          acc += hd.K(c0 + u)[i] * std::exp(end[i] - cum[u * dkh + i]) * hd.V(c0 + u)[j];
        }
        state[i * dvh + j] = acc;
      }
    }
  }
}

void BackwardChunked(const float* qkv, const float* gk, const float* dout, float* dqkv, float* dgk,
                     const Shape& s, int64_t b, int64_t h, int64_t chunk) {
  const Head hd{qkv, gk, s, b, h};
  const int64_t dkh = s.dkh(), dvh = s.dvh();
  const float scale = hd.Scale();
  const auto DO = [&](int64_t t) { return dout + hd.Row(t) * s.dv + h * dvh; };
  const auto DQ = [&](int64_t t) { return dqkv + hd.Row(t) * s.ld + h * dkh; };
  const auto DK = [&](int64_t t) { return dqkv + hd.Row(t) * s.ld + s.dk + h * dkh; };
  const auto DV = [&](int64_t t) { return dqkv + hd.Row(t) * s.ld + 2 * s.dk + h * dvh; };
  std::vector<float> cum;

  // Pass 1, forward over the chunks: the state before each chunk, and dq.
  std::vector<float> state(dkh * dvh, 0.0f);
  for (int64_t c0 = 0; c0 < s.seq; c0 += chunk) {
    const int64_t n = std::min(chunk, s.seq - c0);
    CumulativeGates(hd, c0, n, &cum);
    for (int64_t t = 0; t < n; ++t) {
      const float* d_o = DO(c0 + t);
      const float* bt = cum.data() + t * dkh;
      float* dq = DQ(c0 + t);
      for (int64_t i = 0; i < dkh; ++i) {
        float acc = 0.0f;
        for (int64_t j = 0; j < dvh; ++j) acc += state[i * dvh + j] * d_o[j];
        dq[i] = std::exp(bt[i]) * acc;
      }
      for (int64_t u = 0; u <= t; ++u) {
        const float* v = hd.V(c0 + u);
        float dp = 0.0f;  // do_t . v_s
        for (int64_t j = 0; j < dvh; ++j) dp += d_o[j] * v[j];
        const float* k = hd.K(c0 + u);
        const float* bs = cum.data() + u * dkh;
        for (int64_t i = 0; i < dkh; ++i) dq[i] += dp * k[i] * std::exp(bt[i] - bs[i]);
      }
      for (int64_t i = 0; i < dkh; ++i) dq[i] *= scale;
    }
    const float* end = cum.data() + (n - 1) * dkh;
    for (int64_t i = 0; i < dkh; ++i) {
      for (int64_t j = 0; j < dvh; ++j) {
        float acc = std::exp(end[i]) * state[i * dvh + j];
        for (int64_t u = 0; u < n; ++u) {
          acc += hd.K(c0 + u)[i] * std::exp(end[i] - cum[u * dkh + i]) * hd.V(c0 + u)[j];
        }
        state[i * dvh + j] = acc;
      }
    }
  }

  // Pass 2, the chunks in reverse: dk, dv from dS (the gradient of the state
  // after the chunk), then dS moved to before the chunk.
  std::vector<float> ds(dkh * dvh, 0.0f);
  const int64_t chunks = (s.seq + chunk - 1) / chunk;
  for (int64_t c = chunks - 1; c >= 0; --c) {
    const int64_t c0 = c * chunk, n = std::min(chunk, s.seq - c0);
    CumulativeGates(hd, c0, n, &cum);
    const float* end = cum.data() + (n - 1) * dkh;
    for (int64_t u = 0; u < n; ++u) {
      const float *k = hd.K(c0 + u), *v = hd.V(c0 + u);
      const float* bs = cum.data() + u * dkh;
      float* dk = DK(c0 + u);
      float* dv = DV(c0 + u);
      // Through S_out: dk_s = exp(B_end - B_s) * (dS v_s), dv_s = (k_s * exp(B_end - B_s)) dS.
      for (int64_t i = 0; i < dkh; ++i) {
        float acc = 0.0f;
        for (int64_t j = 0; j < dvh; ++j) acc += ds[i * dvh + j] * v[j];
        dk[i] = std::exp(end[i] - bs[i]) * acc;
      }
      for (int64_t j = 0; j < dvh; ++j) {
        float acc = 0.0f;
        for (int64_t i = 0; i < dkh; ++i) acc += k[i] * std::exp(end[i] - bs[i]) * ds[i * dvh + j];
        dv[j] = acc;
      }
      // Through the intra-chunk outputs of t >= s.
      for (int64_t t = u; t < n; ++t) {
        const float* q = hd.Q(c0 + t);
        const float* d_o = DO(c0 + t);
        const float* bt = cum.data() + t * dkh;
        float a = 0.0f, dp = 0.0f;
        for (int64_t i = 0; i < dkh; ++i) a += q[i] * k[i] * std::exp(bt[i] - bs[i]);
        for (int64_t j = 0; j < dvh; ++j) dp += d_o[j] * v[j];
        for (int64_t i = 0; i < dkh; ++i) dk[i] += scale * dp * q[i] * std::exp(bt[i] - bs[i]);
        for (int64_t j = 0; j < dvh; ++j) dv[j] += scale * a * d_o[j];
      }
    }
    for (int64_t i = 0; i < dkh; ++i) {
      for (int64_t j = 0; j < dvh; ++j) {
        float acc = std::exp(end[i]) * ds[i * dvh + j];
        for (int64_t t = 0; t < n; ++t) {
          acc += scale * hd.Q(c0 + t)[i] * std::exp(cum[t * dkh + i]) * DO(c0 + t)[j];
        }
        ds[i * dvh + j] = acc;
      }
    }
  }

  // dgk_t = sum_{u >= t} (q_u dq_u - k_u dk_u), per feature.
  for (int64_t i = 0; i < dkh; ++i) {
    float run = 0.0f;
    for (int64_t t = s.seq - 1; t >= 0; --t) {
      run += hd.Q(t)[i] * DQ(t)[i] - hd.K(t)[i] * DK(t)[i];
      dgk[hd.Row(t) * s.dk + h * dkh + i] = run;
    }
  }
}

}  // namespace gla_cpu
}  // namespace keel
