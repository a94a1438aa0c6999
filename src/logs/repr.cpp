// logs repr: a small reader for the Python reprs engines print
// (`server_args=ServerArgs(...)`, vLLM's `non-default args: {...}`). Recursive
// descent with a depth limit; stops cleanly at the end of input, so a log line cut
// in the middle of a repr still yields every complete field before the cut. Logs
// that reach users are often cut in the middle too (journalctl's "…", a pasted "...",
// a terminal that dropped part of a line): the top-level keyword arguments are read
// field by field, and reading resumes at the next `, name=` after each cut.
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "logs/logs.h"

namespace kvaudit::logs {

namespace {

constexpr int kMaxDepth = 64;

// The offset of the name in the first ", name=" (not "==") at or after `from`, or npos.
size_t next_keyword(std::string_view s, size_t from) {
  for (size_t at = s.find(", ", from); at != std::string_view::npos; at = s.find(", ", at + 1)) {
    size_t i = at + 2;
    if (i >= s.size() || !(std::isalpha(static_cast<unsigned char>(s[i])) || s[i] == '_')) continue;
    size_t j = i;
    while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
    if (j < s.size() && s[j] == '=' && (j + 1 >= s.size() || s[j + 1] != '=')) return i;
  }
  return std::string_view::npos;
}

class ReprParser {
 public:
  explicit ReprParser(std::string_view text) : s_(text) {}

  ReprResult run() {
    ReprResult result;
    skip_space();
    result.value = value(0);
    result.consumed = pos_;
    result.complete = error_.empty() && cuts_ == 0;
    result.error = error_.empty() && cuts_ > 0 ? first_cut_ : error_;
    result.cuts = cuts_ + (error_.empty() ? 0 : 1);
    return result;
  }

  // Reads `name=value, name=value ...` (the rest of a call after an elision) into `out`,
  // keeping the keys `out` already has.
  void keyword_tail(nlohmann::json& out) {
    if (!out.is_object()) return;
    nlohmann::json tail = nlohmann::json::object();
    keywords(0, tail, true);
    for (auto& [key, v] : tail.items())
      if (!out.contains(key)) out[key] = std::move(v);
    if (!error_.empty()) ++cuts_;
  }

 private:
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }
  void skip_space() {
    while (!at_end() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  void fail(const std::string& why) {
    if (error_.empty()) error_ = why + " at offset " + std::to_string(pos_);
  }
  bool ok() const { return error_.empty(); }

  static bool ident_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  }

  nlohmann::json value(int depth) {
    if (depth > kMaxDepth) {
      fail("nesting deeper than 64");
      return nullptr;
    }
    skip_space();
    if (at_end()) {
      fail("input ends where a value was expected");
      return nullptr;
    }
    char c = peek();
    if (c == '\'' || c == '"') return string_literal();
    if (c == '[') return sequence(depth, ']');
    if (c == '(') return sequence(depth, ')');
    if (c == '{') return braces(depth);
    if (c == '<') return angle();
    if (c == '-' || c == '+' || std::isdigit(static_cast<unsigned char>(c))) {
      nlohmann::json n = number();
      // "tp_size=1" cut from "tp_size=16" would read as a real value: a number that the
      // input ends in is not known.
      if (at_end() && depth > 0) fail("number cut by the end of input");
      return n;
    }
    if (ident_char(c)) {
      size_t start = pos_;
      while (!at_end() && ident_char(peek())) ++pos_;
      if (at_end() && depth > 0) {
        fail("name cut by the end of input");
        return nullptr;
      }
      std::string name(s_.substr(start, pos_ - start));
      // String prefixes: r'..', b'..', f'..', u'..'.
      if (name.size() <= 2 && (peek() == '\'' || peek() == '"')) return string_literal();
      if (name == "None") return nullptr;
      if (name == "True") return true;
      if (name == "False") return false;
      if (name == "inf") return std::numeric_limits<double>::infinity();
      if (name == "nan") return nlohmann::json("nan");
      if (peek() == '(') return call(depth);
      return name;  // torch.bfloat16, LoadFormat.AUTO ...
    }
    fail(std::string("unexpected character '") + c + "'");
    return nullptr;
  }

  nlohmann::json string_literal() {
    char quote = s_[pos_++];
    std::string out;
    while (!at_end()) {
      char c = s_[pos_++];
      if (c == quote) return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_end()) break;
      char e = s_[pos_++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '0':
          out += '\0';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'x':
        case 'u':
        case 'U': {
          size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos_ + digits > s_.size()) {
            pos_ = s_.size();
            break;
          }
          std::string hex(s_.substr(pos_, digits));
          char* end = nullptr;
          unsigned long code = std::strtoul(hex.c_str(), &end, 16);
          if (end != hex.c_str() + digits) {
            out += '\\';
            out += e;
            break;
          }
          pos_ += digits;
          append_utf8(out, code);
          break;
        }
        default:
          out += '\\';
          out += e;
      }
    }
    fail("string not closed before the end of input");
    return out;
  }

  static void append_utf8(std::string& out, unsigned long code) {
    if (code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) code = 0xFFFD;
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  nlohmann::json number() {
    size_t start = pos_;
    if (peek() == '-' || peek() == '+') ++pos_;
    if (s_.substr(pos_, 3) == "inf") {
      pos_ += 3;
      return s_[start] == '-' ? -std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::infinity();
    }
    bool is_float = false;
    while (!at_end()) {
      char c = peek();
      if (std::isdigit(static_cast<unsigned char>(c)) || c == '_') {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E') {
        is_float = true;
        ++pos_;
        if ((c == 'e' || c == 'E') && (peek() == '-' || peek() == '+')) ++pos_;
      } else {
        break;
      }
    }
    std::string text;
    for (char c : s_.substr(start, pos_ - start))
      if (c != '_') text += c;
    if (text.empty() || text == "-" || text == "+") {
      fail("malformed number");
      return nullptr;
    }
    if (!is_float) {
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (errno == 0 && end == text.c_str() + text.size()) return static_cast<int64_t>(v);
    }
    char* end = nullptr;
    double d = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size()) {
      fail("malformed number");
      return text;
    }
    return d;
  }

  // [..] or (..): arrays (tuples are arrays too).
  nlohmann::json sequence(int depth, char close) {
    ++pos_;
    nlohmann::json out = nlohmann::json::array();
    while (ok()) {
      skip_space();
      if (at_end()) {
        fail("sequence not closed before the end of input");
        break;
      }
      if (peek() == close) {
        ++pos_;
        break;
      }
      nlohmann::json v = value(depth + 1);
      if (ok() || v.is_object()) out.push_back(std::move(v));
      if (!ok()) break;
      skip_space();
      if (peek() == ',')
        ++pos_;
      else if (peek() != close)
        fail("expected ',' or closing bracket");
    }
    return out;
  }

  // {k: v} dicts ({a, b} sets become arrays).
  nlohmann::json braces(int depth) {
    ++pos_;
    nlohmann::json object = nlohmann::json::object();
    nlohmann::json set = nlohmann::json::array();
    while (ok()) {
      skip_space();
      if (at_end()) {
        fail("dict not closed before the end of input");
        break;
      }
      if (peek() == '}') {
        ++pos_;
        break;
      }
      nlohmann::json key = value(depth + 1);
      if (!ok()) break;
      skip_space();
      if (peek() == ':') {
        ++pos_;
        nlohmann::json v = value(depth + 1);
        // A value cut short is dropped (a half string would read as a real value);
        // a nested object keeps the fields it completed.
        if (ok() || v.is_object())
          object[key.is_string() ? key.get<std::string>() : key.dump()] = std::move(v);
        if (!ok()) break;
      } else {
        set.push_back(std::move(key));
      }
      skip_space();
      if (peek() == ',')
        ++pos_;
      else if (peek() != '}')
        fail("expected ',' or '}'");
    }
    return set.empty() ? object : set;
  }

  // <LoadFormat.AUTO: 'auto'> and similar: kept as text.
  nlohmann::json angle() {
    size_t start = pos_;
    int level = 0;
    while (!at_end()) {
      char c = s_[pos_++];
      if (c == '<') ++level;
      if (c == '>' && --level == 0) return std::string(s_.substr(start, pos_ - start));
    }
    fail("'<' not closed before the end of input");
    return std::string(s_.substr(start));
  }

  // Name(kw=value, ...): an object of keyword arguments; positional ones in "_args".
  nlohmann::json call(int depth) {
    ++pos_;  // '('
    nlohmann::json out = nlohmann::json::object();
    keywords(depth, out, false);
    return out;
  }

  // The arguments of a call up to its ')'. At the top level (depth 0: the ServerArgs
  // call itself) a value that cannot be read is a cut: it is skipped to the next
  // `, name=` and counted, so one damaged field does not lose the rest.
  void keywords(int depth, nlohmann::json& out, bool tail) {
    while (true) {
      if (!ok()) {
        if (depth != 0 || !resync()) break;
      }
      skip_space();
      if (at_end()) {
        if (!tail) fail("call not closed before the end of input");
        break;
      }
      if (peek() == ')') {
        ++pos_;
        break;
      }
      size_t save = pos_;
      size_t start = pos_;
      while (!at_end() && (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '_'))
        ++pos_;
      std::string name(s_.substr(start, pos_ - start));
      skip_space();
      size_t value_start = pos_;
      if (!name.empty() && peek() == '=' && s_.substr(pos_, 2) != "==") {
        value_start = ++pos_;
        nlohmann::json v = value(depth + 1);
        if (ok() || v.is_object()) out[name] = std::move(v);
      } else {
        pos_ = save;
        nlohmann::json v = value(depth + 1);
        // Positional arguments go under "_args", unless a keyword of that name came first
        // (found by fuzz_logs: `X(_args=1, 2)` threw nlohmann's type_error out of the scan).
        if (ok() || v.is_object()) {
          nlohmann::json& args = out["_args"];
          if (args.is_null()) args = nlohmann::json::array();
          if (args.is_array()) args.push_back(std::move(v));
        }
      }
      if (!ok()) {
        // A damaged value may have swallowed the fields after it (an unclosed quote):
        // look for the next field from where the value began.
        if (depth == 0) pos_ = value_start;
        continue;
      }
      skip_space();
      if (peek() == ',')
        ++pos_;
      else if (peek() != ')')
        fail("expected ',' or ')'");
    }
  }

  // After a failure at the top level: the next ", name=" (not "=="), if any.
  bool resync() {
    size_t i = next_keyword(s_, pos_ > 0 ? pos_ - 1 : 0);
    if (i == std::string_view::npos) return false;
    if (first_cut_.empty()) first_cut_ = error_;
    ++cuts_;
    error_.clear();
    pos_ = i;
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string error_;
  std::string first_cut_;
  int cuts_ = 0;
};

// Where a person or a tool elided part of a line: "…" (U+2026) or a run of 3+ dots
// outside any quoted value would be a syntax error anyway.
std::vector<std::pair<size_t, size_t>> elisions(std::string_view text) {
  std::vector<std::pair<size_t, size_t>> out;  // [begin, end) of each marker
  for (size_t i = 0; i < text.size() && out.size() < 1024;) {
    if (text.compare(i, 3, "\xE2\x80\xA6") == 0) {
      out.push_back({i, i + 3});
      i += 3;
    } else if (text.compare(i, 3, "...") == 0) {
      size_t j = i;
      while (j < text.size() && text[j] == '.') ++j;
      out.push_back({i, j});
      i = j;
    } else {
      ++i;
    }
  }
  return out;
}

}  // namespace

ReprResult parse_python_repr(std::string_view text) {
  const auto marks = elisions(text);
  if (marks.empty()) return ReprParser(text).run();
  ReprResult result = ReprParser(text.substr(0, marks[0].first)).run();
  result.complete = false;
  result.cuts = std::max(result.cuts, 1);
  if (result.error.empty()) result.error = "elided at offset " + std::to_string(marks[0].first);
  for (size_t m = 0; m < marks.size(); ++m) {
    size_t end = m + 1 < marks.size() ? marks[m + 1].first : text.size();
    std::string_view segment = text.substr(marks[m].second, end - marks[m].second);
    // Resume at the segment's start when the elision fell between two fields
    // ("x=1, ..., y=2"); else (it cut a name or a value) at its first ", name=".
    size_t at = 0;
    while (at < segment.size() && (segment[at] == ',' || segment[at] == ' ')) ++at;
    std::string_view before = text.substr(0, marks[m].first);
    while (!before.empty() && before.back() == ' ') before.remove_suffix(1);
    const bool between_fields =
        (!before.empty() && (before.back() == ',' || before.back() == '(')) ||
        (!segment.empty() && segment[0] == ',');
    if (!between_fields) at = next_keyword(segment, 0);
    if (at == std::string_view::npos) {
      if (m > 0) ++result.cuts;
      continue;
    }
    ReprParser tail(segment.substr(at));
    tail.keyword_tail(result.value);
    if (m > 0) ++result.cuts;
    result.consumed = end;
  }
  return result;
}

}  // namespace kvaudit::logs
