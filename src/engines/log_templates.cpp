// Log templates: an engine's log message as its own format string (printf `%s` /
// `%.2f`, or Python `{}` / `{name:,}` / `{x:.2f}`), compiled once into a PCRE2 matcher
// that captures each placeholder. Literal text matches exactly; numeric placeholders
// match numbers (thousands commas allowed), the others any text up to the next literal.
#include <fmt/format.h>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

// Regex JIT-compiles on the first line that reaches the matcher: a registry load compiles
// every template of every engine, and most never meet a line (JIT at load was a quarter of
// the engine-data mutation test's time).
struct CompiledTemplate {
  Regex regex;
  size_t placeholders = 0;
};

namespace {

struct Piece {
  bool placeholder = false;
  bool numeric = false;
  std::string literal;
};

bool numeric_spec(std::string_view spec) {
  // printf conversions and Python format specs that print a number.
  if (spec.empty()) return false;
  char type = spec.back();
  return type == 'd' || type == 'i' || type == 'f' || type == 'e' || type == 'g' || type == ',' ||
         type == '%' || type == 'u';
}

// Splits a template into literal runs and placeholders; throws std::invalid_argument
// with a reason when it is malformed.
std::vector<Piece> split_template(std::string_view text) {
  std::vector<Piece> pieces;
  std::string literal;
  auto flush = [&] {
    if (!literal.empty()) pieces.push_back({false, false, literal});
    literal.clear();
  };
  const bool python =
      text.find('{') != std::string_view::npos || text.find('}') != std::string_view::npos;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (python) {
      if (c == '{' && i + 1 < text.size() && text[i + 1] == '{') {
        literal.push_back('{');
        ++i;
      } else if (c == '}' && i + 1 < text.size() && text[i + 1] == '}') {
        literal.push_back('}');
        ++i;
      } else if (c == '{') {
        size_t close = text.find('}', i);
        if (close == std::string_view::npos) throw std::invalid_argument("unclosed '{'");
        std::string_view inside = text.substr(i + 1, close - i - 1);
        if (inside.find('{') != std::string_view::npos)
          throw std::invalid_argument("nested '{' in a placeholder");
        size_t colon = inside.find(':');
        std::string_view spec = colon == std::string_view::npos ? "" : inside.substr(colon + 1);
        flush();
        pieces.push_back({true, numeric_spec(spec), ""});
        i = close;
      } else if (c == '}') {
        throw std::invalid_argument("unmatched '}'");
      } else {
        literal.push_back(c);
      }
      continue;
    }
    if (c != '%') {
      literal.push_back(c);
      continue;
    }
    if (i + 1 < text.size() && text[i + 1] == '%') {
      literal.push_back('%');
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < text.size() &&
           std::string_view("0123456789.-+ #").find(text[j]) != std::string_view::npos)
      ++j;
    if (j >= text.size() || std::string_view("sdifrxeEgGu").find(text[j]) == std::string_view::npos)
      throw std::invalid_argument(fmt::format("unknown printf conversion at offset {}", i));
    flush();
    pieces.push_back({true, numeric_spec(std::string_view(&text[j], 1)), ""});
    i = j;
  }
  flush();
  return pieces;
}

std::string quote_literal(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}/-#").find(c) != std::string_view::npos)
      out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace

void compile_log_template(LogTemplate& log) {
  std::vector<Piece> pieces = split_template(log.text);
  std::string pattern;
  size_t placeholders = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    if (!piece.placeholder) {
      pattern += quote_literal(piece.literal);
      if (piece.literal.size() > log.anchor.size()) log.anchor = piece.literal;
      continue;
    }
    ++placeholders;
    const bool last = i + 1 == pieces.size();
    // A bare "{}" that prints a number (Python f-strings carry no spec) is still a number:
    // the field says so. Matched as text, "=0.88." would capture "0" before the ".".
    const bool numeric_field =
        placeholders <= log.fields.size() && is_numeric_log_field(log.fields[placeholders - 1]);
    if (piece.numeric || numeric_field)
      pattern += R"(([-+]?(?:[0-9][0-9,]*(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|nan|inf))";
    else
      pattern += last ? "(.*)" : "(.*?)";
  }
  if (placeholders != log.fields.size())
    throw std::invalid_argument(
        fmt::format("{} placeholder(s) but {} field name(s)", placeholders, log.fields.size()));
  // The pre-filter finds candidate lines by a literal run; a short one would match
  // everywhere (and the filter needs 7 bytes).
  if (log.anchor.size() < 7)
    throw std::invalid_argument("no literal run of at least 7 characters to find the line by");
  log.compiled = std::make_shared<CompiledTemplate>(CompiledTemplate{Regex(pattern), placeholders});
}

std::optional<std::vector<std::string>> match_log_template(const LogTemplate& log,
                                                           std::string_view message) {
  if (!log.compiled || message.find(log.anchor) == std::string_view::npos) return std::nullopt;
  // Byte mode: log lines are not validated UTF-8, and every literal is plain bytes.
  auto groups = log.compiled->regex.search(message);
  if (!groups) return std::nullopt;
  std::vector<std::string> captures;
  for (size_t i = 1; i <= log.compiled->placeholders; ++i)
    captures.emplace_back(i < groups->size() ? groups->at(i).value_or("") : "");
  return captures;
}

}  // namespace kvaudit::engines
