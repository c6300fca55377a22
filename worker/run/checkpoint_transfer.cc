// Checkpoint transfers and manifests (see checkpoint_transfer.h).
#include "worker/run/checkpoint_transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

#include "worker/io/crc32.h"
#include "worker/io/file_util.h"

namespace keel {
namespace {

const char kNameRule[] = "1 to 128 characters of A-Z a-z 0-9 . _ -, not starting with '.'";

bool NameAllowed(const std::string& name) {
  if (name.empty() || name.size() > 128 || name[0] == '.') return false;
  for (char c : name) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string Hex(uint32_t crc) {
  char text[16];
  std::snprintf(text, sizeof(text), "%08x", crc);
  return text;
}

// Writes all of `size` bytes to fd.
Status WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::Error("cannot write '" + path + "': " + std::strerror(errno));
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Reads up to `size` bytes (fewer only at the end of the file).
Status ReadSome(int fd, char* data, size_t size, const std::string& path, size_t* got) {
  *got = 0;
  while (*got < size) {
    const ssize_t n = read(fd, data + *got, size - *got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Error("cannot read '" + path + "': " + std::strerror(errno));
    if (n == 0) break;
    *got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Status CheckRunIdForPath(const std::string& field, const std::string& run_id) {
  if (!NameAllowed(run_id)) return Status::InvalidField(field, "'" + run_id + "' is not allowed (allowed: " + kNameRule + ")");
  return Status::Ok();
}

Status CheckCheckpointStep(const std::string& field, int64_t step) {
  if (step < 1 || step > 99999999) {
    return Status::InvalidField(field, std::to_string(step) + " is not allowed (allowed: 1 .. 99999999)");
  }
  return Status::Ok();
}

Status CheckCheckpointFileName(const std::string& field, const std::string& name) {
  if (!NameAllowed(name) || name == kManifestName) {
    return Status::InvalidField(field, "'" + name + "' is not allowed (allowed: " + kNameRule + ", other than " +
                                           kManifestName + ")");
  }
  return Status::Ok();
}

Status CheckCheckpointHeader(const v1::CheckpointHeader& header) {
  KEEL_RETURN_IF_ERROR(CheckRunIdForPath("run_id", header.run_id()));
  KEEL_RETURN_IF_ERROR(CheckCheckpointStep("step", header.step()));
  if (header.files_size() < 1 || header.files_size() > kMaxCheckpointFiles) {
    return Status::InvalidField("files", std::to_string(header.files_size()) + " files is not allowed (allowed: 1 .. " +
                                             std::to_string(kMaxCheckpointFiles) + ")");
  }
  for (int i = 0; i < header.files_size(); ++i) {
    const v1::CheckpointFile& f = header.files(i);
    const std::string field = "files[" + std::to_string(i) + "]";
    KEEL_RETURN_IF_ERROR(CheckCheckpointFileName(field + ".name", f.name()));
    if (i > 0 && f.name() <= header.files(i - 1).name()) {
      return Status::InvalidField(field + ".name", "'" + f.name() + "' after '" + header.files(i - 1).name() +
                                                       "' (allowed: distinct names in ascending order)");
    }
    if (f.size() < 0) return Status::InvalidField(field + ".size", std::to_string(f.size()) + " is not allowed (>= 0)");
  }
  return Status::Ok();
}

Status DescribeCheckpoint(const std::string& dir, v1::CheckpointHeader* header) {
  std::vector<std::string> names;
  KEEL_RETURN_IF_ERROR(ListDir(dir, &names));
  header->clear_files();
  std::vector<char> buffer(static_cast<size_t>(kChunkBytes));
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    KEEL_RETURN_IF_ERROR(CheckCheckpointFileName("checkpoint file '" + path + "'", name));
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::Error("cannot open '" + path + "': " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      return Status::InvalidArgument("checkpoint '" + dir + "': '" + name + "' is not a regular file");
    }
    uint32_t crc = 0;
    int64_t size = 0;
    for (;;) {
      size_t got = 0;
      Status s = ReadSome(fd, buffer.data(), buffer.size(), path, &got);
      if (!s.ok()) {
        close(fd);
        return s;
      }
      if (got == 0) break;
      crc = Crc32(crc, buffer.data(), got);
      size += static_cast<int64_t>(got);
    }
    close(fd);
    v1::CheckpointFile* f = header->add_files();
    f->set_name(name);
    f->set_size(size);
    f->set_crc32(crc);
  }
  return CheckCheckpointHeader(*header).WithPrefix("checkpoint '" + dir + "': ");
}

namespace {

// The files of a checkpoint directory, read in order (one open at a time).
class DirSource : public CheckpointSource {
 public:
  DirSource(std::string dir, const v1::CheckpointHeader& header) : dir_(std::move(dir)), header_(header) {}
  ~DirSource() override {
    if (fd_ >= 0) close(fd_);
  }
  Status Read(int index, int64_t offset, std::string* data) override {
    const v1::CheckpointFile& f = header_.files(index);
    const std::string path = dir_ + "/" + f.name();
    if (index != index_) {
      if (fd_ >= 0) close(fd_);
      index_ = index;
      fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) return Status::DataLoss("cannot open '" + path + "': " + std::strerror(errno));
    }
    if (fd_ < 0) return Status::DataLoss("'" + path + "' could not be opened");
    data->resize(static_cast<size_t>(std::min<int64_t>(kChunkBytes, f.size() - offset)));
    size_t got = 0;
    Status s = ReadSome(fd_, &(*data)[0], data->size(), path, &got);
    data->resize(got);
    return s;
  }

 private:
  const std::string dir_;
  const v1::CheckpointHeader& header_;
  int index_ = -1;
  int fd_ = -1;
};

// The files of a checkpoint directory, written as they come: each created
// (it must not exist), fsynced when complete, the directory fsynced at the end.
class DirSink : public CheckpointSink {
 public:
  DirSink(std::string dir, const v1::CheckpointHeader& header) : dir_(std::move(dir)), header_(header) {}
  ~DirSink() override {
    if (fd_ >= 0) close(fd_);
  }
  Status BeginFile(int index) override {
    const std::string path = Path(index);
    fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) return Status::Error("cannot create '" + path + "': " + std::strerror(errno));
    return Status::Ok();
  }
  Status Write(int index, int64_t, const std::string& data) override {
    return WriteAll(fd_, data.data(), data.size(), Path(index));
  }
  Status EndFile(int index) override {
    const int rc = fsync(fd_);
    close(fd_);
    fd_ = -1;
    if (rc != 0) return Status::Error("'" + Path(index) + "': fsync failed: " + std::strerror(errno));
    return Status::Ok();
  }
  Status Finish() override { return FsyncDir(dir_); }

 private:
  std::string Path(int index) const { return dir_ + "/" + header_.files(index).name(); }
  const std::string dir_;
  const v1::CheckpointHeader header_;
  int fd_ = -1;
};

}  // namespace

std::unique_ptr<CheckpointSink> DirectorySink(const std::string& dir, const v1::CheckpointHeader& header) {
  return std::make_unique<DirSink>(dir, header);
}

Status SendCheckpoint(const std::string& dir, const v1::CheckpointHeader& header,
                      const std::function<bool(const v1::CheckpointChunk&)>& write) {
  DirSource source(dir, header);
  return SendCheckpoint(&source, "checkpoint '" + dir + "'", header, write);
}

Status SendCheckpoint(CheckpointSource* source, const std::string& where, const v1::CheckpointHeader& header,
                      const std::function<bool(const v1::CheckpointChunk&)>& write) {
  v1::CheckpointChunk first;
  *first.mutable_header() = header;
  if (!write(first)) return Status::Unavailable("the stream broke before the header was sent");
  std::string data;
  for (int i = 0; i < header.files_size(); ++i) {
    const v1::CheckpointFile& f = header.files(i);
    const std::string at = where + ", file '" + f.name() + "'";
    uint32_t crc = 0;
    int64_t offset = 0;
    while (offset < f.size()) {
      KEEL_RETURN_IF_ERROR(source->Read(i, offset, &data).WithPrefix(at + ": "));
      if (data.empty() || static_cast<int64_t>(data.size()) > std::min<int64_t>(kChunkBytes, f.size() - offset)) {
        return Status::DataLoss(at + ": " + std::to_string(data.size()) + " bytes read at byte " +
                                std::to_string(offset) + " of " + std::to_string(f.size()) +
                                " (changed while being sent)");
      }
      v1::CheckpointChunk chunk;
      chunk.set_file(f.name());
      chunk.set_offset(offset);
      chunk.set_crc32(Crc32(0, data.data(), data.size()));
      crc = Crc32(crc, data.data(), data.size());
      offset += static_cast<int64_t>(data.size());
      chunk.set_data(std::move(data));
      data.clear();
      if (!write(chunk)) return Status::Unavailable("the stream broke at '" + f.name() + "' byte " + std::to_string(offset));
    }
    if (crc != f.crc32()) {
      return Status::DataLoss(at + ": CRC-32 " + Hex(crc) + " of its bytes does not match " + Hex(f.crc32()) +
                              " (corrupt, or changed while being sent)");
    }
  }
  return Status::Ok();
}

Status CheckpointReceiver::Start(const v1::CheckpointHeader& header, const std::string& dir,
                                 std::unique_ptr<CheckpointReceiver>* out) {
  KEEL_RETURN_IF_ERROR(CheckCheckpointHeader(header));
  std::unique_ptr<CheckpointSink> sink = DirectorySink(dir, header);
  std::unique_ptr<CheckpointReceiver> r;
  KEEL_RETURN_IF_ERROR(Start(header, sink.get(), &r));
  r->own_sink_ = std::move(sink);
  *out = std::move(r);
  return Status::Ok();
}

Status CheckpointReceiver::Start(const v1::CheckpointHeader& header, CheckpointSink* sink,
                                 std::unique_ptr<CheckpointReceiver>* out) {
  KEEL_RETURN_IF_ERROR(CheckCheckpointHeader(header));
  std::unique_ptr<CheckpointReceiver> r(new CheckpointReceiver);
  r->header_ = header;
  r->sink_ = sink;
  for (const v1::CheckpointFile& f : header.files()) r->total_ += f.size();
  KEEL_RETURN_IF_ERROR(r->OpenCurrent());
  *out = std::move(r);
  return Status::Ok();
}

CheckpointReceiver::~CheckpointReceiver() = default;

Status CheckpointReceiver::Fail(Status status) {
  if (failed_.ok()) failed_ = status;
  return status;
}

Status CheckpointReceiver::OpenCurrent() {
  written_ = 0;
  crc_ = 0;
  return sink_->BeginFile(current_);
}

Status CheckpointReceiver::CloseCurrent() {
  const v1::CheckpointFile& f = header_.files(current_);
  const std::string where = "run " + header_.run_id() + " step " + std::to_string(header_.step()) + ", file '" +
                            f.name() + "'";
  if (written_ != f.size()) {
    return Status::DataLoss(where + ": " + std::to_string(written_) + " of " + std::to_string(f.size()) +
                            " bytes arrived (incomplete)");
  }
  if (crc_ != f.crc32()) {
    return Status::DataLoss(where + ": CRC-32 " + Hex(crc_) + " of the bytes received does not match " +
                            Hex(f.crc32()) + " (corrupt)");
  }
  KEEL_RETURN_IF_ERROR(sink_->EndFile(current_).WithPrefix(where + ": "));
  ++current_;
  if (current_ < header_.files_size()) return OpenCurrent();
  return Status::Ok();
}

Status CheckpointReceiver::Add(const v1::CheckpointChunk& chunk) {
  KEEL_RETURN_IF_ERROR(failed_);
  if (chunk.has_header()) return Fail(Status::InvalidArgument("chunk: a second header (allowed: one, first)"));
  const uint32_t crc = Crc32(0, chunk.data().data(), chunk.data().size());
  const std::string at = "file '" + chunk.file() + "' offset " + std::to_string(chunk.offset());
  if (crc != chunk.crc32()) {
    return Fail(Status::DataLoss("run " + header_.run_id() + " step " + std::to_string(header_.step()) + ", " + at +
                                 ": chunk CRC-32 " + Hex(crc) + " does not match " + Hex(chunk.crc32()) + " (corrupt)"));
  }
  if (static_cast<int64_t>(chunk.data().size()) > kChunkBytes) {
    return Fail(Status::InvalidArgument(at + ": a chunk of " + std::to_string(chunk.data().size()) +
                                        " bytes (allowed: at most " + std::to_string(kChunkBytes) + ")"));
  }
  // Files come in header order: a chunk of a later file ends the current one.
  while (current_ < header_.files_size() && chunk.file() != header_.files(current_).name()) {
    Status s = CloseCurrent();
    if (!s.ok()) return Fail(s);
  }
  if (current_ >= header_.files_size()) {
    return Fail(Status::InvalidArgument(at + ": not a file of the header after the files already received "
                                             "(allowed: the header's files, in its order)"));
  }
  const v1::CheckpointFile& f = header_.files(current_);
  if (chunk.offset() != written_) {
    return Fail(Status::InvalidArgument(at + ": expected offset " + std::to_string(written_) +
                                        " (allowed: each file's bytes in order)"));
  }
  if (written_ + static_cast<int64_t>(chunk.data().size()) > f.size()) {
    return Fail(Status::InvalidArgument(at + ": " + std::to_string(chunk.data().size()) +
                                        " bytes run past the file's size " + std::to_string(f.size())));
  }
  Status s = sink_->Write(current_, written_, chunk.data());
  if (!s.ok()) return Fail(s);
  written_ += static_cast<int64_t>(chunk.data().size());
  bytes_ += static_cast<int64_t>(chunk.data().size());
  crc_ = Crc32(crc_, chunk.data().data(), chunk.data().size());
  return Status::Ok();
}

Status CheckpointReceiver::Finish() {
  KEEL_RETURN_IF_ERROR(failed_);
  while (current_ < header_.files_size()) {
    Status s = CloseCurrent();
    if (!s.ok()) return Fail(s);
  }
  return Fail(sink_->Finish());
}

Status ReceiveCheckpoint(const std::function<bool(v1::CheckpointChunk*)>& read, const std::string& expect_run,
                         int64_t expect_step, const std::string& dest, v1::CheckpointHeader* header,
                         const std::function<void(int64_t, int64_t)>& progress) {
  const std::string tmp = dest + ".tmp";
  struct stat st;
  if (stat(dest.c_str(), &st) == 0) return Status::FailedPrecondition("'" + dest + "' exists already");
  RemoveFlatDir(tmp);  // left by an earlier, interrupted transfer
  v1::CheckpointChunk chunk;
  if (!read(&chunk)) return Status::Unavailable("the stream ended before the header");
  if (!chunk.has_header()) return Status::InvalidArgument("the first chunk has no header");
  const v1::CheckpointHeader h = chunk.header();  // a copy: `chunk` is read into again
  if (h.run_id() != expect_run || (expect_step > 0 && h.step() != expect_step)) {
    return Status::InvalidArgument("asked for run " + expect_run + " step " + std::to_string(expect_step) + ", got run " +
                                   h.run_id() + " step " + std::to_string(h.step()));
  }
  KEEL_RETURN_IF_ERROR(MakeDirs(tmp));
  std::unique_ptr<CheckpointReceiver> receiver;
  Status s = CheckpointReceiver::Start(h, tmp, &receiver);
  while (s.ok() && read(&chunk)) {
    s = receiver->Add(chunk);
    if (s.ok() && progress) progress(receiver->bytes(), receiver->total_bytes());
  }
  if (s.ok() && receiver->bytes() < receiver->total_bytes()) {
    s = Status::Unavailable("the stream ended after " + std::to_string(receiver->bytes()) + " of " +
                            std::to_string(receiver->total_bytes()) + " bytes");
  }
  if (s.ok()) s = receiver->Finish();
  if (s.ok() && std::rename(tmp.c_str(), dest.c_str()) != 0) {
    s = Status::Error("cannot rename '" + tmp + "' to '" + dest + "': " + std::strerror(errno));
  }
  if (s.ok()) s = FsyncDir(DirName(dest));
  receiver.reset();  // its file closed before the directory goes
  if (!s.ok()) {
    RemoveFlatDir(tmp);
    return s;
  }
  *header = h;
  return Status::Ok();
}

std::string FormatManifest(const v1::CheckpointHeader& header) {
  std::string text = "keel-checkpoint 1\nrun " + header.run_id() + "\nstep " + std::to_string(header.step()) + "\n";
  for (const v1::CheckpointFile& f : header.files()) {
    text += "file " + Hex(f.crc32()) + " " + std::to_string(f.size()) + " " + f.name() + "\n";
  }
  return text;
}

Status ParseManifest(const std::string& where, const std::string& text, v1::CheckpointHeader* header) {
  std::istringstream in(text);
  std::string line;
  int number = 0;
  v1::CheckpointHeader h;
  auto bad = [&](const std::string& what) {
    return Status::DataLoss(where + ":" + std::to_string(number) + ": " + what + " (allowed: keel-checkpoint 1, "
                            "run ID, step N, then file CRC32HEX SIZE NAME lines)");
  };
  while (std::getline(in, line)) {
    ++number;
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (number == 1) {
      if (line != "keel-checkpoint 1") return bad("'" + line + "' is not the manifest's first line");
    } else if (key == "run" && number == 2) {
      words >> *h.mutable_run_id();
    } else if (key == "step" && number == 3) {
      int64_t step = 0;
      if (!(words >> step)) return bad("no step number");
      h.set_step(step);
    } else if (key == "file" && number > 3) {
      std::string crc, name;
      int64_t size = -1;
      if (!(words >> crc >> size >> name) || crc.size() != 8) return bad("'" + line + "' is not a file line");
      char* end = nullptr;
      const unsigned long value = std::strtoul(crc.c_str(), &end, 16);
      if (*end != '\0') return bad("'" + crc + "' is not a CRC-32 in hex");
      v1::CheckpointFile* f = h.add_files();
      f->set_name(name);
      f->set_size(size);
      f->set_crc32(static_cast<uint32_t>(value));
    } else {
      return bad("'" + line + "' is not expected here");
    }
  }
  if (number < 4) return bad("too short");
  Status s = CheckCheckpointHeader(h);
  if (!s.ok()) return Status::DataLoss(where + ": " + s.message());
  *header = h;
  return Status::Ok();
}

void RemoveFlatDir(const std::string& dir) {
  std::vector<std::string> names;
  if (ListDir(dir, &names).ok()) {
    for (const std::string& n : names) unlink((dir + "/" + n).c_str());
  }
  rmdir(dir.c_str());
}

}  // namespace keel
