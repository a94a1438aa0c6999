// report/junit: a report as JUnit XML, the test-result format every CI shows (Jenkins,
// GitLab, GitHub test reporters). What the command gates its exit code on becomes test cases:
// each finding (failing when it reaches --fail-on) and each check (a logs --expect
// expectation, a probe --gate limit, a plan --from-log figure), in the layout of
// jenkins-junit.xsd, which tests/shell/ci_outputs.sh validates against.
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "report/report.h"
#include "util/util.h"

namespace kvaudit::report {
namespace {

// XML 1.0 allows tab, newline and carriage return below U+0020 and forbids U+FFFE and
// U+FFFF; log lines and file names may carry any byte, so text is made valid UTF-8 first
// and the forbidden characters dropped (an XML parser rejects the whole file for one).
std::string xml_text(std::string_view raw, bool attribute) {
  std::string text = to_valid_utf8(raw);
  std::string out;
  out.reserve(text.size() + 16);
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 && c != '\t' && c != '\n' && c != '\r') continue;
    // U+FFFE and U+FFFF are EF BF BE / EF BF BF.
    if (byte == 0xEF && i + 2 < text.size() && static_cast<unsigned char>(text[i + 1]) == 0xBF &&
        (static_cast<unsigned char>(text[i + 2]) & 0xFE) == 0xBE) {
      i += 2;
      continue;
    }
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
        out += attribute ? "&quot;" : "\"";
        break;
      case '\'':
        out += attribute ? "&apos;" : "'";
        break;
      // An attribute's whitespace is normalised to spaces by parsers unless written as a
      // character reference; element text keeps it as it is.
      case '\n':
        out += attribute ? "&#10;" : "\n";
        break;
      case '\r':  // a literal CR would be read back as a newline
        out += "&#13;";
        break;
      case '\t':
        out += attribute ? "&#9;" : "\t";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string attr(std::string_view text) {
  return xml_text(text, true);
}
std::string body(std::string_view text) {
  return xml_text(text, false);
}

// The finding as people read it in a CI log: the same parts as the terminal report.
std::string finding_details(const Finding& finding) {
  std::string text = fmt::format("[{}] {}\n", severity_name(finding.severity), finding.title);
  if (!finding.consequence.empty()) text += "Consequence: " + finding.consequence + "\n";
  for (const Evidence& item : finding.evidence) {
    std::string where = item.line > 0 ? fmt::format("{}:{}", item.file, item.line) : item.file;
    text += fmt::format("Evidence: {}: {} = {}\n", where, item.key, item.value);
  }
  if (!finding.judged_on.empty()) text += "Judged on: " + finding.judged_on + "\n";
  if (!finding.fix.empty()) text += "Fix: " + finding.fix + "\n";
  if (!finding.reference.empty()) text += "Reference: " + finding.reference + "\n";
  return text;
}

bool reaches(Severity severity, const std::optional<Severity>& fail_on) {
  return fail_on && severity >= *fail_on;
}

}  // namespace

bool gate_fails(const Report& report, const ExitGate& gate) {
  for (const Finding& finding : report.findings)
    if (reaches(finding.severity, gate.fail_on)) return true;
  for (const GateCheck& check : gate.checks)
    if (!check.passed) return true;
  return false;
}

std::string render_junit(const Report& report, const ExitGate& gate) {
  std::string cases;
  int64_t tests = 0, failures = 0;
  for (const Finding& finding : report.findings) {
    ++tests;
    const std::string details = finding_details(finding);
    cases += fmt::format("    <testcase classname=\"{}\" name=\"{}\">\n", attr(finding.id),
                         attr(finding.title));
    if (reaches(finding.severity, gate.fail_on)) {
      ++failures;
      cases += fmt::format("      <failure type=\"{}\" message=\"{}\">{}</failure>\n",
                           severity_name(finding.severity), attr(finding.title), body(details));
    } else {
      cases += fmt::format("      <system-out>{}</system-out>\n", body(details));
    }
    cases += "    </testcase>\n";
  }
  const std::string prefix = "kvaudit." + report.command + ".";
  for (const GateCheck& check : gate.checks) {
    ++tests;
    cases += fmt::format("    <testcase classname=\"{}\" name=\"{}\">\n", attr(prefix + check.kind),
                         attr(check.name));
    if (!check.passed) {
      ++failures;
      cases += fmt::format("      <failure type=\"{}\" message=\"{}\">{}</failure>\n",
                           attr(check.kind), attr(check.message), body(check.message));
    } else if (!check.message.empty()) {
      cases += fmt::format("      <system-out>{}</system-out>\n", body(check.message));
    }
    cases += "    </testcase>\n";
  }
  if (tests == 0) {
    // Nothing found and nothing gated: one passing test that says what ran, so CI shows a
    // test ran rather than an empty suite.
    ++tests;
    cases += fmt::format(
        "    <testcase classname=\"{}\" name=\"{}\">\n      <system-out>{}</system-out>\n"
        "    </testcase>\n",
        attr(prefix + "run"),
        attr(report.title.empty() ? "kvaudit " + report.command : report.title),
        body(report.verdict.empty() ? "no findings" : report.verdict));
  }

  const std::string suite = "kvaudit " + report.command;
  std::string properties = "    <properties>\n";
  if (!report.title.empty())
    properties +=
        fmt::format("      <property name=\"title\" value=\"{}\"/>\n", attr(report.title));
  properties += fmt::format("      <property name=\"verdict_severity\" value=\"{}\"/>\n",
                            severity_name(report.verdict_severity));
  if (!report.verdict.empty())
    properties +=
        fmt::format("      <property name=\"verdict\" value=\"{}\"/>\n", attr(report.verdict));
  properties += "    </properties>\n";
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format("<testsuites name=\"kvaudit\" tests=\"{}\" failures=\"{}\" errors=\"0\">\n",
                     tests, failures);
  out += fmt::format(
      "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"0\">\n",
      attr(suite), tests, failures);
  out += properties;
  out += cases;
  if (!report.verdict.empty())
    out += fmt::format("    <system-out>{}</system-out>\n", body(report.verdict));
  out += "  </testsuite>\n</testsuites>\n";
  return out;
}

}  // namespace kvaudit::report
