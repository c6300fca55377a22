// Command-line flags for Keel's binaries (keeld, keel-worker, keel-train, keel-quant), on
// CLI11 (Debian's libcli11-dev). Each binary declares its flags on a CLI::App
// and calls ParseFlags, which keeps the conventions they share:
//   - `--help`/`-h` prints the binary's own usage text (written next to its
//     flags, so it says exactly what they do) and exits 0;
//   - any other problem prints "PROGRAM: FLAG: 'VALUE' is not allowed (WHAT IS)"
//     or "PROGRAM: unknown argument 'X' (see PROGRAM --help)" and exits 2.
#ifndef KEEL_KERNELS_BASE_FLAGS_H_
#define KEEL_KERNELS_BASE_FLAGS_H_

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace keel {

// Accepts a base-10 integer in [lo, hi]; anything else reads
// "'VALUE' is not allowed (lo .. hi)".
CLI::Validator IntFlag(int64_t lo, int64_t hi);

// A flag given without its value, or a value given to a flag that takes none,
// in Keel's words: "--name needs a value" or "--name takes no value" (CLI11
// says "--name: 1 required TEXT missing" and "name was given a disallowed flag
// override"). ParseFlags and the `keel` CLI both report it so.
std::string ValueMismatchMessage(const CLI::ArgumentMismatch& e);

// The outcome of ParseFlags: go on, or exit with `exit_code` (0 after --help,
// 2 after a usage error; the text is printed already).
struct FlagsOutcome {
  bool proceed = true;
  int exit_code = 0;
};

// A usage error found after parsing (a flag's file cannot be read, two flags
// that go together): prints "PROGRAM: MESSAGE" and returns 2, the exit status
// ParseFlags gives its own usage errors.
int FlagError(const std::string& program, const std::string& message);

// Parses argv[first..argc) into `app`'s options. `program` names the binary in
// messages; `usage` is printed for --help.
FlagsOutcome ParseFlags(CLI::App& app, const std::string& program, const char* usage, int argc,
                        char** argv, int first = 1);

}  // namespace keel

#endif  // KEEL_KERNELS_BASE_FLAGS_H_
