// Run leases between keel-worker and keel-train (see run_lease.h).
#include "worker/run/run_lease.h"

#include <chrono>
#include <cstdio>

#include "worker/io/file_util.h"

namespace keel {

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status WriteRunLease(const std::string& path, const RunLease& lease) {
  return WriteFileAtomic(path, "attempt " + std::to_string(lease.attempt) + " expires_unix_ms " +
                                   std::to_string(lease.expires_unix_ms) + "\n");
}

Status ReadRunLease(const std::string& path, RunLease* out) {
  std::string text;
  KEEL_RETURN_IF_ERROR(ReadFile(path, &text));
  long long attempt = 0, expires = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "attempt %lld expires_unix_ms %lld%c", &attempt, &expires, &tail) != 3 ||
      tail != '\n') {
    return Status::Error("lease file '" + path + "': '" + text.substr(0, 80) +
                         "' is not 'attempt N expires_unix_ms T'");
  }
  out->attempt = attempt;
  out->expires_unix_ms = expires;
  return Status::Ok();
}

}  // namespace keel
