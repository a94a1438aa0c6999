// The load bench's results file: one JSON line per finished level, keyed by what the level
// ran (level_key), appended and flushed as each level ends, and read back so a rerun of the
// same command resumes the ladder where it stopped.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "loadbench/internal.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::loadbench {

using nlohmann::json;

json to_json(const LoadLevel& l) {
  auto latency = [](const LatencySummary& s) {
    return json{
        {"count", s.count}, {"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}};
  };
  return {{"kind", "load_level"},
          {"server", l.server},
          {"prompts", l.prompts},
          {"concurrency", l.concurrency},
          {"requests", l.requests},
          {"failures", l.failures},
          {"cancelled", l.cancelled},
          {"wall_seconds", l.wall_seconds},
          {"requests_per_second", l.requests_per_second},
          {"output_tokens_per_second", l.output_tokens_per_second},
          {"prompt_tokens", l.prompt_tokens},
          {"output_tokens", l.output_tokens},
          {"cached_prompt_tokens", l.cached_prompt_tokens},
          {"ttft_seconds", latency(l.ttft)},
          {"itl_seconds", latency(l.itl)},
          {"e2e_seconds", latency(l.e2e)},
          {"ttft_first_turn_seconds", latency(l.ttft_first_turn)},
          {"ttft_later_turns_seconds", latency(l.ttft_later_turns)},
          {"streamed", l.streamed},
          {"draft_tokens", l.draft_tokens},
          {"accepted_tokens", l.accepted_tokens},
          {"drafts", l.drafts},
          {"spec_source", l.spec_source},
          {"spec_accept_rate_gauge", l.spec_accept_rate_gauge},
          {"spec_accept_length_gauge", l.spec_accept_length_gauge},
          {"server_output_tokens", l.server_output_tokens},
          {"errors", l.errors}};
}

LoadLevel load_level_from_json(const json& doc, const std::string& where) {
  JsonReader r(doc, where);
  LoadLevel l;
  if (r.string("kind") != "load_level") r.fail("kind", "is not \"load_level\"");
  l.server = r.string("server");
  l.prompts = r.string("prompts");
  l.concurrency = static_cast<int>(r.integer("concurrency"));
  l.requests = r.integer("requests");
  l.failures = r.integer("failures");
  l.cancelled = r.has("cancelled") ? r.integer("cancelled") : 0;  // files before it: none
  l.wall_seconds = r.number("wall_seconds");
  l.requests_per_second = r.number("requests_per_second");
  l.output_tokens_per_second = r.number("output_tokens_per_second");
  l.prompt_tokens = r.integer("prompt_tokens");
  l.output_tokens = r.integer("output_tokens");
  l.cached_prompt_tokens = r.integer_or("cached_prompt_tokens", -1);
  auto read_latency = [](JsonReader s, LatencySummary& target) {
    target.count = s.integer("count");
    target.mean = s.number("mean");
    target.p50 = s.number("p50");
    target.p90 = s.number("p90");
    target.p99 = s.number("p99");
    s.finish();
  };
  for (auto [key, target] : {std::pair{"ttft_seconds", &l.ttft}, std::pair{"itl_seconds", &l.itl},
                             std::pair{"e2e_seconds", &l.e2e}})
    read_latency(r.object(key), *target);
  // Absent from results files written before sessions existed.
  if (auto s = r.optional_object("ttft_first_turn_seconds")) read_latency(*s, l.ttft_first_turn);
  if (auto s = r.optional_object("ttft_later_turns_seconds")) read_latency(*s, l.ttft_later_turns);
  l.streamed = r.boolean_or("streamed", false);
  l.draft_tokens = r.integer_or("draft_tokens", -1);
  l.accepted_tokens = r.integer_or("accepted_tokens", -1);
  l.drafts = r.integer_or("drafts", -1);
  l.spec_source = r.string_or("spec_source", "");
  l.spec_accept_rate_gauge = r.number_or("spec_accept_rate_gauge", -1.0);
  l.spec_accept_length_gauge = r.number_or("spec_accept_length_gauge", -1.0);
  l.server_output_tokens = r.integer_or("server_output_tokens", -1);
  l.errors = r.strings_or_empty("errors");
  r.allow_descriptive({"key"});
  r.finish();
  l.resumed = true;
  return l;
}

std::map<std::string, LoadLevel> read_levels(const std::string& results_path) {
  std::map<std::string, LoadLevel> previous;
  if (!results_path.empty() && std::filesystem::exists(results_path)) {
    std::ifstream in(results_path);
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      json doc = json::parse(line, nullptr, false);
      if (doc.is_discarded() || !doc.is_object() || doc.value("kind", "") != "load_level") continue;
      LoadLevel level = load_level_from_json(doc, fmt::format("{}:{}", results_path, number));
      previous[doc.value("key", "")] = level;
    }
  }
  return previous;
}

std::ofstream open_results_file(const std::string& results_path) {
  std::ofstream results_out;
  if (!results_path.empty()) {
    results_out.open(results_path, std::ios::app);
    if (!results_out) throw InputError(results_path, "cannot open the results file for appending");
  }
  return results_out;
}

void append_level(std::ofstream& results_out, const LoadLevel& level, const std::string& key) {
  json line = to_json(level);
  line["key"] = key;
  results_out << line.dump() << '\n';
  results_out.flush();
}

}  // namespace kvaudit::loadbench
