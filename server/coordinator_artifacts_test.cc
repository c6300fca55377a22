// The coordinator's artifact hooks without a server: CheckUpload and
// CheckpointUploaded (which upload may land, which becomes the run's
// artifact_step) and FindArtifact, against a real SQLite store and a real
// artifact store directory. Refused calls change no state.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "server/artifact_store.h"
#include "server/coordinator.h"
#include "server/coordinator_test_util.h"

namespace keel {
namespace {

using coordinator_test::DbPath;
using coordinator_test::Fixture;
using coordinator_test::TestOptions;

std::string ArtifactDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/" + name + "-artifacts";
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
  return dir;
}

v1::CheckpointHeader Header(const std::string& run, int64_t attempt, int64_t step) {
  v1::CheckpointHeader h;
  h.set_run_id(run);
  h.set_attempt(attempt);
  h.set_step(step);
  return h;
}

TEST(CoordinatorArtifactsTest, OnlyTheCurrentAttemptsNewerCheckpointBecomesTheArtifactStep) {
  std::unique_ptr<ArtifactStore> store;
  ASSERT_TRUE(ArtifactStore::OpenDir(ArtifactDir("hooks"), 2, &store).ok());
  CoordinatorOptions options = TestOptions();
  options.artifacts = store.get();
  Fixture f(DbPath("artifact_hooks"), options);
  std::vector<v1::WorkerCommand> sent;
  const auto [worker, run] = f.OneRunOnAWorker(&sent, 1);
  ASSERT_FALSE(run.empty());
  auto artifact_step = [&] { return f.Runs("")[0].artifact_step(); };  // the only run

  EXPECT_TRUE(f.c->CheckUpload(worker, Header(run, 1, 100)).ok());
  // Another worker, another attempt, an unknown run: refused, naming why.
  grpc::Status s = f.c->CheckUpload("worker-404", Header(run, 1, 100));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("is not its current attempt"), std::string::npos) << s.error_message();
  EXPECT_EQ(f.c->CheckUpload(worker, Header(run, 2, 100)).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  s = f.c->CheckUpload(worker, Header("run-404", 1, 100));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("run-404"), std::string::npos) << s.error_message();

  bool recorded = true;
  int64_t protect = -1;
  // A committed upload of the current attempt becomes the artifact step.
  ASSERT_TRUE(f.c->CheckpointUploaded(worker, Header(run, 1, 100), &recorded, &protect).ok());
  EXPECT_TRUE(recorded);
  EXPECT_EQ(protect, 100);
  EXPECT_EQ(artifact_step(), 100);
  // An older one lands (uploads may finish out of order) but is not recorded.
  ASSERT_TRUE(f.c->CheckpointUploaded(worker, Header(run, 1, 50), &recorded, &protect).ok());
  EXPECT_FALSE(recorded);
  EXPECT_EQ(protect, 100);
  EXPECT_EQ(artifact_step(), 100);
  // A stale attempt's is refused and changes nothing; protect still names the recorded step.
  s = f.c->CheckpointUploaded(worker, Header(run, 2, 300), &recorded, &protect);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_FALSE(recorded);
  EXPECT_EQ(protect, 100);
  EXPECT_EQ(artifact_step(), 100);
  EXPECT_EQ(f.c->CheckpointUploaded("worker-404", Header(run, 1, 300), &recorded, &protect).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(artifact_step(), 100);
  EXPECT_EQ(f.c->CheckpointUploaded(worker, Header("run-404", 1, 300), &recorded, &protect).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // A newer one moves it on.
  ASSERT_TRUE(f.c->CheckpointUploaded(worker, Header(run, 1, 200), &recorded, &protect).ok());
  EXPECT_TRUE(recorded);
  EXPECT_EQ(protect, 200);
  EXPECT_EQ(artifact_step(), 200);

  // The artifact step is stored: a restarted keeld knows it.
  f.Reopen();
  EXPECT_EQ(artifact_step(), 200);

  // Nothing was written into the store by these hooks (the worker's upload
  // does that): FindArtifact says what it looked for.
  v1::CheckpointHeader found;
  s = f.c->FindArtifact(run, 200, &found);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find(run), std::string::npos) << s.error_message();
  EXPECT_EQ(f.c->FindArtifact("run-404", 0, &found).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(CoordinatorArtifactsTest, WithoutAnArtifactStoreTheHooksRefuse) {
  Fixture f(DbPath("artifact_none"));
  std::vector<v1::WorkerCommand> sent;
  const auto [worker, run] = f.OneRunOnAWorker(&sent, 1);
  EXPECT_EQ(f.c->CheckUpload(worker, Header(run, 1, 100)).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  v1::CheckpointHeader found;
  grpc::Status s = f.c->FindArtifact(run, 0, &found);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("no artifact store"), std::string::npos) << s.error_message();
}

}  // namespace
}  // namespace keel
