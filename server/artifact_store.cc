// keeld's artifact store (see artifact_store.h).
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

}  // namespace

Status ArtifactStore::Open(const std::string& root, int keep, std::unique_ptr<ArtifactStore>* out) {
  if (keep < 1) return Status::InvalidField("--artifact-keep", std::to_string(keep) + " is not allowed (allowed: >= 1)");
  KEEL_RETURN_IF_ERROR(MakeDirs(root).WithPrefix("--artifact-dir: "));
  std::unique_ptr<ArtifactStore> store(new ArtifactStore);
  store->root_ = root;
  store->keep_ = keep;
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
  *out = std::move(store);
  return Status::Ok();
}

std::string ArtifactStore::Unique(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  return prefix + std::to_string(getpid()) + "-" + std::to_string(++counter_);
}

Status ArtifactStore::BeginUpload(const v1::CheckpointHeader& header, std::unique_ptr<Upload>* out) {
  KEEL_RETURN_IF_ERROR(CheckCheckpointHeader(header));
  std::unique_ptr<Upload> upload(new Upload);
  upload->store_ = this;
  upload->header_ = header;
  v1::CheckpointHeader stored;
  std::string dir;
  if (Find(header.run_id(), header.step(), &stored, &dir).ok()) {
    bool same = stored.files_size() == header.files_size();
    for (int i = 0; same && i < header.files_size(); ++i) {
      same = stored.files(i).name() == header.files(i).name() && stored.files(i).size() == header.files(i).size() &&
             stored.files(i).crc32() == header.files(i).crc32();
    }
    if (same) {
      upload->already_stored_ = true;
      *out = std::move(upload);
      return Status::Ok();
    }
  }
  const std::string run_dir = RunDirOf(header.run_id());
  KEEL_RETURN_IF_ERROR(MakeDirs(run_dir));
  upload->incoming_ = run_dir + "/" + Unique(".incoming-");
  KEEL_RETURN_IF_ERROR(MakeDirs(upload->incoming_));
  Status s = CheckpointReceiver::Start(header, upload->incoming_, &upload->receiver_);
  if (!s.ok()) {
    RemoveFlatDir(upload->incoming_);
    return s;
  }
  *out = std::move(upload);
  return Status::Ok();
}

ArtifactStore::Upload::~Upload() {
  receiver_.reset();  // closes its file first
  if (!committed_ && !incoming_.empty()) RemoveFlatDir(incoming_);
}

Status ArtifactStore::Upload::Add(const v1::CheckpointChunk& chunk) {
  if (already_stored_) return Status::Ok();
  if (committed_) return Status::FailedPrecondition("chunk after the commit");
  return receiver_->Add(chunk);
}

Status ArtifactStore::Upload::Commit() {
  if (already_stored_) return Status::Ok();
  if (receiver_->bytes() < receiver_->total_bytes()) {
    return Status::DataLoss("run " + header_.run_id() + " step " + std::to_string(header_.step()) + ": " +
                            std::to_string(receiver_->bytes()) + " of " + std::to_string(receiver_->total_bytes()) +
                            " bytes arrived (incomplete)");
  }
  KEEL_RETURN_IF_ERROR(receiver_->Finish());
  received_ = receiver_->bytes();
  receiver_.reset();
  KEEL_RETURN_IF_ERROR(WriteFileAtomic(incoming_ + "/" + kManifestName, FormatManifest(header_)));
  const std::string run_dir = store_->RunDirOf(header_.run_id());
  const std::string final_dir = run_dir + "/" + CheckpointDirName(header_.step());
  std::lock_guard<std::mutex> lock(store_->mu_);
  if (Exists(final_dir)) {
    // Another checkpoint of this step (after a rollback, the new trajectory's):
    // swapped in at once, the old one deleted from where the new one was.
    if (ExchangePaths(incoming_, final_dir) != 0) {
      return Status::Error("cannot exchange '" + incoming_ + "' and '" + final_dir + "': " + std::strerror(errno));
    }
  } else if (std::rename(incoming_.c_str(), final_dir.c_str()) != 0) {
    return Status::Error("cannot rename '" + incoming_ + "' to '" + final_dir + "': " + std::strerror(errno));
  } else {
    incoming_.clear();
  }
  committed_ = true;
  if (!incoming_.empty()) RemoveFlatDir(incoming_);  // the replaced checkpoint
  incoming_.clear();
  return FsyncDir(run_dir);
}

Status ArtifactStore::StepsLocked(const std::string& run_id, std::vector<int64_t>* steps) {
  KEEL_RETURN_IF_ERROR(CheckRunIdForPath("run_id", run_id));
  steps->clear();
  const std::string run_dir = RunDirOf(run_id);
  for (const auto& c : ListCheckpoints(run_dir)) {
    if (Exists(run_dir + "/" + c.second + "/" + kManifestName)) steps->push_back(c.first);
  }
  return Status::Ok();
}

Status ArtifactStore::Steps(const std::string& run_id, std::vector<int64_t>* steps) {
  std::lock_guard<std::mutex> lock(mu_);
  return StepsLocked(run_id, steps);
}

Status ArtifactStore::Find(const std::string& run_id, int64_t step, v1::CheckpointHeader* header, std::string* dir) {
  std::vector<int64_t> steps;
  {
    std::lock_guard<std::mutex> lock(mu_);
    KEEL_RETURN_IF_ERROR(StepsLocked(run_id, &steps));
  }
  if (step != 0) KEEL_RETURN_IF_ERROR(CheckCheckpointStep("step", step));
  if (steps.empty() || (step != 0 && !std::binary_search(steps.begin(), steps.end(), step))) {
    return Status::NotFound("run " + run_id + ": " + (step == 0 ? "no checkpoint" : "no checkpoint of step " +
                                                                                        std::to_string(step)) +
                            " in the artifact store (steps stored: " + StepList(steps) + ")");
  }
  const int64_t chosen = step == 0 ? steps.back() : step;
  *dir = RunDirOf(run_id) + "/" + CheckpointDirName(chosen);
  std::string text;
  KEEL_RETURN_IF_ERROR(ReadFile(*dir + "/" + kManifestName, &text));
  KEEL_RETURN_IF_ERROR(ParseManifest(*dir + "/" + kManifestName, text, header));
  if (header->run_id() != run_id || header->step() != chosen) {
    return Status::DataLoss(*dir + "/" + kManifestName + ": names run " + header->run_id() + " step " +
                            std::to_string(header->step()) + ", not run " + run_id + " step " + std::to_string(chosen));
  }
  return Status::Ok();
}

void ArtifactStore::RemoveLocked(const std::string& run_id, int64_t step) {
  const std::string dir = RunDirOf(run_id) + "/" + CheckpointDirName(step);
  const std::string away = RunDirOf(run_id) + "/.removed-" + std::to_string(getpid()) + "-" + std::to_string(++counter_);
  // The rename makes it vanish at once; deleting its files may then take a while.
  if (std::rename(dir.c_str(), away.c_str()) == 0) RemoveFlatDir(away);
}

Status ArtifactStore::Prune(const std::string& run_id, int64_t protect) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> steps;
  KEEL_RETURN_IF_ERROR(StepsLocked(run_id, &steps));
  const size_t kept = static_cast<size_t>(keep_);
  for (size_t i = 0; i + kept < steps.size(); ++i) {
    if (steps[i] != protect) RemoveLocked(run_id, steps[i]);
  }
  return Status::Ok();
}

Status ArtifactStore::DropAfter(const std::string& run_id, int64_t step, int64_t* newest) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> steps;
  KEEL_RETURN_IF_ERROR(StepsLocked(run_id, &steps));
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
