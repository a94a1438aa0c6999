// SARIF and JUnit renderers: where a result points (the evidence line, a unit's file, a file
// outside the working directory, nothing), severities as levels, fingerprints that survive a
// moved line, and JUnit's escaping read back by a real XML parser (xmllint). The whole files
// are validated against their schemas by tests/shell/ci_outputs.sh.
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "report/report.h"

namespace kvaudit::report {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// A folder of its own per test, standing for the repository CI checks out.
class Workspace {
 public:
  explicit Workspace(const std::string& name)
      : root_(fs::temp_directory_path() /
              ("kvaudit-ci-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  ~Workspace() { fs::remove_all(root_); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  fs::path write(const std::string& relative, const std::string& text = "x\n") const {
    fs::path path = root_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path;
  }
  const fs::path& root() const { return root_; }

 private:
  fs::path root_;
};

Finding finding(const std::string& id, Severity severity, std::vector<Evidence> evidence = {}) {
  Finding out;
  out.id = id;
  out.severity = severity;
  out.title = id + " title";
  out.consequence = id + " consequence";
  out.fix = "launch with --kv-cache-dtype bf16";
  out.reference = "python/sglang/srt/layers/quantization/kv_cache.py@078e5e2a";
  out.evidence = std::move(evidence);
  return out;
}

Report report_of(std::vector<Finding> findings, const std::string& command = "check") {
  Report report;
  report.command = command;
  report.title = "kvaudit " + command + ": test";
  report.verdict = "verdict line";
  report.findings = std::move(findings);
  return report;
}

nlohmann::json sarif(const Report& report, const fs::path& root, const std::string& fallback = "") {
  SarifOptions options{.tool_version = "9.8.7", .working_directory = root.string()};
  options.fallback_file = fallback;
  return nlohmann::json::parse(render_sarif(report, options));
}

ExitGate failing_from(Severity severity) {
  ExitGate gate;
  gate.fail_on = severity;
  return gate;
}

// By value: callers pass the temporary a render returns.
nlohmann::json only_location(const nlohmann::json& result) {
  EXPECT_EQ(result["locations"].size(), 1u);
  return result["locations"][0];
}

TEST(Sarif, ResultSitsOnTheLineItsEvidenceNames) {
  Workspace work("line");
  fs::path unit = work.write("deploy/sglang.service");
  Report report = report_of(
      {finding("fp8-unit-scale", Severity::critical,
               {{"launch flags", "--tp", "8"}, {unit.string(), "--kv-cache-dtype", "auto", 12}})});
  nlohmann::json log = sarif(report, work.root());
  const nlohmann::json physical = only_location(log["runs"][0]["results"][0])["physicalLocation"];
  EXPECT_EQ(physical["region"]["startLine"], 12);
  EXPECT_EQ(physical["artifactLocation"]["uri"], "deploy/sglang.service");
  EXPECT_EQ(physical["artifactLocation"]["uriBaseId"], "%SRCROOT%");
  std::string root_uri = log["runs"][0]["originalUriBaseIds"]["%SRCROOT%"]["uri"];
  EXPECT_EQ(root_uri, "file://" + work.root().string() + "/");
  EXPECT_EQ(log["version"], "2.1.0");
  EXPECT_EQ(log["runs"][0]["tool"]["driver"]["version"], "9.8.7");
}

TEST(Sarif, WithoutALineTheFirstExistingFileWinsAndAUnitLabelNamesItsFile) {
  Workspace work("file");
  fs::path unit = work.write("units/a.service");
  fs::path config = work.write("model/config.json");
  // "launch" is a label, the missing file does not exist: the unit's file is the first file.
  Report report = report_of({finding("kv-auto-quantized", Severity::warning,
                                     {{"launch", "--kv-cache-dtype", "auto"},
                                      {(work.root() / "missing.json").string(), "k", "v"},
                                      {"unit " + unit.string(), "ExecStart", "python -m sglang"},
                                      {config.string(), "quantization_config", "fp8"}})});
  const nlohmann::json physical =
      only_location(sarif(report, work.root())["runs"][0]["results"][0])["physicalLocation"];
  EXPECT_EQ(physical["artifactLocation"]["uri"], "units/a.service");
  EXPECT_EQ(physical["region"]["startLine"], 1);
}

TEST(Sarif, FilesOutsideTheWorkingDirectoryAreAbsoluteAndPercentEncoded) {
  Workspace repo("repo"), elsewhere("elsewhere");
  fs::path odd = elsewhere.write("my model#1/c:onfig 100%.json");
  Report report = report_of({finding("x", Severity::info, {{odd.string(), "k", "v", 3}})});
  const nlohmann::json artifact = only_location(
      sarif(report, repo.root())["runs"][0]["results"][0])["physicalLocation"]["artifactLocation"];
  EXPECT_EQ(artifact["uri"],
            "file://" + elsewhere.root().string() + "/my%20model%231/c%3Aonfig%20100%25.json");
  EXPECT_FALSE(artifact.contains("uriBaseId"));
}

TEST(Sarif, WithoutAFileAResultHasALogicalLocationOrTheCommandsInput) {
  Workspace work("logical");
  Report report = report_of({finding("probe-kv-dtype-unknown", Severity::info,
                                     {{"server:http://127.0.0.1:30000", "kv_cache_dtype", ""}})});
  const nlohmann::json location =
      only_location(sarif(report, work.root())["runs"][0]["results"][0]);
  EXPECT_FALSE(location.contains("physicalLocation"));
  EXPECT_EQ(location["logicalLocations"][0]["name"], "server:http://127.0.0.1:30000");
  EXPECT_EQ(location["logicalLocations"][0]["fullyQualifiedName"],
            "server:http://127.0.0.1:30000: kv_cache_dtype");
  // With the command's input file: that file, at its top, and still the logical name.
  fs::path log_file = work.write("server.log");
  const nlohmann::json fallback =
      only_location(sarif(report, work.root(), log_file.string())["runs"][0]["results"][0]);
  EXPECT_EQ(fallback["physicalLocation"]["artifactLocation"]["uri"], "server.log");
  EXPECT_EQ(fallback["physicalLocation"]["region"]["startLine"], 1);
  EXPECT_EQ(fallback["logicalLocations"][0]["name"], "server:http://127.0.0.1:30000");
}

TEST(Sarif, SeveritiesBecomeLevelsAndEachIdOneRule) {
  Workspace work("levels");
  Finding linked = finding("c", Severity::critical, {});
  linked.reference = "https://github.com/sgl-project/sglang/pull/18394";
  linked.basis = "published";
  linked.judged_on = "published measurements on the family";
  Report report = report_of({linked, finding("w", Severity::warning), finding("i", Severity::info),
                             finding("c", Severity::critical)});
  nlohmann::json run = sarif(report, work.root())["runs"][0];
  std::vector<std::string> levels;
  for (const auto& result : run["results"]) levels.push_back(result["level"]);
  EXPECT_EQ(levels, (std::vector<std::string>{"error", "warning", "note", "error"}));
  ASSERT_EQ(run["tool"]["driver"]["rules"].size(), 3u);
  const nlohmann::json& rule = run["tool"]["driver"]["rules"][0];
  EXPECT_EQ(rule["id"], "c");
  EXPECT_EQ(rule["shortDescription"]["text"], "c title");
  EXPECT_EQ(rule["fullDescription"]["text"], "c consequence");
  EXPECT_THAT(rule["help"]["text"].get<std::string>(), HasSubstr("Fix: launch with"));
  EXPECT_EQ(rule["helpUri"], "https://github.com/sgl-project/sglang/pull/18394");
  EXPECT_EQ(rule["defaultConfiguration"]["level"], "error");
  // A reference that is a source path is help text, not a helpUri.
  EXPECT_FALSE(run["tool"]["driver"]["rules"][1].contains("helpUri"));
  EXPECT_THAT(run["tool"]["driver"]["rules"][1]["help"]["text"].get<std::string>(),
              HasSubstr("Reference: python/sglang"));
  EXPECT_EQ(run["results"][3]["ruleIndex"], 0);
  EXPECT_EQ(run["results"][2]["ruleIndex"], 2);
  EXPECT_EQ(run["results"][0]["properties"]["basis"], "published");
  EXPECT_EQ(run["results"][0]["properties"]["judged_on"], "published measurements on the family");
  EXPECT_FALSE(run["results"][1]["properties"].contains("basis"));
}

TEST(Sarif, FingerprintsSurviveAMovedLineAndTellRepeatsApart) {
  Workspace work("fingerprint");
  fs::path unit = work.write("sglang.service");
  auto at_line = [&](int64_t line) {
    return finding("fp8-unit-scale", Severity::critical,
                   {{unit.string(), "--kv-cache-dtype", "auto", line}});
  };
  auto print = [](const nlohmann::json& result) {
    return result["partialFingerprints"]["kvauditFinding/v1"].get<std::string>();
  };
  nlohmann::json first = sarif(report_of({at_line(12), at_line(12)}), work.root())["runs"][0];
  nlohmann::json moved = sarif(report_of({at_line(15)}), work.root())["runs"][0];
  nlohmann::json other =
      sarif(report_of({finding("kv-auto-quantized", Severity::critical,
                               {{unit.string(), "--kv-cache-dtype", "auto", 12}})}),
            work.root())["runs"][0];
  EXPECT_EQ(print(first["results"][0]).size(), 16u);
  EXPECT_EQ(print(first["results"][0]), print(moved["results"][0]));
  EXPECT_NE(print(first["results"][0]), print(first["results"][1]));
  EXPECT_NE(print(first["results"][0]), print(other["results"][0]));
}

TEST(Sarif, AReportWithoutFindingsIsAnEmptyRun) {
  Workspace work("empty");
  nlohmann::json run = sarif(report_of({}), work.root())["runs"][0];
  EXPECT_TRUE(run["results"].is_array());
  EXPECT_TRUE(run["results"].empty());
  EXPECT_TRUE(run["tool"]["driver"]["rules"].empty());
  EXPECT_EQ(run["automationDetails"]["id"], "kvaudit/check/");
}

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t found = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++found;
  return found;
}

TEST(Junit, FindingsFailFromTheGateSeverityUpAndTheRestPass) {
  Report report = report_of({finding("c", Severity::critical), finding("w", Severity::warning),
                             finding("i", Severity::info)});
  std::string at_critical = render_junit(report, failing_from(Severity::critical));
  EXPECT_THAT(at_critical,
              HasSubstr("<testsuite name=\"kvaudit check\" tests=\"3\" failures=\"1\""));
  EXPECT_THAT(
      at_critical,
      HasSubstr("<testcase classname=\"c\" name=\"c title\">\n      <failure type=\"critical\""));
  EXPECT_THAT(
      at_critical,
      HasSubstr("<testcase classname=\"w\" name=\"w title\">\n      <system-out>[warning]"));
  EXPECT_THAT(render_junit(report, failing_from(Severity::warning)), HasSubstr("failures=\"2\""));
  std::string never = render_junit(report, {});
  EXPECT_EQ(occurrences(never, "<failure"), 0u);
  EXPECT_EQ(occurrences(never, "<system-out>"), 4u);  // three findings and the suite's verdict
  EXPECT_TRUE(gate_fails(report, failing_from(Severity::critical)));
  EXPECT_FALSE(gate_fails(report, {}));
}

TEST(Junit, EachCheckIsATestCaseNamedForWhatItChecks) {
  Report report = report_of({}, "logs");
  ExitGate gate;
  gate.checks = {{"expect", "kv_cache_dtype=bf16", true, "expected bf16, log says bf16"},
                 {"expect", "scale_fallback=false", false, "expected false, log says true"}};
  std::string xml = render_junit(report, gate);
  EXPECT_THAT(xml, HasSubstr("<testsuite name=\"kvaudit logs\" tests=\"2\" failures=\"1\""));
  EXPECT_THAT(
      xml, HasSubstr("<testcase classname=\"kvaudit.logs.expect\" name=\"kv_cache_dtype=bf16\">\n"
                     "      <system-out>expected bf16, log says bf16</system-out>"));
  EXPECT_THAT(xml,
              HasSubstr("<failure type=\"expect\" message=\"expected false, log says true\">"));
  EXPECT_TRUE(gate_fails(report, gate));
  gate.checks[1].passed = true;
  EXPECT_FALSE(gate_fails(report, gate));
}

TEST(Junit, NothingFoundIsOnePassingTestSayingWhatRan) {
  Report report = report_of({}, "plan");
  report.verdict = "plan: 1,573,854 tokens per GPU";
  std::string xml = render_junit(report, {});
  EXPECT_THAT(xml, HasSubstr("tests=\"1\" failures=\"0\""));
  EXPECT_THAT(xml,
              HasSubstr("<testcase classname=\"kvaudit.plan.run\" name=\"kvaudit plan: test\">\n"
                        "      <system-out>plan: 1,573,854 tokens per GPU</system-out>"));
  EXPECT_THAT(xml, Not(HasSubstr("<failure")));
  EXPECT_THAT(xml, Not(HasSubstr("<properties>\n    </properties>")));
}

// Runs `command`, returning its standard output and exit status.
std::pair<std::string, int> run_command(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return {"", -1};
  std::array<char, 4096> buffer{};
  size_t got = 0;
  while ((got = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    out.append(buffer.data(), got);
  int status = ::pclose(pipe);
  if (out.ends_with('\n')) out.pop_back();  // xmllint ends a string result with a newline
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// Markup, quotes, control bytes and broken UTF-8 from a log line: the XML parses, and the
// attribute reads back as the text with the forbidden characters dropped.
TEST(Junit, EscapesMarkupAndDropsWhatXmlForbidsAsAParserReadsIt) {
  ASSERT_EQ(run_command("command -v xmllint > /dev/null").second, 0)
      << "xmllint is missing: install libxml2-utils (make deps)";
  Finding nasty = finding("runtime-error", Severity::critical);
  nasty.title = "a<b & \"c\" 'd'\x01\x1b[31m\xff\xef\xbf\xbe end";
  nasty.consequence = "line1\nline2\ttab ]]> </failure>";
  Workspace work("escape");
  fs::path file = work.root() / "junit.xml";
  std::ofstream(file) << render_junit(report_of({nasty}), failing_from(Severity::critical));
  auto [name, status] =
      run_command("xmllint --xpath 'string(//testcase/@name)' '" + file.string() + "' 2>&1");
  ASSERT_EQ(status, 0) << name;
  EXPECT_EQ(name, "a<b & \"c\" 'd'[31m\xef\xbf\xbd end");
  auto [failure, failure_status] =
      run_command("xmllint --xpath 'string(//testcase/failure)' '" + file.string() + "' 2>&1");
  ASSERT_EQ(failure_status, 0) << failure;
  EXPECT_THAT(failure, HasSubstr("Consequence: line1\nline2\ttab ]]> </failure>"));
  std::string xml = render_junit(report_of({nasty}), {});
  EXPECT_THAT(xml, HasSubstr("a&lt;b &amp; &quot;c&quot; &apos;d&apos;"));
  EXPECT_EQ(xml.find('\x01'), std::string::npos);
  EXPECT_EQ(xml.find('\x1b'), std::string::npos);
}

}  // namespace
}  // namespace kvaudit::report
