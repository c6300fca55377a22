// keeld's artifact store (see artifact_store.h): what both places share
// (uploads, steps, retention), then the directory and the database.
#include "server/artifact_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "worker/io/file_util.h"
#include "worker/run/checkpoint_dirs.h"

namespace keel {
namespace {

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

// renameat2(RENAME_EXCHANGE) through syscall: glibc's wrapper is newer than
// some of the systems keeld builds on.
int ExchangePaths(const std::string& a, const std::string& b) {
  return static_cast<int>(syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE));
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string StepList(const std::vector<int64_t>& steps) {
  if (steps.empty()) return "none";
  std::string text;
  for (int64_t s : steps) text += (text.empty() ? "" : ", ") + std::to_string(s);
  return text;
}

bool SameFiles(const v1::CheckpointHeader& a, const v1::CheckpointHeader& b) {
  if (a.files_size() != b.files_size()) return false;
  for (int i = 0; i < a.files_size(); ++i) {
    if (a.files(i).name() != b.files(i).name() || a.files(i).size() != b.files(i).size() ||
        a.files(i).crc32() != b.files(i).crc32()) {
      return false;
    }
  }
  return true;
}

Status CheckKeep(int keep) {
  if (keep < 1) return Status::InvalidField("--artifact-keep", std::to_string(keep) + " is not allowed (allowed: >= 1)");
  return Status::Ok();
}

// A stored manifest that must name the checkpoint it was stored as.
Status ParseStoredManifest(const std::string& where, const std::string& text, const std::string& run_id, int64_t step,
                           v1::CheckpointHeader* header) {
  KEEL_RETURN_IF_ERROR(ParseManifest(where, text, header));
  if (header->run_id() != run_id || header->step() != step) {
    return Status::DataLoss(where + ": names run " + header->run_id() + " step " + std::to_string(header->step()) +
                            ", not run " + run_id + " step " + std::to_string(step));
  }
  return Status::Ok();
}

// ---- dir: files under a root directory ----------------------------------------

class DirArtifactStore : public ArtifactStore {
 public:
  DirArtifactStore(std::string root, int keep) : ArtifactStore(keep), root_(std::move(root)) {}

  std::string Where() const override { return root_; }

 protected:
  Status ListLocked(const std::string& run_id, std::vector<int64_t>* steps) override {
    steps->clear();
    const std::string run_dir = RunDirOf(run_id);
    for (const auto& c : ListCheckpoints(run_dir)) {
      if (Exists(run_dir + "/" + c.second + "/" + kManifestName)) steps->push_back(c.first);
    }
    return Status::Ok();
  }

  Status ManifestLocked(const std::string& run_id, int64_t step, v1::CheckpointHeader* header) override {
    const std::string path = StepDir(run_id, step) + "/" + kManifestName;
    std::string text;
    KEEL_RETURN_IF_ERROR(ReadFile(path, &text));
    return ParseStoredManifest(path, text, run_id, step, header);
  }

  void RemoveLocked(const std::string& run_id, int64_t step) override {
    const std::string dir = StepDir(run_id, step);
    const std::string away = RunDirOf(run_id) + "/" + UniqueLocked(".removed-");
    // The rename makes it vanish at once; deleting its files may then take a while.
    if (std::rename(dir.c_str(), away.c_str()) == 0) RemoveFlatDir(away);
  }

  Status StageLocked(const v1::CheckpointHeader& header, std::unique_ptr<Staging>* out) override {
    const std::string run_dir = RunDirOf(header.run_id());
    KEEL_RETURN_IF_ERROR(MakeDirs(run_dir));
    const std::string incoming = run_dir + "/" + UniqueLocked(".incoming-");
    KEEL_RETURN_IF_ERROR(MakeDirs(incoming));
    *out = std::make_unique<DirStaging>(this, header, incoming);
    return Status::Ok();
  }

  Status SendUnlocked(const v1::CheckpointHeader& header,
                      const std::function<bool(const v1::CheckpointChunk&)>& write) override {
    return SendCheckpoint(StepDir(header.run_id(), header.step()), header, write);
  }

 private:
  // Files written into .incoming-<n> (checkpoint_transfer.h DirectorySink),
  // then renamed into place (the file comment).
  class DirStaging : public Staging {
   public:
    DirStaging(DirArtifactStore* store, const v1::CheckpointHeader& header, std::string incoming)
        : store_(store), header_(header), incoming_(std::move(incoming)), files_(DirectorySink(incoming_, header)) {}
    ~DirStaging() override {
      files_.reset();  // its file closed before the directory goes
      if (!incoming_.empty()) RemoveFlatDir(incoming_);
    }
    Status BeginFile(int index) override { return files_->BeginFile(index); }
    Status Write(int index, int64_t offset, const std::string& data) override {
      return files_->Write(index, offset, data);
    }
    Status EndFile(int index) override { return files_->EndFile(index); }
    Status Finish() override { return files_->Finish(); }

    Status Commit() override {
      const std::string run_dir = store_->RunDirOf(header_.run_id());
      const std::string final_dir = run_dir + "/" + CheckpointDirName(header_.step());
      KEEL_RETURN_IF_ERROR(WriteFileAtomic(incoming_ + "/" + kManifestName, FormatManifest(header_)));
      if (Exists(final_dir)) {
        // Another checkpoint of this step (after a rollback, the new trajectory's):
        // swapped in at once, the old one deleted from where the new one was.
        if (ExchangePaths(incoming_, final_dir) != 0) {
          return Status::Error("cannot exchange '" + incoming_ + "' and '" + final_dir + "': " + std::strerror(errno));
        }
        RemoveFlatDir(incoming_);  // the replaced checkpoint
      } else if (std::rename(incoming_.c_str(), final_dir.c_str()) != 0) {
        return Status::Error("cannot rename '" + incoming_ + "' to '" + final_dir + "': " + std::strerror(errno));
      }
      incoming_.clear();
      return FsyncDir(run_dir);
    }

   private:
    DirArtifactStore* const store_;
    const v1::CheckpointHeader header_;
    std::string incoming_;  // "" once committed
    std::unique_ptr<CheckpointSink> files_;
  };

  std::string RunDirOf(const std::string& run_id) const { return root_ + "/" + run_id; }
  std::string StepDir(const std::string& run_id, int64_t step) const {
    return RunDirOf(run_id) + "/" + CheckpointDirName(step);
  }
  std::string UniqueLocked(const std::string& prefix) {
    return prefix + std::to_string(getpid()) + "-" + std::to_string(++counter_);
  }

  const std::string root_;
  uint64_t counter_ = 0;  // guarded by mu_
};

// ---- db: rows of keeld's store ---------------------------------------------------

// Reads the chunks of a stored artifact at the offsets they were stored at
// (the sender asks for each next offset as the previous chunk ends).
class StoredChunks : public CheckpointSource {
 public:
  StoredChunks(Store* store, int64_t id) : store_(store), id_(id) {}
  Status Read(int index, int64_t offset, std::string* data) override {
    Status s = store_->ReadArtifactChunk(id_, index, offset, data);
    if (IsNotFound(s)) return Status::DataLoss("no stored bytes at byte " + std::to_string(offset) + " (deleted while being sent?)");
    return s;
  }

 private:
  Store* const store_;
  const int64_t id_;
};

class DbArtifactStore : public ArtifactStore {
 public:
  DbArtifactStore(Store* store, int keep) : ArtifactStore(keep), store_(store) {}

  std::string Where() const override { return "the store's database"; }

 protected:
  Status ListLocked(const std::string& run_id, std::vector<int64_t>* steps) override {
    std::vector<Store::StoredArtifact> stored;
    KEEL_RETURN_IF_ERROR(store_->ListArtifacts(run_id, &stored));
    steps->clear();
    for (const Store::StoredArtifact& a : stored) steps->push_back(a.step);
    return Status::Ok();
  }

  Status ManifestLocked(const std::string& run_id, int64_t step, v1::CheckpointHeader* header) override {
    Store::StoredArtifact a;
    KEEL_RETURN_IF_ERROR(FindRow(run_id, step, &a));
    return ParseStoredManifest("the manifest of run " + run_id + " step " + std::to_string(step) + " in the store",
                               a.manifest, run_id, step, header);
  }

  void RemoveLocked(const std::string& run_id, int64_t step) override {
    Store::StoredArtifact a;
    if (FindRow(run_id, step, &a).ok()) {
      Status s = store_->DeleteArtifact(a.id);
      if (!s.ok()) std::fprintf(stderr, "keeld: run %s: deleting checkpoint step %lld: %s\n", run_id.c_str(),
                                static_cast<long long>(step), s.message().c_str());
    }
  }

  Status StageLocked(const v1::CheckpointHeader& header, std::unique_ptr<Staging>* out) override {
    int64_t id = 0;
    KEEL_RETURN_IF_ERROR(store_->BeginArtifact(header.run_id(), header.step(), FormatManifest(header), &id));
    *out = std::make_unique<Rows>(store_, id);
    return Status::Ok();
  }

  Status SendUnlocked(const v1::CheckpointHeader& header,
                      const std::function<bool(const v1::CheckpointChunk&)>& write) override {
    Store::StoredArtifact a;
    KEEL_RETURN_IF_ERROR(FindRow(header.run_id(), header.step(), &a));
    StoredChunks chunks(store_, a.id);
    return SendCheckpoint(&chunks, "run " + header.run_id() + " step " + std::to_string(header.step()) + " in the store",
                          header, write);
  }

 private:
  // An upload's rows: each verified chunk stored as it comes.
  class Rows : public Staging {
   public:
    Rows(Store* store, int64_t id) : store_(store), id_(id) {}
    ~Rows() override {
      if (!committed_) store_->DeleteArtifact(id_);  // best effort; the next start deletes it otherwise
    }
    Status BeginFile(int) override { return Status::Ok(); }
    Status Write(int index, int64_t offset, const std::string& data) override {
      return store_->AppendArtifactChunk(id_, index, offset, data);
    }
    Status EndFile(int) override { return Status::Ok(); }
    Status Finish() override { return Status::Ok(); }  // every chunk was committed as it came
    Status Commit() override {
      KEEL_RETURN_IF_ERROR(store_->CommitArtifact(id_));
      committed_ = true;
      return Status::Ok();
    }

   private:
    Store* const store_;
    const int64_t id_;
    bool committed_ = false;
  };

  Status FindRow(const std::string& run_id, int64_t step, Store::StoredArtifact* out) {
    std::vector<Store::StoredArtifact> stored;
    KEEL_RETURN_IF_ERROR(store_->ListArtifacts(run_id, &stored));
    for (const Store::StoredArtifact& a : stored) {
      if (a.step == step) {
        *out = a;
        return Status::Ok();
      }
    }
    return Status::NotFound("run " + run_id + ": no checkpoint of step " + std::to_string(step) + " in the store");
  }

  Store* const store_;
};

}  // namespace

// ---- what both share ------------------------------------------------------------------

Status ArtifactStore::OpenDir(const std::string& root, int keep, std::unique_ptr<ArtifactStore>* out) {
  KEEL_RETURN_IF_ERROR(CheckKeep(keep));
  KEEL_RETURN_IF_ERROR(MakeDirs(root).WithPrefix("--artifact-dir: "));
  // What an interrupted upload or deletion left: never a complete checkpoint.
  std::vector<std::string> runs;
  KEEL_RETURN_IF_ERROR(ListDir(root, &runs));
  for (const std::string& run : runs) {
    std::vector<std::string> names;
    if (!ListDir(root + "/" + run, &names).ok()) continue;
    for (const std::string& n : names) {
      if (n.rfind(".incoming-", 0) == 0 || n.rfind(".removed-", 0) == 0) RemoveFlatDir(root + "/" + run + "/" + n);
    }
  }
  out->reset(new DirArtifactStore(root, keep));
  return Status::Ok();
}

Status ArtifactStore::OpenInStore(Store* store, int keep, std::unique_ptr<ArtifactStore>* out) {
  KEEL_RETURN_IF_ERROR(CheckKeep(keep));
  if (store == nullptr) return Status::InvalidArgument("OpenInStore: no store");
  // Uploads cut off by a crash (of this keeld, or of the one it took over from).
  KEEL_RETURN_IF_ERROR(store->DeleteUncommittedArtifacts().WithPrefix("--artifact-store db: "));
  out->reset(new DbArtifactStore(store, keep));
  return Status::Ok();
}

Status ArtifactStore::BeginUpload(const v1::CheckpointHeader& header, std::unique_ptr<Upload>* out) {
  KEEL_RETURN_IF_ERROR(CheckCheckpointHeader(header));
  std::unique_ptr<Upload> upload(new Upload);
  upload->store_ = this;
  upload->header_ = header;
  v1::CheckpointHeader stored;
  if (Find(header.run_id(), header.step(), &stored).ok() && SameFiles(stored, header)) {
    upload->already_stored_ = true;
    *out = std::move(upload);
    return Status::Ok();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    KEEL_RETURN_IF_ERROR(StageLocked(header, &upload->staging_));
  }
  KEEL_RETURN_IF_ERROR(CheckpointReceiver::Start(header, upload->staging_.get(), &upload->receiver_));
  *out = std::move(upload);
  return Status::Ok();
}

ArtifactStore::Upload::~Upload() {
  receiver_.reset();  // done with staging_ first
  staging_.reset();   // without a commit: removes what was received
}

Status ArtifactStore::Upload::Add(const v1::CheckpointChunk& chunk) {
  if (already_stored_) return Status::Ok();
  if (committed_) return Status::FailedPrecondition("chunk after the commit");
  return receiver_->Add(chunk);
}

Status ArtifactStore::Upload::Commit() {
  if (already_stored_) return Status::Ok();
  if (committed_) return Status::FailedPrecondition("committed already");
  if (receiver_->bytes() < receiver_->total_bytes()) {
    return Status::DataLoss("run " + header_.run_id() + " step " + std::to_string(header_.step()) + ": " +
                            std::to_string(receiver_->bytes()) + " of " + std::to_string(receiver_->total_bytes()) +
                            " bytes arrived (incomplete)");
  }
  KEEL_RETURN_IF_ERROR(receiver_->Finish());
  received_ = receiver_->bytes();
  receiver_.reset();
  std::lock_guard<std::mutex> lock(store_->mu_);
  KEEL_RETURN_IF_ERROR(staging_->Commit());
  committed_ = true;
  return Status::Ok();
}

Status ArtifactStore::Steps(const std::string& run_id, std::vector<int64_t>* steps) {
  KEEL_RETURN_IF_ERROR(CheckRunIdForPath("run_id", run_id));
  std::lock_guard<std::mutex> lock(mu_);
  return ListLocked(run_id, steps);
}

Status ArtifactStore::Find(const std::string& run_id, int64_t step, v1::CheckpointHeader* header) {
  KEEL_RETURN_IF_ERROR(CheckRunIdForPath("run_id", run_id));
  if (step != 0) KEEL_RETURN_IF_ERROR(CheckCheckpointStep("step", step));
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> steps;
  KEEL_RETURN_IF_ERROR(ListLocked(run_id, &steps));
  if (steps.empty() || (step != 0 && !std::binary_search(steps.begin(), steps.end(), step))) {
    return Status::NotFound("run " + run_id + ": " + (step == 0 ? "no checkpoint" : "no checkpoint of step " +
                                                                                        std::to_string(step)) +
                            " in the artifact store (steps stored: " + StepList(steps) + ")");
  }
  return ManifestLocked(run_id, step == 0 ? steps.back() : step, header);
}

Status ArtifactStore::Send(const v1::CheckpointHeader& header,
                           const std::function<bool(const v1::CheckpointChunk&)>& write) {
  KEEL_RETURN_IF_ERROR(CheckCheckpointHeader(header));
  return SendUnlocked(header, write);
}

Status ArtifactStore::Prune(const std::string& run_id, int64_t protect) {
  KEEL_RETURN_IF_ERROR(CheckRunIdForPath("run_id", run_id));
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> steps;
  KEEL_RETURN_IF_ERROR(ListLocked(run_id, &steps));
  const size_t kept = static_cast<size_t>(keep_);
  for (size_t i = 0; i + kept < steps.size(); ++i) {
    if (steps[i] != protect) RemoveLocked(run_id, steps[i]);
  }
  return Status::Ok();
}

Status ArtifactStore::DropAfter(const std::string& run_id, int64_t step, int64_t* newest) {
  KEEL_RETURN_IF_ERROR(CheckRunIdForPath("run_id", run_id));
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> steps;
  KEEL_RETURN_IF_ERROR(ListLocked(run_id, &steps));
  *newest = 0;
  for (int64_t s : steps) {
    if (s > step) {
      RemoveLocked(run_id, s);
    } else {
      *newest = s;
    }
  }
  return Status::Ok();
}

}  // namespace keel
