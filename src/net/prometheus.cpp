// The Prometheus text exposition format, enough to read vLLM's /metrics: sample lines
// `name{label="value",...} value [timestamp]`, comments, escapes in label values.
#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "net/net.h"

namespace kvaudit::net {

namespace {

bool name_char(char c, bool first) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
         (!first && std::isdigit(static_cast<unsigned char>(c)));
}

struct LineParser {
  std::string_view line;
  size_t at = 0;
  const std::string& where;
  size_t line_number;

  [[noreturn]] void fail(const std::string& problem) const {
    throw InputError(where, fmt::format("line {}: {}", line_number, problem));
  }
  void skip_blanks() {
    while (at < line.size() && (line[at] == ' ' || line[at] == '\t')) ++at;
  }
  std::string name() {
    size_t begin = at;
    while (at < line.size() && name_char(line[at], at == begin)) ++at;
    if (at == begin) fail("expected a metric or label name");
    return std::string(line.substr(begin, at - begin));
  }
  std::string quoted() {
    if (at >= line.size() || line[at] != '"') fail("expected '\"' to open a label value");
    ++at;
    std::string value;
    while (true) {
      if (at >= line.size()) fail("unterminated label value");
      char c = line[at++];
      if (c == '"') break;
      if (c == '\\') {
        if (at >= line.size()) fail("unterminated escape in a label value");
        char e = line[at++];
        value.push_back(e == 'n' ? '\n' : e);  // \\ and \" stand for themselves
      } else {
        value.push_back(c);
      }
    }
    return value;
  }
  double number() {
    size_t begin = at;
    while (at < line.size() && line[at] != ' ' && line[at] != '\t') ++at;
    std::string text(line.substr(begin, at - begin));
    if (text.empty()) fail("expected a sample value");
    if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (text == "+Inf" || text == "Inf") return std::numeric_limits<double>::infinity();
    if (text == "-Inf") return -std::numeric_limits<double>::infinity();
    char* end = nullptr;
    double value = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size()) fail(fmt::format("'{}' is not a number", text));
    return value;
  }
};

}  // namespace

std::vector<MetricSample> parse_prometheus(std::string_view text, const std::string& where) {
  std::vector<MetricSample> samples;
  size_t line_number = 0;
  while (!text.empty()) {
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    LineParser parser{line, 0, where, line_number};
    parser.skip_blanks();
    if (parser.at >= line.size() || line[parser.at] == '#') continue;
    MetricSample sample;
    sample.name = parser.name();
    parser.skip_blanks();
    if (parser.at < line.size() && line[parser.at] == '{') {
      ++parser.at;
      while (true) {
        parser.skip_blanks();
        if (parser.at < line.size() && line[parser.at] == '}') {
          ++parser.at;
          break;
        }
        std::string key = parser.name();
        parser.skip_blanks();
        if (parser.at >= line.size() || line[parser.at] != '=') parser.fail("expected '='");
        ++parser.at;
        parser.skip_blanks();
        sample.labels[key] = parser.quoted();
        parser.skip_blanks();
        if (parser.at < line.size() && line[parser.at] == ',') {
          ++parser.at;
          continue;
        }
        if (parser.at < line.size() && line[parser.at] == '}') {
          ++parser.at;
          break;
        }
        parser.fail("expected ',' or '}' after a label");
      }
    }
    parser.skip_blanks();
    sample.value = parser.number();
    parser.skip_blanks();
    if (parser.at < line.size()) parser.number();  // optional timestamp
    parser.skip_blanks();
    if (parser.at < line.size()) parser.fail("unexpected text after the sample");
    samples.push_back(std::move(sample));
  }
  return samples;
}

}  // namespace kvaudit::net
