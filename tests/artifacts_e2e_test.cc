// Checkpoints without a shared filesystem (docs/service.md, "Artifacts"), end
// to end with real processes on loopback: keeld, two keel-workers with
// separate work dirs, keel-train on the CPU, the keel CLI. A run checkpoints
// on worker A, which uploads to keeld; A is killed (-9) and its work dir
// removed (its host is gone); worker B, which never saw the run, downloads
// the checkpoint keeld recorded and resumes from it: its metrics continue at
// the next step, no step before it is trained again, the final loss equals an
// uninterrupted run's. `keel fetch` downloads the final checkpoint with the
// worker's bytes. A checkpoint that arrives corrupt is retried, then fails
// the attempt with a message naming it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/keel.grpc.pb.h"
#include "kernels/base/host.h"
#include "tests/cluster.h"

namespace {

using keel_test::Cluster;
using keel_test::kUserToken;

// 3000 steps of the small proxy (a few seconds), a checkpoint every 100.
std::string Sweep() {
  return "name: artifacts\n"
         "base:\n"
         "  model: {type: proxy, layers: 1, width: 16}\n"
         "  batch: 32\n  threads: 1\n  checkpoint_every: 100\n"
         "  steps: 3000\n";
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

keel::v1::Run GetRun(Cluster* cluster, const std::string& id) {
  keel::v1::GetRunRequest request;
  request.set_run_id(id);
  keel::v1::Run run;
  EXPECT_TRUE(cluster->stub()->GetRun(cluster->Context().get(), request, &run).ok());
  return run;
}

// Polls the run until `done` holds (or `seconds` pass); returns the last look.
keel::v1::Run WaitRun(Cluster* cluster, const std::string& id, int seconds,
                      const std::function<bool(const keel::v1::Run&)>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  keel::v1::Run run;
  while (std::chrono::steady_clock::now() < deadline) {
    run = GetRun(cluster, id);
    if (done(run)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return run;
}

// A shell command's exit status, its stdout and stderr together in *output.
int RunTool(const std::string& command, const std::string& dir, std::string* output) {
  const std::string log = dir + "/tool.out";
  const int status = std::system((command + " > '" + log + "' 2>&1").c_str());
  *output = Read(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// The "step" of each line of a metrics.jsonl.
std::vector<int64_t> StepsOf(const std::string& metrics) {
  std::vector<int64_t> steps;
  std::istringstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("\"step\":");
    if (at != std::string::npos) steps.push_back(std::atoll(line.c_str() + at + 7));
  }
  return steps;
}

// Starts the sweep on worker "wa", waits until keeld recorded an uploaded
// checkpoint of step >= 200, kills wa (-9), waits for its trainer to stop and
// removes its work dir. Returns the run; *step: the checkpoint keeld resumes
// it from (read once keeld has requeued it, so no upload is still landing).
// keel-worker's /metrics at 127.0.0.1:port (one HTTP/1.0 GET), "" when it does not answer.
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) body.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return body;
}

// The value of the sample line that starts with `series` in a scrape, or -1.
double Sample(const std::string& scrape, const std::string& series) {
  std::istringstream lines(scrape);
  for (std::string line; std::getline(lines, line);) {
    if (line.compare(0, series.size() + 1, series + " ") == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

// Scrapes until `series` reaches at least `at_least` (the worker refreshes its
// counters once a second); returns the last value seen.
double WaitSample(int port, const std::string& series, double at_least) {
  double v = -1;
  for (int i = 0; i < 100 && v < at_least; ++i) {
    v = Sample(Scrape(port), series);
    if (v < at_least) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return v;
}

std::string CheckpointOnAThenLoseA(Cluster* cluster, int64_t* step) {
  keel_test::Process* a = cluster->AddWorker("wa");
  keel::v1::SubmitSweepResponse submitted;
  grpc::Status s = cluster->Submit(Sweep(), &submitted);
  EXPECT_TRUE(s.ok()) << s.error_message();
  if (!s.ok()) return "";
  const std::string id = submitted.runs(0).id();
  keel::v1::Run run = WaitRun(cluster, id, 60, [](const keel::v1::Run& r) { return r.artifact_step() >= 200; });
  EXPECT_GE(run.artifact_step(), 200) << run.DebugString();
  EXPECT_NE(run.state(), keel::v1::SUCCEEDED) << "the run ended before the kill: make it longer";
  a->Kill(SIGKILL);
  // Its trainer stops too (SIGTERM when its worker dies) and writes a last
  // checkpoint into wa's dir, which nobody uploads any more.
  for (int i = 0; i < 200 && !cluster->Trainers(id).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(cluster->Trainers(id).empty());
  EXPECT_EQ(std::system(("rm -rf '" + cluster->dir() + "/wa'").c_str()), 0);  // wa's host is gone
  run = WaitRun(cluster, id, 30, [](const keel::v1::Run& r) { return r.restarts() == 1; });
  EXPECT_EQ(run.restarts(), 1) << run.DebugString();
  EXPECT_EQ(run.state(), keel::v1::QUEUED);
  *step = run.artifact_step();
  return id;
}

TEST(ArtifactsE2eTest, ARunResumesFromItsUploadedCheckpointOnAWorkerThatNeverSawIt) {
  Cluster cluster("e2e_artifacts_resume", {"--artifact-keep", "2"});
  int64_t step = 0;
  // wb's upload and download counters on its real /metrics endpoint. (wa is
  // not scraped: waiting for its once-a-second refresh could let the run end
  // before the kill.)
  const int wb_port = keel::FreeLoopbackPort();
  const std::string committed = "keel_worker_checkpoint_uploads_total{outcome=\"committed\"}";
  const std::string downloaded = "keel_worker_checkpoint_downloads_total{outcome=\"ok\"}";
  const std::string id = CheckpointOnAThenLoseA(&cluster, &step);
  ASSERT_FALSE(id.empty());
  ASSERT_GE(step, 200);
  ASSERT_EQ(step % 100, 0);
  cluster.AddWorker("wb", {"--metrics-listen", "127.0.0.1:" + std::to_string(wb_port)});
  keel::v1::Run run = WaitRun(&cluster, id, 120, [](const keel::v1::Run& r) { return r.state() == keel::v1::SUCCEEDED || r.state() == keel::v1::FAILED; });
  ASSERT_EQ(run.state(), keel::v1::SUCCEEDED) << run.message();
  EXPECT_EQ(run.restarts(), 1);

  EXPECT_EQ(WaitSample(wb_port, downloaded, 1), 1);  // the one checkpoint it resumed from
  EXPECT_GE(WaitSample(wb_port, committed, 1), 1);   // and its own, uploaded as it trained on
  EXPECT_EQ(Sample(Scrape(wb_port), "keel_worker_checkpoint_uploads_total{outcome=\"failed\"}"), 0);

  // wb downloaded the checkpoint keeld recorded and trained from the step after it.
  const std::string wb_log = Read(cluster.dir() + "/wb.log");
  EXPECT_NE(wb_log.find("run " + id + ": downloaded and verified checkpoint step " + std::to_string(step) + " of run " + id),
            std::string::npos)
      << wb_log;
  const std::string run_dir = cluster.dir() + "/wb/runs/" + id;
  const std::vector<int64_t> trained = StepsOf(Read(run_dir + "/metrics.jsonl"));
  ASSERT_FALSE(trained.empty());
  EXPECT_EQ(trained.front(), step + 1);  // no step up to the checkpoint's trained again
  for (size_t i = 0; i < trained.size(); ++i) ASSERT_EQ(trained[i], step + 1 + static_cast<int64_t>(i));
  EXPECT_EQ(trained.back(), 3000);

  // keeld holds every step once: wa's up to the kill, wb's after the checkpoint.
  keel::v1::GetMetricsRequest mr;
  mr.set_run_id(id);
  std::vector<int64_t> stored;
  do {
    keel::v1::GetMetricsResponse page;
    ASSERT_TRUE(cluster.stub()->GetMetrics(cluster.Context().get(), mr, &page).ok());
    for (const auto& p : page.points()) stored.push_back(p.step());
    mr.set_page_token(page.next_page_token());
  } while (!mr.page_token().empty());
  ASSERT_EQ(stored.size(), 3000u);
  for (size_t i = 0; i < stored.size(); ++i) ASSERT_EQ(stored[i], static_cast<int64_t>(i) + 1);

  // The final loss is an uninterrupted run's, bit for bit (as printed).
  const std::string direct = cluster.dir() + "/direct";
  std::ofstream(direct + ".yaml") << run.spec().yaml();
  ASSERT_EQ(std::system(("worker/engine/keel-train --quiet --config " + direct + ".yaml --run-dir " + direct).c_str()), 0);
  const std::string direct_metrics = Read(direct + "/metrics.jsonl");
  const std::string resumed_metrics = Read(run_dir + "/metrics.jsonl");
  auto last_line = [](const std::string& text) {
    const size_t end = text.find_last_not_of('\n');
    return text.substr(text.rfind('\n', end) + 1, end - text.rfind('\n', end));
  };
  auto loss = [](const std::string& line) { return line.substr(line.find("\"loss\":"), line.find(",\"lr\"") - line.find("\"loss\":")); };
  EXPECT_EQ(loss(last_line(resumed_metrics)), loss(last_line(direct_metrics)));

  // wb uploads its final checkpoint too; retention keeps 2 and no leftovers.
  run = WaitRun(&cluster, id, 30, [](const keel::v1::Run& r) { return r.artifact_step() == 3000; });
  ASSERT_EQ(run.artifact_step(), 3000);
  std::string out;
  ASSERT_EQ(RunTool("ls -A '" + cluster.dir() + "/state/artifacts/" + id + "'", cluster.dir(), &out), 0);
  EXPECT_EQ(out.find(".incoming"), std::string::npos) << out;
  EXPECT_NE(out.find("step_00003000\n"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;

  // keel fetch: the newest checkpoint, with wb's bytes.
  const std::string keel = "client/keel --server " + cluster.Address() + " --token " + kUserToken;
  const std::string fetched = cluster.dir() + "/fetched";
  ASSERT_EQ(RunTool(keel + " fetch " + id + " -o " + fetched, cluster.dir(), &out), 0) << out;
  EXPECT_NE(out.find("fetched run " + id + " step 3000 into " + fetched + ": 2 files, "), std::string::npos) << out;
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string mine = Read(fetched + "/" + file);
    EXPECT_FALSE(mine.empty()) << file;
    EXPECT_EQ(mine, Read(run_dir + "/checkpoints/step_00003000/" + file)) << file;
  }
  // Without -o it goes to RUN-step_<8 digits> in the working directory.
  ASSERT_EQ(RunTool("cd '" + cluster.dir() + "' && $OLDPWD/" + keel + " fetch " + id, cluster.dir(), &out), 0) << out;
  EXPECT_EQ(Read(cluster.dir() + "/" + id + "-step_00003000/model.safetensors"), Read(fetched + "/model.safetensors"));
  // Errors name the run, the step and what exists.
  EXPECT_EQ(RunTool(keel + " fetch " + id + " --step 7 -o " + cluster.dir() + "/none", cluster.dir(), &out), 5) << out;
  EXPECT_NE(out.find("run " + id + ": no checkpoint of step 7 in the artifact store (steps stored: "), std::string::npos) << out;
  EXPECT_NE(out.find("3000)"), std::string::npos) << out;
  EXPECT_EQ(RunTool(keel + " fetch run-999", cluster.dir(), &out), 5) << out;
  EXPECT_NE(out.find("run 'run-999' not found"), std::string::npos) << out;
  EXPECT_EQ(RunTool(keel + " fetch " + id + " -o " + fetched, cluster.dir(), &out), 2) << out;
  EXPECT_NE(out.find("'" + fetched + "' exists already"), std::string::npos) << out;
  EXPECT_EQ(RunTool(keel + " fetch " + id + " --step -3", cluster.dir(), &out), 2) << out;
  EXPECT_NE(out.find("--step: '-3' is not allowed (allowed: a step, 1 .. 99999999)"), std::string::npos) << out;
}

// keeld --artifact-store db on PostgreSQL, with a standby on "another host"
// (its own state directory, no shared files): keeld A records a checkpoint
// uploaded by worker wa; then A's host and wa's host are both lost (keeld A
// and wa killed with -9, their directories deleted). The standby B takes over
// and serves that checkpoint from the database: `keel fetch` gets wa's bytes,
// and worker wb, which never saw the run, downloads it from B and finishes
// the run from the step after it.
TEST(ArtifactsE2eTest, InTheDatabaseTheCheckpointsOutliveTheActiveKeeldsHostAndTheStandbyServesThem) {
  std::vector<std::string> store;
  auto pg = keel_test::StartPostgres("e2e_artifacts_db", &store);
  ASSERT_TRUE(pg);
  std::vector<std::string> keeld_args = store;
  keeld_args.insert(keeld_args.end(), {"--artifact-store", "db", "--artifact-keep", "2"});
  Cluster cluster("e2e_artifacts_db", keeld_args);  // keeld A, state in <dir>/state
  const std::string a = cluster.Address();
  const std::string b = "127.0.0.1:" + std::to_string(keel::FreeLoopbackPort());
  const std::string b_log = cluster.dir() + "/keeld-b.log";
  keel_test::Process standby({"server/keeld", "--listen", b, "--state-dir", cluster.dir() + "/host-b/state",
                              "--metrics-listen", "off", "--lease-ms", "1500", "--heartbeat-ms", "200", "--standby",
                              store[0], store[1], "--artifact-store", "db", "--artifact-keep", "2"},
                             b_log);
  for (int i = 0; i < 400 && Read(b_log).find("waiting for it") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(Read(b_log).find("waiting for it"), std::string::npos) << Read(b_log);
  EXPECT_NE(Read(cluster.dir() + "/keeld.log").find("artifacts in the store's database (keep 2 a run)"),
            std::string::npos)
      << Read(cluster.dir() + "/keeld.log");

  keel_test::Process* wa = cluster.AddWorker("wa", {"--server", a + "," + b});
  keel::v1::SubmitSweepResponse submitted;
  grpc::Status s = cluster.Submit(Sweep(), &submitted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::string id = submitted.runs(0).id();
  keel::v1::Run run = WaitRun(&cluster, id, 60, [](const keel::v1::Run& r) { return r.artifact_step() >= 200; });
  ASSERT_GE(run.artifact_step(), 200) << run.DebugString();
  ASSERT_NE(run.state(), keel::v1::SUCCEEDED) << "the run ended before the kill: make it longer";
  // wa's host is lost (no upload lands after this), then keeld A's, each with
  // its files. Before A goes, keel fetch takes the checkpoint A recorded.
  wa->Kill(SIGKILL);
  for (int i = 0; i < 200 && !cluster.Trainers(id).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(cluster.Trainers(id).empty());
  const int64_t step = GetRun(&cluster, id).artifact_step();
  ASSERT_GE(step, 200);
  std::string out;
  const std::string from_a = cluster.dir() + "/from-a";
  ASSERT_EQ(RunTool("client/keel --server " + a + " --token " + kUserToken + " fetch " + id + " -o " + from_a,
                    cluster.dir(), &out),
            0)
      << out;
  EXPECT_NE(out.find("fetched run " + id + " step " + std::to_string(step) + " into "), std::string::npos) << out;
  cluster.KillKeeld();
  ASSERT_EQ(std::system(("rm -rf '" + cluster.dir() + "/wa' '" + cluster.dir() + "/state'").c_str()), 0);

  // B takes over and answers from the database: the same checkpoint, byte for byte.
  cluster.UseKeeldAt(b);
  for (int i = 0; i < 200 && Read(b_log).find("took over after") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(Read(b_log).find("took over after"), std::string::npos) << Read(b_log);
  EXPECT_NE(Read(b_log).find("artifacts in the store's database"), std::string::npos) << Read(b_log);
  EXPECT_EQ(GetRun(&cluster, id).artifact_step(), step);
  const std::string keel = "client/keel --server " + b + " --token " + kUserToken;
  const std::string fetched = cluster.dir() + "/fetched";
  ASSERT_EQ(RunTool(keel + " fetch " + id + " --step " + std::to_string(step) + " -o " + fetched, cluster.dir(), &out),
            0)
      << out;
  EXPECT_NE(out.find("fetched run " + id + " step " + std::to_string(step) + " into " + fetched + ": 2 files, "),
            std::string::npos)
      << out;
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string mine = Read(fetched + "/" + file);
    EXPECT_FALSE(mine.empty()) << file;
    EXPECT_EQ(mine, Read(from_a + "/" + file)) << file;
  }

  // wb, on a third host, resumes the run from B's copy and finishes it.
  cluster.AddWorker("wb", {"--server", a + "," + b});
  run = WaitRun(&cluster, id, 120, [](const keel::v1::Run& r) {
    return r.state() == keel::v1::SUCCEEDED || r.state() == keel::v1::FAILED;
  });
  ASSERT_EQ(run.state(), keel::v1::SUCCEEDED) << run.message();
  EXPECT_EQ(run.restarts(), 1);
  const std::string wb_log = Read(cluster.dir() + "/wb.log");
  EXPECT_NE(wb_log.find("run " + id + ": downloaded and verified checkpoint step " + std::to_string(step) + " of run " + id),
            std::string::npos)
      << wb_log;
  const std::vector<int64_t> trained = StepsOf(Read(cluster.dir() + "/wb/runs/" + id + "/metrics.jsonl"));
  ASSERT_FALSE(trained.empty());
  EXPECT_EQ(trained.front(), step + 1);
  EXPECT_EQ(trained.back(), 3000);
  // wb's own uploads land in the database too: B records its last one.
  run = WaitRun(&cluster, id, 30, [](const keel::v1::Run& r) { return r.artifact_step() == 3000; });
  EXPECT_EQ(run.artifact_step(), 3000);
  ASSERT_EQ(RunTool(keel + " fetch " + id + " -o " + cluster.dir() + "/last", cluster.dir(), &out), 0) << out;
  EXPECT_EQ(Read(cluster.dir() + "/last/model.safetensors"),
            Read(cluster.dir() + "/wb/runs/" + id + "/checkpoints/step_00003000/model.safetensors"));
  // Nothing of it is on B's disk: its state directory holds no artifacts.
  EXPECT_EQ(RunTool("test -e '" + cluster.dir() + "/host-b/state/artifacts'", cluster.dir(), &out), 1);
}

TEST(ArtifactsE2eTest, ACheckpointThatArrivesCorruptIsRetriedThenFailsTheAttemptNamingIt) {
  Cluster cluster("e2e_artifacts_corrupt", {"--restart-backoff-ms", "100"});
  int64_t step = 0;
  const std::string id = CheckpointOnAThenLoseA(&cluster, &step);
  ASSERT_FALSE(id.empty());
  ASSERT_GE(step, 200);
  // A bit flips in keeld's stored copy.
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  const std::string model = cluster.dir() + "/state/artifacts/" + id + "/" + name + "/model.safetensors";
  std::string bytes = Read(model);
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() - 5] ^= 0x04;
  std::ofstream(model, std::ios::binary | std::ios::trunc) << bytes;
  cluster.AddWorker("wb");
  keel::v1::Run run = WaitRun(&cluster, id, 120, [](const keel::v1::Run& r) { return r.state() == keel::v1::SUCCEEDED || r.state() == keel::v1::FAILED; });
  ASSERT_EQ(run.state(), keel::v1::FAILED) << run.message();
  EXPECT_NE(run.message().find("keel-worker could not download checkpoint step " + std::to_string(step) + " of run " + id +
                               " from keeld (3 tries): "),
            std::string::npos)
      << run.message();
  EXPECT_NE(run.message().find("corrupt"), std::string::npos) << run.message();
  const std::string wb_log = Read(cluster.dir() + "/wb.log");
  EXPECT_NE(wb_log.find("try 1 of 3"), std::string::npos) << wb_log;
  EXPECT_NE(wb_log.find("try 2 of 3"), std::string::npos) << wb_log;
  // Nothing half-downloaded was left to be resumed from.
  std::string out;
  RunTool("ls -A '" + cluster.dir() + "/wb/runs/" + id + "/checkpoints'", cluster.dir(), &out);
  EXPECT_EQ(out.find(name), std::string::npos) << out;
}

}  // namespace
