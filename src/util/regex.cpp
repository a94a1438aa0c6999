// util/regex: the PCRE2 wrapper every module matches with (see Regex in util.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <mutex>

#include "util/util.h"

namespace kvaudit {

struct Regex::Code {
  pcre2_code* code = nullptr;
  uint32_t groups = 0;
  // JIT on first use: a registry compiles every engine's log templates, and most never meet
  // a line.
  mutable std::once_flag jit_once;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_DOLLAR_ENDONLY, &error_code, &error_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw std::invalid_argument(fmt::format("regex does not compile at offset {}: {}", error_offset,
                                            reinterpret_cast<const char*>(message)));
  }
  auto compiled = std::make_shared<Code>();
  compiled->code = code;
  pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &compiled->groups);
  code_ = std::move(compiled);
}

size_t Regex::group_count() const {
  return code_->groups;
}

std::optional<Regex::Groups> Regex::search(std::string_view subject) const {
  return match(subject, false);
}

std::optional<Regex::Groups> Regex::full_match(std::string_view subject) const {
  return match(subject, true);
}

std::optional<Regex::Groups> Regex::match(std::string_view subject, bool whole) const {
  std::call_once(code_->jit_once, [&] { pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE); });
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  if (!data) throw std::bad_alloc();
  // An empty view may carry a null pointer; PCRE2 wants a valid one even for length 0.
  const char* bytes = subject.data() ? subject.data() : "";
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(bytes), subject.size(), 0,
                             whole ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0, data.get(), nullptr);
  if (rc <= 0) return std::nullopt;  // no match, or a matching error (limits): treated alike
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
  Groups groups(code_->groups + 1);
  for (size_t i = 0; i < groups.size() && i < static_cast<size_t>(rc); ++i)
    if (ovector[2 * i] != PCRE2_UNSET)
      groups[i] = subject.substr(ovector[2 * i], ovector[2 * i + 1] - ovector[2 * i]);
  return groups;
}

}  // namespace kvaudit
