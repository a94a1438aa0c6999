// report/sarif: a report as SARIF 2.1.0, the format code scanning (GitHub, GitLab, Azure
// DevOps) reads. Findings become results of rules named by their finding id; a result points
// at the file and line its evidence names, so an alert sits on the flag, config key or unit
// line that causes it. docs/ci.md says what each field holds and what code scanning does with
// a result whose evidence names no file.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "report/report.h"
#include "util/util.h"

namespace kvaudit::report {
namespace {

namespace fs = std::filesystem;

// The key code scanning matches results by across runs (with the rule id and the file), so
// it must not change when a line moves or a title's numbers change: "/v1" names this recipe.
constexpr std::string_view kFingerprintKey = "kvauditFinding/v1";
constexpr std::string_view kSourceRoot = "%SRCROOT%";

std::string_view sarif_level(Severity severity) {
  switch (severity) {
    case Severity::critical:
      return "error";
    case Severity::warning:
      return "warning";
    case Severity::info:
      return "note";
  }
  return "note";
}

// RFC 3986 path characters stay, everything else (spaces, '%', '#', '?', bytes of non-ASCII
// names) is percent-encoded, so a file name never breaks the URI. ':' is encoded too: in the
// first segment of a relative URI it would read as a scheme ("c:x.json").
std::string percent_encode_path(std::string_view path) {
  std::string out;
  for (unsigned char c : path) {
    bool keep =
        (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
        std::string_view("-._~!$&'()*+,;=@/").find(static_cast<char>(c)) != std::string_view::npos;
    if (keep)
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

// FNV-1a: stable across builds and machines (std::hash is neither), enough to tell findings
// apart within one repository.
uint64_t fnv1a64(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// The file an evidence's `file` names, when it is one: the field is sometimes a label
// ("launch flags", "log:12", "server:URL") and a unit's evidence says "unit PATH".
std::optional<fs::path> evidence_file(const std::string& file) {
  if (file.empty()) return std::nullopt;
  std::string_view name = file;
  if (name.starts_with("unit ")) name.remove_prefix(5);
  std::error_code ec;
  fs::path path{std::string(name)};
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  return path;
}

struct ArtifactUri {
  std::string uri;
  bool relative = false;  // under %SRCROOT%
};

ArtifactUri artifact_uri(const fs::path& file, const fs::path& root) {
  std::error_code ec;
  fs::path absolute = fs::absolute(file, ec).lexically_normal();
  if (ec) absolute = file.lexically_normal();
  fs::path relative = absolute.lexically_relative(root);
  if (!relative.empty() && *relative.begin() != "..")
    return {percent_encode_path(relative.generic_string()), true};
  return {"file://" + percent_encode_path(absolute.generic_string()), false};
}

// Where a result sits: the first evidence with a line, else the first evidence that names an
// existing regular file (line 1, the file as a whole), else nowhere (nullopt).
struct Located {
  ArtifactUri artifact;
  int64_t line = 1;
  const Evidence* evidence = nullptr;
};

std::optional<Located> locate(const Finding& finding, const fs::path& root) {
  for (const Evidence& item : finding.evidence) {
    if (item.line <= 0) continue;
    if (auto file = evidence_file(item.file))
      return Located{artifact_uri(*file, root), item.line, &item};
  }
  for (const Evidence& item : finding.evidence)
    if (auto file = evidence_file(item.file)) return Located{artifact_uri(*file, root), 1, &item};
  return std::nullopt;
}

// What a result that no evidence places concerns, by name: the first evidence's label (a
// "launch flags", "server:URL"), else the finding id.
nlohmann::json logical_location(const Finding& finding) {
  std::string name = finding.evidence.empty() ? finding.id : finding.evidence.front().file;
  if (name.empty()) name = finding.id;
  nlohmann::json logical = {{"name", to_valid_utf8(name)}, {"kind", "resource"}};
  if (!finding.evidence.empty() && !finding.evidence.front().key.empty())
    logical["fullyQualifiedName"] = to_valid_utf8(name + ": " + finding.evidence.front().key);
  return logical;
}

std::string evidence_line(const Evidence& item) {
  std::string where = item.line > 0 ? fmt::format("{}:{}", item.file, item.line) : item.file;
  return fmt::format("{}: {} = {}", where, item.key, item.value);
}

bool is_web_address(std::string_view text) {
  return (text.starts_with("https://") || text.starts_with("http://")) &&
         text.find_first_of(" \t\n") == std::string_view::npos;
}

std::string help_text(const Finding& finding) {
  std::string text = finding.consequence;
  if (!finding.fix.empty()) text += (text.empty() ? "" : "\n\n") + ("Fix: " + finding.fix);
  if (!finding.reference.empty())
    text += (text.empty() ? "" : "\n\n") + ("Reference: " + finding.reference);
  return text.empty() ? finding.title : text;
}

// A rule is described by the first finding of its id in the run: the finding ids are the
// rules (docs/findings.md is their catalogue) and their text is the finding's own, which
// names the engine release and the fix it was judged on.
nlohmann::json rule_of(const Finding& finding, const std::string& command) {
  std::string title = to_valid_utf8(finding.title);
  nlohmann::json rule = {
      {"id", to_valid_utf8(finding.id)},
      {"shortDescription", {{"text", title}}},
      {"fullDescription",
       {{"text",
         to_valid_utf8(finding.consequence.empty() ? finding.title : finding.consequence)}}},
      {"help", {{"text", to_valid_utf8(help_text(finding))}}},
      {"defaultConfiguration", {{"level", sarif_level(finding.severity)}}},
      {"properties", {{"tags", {"kvaudit", to_valid_utf8(command)}}}}};
  if (is_web_address(finding.reference)) rule["helpUri"] = to_valid_utf8(finding.reference);
  return rule;
}

nlohmann::json physical_location(const Located& located) {
  nlohmann::json artifact = {{"uri", located.artifact.uri}};
  if (located.artifact.relative) artifact["uriBaseId"] = kSourceRoot;
  return {{"artifactLocation", std::move(artifact)}, {"region", {{"startLine", located.line}}}};
}

nlohmann::json result_of(const Finding& finding, size_t rule_index, const fs::path& root,
                         const std::optional<ArtifactUri>& fallback,
                         std::map<std::string, int>& seen) {
  std::string text = finding.title;
  if (!finding.fix.empty()) text += "\nFix: " + finding.fix;
  nlohmann::json result = {{"ruleId", to_valid_utf8(finding.id)},
                           {"ruleIndex", rule_index},
                           {"level", sarif_level(finding.severity)},
                           {"message", {{"text", to_valid_utf8(text)}}}};

  std::optional<Located> located = locate(finding, root);
  const std::string first_key = finding.evidence.empty() ? "" : finding.evidence.front().key;
  std::string anchor;  // what the fingerprint ties the result to
  if (located) {
    anchor = located->artifact.uri + '\0' + located->evidence->key;
    result["locations"] = {{{"physicalLocation", physical_location(*located)}}};
  } else if (fallback) {
    // The command's own input file, at its top: code scanning shows no result without a
    // file; the logical location says what the finding is about.
    Located at{*fallback, 1, nullptr};
    anchor = fallback->uri + '\0' + first_key;
    result["locations"] = {{{"physicalLocation", physical_location(at)},
                            {"logicalLocations", {logical_location(finding)}}}};
  } else {
    nlohmann::json logical = logical_location(finding);
    anchor = logical["name"].get<std::string>() + '\0' + first_key;
    result["locations"] = {{{"logicalLocations", {std::move(logical)}}}};
  }
  // The same finding twice at one place (two launches of a log): the n-th one keeps its own
  // fingerprint, so code scanning neither merges them nor reopens them on the next run.
  std::string key = finding.id + '\0' + anchor;
  int occurrence = ++seen[key];
  if (occurrence > 1) key += '\0' + std::to_string(occurrence);
  result["partialFingerprints"] = {{kFingerprintKey, fmt::format("{:016x}", fnv1a64(key))}};

  nlohmann::json evidence = nlohmann::json::array();
  for (const Evidence& item : finding.evidence)
    evidence.push_back(to_valid_utf8(evidence_line(item)));
  nlohmann::json properties = {{"severity", severity_name(finding.severity)},
                               {"evidence", std::move(evidence)}};
  if (!finding.consequence.empty()) properties["consequence"] = to_valid_utf8(finding.consequence);
  if (!finding.fix.empty()) properties["fix"] = to_valid_utf8(finding.fix);
  if (!finding.reference.empty()) properties["reference"] = to_valid_utf8(finding.reference);
  if (!finding.basis.empty()) properties["basis"] = to_valid_utf8(finding.basis);
  if (!finding.judged_on.empty()) properties["judged_on"] = to_valid_utf8(finding.judged_on);
  result["properties"] = std::move(properties);
  return result;
}

}  // namespace

std::string render_sarif(const Report& report, const SarifOptions& options) {
  std::error_code ec;
  fs::path root = options.working_directory.empty() ? fs::current_path(ec)
                                                    : fs::path(options.working_directory);
  root = fs::absolute(root, ec).lexically_normal();
  // %SRCROOT% must end in '/' to be a folder a relative URI resolves under.
  std::string root_uri = "file://" + percent_encode_path(root.generic_string());
  if (!root_uri.ends_with('/')) root_uri += '/';

  nlohmann::json rules = nlohmann::json::array();
  std::map<std::string, size_t> rule_index;
  nlohmann::json results = nlohmann::json::array();
  std::map<std::string, int> seen;
  std::optional<ArtifactUri> fallback;
  if (auto file = evidence_file(options.fallback_file)) fallback = artifact_uri(*file, root);
  for (const Finding& finding : report.findings) {
    auto [at, added] = rule_index.try_emplace(finding.id, rules.size());
    if (added) rules.push_back(rule_of(finding, report.command));
    results.push_back(result_of(finding, at->second, root, fallback, seen));
  }

  nlohmann::json driver = {{"name", "kvaudit"}, {"rules", std::move(rules)}};
  if (!options.tool_version.empty()) {
    driver["version"] = to_valid_utf8(options.tool_version);
    driver["semanticVersion"] = to_valid_utf8(options.tool_version);
  }
  nlohmann::json run = {
      {"tool", {{"driver", std::move(driver)}}},
      {"automationDetails", {{"id", to_valid_utf8("kvaudit/" + report.command + "/")}}},
      {"originalUriBaseIds", {{kSourceRoot, {{"uri", root_uri}}}}},
      {"results", std::move(results)},
      {"properties",
       {{"title", to_valid_utf8(report.title)},
        {"verdict", to_valid_utf8(report.verdict)},
        {"verdict_severity", severity_name(report.verdict_severity)}}}};
  nlohmann::json log = {{"$schema", "https://json.schemastore.org/sarif-2.1.0.json"},
                        {"version", "2.1.0"},
                        {"runs", {std::move(run)}}};
  return log.dump(2) + '\n';
}

}  // namespace kvaudit::report
