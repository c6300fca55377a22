// RunSupervisor with the real keel-train (a data dependency): metrics lines and
// checkpoints are followed while it trains; a normal end, SIGTERM (checkpoint,
// exit 130) and kill -9 are each reported as what they were; resume continues.
#include "worker/agent/run_supervisor.h"

#include "worker/io/file_util.h"
#include "worker/run/run_dir.h"
#include "worker/run/run_lease.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <thread>
#include <vector>

namespace keel {
namespace {

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
  return dir;
}

RunLaunch Launch(const std::string& dir, int steps) {
  RunLaunch l;
  l.run_id = "run-1";
  l.trainer = "worker/engine/keel-train";  // runfiles path of the data dependency
  l.run_dir = dir;
  l.spec_yaml = "model: {type: proxy, layers: 1, width: 16}\nbatch: 32\nthreads: 1\ncheckpoint_every: 10\n"
                "steps: " + std::to_string(steps) + "\n";
  l.attempt = 1;
  l.lease_expires_unix_ms = UnixMs() + 3600 * 1000;  // renewed by keel-worker in real use
  return l;
}

// Polls until the process exits (or 60 s), collecting everything it reported.
RunProgress Follow(RunSupervisor* s, int stop_after_metrics = -1, int signal = 0) {
  RunProgress all;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool signalled = false;
  while (std::chrono::steady_clock::now() < deadline) {
    RunProgress p;
    Status st = s->Poll(&p);
    EXPECT_TRUE(st.ok()) << st.message();
    all.metrics.insert(all.metrics.end(), p.metrics.begin(), p.metrics.end());
    all.checkpoints.insert(all.checkpoints.end(), p.checkpoints.begin(), p.checkpoints.end());
    if (!signalled && stop_after_metrics >= 0 && static_cast<int>(all.metrics.size()) >= stop_after_metrics) {
      EXPECT_TRUE(s->Signal(signal).ok());
      signalled = true;
    }
    if (p.exited) {
      all.exited = true;
      all.exit = p.exit;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return all;
}

TEST(RunSupervisorTest, FollowsMetricsAndCheckpointsToANormalExit) {
  std::unique_ptr<RunSupervisor> s;
  Status st = RunSupervisor::Start(Launch(FreshDir("sup_normal"), 30), &s);
  ASSERT_TRUE(st.ok()) << st.message();
  RunProgress p = Follow(s.get());
  ASSERT_TRUE(p.exited);
  EXPECT_EQ(p.exit.exit_code(), 0) << p.exit.message();
  ASSERT_EQ(p.metrics.size(), 30u);
  for (size_t i = 0; i < p.metrics.size(); ++i) {
    EXPECT_EQ(p.metrics[i].step(), static_cast<int64_t>(i + 1));
    EXPECT_EQ(p.metrics[i].run_id(), "run-1");
    EXPECT_GT(p.metrics[i].loss(), 0.0);
    EXPECT_NE(p.metrics[i].json().find("\"grad_norm\""), std::string::npos);
  }
  ASSERT_FALSE(p.checkpoints.empty());
  EXPECT_EQ(p.checkpoints.back().step(), 30);  // the final checkpoint
}

TEST(RunSupervisorTest, SigtermCheckpointsAndResumeContinues) {
  std::string dir = FreshDir("sup_term");
  std::unique_ptr<RunSupervisor> s;
  ASSERT_TRUE(RunSupervisor::Start(Launch(dir, 100000), &s).ok());
  RunProgress p = Follow(s.get(), 5, SIGTERM);
  ASSERT_TRUE(p.exited);
  EXPECT_EQ(p.exit.exit_code(), 130) << p.exit.message();
  ASSERT_FALSE(p.checkpoints.empty());
  const v1::CheckpointNotice last = p.checkpoints.back();
  EXPECT_EQ(last.step(), p.metrics.back().step());
  // Resume from it for a few more steps.
  RunLaunch again = Launch(dir, static_cast<int>(last.step()) + 3);
  again.resume_checkpoint = last.path();
  std::unique_ptr<RunSupervisor> resumed;
  ASSERT_TRUE(RunSupervisor::Start(again, &resumed).ok());
  RunProgress q = Follow(resumed.get());
  ASSERT_TRUE(q.exited);
  EXPECT_EQ(q.exit.exit_code(), 0) << q.exit.message();
  ASSERT_FALSE(q.metrics.empty());
  EXPECT_EQ(q.metrics.back().step(), last.step() + 3);
}

TEST(RunSupervisorTest, KillNineIsReportedAsTheSignal) {
  std::unique_ptr<RunSupervisor> s;
  ASSERT_TRUE(RunSupervisor::Start(Launch(FreshDir("sup_kill"), 100000), &s).ok());
  RunProgress p = Follow(s.get(), 3, SIGKILL);
  ASSERT_TRUE(p.exited);
  EXPECT_EQ(p.exit.exit_code(), -1);
  EXPECT_EQ(p.exit.signal(), SIGKILL);
}

// The NUL-separated strings of a /proc file (cmdline, environ).
std::vector<std::string> ProcStrings(pid_t pid, const std::string& file) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  for (size_t begin = 0, end; begin < text.size(); begin = end + 1) {
    end = text.find('\0', begin);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(begin, end - begin));
  }
  return out;
}

// The value of `name` in the process's environment ("" when unset).
std::string EnvOf(pid_t pid, const std::string& name) {
  for (const std::string& kv : ProcStrings(pid, "environ")) {
    if (kv.rfind(name + "=", 0) == 0) return kv.substr(name.size() + 1);
  }
  return "";
}

// The processes whose parent is `parent`.
std::vector<pid_t> Children(pid_t parent) {
  std::vector<pid_t> out;
  DIR* proc = opendir("/proc");
  while (dirent* e = proc ? readdir(proc) : nullptr) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
    std::string text;
    std::getline(stat, text);
    const size_t paren = text.rfind(')');
    int ppid = 0;
    char state = 0;
    if (paren != std::string::npos && std::sscanf(text.c_str() + paren + 1, " %c %d", &state, &ppid) == 2 &&
        ppid == parent) {
      out.push_back(pid);
    }
  }
  if (proc) closedir(proc);
  return out;
}

// Fake GPUs (keel-worker --fake-gpus): the trainer gets no --backend (its
// config's cpu runs), and rank k of its launcher sees only the k-th GPU.
TEST(RunSupervisorTest, FakeGpusRunTheConfigsBackendWithOneDevicePerRank) {
  RunLaunch l = Launch(FreshDir("sup_fake_gpus"), 3000);  // a few seconds: long enough to see the ranks
  l.gpus = {3, 5};
  l.fake_gpus = true;
  l.ranks = 2;
  std::unique_ptr<RunSupervisor> s;
  ASSERT_TRUE(RunSupervisor::Start(l, &s).ok());
  // The launcher, once exec'd (before that /proc shows this test): no --backend.
  std::vector<std::string> args;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::find(args.begin(), args.end(), "--config") == args.end() && std::chrono::steady_clock::now() < deadline) {
    args = ProcStrings(s->pid(), "cmdline");
  }
  EXPECT_EQ(std::find(args.begin(), args.end(), "--backend"), args.end());
  EXPECT_NE(std::find(args.begin(), args.end(), "--nproc"), args.end());
  EXPECT_EQ(EnvOf(s->pid(), "CUDA_VISIBLE_DEVICES"), "3,5");
  // Each rank, once started: its own GPU.
  std::map<std::string, std::string> by_rank;
  while (by_rank.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    for (pid_t child : Children(s->pid())) {
      const std::vector<std::string> rank_args = ProcStrings(child, "cmdline");
      auto rank = std::find(rank_args.begin(), rank_args.end(), "--rank");
      if (rank != rank_args.end() && rank + 1 != rank_args.end()) by_rank[*(rank + 1)] = EnvOf(child, "CUDA_VISIBLE_DEVICES");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(by_rank, (std::map<std::string, std::string>{{"0", "3"}, {"1", "5"}}));
  // They train on the CPU (the config's backend) to the end.
  RunProgress p = Follow(s.get());
  ASSERT_TRUE(p.exited);
  EXPECT_EQ(p.exit.exit_code(), 0) << p.exit.message();
  EXPECT_EQ(p.metrics.size(), 3000u);
}

// A gang of two parts of one rank each, as on two hosts (two run directories,
// the id relayed by hand as keeld relays it): the part with rank 0 listens on
// every interface and publishes its advertise address, here 127.0.0.2, which
// reaches a socket bound to 0.0.0.0 but never one bound to 127.0.0.1 (the
// single-host default); the other part joins through it and both finish.
TEST(RunSupervisorTest, AGangsRankZeroListensOnEveryInterfaceAndPublishesItsAdvertiseAddress) {
  RunLaunch first = Launch(FreshDir("sup_gang_first"), 20);
  first.ranks = 1;
  first.first_rank = 0;
  first.world = 2;
  first.advertise = "127.0.0.2";
  RunLaunch second = Launch(FreshDir("sup_gang_second"), 20);
  second.ranks = 1;
  second.first_rank = 1;
  second.world = 2;
  second.advertise = "127.0.0.3";  // not the part with rank 0: unused
  std::unique_ptr<RunSupervisor> a, b;
  ASSERT_TRUE(RunSupervisor::Start(first, &a).ok());
  ASSERT_TRUE(RunSupervisor::Start(second, &b).ok());
  std::vector<std::string> args;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::find(args.begin(), args.end(), "--config") == args.end() && std::chrono::steady_clock::now() < deadline) {
    args = ProcStrings(a->pid(), "cmdline");
  }
  auto set = [](const std::vector<std::string>& v, const std::string& what) {
    for (size_t i = 0; i + 1 < v.size(); ++i) {
      if (v[i] == "--set" && v[i + 1] == what) return true;
    }
    return false;
  };
  EXPECT_TRUE(set(args, "dist.listen_host=0.0.0.0"));
  EXPECT_TRUE(set(args, "dist.advertise_host=127.0.0.2"));
  std::vector<std::string> other;
  while (std::find(other.begin(), other.end(), "--config") == other.end() && std::chrono::steady_clock::now() < deadline) {
    other = ProcStrings(b->pid(), "cmdline");
  }
  EXPECT_FALSE(set(other, "dist.listen_host=0.0.0.0"));  // only rank 0 listens
  // Relay rank 0's id to the other part, as keeld does.
  std::string id;
  while (std::chrono::steady_clock::now() < deadline) {
    if (ReadFile(RunDir(first.run_dir).bootstrap(), &id).ok() && !id.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(id.rfind("127.0.0.2:", 0), 0u) << id;
  ASSERT_TRUE(WriteFileAtomic(RunDir(second.run_dir).bootstrap(), id).ok());
  RunProgress second_progress;
  std::thread follow_second([&] { second_progress = Follow(b.get()); });
  RunProgress p = Follow(a.get());
  follow_second.join();
  ASSERT_TRUE(p.exited);
  EXPECT_EQ(p.exit.exit_code(), 0) << p.exit.message();
  EXPECT_EQ(p.metrics.size(), 20u);
  ASSERT_TRUE(second_progress.exited);
  EXPECT_EQ(second_progress.exit.exit_code(), 0) << second_progress.exit.message();
}

TEST(RunSupervisorTest, BadTrainerPathExitsWith127AndSaysSo) {
  RunLaunch l = Launch(FreshDir("sup_bad"), 5);
  l.trainer = "/nonexistent/keel-train";
  std::unique_ptr<RunSupervisor> s;
  ASSERT_TRUE(RunSupervisor::Start(l, &s).ok());
  RunProgress p = Follow(s.get());
  ASSERT_TRUE(p.exited);
  EXPECT_EQ(p.exit.exit_code(), 127);
  EXPECT_NE(p.exit.message().find("exec of the trainer failed"), std::string::npos) << p.exit.message();
}

TEST(RunSupervisorTest, ATruncatedMetricsFileIsReadAgainFromTheStart) {
  const std::string dir = FreshDir("sup_truncate");
  std::unique_ptr<RunSupervisor> s;
  ASSERT_TRUE(RunSupervisor::Start(Launch(dir, 4000), &s).ok());
  RunProgress all;
  bool truncated = false;
  int64_t cut_after = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    RunProgress p;
    ASSERT_TRUE(s->Poll(&p).ok());
    all.metrics.insert(all.metrics.end(), p.metrics.begin(), p.metrics.end());
    if (!truncated && all.metrics.size() >= 200) {
      // Someone empties the file mid-run, after everything written was read
      // (the trainer is paused meanwhile); the trainer then keeps appending.
      ASSERT_EQ(kill(s->pid(), SIGSTOP), 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      RunProgress rest;
      ASSERT_TRUE(s->Poll(&rest).ok());
      all.metrics.insert(all.metrics.end(), rest.metrics.begin(), rest.metrics.end());
      cut_after = all.metrics.back().step();
      ASSERT_EQ(truncate((dir + "/metrics.jsonl").c_str(), 0), 0);
      ASSERT_TRUE(s->Poll(&rest).ok());  // sees the file shrink before the trainer writes again
      ASSERT_TRUE(rest.metrics.empty());
      ASSERT_EQ(kill(s->pid(), SIGCONT), 0);
      truncated = true;
    }
    if (p.exited) {
      all.exit = p.exit;
      all.exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(all.exited);
  EXPECT_EQ(all.exit.exit_code(), 0) << all.exit.message();
  // Every line written after the truncation arrives and parses: steps 1 ..
  // cut_after, then cut_after + 1 .. 4000, each once and in order. (A trainer
  // writing at its own offset instead of appending would leave a hole of zero
  // bytes there, and the first line after it would not parse.)
  ASSERT_EQ(all.metrics.size(), 4000u);
  for (size_t i = 0; i < all.metrics.size(); ++i) EXPECT_EQ(all.metrics[i].step(), static_cast<int64_t>(i + 1));
  EXPECT_GT(cut_after, 0);
}

TEST(RunSupervisorTest, AnExpiredLeaseHoldsTheTrainerAndAnotherAttemptsLeaseStopsIt) {
  const std::string dir = FreshDir("sup_lease");
  RunLaunch l = Launch(dir, 100000);
  // No periodic checkpoints: the only one would be written on the way out.
  l.spec_yaml.replace(l.spec_yaml.find("checkpoint_every: 10"), 20, "checkpoint_every: 0");
  const int64_t deadline = UnixMs() + 2000;
  l.lease_expires_unix_ms = deadline;
  std::unique_ptr<RunSupervisor> s;
  ASSERT_TRUE(RunSupervisor::Start(l, &s).ok());
  // It trains until the lease expires, then takes no step while it stays expired.
  std::this_thread::sleep_for(std::chrono::milliseconds(deadline - UnixMs() + 500));
  RunProgress p;
  ASSERT_TRUE(s->Poll(&p).ok());
  ASSERT_FALSE(p.exited) << p.exit.message();
  ASSERT_FALSE(p.metrics.empty());
  const int64_t held_at = p.metrics.back().step();
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ASSERT_TRUE(s->Poll(&p).ok());
  EXPECT_TRUE(p.metrics.empty()) << "stepped to " << p.metrics.back().step() << " on an expired lease";
  // Renewed: it trains on from where it waited.
  ASSERT_TRUE(s->RenewLease(UnixMs() + 60000).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ASSERT_TRUE(s->Poll(&p).ok());
  ASSERT_FALSE(p.metrics.empty());
  EXPECT_EQ(p.metrics.front().step(), held_at + 1);
  // The lease now names attempt 2 (keeld gave the run to another worker): it
  // stops with exit 4 and writes no checkpoint on the way out.
  ASSERT_TRUE(WriteRunLease(dir + "/lease", {2, UnixMs() - 1}).ok());
  RunProgress rest = Follow(s.get());
  ASSERT_TRUE(rest.exited);
  EXPECT_EQ(rest.exit.exit_code(), 4) << rest.exit.message();
  EXPECT_NE(rest.exit.message().find("superseded"), std::string::npos) << rest.exit.message();
  EXPECT_NE(access((dir + "/checkpoints").c_str(), F_OK), 0) << "a superseded trainer wrote a checkpoint";
}

}  // namespace
}  // namespace keel
