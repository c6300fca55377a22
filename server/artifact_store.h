// keeld's artifact store: the checkpoints workers upload, so that a run can
// resume on a host that never saw it and users can fetch them (keel fetch),
// without a shared filesystem. docs/service.md, "Artifacts".
//
// Layout under the root (keeld --artifact-dir, default <state-dir>/artifacts):
//   <root>/<run id>/step_<8 digits>/<the checkpoint's files> + MANIFEST
//   <root>/<run id>/.incoming-<n>/   an upload in progress (removed at Open)
//   <root>/<run id>/.removed-<n>/    a checkpoint being deleted (removed at Open)
// Commit protocol: an upload is received into .incoming-<n> (every file and
// chunk verified against the header's sizes and CRC-32s, each file fsynced),
// then MANIFEST is written there (temp name, fsync, rename, directory fsync),
// then the directory is renamed to step_<8 digits> (an existing one of the same
// step is swapped out atomically, RENAME_EXCHANGE, and deleted). So a
// step_<8 digits> directory is always complete: a checkpoint exists exactly
// when its directory has a MANIFEST, and an interrupted upload leaves only an
// .incoming directory, which nobody lists.
//
// Retention: Prune keeps the newest `keep` checkpoints of a run and the one
// keeld resumes it from (Run.artifact_step), whatever its age.
//
// Run ids and steps are checked before they become paths (checkpoint_transfer.h
// CheckRunIdForPath, CheckCheckpointStep): nothing outside the root is named.
// Thread-safe: one mutex (mu_) orders commits and deletions.
#ifndef KEEL_SERVER_ARTIFACT_STORE_H_
#define KEEL_SERVER_ARTIFACT_STORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/base/status.h"
#include "proto/keel.pb.h"
#include "worker/run/checkpoint_transfer.h"

namespace keel {

constexpr int kDefaultArtifactKeep = 3;

class ArtifactStore {
 public:
  // Creates `root` if missing and removes what interrupted uploads and
  // deletions left. keep >= 1.
  static Status Open(const std::string& root, int keep, std::unique_ptr<ArtifactStore>* out);

  // One checkpoint being received. Destroyed without Commit: nothing of it stays.
  class Upload {
   public:
    ~Upload();
    Status Add(const v1::CheckpointChunk& chunk);
    // Verifies that every byte arrived, then commits (the file comment). OK
    // at once for already_stored().
    Status Commit();
    // A checkpoint of this run and step with the same files (names, sizes,
    // CRC-32s) is complete already: the upload needs no bytes.
    bool already_stored() const { return already_stored_; }
    int64_t bytes() const { return receiver_ ? receiver_->bytes() : received_; }  // received so far
    const v1::CheckpointHeader& header() const { return header_; }

   private:
    friend class ArtifactStore;
    ArtifactStore* store_ = nullptr;
    v1::CheckpointHeader header_;
    std::string incoming_;  // its .incoming directory ("" when already stored)
    std::unique_ptr<CheckpointReceiver> receiver_;
    int64_t received_ = 0;  // bytes, once receiver_ is gone
    bool already_stored_ = false;
    bool committed_ = false;
  };
  // Starts receiving the checkpoint `header` describes (checked: run id,
  // step, file names and sizes; INVALID_ARGUMENT naming the field).
  Status BeginUpload(const v1::CheckpointHeader& header, std::unique_ptr<Upload>* out);

  // The complete checkpoints of `run_id`, ascending (empty: none, or an
  // unknown run).
  Status Steps(const std::string& run_id, std::vector<int64_t>* steps);
  // A complete checkpoint: its manifest and directory. step 0: the newest.
  // NOT_FOUND names the run, the step and the steps there are.
  Status Find(const std::string& run_id, int64_t step, v1::CheckpointHeader* header, std::string* dir);
  // Deletes all but the newest keep() checkpoints of `run_id` and `protect`
  // (a step; 0: none).
  Status Prune(const std::string& run_id, int64_t protect);
  // Deletes the checkpoints of `run_id` after `step` (an abandoned trajectory:
  // the run rolled back to `step`); *newest: the newest left (0: none).
  Status DropAfter(const std::string& run_id, int64_t step, int64_t* newest);

  const std::string& root() const { return root_; }
  int keep() const { return keep_; }

 private:
  ArtifactStore() = default;
  std::string RunDirOf(const std::string& run_id) const { return root_ + "/" + run_id; }
  // Renames a checkpoint directory away (.removed-<n>) and deletes it. mu_ held.
  void RemoveLocked(const std::string& run_id, int64_t step);
  Status StepsLocked(const std::string& run_id, std::vector<int64_t>* steps);
  std::string Unique(const std::string& prefix);

  std::string root_;
  int keep_ = kDefaultArtifactKeep;
  std::mutex mu_;  // guards counter_ and orders commits, listings and deletions
  uint64_t counter_ = 0;
};

}  // namespace keel

#endif  // KEEL_SERVER_ARTIFACT_STORE_H_
