// Fuzzes the CI outputs, SARIF and JUnit, with what findings carry from outside: log lines,
// file names, flag values and messages hold any bytes (invalid UTF-8, NULs, control
// characters, quotes, angle brackets, ampersands). The input is cut into a report's
// findings, evidence and gate checks. Invariants: render_sarif's text parses as JSON and
// holds one result per finding; render_junit's text is well-formed XML 1.0 (valid UTF-8, only
// the characters XML allows, every '<' a tag, every '&' an entity, tags balanced) with one
// test case per finding and per check.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "report/report.h"

namespace {

using kvaudit::report::Severity;

// The next UTF-8 code point of `text` at `i` (advancing i), or -1 when it is not valid UTF-8.
int32_t next_code_point(std::string_view text, size_t& i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(i);
  int length = lead < 0x80         ? 1
               : (lead >> 5) == 6  ? 2
               : (lead >> 4) == 14 ? 3
               : (lead >> 3) == 30 ? 4
                                   : 0;
  if (length == 0 || i + length > text.size()) return -1;
  int32_t cp = length == 1 ? lead : lead & (0x3f >> (length - 1));
  for (int k = 1; k < length; ++k) {
    if ((byte(i + k) >> 6) != 2) return -1;
    cp = (cp << 6) | (byte(i + k) & 0x3f);
  }
  static constexpr int32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kSmallest[length] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return -1;
  i += static_cast<size_t>(length);
  return cp;
}

// XML 1.0's Char production.
bool xml_char(int32_t cp) {
  return cp == 0x9 || cp == 0xa || cp == 0xd || (cp >= 0x20 && cp <= 0xd7ff) ||
         (cp >= 0xe000 && cp <= 0xfffd) || (cp >= 0x10000 && cp <= 0x10ffff);
}

// Well-formedness as far as a writer can break it: characters, markup and entities, nesting.
// Counts the <testcase elements.
bool well_formed_xml(std::string_view xml, size_t& test_cases) {
  std::vector<std::string_view> open;
  size_t i = 0;
  while (i < xml.size()) {
    const char c = xml[i];
    if (c == '<') {
      const size_t end = xml.find('>', i);
      if (end == std::string_view::npos) return false;
      std::string_view tag = xml.substr(i + 1, end - i - 1);
      if (tag.size() >= 1 && (tag[0] == '?' || tag[0] == '!')) {
        i = end + 1;
        continue;
      }
      const bool closing = !tag.empty() && tag[0] == '/';
      const bool empty = !tag.empty() && tag.back() == '/';
      std::string_view name = tag.substr(closing ? 1 : 0);
      name = name.substr(0, name.find_first_of(" \t\n/"));
      if (name.empty()) return false;
      // Attribute values: quoted, without '<'; entities are checked below like text.
      for (size_t k = 0, quote = 0; k < tag.size(); ++k) {
        if (tag[k] == '"') quote ^= 1;
        if (tag[k] == '<') return false;
        if (k + 1 == tag.size() && quote) return false;
      }
      if (closing) {
        if (open.empty() || open.back() != name) return false;
        open.pop_back();
      } else if (!empty) {
        open.push_back(name);
      }
      if (!closing && name == "testcase") ++test_cases;
      // The characters inside the tag must be valid too.
      for (size_t k = i + 1; k < end;) {
        const int32_t cp = next_code_point(xml, k);
        if (cp < 0 || !xml_char(cp)) return false;
      }
      i = end + 1;
      continue;
    }
    if (c == '&') {
      const size_t semi = xml.find(';', i);
      if (semi == std::string_view::npos || semi - i > 10) return false;
      const std::string_view entity = xml.substr(i + 1, semi - i - 1);
      if (entity != "lt" && entity != "gt" && entity != "amp" && entity != "quot" &&
          entity != "apos" && !(entity.size() > 1 && entity[0] == '#'))
        return false;
      i = semi + 1;
      continue;
    }
    const int32_t cp = next_code_point(xml, i);
    if (cp < 0 || !xml_char(cp)) return false;
  }
  return open.empty();
}

std::string text(FuzzedDataProvider& in) {
  return in.ConsumeRandomLengthString(64);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  kvaudit::report::Report report;
  report.command = in.PickValueInArray({"check", "logs", "probe", "plan"});
  report.title = text(in);
  report.verdict = text(in);
  const size_t findings = in.ConsumeIntegralInRange<size_t>(0, 6);
  for (size_t f = 0; f < findings; ++f) {
    kvaudit::report::Finding finding;
    finding.id = text(in);
    finding.severity = in.PickValueInArray({Severity::info, Severity::warning, Severity::critical});
    finding.title = text(in);
    finding.consequence = text(in);
    finding.fix = text(in);
    finding.reference = text(in);
    const size_t evidence = in.ConsumeIntegralInRange<size_t>(0, 3);
    for (size_t e = 0; e < evidence; ++e)
      finding.evidence.push_back({text(in), text(in), text(in), in.ConsumeIntegral<int64_t>()});
    report.findings.push_back(std::move(finding));
  }
  kvaudit::report::ExitGate gate;
  if (in.ConsumeBool())
    gate.fail_on = in.PickValueInArray({Severity::info, Severity::warning, Severity::critical});
  const size_t checks = in.ConsumeIntegralInRange<size_t>(0, 4);
  for (size_t c = 0; c < checks; ++c)
    gate.checks.push_back({in.PickValueInArray({"expect", "figure", "gate", "verdict"}), text(in),
                           in.ConsumeBool(), text(in)});

  kvaudit::report::SarifOptions sarif_options;
  sarif_options.tool_version = "0.1.0";
  sarif_options.working_directory = "/nonexistent-kvaudit-fuzz";
  sarif_options.fallback_file = in.ConsumeBool() ? text(in) : "";
  const std::string sarif = kvaudit::report::render_sarif(report, sarif_options);
  const nlohmann::json parsed = nlohmann::json::parse(sarif, nullptr, false);
  if (parsed.is_discarded()) __builtin_trap();
  if (parsed.at("runs").at(0).at("results").size() != report.findings.size()) __builtin_trap();

  const std::string junit = kvaudit::report::render_junit(report, gate);
  size_t test_cases = 0;
  if (!well_formed_xml(junit, test_cases)) __builtin_trap();
  if (test_cases < report.findings.size() + gate.checks.size()) __builtin_trap();
  return 0;
}
