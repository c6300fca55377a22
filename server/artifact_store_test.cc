// The artifact store and the checkpoint transfer it receives, in both of its
// places (files under a directory; rows of keeld's store, here a real SQLite
// file): the commit protocol (complete only once committed; an interrupted
// upload leaves nothing), retention, checksum mismatches refused, bad run ids,
// steps and file names refused before they become paths or rows, reading a
// checkpoint back byte for byte, and a transfer's round trip.
#include "server/artifact_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "worker/io/file_util.h"
#include "worker/run/checkpoint_transfer.h"

namespace keel {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  EXPECT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  return dir;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// `size` bytes that differ with `seed`.
std::string Bytes(size_t size, uint32_t seed) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    seed = seed * 1664525u + 1013904223u;
    out[i] = static_cast<char>(seed >> 24);
  }
  return out;
}

// A checkpoint directory like keel-train's: model (2.5 chunks) and optimizer.
std::string MakeCheckpoint(const std::string& dir, uint32_t seed) {
  EXPECT_TRUE(MakeDirs(dir).ok());
  EXPECT_TRUE(WriteFileAtomic(dir + "/model.safetensors", Bytes(static_cast<size_t>(kChunkBytes * 5 / 2), seed)).ok());
  EXPECT_TRUE(WriteFileAtomic(dir + "/optimizer.safetensors", Bytes(1000, seed + 1)).ok());
  return dir;
}

v1::CheckpointHeader Describe(const std::string& dir, const std::string& run, int64_t step) {
  v1::CheckpointHeader h;
  h.set_run_id(run);
  h.set_step(step);
  Status s = DescribeCheckpoint(dir, &h);
  EXPECT_TRUE(s.ok()) << s.message();
  return h;
}

// Uploads checkpoint `dir` as run/step and commits it.
Status Upload(ArtifactStore* store, const std::string& dir, const std::string& run, int64_t step,
              bool* already_stored = nullptr) {
  std::unique_ptr<ArtifactStore::Upload> upload;
  KEEL_RETURN_IF_ERROR(store->BeginUpload(Describe(dir, run, step), &upload));
  if (already_stored) *already_stored = upload->already_stored();
  Status added = Status::Ok();
  KEEL_RETURN_IF_ERROR(SendCheckpoint(dir, upload->header(), [&](const v1::CheckpointChunk& c) {
    if (c.has_header()) return true;
    added = upload->Add(c);
    return added.ok();
  }));
  KEEL_RETURN_IF_ERROR(added);
  return upload->Commit();
}

std::vector<int64_t> Steps(ArtifactStore* store, const std::string& run) {
  std::vector<int64_t> steps;
  EXPECT_TRUE(store->Steps(run, &steps).ok());
  return steps;
}

std::string Read(const std::string& path) {
  std::string text;
  EXPECT_TRUE(ReadFile(path, &text).ok()) << path;
  return text;
}

// Every file of a stored checkpoint as Send streams it (name -> bytes); the
// chunks must come in order and match their CRC-32s (ReceiveCheckpoint checks).
std::map<std::string, std::string> ReadBack(ArtifactStore* store, const std::string& run, int64_t step,
                                            const std::string& scratch) {
  std::map<std::string, std::string> files;
  v1::CheckpointHeader h;
  Status s = store->Find(run, step, &h);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return files;
  std::vector<v1::CheckpointChunk> chunks;
  s = store->Send(h, [&](const v1::CheckpointChunk& c) {
    chunks.push_back(c);
    return true;
  });
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(std::system(("rm -rf '" + scratch + "'").c_str()), 0);
  size_t next = 0;
  v1::CheckpointHeader got;
  s = ReceiveCheckpoint(
      [&](v1::CheckpointChunk* c) {
        if (next == chunks.size()) return false;
        *c = chunks[next++];
        return true;
      },
      run, h.step(), scratch, &got);
  EXPECT_TRUE(s.ok()) << s.message();
  for (const v1::CheckpointFile& f : got.files()) files[f.name()] = Read(scratch + "/" + f.name());
  return files;
}

// One row count of a SQLite file, read with a connection of its own.
int64_t CountRows(const std::string& path, const std::string& table) {
  sqlite3* db = nullptr;
  int64_t n = -1;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* q = nullptr;
    const std::string sql = "SELECT COUNT(*) FROM " + table;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &q, nullptr) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW) {
      n = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
  }
  sqlite3_close(db);
  return n;
}

enum class Where { kDir, kDb };

// The store under test: files under <dir>/store, or rows of <dir>/keeld.db.
class ArtifactStoreTest : public ::testing::TestWithParam<Where> {
 protected:
  bool InDir() const { return GetParam() == Where::kDir; }
  void Open(const std::string& name, int keep) {
    dir_ = TempDir(name + (InDir() ? "_dir" : "_db"));
    keep_ = keep;
    Reopen();
  }
  // Closes the store and opens it again, as a restarted keeld does.
  void Reopen() {
    store_.reset();
    db_.reset();
    Status s;
    if (InDir()) {
      s = ArtifactStore::OpenDir(dir_ + "/store", keep_, &store_);
    } else {
      s = OpenSqliteStore(DbPath(), &db_);
      if (s.ok()) s = ArtifactStore::OpenInStore(db_.get(), keep_, &store_);
    }
    ASSERT_TRUE(s.ok()) << s.message();
  }
  std::string DbPath() const { return dir_ + "/keeld.db"; }
  // What is left of uploads, complete or not: directory entries of a run, or rows.
  int64_t Leftovers(const std::string& run) {
    if (!InDir()) return CountRows(DbPath(), "artifacts") + CountRows(DbPath(), "artifact_chunks");
    std::vector<std::string> names;
    if (!ListDir(dir_ + "/store/" + run, &names).ok()) return 0;
    return static_cast<int64_t>(names.size());
  }

  std::string dir_;
  int keep_ = 3;
  std::unique_ptr<Store> db_;
  std::unique_ptr<ArtifactStore> store_;
};

INSTANTIATE_TEST_SUITE_P(Places, ArtifactStoreTest, ::testing::Values(Where::kDir, Where::kDb),
                         [](const ::testing::TestParamInfo<Where>& info) {
                           return info.param == Where::kDir ? std::string("Dir") : std::string("Db");
                         });

TEST_P(ArtifactStoreTest, ACheckpointIsCompleteOnlyOnceCommittedAndReadsBackByteForByte) {
  Open("artifact_commit", 3);
  ArtifactStore* store = store_.get();
  const std::string ckpt = MakeCheckpoint(dir_ + "/ckpt", 1);
  std::unique_ptr<ArtifactStore::Upload> upload;
  ASSERT_TRUE(store->BeginUpload(Describe(ckpt, "run-1", 30), &upload).ok());
  int chunks = 0;
  ASSERT_TRUE(SendCheckpoint(ckpt, upload->header(), [&](const v1::CheckpointChunk& c) {
                if (!c.has_header()) {
                  EXPECT_TRUE(upload->Add(c).ok());
                }
                ++chunks;
                return true;
              }).ok());
  EXPECT_EQ(chunks, 1 + 3 + 1);  // the header, model in 3 chunks, optimizer in 1
  // Every byte is there, but nothing is listed before the commit.
  EXPECT_TRUE(Steps(store, "run-1").empty());
  v1::CheckpointHeader h;
  EXPECT_EQ(store->Find("run-1", 30, &h).code(), StatusCode::kNotFound);
  if (InDir()) EXPECT_FALSE(Exists(dir_ + "/store/run-1/step_00000030"));
  ASSERT_TRUE(upload->Commit().ok());
  upload.reset();
  EXPECT_EQ(Steps(store, "run-1"), std::vector<int64_t>({30}));
  std::map<std::string, std::string> back = ReadBack(store, "run-1", 30, dir_ + "/back");
  EXPECT_EQ(back.size(), 2u);
  EXPECT_EQ(back["model.safetensors"], Read(ckpt + "/model.safetensors"));
  EXPECT_EQ(back["optimizer.safetensors"], Read(ckpt + "/optimizer.safetensors"));
  // It survives a restart.
  Reopen();
  store = store_.get();
  EXPECT_EQ(Steps(store, "run-1"), std::vector<int64_t>({30}));
  EXPECT_EQ(ReadBack(store, "run-1", 0, dir_ + "/back2"), back);
  if (InDir()) {
    const std::string stored = dir_ + "/store/run-1/step_00000030";
    EXPECT_EQ(Read(stored + "/model.safetensors"), Read(ckpt + "/model.safetensors"));
    const std::string manifest = Read(stored + "/MANIFEST");
    EXPECT_EQ(manifest.rfind("keel-checkpoint 1\nrun run-1\nstep 30\nfile ", 0), 0u) << manifest;
    std::vector<std::string> names;
    ASSERT_TRUE(ListDir(dir_ + "/store/run-1", &names).ok());
    EXPECT_EQ(names, std::vector<std::string>({"step_00000030"}));  // no .incoming left
    // A directory without its MANIFEST is not a checkpoint.
    ASSERT_TRUE(MakeDirs(dir_ + "/store/run-1/step_00000040").ok());
    EXPECT_EQ(Steps(store, "run-1"), std::vector<int64_t>({30}));
  } else {
    EXPECT_EQ(CountRows(DbPath(), "artifacts"), 1);
    EXPECT_EQ(CountRows(DbPath(), "artifact_chunks"), 4);  // the chunks as they came
  }
}

TEST_P(ArtifactStoreTest, AnInterruptedUploadLeavesNothingThatLooksComplete) {
  Open("artifact_interrupted", 3);
  const std::string ckpt = MakeCheckpoint(dir_ + "/ckpt", 2);
  {
    std::unique_ptr<ArtifactStore::Upload> upload;
    ASSERT_TRUE(store_->BeginUpload(Describe(ckpt, "run-1", 10), &upload).ok());
    int sent = 0;
    // The stream breaks after two chunks of data.
    EXPECT_FALSE(SendCheckpoint(ckpt, upload->header(), [&](const v1::CheckpointChunk& c) {
                   if (!c.has_header()) {
                     EXPECT_TRUE(upload->Add(c).ok());
                   }
                   return ++sent <= 2;
                 }).ok());
    Status committed = upload->Commit();  // what a handler must not do, refused anyway
    EXPECT_EQ(committed.code(), StatusCode::kDataLoss) << committed.message();
    EXPECT_NE(committed.message().find("bytes arrived (incomplete)"), std::string::npos) << committed.message();
  }
  EXPECT_TRUE(Steps(store_.get(), "run-1").empty());
  EXPECT_EQ(Leftovers("run-1"), 0);
  // A keeld killed mid-upload leaves its partial upload: opening removes it.
  if (InDir()) {
    ASSERT_TRUE(MakeDirs(dir_ + "/store/run-1/.incoming-99-1").ok());
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/store/run-1/.incoming-99-1/model.safetensors", "part").ok());
  } else {
    int64_t id = 0;
    ASSERT_TRUE(db_->BeginArtifact("run-1", 10, "keel-checkpoint 1\n", &id).ok());
    ASSERT_TRUE(db_->AppendArtifactChunk(id, 0, 0, "part").ok());
  }
  EXPECT_GT(Leftovers("run-1"), 0);
  EXPECT_TRUE(Steps(store_.get(), "run-1").empty());
  Reopen();
  EXPECT_EQ(Leftovers("run-1"), 0);
}

TEST_P(ArtifactStoreTest, ChecksumMismatchesAreRefusedAndStoreNothing) {
  Open("artifact_crc", 3);
  const std::string ckpt = MakeCheckpoint(dir_ + "/ckpt", 3);
  // A chunk whose bytes changed in flight: its CRC no longer matches.
  {
    std::unique_ptr<ArtifactStore::Upload> upload;
    ASSERT_TRUE(store_->BeginUpload(Describe(ckpt, "run-1", 10), &upload).ok());
    Status refused = Status::Ok();
    SendCheckpoint(ckpt, upload->header(), [&](const v1::CheckpointChunk& c) {
      if (c.has_header()) return true;
      v1::CheckpointChunk bad = c;
      if (c.offset() == kChunkBytes) (*bad.mutable_data())[7] ^= 0x10;
      refused = upload->Add(bad);
      return refused.ok();
    });
    EXPECT_EQ(refused.code(), StatusCode::kDataLoss);
    EXPECT_NE(refused.message().find("run run-1 step 10, file 'model.safetensors' offset 1048576: chunk CRC-32"),
              std::string::npos)
        << refused.message();
    EXPECT_FALSE(upload->Commit().ok());  // a failed receiver takes nothing more
  }
  // A header whose file CRC is not the bytes' (each chunk consistent).
  {
    v1::CheckpointHeader h = Describe(ckpt, "run-1", 10);
    h.mutable_files(1)->set_crc32(h.files(1).crc32() ^ 1);
    std::unique_ptr<ArtifactStore::Upload> upload;
    ASSERT_TRUE(store_->BeginUpload(h, &upload).ok());
    v1::CheckpointHeader truth = Describe(ckpt, "run-1", 10);
    SendCheckpoint(ckpt, truth, [&](const v1::CheckpointChunk& c) { return c.has_header() || upload->Add(c).ok(); });
    Status committed = upload->Commit();
    EXPECT_EQ(committed.code(), StatusCode::kDataLoss);
    EXPECT_NE(committed.message().find("file 'optimizer.safetensors': CRC-32"), std::string::npos) << committed.message();
    EXPECT_NE(committed.message().find("(corrupt)"), std::string::npos);
  }
  EXPECT_TRUE(Steps(store_.get(), "run-1").empty());
  EXPECT_EQ(Leftovers("run-1"), 0);
}

TEST_P(ArtifactStoreTest, BadRunIdsStepsAndFileNamesAreRefusedBeforeTheyBecomePathsOrRows) {
  Open("artifact_names", 3);
  const std::string ckpt = MakeCheckpoint(dir_ + "/ckpt", 4);
  struct Case {
    std::string run;
    int64_t step;
    std::string file;  // renames files[0]
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"../escape", 10, "", "run_id: '../escape' is not allowed (allowed: 1 to 128 characters of A-Z a-z 0-9 . _ -"},
      {"a/b", 10, "", "run_id: 'a/b' is not allowed"},
      {".hidden", 10, "", "run_id: '.hidden' is not allowed"},
      {"", 10, "", "run_id: '' is not allowed"},
      {std::string(129, 'r'), 10, "", "is not allowed"},
      {"run-1", 0, "", "step: 0 is not allowed (allowed: 1 .. 99999999)"},
      {"run-1", -5, "", "step: -5 is not allowed"},
      {"run-1", 100000000, "", "step: 100000000 is not allowed"},
      {"run-1", 10, "../../x", "files[0].name: '../../x' is not allowed"},
      {"run-1", 10, "MANIFEST", "files[0].name: 'MANIFEST' is not allowed"},
      {"run-1", 10, "optimizer.safetensors", "files[1].name: 'optimizer.safetensors' after 'optimizer.safetensors'"},
  };
  for (const Case& c : cases) {
    v1::CheckpointHeader h = Describe(ckpt, "run-1", 10);
    h.set_run_id(c.run);
    h.set_step(c.step);
    if (!c.file.empty()) h.mutable_files(0)->set_name(c.file);
    std::unique_ptr<ArtifactStore::Upload> upload;
    Status s = store_->BeginUpload(h, &upload);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.run << " " << c.step << " " << c.file;
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << s.message();
  }
  v1::CheckpointHeader h;
  EXPECT_EQ(store_->Find("../state", 0, &h).code(), StatusCode::kInvalidArgument);
  std::vector<int64_t> steps;
  EXPECT_EQ(store_->Steps("..", &steps).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Prune("../x", 0).code(), StatusCode::kInvalidArgument);
  // Nothing was created anywhere.
  if (InDir()) {
    std::vector<std::string> names;
    ASSERT_TRUE(ListDir(dir_ + "/store", &names).ok());
    EXPECT_TRUE(names.empty());
    ASSERT_TRUE(ListDir(dir_, &names).ok());
    EXPECT_EQ(names, std::vector<std::string>({"ckpt", "store"}));
  } else {
    EXPECT_EQ(Leftovers(""), 0);
  }
  // Bad keep.
  std::unique_ptr<ArtifactStore> other;
  EXPECT_EQ(ArtifactStore::OpenDir(dir_ + "/other", 0, &other).message(),
            "--artifact-keep: 0 is not allowed (allowed: >= 1)");
  std::unique_ptr<Store> db;
  ASSERT_TRUE(OpenSqliteStore(dir_ + "/other.db", &db).ok());
  EXPECT_EQ(ArtifactStore::OpenInStore(db.get(), 0, &other).message(),
            "--artifact-keep: 0 is not allowed (allowed: >= 1)");
}

TEST_P(ArtifactStoreTest, RetentionKeepsTheNewestAndTheOneTheRunResumesFrom) {
  Open("artifact_retention", 2);
  ArtifactStore* store = store_.get();
  const std::string ckpt = MakeCheckpoint(dir_ + "/ckpt", 5);
  for (int64_t step : {10, 20, 30, 40}) {
    Status s = Upload(store, ckpt, "run-1", step);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_TRUE(store->Prune("run-1", /*protect=*/10).ok());
  }
  EXPECT_EQ(Steps(store, "run-1"), std::vector<int64_t>({10, 30, 40}));
  ASSERT_TRUE(store->Prune("run-1", 0).ok());
  EXPECT_EQ(Steps(store, "run-1"), std::vector<int64_t>({30, 40}));
  // Another run's checkpoints are its own.
  ASSERT_TRUE(Upload(store, ckpt, "run-2", 5).ok());
  ASSERT_TRUE(store->Prune("run-2", 0).ok());
  EXPECT_EQ(Steps(store, "run-1"), std::vector<int64_t>({30, 40}));
  EXPECT_EQ(Steps(store, "run-2"), std::vector<int64_t>({5}));
  // A rollback to 35 abandons 40.
  int64_t newest = -1;
  ASSERT_TRUE(store->DropAfter("run-1", 35, &newest).ok());
  EXPECT_EQ(newest, 30);
  EXPECT_EQ(Steps(store, "run-1"), std::vector<int64_t>({30}));
  if (InDir()) {
    std::vector<std::string> names;
    ASSERT_TRUE(ListDir(dir_ + "/store/run-1", &names).ok());
    EXPECT_EQ(names, std::vector<std::string>({"step_00000030"}));  // no .removed left
  } else {
    // Two checkpoints (run-1 step 30, run-2 step 5) of 4 chunks each: the
    // deleted ones took their chunks with them.
    EXPECT_EQ(CountRows(DbPath(), "artifacts"), 2);
    EXPECT_EQ(CountRows(DbPath(), "artifact_chunks"), 8);
  }
}

TEST_P(ArtifactStoreTest, UploadingTheSameCheckpointAgainIsHarmlessAndANewOneOfTheStepReplacesIt) {
  Open("artifact_idempotent", 3);
  ArtifactStore* store = store_.get();
  const std::string ckpt = MakeCheckpoint(dir_ + "/ckpt", 6);
  bool already = true;
  ASSERT_TRUE(Upload(store, ckpt, "run-1", 20, &already).ok());
  EXPECT_FALSE(already);
  ASSERT_TRUE(Upload(store, ckpt, "run-1", 20, &already).ok());
  EXPECT_TRUE(already);
  EXPECT_EQ(Steps(store, "run-1"), std::vector<int64_t>({20}));
  // Step 20 again after a rollback: other weights, which replace the old ones.
  const std::string other = MakeCheckpoint(dir_ + "/other", 7);
  ASSERT_TRUE(Upload(store, other, "run-1", 20, &already).ok());
  EXPECT_FALSE(already);
  EXPECT_EQ(Steps(store, "run-1"), std::vector<int64_t>({20}));
  EXPECT_EQ(ReadBack(store, "run-1", 20, dir_ + "/back")["model.safetensors"], Read(other + "/model.safetensors"));
  if (InDir()) {
    EXPECT_EQ(Read(dir_ + "/store/run-1/step_00000020/model.safetensors"), Read(other + "/model.safetensors"));
    std::vector<std::string> names;
    ASSERT_TRUE(ListDir(dir_ + "/store/run-1", &names).ok());
    EXPECT_EQ(names, std::vector<std::string>({"step_00000020"}));
  } else {
    EXPECT_EQ(CountRows(DbPath(), "artifacts"), 1);
    EXPECT_EQ(CountRows(DbPath(), "artifact_chunks"), 4);
  }
}

TEST_P(ArtifactStoreTest, FindNamesTheRunTheStepAndWhatExists) {
  Open("artifact_find", 3);
  ArtifactStore* store = store_.get();
  v1::CheckpointHeader h;
  Status s = store->Find("run-9", 0, &h);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "run run-9: no checkpoint in the artifact store (steps stored: none)");
  const std::string ckpt = MakeCheckpoint(dir_ + "/ckpt", 8);
  ASSERT_TRUE(Upload(store, ckpt, "run-9", 10).ok());
  ASSERT_TRUE(Upload(store, ckpt, "run-9", 20).ok());
  s = store->Find("run-9", 15, &h);
  EXPECT_EQ(s.message(), "run run-9: no checkpoint of step 15 in the artifact store (steps stored: 10, 20)");
  ASSERT_TRUE(store->Find("run-9", 0, &h).ok());
  EXPECT_EQ(h.step(), 20);
  EXPECT_EQ(h.run_id(), "run-9");
  EXPECT_EQ(h.files_size(), 2);
  if (InDir()) {
    // A manifest that was tampered with is refused, naming it.
    const std::string found = dir_ + "/store/run-9/step_00000020";
    ASSERT_TRUE(WriteFileAtomic(found + "/MANIFEST", "keel-checkpoint 1\nrun run-9\nstep 20\nfile zz 1 x\n").ok());
    s = store->Find("run-9", 20, &h);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("MANIFEST:4: 'file zz 1 x' is not a file line"), std::string::npos) << s.message();
  } else {
    // A chunk that went missing from the database ends the stream with an
    // error naming the checkpoint, the file and the byte.
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(DbPath().c_str(), &raw), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(raw, "DELETE FROM artifact_chunks WHERE byte_offset = 1048576 AND artifact_id = "
                                "(SELECT id FROM artifacts WHERE step = 20)",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(raw);
    s = store->Send(h, [](const v1::CheckpointChunk&) { return true; });
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.message();
    EXPECT_NE(s.message().find("run run-9 step 20 in the store, file 'model.safetensors': no stored bytes at byte 1048576"),
              std::string::npos)
        << s.message();
  }
}

TEST(CheckpointTransferTest, ARoundTripIsByteExactAndACorruptTransferLeavesNothing) {
  const std::string dir = TempDir("transfer_round_trip");
  const std::string ckpt = MakeCheckpoint(dir + "/ckpt", 9);
  const v1::CheckpointHeader header = Describe(ckpt, "run-3", 40);
  auto transfer = [&](bool corrupt, const std::string& dest, v1::CheckpointHeader* got) {
    std::vector<v1::CheckpointChunk> chunks;
    EXPECT_TRUE(SendCheckpoint(ckpt, header, [&](const v1::CheckpointChunk& c) {
                  chunks.push_back(c);
                  return true;
                }).ok());
    if (corrupt) (*chunks[2].mutable_data())[0] ^= 1;
    size_t next = 0;
    int64_t last_progress = 0;
    Status s = ReceiveCheckpoint(
        [&](v1::CheckpointChunk* c) {
          if (next == chunks.size()) return false;
          *c = chunks[next++];
          return true;
        },
        "run-3", 40, dest, got, [&](int64_t bytes, int64_t total) {
          EXPECT_GT(bytes, last_progress);
          EXPECT_LE(bytes, total);
          last_progress = bytes;
        });
    return s;
  };
  v1::CheckpointHeader got;
  Status s = transfer(false, dir + "/copy", &got);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(got.step(), 40);
  EXPECT_EQ(Read(dir + "/copy/model.safetensors"), Read(ckpt + "/model.safetensors"));
  EXPECT_EQ(Read(dir + "/copy/optimizer.safetensors"), Read(ckpt + "/optimizer.safetensors"));
  s = transfer(true, dir + "/bad", &got);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.message();
  EXPECT_FALSE(Exists(dir + "/bad"));
  EXPECT_FALSE(Exists(dir + "/bad.tmp"));
  // An existing destination is never overwritten.
  s = transfer(false, dir + "/copy", &got);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace keel
