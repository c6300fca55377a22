// What the Store implementations (store_sqlite.cc, store_postgres.cc) share:
// the page and downsampling arithmetic, id and serialization checks, and the
// schema version check, so that both backends answer the same way. Not part
// of the Store interface; only the implementations include it.
#ifndef KEEL_SERVER_STORE_INTERNAL_H_
#define KEEL_SERVER_STORE_INTERNAL_H_

#include <cstdint>
#include <string>

#include <google/protobuf/message.h>

#include "kernels/base/status.h"
#include "server/store.h"

namespace keel {
namespace store_internal {

inline Status RequireId(const std::string& id, const std::string& what) {
  if (id.empty()) return Status::Error(what + ": id is empty; every record needs a non-empty id");
  return Status::Ok();
}

inline Status Serialize(const google::protobuf::Message& msg, std::string* out) {
  if (!msg.SerializeToString(out)) {
    return Status::Error("store: cannot serialize " + msg.GetTypeName());
  }
  return Status::Ok();
}

// Parses a stored record; the error names its type and size.
inline Status ParseRecord(const void* data, int64_t size, google::protobuf::Message* msg) {
  if (!msg->ParseFromArray(data, static_cast<int>(size))) {
    return Status::Error("store: stored " + msg->GetTypeName() + " record is corrupt (" +
                         std::to_string(size) + " bytes do not parse)");
  }
  return Status::Ok();
}

// Whether a page of `items` records and `bytes` bytes ends before the next
// record (`size` bytes): it holds page.max_items records, or that record would
// take it past page.max_bytes. A page always takes its first record.
inline bool PageFull(const PageRequest& page, size_t items, int64_t bytes, int64_t size) {
  return items > 0 &&
         (static_cast<int64_t>(items) >= page.max_items || bytes + size > page.max_bytes);
}

// Downsampling n points to m < n by index: the k-th point kept (k = 0 .. m-1)
// is point round(k * (n-1) / (m-1)). n > m makes the spacing (n-1)/(m-1) > 1,
// so the indices are distinct and increasing, with k = 0 the first point and
// k = m-1 the last (the last alone when m is 1).
inline int64_t DownsampledIndex(int64_t k, int64_t n, int64_t m) {
  return m == 1 ? n - 1 : (k * (n - 1) + (m - 1) / 2) / (m - 1);
}

// OK when a store at schema `version` can be opened by this build; otherwise
// the error that names the store, both versions and what to do.
inline Status CheckSchemaVersion(const std::string& store, int64_t version) {
  if (version > kStoreSchemaVersion) {
    return Status::FailedPrecondition(
        "store '" + store + "': schema version " + std::to_string(version) +
        " is newer than version " + std::to_string(kStoreSchemaVersion) +
        ", the newest this keeld supports; run a newer keeld (the store was left unchanged)");
  }
  return Status::Ok();
}

}  // namespace store_internal
}  // namespace keel

#endif  // KEEL_SERVER_STORE_INTERNAL_H_
