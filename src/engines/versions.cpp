// Engine versions and version ranges, and the provenance vocabulary.
#include <fmt/format.h>

#include <charconv>

#include "engines/engines.h"
#include "util/util.h"

namespace kvaudit::engines {

std::optional<Version> parse_version(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  Version version;
  if (text.empty() || text == "latest") {
    version.latest = true;
    return version;
  }
  if (text.front() == 'v' || text.front() == 'V') text.remove_prefix(1);
  int parts[3] = {0, 0, 0};
  int count = 0;
  bool wildcard = false;
  while (!text.empty() && count < 3) {
    if (text.front() == 'x' || text.front() == '*') {
      wildcard = true;
      break;
    }
    int value = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end == text.data() || value < 0 || value >= (1 << 20))
      return std::nullopt;
    parts[count++] = value;
    text.remove_prefix(static_cast<size_t>(end - text.data()));
    if (text.empty()) break;
    if (text.front() != '.') break;  // suffixes like "rc1", "+cu128" end the number
    text.remove_prefix(1);
    if (count == 3) break;  // ".post1" and the like
  }
  if (count == 0) return std::nullopt;
  version.major = parts[0];
  version.minor = parts[1];
  version.patch = parts[2];
  // A release candidate ("1.3.0rc7", TensorRT-LLM's numbering) comes before its release.
  if (count == 3 && text.size() > 2 && (text.substr(0, 2) == "rc" || text.substr(0, 2) == "RC")) {
    int candidate = 0;
    auto [end, error] = std::from_chars(text.data() + 2, text.data() + text.size(), candidate);
    if (error == std::errc() && end != text.data() + 2 && candidate >= 0 &&
        candidate < Version::kFinal)
      version.pre = candidate;
  }
  // "0.5" or "0.5.x" mean the newest 0.5 release: compare as the top of that series.
  if (wildcard || count < 3) {
    if (count < 2) version.minor = 1 << 20;
    version.patch = 1 << 20;
  }
  return version;
}

std::string version_text(const Version& version) {
  if (version.latest) return "latest";
  auto part = [](int value) {
    return value >= (1 << 20) ? std::string("x") : std::to_string(value);
  };
  std::string text =
      fmt::format("{}.{}.{}", version.major, part(version.minor), part(version.patch));
  if (version.pre < Version::kFinal) text += fmt::format("rc{}", version.pre);
  return text;
}

namespace {

// "latest" stands above every numbered release.
bool less(const Version& a, const Version& b) {
  if (a.latest != b.latest) return b.latest;
  return std::tie(a.major, a.minor, a.patch, a.pre) < std::tie(b.major, b.minor, b.patch, b.pre);
}

}  // namespace

std::optional<VersionRange> parse_version_range(std::string_view text) {
  VersionRange range;
  range.text = std::string(text);
  std::vector<std::string> clauses = split_list(text, ' ');
  if (clauses.empty()) return std::nullopt;
  for (const auto& clause : clauses) {
    if (clause == "*") {
      if (clauses.size() != 1) return std::nullopt;  // "*" stands alone
      continue;
    }
    size_t digits = clause.find_first_of("0123456789");
    if (digits == std::string::npos || digits > 2) return std::nullopt;
    std::string_view op = std::string_view(clause).substr(0, digits);
    VersionRange::Clause parsed;
    if (op == ">=")
      parsed.op = VersionRange::Op::ge;
    else if (op == ">")
      parsed.op = VersionRange::Op::gt;
    else if (op == "<=")
      parsed.op = VersionRange::Op::le;
    else if (op == "<")
      parsed.op = VersionRange::Op::lt;
    else if (op == "==")
      parsed.op = VersionRange::Op::eq;
    else
      return std::nullopt;
    // Bounds are exact releases: "0.5.x" or "0.5" as a bound would silently mean
    // "the top of the series", which nobody writing a range intends.
    std::string_view bound = std::string_view(clause).substr(digits);
    std::string_view numbers = bound.substr(0, bound.find("rc"));  // "1.3.0rc7": a candidate
    if (std::count(numbers.begin(), numbers.end(), '.') != 2 ||
        numbers.find_first_not_of("0123456789.") != std::string_view::npos)
      return std::nullopt;
    auto version = parse_version(bound);
    if (!version || version->latest || version_text(*version) != bound) return std::nullopt;
    parsed.bound = *version;
    range.clauses.push_back(parsed);
  }
  return range;
}

bool VersionRange::contains(const Version& version) const {
  for (const Clause& clause : clauses) {
    bool lt = less(version, clause.bound), gt = less(clause.bound, version);
    bool ok = false;
    switch (clause.op) {
      case Op::ge:
        ok = !lt;
        break;
      case Op::gt:
        ok = gt;
        break;
      case Op::le:
        ok = !gt;
        break;
      case Op::lt:
        ok = lt;
        break;
      case Op::eq:
        ok = !lt && !gt;
        break;
    }
    if (!ok) return false;
  }
  return true;
}

bool version_in_range(const Version& version, std::string_view range) {
  auto parsed = parse_version_range(range);
  return parsed && parsed->contains(version);
}

std::string_view rule_status_id(RuleStatus status) {
  switch (status) {
    case RuleStatus::code:
      return "code";
    case RuleStatus::merged:
      return "merged";
    case RuleStatus::open:
      return "open";
    case RuleStatus::closed_unmerged:
      return "closed_unmerged";
  }
  return "?";
}

std::string_view rule_status_name(RuleStatus status) {
  switch (status) {
    case RuleStatus::code:
      return "read in the engine's source";
    case RuleStatus::merged:
      return "merged";
    case RuleStatus::open:
      return "open";
    case RuleStatus::closed_unmerged:
      return "closed unmerged";
  }
  return "?";
}

}  // namespace kvaudit::engines
