// Writing and validating safetensors files of float32 tensors.
#include "worker/io/safetensors.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <set>

#include "worker/io/crc32.h"
#include "worker/io/file_util.h"
#include "worker/io/json.h"
#include "worker/io/utf8.h"

namespace keel {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian float32 copied as raw memory");

constexpr char kMetadataKey[] = "__metadata__";
constexpr char kDtypeF32[] = "F32";

// Tensors handed to the writer that it cannot store (the caller's mistake).
Status FileError(const std::string& path, const std::string& what) {
  return Status::InvalidArgument("safetensors " + path + ": " + what);
}

// A file that does not read back as what the writer writes: corrupt or truncated.
Status Corrupt(const std::string& path, const std::string& what) {
  return Status::DataLoss("safetensors " + path + ": " + what);
}

// Product of the dimensions; false when one is negative or it overflows the
// byte count of a float32 tensor.
bool ElementCount(const std::vector<int64_t>& shape, int64_t* count) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && n > INT64_MAX / 4 / d) return false;
    n *= d;
  }
  *count = n;
  return true;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string Hex32(uint32_t value) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", value);
  return buf;
}

bool IsUtf8(const std::string& s) {
  size_t offset;
  return IsValidUtf8(s, &offset);
}

// One tensor entry of the header, validated.
struct Entry {
  std::string name;
  std::vector<int64_t> shape;
  int64_t begin = 0;
  int64_t end = 0;
};

// A JSON array of non-negative integers into *out; false otherwise.
bool NonNegativeInts(const JsonValue& value, std::vector<int64_t>* out) {
  if (!value.is_array()) return false;
  out->clear();
  for (const JsonValue& v : value.array()) {
    if (!v.is_int() || v.int_value() < 0) return false;
    out->push_back(v.int_value());
  }
  return true;
}

Status ParseEntry(const std::string& path, const std::string& name, const JsonValue& value,
                  Entry* entry) {
  const std::string where = "tensor '" + name + "'";
  if (!value.is_object()) {
    return Corrupt(path, where + " is " + ToJson(value).substr(0, 40) +
                               ", expected an object with dtype, shape and data_offsets");
  }
  for (const JsonValue::Member& m : value.members()) {
    if (m.first != "dtype" && m.first != "shape" && m.first != "data_offsets") {
      return Corrupt(path, where + " has key '" + m.first +
                                 "'; allowed keys are dtype, shape, data_offsets");
    }
  }
  const JsonValue* dtype = value.Find("dtype");
  const JsonValue* shape = value.Find("shape");
  const JsonValue* offsets = value.Find("data_offsets");
  if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
    return Corrupt(path, where + " lacks " +
                               (dtype == nullptr ? "dtype" : shape == nullptr ? "shape"
                                                                              : "data_offsets"));
  }
  if (!dtype->is_string() || dtype->string_value() != kDtypeF32) {
    return Corrupt(path, where + " has dtype " + ToJson(*dtype) +
                               "; the only dtype allowed is \"F32\"");
  }
  entry->name = name;
  if (!NonNegativeInts(*shape, &entry->shape)) {
    return Corrupt(path, where + " has shape " + ToJson(*shape) +
                               ", expected an array of non-negative integers");
  }
  std::vector<int64_t> range;
  if (!NonNegativeInts(*offsets, &range) || range.size() != 2 || range[0] > range[1]) {
    return Corrupt(path, where + " has data_offsets " + ToJson(*offsets) +
                               ", expected [begin, end] with 0 <= begin <= end");
  }
  entry->begin = range[0];
  entry->end = range[1];
  int64_t count;
  if (!ElementCount(entry->shape, &count)) {
    return Corrupt(path, where + " has shape " + ShapeString(entry->shape) +
                               " whose element count overflows");
  }
  if (entry->end - entry->begin != 4 * count) {
    return Corrupt(path, where + " has shape " + ShapeString(entry->shape) + " (" +
                               std::to_string(count) + " float32 = " +
                               std::to_string(4 * count) + " bytes) but data_offsets [" +
                               std::to_string(entry->begin) + ", " +
                               std::to_string(entry->end) + "] span " +
                               std::to_string(entry->end - entry->begin) + " bytes");
  }
  return Status::Ok();
}

}  // namespace

Status WriteSafetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  std::vector<int64_t> bytes(tensors.size());
  uint32_t crc = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    const std::string where = "tensor " + std::to_string(i) + " ('" + t.name + "')";
    if (t.name.empty()) {
      return FileError(path, "tensor " + std::to_string(i) + " has an empty name");
    }
    if (t.name == kMetadataKey) {
      return FileError(path, where + ": the name __metadata__ is reserved for the metadata");
    }
    if (!IsUtf8(t.name)) return FileError(path, where + ": the name is not valid UTF-8");
    if (!names.insert(t.name).second) {
      return FileError(path, where + ": the name is used by an earlier tensor too");
    }
    int64_t count;
    if (!ElementCount(t.shape, &count)) {
      return FileError(path, where + ": shape " + ShapeString(t.shape) +
                                 " has a negative dimension or too many elements");
    }
    if (count > 0 && t.data == nullptr) {
      return FileError(path, where + ": data is null for " + std::to_string(count) +
                                 " elements");
    }
    bytes[i] = 4 * count;
    crc = Crc32(crc, t.data, static_cast<size_t>(bytes[i]));
  }
  for (const auto& kv : metadata) {
    if (!IsUtf8(kv.first) || !IsUtf8(kv.second)) {
      return FileError(path, "metadata key '" + kv.first + "' or its value is not valid UTF-8");
    }
  }

  std::map<std::string, std::string> all_metadata = metadata;
  all_metadata[kSafetensorsCrcKey] = Hex32(crc);
  JsonValue header = JsonValue::Object();
  JsonValue meta = JsonValue::Object();
  for (const auto& kv : all_metadata) meta.Set(kv.first, kv.second);
  header.Set(kMetadataKey, std::move(meta));
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    JsonValue entry = JsonValue::Object();
    entry.Set("dtype", kDtypeF32);
    JsonValue shape = JsonValue::Array();
    for (int64_t d : tensors[i].shape) shape.Append(d);
    entry.Set("shape", std::move(shape));
    JsonValue offsets = JsonValue::Array();
    offsets.Append(offset);
    offsets.Append(offset + bytes[i]);
    entry.Set("data_offsets", std::move(offsets));
    header.Set(tensors[i].name, std::move(entry));
    offset += bytes[i];
  }
  std::string header_text = ToJson(header);
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  unsigned char length[8];
  const uint64_t n = header_text.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
  std::vector<ByteSpan> pieces = {ByteSpan{length, sizeof(length)},
                                  ByteSpan{header_text.data(), header_text.size()}};
  for (size_t i = 0; i < tensors.size(); ++i) {
    pieces.push_back(ByteSpan{tensors[i].data, static_cast<size_t>(bytes[i])});
  }
  return WriteFileAtomic(path, pieces);
}

Status ReadSafetensors(const std::string& path, std::vector<Tensor>* tensors,
                       std::map<std::string, std::string>* metadata) {
  int64_t file_size;
  Status s = FileSize(path, &file_size);
  if (!s.ok()) return s;
  if (file_size < 8) {
    return Corrupt(path, "file is " + std::to_string(file_size) +
                               " bytes, shorter than the 8-byte header length");
  }
  unsigned char length[8];
  s = ReadFileRange(path, 0, 8, length);
  if (!s.ok()) return s;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return Corrupt(path, "header length " + std::to_string(n) + " is above the limit of " +
                               std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  }
  const int64_t header_size = static_cast<int64_t>(n);
  if (header_size > file_size - 8) {
    return Corrupt(path, "header length " + std::to_string(header_size) +
                               " is larger than the " + std::to_string(file_size - 8) +
                               " bytes after it: the file is truncated or not safetensors");
  }
  std::string header_text(static_cast<size_t>(header_size), '\0');
  s = ReadFileRange(path, 8, header_size, &header_text[0]);
  if (!s.ok()) return s;
  JsonValue header;
  s = ParseJson(header_text, &header);
  if (!s.ok()) {
    return Corrupt(path, "header (file bytes 8 to " + std::to_string(8 + header_size) +
                               ") is not valid JSON: " + s.message() +
                               " (byte offsets count from the header's start)");
  }
  if (!header.is_object()) return Corrupt(path, "header is not a JSON object");

  std::map<std::string, std::string> meta;
  std::vector<Entry> entries;
  for (const JsonValue::Member& m : header.members()) {
    if (m.first == kMetadataKey) {
      if (!m.second.is_object()) {
        return Corrupt(path, "__metadata__ is not an object of strings");
      }
      for (const JsonValue::Member& kv : m.second.members()) {
        if (!kv.second.is_string()) {
          return Corrupt(path, "__metadata__ key '" + kv.first + "' has value " +
                                     ToJson(kv.second).substr(0, 40) + ", expected a string");
        }
        meta[kv.first] = kv.second.string_value();
      }
      continue;
    }
    Entry entry;
    s = ParseEntry(path, m.first, m.second, &entry);
    if (!s.ok()) return s;
    entries.push_back(std::move(entry));
  }

  // File order: by offsets; back to back from 0.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const int64_t data_size = file_size - 8 - header_size;
  int64_t expected = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    const std::string range =
        "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
    if (e.begin < expected) {
      return Corrupt(path, "tensor '" + e.name + "' " + range + " overlaps tensor '" +
                                 entries[i - 1].name + "', which ends at " +
                                 std::to_string(expected));
    }
    if (e.begin > expected) {
      return Corrupt(path, "tensor '" + e.name + "' " + range + " leaves bytes [" +
                                 std::to_string(expected) + ", " + std::to_string(e.begin) +
                                 ") of the data buffer to no tensor; tensors must be contiguous");
    }
    if (e.end > data_size) {
      return Corrupt(path, "tensor '" + e.name + "' " + range + " runs past the end of the " +
                                 std::to_string(data_size) + "-byte data buffer: the file is "
                                 "truncated");
    }
    expected = e.end;
  }
  if (expected != data_size) {
    return Corrupt(path, "data buffer is " + std::to_string(data_size) +
                               " bytes but the tensors cover " + std::to_string(expected) +
                               ": " + std::to_string(data_size - expected) +
                               " trailing bytes");
  }

  std::vector<Tensor> result(entries.size());
  uint32_t crc = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    Tensor& t = result[i];
    t.name = entries[i].name;
    t.shape = entries[i].shape;
    const int64_t bytes = entries[i].end - entries[i].begin;
    t.data.resize(static_cast<size_t>(bytes / 4));
    s = ReadFileRange(path, 8 + header_size + entries[i].begin, bytes, t.data.data());
    if (!s.ok()) return s;
    crc = Crc32(crc, t.data.data(), static_cast<size_t>(bytes));
  }
  auto stored = meta.find(kSafetensorsCrcKey);
  if (stored != meta.end()) {
    const std::string& hex = stored->second;
    if (hex.size() != 8 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
      return Corrupt(path, std::string(kSafetensorsCrcKey) + " is \"" + hex +
                                 "\", expected 8 hex digits");
    }
    const uint32_t want = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
    if (want != crc) {
      return Corrupt(path, "data is corrupt: " + std::string(kSafetensorsCrcKey) + " is " +
                                 hex + " but the data buffer's CRC-32 is " + Hex32(crc));
    }
  }
  tensors->swap(result);
  metadata->swap(meta);
  return Status::Ok();
}

}  // namespace keel
