// keeld's artifact store: the checkpoints workers upload, so that a run can
// resume on a host that never saw it and users can fetch them (keel fetch),
// without a shared filesystem. docs/service.md, "Artifacts".
//
// Two places hold them (keeld --artifact-store):
//
// dir (OpenDir; the default): files under a root directory (keeld
// --artifact-dir, default <state-dir>/artifacts):
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
// db (OpenInStore): keeld's store, the database that also holds its runs
// (Store's artifact methods; tables artifacts and artifact_chunks), so that a
// standby keeld on another host that takes over from the active one serves
// the checkpoints uploaded to it. An upload is a row that nobody lists, its
// verified chunks stored as they arrive; the commit makes it the run's
// checkpoint of that step (replacing one stored before) in one transaction.
// Uploads that were cut off are deleted at open.
//
// Both verify every chunk and file the same way (CheckpointReceiver), answer
// Steps, Find and Send the same way, and apply the same retention: Prune keeps
// the newest `keep` checkpoints of a run and the one keeld resumes it from
// (Run.artifact_step), whatever its age.
//
// Run ids and steps are checked before they become paths or rows
// (checkpoint_transfer.h CheckRunIdForPath, CheckCheckpointStep).
// Thread-safe: one mutex (mu_) orders commits, listings and deletions.
#ifndef KEEL_SERVER_ARTIFACT_STORE_H_
#define KEEL_SERVER_ARTIFACT_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/base/status.h"
#include "proto/keel.pb.h"
#include "server/store.h"
#include "worker/run/checkpoint_transfer.h"

namespace keel {

constexpr int kDefaultArtifactKeep = 3;

class ArtifactStore {
 public:
  // Files under `root`: creates it if missing and removes what interrupted
  // uploads and deletions left. keep >= 1.
  static Status OpenDir(const std::string& root, int keep, std::unique_ptr<ArtifactStore>* out);
  // Rows of `store` (which must outlive the artifact store): deletes the
  // uploads that were cut off. keep >= 1.
  static Status OpenInStore(Store* store, int keep, std::unique_ptr<ArtifactStore>* out);
  virtual ~ArtifactStore() = default;

  // Where the checkpoints are, for keeld's startup line: "DIR" or "the store's database".
  virtual std::string Where() const = 0;
  int keep() const { return keep_; }

  // A checkpoint's bytes on their way in: the backend's place for them
  // (a CheckpointSink) that becomes the checkpoint at Commit. Destroyed
  // without Commit: nothing of it stays.
  class Staging : public CheckpointSink {
   public:
    virtual Status Commit() = 0;  // called with the store's mu_ held
  };

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
    std::unique_ptr<Staging> staging_;             // null when already stored
    std::unique_ptr<CheckpointReceiver> receiver_;  // writes into staging_ (destroyed first)
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
  // A complete checkpoint's manifest. step 0: the newest. NOT_FOUND names the
  // run, the step and the steps there are.
  Status Find(const std::string& run_id, int64_t step, v1::CheckpointHeader* header);
  // Streams the checkpoint `header` (from Find) describes: the header, then
  // its files' bytes (checkpoint_transfer.h SendCheckpoint).
  Status Send(const v1::CheckpointHeader& header, const std::function<bool(const v1::CheckpointChunk&)>& write);
  // Deletes all but the newest keep() checkpoints of `run_id` and `protect`
  // (a step; 0: none).
  Status Prune(const std::string& run_id, int64_t protect);
  // Deletes the checkpoints of `run_id` after `step` (an abandoned trajectory:
  // the run rolled back to `step`); *newest: the newest left (0: none).
  Status DropAfter(const std::string& run_id, int64_t step, int64_t* newest);

 protected:
  explicit ArtifactStore(int keep) : keep_(keep) {}

  // What a backend provides; each *Locked one is called with mu_ held.
  // The complete checkpoints of a (checked) run id, ascending by step.
  virtual Status ListLocked(const std::string& run_id, std::vector<int64_t>* steps) = 0;
  // The stored manifest of a complete checkpoint.
  virtual Status ManifestLocked(const std::string& run_id, int64_t step, v1::CheckpointHeader* header) = 0;
  // Deletes a complete checkpoint (best effort: a failure leaves it listed).
  virtual void RemoveLocked(const std::string& run_id, int64_t step) = 0;
  // Where a new checkpoint's verified bytes go until its commit.
  virtual Status StageLocked(const v1::CheckpointHeader& header, std::unique_ptr<Staging>* out) = 0;
  // Send's work, without mu_ (a long stream must not hold up uploads): a
  // checkpoint deleted meanwhile ends it with an error.
  virtual Status SendUnlocked(const v1::CheckpointHeader& header,
                              const std::function<bool(const v1::CheckpointChunk&)>& write) = 0;

  std::mutex mu_;  // orders commits, listings and deletions

 private:
  const int keep_;
};

}  // namespace keel

#endif  // KEEL_SERVER_ARTIFACT_STORE_H_
