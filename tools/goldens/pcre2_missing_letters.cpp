// Reads {"L": [code points], "N": [...]} (letters and numbers per the newest Unicode, from
// generate_unicode_delta.mjs) and prints those PCRE2's \p{L} / \p{N} do not match (its
// tables lag Unicode). Build: g++ -std=c++20 -O2 pcre2_missing_letters.cpp -lpcre2-8
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

static std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | cp >> 6);
    out += char(0x80 | (cp & 63));
  } else if (cp < 0x10000) {
    out += char(0xE0 | cp >> 12);
    out += char(0x80 | ((cp >> 6) & 63));
    out += char(0x80 | (cp & 63));
  } else {
    out += char(0xF0 | cp >> 18);
    out += char(0x80 | ((cp >> 12) & 63));
    out += char(0x80 | ((cp >> 6) & 63));
    out += char(0x80 | (cp & 63));
  }
  return out;
}

int main() {
  std::string input{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  auto classes = nlohmann::json::parse(input);
  nlohmann::json missing;
  for (const char* name : {"L", "N"}) {
    std::string pattern = std::string("^\\p{") + name + "}$";
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
    missing[name] = nlohmann::json::array();
    for (uint32_t cp : classes[name]) {
      std::string text = utf8(cp);
      if (pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, match,
                      nullptr) < 0) {
        missing[name].push_back(cp);
      }
    }
    pcre2_match_data_free(match);
    pcre2_code_free(code);
  }
  std::cout << missing.dump() << '\n';
}
