// Small file-system helpers for the trainer's file formats. Every function
// returns a Status whose message names the path and the failing call (with
// strerror); none throws. Paths are plain POSIX paths.
#ifndef KEEL_WORKER_IO_FILE_UTIL_H_
#define KEEL_WORKER_IO_FILE_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/base/status.h"

namespace keel {

// A borrowed run of bytes; `data` must stay valid while the span is used.
struct ByteSpan {
  const void* data;
  size_t size;
};

// Reads the whole file at `path` into *contents (replacing it).
Status ReadFile(const std::string& path, std::string* contents);

// Reads exactly `size` bytes starting at byte `offset` of `path` into `dest`
// (which must hold `size` bytes). Reading past the end of the file is an error
// that names the file size.
Status ReadFileRange(const std::string& path, int64_t offset, int64_t size, void* dest);

// The size of the file at `path` in bytes.
Status FileSize(const std::string& path, int64_t* size);

// Writes the concatenation of `pieces` to `path` atomically: the bytes go to
// `path` + ".tmp", which is fsynced, closed and renamed over `path`, and then the
// directory is fsynced. A reader sees either the old file or the whole new one.
// On failure the .tmp file is removed and `path` is untouched.
Status WriteFileAtomic(const std::string& path, const std::vector<ByteSpan>& pieces);
Status WriteFileAtomic(const std::string& path, const std::string& contents);

// fsyncs directory `dir`, so that the entries created, renamed or removed in
// it last survive a crash.
Status FsyncDir(const std::string& dir);

// Creates `path` and any missing parents (like `mkdir -p`, mode 0777 & umask).
// An existing directory is fine; an existing non-directory is an error.
Status MakeDirs(const std::string& path);

// `path` made absolute against the current directory ("runs" -> "/cwd/runs");
// an absolute or empty path, or one when the current directory cannot be read,
// as it is. Nothing is resolved (no symlinks, no "..").
std::string AbsolutePath(const std::string& path);

// The names (not paths) of the entries of directory `path`, without "." and
// "..", sorted bytewise.
Status ListDir(const std::string& path, std::vector<std::string>* names);

// Fails unless every file that `pattern` (a path or a glob) names lies, once
// symlinks and ".." are resolved, inside one of the directories `roots`
// (resolved the same way). `field` names the config field in the error, e.g.
// "data.train: '/etc/shadow' resolves to '/etc/shadow', outside the allowed
// data roots (/srv/data)". A pattern that names no file passes: whoever opens
// it reports that.
Status CheckInsideRoots(const std::string& field, const std::string& pattern, const std::vector<std::string>& roots);

// The directory part of `path` ("a/b/c" -> "a/b", "c" -> ".", "/c" -> "/").
std::string DirName(const std::string& path);

}  // namespace keel

#endif  // KEEL_WORKER_IO_FILE_UTIL_H_
