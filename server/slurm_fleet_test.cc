// SlurmFleet's parsing, its command runner, and its submission rule, the rule
// driven through stand-in squeue/sbatch scripts that log their calls (the
// real Slurm runs in tests/slurm_test.sh).
#include "server/slurm_fleet.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace keel {
namespace {

TEST(SlurmFleetParse, SqueueLines) {
  std::vector<SlurmJob> jobs;
  ASSERT_TRUE(ParseSqueue("12 RUNNING\n13 PENDING\n\n", &jobs).ok());
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].id, "12");
  EXPECT_EQ(jobs[0].state, "RUNNING");
  EXPECT_EQ(jobs[1].state, "PENDING");
  ASSERT_TRUE(ParseSqueue("", &jobs).ok());
  EXPECT_TRUE(jobs.empty());
  const Status bad = ParseSqueue("12 RUNNING extra\n", &jobs);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("'12 RUNNING extra'"), std::string::npos) << bad.message();
}

TEST(SlurmFleetParse, SbatchId) {
  std::string id;
  ASSERT_TRUE(ParseSbatchId("4711\n", &id).ok());
  EXPECT_EQ(id, "4711");
  ASSERT_TRUE(ParseSbatchId("4712;cluster-a\n", &id).ok());
  EXPECT_EQ(id, "4712");
  EXPECT_FALSE(ParseSbatchId("Submitted batch job 4713\n", &id).ok());
  EXPECT_FALSE(ParseSbatchId("", &id).ok());
}

TEST(SlurmFleetRunCommand, OutputEnvironmentExitAndTimeout) {
  std::string out, err;
  ASSERT_TRUE(RunCommand({"sh", "-c", "echo \"out $KEEL_X\"; echo err >&2"}, {{"KEEL_X", "42"}}, 5000, &out, &err).ok());
  EXPECT_EQ(out, "out 42\n");
  EXPECT_EQ(err, "err\n");
  const Status failed = RunCommand({"sh", "-c", "echo nope >&2; exit 3"}, {}, 5000, &out, &err);
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("exited 3: nope"), std::string::npos) << failed.message();
  const Status slow = RunCommand({"sleep", "5"}, {}, 200, &out, &err);
  EXPECT_FALSE(slow.ok());
  EXPECT_NE(slow.message().find("ran past 200 ms"), std::string::npos) << slow.message();
  const Status missing = RunCommand({"/nonexistent/sbatch"}, {}, 1000, &out, &err);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("/nonexistent/sbatch"), std::string::npos) << missing.message();
}

// Stand-ins: squeue prints the file `queue`; sbatch appends its arguments and
// KEEL_SERVER to `calls`, adds a PENDING job to `queue` and prints its id.
class SlurmFleetRule : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/slurm_fleet_rule";
    std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str());
    Write(dir_ + "/queue", "");
    Write(dir_ + "/squeue", "#!/bin/sh\ncat " + dir_ + "/queue\n");
    Write(dir_ + "/sbatch",
          "#!/bin/sh\necho \"$* server=$KEEL_SERVER\" >> " + dir_ + "/calls\n" + "n=$(($(wc -l < " + dir_ +
              "/calls) + 100))\necho \"$n PENDING\" >> " + dir_ + "/queue\necho $n\n");
    chmod((dir_ + "/squeue").c_str(), 0755);
    chmod((dir_ + "/sbatch").c_str(), 0755);
    options_.script = "worker.sbatch";
    options_.squeue = dir_ + "/squeue";
    options_.sbatch = dir_ + "/sbatch";
    options_.sbatch_args = {"--partition=gpu"};
    options_.max_jobs = 2;
    options_.queued_for_ms = 3000;
    options_.poll_ms = 1000;
    options_.env["KEEL_SERVER"] = "head:7070";
  }
  static void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
  std::string Calls() {
    std::ifstream in(dir_ + "/calls");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string dir_;
  SlurmFleetOptions options_;
};

TEST_F(SlurmFleetRule, SubmitsOnlyAfterRunsWaitedAndOneJobPendingAtATime) {
  SlurmFleet fleet(options_);
  std::string id;
  ASSERT_TRUE(fleet.Tick(0, 0, &id).ok());
  EXPECT_EQ(id, "") << "nothing queued";
  ASSERT_TRUE(fleet.Tick(3, 1000, &id).ok());
  EXPECT_EQ(id, "") << "queued for 0 s of 3";
  ASSERT_TRUE(fleet.Tick(3, 3500, &id).ok());
  EXPECT_EQ(id, "") << "queued for 2.5 s of 3";
  ASSERT_TRUE(fleet.Tick(3, 4500, &id).ok());
  EXPECT_EQ(id, "101");
  EXPECT_EQ(Calls(), "--parsable --job-name=keel-worker --partition=gpu worker.sbatch server=head:7070\n");
  ASSERT_TRUE(fleet.Tick(3, 6000, &id).ok());
  EXPECT_EQ(id, "") << "job 101 still pending";
  // It starts; runs are still waiting: one more, then the cap of 2.
  Write(dir_ + "/queue", "101 RUNNING\n");
  ASSERT_TRUE(fleet.Tick(2, 7000, &id).ok());
  EXPECT_EQ(id, "102");
  Write(dir_ + "/queue", "101 RUNNING\n102 RUNNING\n");
  ASSERT_TRUE(fleet.Tick(2, 8000, &id).ok());
  EXPECT_EQ(id, "") << "max_jobs 2 reached";
  EXPECT_EQ(fleet.submitted_total(), 2);
  // Polls are rate-limited: a tick within poll_ms runs no command at all.
  Write(dir_ + "/queue", "");
  ASSERT_TRUE(fleet.Tick(2, 8500, &id).ok());
  EXPECT_EQ(fleet.jobs().size(), 2u) << "not polled again within poll_ms";
  // The queue empties, then fills again: the 3 s wait starts over.
  ASSERT_TRUE(fleet.Tick(0, 9000, &id).ok());
  ASSERT_TRUE(fleet.Tick(1, 10000, &id).ok());
  EXPECT_EQ(id, "");
  ASSERT_TRUE(fleet.Tick(1, 13000, &id).ok());
  EXPECT_EQ(id, "103");
}

TEST_F(SlurmFleetRule, ErrorsOfSqueueAndSbatchAreReturned) {
  Write(dir_ + "/queue", "garbage line here\n");
  SlurmFleet fleet(options_);
  std::string id;
  Status s = fleet.Tick(1, 0, &id);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is not 'JOBID STATE'"), std::string::npos) << s.message();
  Write(dir_ + "/queue", "");
  options_.sbatch = dir_ + "/missing-sbatch";
  SlurmFleet broken(options_);
  ASSERT_TRUE(broken.Tick(1, 0, &id).ok());
  s = broken.Tick(1, 5000, &id);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("missing-sbatch"), std::string::npos) << s.message();
  EXPECT_EQ(id, "");
}

}  // namespace
}  // namespace keel
