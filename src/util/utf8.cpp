// UTF-8 repair and validation, the one implementation every module uses (reports, JSON,
// the tokenizer, the HTTP front end): Unicode's "maximal subpart" practice, one U+FFFD per
// maximal ill-formed subsequence, as Python's and the WHATWG decoders do.
#include <cstdint>
#include <cstring>

#include "util/util.h"

namespace kvaudit {

namespace {

// Length of the well-formed prefix of the sequence starting at bytes[pos] (0 when the byte
// cannot start one), following Table 3-7 of the Unicode standard. `complete` tells whether
// that prefix is a whole code point.
size_t well_formed_prefix(std::string_view bytes, size_t pos, bool& complete) {
  const auto byte_at = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  unsigned char lead = byte_at(pos);
  complete = false;
  if (lead < 0x80) {
    complete = true;
    return 1;
  }
  size_t need = 0;
  unsigned char second_low = 0x80, second_high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 3;
    if (lead == 0xE0) second_low = 0xA0;
    if (lead == 0xED) second_high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 4;
    if (lead == 0xF0) second_low = 0x90;
    if (lead == 0xF4) second_high = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;  // continuation byte, C0, C1 or F5..FF
  }
  size_t length = 1;
  while (length < need && pos + length < bytes.size()) {
    unsigned char next = byte_at(pos + length);
    unsigned char low = length == 1 ? second_low : 0x80;
    unsigned char high = length == 1 ? second_high : 0xBF;
    if (next < low || next > high) break;
    ++length;
  }
  complete = length == need;
  return length;
}

}  // namespace

std::string to_valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    bool complete = false;
    size_t length = well_formed_prefix(bytes, pos, complete);
    if (complete) {
      out.append(bytes.substr(pos, length));
      pos += length;
    } else {
      out.append("\xEF\xBF\xBD");  // one U+FFFD per maximal ill-formed subsequence
      pos += length == 0 ? 1 : length;
    }
  }
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    // ASCII runs are the common case: skip eight bytes at a time.
    while (pos + 8 <= bytes.size()) {
      uint64_t word;
      std::memcpy(&word, bytes.data() + pos, 8);
      if (word & 0x8080808080808080ull) break;
      pos += 8;
    }
    if (pos >= bytes.size()) break;
    bool complete = false;
    size_t length = well_formed_prefix(bytes, pos, complete);
    if (!complete) return false;
    pos += length;
  }
  return true;
}

}  // namespace kvaudit
