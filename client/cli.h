// The keel command line: parses arguments, resolves server and token, makes one
// or two KeelService RPCs per command and formats the answers (format.h).
// Exit codes (also in `keel --help`):
//   0 ok; 1 the operation failed, or (watch) a run did not succeed;
//   2 usage error (bad flags, missing file); 3 could not reach keeld
//   (UNAVAILABLE / DEADLINE_EXCEEDED); 4 UNAUTHENTICATED; 5 NOT_FOUND;
//   6 INVALID_ARGUMENT (the server's message is printed verbatim).
#ifndef KEEL_CLIENT_CLI_H_
#define KEEL_CLIENT_CLI_H_

#include <ostream>
#include <string>
#include <vector>

namespace keel {
namespace client {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnavailable = 3;
constexpr int kExitUnauthenticated = 4;
constexpr int kExitNotFound = 5;
constexpr int kExitInvalidArgument = 6;

// Runs one invocation; `args` excludes the program name. Results go to `out`,
// diagnostics to `err`. `keel watch` redraws its table in place (ANSI) only
// when `out` is std::cout and stdout is a terminal.
int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace client
}  // namespace keel

#endif  // KEEL_CLIENT_CLI_H_
