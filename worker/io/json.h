// A small JSON value type, a strict parser (RFC 8259) and a writer, for the
// trainer's metrics lines, run files and the safetensors header.
//
// Numbers keep a double and, when the value is integral, an exact int64: a
// literal like 9007199254740993 or data_offsets beyond 2^53 survive a round
// trip. Objects keep their members in insertion order (the writer emits them in
// that order) and have unique keys.
//
// Non-finite doubles are not JSON numbers. The writer spells them as the
// strings "NaN", "Infinity" and "-Infinity" (a diverging run's loss must reach
// the metrics file, not be dropped as null); JsonValue::ToDouble reads them back.
#ifndef KEEL_WORKER_IO_JSON_H_
#define KEEL_WORKER_IO_JSON_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/base/status.h"

namespace keel {

class SimdjsonReader;

class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Member = std::pair<std::string, JsonValue>;

  JsonValue() = default;  // null
  JsonValue(std::nullptr_t) {}
  JsonValue(bool value) : type_(Type::kBool), bool_(value) {}
  JsonValue(double value);
  // Any integer type except bool; a uint64 above INT64_MAX keeps only its double.
  template <typename T,
            typename std::enable_if<std::is_integral<T>::value && !std::is_same<T, bool>::value,
                                    int>::type = 0>
  JsonValue(T value) {
    if (std::is_signed<T>::value) {
      SetInt(static_cast<int64_t>(value));
    } else {
      SetUint(static_cast<uint64_t>(value));
    }
  }
  JsonValue(const char* value) : type_(Type::kString), string_(value) {}
  JsonValue(std::string value) : type_(Type::kString), string_(std::move(value)) {}
  static JsonValue Array();   // []
  static JsonValue Object();  // {}

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Accessors of the wrong type return false / 0 / empty; they never throw.
  bool bool_value() const { return type_ == Type::kBool && bool_; }
  double number() const { return type_ == Type::kNumber ? number_ : 0.0; }
  // True for a number whose value is an integer that int64 holds exactly
  // (-0.0 excluded, so that it keeps its sign).
  bool is_int() const { return type_ == Type::kNumber && has_int_; }
  int64_t int_value() const { return is_int() ? int_ : 0; }
  const std::string& string_value() const;
  // A number, or one of the strings "NaN", "Infinity", "-Infinity" the writer
  // uses for non-finite doubles. False (and *out untouched) otherwise.
  bool ToDouble(double* out) const;

  // Arrays. Append turns a null value into an array first.
  const std::vector<JsonValue>& array() const;
  void Append(JsonValue value);

  // Objects, in insertion order. Find returns nullptr when the key is absent
  // or this is not an object. Set replaces the value of an existing key in
  // place, else appends; it turns a null value into an object first.
  const std::vector<Member>& members() const;
  const JsonValue* Find(const std::string& key) const;
  void Set(const std::string& key, JsonValue value);

  // Elements of an array or members of an object; 0 otherwise.
  size_t size() const;

  // Deep equality; numbers compare by their int64 when both have one, else by
  // double (so NaN != NaN); object members compare in order.
  bool operator==(const JsonValue& other) const;
  bool operator!=(const JsonValue& other) const { return !(*this == other); }

 private:
  friend class SimdjsonReader;  // json.cc: fills objects and arrays directly
  void SetInt(int64_t value);
  void SetUint(uint64_t value);

  Type type_ = Type::kNull;
  bool bool_ = false;
  bool has_int_ = false;
  double number_ = 0.0;
  int64_t int_ = 0;
  std::string string_;
  std::vector<JsonValue> array_;
  std::vector<Member> members_;
};

// Parses one JSON text (surrounding whitespace allowed) into *out. Strict:
// no comments, trailing commas, NaN literals, leading zeros, unescaped control
// characters, invalid UTF-8, lone surrogates or duplicate object keys; nesting
// deeper than kMaxJsonDepth is refused. Errors read "JSON: at byte N: expected
// ..., found ..."; *out is unchanged on error.
//
// simdjson reads the text, 2.2-2.4x as fast as the bytewise parser on metric
// lines (docs/benchmarks.md). What simdjson refuses or reads otherwise goes to
// ParseJsonBytewise, whose result is ParseJson's: an error (its message needs
// the byte offset simdjson does not report), an integer beyond 64 bits, "-0".
constexpr int kMaxJsonDepth = 512;
Status ParseJson(const std::string& text, JsonValue* out);

// The byte-at-a-time parser behind ParseJson's errors, with the same contract
// and the same result on every input; exposed so that json_test can hold the
// two to that.
Status ParseJsonBytewise(const std::string& text, JsonValue* out);

// Compact JSON (no spaces, no newline). Strings: '"', '\\' and control
// characters are escaped (\n, \t, ... or \u00XX); other UTF-8 passes through;
// bytes that are not valid UTF-8 become U+FFFD. Numbers: an int64 exactly, a
// double in its shortest form that parses back to the same double.
std::string ToJson(const JsonValue& value);

// Shortest decimal that parses back to `value` ("0.1", "1e+300", "3"); the
// strings "NaN", "Infinity", "-Infinity" (quoted) for non-finite values.
std::string JsonNumber(double value);

// Builds one single-line JSON object cheaply, for metrics JSON lines:
//   JsonWriter w;
//   w.Add("step", step).Add("loss", loss).Add("scheme", "mxfp4");
//   file << w.str() << "\n";   // {"step":10,"loss":2.5,"scheme":"mxfp4"}
// Members appear in the order added. Keys should be unique: the writer does
// not check (a metrics line is written every step).
class JsonWriter {
 public:
  JsonWriter& Add(const std::string& key, const JsonValue& value);
  // The object so far, e.g. "{}" when nothing was added.
  std::string str() const { return text_ + "}"; }
  void Clear() { text_ = "{"; }

 private:
  std::string text_ = "{";
};

}  // namespace keel

#endif  // KEEL_WORKER_IO_JSON_H_
