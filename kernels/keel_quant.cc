// keel-quant: quantizes a raw float32 matrix with one of Keel's formats and
// writes the dequantized matrix (and optionally the packed codes and scales).
// Used by the tests, by users, and by outside checks against microxcaling and
// TransformerEngine, so its flags and file formats are a contract: see --help.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include "kernels/base/flags.h"
#include "kernels/quantizer.h"

namespace {

const char kUsage[] =
    "usage: keel-quant --format FORMAT --rows R --cols C --in X.f32 --out Y.f32\n"
    "                  [--axis 1|0] [--block 32] [--rounding nearest_even|nearest_away|stochastic]\n"
    "                  [--seed S] [--tile 1x16|16x16] [--rht] [--device cpu|cuda]\n"
    "                  [--packed-out Y.bin]\n"
    "\n"
    "Quantizes a row-major R x C matrix of little-endian float32 (--in) and writes\n"
    "the dequantized matrix, same shape and encoding (--out).\n"
    "\n"
    "  --format      mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4 (MX, E8M0\n"
    "                block scales), nvfp4 (E2M1, E4M3 scales of 16-element blocks and\n"
    "                an fp32 tensor scale), fp8_e4m3, fp8_e5m2 (one fp32 scale from\n"
    "                the tensor's amax), bf16\n"
    "  --axis        1: blocks of consecutive elements within a row (default);\n"
    "                0: blocks running down a column\n"
    "  --block       MX block size (default 32); a trailing partial block is padded\n"
    "                with zeros\n"
    "  --rounding    nearest_even (default), nearest_away (ties away from zero, as\n"
    "                microxcaling's \"nearest\"), stochastic (Philox4x32-10 keyed by\n"
    "                --seed; identical on cpu and cuda); nvfp4 allows nearest_even\n"
    "                and stochastic only\n"
    "  --seed        seed for stochastic rounding (default 0)\n"
    "  --tile        nvfp4 only: 1x16 blocks (default) or 16x16 tiles (one amax per\n"
    "                tile, so W and W^T quantize alike); the tile must divide the shape\n"
    "  --rht         nvfp4 only: random Hadamard transform of each 16-element chunk\n"
    "                along the axis first; --out is then in the rotated domain\n"
    "  --device      cpu (reference, default) or cuda (bit-identical kernels)\n"
    "  --packed-out  also write the packed form: element codes (FP4 two per byte, low\n"
    "                nibble first; FP6 and FP8 one per byte; bf16 two bytes each),\n"
    "                then the block scales (row-major: R x ceil(C/block) for axis 1,\n"
    "                ceil(R/block) x C for axis 0), then for nvfp4 and fp8_* the\n"
    "                tensor decode scale as float32\n"
    "\n"
    "On any error keel-quant prints one line naming the problem, writes no output\n"
    "file and exits with status 2 (1 when the quantizer itself fails).\n";

int Fail(const std::string& message, int code = 2) {
  std::fprintf(stderr, "keel-quant: error: %s\n", message.c_str());
  return code;
}

bool ParseInt(const std::string& text, int64_t min, int64_t max, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || value < min || value > max) return false;
  *out = value;
  return true;
}

// Writes bytes to path through a temporary file and a rename, so a failure
// never leaves a partial output behind.
bool WriteFileAtomically(const std::string& path, const void* data, size_t size, std::string* error) {
  std::string temp = path + ".tmp." + std::to_string(getpid());
  FILE* file = std::fopen(temp.c_str(), "wb");
  if (file == nullptr) {
    *error = "cannot create " + temp;
    return false;
  }
  bool ok = std::fwrite(data, 1, size, file) == size;
  ok = (std::fclose(file) == 0) && ok;
  if (!ok || std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    *error = "cannot write " + path;
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // Flags that take a value, and the one that does not. Values are checked
  // below, one message per flag; CLI11 only splits the command line.
  const char* kValued[] = {"--format", "--rows",  "--cols", "--in",     "--out",       "--axis",
                           "--block",  "--rounding", "--seed", "--tile", "--device", "--packed-out"};
  std::map<std::string, std::string> values;
  bool rht = false;
  CLI::App app("keel-quant");
  std::vector<CLI::Option*> options;
  for (const char* valued : kValued) options.push_back(app.add_option(valued, values[valued]));
  app.add_flag("--rht", rht);
  keel::FlagsOutcome outcome = keel::ParseFlags(app, "keel-quant", kUsage, argc, argv);
  if (!outcome.proceed) return outcome.exit_code;
  std::map<std::string, std::string> flags;  // only the flags given
  for (CLI::Option* option : options) {
    if (option->count() > 0) flags[option->get_name()] = values[option->get_name()];
  }
  for (const char* required : {"--format", "--rows", "--cols", "--in", "--out"}) {
    if (flags.count(required) == 0) return Fail(std::string(required) + " is required (see --help)");
  }

  keel::QuantRequest request;
  if (!keel::ParseQuantFormat(flags["--format"], &request.format))
    return Fail("--format: '" + flags["--format"] + "' is not a format; use one of " +
                keel::QuantFormatNames());
  int64_t value = 0;
  if (!ParseInt(flags["--rows"], 1, int64_t{1} << 31, &value))
    return Fail("--rows: '" + flags["--rows"] + "' is not allowed; need an integer >= 1");
  request.rows = value;
  if (!ParseInt(flags["--cols"], 1, int64_t{1} << 31, &value))
    return Fail("--cols: '" + flags["--cols"] + "' is not allowed; need an integer >= 1");
  request.cols = value;
  if (flags.count("--axis")) {
    if (flags["--axis"] != "0" && flags["--axis"] != "1")
      return Fail("--axis: '" + flags["--axis"] + "' is not allowed; use 1 (along rows) or 0 (down columns)");
    request.axis = flags["--axis"] == "1" ? 1 : 0;
  }
  if (flags.count("--block")) {
    if (!keel::IsMx(request.format))
      return Fail("--block: applies to MX formats only, not " + flags["--format"]);
    if (!ParseInt(flags["--block"], 1, 4096, &value))
      return Fail("--block: '" + flags["--block"] + "' is not allowed; need an integer 1..4096");
    request.block = static_cast<int>(value);
  }
  if (flags.count("--rounding") &&
      !keel::ParseRounding(flags["--rounding"], &request.rounding))
    return Fail("--rounding: '" + flags["--rounding"] +
                "' is not allowed; use nearest_even, nearest_away or stochastic");
  if (flags.count("--seed")) {
    char* end = nullptr;
    errno = 0;
    unsigned long long seed = std::strtoull(flags["--seed"].c_str(), &end, 10);
    if (flags["--seed"].empty() || flags["--seed"][0] == '-' || errno != 0 || *end != '\0')
      return Fail("--seed: '" + flags["--seed"] + "' is not allowed; need an integer 0..2^64-1");
    request.seed = seed;
  }
  if (flags.count("--tile")) {
    if (request.format != keel::QuantFormat::kNvfp4)
      return Fail("--tile: applies to nvfp4 only, not " + flags["--format"]);
    if (flags["--tile"] != "1x16" && flags["--tile"] != "16x16")
      return Fail("--tile: '" + flags["--tile"] + "' is not allowed; use 1x16 or 16x16");
    request.tile_16x16 = flags["--tile"] == "16x16";
  }
  if (rht && request.format != keel::QuantFormat::kNvfp4)
    return Fail("--rht: applies to nvfp4 only, not " + flags["--format"]);
  request.rht = rht;
  std::string device = flags.count("--device") ? flags["--device"] : "cpu";
  if (device != "cpu" && device != "cuda")
    return Fail("--device: '" + device + "' is not allowed; use cpu or cuda");
  keel::Status status = keel::ValidateRequest(request);
  if (!status.ok()) return Fail(status.message());

  // Read the input and check its size against the shape.
  const std::string& in_path = flags["--in"];
  std::ifstream in(in_path, std::ios::binary);
  if (!in) return Fail("--in: cannot open '" + in_path + "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int64_t count = request.rows * request.cols;
  if (static_cast<int64_t>(bytes.size()) != count * 4)
    return Fail("--in: '" + in_path + "' has " + std::to_string(bytes.size()) + " bytes; --rows " +
                std::to_string(request.rows) + " x --cols " + std::to_string(request.cols) +
                " float32 need " + std::to_string(count * 4));
  std::vector<float> x(count);
  std::memcpy(x.data(), bytes.data(), bytes.size());
  bytes = std::vector<char>();

  keel::QuantResult result;
  status = device == "cuda" ? keel::QuantizeCuda(request, x.data(), &result)
                            : keel::QuantizeCpu(request, x.data(), &result);
  if (!status.ok()) return Fail(status.message(), 1);

  std::string error;
  if (flags.count("--packed-out")) {
    std::vector<uint8_t> packed = result.PackedFile();
    if (!WriteFileAtomically(flags["--packed-out"], packed.data(), packed.size(), &error))
      return Fail("--packed-out: " + error, 1);
  }
  if (!WriteFileAtomically(flags["--out"], result.out.data(), result.out.size() * 4, &error)) {
    if (flags.count("--packed-out")) std::remove(flags["--packed-out"].c_str());
    return Fail("--out: " + error, 1);
  }
  return 0;
}
