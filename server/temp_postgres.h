// TempPostgres: a throwaway PostgreSQL server for tests and benchmarks of the
// PostgreSQL store. Debian's server binaries (/usr/lib/postgresql/N/bin,
// package postgresql) initdb a cluster into a fresh directory under /tmp,
// and the server listens on 127.0.0.1 at a free port and on a unix socket in
// that directory, with the server's defaults otherwise (fsync on: commits are
// as durable as in production). It is stopped (immediate shutdown) and its
// directory removed when the object is destroyed, and it gets SIGINT if the
// process that started it dies first.
//
// PostgreSQL refuses to run as root: when this process is root, initdb and the
// server run as the `postgres` user (created by Debian's package), or as
// `nobody` when there is none.
#ifndef KEEL_SERVER_TEMP_POSTGRES_H_
#define KEEL_SERVER_TEMP_POSTGRES_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "kernels/base/status.h"

namespace keel {

class TempPostgres {
 public:
  // Starts a server. Fails, saying what is missing, when no PostgreSQL server
  // binaries are found ($KEEL_PG_BINDIR, else the newest
  // /usr/lib/postgresql/*/bin with initdb and postgres), and with the tail of
  // the server's log when it does not come up within 60 s.
  static Status Start(std::unique_ptr<TempPostgres>* out);
  ~TempPostgres();
  TempPostgres(const TempPostgres&) = delete;
  TempPostgres& operator=(const TempPostgres&) = delete;

  // Creates database `name` (lowercase letters, digits and '_') and sets *url to its
  // TCP URL, postgresql://keel@127.0.0.1:PORT/name.
  Status CreateDatabase(const std::string& name, std::string* url);
  // The TCP URL of database `name` (which need not exist yet).
  std::string Url(const std::string& name) const;
  // The same database through the unix socket in dir():
  // postgresql://keel@/name?host=DIR&port=PORT.
  std::string SocketUrl(const std::string& name) const;

  int port() const { return port_; }
  const std::string& dir() const { return dir_; }
  const std::string& bin_dir() const { return bin_dir_; }
  pid_t pid() const { return pid_; }

 private:
  TempPostgres() = default;
  std::string bin_dir_;
  std::string dir_;   // the temporary directory: data/, the socket, logs
  int port_ = 0;
  pid_t pid_ = -1;    // the postmaster
};

}  // namespace keel

#endif  // KEEL_SERVER_TEMP_POSTGRES_H_
