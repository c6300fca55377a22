// Checkpoints on the wire (keel.proto CheckpointChunk): one sender and one
// receiver for every transfer (keel-worker -> keeld's artifact store on upload,
// keeld -> keel-worker on a restart elsewhere, keeld -> `keel fetch`), and the
// artifact store's MANIFEST text.
//
// A transfer is a header (run, step, every file's name, size and CRC-32) and
// then each file's bytes in header order, in chunks of at most kChunkBytes,
// each chunk with the CRC-32 of its data. The receiver writes each file as it
// comes, checks every chunk's CRC and offset, and at the end of each file its
// size and CRC against the header; a file is fsynced before the next begins.
// Nothing here decides where a verified checkpoint goes: the caller receives
// into a temporary directory and commits it (renames it) once Finish is OK,
// or gives the receiver a CheckpointSink of its own (keeld's artifact store in
// its database); a sender reads from a directory or from a CheckpointSource.
#ifndef KEEL_WORKER_RUN_CHECKPOINT_TRANSFER_H_
#define KEEL_WORKER_RUN_CHECKPOINT_TRANSFER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kernels/base/status.h"
#include "proto/keel.pb.h"

namespace keel {

constexpr int64_t kChunkBytes = int64_t{1} << 20;  // a chunk's data at most (1 MiB)
constexpr int kMaxCheckpointFiles = 64;            // files in one checkpoint at most
// The artifact store's completion mark of a checkpoint directory (not a
// checkpoint file: a checkpoint may not hold a file of this name).
constexpr char kManifestName[] = "MANIFEST";

// A run id as a directory name: 1 to 128 characters of A-Z a-z 0-9 . _ -, not
// starting with '.'. The error names `field`, the value and what is allowed.
Status CheckRunIdForPath(const std::string& field, const std::string& run_id);
// A checkpoint step: 1 .. 99999999 (the 8 digits of step_<8 digits>).
Status CheckCheckpointStep(const std::string& field, int64_t step);
// A checkpoint file name: as a run id, and not kManifestName.
Status CheckCheckpointFileName(const std::string& field, const std::string& name);
// The whole header: run id, step, 1 .. kMaxCheckpointFiles files with allowed,
// distinct, ascending names and sizes >= 0.
Status CheckCheckpointHeader(const v1::CheckpointHeader& header);

// Fills header->files with the regular files of checkpoint directory `dir`
// (ascending by name; their sizes and CRC-32s). Anything else in `dir`, or a
// name CheckCheckpointFileName refuses, is an error naming it.
Status DescribeCheckpoint(const std::string& dir, v1::CheckpointHeader* header);

// Where a checkpoint's bytes come from when it is sent: files in a directory
// (SendCheckpoint's `dir`), or rows of keeld's database.
class CheckpointSource {
 public:
  virtual ~CheckpointSource() = default;
  // The bytes of file `index` (of the header being sent) from `offset` on,
  // at most kChunkBytes and at least one (offset < the file's size): each
  // call continues where the previous one ended. Fewer bytes than remain are
  // fine; none is a DataLoss error naming the file and the offset.
  virtual Status Read(int index, int64_t offset, std::string* data) = 0;
};

// Sends `header` (one chunk), then the files of `dir` it lists. A file whose
// bytes no longer match the header (the trainer replaced or pruned it) is a
// DataLoss error; `write` returning false (the stream broke) is an error too.
Status SendCheckpoint(const std::string& dir, const v1::CheckpointHeader& header,
                      const std::function<bool(const v1::CheckpointChunk&)>& write);
// The same from `source`; errors read "<where>, file '<name>': ...".
Status SendCheckpoint(CheckpointSource* source, const std::string& where, const v1::CheckpointHeader& header,
                      const std::function<bool(const v1::CheckpointChunk&)>& write);

// Where a CheckpointReceiver puts the bytes it has verified: files in a
// directory (the default), or elsewhere (keeld's artifact store in its
// database). Calls come in this order: for each file of the header, BeginFile,
// Write for its bytes in order (each chunk after its CRC-32 and offset were
// checked), EndFile once its size and CRC-32 match the header; then Finish.
class CheckpointSink {
 public:
  virtual ~CheckpointSink() = default;
  virtual Status BeginFile(int index) = 0;
  virtual Status Write(int index, int64_t offset, const std::string& data) = 0;
  virtual Status EndFile(int index) = 0;
  // Every file complete and verified: make them durable.
  virtual Status Finish() = 0;
};

// The files of a checkpoint directory `dir` (which must exist; the files must
// not), each fsynced when complete and the directory at Finish: the sink of
// CheckpointReceiver::Start(header, dir).
std::unique_ptr<CheckpointSink> DirectorySink(const std::string& dir, const v1::CheckpointHeader& header);

// Writes one transfer's files into a directory, verifying as they come.
class CheckpointReceiver {
 public:
  // `header` is checked (CheckCheckpointHeader); `dir` must exist, and the
  // files must not.
  static Status Start(const v1::CheckpointHeader& header, const std::string& dir,
                      std::unique_ptr<CheckpointReceiver>* out);
  // The same into `sink`, which must outlive the receiver.
  static Status Start(const v1::CheckpointHeader& header, CheckpointSink* sink,
                      std::unique_ptr<CheckpointReceiver>* out);
  ~CheckpointReceiver();
  // One chunk after the header. Errors: a second header, a file not in the
  // header or out of order, an offset other than the bytes received so far,
  // more bytes than the file's size, a chunk or file CRC-32 that does not
  // match (DataLoss). After an error the receiver takes nothing more.
  Status Add(const v1::CheckpointChunk& chunk);
  // Every file complete and verified, and fsynced with the directory.
  Status Finish();
  const v1::CheckpointHeader& header() const { return header_; }
  int64_t bytes() const { return bytes_; }        // received so far
  int64_t total_bytes() const { return total_; }  // the header's files together

 private:
  CheckpointReceiver() = default;
  Status OpenCurrent();
  Status CloseCurrent();  // verifies size and CRC, ends the file, moves to the next one
  Status Fail(Status status);

  v1::CheckpointHeader header_;
  std::unique_ptr<CheckpointSink> own_sink_;  // the directory's, for Start(header, dir)
  CheckpointSink* sink_ = nullptr;
  int current_ = 0;        // index of the file being written
  int64_t written_ = 0;    // bytes of files[current_] so far
  uint32_t crc_ = 0;       // their CRC-32
  int64_t bytes_ = 0, total_ = 0;
  Status failed_ = Status::Ok();
};

// A whole transfer into the new directory `dest` (its parent must exist, and
// `dest` must not): written into `dest`.tmp, verified, then renamed to `dest`.
// `read` gives the next chunk (false: the stream ended; the caller then adds
// the RPC's status to the error). `expect_run` and `expect_step` (> 0) must be
// the header's. `progress`, when set, gets (bytes so far, total) after each
// chunk. On any error nothing is left at `dest` nor at `dest`.tmp.
Status ReceiveCheckpoint(const std::function<bool(v1::CheckpointChunk*)>& read, const std::string& expect_run,
                         int64_t expect_step, const std::string& dest, v1::CheckpointHeader* header,
                         const std::function<void(int64_t, int64_t)>& progress = nullptr);

// The artifact store's MANIFEST: "keel-checkpoint 1", "run ID", "step N",
// then "file CRC32HEX SIZE NAME" per file, each line ending in '\n'.
std::string FormatManifest(const v1::CheckpointHeader& header);
// Parses and checks (CheckCheckpointHeader) a MANIFEST; `where` names it in errors.
Status ParseManifest(const std::string& where, const std::string& text, v1::CheckpointHeader* header);

// Removes directory `dir` and the files in it (one level: checkpoints hold no
// subdirectories). Missing is fine.
void RemoveFlatDir(const std::string& dir);

}  // namespace keel

#endif  // KEEL_WORKER_RUN_CHECKPOINT_TRANSFER_H_
