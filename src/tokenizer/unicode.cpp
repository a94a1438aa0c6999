// Unicode pieces of the tokenizer: UTF-8 repair and decoding, the character classes
// Hugging Face's regex engines use, GPT-2's byte-level alphabet, and normalization
// (utf8proc).
#include <utf8proc.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "tokenizer/internal.h"
#include "util/util.h"

namespace kvaudit::tokenizer {

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

namespace detail {

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

char32_t next_code_point(std::string_view text, size_t& pos) {
  auto byte_at = [&](size_t i) {
    return static_cast<char32_t>(static_cast<unsigned char>(text[i]));
  };
  char32_t lead = byte_at(pos);
  if (lead < 0x80) {
    pos += 1;
    return lead;
  }
  if (lead < 0xE0) {
    char32_t cp = ((lead & 0x1F) << 6) | (byte_at(pos + 1) & 0x3F);
    pos += 2;
    return cp;
  }
  if (lead < 0xF0) {
    char32_t cp =
        ((lead & 0x0F) << 12) | ((byte_at(pos + 1) & 0x3F) << 6) | (byte_at(pos + 2) & 0x3F);
    pos += 3;
    return cp;
  }
  char32_t cp = ((lead & 0x07) << 18) | ((byte_at(pos + 1) & 0x3F) << 12) |
                ((byte_at(pos + 2) & 0x3F) << 6) | (byte_at(pos + 3) & 0x3F);
  pos += 4;
  return cp;
}

char32_t last_code_point(std::string_view text) {
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return next_code_point(text, start);
}

bool is_white_space(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

const char* const kWhiteSpaceClassItems =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

bool is_word_char(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  // Other_Alphabetic symbols: circled and squared Latin letters.
  if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
      (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189)) {
    return true;
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

namespace {

std::string encode_utf8(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// bytes_to_unicode() of GPT-2: printable Latin-1 bytes stand for themselves, the other 68
// bytes get U+0100 onwards in byte order, so every byte has a visible character.
struct ByteLevelTables {
  std::array<char32_t, 256> char_of_byte{};
  std::array<std::string, 256> utf8_of_byte;
  ByteLevelTables() {
    char32_t next_extra = 0x100;
    for (int byte = 0; byte < 256; ++byte) {
      bool printable = (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
                       (byte >= 0xAE && byte <= 0xFF);
      char_of_byte[byte] = printable ? static_cast<char32_t>(byte) : next_extra++;
      utf8_of_byte[byte] = encode_utf8(char_of_byte[byte]);
    }
  }
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables;
  return tables;
}

}  // namespace

const std::array<std::string, 256>& byte_level_chars() {
  return byte_level_tables().utf8_of_byte;
}

int byte_level_byte(char32_t cp) {
  // Printable bytes map to themselves; the 68 others live in U+0100..U+0143.
  if (cp < 0x100) {
    return byte_level_tables().char_of_byte[cp] == cp ? static_cast<int>(cp) : -1;
  }
  if (cp > 0x143) return -1;
  static const std::array<int, 68> extra_to_byte = [] {
    std::array<int, 68> table{};
    const auto& chars = byte_level_tables().char_of_byte;
    for (int byte = 0; byte < 256; ++byte) {
      if (chars[byte] >= 0x100) table[chars[byte] - 0x100] = byte;
    }
    return table;
  }();
  return extra_to_byte[cp - 0x100];
}

std::string byte_level_decode(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    int byte = byte_level_byte(next_code_point(token, pos));
    if (byte < 0) return std::string(token);
    bytes += static_cast<char>(byte);
  }
  return bytes;
}

namespace {

std::string normalize_with_utf8proc(std::string_view text, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::nfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::nfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::nfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::nfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* mapped = nullptr;
  utf8proc_ssize_t length = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                         static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                                         static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(mapped, &std::free);
  // The input is valid UTF-8 by now, so only memory exhaustion can fail here.
  if (length < 0) throw std::bad_alloc();
  return std::string(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
}

size_t next_byte_at_least(std::string_view text, size_t pos, unsigned char threshold) {
  while (pos < text.size()) {
    // ASCII runs are never affected: skip eight bytes at a time.
    if (pos + 8 <= text.size()) {
      uint64_t word;
      std::memcpy(&word, text.data() + pos, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        pos += 8;
        continue;
      }
    }
    if (static_cast<unsigned char>(text[pos]) >= threshold) return pos;
    ++pos;
  }
  return text.size();
}

}  // namespace

std::string_view Normalizer::apply(std::string_view text, std::string& storage) const {
  std::string_view current = text;
  for (NormalForm form : forms) {
    // Below U+0300 (no UTF-8 lead byte >= 0xCC) nothing decomposes or composes canonically;
    // compatibility forms only leave ASCII alone.
    const unsigned char first_affected =
        (form == NormalForm::nfc || form == NormalForm::nfd) ? 0xCC : 0x80;
    size_t pos = next_byte_at_least(current, 0, first_affected);
    if (pos == current.size()) continue;
    // Every ASCII character is a starter that never composes with what precedes it, so the
    // text normalizes chunk by chunk between ASCII bytes; only chunks holding an affected
    // byte go through utf8proc. Mostly-ASCII text (source code) stays on the fast path.
    std::string out;
    out.reserve(current.size() + current.size() / 8);
    size_t copied = 0;
    while (pos < current.size()) {
      size_t chunk_begin = pos;
      while (chunk_begin > copied && static_cast<unsigned char>(current[chunk_begin]) >= 0x80) {
        --chunk_begin;
      }
      size_t chunk_end = pos;
      while (chunk_end < current.size() && static_cast<unsigned char>(current[chunk_end]) >= 0x80) {
        ++chunk_end;
      }
      out.append(current.substr(copied, chunk_begin - copied));
      out += normalize_with_utf8proc(current.substr(chunk_begin, chunk_end - chunk_begin), form);
      copied = chunk_end;
      pos = next_byte_at_least(current, chunk_end, first_affected);
    }
    out.append(current.substr(copied));
    storage = std::move(out);
    current = storage;
  }
  return current;
}

}  // namespace detail
}  // namespace kvaudit::tokenizer
