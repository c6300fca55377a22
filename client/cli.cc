// The keel command line (see cli.h). Each command is one or two KeelService
// RPCs plus formatting from format.h; `watch` adds the server stream.
#include "client/cli.h"

#include <google/protobuf/util/json_util.h>
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "client/format.h"
#include "client/plot.h"
#include "kernels/base/flags.h"
#include "proto/channel.h"
#include "proto/gpu_share.h"
#include "proto/keel.grpc.pb.h"
#include "proto/keel.pb.h"
#include "worker/io/yaml_strict.h"
#include "worker/run/checkpoint_dirs.h"
#include "worker/run/checkpoint_transfer.h"

namespace keel {
namespace client {
namespace {

constexpr const char* kDefaultServer = "127.0.0.1:7070";
// Unary calls are small; a server that does not answer in this long is
// treated as unreachable (exit 3).
constexpr int kUnaryDeadlineSeconds = 5;
// One page of GetMetrics (up to 2 MiB of points).
constexpr int kMetricsDeadlineSeconds = 60;
// One page of ListRuns, ListSweeps or ListEvents: small, but a keeld busy with
// a large change (cancelling a 10,000-run sweep on a loaded host) can take
// seconds to answer, and that is not unreachable.
constexpr int kListPageDeadlineSeconds = 30;
// Calls that change many runs at once (SubmitSweep, CancelSweep of a
// 10,000-run sweep) are long but not stuck: a short deadline would report a
// success as a timeout. $KEEL_LONG_DEADLINE_S overrides it (tests).
constexpr int kLongDeadlineSeconds = 300;
// Given several keeld addresses (an active keeld and its standbys), how long
// the CLI looks for the active one: longer than a standby takes to take over
// (under 10 s), so that a command issued during a takeover still succeeds.
constexpr int kFindActiveSeconds = 15;
// One probe of one address while looking.
constexpr int kProbeDeadlineSeconds = 2;
// Points per run that `keel plot` asks for (the server downsamples).
constexpr int kPlotMaxPoints = 2000;
// Events `keel show` lists.
constexpr int kShowEvents = 10;

// ---- Help ------------------------------------------------------------------------

struct CommandSpec {
  const char* name;
  const char* usage;
  const char* summary;
  const char* details;
  std::vector<std::string> value_flags;  // take a value: "--flag V" or "--flag=V"
  std::vector<std::string> bool_flags;
  size_t min_positional;
  size_t max_positional;
};

const std::vector<CommandSpec>& Commands() {
  static const std::vector<CommandSpec> commands = {
      {"submit",
       "keel submit SWEEP.yaml [--watch]",
       "submit a sweep file; prints the sweep id and run count",
       "Reads SWEEP.yaml and sends it to keeld (SubmitSweep; spec.source is the path,\n"
       "used in error messages). keeld validates every run; a bad field exits 6 with\n"
       "keeld's message (field, line, allowed values) printed verbatim. A file over\n"
       "4 MiB, or one that is not UTF-8 text, exits 6 before anything is sent.\n"
       "  --watch   then watch the new sweep as `keel watch` does (and exit as it does)\n",
       {},
       {"--watch"},
       1,
       1},
      {"sweeps",
       "keel sweeps [--output json]",
       "list sweeps",
       "Lists every sweep (ListSweeps): id, name, state, run count, runs by state,\n"
       "creation time (UTC).\n"
       "  --output json   print the ListSweepsResponse as JSON\n",
       {"--output"},
       {},
       0,
       0},
      {"runs",
       "keel runs [SWEEP] [--output json]",
       "list the runs of a sweep (or all runs)",
       "Lists runs (ListRuns): id, sweep, state, step/steps, loss (4 significant\n"
       "digits), precision, restarts, worker, axes. Without SWEEP, all runs.\n"
       "  --output json   print the ListRunsResponse as JSON\n",
       {"--output"},
       {},
       0,
       1},
      {"show",
       "keel show RUN [--output json]",
       "show a run's details and recent events",
       "Prints a run (GetRun; loss to 4 significant digits) and its last 10 events\n"
       "(ListEvents).\n"
       "  --output json   print {\"run\": Run, \"events\": [Event, ...]} as JSON (all events)\n",
       {"--output"},
       {},
       1,
       1},
      {"watch",
       "keel watch SWEEP|RUN",
       "follow a sweep or run live until every run is terminal",
       "Streams updates (WatchSweep, or WatchRun when ID is not a sweep: keel asks\n"
       "GetSweep first) and shows one line per run: id, state, progress bar with\n"
       "step/steps, loss (4 significant digits), precision, restarts, interventions\n"
       "(switch_precision and rollback events). On a terminal the table is redrawn\n"
       "in place; otherwise a line is appended whenever a run changes state,\n"
       "precision, restarts or interventions, or passes another 10% of its steps.\n"
       "Ends when every run is SUCCEEDED, FAILED, CANCELLED or DIVERGED: exit 0 if\n"
       "all SUCCEEDED, else 1 (also 1 if keeld ends the stream before that).\n",
       {},
       {},
       1,
       1},
      {"cancel",
       "keel cancel SWEEP|RUN",
       "cancel a sweep (all its runs) or one run",
       "Asks GetSweep first: when ID names a sweep, CancelSweep; when keeld answers\n"
       "NOT_FOUND, CancelRun (exit 5 if it is no run either).\n",
       {},
       {},
       1,
       1},
      {"intervene",
       "keel intervene RUN --precision NAME [--rollback-steps N] [--reason TEXT]",
       "switch a run's precision now (optionally rolling back)",
       "Sends Intervene: the run switches to precision preset NAME (a preset may be\n"
       "followed by +bf16_head: the language model's head in BF16), first rolling\n"
       "back N steps to a checkpoint when N > 0 (default 0). TEXT is recorded in\n"
       "the event. Prints the resulting event.\n",
       {"--precision", "--rollback-steps", "--reason"},
       {},
       1,
       1},
      {"export",
       "keel export SWEEP [--format csv|jsonl] [-o FILE]",
       "export every run's metric points",
       "Lists the sweep's runs, then fetches every point of each (GetMetrics with\n"
       "max_points 0). CSV columns: sweep_id,run_id,step,loss,lr,tokens_per_s,\n"
       "grad_norm, then one column per sweep axis (sorted by name). JSONL: one\n"
       "object per point with the same fields (non-finite numbers as null).\n"
       "  --format csv|jsonl   output format (default csv)\n"
       "  -o FILE              write to FILE instead of stdout\n",
       {"--format", "-o"},
       {},
       1,
       1},
      {"plot",
       "keel plot RUN|SWEEP -o FILE.svg",
       "plot loss vs step to an SVG file",
       "Writes a standalone SVG 1.1 file: loss against step on a log-scale y axis,\n"
       "one line per run (a colour and dash pattern each). A loss above 3x the\n"
       "highest starting loss (rounded up) is cut: the axis ends there and says so,\n"
       "and a run that blows up leaves through the top. Each intervention (a\n"
       "switch_precision or rollback, with the actions decided with it) is a dashed\n"
       "vertical line at the step where it was decided (a rollback's from_step,\n"
       "not the step it resumed from), numbered in a band above the chart and\n"
       "listed under it. A precision switch puts a shape on the run's line where\n"
       "the new scheme starts, one shape per scheme (key under the chart). Under\n"
       "the chart: the legend, a row per run (id, state, axis values, precision\n"
       "switches), side by side when rows are short, then the interventions; the\n"
       "canvas grows to hold them. Points with loss <= 0 or not finite are skipped.\n"
       "Asks for at most 2000 points per run (keeld downsamples). ID is tried as a\n"
       "sweep first (GetSweep), then as a run.\n"
       "  -o FILE.svg   output file (required)\n",
       {"-o"},
       {},
       1,
       1},
      {"fetch",
       "keel fetch RUN [--step N] [-o DIR]",
       "download a run's checkpoint from keeld's artifact store",
       "Downloads a checkpoint its worker uploaded (FetchCheckpoint): the newest\n"
       "stored, or step N's. Every chunk and file is checked against its CRC-32 and\n"
       "size; the files land in DIR.tmp and DIR appears only once all verified.\n"
       "Checkpoints of 8 MiB or more print their progress on stderr.\n"
       "  --step N   the checkpoint of step N (default: the newest stored)\n"
       "  -o DIR     a new directory for its files (default RUN-step_<8 digits>;\n"
       "             an existing one is refused)\n",
       {"--step", "-o"},
       {},
       1,
       1},
      {"workers",
       "keel workers [--output json]",
       "list workers and their devices",
       "Lists workers (ListWorkers): id, host, connected, GPUs busy/total,\n"
       "CPU slots, runs, lease expiry (UTC).\n"
       "  --output json   print the ListWorkersResponse as JSON\n",
       {"--output"},
       {},
       0,
       0},
  };
  return commands;
}

const CommandSpec* FindCommand(const std::string& name) {
  for (const auto& c : Commands())
    if (name == c.name) return &c;
  return nullptr;
}

const char kGlobalHelp[] =
    "Global flags (anywhere on the line):\n"
    "  --server HOST:PORT   keeld's address; else $KEEL_SERVER, else `server = ...`\n"
    "                       in ~/.config/keel/config, else 127.0.0.1:7070. Several,\n"
    "                       comma-separated (A:7070,B:7070: an active keeld and its\n"
    "                       standbys): keel asks each in order and uses the first that\n"
    "                       answers as the active one (a standby refuses: UNAVAILABLE),\n"
    "                       going round with backoff for up to 15 s (a takeover)\n"
    "  --token TOKEN        user token, sent as \"authorization: Bearer TOKEN\"\n"
    "  --token-file FILE    read the token from FILE (one trailing newline dropped)\n"
    "                       tokens are printable ASCII without spaces (0x21..0x7E)\n"
    "                       without either: $KEEL_TOKEN, else `token = ...` in the config\n"
    "  --tls-ca FILE        speak TLS, trusting keeld's certificate if FILE's CA signed it\n"
    "                       (else $KEEL_TLS_CA, else `tls_ca = ...` in the config)\n"
    "  --tls-cert FILE --tls-key FILE\n"
    "                       a client certificate, for a keeld started with --tls-client-ca\n"
    "  --help, -h           this help; `keel COMMAND --help` or `keel help COMMAND`\n"
    "                       for one command\n"
    "Unary calls time out after 5 s (GetMetrics: 60 s a page; submit and cancel: 300 s);\n"
    "watch streams have no limit. Listings follow keeld's pages to the end.\n"
    "\n"
    "Exit codes:\n"
    "  0  ok\n"
    "  1  the operation failed, or (watch) a run did not succeed\n"
    "  2  usage error (bad flags, missing file)\n"
    "  3  could not reach keeld (UNAVAILABLE or DEADLINE_EXCEEDED)\n"
    "  4  keeld refused the token (UNAUTHENTICATED)\n"
    "  5  no such sweep/run (NOT_FOUND)\n"
    "  6  keeld rejected the input (INVALID_ARGUMENT; its message is printed verbatim)\n";

std::string ToolHelp() {
  std::string out =
      "keel: the command-line client of keeld, Keel's coordinator.\n"
      "\n"
      "Usage: keel [global flags] COMMAND [args] [flags]\n"
      "\n"
      "Commands:\n";
  for (const auto& c : Commands()) out += std::string("  ") + c.usage + "\n      " + c.summary + "\n";
  out += "\n";
  out += kGlobalHelp;
  return out;
}

std::string CommandHelp(const CommandSpec& c) {
  return std::string("Usage: ") + c.usage + "\n\n" + c.summary + ".\n\n" + c.details + "\n" + kGlobalHelp;
}

// ---- Arguments -------------------------------------------------------------------

const std::vector<std::string> kGlobalValueFlags = {"--server", "--token", "--token-file", "--tls-ca",
                                                     "--tls-cert", "--tls-key"};

struct Parsed {
  bool help = false;
  std::string command;
  const CommandSpec* spec = nullptr;
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
};

// CLI11 splits the line: global flags on the top app (a command passes the
// ones it does not know up to it), one subcommand per command, positionals
// counted by RunCli. Empty on success, else the usage error's message.
std::string ParseArgs(const std::vector<std::string>& args, Parsed* parsed) {
  CLI::App app("keel");
  app.set_help_flag();
  app.add_flag("-h,--help", parsed->help);
  app.allow_extras();  // an unknown command or flag, reported below in keel's words
  std::map<std::string, std::string> values;
  std::map<std::string, bool> set;
  std::vector<std::pair<std::string, CLI::Option*>> options;
  for (const std::string& name : kGlobalValueFlags) options.push_back({name, app.add_option(name, values[name])});
  std::vector<CLI::App*> subcommands;
  CLI::App* help = app.add_subcommand("help");
  help->add_option("command", parsed->positional);
  subcommands.push_back(help);
  for (const CommandSpec& c : Commands()) {
    CLI::App* sub = app.add_subcommand(c.name);
    sub->fallthrough();
    sub->add_option("args", parsed->positional);
    for (const std::string& name : c.value_flags) options.push_back({name, sub->add_option(name, values[name])});
    for (const std::string& name : c.bool_flags) sub->add_flag(name, set[name])->disable_flag_override();
    subcommands.push_back(sub);
  }
  app.require_subcommand(0, 1);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 wants them reversed
  std::string problem;
  try {
    app.parse(reversed);
  } catch (const CLI::ArgumentMismatch& e) {
    problem = "flag " + ValueMismatchMessage(e);
  } catch (const CLI::ParseError& e) {
    problem = e.what();
  }
  for (CLI::App* sub : subcommands) {
    if (sub->parsed()) parsed->command = sub->get_name();
  }
  if (!parsed->command.empty() && parsed->command != "help") parsed->spec = FindCommand(parsed->command);
  if (!problem.empty()) return problem;
  for (const auto& [name, option] : options) {
    if (option->count() > 0) parsed->flags[name] = values[name];
  }
  for (const auto& [name, given] : set) {
    if (given) parsed->flags[name] = "true";
  }
  for (const std::string& extra : app.remaining(true)) {
    if (extra == "--") continue;  // CLI11 keeps the end-of-flags mark among the extras
    const bool flag = extra.size() > 1 && extra[0] == '-';
    if (!flag && parsed->command.empty()) return "unknown command \"" + extra + "\"";
    if (parsed->spec == nullptr) return "unknown flag " + extra + " (command flags go after the command)";
    return "unknown " + std::string(flag ? "flag " : "argument ") + extra + " for `keel " + parsed->command + "`";
  }
  return "";
}

std::string Trim(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  size_t end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

// Reads at most max_bytes + 1 bytes (a caller that finds more refuses the file;
// /dev/urandom must not be read to its end).
bool ReadFile(const std::string& path, std::string* contents, size_t max_bytes = size_t{1} << 20) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string data(max_bytes + 1, '\0');
  in.read(&data[0], static_cast<std::streamsize>(data.size()));
  if (in.bad()) return false;
  data.resize(static_cast<size_t>(in.gcount()));
  *contents = std::move(data);
  return true;
}

// `key = value` lines of ~/.config/keel/config; '#' starts a comment, values
// may be quoted.
std::map<std::string, std::string> ReadConfig() {
  std::map<std::string, std::string> config;
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') return config;
  std::string text;
  if (!ReadFile(std::string(home) + "/.config/keel/config", &text)) return config;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    size_t hash = line.find('#');
    if (hash != std::string::npos) line = line.substr(0, hash);
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = Trim(line.substr(0, eq)), value = Trim(line.substr(eq + 1));
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
      value = value.substr(1, value.size() - 2);
    if (!key.empty()) config[key] = value;
  }
  return config;
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// ---- RPC plumbing ----------------------------------------------------------------

class Client {
 public:
  Client(std::string server, std::string token, std::shared_ptr<grpc::Channel> channel)
      : server_(std::move(server)), token_(std::move(token)) {
    channel_ = std::move(channel);
    stub_ = v1::KeelService::NewStub(channel_);
  }

  v1::KeelService::Stub* stub() { return stub_.get(); }
  const std::string& server() const { return server_; }

  // A context carrying the bearer token; deadline_seconds 0: none (streams).
  std::unique_ptr<grpc::ClientContext> Context(int deadline_seconds = kUnaryDeadlineSeconds) const {
    auto context = std::make_unique<grpc::ClientContext>();
    if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
    if (deadline_seconds > 0)
      context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_seconds));
    return context;
  }

  // Waits up to the unary deadline for a connection (before a stream, which
  // has no deadline of its own).
  bool WaitForConnected() {
    return channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(kUnaryDeadlineSeconds));
  }

 private:
  std::string server_;
  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KeelService::Stub> stub_;
};

// Several addresses: the first, in order, whose keeld answers as the active
// one, going round with backoff for up to kFindActiveSeconds. The probe is a
// GetSweep of no sweep: an active keeld answers it (NOT_FOUND, or
// UNAUTHENTICATED for a bad token, which the command then reports); a standby
// or an unreachable address gives UNAVAILABLE or DEADLINE_EXCEEDED.
// Returns kExitOk with *server and *channel set, or the exit code after
// printing why.
int FindActive(const std::vector<std::string>& servers, ChannelOptions options, const std::string& token,
               std::string* server, std::shared_ptr<grpc::Channel>* channel, std::ostream& err) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kFindActiveSeconds);
  int backoff_ms = 250;
  std::vector<std::string> last(servers.size());
  for (;;) {
    for (size_t i = 0; i < servers.size(); ++i) {
      options.address = servers[i];
      std::shared_ptr<grpc::Channel> c;
      Status made = MakeChannel(options, &c);
      if (!made.ok()) {
        err << "keel: " << made.message() << "\n";
        return kExitUsage;
      }
      grpc::ClientContext context;
      if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(kProbeDeadlineSeconds));
      v1::GetSweepRequest request;
      v1::Sweep sweep;
      grpc::Status status = v1::KeelService::NewStub(c)->GetSweep(&context, request, &sweep);
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
          status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        *server = servers[i];
        *channel = c;
        return kExitOk;
      }
      last[i] = status.error_message();
    }
    if (std::chrono::steady_clock::now() + std::chrono::milliseconds(backoff_ms) >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(2000, backoff_ms * 2);
  }
  err << "keel: could not reach an active keeld at any of " << servers.size() << " addresses within "
      << kFindActiveSeconds << " s (UNAVAILABLE):";
  for (size_t i = 0; i < servers.size(); ++i) err << (i ? ";" : "") << " " << servers[i] << ": " << last[i];
  err << "\n";
  return kExitUnavailable;
}

// Prints a failed RPC's status and returns the exit code for it.
int RpcError(const std::string& what, const grpc::Status& status, const Client& client, std::ostream& err) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      err << "keel: could not reach keeld at " << client.server() << " (" << what << ": "
          << (status.error_code() == grpc::StatusCode::UNAVAILABLE ? "UNAVAILABLE" : "DEADLINE_EXCEEDED") << ": "
          << status.error_message() << ")\n";
      return kExitUnavailable;
    case grpc::StatusCode::UNAUTHENTICATED:
      err << "keel: keeld refused the token (UNAUTHENTICATED: " << status.error_message()
          << "); give --token, --token-file, $KEEL_TOKEN or `token = ...` in ~/.config/keel/config\n";
      return kExitUnauthenticated;
    case grpc::StatusCode::NOT_FOUND:
      err << "keel: " << status.error_message() << "\n";
      return kExitNotFound;
    case grpc::StatusCode::INVALID_ARGUMENT:
      // Verbatim: keeld's message names the YAML field, line and allowed values.
      err << status.error_message() << "\n";
      return kExitInvalidArgument;
    default:
      err << "keel: " << what << " failed (code " << static_cast<int>(status.error_code())
          << "): " << (status.error_message().empty() ? "no reason given by gRPC" : status.error_message())
          << "\n";
      return kExitFailed;
  }
}

// The page_size listings ask for: 0 (keeld's default) unless $KEEL_PAGE_SIZE
// sets one (for tests of paging; not in --help).
int PageSize() {
  const char* value = std::getenv("KEEL_PAGE_SIZE");
  return value == nullptr ? 0 : std::max(0, std::atoi(value));
}

int LongDeadlineSeconds() {
  const char* value = std::getenv("KEEL_LONG_DEADLINE_S");
  int seconds = value == nullptr ? 0 : std::atoi(value);
  return seconds > 0 ? seconds : kLongDeadlineSeconds;
}

// Calls `rpc` for every page of a listing (page_token from each answer's
// next_page_token until it is empty), appending each page's `items` to *out.
template <typename Request, typename Response, typename Item, typename Rpc, typename Items>
grpc::Status AllPages(Client& client, Request request, int deadline_seconds, Rpc rpc, Items items,
                      std::vector<Item>* out) {
  request.set_page_size(PageSize());
  do {
    Response response;
    auto context = client.Context(deadline_seconds);
    grpc::Status status = (client.stub()->*rpc)(context.get(), request, &response);
    if (!status.ok()) return status;
    auto* page = items(response);
    out->reserve(out->size() + page->size());
    for (Item& item : *page) out->push_back(std::move(item));
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return grpc::Status::OK;
}

grpc::Status ListAllRuns(Client& client, const std::string& sweep_id, std::vector<v1::Run>* runs) {
  v1::ListRunsRequest request;
  request.set_sweep_id(sweep_id);
  return AllPages<v1::ListRunsRequest, v1::ListRunsResponse>(client, request, kListPageDeadlineSeconds,
                                                               &v1::KeelService::Stub::ListRuns,
                                                               [](v1::ListRunsResponse& r) { return r.mutable_runs(); }, runs);
}

grpc::Status ListAllSweeps(Client& client, std::vector<v1::Sweep>* sweeps) {
  return AllPages<v1::ListSweepsRequest, v1::ListSweepsResponse>(client, v1::ListSweepsRequest(), kListPageDeadlineSeconds,
                                                                   &v1::KeelService::Stub::ListSweeps,
                                                                   [](v1::ListSweepsResponse& r) { return r.mutable_sweeps(); }, sweeps);
}

grpc::Status ListAllEvents(Client& client, const v1::ListEventsRequest& request, std::vector<v1::Event>* events) {
  return AllPages<v1::ListEventsRequest, v1::ListEventsResponse>(client, request, kListPageDeadlineSeconds,
                                                                   &v1::KeelService::Stub::ListEvents,
                                                                   [](v1::ListEventsResponse& r) { return r.mutable_events(); }, events);
}

// Points without their json lines: export and plot use the numeric fields
// only, and the lines are most of the bytes.
grpc::Status GetAllMetrics(Client& client, const std::string& run_id, int max_points,
                           std::vector<v1::MetricPoint>* points) {
  v1::GetMetricsRequest request;
  request.set_run_id(run_id);
  request.set_max_points(max_points);
  request.set_omit_json(true);
  return AllPages<v1::GetMetricsRequest, v1::GetMetricsResponse>(client, request, kMetricsDeadlineSeconds,
                                                                   &v1::KeelService::Stub::GetMetrics,
                                                                   [](v1::GetMetricsResponse& r) { return r.mutable_points(); }, points);
}

// A long call (LongDeadlineSeconds) that ran out of time may still finish in
// keeld: say so, and how to check, instead of "could not reach keeld".
int LongCallError(const std::string& what, const std::string& check, const grpc::Status& status,
                  const Client& client, std::ostream& err) {
  if (status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) return RpcError(what, status, client, err);
  err << "keel: " << what << " got no answer from keeld at " << client.server() << " within " << LongDeadlineSeconds()
      << " s (DEADLINE_EXCEEDED); keeld may still complete it: check with " << check << "\n";
  return kExitUnavailable;
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) return "null";
  return json;
}

bool JsonOutput(const Parsed& parsed, std::ostream& err, int* code) {
  auto it = parsed.flags.find("--output");
  if (it == parsed.flags.end()) return false;
  if (it->second != "json") {
    err << "keel: --output " << it->second << ": allowed: json (the default is a table)\n";
    *code = kExitUsage;
  }
  return true;
}

std::string SweepStateName(v1::SweepState state) {
  switch (state) {
    case v1::SWEEP_ACTIVE:
      return "ACTIVE";
    case v1::SWEEP_DONE:
      return "DONE";
    case v1::SWEEP_CANCELLED:
      return "CANCELLED";
    default:
      return "-";
  }
}

std::string StepText(const v1::Run& run) { return std::to_string(run.step()) + "/" + std::to_string(run.steps()); }

// Orders runs by sweep, then index, then id (a vector, or a response's runs).
template <typename Runs>
void SortRuns(Runs* runs) {
  std::stable_sort(runs->begin(), runs->end(), [](const v1::Run& a, const v1::Run& b) {
    if (a.sweep_id() != b.sweep_id()) return a.sweep_id() < b.sweep_id();
    if (a.index() != b.index()) return a.index() < b.index();
    return a.id() < b.id();
  });
}

// Is `id` a sweep? 1: yes (sweep filled), 0: NOT_FOUND, else the exit code
// negated after printing the error.
int LookupSweep(Client& client, const std::string& id, v1::Sweep* sweep, std::ostream& err) {
  v1::GetSweepRequest request;
  request.set_sweep_id(id);
  auto context = client.Context();
  grpc::Status status = client.stub()->GetSweep(context.get(), request, sweep);
  if (status.ok()) return 1;
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) return 0;
  return -RpcError("GetSweep", status, client, err);
}

// Runs of sweep `id`, sorted; NOT_FOUND when the sweep does not exist.
int SweepRuns(Client& client, const std::string& id, std::vector<v1::Run>* runs, std::ostream& err) {
  runs->clear();
  grpc::Status status = ListAllRuns(client, id, runs);
  if (!status.ok()) return RpcError("ListRuns", status, client, err);
  if (runs->empty()) {
    // An empty list may be an unknown sweep: ask, for a clear exit code.
    v1::Sweep sweep;
    int is_sweep = LookupSweep(client, id, &sweep, err);
    if (is_sweep < 0) return -is_sweep;
    if (is_sweep == 0) {
      err << "keel: no sweep " << id << "\n";
      return kExitNotFound;
    }
  }
  SortRuns(runs);
  return kExitOk;
}

// The exit code of a failed RPC about `id`, known to be no sweep: NOT_FOUND
// says "no sweep or run".
int SweepOrRunError(const std::string& what, const grpc::Status& status, const std::string& id,
                    const Client& client, std::ostream& err) {
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    err << "keel: no sweep or run " << id << "\n";
    return kExitNotFound;
  }
  return RpcError(what, status, client, err);
}

// What a command given a sweep or run id acts on.
struct SweepOrRun {
  bool is_sweep = false;
  v1::Sweep sweep;               // when is_sweep
  std::vector<v1::Run> runs;     // the sweep's runs, sorted, or the one run
  v1::ListEventsRequest events;  // the events of those runs
};

// Looks `id` up as a sweep, then as a run. Returns an exit code: not found,
// saying "no sweep or run", when it is neither.
int ResolveSweepOrRun(Client& client, const std::string& id, SweepOrRun* target, std::ostream& err) {
  int is_sweep = LookupSweep(client, id, &target->sweep, err);
  if (is_sweep < 0) return -is_sweep;
  target->is_sweep = is_sweep == 1;
  if (target->is_sweep) {
    target->events.set_sweep_id(id);
    return SweepRuns(client, id, &target->runs, err);
  }
  v1::GetRunRequest request;
  request.set_run_id(id);
  v1::Run run;
  auto context = client.Context();
  grpc::Status status = client.stub()->GetRun(context.get(), request, &run);
  if (!status.ok()) return SweepOrRunError("GetRun", status, id, client, err);
  target->runs.push_back(run);
  target->events.set_run_id(id);
  return kExitOk;
}

// ---- Commands --------------------------------------------------------------------

int Watch(Client& client, const std::string& id, std::ostream& out, std::ostream& err, bool tty);

int CmdSubmit(Client& client, const Parsed& parsed, std::ostream& out, std::ostream& err, bool tty) {
  const std::string& path = parsed.positional[0];
  std::string yaml;
  if (!ReadFile(path, &yaml, kMaxYamlBytes)) {
    err << "keel: cannot read sweep file " << path << ": " << std::strerror(errno) << "\n";
    return kExitUsage;
  }
  // keeld enforces the same limits; checked here so that a huge file is not
  // sent, and because SweepSpec.yaml is a proto string: gRPC fails to
  // serialize bytes that are not UTF-8 and reports it with an empty message.
  if (yaml.size() > kMaxYamlBytes) {
    Status s = ReadYamlFile(path, &yaml);  // its message names the file's size and the limit
    err << (s.ok() ? path + ":1:1: size: more than the limit of 4194304 bytes" : s.message()) << "\n";
    return kExitInvalidArgument;
  }
  Status text = CheckYamlText(yaml, path);
  if (!text.ok()) {
    err << text.message() << "\n";
    return kExitInvalidArgument;
  }
  v1::SubmitSweepRequest request;
  request.mutable_spec()->set_yaml(yaml);
  request.mutable_spec()->set_source(path);
  v1::SubmitSweepResponse response;
  auto context = client.Context(LongDeadlineSeconds());
  grpc::Status status = client.stub()->SubmitSweep(context.get(), request, &response);
  if (!status.ok()) return LongCallError("SubmitSweep of " + path, "`keel sweeps`", status, client, err);
  int runs = response.runs_size() > 0 ? response.runs_size() : response.sweep().runs_total();
  out << "submitted sweep " << response.sweep().id();
  if (!response.sweep().name().empty()) out << " (" << response.sweep().name() << ")";
  out << ": " << runs << (runs == 1 ? " run" : " runs") << "\n";
  out.flush();
  if (parsed.flags.count("--watch")) return Watch(client, response.sweep().id(), out, err, tty);
  return kExitOk;
}

// A listing command: keeld's answer (every page in one response) as JSON with
// --output json, else the table `table` makes of it. `fetch` asks keeld.
template <typename Response, typename Fetch, typename Table>
int PrintListing(Client& client, const Parsed& parsed, const char* rpc, std::ostream& out, std::ostream& err,
                 Fetch fetch, Table table) {
  int code = kExitOk;
  const bool json = JsonOutput(parsed, err, &code);
  if (code != kExitOk) return code;
  Response response;
  const grpc::Status status = fetch(&response);
  if (!status.ok()) return RpcError(rpc, status, client, err);
  if (json) {
    out << ToJson(response) << "\n";
  } else {
    out << table(&response);
  }
  return kExitOk;
}

// Moves `items` into a response's repeated field.
template <typename T>
void MoveInto(std::vector<T>* items, google::protobuf::RepeatedPtrField<T>* field) {
  field->Reserve(static_cast<int>(items->size()));
  for (T& item : *items) *field->Add() = std::move(item);
}

int CmdSweeps(Client& client, const Parsed& parsed, std::ostream& out, std::ostream& err) {
  auto fetch = [&](v1::ListSweepsResponse* response) {
    std::vector<v1::Sweep> sweeps;
    const grpc::Status status = ListAllSweeps(client, &sweeps);
    MoveInto(&sweeps, response->mutable_sweeps());
    return status;
  };
  auto table = [](v1::ListSweepsResponse* response) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& sweep : response->sweeps()) {
      std::map<std::string, int> by_state(sweep.runs_by_state().begin(), sweep.runs_by_state().end());
      std::string states;
      for (const auto& kv : by_state) {
        if (kv.second == 0) continue;
        if (!states.empty()) states += " ";
        states += kv.first + "=" + std::to_string(kv.second);
      }
      rows.push_back({sweep.id(), sweep.name().empty() ? "-" : sweep.name(), SweepStateName(sweep.state()),
                      std::to_string(sweep.runs_total()), states.empty() ? "-" : states,
                      FormatTime(sweep.created_unix_ms())});
    }
    return FormatTable({"ID", "NAME", "STATE", "RUNS", "BY STATE", "CREATED"}, rows);
  };
  return PrintListing<v1::ListSweepsResponse>(client, parsed, "ListSweeps", out, err, fetch, table);
}

// Where a run trains: its worker, and its GPUs; a gang's workers with their ranks.
// short_form: the workers only ("w1+w2"), for tables.
std::string PlacementText(const v1::Run& run, bool short_form) {
  if (run.parts_size() > 0) {
    std::string text;
    for (const v1::RunPart& p : run.parts()) {
      text += text.empty() ? "" : short_form ? "+" : ", ";
      text += p.worker_id();
      if (!short_form) {
        text += " (ranks " + std::to_string(p.first_rank()) + "-" + std::to_string(p.first_rank() + p.ranks() - 1) + ")";
      }
    }
    return text;
  }
  if (run.worker_id().empty()) return "-";
  return run.worker_id();
}

// Data-parallel ranks of a run: one per GPU, else one per CPU slot.
int RanksOf(const v1::Run& run) { return run.gpus() > 0 ? run.gpus() : std::max(1, run.cpu_slots()); }

// "0.25" for a fractional run's 250 thousandths of a GPU.
// The GPUs a run holds, by worker, in rank order: "w1[0,1] w2[0,1]"; "-" when none.
std::string GpusText(const v1::Run& run) {
  auto one = [](const std::string& worker, const google::protobuf::RepeatedField<int32_t>& gpus) {
    std::string text = worker + "[";
    for (int i = 0; i < gpus.size(); ++i) text += (i ? "," : "") + std::to_string(gpus.Get(i));
    return text + "]";
  };
  std::string text;
  if (run.parts_size() > 0) {
    for (const v1::RunPart& p : run.parts()) {
      if (p.device_indices_size() > 0) text += (text.empty() ? "" : " ") + one(p.worker_id(), p.device_indices());
    }
  } else if (run.device_indices_size() > 0) {
    text = one(run.worker_id(), run.device_indices());
    if (run.gpu_milli() > 0) text += "x" + GpuShareText(run.gpu_milli());  // "w1[0]x0.25": a share of GPU 0
  }
  return text.empty() ? "-" : text;
}

// What a GPU run asks for: "8", or "8 (2 hosts x 4)"; "-" for a CPU run.
std::string GpusWanted(const v1::Run& run) {
  if (run.gpus() == 0) return "-";
  if (run.gpu_milli() > 0) return GpuShareText(run.gpu_milli());
  std::string text = std::to_string(run.gpus());
  if (run.hosts() > 0) {
    text += " (" + std::to_string(run.hosts()) + (run.hosts() == 1 ? " host" : " hosts") + " x " +
            std::to_string(run.gpus_per_host()) + ")";
  }
  return text;
}

int CmdRuns(Client& client, const Parsed& parsed, std::ostream& out, std::ostream& err) {
  auto fetch = [&](v1::ListRunsResponse* response) {
    std::vector<v1::Run> runs;
    const grpc::Status status = ListAllRuns(client, parsed.positional.empty() ? "" : parsed.positional[0], &runs);
    MoveInto(&runs, response->mutable_runs());
    return status;
  };
  auto table = [](v1::ListRunsResponse* response) {
    SortRuns(response->mutable_runs());
    std::vector<std::vector<std::string>> rows;
    for (const auto& run : response->runs()) {
      std::string axes = AxesText(run.axes());
      rows.push_back({run.id(), run.sweep_id(), StateName(run.state()), StepText(run), RunLossText(run),
                      run.precision().empty() ? "-" : run.precision(), std::to_string(run.restarts()),
                      std::to_string(RanksOf(run)), PlacementText(run, true), GpusText(run), axes.empty() ? "-" : axes});
    }
    return FormatTable(
        {"ID", "SWEEP", "STATE", "STEP", "LOSS", "PRECISION", "RESTARTS", "RANKS", "WORKER", "GPUS", "AXES"}, rows);
  };
  return PrintListing<v1::ListRunsResponse>(client, parsed, "ListRuns", out, err, fetch, table);
}

int CmdShow(Client& client, const Parsed& parsed, std::ostream& out, std::ostream& err) {
  int code = kExitOk;
  bool json = JsonOutput(parsed, err, &code);
  if (code != kExitOk) return code;
  v1::GetRunRequest request;
  request.set_run_id(parsed.positional[0]);
  v1::Run run;
  auto context = client.Context();
  grpc::Status status = client.stub()->GetRun(context.get(), request, &run);
  if (!status.ok()) return RpcError("GetRun", status, client, err);
  v1::ListEventsRequest events_request;
  events_request.set_run_id(run.id());
  std::vector<v1::Event> list;
  status = ListAllEvents(client, events_request, &list);
  if (!status.ok()) return RpcError("ListEvents", status, client, err);
  if (json) {
    out << "{\"run\":" << ToJson(run) << ",\"events\":[";
    for (size_t i = 0; i < list.size(); ++i) out << (i ? "," : "") << ToJson(list[i]);
    out << "]}\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> fields = {
      {"id:", run.id()},
      {"sweep:", run.sweep_id()},
      {"state:", StateName(run.state())},
      {"step:", StepText(run)},
      {"loss:", RunLossText(run)},
      {"precision:", run.precision().empty() ? "-" : run.precision()},
      {"restarts:", std::to_string(run.restarts()) + " (max " + std::to_string(run.max_restarts()) + ")"},
      {"worker:", PlacementText(run, false)},
      {"ranks:", std::to_string(RanksOf(run))},  // data-parallel: one per GPU, else one per CPU slot
      {"gpus:", run.gpus() == 0 ? "-" : GpusText(run) == "-" ? "none held; wants " + GpusWanted(run) : GpusText(run)},
      {"checkpoint:", run.checkpoint().empty() ? "-" : run.checkpoint()},
      {"axes:", run.axes().empty() ? "-" : AxesText(run.axes())},
      {"created:", FormatTime(run.created_unix_ms())},
      {"updated:", FormatTime(run.updated_unix_ms())},
  };
  if (!run.message().empty()) fields.push_back({"message:", run.message()});
  std::string table = FormatTable({"", ""}, fields);
  out << table.substr(table.find('\n') + 1);
  std::stable_sort(list.begin(), list.end(),
                   [](const v1::Event& a, const v1::Event& b) { return a.unix_ms() < b.unix_ms(); });
  size_t first = list.size() > static_cast<size_t>(kShowEvents) ? list.size() - kShowEvents : 0;
  out << "\nrecent events (" << (list.size() - first) << " of " << list.size() << "):\n";
  std::vector<std::vector<std::string>> rows;
  for (size_t i = first; i < list.size(); ++i)
    rows.push_back({FormatTime(list[i].unix_ms()), std::to_string(list[i].step()), list[i].kind(), list[i].message()});
  out << FormatTable({"TIME", "STEP", "KIND", "MESSAGE"}, rows);
  return kExitOk;
}

// State of a watch: the runs in display order and their intervention counts.
struct WatchState {
  std::vector<std::string> order;
  std::map<std::string, v1::Run> runs;
  std::map<std::string, int> interventions;
  std::set<std::string> seen_events;
  std::map<std::string, std::string> last_line_key;  // non-TTY: what was last printed

  void Upsert(const v1::Run& run) {
    if (!runs.count(run.id())) order.push_back(run.id());
    runs[run.id()] = run;
  }
  // True when the event is a new intervention.
  bool AddEvent(const v1::Event& event) {
    if (!IsInterventionEvent(event)) return false;
    std::string key = event.run_id() + "\x1f" + std::to_string(event.step()) + "\x1f" +
                      std::to_string(event.unix_ms()) + "\x1f" + event.kind() + "\x1f" + event.message();
    if (!seen_events.insert(key).second) return false;
    ++interventions[event.run_id()];
    return true;
  }
  bool AllTerminal() const {
    if (runs.empty()) return false;
    for (const auto& kv : runs)
      if (!IsTerminal(kv.second.state())) return false;
    return true;
  }
  bool AllSucceeded() const {
    for (const auto& kv : runs)
      if (kv.second.state() != v1::SUCCEEDED) return false;
    return true;
  }
};

class WatchPrinter {
 public:
  WatchPrinter(std::ostream& out, bool tty) : out_(out), tty_(tty) {}

  void Draw(WatchState& state, bool force) {
    if (tty_) {
      auto now = std::chrono::steady_clock::now();
      // At most ten redraws a second: metric updates can arrive every step.
      if (!force && lines_ > 0 && now - last_draw_ < std::chrono::milliseconds(100)) return;
      last_draw_ = now;
      std::vector<std::vector<std::string>> rows;
      for (const auto& id : state.order) rows.push_back(WatchRow(state.runs[id], state.interventions[id]));
      std::string table = FormatTable(WatchHeader(), rows);
      if (lines_ > 0) out_ << "\x1b[" << lines_ << "A";
      std::istringstream lines(table);
      std::string line;
      int count = 0;
      while (std::getline(lines, line)) {
        out_ << "\r\x1b[2K" << line << "\n";
        ++count;
      }
      lines_ = count;
      out_.flush();
      return;
    }
    if (!header_printed_) {
      std::string header;
      for (const auto& cell : WatchHeader()) header += (header.empty() ? "" : "  ") + cell;
      out_ << header << "\n";
      header_printed_ = true;
    }
    for (const auto& id : state.order) {
      const v1::Run& run = state.runs[id];
      int decile = run.steps() > 0 ? static_cast<int>(std::min<int64_t>(10, run.step() * 10 / run.steps())) : 0;
      std::string key = StateName(run.state()) + "|" + run.precision() + "|" + std::to_string(run.restarts()) + "|" +
                        std::to_string(state.interventions[id]) + "|" + std::to_string(decile);
      if (state.last_line_key[id] == key) continue;
      state.last_line_key[id] = key;
      std::string line;
      for (const auto& cell : WatchRow(run, state.interventions[id])) line += (line.empty() ? "" : "  ") + cell;
      out_ << line << "\n";
    }
    out_.flush();
  }

 private:
  std::ostream& out_;
  bool tty_;
  bool header_printed_ = false;
  int lines_ = 0;
  std::chrono::steady_clock::time_point last_draw_;
};

int WatchResult(const WatchState& state, std::ostream& out) {
  std::map<std::string, int> counts;
  for (const auto& kv : state.runs) ++counts[StateName(kv.second.state())];
  out << state.runs.size() << (state.runs.size() == 1 ? " run:" : " runs:");
  for (const auto& kv : counts) out << " " << kv.first << "=" << kv.second;
  out << "\n";
  return state.AllSucceeded() ? kExitOk : kExitFailed;
}

int Watch(Client& client, const std::string& id, std::ostream& out, std::ostream& err, bool tty) {
  SweepOrRun target;
  const int code = ResolveSweepOrRun(client, id, &target, err);
  if (code != kExitOk) return code;
  const bool is_sweep = target.is_sweep;
  WatchState state;
  for (const auto& run : target.runs) state.Upsert(run);
  // Interventions so far; a failure here only leaves the counts at zero.
  {
    std::vector<v1::Event> events;
    ListAllEvents(client, target.events, &events);
    for (const auto& event : events) state.AddEvent(event);
  }
  WatchPrinter printer(out, tty);
  printer.Draw(state, true);
  if (state.AllTerminal()) return WatchResult(state, out);

  if (!client.WaitForConnected()) {
    err << "keel: could not reach keeld at " << client.server() << " to watch " << id << "\n";
    return kExitUnavailable;
  }
  v1::WatchRequest request;
  request.set_id(id);
  auto context = client.Context(0);
  std::unique_ptr<grpc::ClientReader<v1::WatchUpdate>> reader =
      is_sweep ? client.stub()->WatchSweep(context.get(), request) : client.stub()->WatchRun(context.get(), request);
  v1::WatchUpdate update;
  bool done = false;
  while (reader->Read(&update)) {
    bool force = false;
    switch (update.update_case()) {
      case v1::WatchUpdate::kRun: {
        const v1::Run& run = update.run();
        auto it = state.runs.find(run.id());
        force = it == state.runs.end() || it->second.state() != run.state();
        state.Upsert(run);
        break;
      }
      case v1::WatchUpdate::kMetric: {
        const v1::MetricPoint& point = update.metric();
        auto it = state.runs.find(point.run_id());
        if (it != state.runs.end() && point.step() >= it->second.step()) {
          it->second.set_step(point.step());
          it->second.set_loss(point.loss());
        }
        break;
      }
      case v1::WatchUpdate::kEvent:
        force = state.AddEvent(update.event());
        break;
      default:
        break;
    }
    if (state.AllTerminal()) {
      done = true;
      break;
    }
    printer.Draw(state, force);
  }
  if (done) {
    printer.Draw(state, true);
    context->TryCancel();
    reader->Finish();  // CANCELLED, by us
    return WatchResult(state, out);
  }
  grpc::Status status = reader->Finish();
  printer.Draw(state, true);
  if (!status.ok()) return RpcError(is_sweep ? "WatchSweep" : "WatchRun", status, client, err);
  err << "keel: keeld ended the watch stream before every run finished\n";
  return kExitFailed;
}

int CmdCancel(Client& client, const Parsed& parsed, std::ostream& out, std::ostream& err) {
  const std::string& id = parsed.positional[0];
  v1::Sweep sweep;
  int is_sweep = LookupSweep(client, id, &sweep, err);
  if (is_sweep < 0) return -is_sweep;
  if (is_sweep) {
    v1::CancelSweepRequest request;
    request.set_sweep_id(id);
    v1::Sweep cancelled;
    auto context = client.Context(LongDeadlineSeconds());
    grpc::Status status = client.stub()->CancelSweep(context.get(), request, &cancelled);
    if (!status.ok()) return LongCallError("CancelSweep of " + id, "`keel runs " + id + "`", status, client, err);
    out << "cancelled sweep " << cancelled.id() << " (" << SweepStateName(cancelled.state()) << ")\n";
    return kExitOk;
  }
  v1::CancelRunRequest request;
  request.set_run_id(id);
  v1::Run run;
  auto context = client.Context();
  grpc::Status status = client.stub()->CancelRun(context.get(), request, &run);
  if (!status.ok()) return SweepOrRunError("CancelRun", status, id, client, err);
  out << "cancelled run " << run.id() << " (" << StateName(run.state()) << ")\n";
  return kExitOk;
}

bool ParseInt64(const std::string& text, int64_t* value) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *value = v;
  return true;
}

int CmdIntervene(Client& client, const Parsed& parsed, std::ostream& out, std::ostream& err) {
  auto precision = parsed.flags.find("--precision");
  if (precision == parsed.flags.end() || precision->second.empty()) {
    err << "keel: intervene needs --precision NAME (a precision preset)\n";
    return kExitUsage;
  }
  int64_t rollback = 0;
  auto steps = parsed.flags.find("--rollback-steps");
  if (steps != parsed.flags.end() && (!ParseInt64(steps->second, &rollback) || rollback < 0)) {
    err << "keel: --rollback-steps " << steps->second << ": allowed: an integer >= 0\n";
    return kExitUsage;
  }
  v1::InterveneRequest request;
  request.set_run_id(parsed.positional[0]);
  request.set_precision(precision->second);
  request.set_rollback_steps(rollback);
  auto reason = parsed.flags.find("--reason");
  if (reason != parsed.flags.end()) request.set_reason(reason->second);
  v1::InterveneResponse response;
  auto context = client.Context();
  grpc::Status status = client.stub()->Intervene(context.get(), request, &response);
  if (!status.ok()) return RpcError("Intervene", status, client, err);
  const v1::Event& event = response.event();
  out << "run " << request.run_id() << ": " << (event.kind().empty() ? "intervention" : event.kind()) << " at step "
      << event.step();
  if (!event.message().empty()) out << ": " << event.message();
  out << "\n";
  return kExitOk;
}

// The runs of a sweep with their metric points. Returns an exit code.
int FetchSeries(Client& client, const std::vector<v1::Run>& runs, int max_points, std::vector<RunSeries>* series,
                std::ostream& err) {
  for (const auto& run : runs) {
    RunSeries s;
    grpc::Status status = GetAllMetrics(client, run.id(), max_points, &s.points);
    if (!status.ok()) return RpcError("GetMetrics " + run.id(), status, client, err);
    s.run = run;
    std::stable_sort(s.points.begin(), s.points.end(),
                     [](const v1::MetricPoint& a, const v1::MetricPoint& b) { return a.step() < b.step(); });
    series->push_back(std::move(s));
  }
  return kExitOk;
}

bool WriteOutput(const std::string& path, const std::string& contents, std::ostream& err) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (file) file << contents;
  if (!file) {
    err << "keel: cannot write " << path << ": " << std::strerror(errno) << "\n";
    return false;
  }
  return true;
}

int CmdExport(Client& client, const Parsed& parsed, std::ostream& out, std::ostream& err) {
  std::string format = parsed.flags.count("--format") ? parsed.flags.at("--format") : "csv";
  if (format != "csv" && format != "jsonl") {
    err << "keel: --format " << format << ": allowed: csv, jsonl\n";
    return kExitUsage;
  }
  std::vector<v1::Run> runs;
  int code = SweepRuns(client, parsed.positional[0], &runs, err);
  if (code != kExitOk) return code;
  std::vector<RunSeries> series;
  code = FetchSeries(client, runs, 0, &series, err);
  if (code != kExitOk) return code;
  std::string text = format == "csv" ? ExportCsv(series) : ExportJsonl(series);
  auto file = parsed.flags.find("-o");
  if (file == parsed.flags.end() || file->second == "-") {
    out << text;
    return kExitOk;
  }
  if (!WriteOutput(file->second, text, err)) return kExitFailed;
  size_t points = 0;
  for (const auto& s : series) points += s.points.size();
  err << "wrote " << file->second << ": " << series.size() << " runs, " << points << " points\n";
  return kExitOk;
}

int CmdPlot(Client& client, const Parsed& parsed, std::ostream& out, std::ostream& err) {
  auto file = parsed.flags.find("-o");
  if (file == parsed.flags.end() || file->second.empty()) {
    err << "keel: plot needs -o FILE.svg\n";
    return kExitUsage;
  }
  const std::string& id = parsed.positional[0];
  SweepOrRun target;
  int code = ResolveSweepOrRun(client, id, &target, err);
  if (code != kExitOk) return code;
  std::vector<RunSeries> series;
  code = FetchSeries(client, target.runs, kPlotMaxPoints, &series, err);
  if (code != kExitOk) return code;
  std::vector<v1::Event> list;
  grpc::Status status = ListAllEvents(client, target.events, &list);
  if (!status.ok()) return RpcError("ListEvents", status, client, err);
  const std::string& name = target.sweep.name();
  std::string title = target.is_sweep ? "sweep " + id + (name.empty() ? "" : " (" + name + ")") : "run " + id;
  const LossPlot plot = LayOutLossPlot(title + ": loss vs step", series, list);
  if (!WriteOutput(file->second, LossPlotSvg(plot), err)) return kExitFailed;
  // Interventions as drawn: a rollback and the switch decided with it are one.
  out << "wrote " << file->second << ": " << series.size() << (series.size() == 1 ? " run, " : " runs, ")
      << plot.markers.size() << " interventions\n";
  return kExitOk;
}

int CmdFetch(Client& client, const Parsed& parsed, std::ostream& out, std::ostream& err) {
  const std::string& run_id = parsed.positional[0];
  int64_t step = 0;
  if (parsed.flags.count("--step")) {
    const std::string& text = parsed.flags.at("--step");
    char* end = nullptr;
    step = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || step < 1 || step > 99999999) {
      err << "keel: --step: '" << text << "' is not allowed (allowed: a step, 1 .. 99999999)\n";
      return kExitUsage;
    }
  }
  std::string dest = parsed.flags.count("-o") ? parsed.flags.at("-o") : "";
  if (dest.empty()) {
    int64_t named = step;
    if (named == 0) {  // the newest: its step names the directory
      v1::GetRunRequest request;
      request.set_run_id(run_id);
      v1::Run run;
      grpc::Status status = client.stub()->GetRun(client.Context().get(), request, &run);
      if (!status.ok()) return RpcError("GetRun", status, client, err);
      named = run.artifact_step();
    }
    dest = run_id + "-" + CheckpointDirName(named);
  }
  while (dest.size() > 1 && dest.back() == '/') dest.pop_back();
  if (!client.WaitForConnected()) {
    return RpcError("FetchCheckpoint", grpc::Status(grpc::StatusCode::UNAVAILABLE, "no connection"), client, err);
  }
  v1::DownloadCheckpointRequest request;
  request.set_run_id(run_id);
  request.set_step(step);
  auto context = client.Context(0);
  auto reader = client.stub()->FetchCheckpoint(context.get(), request);
  v1::CheckpointHeader header;
  int last_tenth = -1;
  Status received = ReceiveCheckpoint(
      [&](v1::CheckpointChunk* c) { return reader->Read(c); }, run_id, step, dest, &header,
      [&](int64_t bytes, int64_t total) {
        if (total < (int64_t{8} << 20)) return;
        const int tenth = static_cast<int>(bytes * 10 / total);
        if (tenth == last_tenth) return;
        last_tenth = tenth;
        char line[128];
        std::snprintf(line, sizeof(line), "keel: fetching %s: %.1f of %.1f MiB (%d%%)\n", run_id.c_str(),
                      static_cast<double>(bytes) / (1 << 20), static_cast<double>(total) / (1 << 20), tenth * 10);
        err << line << std::flush;
      });
  // Unavailable: the stream ended, and keeld's status says why; else stop keeld sending.
  if (!received.ok() && received.code() != StatusCode::kUnavailable) context->TryCancel();
  grpc::Status status = reader->Finish();
  if (!received.ok() && (status.ok() || status.error_code() == grpc::StatusCode::CANCELLED)) {
    err << "keel: fetch of run " << run_id << (step ? " step " + std::to_string(step) : std::string(" (newest)"))
        << " failed: " << received.message() << "\n";
    return received.code() == StatusCode::kFailedPrecondition ? kExitUsage : kExitFailed;
  }
  if (!status.ok()) return RpcError("FetchCheckpoint", status, client, err);
  int64_t bytes = 0;
  for (const v1::CheckpointFile& f : header.files()) bytes += f.size();
  out << "fetched run " << run_id << " step " << header.step() << " into " << dest << ": " << header.files_size()
      << " files, " << bytes << " bytes, every file's CRC-32 verified\n";
  return kExitOk;
}

int CmdWorkers(Client& client, const Parsed& parsed, std::ostream& out, std::ostream& err) {
  auto fetch = [&](v1::ListWorkersResponse* response) {
    auto context = client.Context();
    return client.stub()->ListWorkers(context.get(), v1::ListWorkersRequest(), response);
  };
  auto table = [](v1::ListWorkersResponse* response) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& worker : response->workers()) {
      int busy = 0;
      for (const auto& device : worker.devices()) busy += device.run_id().empty() ? 0 : 1;
      std::string runs;
      for (const auto& run : worker.run_ids()) runs += (runs.empty() ? "" : ",") + run;
      rows.push_back({worker.id(), worker.host(), worker.connected() ? "yes" : "no",
                      std::to_string(busy) + "/" + std::to_string(worker.devices_size()),
                      std::to_string(worker.cpu_slots()), runs.empty() ? "-" : runs,
                      FormatTime(worker.lease_expires_unix_ms())});
    }
    return FormatTable({"ID", "HOST", "CONNECTED", "GPUS BUSY", "CPU SLOTS", "RUNS", "LEASE EXPIRES"}, rows);
  };
  return PrintListing<v1::ListWorkersResponse>(client, parsed, "ListWorkers", out, err, fetch, table);
}

}  // namespace

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Parsed parsed;
  std::string problem = ParseArgs(args, &parsed);
  if (!problem.empty()) {
    err << "keel: " << problem << "\n";
    if (parsed.spec != nullptr)
      err << "usage: " << parsed.spec->usage << " (keel " << parsed.spec->name << " --help)\n";
    else
      err << "run `keel --help` for the commands\n";
    return kExitUsage;
  }
  if (parsed.command == "help") {
    if (parsed.positional.empty()) {
      out << ToolHelp();
      return kExitOk;
    }
    const CommandSpec* spec = FindCommand(parsed.positional[0]);
    if (spec == nullptr) {
      err << "keel: unknown command \"" << parsed.positional[0] << "\"\n";
      return kExitUsage;
    }
    out << CommandHelp(*spec);
    return kExitOk;
  }
  if (parsed.help) {
    out << (parsed.spec != nullptr ? CommandHelp(*parsed.spec) : ToolHelp());
    return kExitOk;
  }
  if (parsed.spec == nullptr) {
    err << ToolHelp();
    return kExitUsage;
  }
  const CommandSpec& spec = *parsed.spec;
  if (parsed.positional.size() < spec.min_positional || parsed.positional.size() > spec.max_positional) {
    err << "keel: " << (parsed.positional.size() < spec.min_positional ? "missing argument" : "too many arguments")
        << "\nusage: " << spec.usage << "\n";
    return kExitUsage;
  }

  // Server and token: flags, then environment, then the config file.
  std::map<std::string, std::string> config = ReadConfig();
  std::string server = parsed.flags.count("--server") ? parsed.flags.at("--server") : Env("KEEL_SERVER");
  std::string server_origin = parsed.flags.count("--server") ? "--server" : "KEEL_SERVER";
  if (server.empty() && config.count("server")) {
    server = config.at("server");
    server_origin = "server in ~/.config/keel/config";
  }
  if (server.empty()) server = kDefaultServer;
  std::vector<std::string> servers;
  if (Status s = ParseServerList(server, server_origin, &servers); !s.ok()) {
    err << "keel: " << s.message() << "\n";
    return kExitUsage;
  }
  if (parsed.flags.count("--token") && parsed.flags.count("--token-file")) {
    err << "keel: give --token or --token-file, not both\n";
    return kExitUsage;
  }
  std::string token, token_origin;
  if (parsed.flags.count("--token")) {
    token = parsed.flags.at("--token");
    token_origin = "--token";
  } else if (parsed.flags.count("--token-file")) {
    Status s = ReadTokenFile(parsed.flags.at("--token-file"), &token);
    if (!s.ok()) {
      err << "keel: " << s.message() << "\n";
      return kExitUsage;
    }
  } else {
    token = Env("KEEL_TOKEN");
    token_origin = "KEEL_TOKEN";
    if (token.empty() && config.count("token")) {
      token = config.at("token");
      token_origin = "token in ~/.config/keel/config";
    }
  }
  // gRPC aborts the process (exit 134) on a metadata value with a newline or
  // a control character; refuse it here with where it came from.
  if (Status s = CheckToken(token, token_origin); !token_origin.empty() && !s.ok()) {
    err << "keel: " << s.message() << "\n";
    return kExitUsage;
  }

  ChannelOptions channel_options;
  channel_options.address = servers[0];
  auto flag_env_config = [&](const char* flag, const char* env, const char* key) {
    if (parsed.flags.count(flag)) return parsed.flags.at(flag);
    std::string v = Env(env);
    if (v.empty() && config.count(key)) v = config.at(key);
    return v;
  };
  channel_options.tls_ca = flag_env_config("--tls-ca", "KEEL_TLS_CA", "tls_ca");
  channel_options.tls_cert = flag_env_config("--tls-cert", "KEEL_TLS_CERT", "tls_cert");
  channel_options.tls_key = flag_env_config("--tls-key", "KEEL_TLS_KEY", "tls_key");
  std::shared_ptr<grpc::Channel> channel;
  server = servers[0];
  if (servers.size() > 1) {
    const int found = FindActive(servers, channel_options, token, &server, &channel, err);
    if (found != kExitOk) return found;
  } else {
    Status channel_status = MakeChannel(channel_options, &channel);
    if (!channel_status.ok()) {
      err << "keel: " << channel_status.message() << "\n";
      return kExitUsage;
    }
  }
  bool tty = &out == &std::cout && isatty(STDOUT_FILENO);
  Client client(server, token, channel);
  const std::string command = spec.name;
  if (command == "submit") return CmdSubmit(client, parsed, out, err, tty);
  if (command == "sweeps") return CmdSweeps(client, parsed, out, err);
  if (command == "runs") return CmdRuns(client, parsed, out, err);
  if (command == "show") return CmdShow(client, parsed, out, err);
  if (command == "watch") return Watch(client, parsed.positional[0], out, err, tty);
  if (command == "cancel") return CmdCancel(client, parsed, out, err);
  if (command == "intervene") return CmdIntervene(client, parsed, out, err);
  if (command == "export") return CmdExport(client, parsed, out, err);
  if (command == "plot") return CmdPlot(client, parsed, out, err);
  if (command == "workers") return CmdWorkers(client, parsed, out, err);
  if (command == "fetch") return CmdFetch(client, parsed, out, err);
  err << "keel: command " << command << " is not implemented\n";
  return kExitFailed;
}

}  // namespace client
}  // namespace keel
