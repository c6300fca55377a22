// UTF-8 decoding rules of RFC 3629, table 3-7 of the Unicode standard.
#include "worker/io/utf8.h"

namespace keel {

size_t Utf8SequenceLength(const unsigned char* data, size_t size) {
  const unsigned char b0 = data[0];
  if (b0 < 0x80) return 1;
  size_t length;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong below U+0800
    if (b0 == 0xED) hi = 0x9F;  // surrogates U+D800..U+DFFF
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong below U+10000
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;  // continuation byte, C0/C1 (overlong), or F5..FF
  }
  if (size < length) return 0;
  if (data[1] < lo || data[1] > hi) return 0;
  for (size_t i = 2; i < length; ++i) {
    if ((data[i] & 0xC0) != 0x80) return 0;
  }
  return length;
}

bool IsValidUtf8(const std::string& text, size_t* offset) {
  const unsigned char* data = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  size_t pos = 0;
  while (pos < size) {
    if (data[pos] < 0x80) {  // fast path for ASCII
      ++pos;
      continue;
    }
    const size_t length = Utf8SequenceLength(data + pos, size - pos);
    if (length == 0) {
      *offset = pos;
      return false;
    }
    pos += length;
  }
  return true;
}

void AppendUtf8(unsigned cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace keel
