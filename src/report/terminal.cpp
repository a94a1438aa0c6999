// report/terminal: the plain-text rendering people read in a shell. Aligned
// fact lines and tables (by display width, so CJK text and emoji do not skew
// columns), findings grouped by severity, and the verdict as the last line.
// Text that came from files or servers is made safe first: a log line holding
// an escape sequence must not recolour or move the user's terminal.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <utf8proc.h>

#include "report/report.h"
#include "util/util.h"

namespace kvaudit::report {
namespace {

constexpr const char* kReset = "\x1b[0m";
constexpr const char* kBold = "\x1b[1m";
constexpr const char* kDim = "\x1b[2m";

const char* severity_color(Severity severity) {
  switch (severity) {
    case Severity::critical:
      return "\x1b[1;31m";
    case Severity::warning:
      return "\x1b[1;33m";
    case Severity::info:
      return "\x1b[36m";
  }
  return "";
}

// Control characters (C0, DEL, C1) become visible escapes such as "\x1b"; a
// newline is kept only where the caller wraps text itself.
std::string terminal_safe(std::string_view text, bool keep_newlines = false) {
  std::string valid = to_valid_utf8(text);
  std::string out;
  out.reserve(valid.size());
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(valid.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(valid.size());
  while (left > 0) {
    utf8proc_int32_t codepoint = 0;
    utf8proc_ssize_t used = utf8proc_iterate(bytes, left, &codepoint);
    if (used <= 0) used = 1;  // cannot happen after to_valid_utf8; never loop forever
    bool control = codepoint < 0x20 || (codepoint >= 0x7f && codepoint <= 0x9f);
    if (codepoint == '\n' && keep_newlines) {
      out += '\n';
    } else if (codepoint == '\t') {
      out += ' ';
    } else if (control) {
      out += fmt::format("\\x{:02x}", codepoint);
    } else {
      out.append(reinterpret_cast<const char*>(bytes), static_cast<size_t>(used));
    }
    bytes += used;
    left -= used;
  }
  return out;
}

std::string pad(const std::string& text, size_t width, bool align_right) {
  size_t shown = display_width(text);
  std::string fill(shown < width ? width - shown : 0, ' ');
  return align_right ? fill + text : text + fill;
}

// Word-wraps already-safe text so no line exceeds `width` columns where words
// allow; the first line follows `first_prefix`, the others `rest_prefix`.
std::string wrap(const std::string& text, size_t width, const std::string& first_prefix,
                 const std::string& rest_prefix) {
  std::string out;
  size_t paragraph_start = 0;
  bool first_line = true;
  while (paragraph_start <= text.size()) {
    size_t paragraph_end = text.find('\n', paragraph_start);
    if (paragraph_end == std::string::npos) paragraph_end = text.size();
    std::string_view paragraph(text.data() + paragraph_start, paragraph_end - paragraph_start);
    std::string line = first_line ? first_prefix : rest_prefix;
    size_t line_width = display_width(line);
    size_t prefix_width = line_width;
    first_line = false;
    size_t pos = 0;
    while (pos < paragraph.size()) {
      size_t word_end = paragraph.find(' ', pos);
      if (word_end == std::string_view::npos) word_end = paragraph.size();
      std::string_view word = paragraph.substr(pos, word_end - pos);
      pos = word_end + 1;
      if (word.empty()) continue;
      size_t word_width = display_width(word);
      if (line_width > prefix_width && line_width + 1 + word_width > width) {
        out += line + '\n';
        line = rest_prefix;
        line_width = prefix_width = display_width(line);
      }
      if (line_width > prefix_width) {
        line += ' ';
        ++line_width;
      }
      line += word;
      line_width += word_width;
    }
    out += line + '\n';
    paragraph_start = paragraph_end + 1;
  }
  return out;
}

class Painter {
 public:
  explicit Painter(bool color) : color_(color) {}
  std::string operator()(const std::string& text, const char* code) const {
    return color_ ? std::string(code) + text + kReset : text;
  }

 private:
  bool color_;
};

std::string terminal_facts(const std::vector<Fact>& facts) {
  size_t label_width = 0;
  std::vector<std::string> labels;
  for (const Fact& fact : facts) {
    labels.push_back(terminal_safe(fact.label) + ":");
    label_width = std::max(label_width, display_width(labels.back()));
  }
  std::string out;
  for (size_t i = 0; i < facts.size(); ++i) {
    out += "  " + pad(labels[i], label_width, false) + " " + terminal_safe(format_fact(facts[i])) +
           '\n';
  }
  return out;
}

bool is_numeric_column(const Table& table, size_t column) {
  bool any_number = false;
  for (const auto& row : table.rows) {
    if (column >= row.size()) continue;
    const Value& value = row[column];
    if (std::holds_alternative<int64_t>(value) || std::holds_alternative<double>(value)) {
      any_number = true;
    } else if (!std::holds_alternative<std::monostate>(value)) {
      return false;
    }
  }
  return any_number;
}

std::string terminal_table(const Table& table, size_t width, const Painter& paint) {
  size_t column_count = table.columns.size();
  std::vector<std::string> headers;
  std::vector<size_t> widths;
  std::vector<bool> numeric;
  for (size_t c = 0; c < column_count; ++c) {
    const Column& column = table.columns[c];
    std::string header = terminal_safe(column.label);
    if (!column.unit.empty()) header += " (" + terminal_safe(column.unit) + ")";
    headers.push_back(header);
    widths.push_back(display_width(header));
    numeric.push_back(is_numeric_column(table, c));
  }
  std::vector<std::vector<std::string>> cells;
  for (const auto& row : table.rows) {
    std::vector<std::string> line;
    for (size_t c = 0; c < column_count; ++c) {
      std::string cell =
          c < row.size() ? terminal_safe(format_value(row[c], table.columns[c])) : "";
      widths[c] = std::max(widths[c], display_width(cell));
      line.push_back(std::move(cell));
    }
    cells.push_back(std::move(line));
  }
  auto join = [&](const std::vector<std::string>& parts) {
    std::string line = " ";
    for (size_t c = 0; c < column_count; ++c) {
      line += c == 0 ? " " : "  ";
      line += pad(parts[c], widths[c], numeric[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line + '\n';
  };
  std::string out;
  if (!table.title.empty()) out += paint(terminal_safe(table.title), kBold) + '\n';
  std::string header_line = join(headers);
  header_line.pop_back();
  out += paint(header_line, kBold) + '\n';
  std::vector<std::string> rules;
  rules.reserve(widths.size());
  for (size_t column_width : widths) rules.emplace_back(column_width, '-');
  out += join(rules);
  for (const auto& line : cells) out += join(line);
  if (!table.note.empty()) out += wrap(terminal_safe(table.note, true), width, "  ", "  ");
  return out;
}

std::string evidence_text(const Evidence& evidence) {
  // file:line, as compilers and editors spell a place.
  std::string text = terminal_safe(evidence.file);
  if (evidence.line > 0) text += fmt::format(":{}", evidence.line);
  if (!evidence.key.empty()) text += (text.empty() ? "" : ": ") + terminal_safe(evidence.key);
  if (!evidence.value.empty()) {
    text += (text.empty() ? "" : " = ") + terminal_safe(evidence.value);
  }
  return text;
}

std::string terminal_findings(const std::vector<Finding>& findings, size_t width,
                              const Painter& paint) {
  std::string out;
  const std::string indent(5, ' ');
  const std::string value_indent = indent + std::string(13, ' ');
  auto field = [&](const std::string& label, const std::string& text) {
    if (text.empty()) return std::string();
    std::string head = indent + pad(label + ":", 13, false);
    return wrap(terminal_safe(text, true), width, head, value_indent);
  };
  for (Severity severity : {Severity::critical, Severity::warning, Severity::info}) {
    size_t count = 0;
    for (const Finding& finding : findings) count += finding.severity == severity;
    if (count == 0) continue;
    std::string heading = std::string(severity_name(severity)) + " (" + std::to_string(count) + ")";
    std::transform(heading.begin(), heading.end(), heading.begin(), ::toupper);
    out += '\n' + paint(heading, severity_color(severity)) + '\n';
    size_t number = 0;
    for (const Finding& finding : findings) {
      if (finding.severity != severity) continue;
      ++number;
      std::string head = pad(fmt::format("  {}.", number), indent.size(), false);
      std::string title = terminal_safe(finding.title);
      if (!finding.id.empty()) title += "  [" + terminal_safe(finding.id) + "]";
      out += wrap(title, width, head, indent);
      out += field("Consequence", finding.consequence);
      for (size_t e = 0; e < finding.evidence.size(); ++e) {
        std::string head_label = indent + pad(e == 0 ? "Evidence:" : "", 13, false);
        out += wrap(evidence_text(finding.evidence[e]), width, head_label, value_indent);
      }
      if (!finding.judged_on.empty())
        out += field("Judged on", fmt::format("{}: {}", finding.basis, finding.judged_on));
      out += field("Fix", finding.fix);
      out += field("Reference", finding.reference);
    }
  }
  return out;
}

std::string verdict_line(const Report& report, const Painter& paint) {
  std::string line = "Verdict [" + std::string(severity_name(report.verdict_severity)) +
                     "]: " + terminal_safe(report.verdict);
  const char* code = report.verdict_severity == Severity::info
                         ? "\x1b[1;32m"
                         : severity_color(report.verdict_severity);
  return paint(line, code) + '\n';
}

}  // namespace

std::string render_terminal(const Report& report, const TerminalOptions& options) {
  Painter paint(options.color);
  if (options.quiet) return verdict_line(report, paint);
  size_t width = options.width > 20 ? static_cast<size_t>(options.width) : 20;
  std::string out;
  if (!report.title.empty()) out += paint(terminal_safe(report.title), kBold) + "\n";
  if (!report.facts.empty()) out += '\n' + terminal_facts(report.facts);
  for (const Table& table : report.tables) out += '\n' + terminal_table(table, width, paint);
  if (!report.charts.empty()) {
    std::string titles;
    for (const Chart& chart : report.charts) {
      titles += (titles.empty() ? "" : "; ") +
                terminal_safe(chart.title.empty() ? chart.id : chart.title);
    }
    std::string text = wrap("Charts (see --html or --json): " + titles, width, "", "  ");
    text.pop_back();  // keep the newline outside the colour
    out += '\n' + paint(text, kDim) + '\n';
  }
  if (!report.findings.empty()) out += terminal_findings(report.findings, width, paint);
  if (!report.notes.empty()) {
    out += '\n';
    for (const std::string& note : report.notes)
      out += wrap(terminal_safe(note, true), width, "Note: ", "      ");
  }
  out += '\n' + verdict_line(report, paint);
  return out;
}

}  // namespace kvaudit::report
