// Where keeld's store lives: --store values (ParseStoreLocation), opening the
// store they name (OpenStore) and URLs with their passwords hidden
// (RedactStoreUrl); declared in store.h.
#include <postgresql/libpq-fe.h>

#include <memory>
#include <string>

#include "server/store.h"

namespace keel {

std::string RedactStoreUrl(const std::string& url) {
  std::string out = url;
  // user:PASSWORD@ in the authority (between "://" and the next '/', '?').
  const size_t scheme = out.find("://");
  if (scheme != std::string::npos) {
    const size_t start = scheme + 3;
    const size_t end = out.find_first_of("/?", start);
    const size_t at = out.rfind('@', end == std::string::npos ? std::string::npos : end);
    if (at != std::string::npos && at >= start) {
      const size_t colon = out.find(':', start);
      if (colon != std::string::npos && colon < at) out.replace(colon + 1, at - colon - 1, "***");
    }
  }
  // password=VALUE in the query or a key=value conninfo string.
  for (size_t pos = out.find("password="); pos != std::string::npos; pos = out.find("password=", pos + 1)) {
    const size_t value = pos + 9;
    const size_t end = out.find_first_of("& ", value);
    out.replace(value, (end == std::string::npos ? out.size() : end) - value, "***");
  }
  return out;
}

Status ParseStoreLocation(const std::string& value, StoreLocation* out) {
  const std::string allowed =
      "allowed: sqlite:PATH, a plain PATH (SQLite), or postgresql://user@host:port/db";
  if (value.empty()) return Status::InvalidField("--store", "the value is empty; " + allowed);
  if (value.rfind("postgresql://", 0) == 0 || value.rfind("postgres://", 0) == 0) {
    char* error = nullptr;
    PQconninfoOption* options = PQconninfoParse(value.c_str(), &error);
    if (options == nullptr) {
      std::string why = error != nullptr ? error : "out of memory";
      PQfreemem(error);
      while (!why.empty() && why.back() == '\n') why.pop_back();
      return Status::InvalidField("--store", "'" + RedactStoreUrl(value) + "' is not a valid PostgreSQL URL (" +
                                                 why + "); " + allowed);
    }
    PQconninfoFree(options);
    out->kind = StoreLocation::Kind::kPostgres;
    out->target = value;
    return Status::Ok();
  }
  if (value.rfind("sqlite:", 0) == 0) {
    out->kind = StoreLocation::Kind::kSqlite;
    out->target = value.substr(7);
    if (out->target.empty()) return Status::InvalidField("--store", "'" + value + "' names no file; " + allowed);
    return Status::Ok();
  }
  // Any other scheme ("mysql://", "file://", a typo of postgresql) is refused
  // rather than taken for a file name.
  const size_t scheme = value.find("://");
  if (scheme != std::string::npos) {
    return Status::InvalidField("--store", "'" + RedactStoreUrl(value) + "': unknown scheme '" +
                                               value.substr(0, scheme) + "'; " + allowed);
  }
  out->kind = StoreLocation::Kind::kSqlite;
  out->target = value;
  return Status::Ok();
}

Status OpenStore(const StoreLocation& location, std::unique_ptr<Store>* out) {
  if (location.kind == StoreLocation::Kind::kPostgres) return OpenPostgresStore(location.target, out);
  return OpenSqliteStore(location.target, out);
}

}  // namespace keel
