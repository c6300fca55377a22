// A training run's configuration (`keel-train --config run.yaml`): model, data,
// precision scheme, optimizer, schedule, checkpoints and metrics. Parsed from
// YAML in one place (ParseRunConfig); every error names the field (with its line
// and column), the value and what is allowed, and leaves *out untouched.
#ifndef KEEL_WORKER_CONFIG_RUN_CONFIG_H_
#define KEEL_WORKER_CONFIG_RUN_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/base/status.h"
#include "worker/stability/policy.h"
#include "worker/config/scheme.h"

namespace YAML {
class Node;
}

namespace keel {

struct ModelConfig {
  std::string type = "proxy";  // proxy | gpt | llama | gla
  int layers = 4;              // proxy: depth L; gpt, llama, gla: transformer blocks
  int width = 512;             // proxy: d; gpt, llama, gla: model width
  // gpt, llama and gla (the language models). gla: heads divide the key width
  // d/2 (key head d/2/heads) and d (value head d/heads).
  int heads = 12;
  int context = 1024;          // max sequence length (gpt: position embeddings)
  int vocab = 50257;
  int padded_vocab = 0;        // 0: vocab rounded up to a multiple of 128
  int mlp_hidden = 0;          // 0: 4 x width (gelu), 8/3 x width rounded up to 64 (swiglu)
  float ln_eps = 1e-5f;        // layernorm eps (gpt), RMSNorm eps (llama, gla)
  // gpt only: llama and gla are always SwiGLU without biases or QK-LayerNorm, and the
  // parser refuses these keys for it (ParseRunConfig resolves them to what it is).
  std::string mlp = "gelu";    // gelu | swiglu
  bool qk_layernorm = false;
  bool bias = true;            // false: no biases in linears and layernorms
};

// The models built on the decoder skeleton (worker/engine/model_decoder.h):
// RMSNorm, SwiGLU, no biases, a tied head; they differ in the sequence mixer
// (llama: softmax attention with RoPE; gla: gated linear attention).
inline bool IsDecoderModel(const ModelConfig& model) { return model.type == "llama" || model.type == "gla"; }

// The models that read token shards and see batch x seq tokens a micro-batch.
inline bool IsLanguageModel(const ModelConfig& model) {
  return model.type == "gpt" || IsDecoderModel(model);
}

// gla: the rank of the forget gate's low-rank projection, gk_proj = Linear(16 ->
// d/2) . Linear(d -> 16) (docs/train.md), and the divisor of its logsigmoid,
// gk = logsigmoid(gk_proj(x)) / 16, which keeps the gates near 0 (slow decay).
constexpr int64_t kGlaGateRank = 16;
constexpr float kGlaGateNormalizer = 16.0f;

struct DataConfig {
  std::string train;  // llm.c token shard path or glob (gpt)
  std::string val;    // optional
  int val_batches = 4;
  int eval_every = 0;  // steps between val evaluations (0: never)
  // The training batches in a shuffled order drawn from the run's seed
  // (TokenLoader::Shuffle) instead of llm.c's in-order walk; val stays in order.
  bool shuffle = false;
};

struct OptimizerConfig {
  std::string type = "adam";  // adam | adamw
  float lr = 6e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // adamw only (decoupled), applied to matrices
  float grad_clip = 0.0f;     // global-norm clipping threshold (0: off)
  // ZeRO-1 under ranks: each rank keeps the Adam moments of 1/N of the
  // parameters and updates only those; the parameters are all-gathered after
  // the update. One rank: no effect.
  bool shard = false;
};

struct ScheduleConfig {
  std::string type = "constant";  // constant | cosine | linear
  int warmup_steps = 0;           // linear warmup from lr/warmup to lr
  float min_lr_ratio = 0.0f;      // cosine/linear decay down to lr * min_lr_ratio
  // Fault injection, for testing stability policies: from step spike_at (1-based;
  // 0: off) for spike_steps steps the learning rate is multiplied by spike_factor.
  int spike_at = 0;
  int spike_steps = 1;
  float spike_factor = 1.0f;
};

// How the ranks of a data-parallel run (keel-train --nproc N, or N ranks under
// keel-worker) reduce their gradients and wait for each other.
struct DistConfig {
  std::string reduce = "fp32";  // fp32 | bf16: the precision gradients travel in (comm.h)
  float timeout_s = 120;        // joining, and any one wait for a peer inside a collective
  // Gradient buckets of about this many MiB, each all-reduced as soon as the
  // backward has written it (worker/engine/grad_buckets.h); 0: one reduction
  // after the backward. ZeRO-1 (optimizer.shard) keeps one reduce-scatter.
  float bucket_mb = 25;
  // TCP (CPU) ranks: rank 0 listens on listen_host ("0.0.0.0" or "::": every
  // interface) and publishes advertise_host:port in the bootstrap file, the
  // address the other ranks connect to ("": listen_host, or this machine's name
  // when listen_host is a wildcard). keel-worker sets both for a gang's parts
  // (0.0.0.0 and its --advertise); NCCL ranks do not use them.
  std::string listen_host = "127.0.0.1";
  std::string advertise_host;
};

// Outlier analytics (kernels/outliers.h; docs/train.md, "Outlier analytics"),
// taken every RunConfig::analytics_every steps.
struct AnalyticsConfig {
  int top_k = 8;        // hot channels per operand (1 .. 1024)
  int maps_every = 0;   // steps between block-map SVGs (0: none; a multiple of analytics_every)
};

struct RunConfig {
  std::string name = "run";
  ModelConfig model;
  DataConfig data;
  PrecisionScheme precision;  // default fp32
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  int64_t steps = 100;
  int batch = 64;       // proxy: samples per micro-batch; gpt: sequences
  int seq = 0;          // gpt tokens per sequence (0: model.context)
  int grad_accum = 1;   // micro-batches per optimizer step
  uint64_t seed = 1337;
  std::string backend = "cpu";  // cpu | cuda
  int threads = 0;              // cpu backend threads (0: all cores)
  std::string run_dir;          // "" : runs/<name>
  int checkpoint_every = 0;     // steps (0: only the final checkpoint)
  int keep_checkpoints = 3;     // newest kept (0: all)
  int probe_every = 0;          // gradient-bias probe period (0: off)
  std::string probe_reference = "fp32";  // the probe's reference gradient: fp32 | bf16 operands
  bool operand_stats = true;    // per-operand saturation/NaN counters every step
  int analytics_every = 100;    // outlier analytics period (0: off)
  AnalyticsConfig analytics;
  int log_every = 1;            // terminal progress period
  int check_every = 100;        // ranks compare hashes of their weights and Adam moments (0: off)
  DistConfig dist;              // data-parallel ranks (ignored by a 1-rank run)
  Policy policy;                // stability policy (policy.h); none by default
};

// Names of runs and sweeps: a run's default directory is runs/<name>, so a name
// must stay one plain path component. Allowed: 1 to kMaxNameLength characters
// of [A-Za-z0-9_.-], not starting with '.' (never "." or ".."). NameProblem
// returns "" for an allowed name, else what is wrong ending in "(allowed: ...)".
constexpr size_t kMaxNameLength = 128;
constexpr char kNameRule[] = "[A-Za-z0-9_.-]+, at most 128 characters, not starting with '.'";
std::string NameProblem(const std::string& name);

// The model's parameter count (proxy: model_proxy.cc's blocks; gpt:
// model_gpt.cc's embeddings, blocks and final layernorm; llama: model_llama.cc's,
// gla: model_gla.cc's, the formulas in docs/train.md), computed from the
// config alone, saturating at INT64_MAX instead of overflowing. Needs
// padded_vocab and mlp_hidden resolved (ParseRunConfig does that).
int64_t ModelParameterCount(const ModelConfig& model);

// Training keeps 16 bytes per parameter: fp32 weights, gradients, Adam m and v.
// A run whose state exceeds this cannot fit any GPU Keel runs on and is refused
// at parse time, before keeld queues it or keel-train allocates anything.
constexpr int64_t kBytesPerParameter = 16;
constexpr int64_t kMaxTrainingStateBytes = int64_t{256} << 30;  // 256 GiB

// Parses a `policy:` mapping (policy.h's format). `source` names the file in
// messages, which carry the node's line:column. Used by ParseRunConfig and by
// keeld's sweep expansion (on the sweep file's own nodes).
Status ParsePolicyNode(const YAML::Node& node, const std::string& source, Policy* out);

// Parses YAML text (`source` names it in messages) through LoadYamlStrict
// (worker/io/yaml_strict.h: size, bytes, one document, no duplicate keys,
// bounded nesting). Unknown keys are errors. Every error starts with
// "source:line:col: ", except those of an override ("--set path: ...").
// overrides: "key.path=value" assignments applied to the YAML before parsing
// (e.g. "optimizer.lr=1e-3", "precision=mxfp4"), as the CLI's --set gives them.
Status ParseRunConfig(const std::string& yaml_text, const std::string& source,
                      const std::vector<std::string>& overrides, RunConfig* out);
Status LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides,
                     RunConfig* out);

// The scheme as a one-line YAML mapping (every field), readable by
// ParseSchemeYaml: stored in checkpoints so a switched scheme survives resume.
std::string SchemeToYaml(const PrecisionScheme& scheme);
Status ParseSchemeYaml(const std::string& yaml_text, PrecisionScheme* out);

// Checks cross-field rules (gpt, llama and gla need data.train, heads divide width, the
// training state fits kMaxTrainingStateBytes, ...).
Status ValidateRunConfig(const RunConfig& config);

}  // namespace keel

#endif  // KEEL_WORKER_CONFIG_RUN_CONFIG_H_
