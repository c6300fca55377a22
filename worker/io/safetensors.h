// The safetensors file format (https://github.com/huggingface/safetensors),
// float32 tensors only, for Keel's checkpoints.
//
// Layout:
//   8 bytes   N, the header length, uint64 little-endian
//   N bytes   header: a JSON object, padded with spaces to make N a multiple
//             of 8:
//               {"__metadata__":{"key":"value",...},
//                "name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},...}
//   the data buffer: the tensors' bytes (little-endian float32, row-major),
//             data_offsets = [begin, end) relative to the buffer's start;
//             tensors lie back to back, no gaps, no overlaps, no trailing bytes.
//
// WriteSafetensors writes the header compactly, exactly as in the example
// above (no whitespace; "__metadata__" first with keys in sorted order; then
// the tensors in the order given with keys dtype, shape, data_offsets): the
// compact form the safetensors library writes too (it picks its own order of
// tensors and metadata keys, which readers must not depend on). It records the CRC-32
// (crc32.h) of the data buffer as metadata "keel.crc32" = 8 lowercase hex
// digits; ReadSafetensors checks it when present, so a flipped byte in a Keel
// checkpoint is caught, while files from other tools (no keel.crc32) load too.
#ifndef KEEL_WORKER_IO_SAFETENSORS_H_
#define KEEL_WORKER_IO_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/base/status.h"

namespace keel {

// The metadata key holding the data buffer's CRC-32.
constexpr char kSafetensorsCrcKey[] = "keel.crc32";
// Headers longer than this are refused (the limit the safetensors library uses).
constexpr int64_t kMaxSafetensorsHeaderBytes = 100000000;

// A tensor to write; `data` is borrowed and holds product(shape) floats (it
// may be null when that product is 0). A shape of {} is a scalar (1 element).
struct TensorRef {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;
};

// Writes `tensors` (in the order given) and `metadata` to `path` atomically
// (path.tmp, fsync, rename). A "keel.crc32" in `metadata` is replaced by the
// checksum of the data written. Refused, writing nothing: an empty or
// duplicate tensor name, the name "__metadata__", a name or metadata string
// that is not valid UTF-8, a negative dimension, an element count that
// overflows, and null data for a nonempty tensor.
Status WriteSafetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                        const std::map<std::string, std::string>& metadata);

// A tensor read back.
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Reads `path` into *tensors (in the order of their data offsets) and
// *metadata (the "__metadata__" strings, keel.crc32 included). On error both
// are unchanged and the message names the file and the problem: a file
// shorter than 8 bytes; a header length larger than the rest of the file or
// than kMaxSafetensorsHeaderBytes; a header that is not JSON or not an object;
// metadata that is not an object of strings; a tensor entry without dtype,
// shape or data_offsets, or with other keys; a dtype other than F32 (the only
// one allowed); a negative or non-integer dimension; offsets that are not
// [begin, end] with 0 <= begin <= end, whose length disagrees with the shape's
// element count, that overlap or leave a gap; a data buffer shorter
// (truncated) or longer than the tensors; a malformed keel.crc32, or one that
// does not match the data buffer (corrupt).
Status ReadSafetensors(const std::string& path, std::vector<Tensor>* tensors,
                       std::map<std::string, std::string>* metadata);

}  // namespace keel

#endif  // KEEL_WORKER_IO_SAFETENSORS_H_
