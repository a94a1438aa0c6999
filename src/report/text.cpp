// report/text: the small text rules every renderer shares: how a value is written
// (so terminal, HTML and tests agree digit for digit), how wide a string is on a
// terminal, and how to make arbitrary bytes safe for UTF-8 outputs.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include <fmt/format.h>
#include <utf8proc.h>

#include "report/report.h"
#include "util/util.h"

namespace kvaudit::report {

std::string_view severity_name(Severity severity) {
  switch (severity) {
    case Severity::info:
      return "info";
    case Severity::warning:
      return "warning";
    case Severity::critical:
      return "critical";
  }
  return "info";
}

namespace {

// Inserts thousands separators into the integer part of a plain decimal number
// ("-1234567.50" -> "-1,234,567.50").
std::string group_integer_part(const std::string& number) {
  size_t start = (!number.empty() && number[0] == '-') ? 1 : 0;
  size_t end = number.find_first_of(".e", start);
  if (end == std::string::npos) end = number.size();
  std::string out = number.substr(0, start);
  size_t digits = end - start;
  for (size_t i = 0; i < digits; ++i) {
    if (i > 0 && (digits - i) % 3 == 0) out += ',';
    out += number[start + i];
  }
  out += number.substr(end);
  return out;
}

// "-0.000" reads as a sign that is not there; print it as "0.000".
std::string drop_negative_zero(std::string number) {
  if (!number.empty() && number[0] == '-' &&
      number.find_first_not_of("0.,", 1) == std::string::npos) {
    number.erase(0, 1);
  }
  return number;
}

std::string format_double(double value, int precision, bool group_digits) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (precision < 0) precision = 0;
  if (precision > 17) precision = 17;
  double magnitude = std::fabs(value);
  std::string text;
  if (magnitude == 0.0 || magnitude >= 1.0) {
    // Fixed decimals, so a column's decimal points line up.
    text = fmt::format("{:.{}f}", value, precision);
  } else if (magnitude >= 1e-6) {
    // Below 1, fixed decimals would print 0.00123 as "0.001": keep `precision`
    // significant digits instead, still without an exponent.
    int significant = precision > 0 ? precision : 1;
    int leading_zeros = -static_cast<int>(std::floor(std::log10(magnitude))) - 1;
    int decimals = std::max(precision, leading_zeros + significant);
    text = fmt::format("{:.{}f}", value, decimals);
  } else {
    text = fmt::format("{:.{}e}", value, precision > 1 ? precision - 1 : 0);
  }
  text = drop_negative_zero(text);
  return group_digits ? group_integer_part(text) : text;
}

std::string format_any(const Value& value, int precision, bool group_digits) {
  struct Visitor {
    int precision;
    bool group_digits;
    std::string operator()(std::monostate) const { return "-"; }
    std::string operator()(bool flag) const { return flag ? "yes" : "no"; }
    std::string operator()(int64_t number) const {
      // Not util's with_thousands: it negates, which overflows for INT64_MIN.
      return group_digits ? group_integer_part(std::to_string(number)) : std::to_string(number);
    }
    std::string operator()(double number) const {
      return format_double(number, precision, group_digits);
    }
    std::string operator()(const std::string& text) const { return text; }
  };
  return std::visit(Visitor{precision, group_digits}, value);
}

}  // namespace

std::string format_value(const Value& value, const Column& column) {
  return format_any(value, column.precision, column.group_digits);
}

std::string format_fact(const Fact& fact) {
  std::string text = format_any(fact.value, fact.precision, fact.group_digits);
  if (fact.unit.empty() || std::holds_alternative<std::monostate>(fact.value)) return text;
  if (fact.unit == "%") return text + "%";
  return text + " " + fact.unit;
}

bool stdout_wants_color() {
  const char* no_color = std::getenv("NO_COLOR");
  if (no_color != nullptr && no_color[0] != '\0') return false;
  const char* term = std::getenv("TERM");
  if (term != nullptr && std::string_view(term) == "dumb") return false;
  return isatty(STDOUT_FILENO) == 1;
}

size_t display_width(std::string_view text) {
  // Terminals draw one grapheme cluster (a base plus combining marks, or an emoji
  // ZWJ sequence) in the width of its widest code point; U+FE0F (emoji
  // presentation) makes the cluster two columns wide.
  size_t width = 0;
  size_t cluster_width = 0;
  utf8proc_int32_t previous = -1;
  utf8proc_int32_t state = 0;
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(text.size());
  while (left > 0) {
    utf8proc_int32_t codepoint = 0;
    utf8proc_ssize_t used = utf8proc_iterate(bytes, left, &codepoint);
    if (used <= 0) {
      codepoint = 0xFFFD;  // shown as one replacement character
      used = 1;
    }
    bytes += used;
    left -= used;
    if (previous < 0 || utf8proc_grapheme_break_stateful(previous, codepoint, &state)) {
      width += cluster_width;
      cluster_width = 0;
    }
    previous = codepoint;
    size_t code_width = static_cast<size_t>(std::max(0, utf8proc_charwidth(codepoint)));
    if (codepoint == 0xFE0F) code_width = 2;
    cluster_width = std::max(cluster_width, code_width);
  }
  return width + cluster_width;
}

std::string escape_html(std::string_view text) {
  std::string valid = to_valid_utf8(text);
  std::string out;
  out.reserve(valid.size() + 16);
  for (char c : valid) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        // C0 controls other than tab and newline are not allowed in HTML text.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') {
          out += "\xEF\xBF\xBD";
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace kvaudit::report
