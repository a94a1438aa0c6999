// Probe records as JSON, and the JSON-lines results file that makes a run resumable.
#include <fmt/format.h>

#include <fstream>

#include "probe/probe.h"
#include "util/json.h"

namespace kvaudit::probe {

using nlohmann::json;

namespace {

json positions_to_json(const std::vector<Position>& positions, bool with_top) {
  json out = json::array();
  for (const auto& position : positions) {
    json top = json::array();
    if (with_top)
      for (const auto& entry : position.top) top.push_back({entry.token, entry.logprob});
    out.push_back({{"token", position.token},
                   {"logprob", position.logprob ? json(*position.logprob) : json()},
                   {"top", std::move(top)}});
  }
  return out;
}

std::vector<Position> positions_from_json(const json& doc) {
  std::vector<Position> out;
  if (!doc.is_array()) return out;
  for (const auto& item : doc) {
    Position position;
    position.token = item.at("token").get<std::string>();
    if (!item.at("logprob").is_null()) position.logprob = item.at("logprob").get<double>();
    for (const auto& entry : item.at("top"))
      position.top.push_back({entry.at(0).get<std::string>(), entry.at(1).get<double>()});
    out.push_back(std::move(position));
  }
  return out;
}

}  // namespace

json to_json(const ProbeRecord& record, bool with_top) {
  json doc = {
      {"server", record.server},
      {"id", record.id},
      {"kind", record.kind},
      {"endpoint", record.endpoint},
      {"expected", record.expected},
      {"output", record.output},
      {"passed", record.passed},
      {"error", record.error},
      {"ctx_tokens", record.ctx_tokens},
      {"depth_tokens", record.depth_tokens},
      {"prompt_tokens", record.prompt_tokens},
      {"expected_logprob", record.expected_logprob ? json(*record.expected_logprob) : json()},
      {"expected_tokens", record.expected_tokens},
      {"generated", positions_to_json(record.generated, with_top)},
      {"forced", positions_to_json(record.forced, with_top)},
      {"forced_note", record.forced_note},
      {"rounds", record.rounds},
      {"rounds_passed", record.rounds_passed},
      {"schema_valid", record.schema_valid},
      {"tail_mass", record.tail_mass ? json(*record.tail_mass) : json()},
      {"top_k", record.top_k},
      {"seconds", record.seconds}};
  return doc;
}

ProbeRecord record_from_json(const json& doc, const std::string& where) {
  try {
    ProbeRecord record;
    record.server = doc.at("server").get<std::string>();
    record.id = doc.at("id").get<std::string>();
    record.kind = doc.at("kind").get<std::string>();
    record.endpoint = doc.value("endpoint", "");
    record.expected = doc.at("expected").get<std::string>();
    record.output = doc.at("output").get<std::string>();
    record.passed = doc.at("passed").get<bool>();
    record.error = doc.value("error", "");
    // Counts through JsonReader: a results file is outside input, and a float there (1e50)
    // must be an error, not an undefined conversion.
    JsonReader counts(doc, where, "record");
    record.ctx_tokens = counts.integer_or("ctx_tokens", 0);
    record.depth_tokens = counts.integer_or("depth_tokens", 0);
    record.prompt_tokens = counts.integer_or("prompt_tokens", 0);
    if (doc.contains("expected_logprob") && !doc["expected_logprob"].is_null())
      record.expected_logprob = doc["expected_logprob"].get<double>();
    record.expected_tokens = counts.integer_or("expected_tokens", 0);
    record.generated = positions_from_json(doc.value("generated", json::array()));
    record.forced_note = doc.value("forced_note", "");
    record.forced = positions_from_json(doc.value("forced", json::array()));
    record.rounds = counts.integer_or("rounds", 0);
    record.rounds_passed = counts.integer_or("rounds_passed", 0);
    record.schema_valid = counts.integer_or("schema_valid", 0);
    if (doc.contains("tail_mass") && !doc["tail_mass"].is_null())
      record.tail_mass = doc["tail_mass"].get<double>();
    const int64_t top_k = counts.integer_or("top_k", 0);
    if (top_k < 0 || top_k > 1 << 20) counts.fail("top_k", "out of range");
    record.top_k = static_cast<int>(top_k);
    record.seconds = doc.value("seconds", 0.0);
    return record;
  } catch (const json::exception& error) {
    throw InputError(where, fmt::format("not a probe record: {}", error.what()));
  }
}

ResultsFile load_results(const std::string& path) {
  ResultsFile results;
  std::ifstream in(path);
  if (!in) return results;  // a new file
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    auto doc = json::parse(line, nullptr, false);
    try {
      if (doc.is_discarded() || !doc.is_object() || !doc.contains("key") ||
          !doc["key"].is_string() || !doc.contains("record"))
        throw InputError(path, "not a results line");
      results.records.emplace_back(doc["key"].get<std::string>(),
                                   record_from_json(doc["record"], path));
    } catch (const InputError&) {
      // A killed writer leaves at most a torn last line; anything else unreadable is
      // skipped too (and counted) rather than stopping a resume.
      results.skipped_lines++;
    }
  }
  return results;
}

}  // namespace kvaudit::probe
