// Flag parsing on CLI11 with Keel's messages (flags.h).
#include "kernels/base/flags.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace keel {

CLI::Validator IntFlag(int64_t lo, int64_t hi) {
  const std::string range = std::to_string(lo) + " .. " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long n = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno == ERANGE || n < lo || n > hi) {
          return "'" + text + "' is not allowed (" + range + ")";
        }
        return std::string();
      },
      range);
}

std::string ValueMismatchMessage(const CLI::ArgumentMismatch& e) {
  const std::string what = e.what();
  const size_t colon = what.find(':');
  if (colon != std::string::npos) return what.substr(0, colon) + " needs a value";
  return "--" + what.substr(0, what.find(' ')) + " takes no value";
}

namespace {

// A parse error as ParseFlags prints it: a value mismatch in Keel's words
// (ValueMismatchMessage), anything else in CLI11's.
std::string Describe(const CLI::ParseError& e, const std::string& program) {
  if (const auto* mismatch = dynamic_cast<const CLI::ArgumentMismatch*>(&e)) {
    return ValueMismatchMessage(*mismatch) + " (see " + program + " --help)";
  }
  return e.what();
}

}  // namespace

int FlagError(const std::string& program, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", program.c_str(), message.c_str());
  return 2;
}

FlagsOutcome ParseFlags(CLI::App& app, const std::string& program, const char* usage, int argc,
                        char** argv, int first) {
  bool help = false;
  app.set_help_flag();
  app.add_flag("-h,--help", help);
  app.allow_extras(true);  // reported below, first one first
  // A single-valued flag given twice takes the last value (scripts append
  // overrides to a base command line).
  for (CLI::Option* option : app.get_options()) {
    if (option->get_expected_max() == 1) option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  std::vector<std::string> args;
  for (int i = argc - 1; i >= first; --i) args.push_back(argv[i]);  // CLI11 wants them reversed
  FlagsOutcome outcome;
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // --help wins over any other problem on the same command line.
    for (int i = first; i < argc; ++i) {
      if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") help = true;
    }
    if (!help) {
      outcome.proceed = false;
      outcome.exit_code = FlagError(program, Describe(e, program));
      return outcome;
    }
  }
  if (!help && !app.remaining().empty()) {
    outcome.proceed = false;
    outcome.exit_code =
        FlagError(program, "unknown argument '" + app.remaining().front() + "' (see " + program + " --help)");
    return outcome;
  }
  if (help) {
    std::fputs(usage, stdout);
    outcome.proceed = false;
    outcome.exit_code = 0;
  }
  return outcome;
}

}  // namespace keel
