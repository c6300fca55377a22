// The bootstrap file of comm.h: rank 0's address, written atomically and
// polled for by the other ranks.
#include "kernels/comm/comm.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace keel {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// Writes all of `text` to fd, retrying short writes and EINTR.
bool WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

Status WriteBootstrapId(const std::string& path, const std::string& id) {
  if (path.empty()) return Status::InvalidField("bootstrap_path", "is empty; a file path is required");
  if (id.empty()) return Status::InvalidField("id", "is empty; an empty file reads as \"not written yet\"");
  // The temporary name carries the pid so that two writers never share one;
  // rename() replaces `path` in one step, so a reader sees the old file, no
  // file or the whole id, never a part of it.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Error("bootstrap id: cannot create " + tmp + ": " + ErrnoText(errno));
  bool ok = WriteAll(fd, id);
  int err = errno;
  if (ok && ::fsync(fd) != 0) {
    ok = false;
    err = errno;
  }
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return Status::Error("bootstrap id: cannot write " + tmp + ": " + ErrnoText(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    return Status::Error("bootstrap id: cannot rename " + tmp + " to " + path + ": " + ErrnoText(err));
  }
  return Status::Ok();
}

Status WaitBootstrapId(const std::string& path, double timeout_s, std::string* id) {
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::ostringstream text;
      text << in.rdbuf();
      // An empty file is one a writer without rename() has only created: not there yet.
      if (!text.str().empty()) {
        *id = text.str();
        return Status::Ok();
      }
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ostringstream message;
  message << "no bootstrap id from rank 0 at " << path << " after " << timeout_s << " s";
  return Status::Unavailable(message.str());
}

std::string BootstrapIdToHex(const void* bytes, size_t size) {
  static const char kDigits[] = "0123456789abcdef";
  const unsigned char* b = static_cast<const unsigned char*>(bytes);
  std::string text(2 * size, '0');
  for (size_t i = 0; i < size; ++i) {
    text[2 * i] = kDigits[b[i] >> 4];
    text[2 * i + 1] = kDigits[b[i] & 15];
  }
  return text;
}

Status BootstrapIdFromHex(const std::string& path, const std::string& text, void* bytes, size_t size) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const std::string want = "(allowed: exactly " + std::to_string(2 * size) + " hex digits)";
  if (text.size() != 2 * size) {
    return Status::InvalidArgument("bootstrap id at " + path + ": " + std::to_string(text.size()) +
                                   " characters, not a hex id " + want);
  }
  for (size_t i = 0; i < text.size(); ++i) {
    if (digit(text[i]) < 0) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      const std::string shown = c >= 0x20 && c < 0x7f ? "'" + std::string(1, text[i]) + "'" : "byte " + std::to_string(c);
      return Status::InvalidArgument("bootstrap id at " + path + ": character " + std::to_string(i) + " is " + shown +
                                     ", not a hex digit " + want);
    }
  }
  unsigned char* b = static_cast<unsigned char*>(bytes);
  for (size_t i = 0; i < size; ++i) b[i] = static_cast<unsigned char>(digit(text[2 * i]) * 16 + digit(text[2 * i + 1]));
  return Status::Ok();
}

}  // namespace keel
