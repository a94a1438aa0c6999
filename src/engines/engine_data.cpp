// Loading data/engines/<engine>.json, version ranges, dtype choices and aliases.
#include <fmt/format.h>

#include <charconv>

#include "engines/engines.h"
#include "util/util.h"

namespace kvaudit::engines {

using nlohmann::json;

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
    if (error != std::errc() || end == text.data()) return std::nullopt;
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
  return fmt::format("{}.{}.{}", version.major, part(version.minor), part(version.patch));
}

bool version_in_range(const Version& version, std::string_view range) {
  for (const auto& clause : split_list(range, ' ')) {
    if (clause == "*") continue;
    std::string_view op = clause;
    size_t digits = op.find_first_of("0123456789");
    if (digits == std::string_view::npos) return false;
    std::string_view comparison = op.substr(0, digits);
    auto bound = parse_version(op.substr(digits));
    if (!bound) return false;
    // "latest" stands above every numbered release.
    auto less = [](const Version& a, const Version& b) {
      if (a.latest != b.latest) return b.latest;
      return std::tie(a.major, a.minor, a.patch) < std::tie(b.major, b.minor, b.patch);
    };
    bool lt = less(version, *bound), gt = less(*bound, version);
    bool ok = comparison == ">="                         ? !lt
              : comparison == ">"                        ? gt
              : comparison == "<="                       ? !gt
              : comparison == "<"                        ? lt
              : comparison == "==" || comparison.empty() ? (!lt && !gt)
                                                         : false;
    if (!ok) return false;
  }
  return true;
}

std::vector<std::string> known_engines() {
  return {"sglang", "vllm"};
}

EngineData load_engine_data(std::string_view engine) {
  bool known = false;
  for (const auto& name : known_engines()) known |= name == engine;
  if (!known)
    throw InputError("--engine", fmt::format("unknown engine '{}' (known: sglang, vllm)", engine));
  EngineData data;
  data.engine = std::string(engine);
  data.file = data_dir() / "engines" / (data.engine + ".json");
  std::string text = read_text_file(data.file);
  try {
    data.document = json::parse(text);
  } catch (const json::exception& error) {  // syntax, or a number out of range
    throw InputError(data.file.string(), std::string("invalid JSON: ") + error.what());
  }
  for (const char* key : {"engine", "latest_known_version", "launch", "kv_cache_dtype_choices",
                          "dtype_aliases", "auto_resolution", "scale_loading", "fallback"})
    if (!data.document.contains(key))
      throw InputError(data.file.string(), fmt::format("engine data lacks \"{}\"", key));
  data.latest_known_version = data.document["latest_known_version"].get<std::string>();
  return data;
}

std::vector<std::string> kv_cache_dtype_choices(const EngineData& data, const Version& version) {
  for (const auto& entry : data.document["kv_cache_dtype_choices"])
    if (version_in_range(version, entry.value("versions", "*")))
      return entry["choices"].get<std::vector<std::string>>();
  return {};
}

std::string normalise_kv_dtype(const EngineData& data, std::string_view cli_value) {
  const json& aliases = data.document["dtype_aliases"];
  if (auto it = aliases.find(std::string(cli_value)); it != aliases.end())
    return it->get<std::string>();
  return std::string(cli_value);
}

}  // namespace kvaudit::engines
