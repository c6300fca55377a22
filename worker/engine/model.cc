// Model base class: the flat parameter buffer, scratch, initialisers, factory.
#include "worker/engine/model.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kernels/philox.h"

namespace keel {

std::unique_ptr<Model> NewProxyModel(const RunConfig& config, Backend* backend);
std::unique_ptr<Model> NewGptModel(const RunConfig& config, Backend* backend);
std::unique_ptr<Model> NewLlamaModel(const RunConfig& config, Backend* backend);
std::unique_ptr<Model> NewGlaModel(const RunConfig& config, Backend* backend);

Model::~Model() {
  for (void* p : allocations_) backend_->Free(p);
}

void Model::AddParam(const std::string& name, std::vector<int64_t> shape, int block, bool decay,
                     bool ln_gamma) {
  ParamInfo info;
  info.name = name;
  info.count = 1;
  for (int64_t s : shape) info.count *= s;
  info.shape = std::move(shape);
  // Each tensor starts on a 64-float (256-byte) boundary: vectorised kernels and
  // cuBLASLt like aligned operands.
  info.offset = (param_count_ + 63) / 64 * 64;
  info.block = block;
  info.decay = decay;
  info.ln_gamma = ln_gamma;
  param_count_ = info.offset + info.count;
  params_.push_back(std::move(info));
}

Status Model::LinearPlusResidual(const float* x, const float* w, const float* bias, const float* residual,
                                 float* y, int64_t rows, int64_t in, int64_t out, const LinearQuant& q) {
  if (bias == nullptr) return backend_->LinearForward(x, w, nullptr, residual, y, rows, in, out, q);
  KEEL_RETURN_IF_ERROR(backend_->LinearForward(x, w, bias, nullptr, y, rows, in, out, q));
  return backend_->Add(y, residual, y, rows * out);
}

Status Model::Final(const GradientReady& ready, std::initializer_list<int> indices) {
  if (!ready) return Status::Ok();
  for (int i : indices) {
    if (i >= 0) KEEL_RETURN_IF_ERROR(ready(i));
  }
  return Status::Ok();
}

Status Model::UploadTokens(const Batch& batch, const std::string& type, int64_t bt, int32_t* tokens,
                           int32_t* targets, int64_t* valid) {
  if (static_cast<int64_t>(batch.inputs.size()) != bt || static_cast<int64_t>(batch.targets.size()) != bt) {
    return Status::Error(type + ": batch holds " + std::to_string(batch.inputs.size()) +
                         " tokens, expected batch x seq = " + std::to_string(bt));
  }
  *valid = 0;
  for (int32_t t : batch.targets) *valid += t >= 0;
  KEEL_RETURN_IF_ERROR(backend_->Upload(tokens, batch.inputs.data(), bt * sizeof(int32_t)));
  return backend_->Upload(targets, batch.targets.data(), bt * sizeof(int32_t));
}

Status Model::MeanLoss(const float* losses, int64_t bt, int64_t valid, double* loss) {
  std::vector<double> sums;
  KEEL_RETURN_IF_ERROR(backend_->Sums({Span{losses, bt}}, &sums));
  *loss = valid > 0 ? sums[0] / static_cast<double>(valid) : 0.0;
  return Status::Ok();
}

Status Model::LanguageModelLoss(float* logits, const int32_t* targets, float* losses, int64_t bt,
                                int64_t padded_vocab, int64_t vocab, const float* grad_scale, int64_t valid,
                                const LinearQuant& head, double* loss) {
  dlogits_bf16_ = nullptr;
  if (grad_scale != nullptr && valid > 0) {
    const float scale = *grad_scale / static_cast<float>(valid);
    if (TakesBf16Dy(head) && head.hcp_dgrad.count == 0 && head.hcp_wgrad_rows == 0) {
      uint16_t* d = reinterpret_cast<uint16_t*>(logits);
      KEEL_RETURN_IF_ERROR(
          backend_->CrossEntropyFusedBf16(logits, targets, losses, d, 2 * padded_vocab, bt, padded_vocab, vocab, scale, 0));
      dlogits_bf16_ = d;
      dlogits_bf16_ld_ = 2 * padded_vocab;
    } else {
      KEEL_RETURN_IF_ERROR(
          backend_->CrossEntropyFused(logits, targets, losses, logits, bt, padded_vocab, vocab, scale));
    }
  } else {
    KEEL_RETURN_IF_ERROR(backend_->CrossEntropyForward(logits, targets, losses, bt, padded_vocab, vocab));
  }
  return MeanLoss(losses, bt, valid, loss);
}

namespace {

// The multiple of rows the head's chunks must be for the chunked pass (its
// backward chunk by chunk) to give every row the bits of the one-piece pass,
// but the weight gradient's order of summation; 0: the head runs in one piece.
// 1: BF16 nearest-even in all six roles (a row's rounding is its own). 32: its
// quantized roles MX (their blocks lie within a row, or within 32 rows of a
// column) with nearest rounding (stochastic seeds follow the element's index in
// the whole tensor) and no RHT, the others BF16 nearest-even or fp32, at least
// one MX. Never with a Hot-Channel Patch (its sets span every row).
int64_t HeadChunkMultiple(const LinearQuant& q) {
  if (q.hcp_fwd.count != 0 || q.hcp_dgrad.count != 0 || q.hcp_wgrad_rows != 0) return 0;
  bool all_bf16 = true, mx = false;
  for (const OperandFormat& f : q.role) {
    const bool bf16 = f.quantized() && f.format == QuantFormat::kBf16;
    if (!bf16) all_bf16 = false;
    if (!f.quantized()) continue;
    if (bf16) {
      if (f.rounding != Rounding::kNearestEven) return 0;
      continue;
    }
    if (!IsMx(f.format) || f.rounding == Rounding::kStochastic || f.rht || f.mx_block <= 0 || 32 % f.mx_block != 0) {
      return 0;
    }
    mx = true;
  }
  return all_bf16 ? 1 : mx ? 32 : 0;
}

// The rows of a head chunk: the largest divisor of bt that is a multiple of
// `multiple` and whose fp32 logits fit `floats`; 0 (one piece) when that is
// under 64 rows or the whole.
int64_t HeadChunkRows(int64_t bt, int64_t padded_vocab, int64_t floats, int64_t multiple) {
  for (int64_t c = std::min<int64_t>(bt, std::max<int64_t>(1, floats / padded_vocab)); c >= 1; --c) {
    if (bt % c == 0 && c % multiple == 0) return c >= 64 || c == bt ? c : 0;
  }
  return 0;
}

}  // namespace

Status Model::HeadChunks(const float* x, const float* w, float* logits, int64_t bt, int64_t rows, int64_t d,
                         int64_t padded_vocab, const LinearQuant& head,
                         const std::function<Status(int64_t r0)>& after_chunk) {
  KEEL_RETURN_IF_ERROR(backend_->HoldWeight(w));
  Status s = Status::Ok();
  for (int64_t r0 = 0; r0 < bt && s.ok(); r0 += rows) {
    s = backend_->LinearForward(x + r0 * d, w, nullptr, nullptr, logits, rows, d, padded_vocab, head);
    if (s.ok()) s = after_chunk(r0);
  }
  KEEL_RETURN_IF_ERROR(backend_->HoldWeight(nullptr));
  return s;
}

Status Model::HeadAndLoss(const float* x, const float* w, const int32_t* targets, float* losses, int64_t bt,
                          int64_t d, int64_t padded_vocab, int64_t vocab, const LinearQuant& head,
                          const float* grad_scale, int64_t valid, double* loss) {
  const bool training = grad_scale != nullptr && valid > 0;
  head_backward_done_ = false;
  // The chunk: the largest divisor of bt (a multiple of the head's) whose logits fit; 0 for one piece.
  // Training, chunks need the backward's outputs (SetHeadGradients) to run it chunk by chunk.
  int64_t rows = 0;
  const int64_t multiple = HeadChunkMultiple(head);
  if (multiple > 0 && (!training || (head_dx_ != nullptr && head_dw_ != nullptr))) {
    rows = HeadChunkRows(bt, padded_vocab, head_chunk_floats_, multiple);
    if (rows == bt) rows = 0;  // one chunk: the one-piece pass, its backward where the caller runs it
  }
  if (rows == 0) {
    KEEL_RETURN_IF_ERROR(GrowScratch(static_cast<size_t>(bt * padded_vocab) * sizeof(float), &head_buf_, &head_bytes_));
    float* logits = static_cast<float*>(head_buf_);
    KEEL_RETURN_IF_ERROR(backend_->LinearForward(x, w, nullptr, nullptr, logits, bt, d, padded_vocab, head));
    return LanguageModelLoss(logits, targets, losses, bt, padded_vocab, vocab, grad_scale, valid, head, loss);
  }
  // Each chunk's fp32 logits, its loss, its dlogits in place (bf16 over the logits where the head's
  // backward reads dy in bf16, as LanguageModelLoss writes them) and the head's backward on them.
  KEEL_RETURN_IF_ERROR(GrowScratch(static_cast<size_t>(rows * padded_vocab) * sizeof(float), &head_buf_,
                                   &head_bytes_));
  float* logits = static_cast<float*>(head_buf_);
  const float scale = training ? *grad_scale / static_cast<float>(valid) : 0.0f;
  dlogits_bf16_ = nullptr;
  const bool bf16_dy = TakesBf16Dy(head);
  LinearQuant backward = head;
  if (bf16_dy) {
    backward.dy_bf16 = reinterpret_cast<const uint16_t*>(logits);
    backward.dy_bf16_ld = 2 * padded_vocab;
  }
  // w quantized once for the chunks' forwards and once for their dgrads (a BF16 w: rounded once for both).
  KEEL_RETURN_IF_ERROR(HeadChunks(x, w, logits, bt, rows, d, padded_vocab, head, [&](int64_t r0) -> Status {
    if (!training) return backend_->CrossEntropyForward(logits, targets + r0, losses + r0, rows, padded_vocab, vocab);
    if (bf16_dy) {
      KEEL_RETURN_IF_ERROR(backend_->CrossEntropyFusedBf16(logits, targets + r0, losses + r0,
                                                           reinterpret_cast<uint16_t*>(logits), 2 * padded_vocab,
                                                           rows, padded_vocab, vocab, scale, 0));
    } else {
      KEEL_RETURN_IF_ERROR(backend_->CrossEntropyFused(logits, targets + r0, losses + r0, logits, rows, padded_vocab,
                                                       vocab, scale));
    }
    return backend_->LinearBackward(x + r0 * d, w, logits, head_dx_ + r0 * d, head_dw_, nullptr, rows, d,
                                    padded_vocab, backward);
  }));
  head_backward_done_ = training;
  return MeanLoss(losses, bt, valid, loss);
}

LinearQuant Model::HeadBackward(LinearQuant q) const {
  q.dy_bf16 = dlogits_bf16_;
  q.dy_bf16_ld = dlogits_bf16_ld_;
  return q;
}

bool Model::XBf16(const LinearQuant& q) {
  // The patch needs x in fp32 (its residual): no bf16 x with it.
  return TakesBf16X(q) && q.hcp_fwd.count == 0 && q.hcp_wgrad_rows == 0;
}

LinearQuant Model::XInBf16(LinearQuant q, const float* buffer, int64_t ld) {
  if (!XBf16(q)) return q;
  q.x_bf16 = reinterpret_cast<const uint16_t*>(buffer);
  q.x_bf16_ld = ld;
  return q;
}

// ---- Hot-Channel Patch state -------------------------------------------------------

namespace {

// The scheme the hot sets were chosen under, as one line.
std::string HcpSchemeKey(const PrecisionScheme& scheme) { return scheme.name + " " + DescribeScheme(scheme); }

bool HasRoleBelowBf16(const LinearQuant& q) {
  for (const OperandFormat& f : q.role) {
    if (f.quantized() && f.format != QuantFormat::kBf16) return true;
  }
  return false;
}

}  // namespace

void Model::LinearShape(int slot, int64_t* in, int64_t* out) const {
  const std::string weight = linear_names_[static_cast<size_t>(slot)] + ".weight";
  const ParamInfo* found = nullptr;
  for (const ParamInfo& p : params_) {
    if (p.name == weight) found = &p;
  }
  if (found == nullptr) {  // lm_head: the tied embedding, the first matrix outside the blocks
    for (const ParamInfo& p : params_) {
      if (p.block < 0 && p.shape.size() == 2) {
        found = &p;
        break;
      }
    }
  }
  *out = found != nullptr ? found->shape[0] : 0;
  *in = found != nullptr ? found->shape[1] : 0;
}

Status Model::BeginHcpStep(const PrecisionScheme& scheme, bool choose) {
  hcp_in_step_ = true;
  hcp_choosing_ = false;
  if (scheme.hcp_channels == 0) return Status::Ok();
  const std::string key = HcpSchemeKey(scheme);
  if (!hot_held_ || hot_scheme_ != key) choose = true;
  if (!choose) return Status::Ok();
  const int64_t layers = static_cast<int64_t>(linear_names_.size());
  KEEL_RETURN_IF_ERROR(HotIndexFor(scheme.hcp_channels));
  hot_fwd_.assign(static_cast<size_t>(layers), 0);
  hot_dgrad_.assign(static_cast<size_t>(layers), 0);
  // Each layer's set size, once per choice: its contraction may be narrower.
  hot_k_.assign(static_cast<size_t>(layers), 0);
  for (int64_t slot = 0; slot < layers; ++slot) {
    int64_t in = 0, out = 0;
    LinearShape(static_cast<int>(slot), &in, &out);
    hot_k_[static_cast<size_t>(slot)] = static_cast<int32_t>(std::min<int64_t>(scheme.hcp_channels, std::min(in, out)));
  }
  hot_held_ = false;
  hot_scheme_ = key;
  hcp_choosing_ = true;
  return Status::Ok();
}

Status Model::HotIndexFor(int channels) {
  if (hot_index_ != nullptr && hot_channels_ == channels) return Status::Ok();
  // Every layer's two sets at this channel count.
  const int64_t ints = static_cast<int64_t>(linear_names_.size()) * 2 * channels;
  void* p = nullptr;
  KEEL_RETURN_IF_ERROR(ScratchBytes(static_cast<size_t>(ints) * sizeof(int32_t), &p));
  hot_index_ = static_cast<int32_t*>(p);
  hot_capacity_ = ints;
  hot_channels_ = channels;
  return Status::Ok();
}

void Model::EndHcpStep() {
  if (hcp_choosing_) hot_held_ = true;
  hcp_in_step_ = false;
}

LinearQuant Model::WithHcp(LinearQuant q, const PrecisionScheme& scheme, int slot) const {
  if ((scheme.hcp_channels == 0 && scheme.hcp_wgrad_rows == 0) || !HasRoleBelowBf16(q)) return q;
  q.hcp_wgrad_rows = scheme.hcp_wgrad_rows;
  if (scheme.hcp_channels == 0) return q;
  const bool choosing = hcp_in_step_ && hcp_choosing_;
  // Sets exist for this scheme: being chosen now, or held from a step that chose
  // under it. Inside a training step BeginHcpStep has compared them with the
  // step's scheme (the one ForwardBackward passes) once; outside one
  // (evaluation) they are compared here.
  const bool usable = choosing || (hot_held_ && (hcp_in_step_ || hot_scheme_ == HcpSchemeKey(scheme)));
  if (!usable || hot_index_ == nullptr || hot_channels_ != scheme.hcp_channels) return q;
  int32_t* fwd = hot_index_ + static_cast<int64_t>(slot) * 2 * hot_channels_;
  int32_t* dgrad = fwd + hot_channels_;
  if (choosing) {
    const int32_t k = hot_k_[static_cast<size_t>(slot)];
    if (k <= 0) return q;
    hot_fwd_[static_cast<size_t>(slot)] = k;
    hot_dgrad_[static_cast<size_t>(slot)] = scheme.hcp_dgrad ? k : 0;
    q.hcp_fwd = HotChannels{nullptr, k, fwd};
    if (scheme.hcp_dgrad) q.hcp_dgrad = HotChannels{nullptr, k, dgrad};
  } else {
    q.hcp_fwd = HotChannels{fwd, hot_fwd_[static_cast<size_t>(slot)]};
    q.hcp_dgrad = HotChannels{dgrad, hot_dgrad_[static_cast<size_t>(slot)]};
  }
  return q;
}

// Text: "scheme KEY\n" then one line per layer with sets, "SLOT FWD_COUNT
// DGRAD_COUNT i i i ..." (the forward's indices, then the dgrad's).
Status Model::HotSetsToText(std::string* out) const {
  out->clear();
  if (!hot_held_ || hot_index_ == nullptr) return Status::Ok();
  std::vector<int32_t> all(static_cast<size_t>(hot_capacity_));
  KEEL_RETURN_IF_ERROR(backend_->Download(all.data(), hot_index_, all.size() * sizeof(int32_t)));
  std::string text = "scheme " + hot_scheme_ + "\n";
  for (size_t slot = 0; slot < hot_fwd_.size(); ++slot) {
    if (hot_fwd_[slot] == 0 && hot_dgrad_[slot] == 0) continue;
    text += std::to_string(slot) + " " + std::to_string(hot_fwd_[slot]) + " " + std::to_string(hot_dgrad_[slot]);
    const int32_t* fwd = all.data() + slot * 2 * static_cast<size_t>(hot_channels_);
    for (int32_t h = 0; h < hot_fwd_[slot]; ++h) text += " " + std::to_string(fwd[h]);
    for (int32_t h = 0; h < hot_dgrad_[slot]; ++h) text += " " + std::to_string(fwd[hot_channels_ + h]);
    text += "\n";
  }
  *out = text;
  return Status::Ok();
}

Status Model::ParseHotSets(const std::string& text, const PrecisionScheme& scheme, ParsedHotSets* out) const {
  *out = ParsedHotSets();
  if (text.empty()) return Status::Ok();
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  if (line != "scheme " + HcpSchemeKey(scheme)) return Status::Ok();  // another scheme's: chosen again
  const int64_t layers = static_cast<int64_t>(linear_names_.size());
  const int channels = scheme.hcp_channels;
  out->index.assign(static_cast<size_t>(layers * 2 * channels), 0);
  out->fwd.assign(static_cast<size_t>(layers), 0);
  out->dgrad.assign(static_cast<size_t>(layers), 0);
  while (std::getline(in, line)) {
    std::istringstream l(line);
    int64_t slot = -1, nf = -1, nd = -1;
    l >> slot >> nf >> nd;
    if (!l || slot < 0 || slot >= layers || nf < 0 || nf > channels || nd < 0 || nd > channels) {
      return Status::Error("hot sets: line '" + line + "' is not allowed (need SLOT < " + std::to_string(layers) +
                           " and counts <= " + std::to_string(channels) + ")");
    }
    int64_t k_in = 0, k_out = 0;
    LinearShape(static_cast<int>(slot), &k_in, &k_out);
    int32_t* set = out->index.data() + slot * 2 * channels;
    int64_t previous = -1;
    for (int64_t h = 0; h < nf + nd; ++h) {
      int64_t v = -1;
      l >> v;
      const int64_t limit = h < nf ? k_in : k_out;
      if (h == nf) previous = -1;  // the dgrad set starts
      if (!l || v <= previous || v >= limit) {
        return Status::Error("hot sets: layer " + std::to_string(slot) + " (" + linear_names_[slot] + ") " +
                             (h < nf ? "forward" : "dgrad") + " index " + std::to_string(h < nf ? h : h - nf) + ": " +
                             (l ? std::to_string(v) : std::string("missing")) +
                             " is not allowed (need ascending indices below " + std::to_string(limit) + ")");
      }
      previous = v;
      set[h < nf ? h : channels + (h - nf)] = static_cast<int32_t>(v);
    }
    out->fwd[static_cast<size_t>(slot)] = static_cast<int32_t>(nf);
    out->dgrad[static_cast<size_t>(slot)] = static_cast<int32_t>(nd);
  }
  out->held = true;
  return Status::Ok();
}

Status Model::CheckHotSetsText(const std::string& text, const PrecisionScheme& scheme) const {
  ParsedHotSets parsed;
  return ParseHotSets(text, scheme, &parsed);
}

Status Model::HotSetsFromText(const std::string& text, const PrecisionScheme& scheme) {
  ParsedHotSets parsed;
  KEEL_RETURN_IF_ERROR(ParseHotSets(text, scheme, &parsed));
  hot_held_ = false;
  if (!parsed.held) return Status::Ok();
  KEEL_RETURN_IF_ERROR(HotIndexFor(scheme.hcp_channels));  // parsed.index has its size
  KEEL_RETURN_IF_ERROR(backend_->Upload(hot_index_, parsed.index.data(), parsed.index.size() * sizeof(int32_t)));
  hot_fwd_ = parsed.fwd;
  hot_dgrad_ = parsed.dgrad;
  hot_scheme_ = HcpSchemeKey(scheme);
  hot_held_ = true;
  return Status::Ok();
}

Status Model::LayerNormFor(const LinearQuant& q, const float* x, const float* gamma, const float* beta, float* y,
                           float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  if (q.x_bf16 == nullptr) return backend_->LayerNormForward(x, gamma, beta, y, mean, rstd, rows, cols, eps);
  return backend_->LayerNormForwardBf16(x, gamma, beta, reinterpret_cast<uint16_t*>(y), mean, rstd, rows, cols, eps);
}

Status Model::LinearThenResidual(const float* x, const float* w, const float* bias, const float* residual, float* y,
                                 int64_t rows, int64_t in, int64_t out, const LinearQuant& q, const float** pending) {
  *pending = nullptr;
  if (bias == nullptr) return LinearPlusResidual(x, w, bias, residual, y, rows, in, out, q);
  KEEL_RETURN_IF_ERROR(backend_->LinearForward(x, w, bias, nullptr, y, rows, in, out, q));
  *pending = residual;
  return Status::Ok();
}

Status Model::LayerNormAfter(const LinearQuant& q, float* x, const float* pending, const float* gamma,
                             const float* beta, float* y, float* mean, float* rstd, int64_t rows, int64_t cols,
                             float eps) {
  if (pending == nullptr) return LayerNormFor(q, x, gamma, beta, y, mean, rstd, rows, cols, eps);
  if (q.x_bf16 == nullptr) {
    return backend_->AddLayerNormForward(x, pending, x, gamma, beta, y, nullptr, mean, rstd, rows, cols, eps);
  }
  return backend_->AddLayerNormForward(x, pending, x, gamma, beta, nullptr, reinterpret_cast<uint16_t*>(y), mean,
                                       rstd, rows, cols, eps);
}

Status Model::GeluFor(const LinearQuant& q, const float* x, float* y, int64_t count) {
  if (q.x_bf16 == nullptr) return backend_->GeluForward(x, y, count);
  return backend_->GeluForwardBf16(x, reinterpret_cast<uint16_t*>(y), count);
}

Status Model::AllocateParams() {
  param_count_ = (param_count_ + 63) / 64 * 64;
  return Scratch(param_count_, &weights_);
}

Status Model::AllocateParamCopies(const std::function<bool(size_t index)>& copied) {
  param_copy_at_.assign(params_.size(), -1);
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!copied(i)) continue;
    param_copy_at_[i] = total;
    total += (params_[i].count + 63) / 64 * 64;
  }
  return Scratch(std::max<int64_t>(total, 64), &param_copies_);
}

float* Model::ParamCopy(int index) const {
  if (index < 0 || static_cast<size_t>(index) >= param_copy_at_.size() || param_copy_at_[index] < 0) return nullptr;
  return param_copies_ + param_copy_at_[index];
}

Status Model::GrowScratch(size_t need, void** buffer, size_t* bytes) {
  if (*buffer != nullptr && *bytes >= need) return Status::Ok();
  if (*buffer != nullptr) {
    allocations_.erase(std::find(allocations_.begin(), allocations_.end(), *buffer));
    backend_->Free(*buffer);
    *buffer = nullptr;
    *bytes = 0;
  }
  KEEL_RETURN_IF_ERROR(ScratchBytes(need, buffer));
  *bytes = need;
  return Status::Ok();
}

Status Model::GrowActivation(const LinearQuant& q, int64_t count, float** buffer, size_t* bytes) {
  return GrowActivationBytes(static_cast<size_t>(count) * (XBf16(q) ? sizeof(uint16_t) : sizeof(float)), buffer,
                             bytes);
}

Status Model::GrowSavedQkv(int64_t count, int64_t head_dim, bool bf16, bool may_keep, bool* kept, float** buffer,
                           size_t* bytes) {
  *kept = may_keep && backend_->KeepsAttentionHeads(head_dim, bf16);
  return GrowActivationBytes(static_cast<size_t>(count) * (*kept ? sizeof(uint16_t) : sizeof(float)), buffer, bytes);
}

Status Model::GrowActivationBytes(size_t need, float** buffer, size_t* bytes) {
  const size_t before = *bytes;
  void* p = *buffer;
  KEEL_RETURN_IF_ERROR(GrowScratch(need, &p, bytes));
  *buffer = static_cast<float*>(p);
  scheme_sized_bytes_ += static_cast<int64_t>(*bytes) - static_cast<int64_t>(before);
  return Status::Ok();
}

Status Model::ScratchBytes(size_t bytes, void** out) {
  KEEL_RETURN_IF_ERROR(backend_->Alloc(bytes, out));
  allocations_.push_back(*out);
  return Status::Ok();
}

void InitUniform(uint64_t seed, float bound, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    out[i] = (2.0f * PhiloxUniform(seed, static_cast<uint64_t>(i)) - 1.0f) * bound;
  }
}

void InitNormal(uint64_t seed, float stddev, float* out, int64_t count) {
  // The Box-Muller form nn.h's RandomNormal uses.
  const float kTwoPi = 6.283185307179586f;
  for (int64_t i = 0; i < count; ++i) {
    uint64_t k = 2 * static_cast<uint64_t>(i);
    float u1 = 1.0f - PhiloxUniform(seed, k);
    float u2 = PhiloxUniform(seed, k + 1);
    out[i] = stddev * std::sqrt(-2.0f * std::log(u1)) * std::cos(kTwoPi * u2);
  }
}

Status MakeModel(const RunConfig& config, Backend* backend, std::unique_ptr<Model>* out) {
  std::unique_ptr<Model> model;
  if (config.model.type == "proxy") {
    model = NewProxyModel(config, backend);
  } else if (config.model.type == "gpt") {
    model = NewGptModel(config, backend);
  } else if (config.model.type == "llama") {
    model = NewLlamaModel(config, backend);
  } else if (config.model.type == "gla") {
    model = NewGlaModel(config, backend);
  } else {
    return Status::Error("model.type: unknown value '" + config.model.type +
                         "' (allowed: proxy, gpt, llama, gla)");
  }
  Status s = model->Build();
  if (!s.ok()) return s;
  *out = std::move(model);
  return Status::Ok();
}

}  // namespace keel
