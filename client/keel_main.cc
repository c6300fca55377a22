// keel: the command-line client of keeld (see cli.h for the exit codes).
#include <iostream>
#include <string>
#include <vector>

#include "client/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return keel::client::RunCli(args, std::cout, std::cerr);
}
