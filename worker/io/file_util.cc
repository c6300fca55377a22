// POSIX implementations of the file helpers: open/read/write/fsync/rename, so
// that errors carry errno and the atomic write can fsync file and directory.
#include "worker/io/file_util.h"

#include <climits>
#include <cstdlib>
#include <glob.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace keel {
namespace {

Status PosixError(const std::string& what, const std::string& path, int error) {
  const std::string message = what + " " + path + ": " + std::strerror(error);
  return error == ENOENT ? Status::NotFound(message) : Status::Error(message);
}

// Closes the descriptor on scope exit unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

// Reads exactly `size` bytes at `offset`; *got is how many were read before
// end of file (== size on success).
Status PreadAll(int fd, const std::string& path, int64_t offset, size_t size, char* dest,
                size_t* got) {
  *got = 0;
  while (*got < size) {
    ssize_t n = ::pread(fd, dest + *got, size - *got, static_cast<off_t>(offset + *got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("cannot read", path, errno);
    }
    if (n == 0) break;  // end of file
    *got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status WriteAll(int fd, const std::string& path, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("cannot write", path, errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Status FileSize(const std::string& path, int64_t* size) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return PosixError("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) return Status::Error(path + " is not a regular file");
  *size = static_cast<int64_t>(st.st_size);
  return Status::Ok();
}

Status ReadFile(const std::string& path, std::string* contents) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return PosixError("cannot open", path, errno);
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return PosixError("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) return Status::Error(path + " is not a regular file");
  contents->assign(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  Status s = PreadAll(fd, path, 0, contents->size(), &(*contents)[0], &got);
  if (!s.ok()) return s;
  // The file shrank while we read it: keep what is there.
  contents->resize(got);
  return Status::Ok();
}

Status ReadFileRange(const std::string& path, int64_t offset, int64_t size, void* dest) {
  if (offset < 0 || size < 0) {
    return Status::Error("cannot read " + path + ": offset " + std::to_string(offset) +
                         " and size " + std::to_string(size) + " must be >= 0");
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return PosixError("cannot open", path, errno);
  FdCloser closer(fd);
  size_t got = 0;
  Status s = PreadAll(fd, path, offset, static_cast<size_t>(size), static_cast<char*>(dest), &got);
  if (!s.ok()) return s;
  if (got != static_cast<size_t>(size)) {
    return Status::Error("cannot read " + path + ": wanted bytes [" + std::to_string(offset) +
                         ", " + std::to_string(offset + size) + ") but the file ends at byte " +
                         std::to_string(offset + static_cast<int64_t>(got)));
  }
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, const std::vector<ByteSpan>& pieces) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return PosixError("cannot create", tmp, errno);
  Status s;
  for (const ByteSpan& piece : pieces) {
    s = WriteAll(fd, tmp, static_cast<const char*>(piece.data), piece.size);
    if (!s.ok()) break;
  }
  // fsync before rename: otherwise a crash can leave the new name on an empty file.
  if (s.ok() && ::fsync(fd) != 0) s = PosixError("cannot fsync", tmp, errno);
  if (::close(fd) != 0 && s.ok()) s = PosixError("cannot close", tmp, errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = PosixError("cannot rename " + tmp + " to", path, errno);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  // Make the rename itself durable.
  return FsyncDir(DirName(path));
}

Status FsyncDir(const std::string& dir) {
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return PosixError("cannot open directory", dir, errno);
  FdCloser dir_closer(dir_fd);
  if (::fsync(dir_fd) != 0) return PosixError("cannot fsync directory", dir, errno);
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, const std::string& contents) {
  return WriteFileAtomic(path, {ByteSpan{contents.data(), contents.size()}});
}

std::string AbsolutePath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

Status MakeDirs(const std::string& path) {
  if (path.empty()) return Status::Error("cannot create a directory with an empty path");
  // Create each prefix ending before a '/', then the whole path.
  for (size_t pos = path.find('/', 1);; pos = path.find('/', pos + 1)) {
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      return PosixError("cannot create directory", prefix, errno);
    }
    if (pos == std::string::npos) break;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return PosixError("cannot stat", path, errno);
  if (!S_ISDIR(st.st_mode)) return Status::Error("cannot create directory " + path +
                                                 ": a file that is not a directory is there");
  return Status::Ok();
}

Status ListDir(const std::string& path, std::vector<std::string>* names) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return PosixError("cannot open directory", path, errno);
  names->clear();
  errno = 0;
  while (struct dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names->push_back(name);
    errno = 0;
  }
  const int error = errno;
  ::closedir(dir);
  if (error != 0) return PosixError("cannot read directory", path, error);
  std::sort(names->begin(), names->end());
  return Status::Ok();
}

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status CheckInsideRoots(const std::string& field, const std::string& pattern, const std::vector<std::string>& roots) {
  std::vector<std::string> resolved_roots;
  std::string listed;
  for (const std::string& root : roots) {
    listed += (listed.empty() ? "" : ", ") + root;
    char buffer[PATH_MAX];
    if (realpath(root.c_str(), buffer) != nullptr) resolved_roots.push_back(buffer);
  }
  glob_t matches = {};
  const int rc = glob(pattern.c_str(), GLOB_NOSORT, nullptr, &matches);
  Status result = Status::Ok();
  for (size_t i = 0; rc == 0 && i < matches.gl_pathc && result.ok(); ++i) {
    const std::string path = matches.gl_pathv[i];
    char buffer[PATH_MAX];
    if (realpath(path.c_str(), buffer) == nullptr) {
      result = Status::Error(field + ": '" + path + "': " + strerror(errno));
      break;
    }
    const std::string real = buffer;
    bool inside = false;
    for (const std::string& root : resolved_roots) {
      inside |= root == "/" || real.compare(0, root.size() + 1, root + "/") == 0;
    }
    if (!inside) {
      result = Status::InvalidArgument(field + ": '" + path + "' resolves to '" + real +
                             "', outside the allowed data roots (" + (listed.empty() ? "none" : listed) +
                             (resolved_roots.size() < roots.size() ? "; some do not exist" : "") + ")");
    }
  }
  globfree(&matches);
  return result;
}

}  // namespace keel
