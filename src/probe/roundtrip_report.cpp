// probe --roundtrip's report: the server, each pass with the tier that served it, each
// tier's check against the floor, and the verdict.
#include <fmt/format.h>

#include "probe/internal.h"

namespace kvaudit::probe {

namespace {

using nlohmann::json;
using report::Value;

json pass_json(const RoundTripPass& pass) {
  json records = json::array();
  for (size_t i = 0; i < pass.records.size(); ++i) {
    const ProbeRecord& r = pass.records[i];
    json tokens = json::array(), logprobs = json::array();
    for (const Position& p : r.generated) {
      tokens.push_back(p.token);
      logprobs.push_back(p.logprob ? json(*p.logprob) : json());
    }
    records.push_back(
        {{"id", r.id},
         {"prompt_tokens", r.prompt_tokens},
         {"cached_tokens", pass.cached_tokens[i] ? json(*pass.cached_tokens[i]) : json()},
         {"served_by", i < pass.record_served_by.size() ? pass.record_served_by[i] : ""},
         {"output", r.output},
         {"tokens", std::move(tokens)},
         {"logprobs", std::move(logprobs)}});
  }
  return {{"name", pass.name},
          {"served_by", pass.served_by},
          {"served_by_evidence", pass.served_by_evidence},
          {"prompt_tokens", pass.prompt_tokens},
          {"cached_tokens", pass.cached},
          {"cached_field", pass.cached_field},
          {"counter_rise", pass.counter_delta},
          {"records", std::move(records)}};
}

json check_json(const TierCheck& c) {
  json first = c.first_token < 0 ? json()
                                 : json{{"prompt", c.first_prompt},
                                        {"generated_token", c.first_token},
                                        {"position", c.first_position},
                                        {"expected", c.token_expected},
                                        {"served", c.token_served}};
  return {{"name", c.name},
          {"pass", c.pass},
          {"against", c.against},
          {"prompts", c.prompts},
          {"diverged", c.diverged},
          {"kl", c.kl},
          {"floor", c.floor},
          {"excess", c.excess},
          {"excess_interval", {c.excess_interval.low, c.excess_interval.high}},
          {"p_value", c.test.p_value},
          {"p_adjusted", c.p_adjusted},
          {"test", c.test.method},
          {"first_divergence", first},
          {"verdict", c.verdict},
          {"sentence", c.sentence}};
}

report::Table passes_table(const RoundTripResult& result) {
  report::Table table;
  table.id = "roundtrip_passes";
  table.title = "Passes: the same prompts, and what served them";
  table.columns = {{"pass", "Pass", ""},
                   {"prompts", "Prompts", ""},
                   {"cached", "Cached tokens", "tokens"},
                   {"prompt_tokens", "Prompt tokens", "tokens"},
                   {"served_by", "Served by", ""},
                   {"evidence", "Evidence", ""}};
  for (const auto& pass : result.passes)
    table.rows.push_back({pass.name, int64_t(pass.records.size()),
                          pass.prompt_tokens > 0 ? Value(pass.cached) : Value(),
                          pass.prompt_tokens > 0 ? Value(pass.prompt_tokens) : Value(),
                          pass.served_by, pass.served_by_evidence});
  return table;
}

report::Table checks_table(const RoundTripResult& result) {
  report::Table table;
  table.id = "roundtrip_checks";
  table.title = "Each tier against the pass before it, over the floor (the same path twice)";
  table.columns = {{"tier", "Tier", ""},
                   {"compared", "Compared", ""},
                   {"prompts", "Prompts", ""},
                   {"excess", "KL excess", "nats", 5},
                   {"low", "95% CI low", "nats", 5},
                   {"high", "95% CI high", "nats", 5},
                   {"p", "p (Holm)", "", 4},
                   {"diverged", "Texts changed", ""},
                   {"first", "First divergence", ""},
                   {"verdict", "Verdict", ""}};
  for (const auto& c : result.checks)
    table.rows.push_back({c.name, c.pass + " vs " + c.against, c.prompts, c.excess,
                          c.excess_interval.low, c.excess_interval.high, c.p_adjusted, c.diverged,
                          c.first_token < 0
                              ? Value("none")
                              : Value(fmt::format("prompt {}, token {} (position {})",
                                                  c.first_prompt, c.first_token, c.first_position)),
                          c.verdict});
  return table;
}

}  // namespace

report::Report to_report(const RoundTripResult& result, const RoundTripOptions& options) {
  report::Report out;
  out.command = "probe";
  out.title = fmt::format("kvaudit probe --roundtrip: {}", result.facts.url);
  const ServerFacts& f = result.facts;
  out.facts.push_back({"engine", "Engine",
                       f.engine + (f.engine_version.empty() ? "" : " " + f.engine_version), ""});
  out.facts.push_back({"model", "Model", f.model_id, ""});
  out.facts.push_back({"kv_cache_dtype", "KV cache dtype",
                       f.kv_cache_dtype.empty() ? "unknown" : f.kv_cache_dtype, ""});
  if (f.capacity_tokens)
    out.facts.push_back({"pool_tokens", "Device pool", *f.capacity_tokens, "tokens"});
  out.facts.push_back({"prompts", "Prompts", int64_t(options.prompts), ""});
  out.facts.push_back({"requests", "Requests", result.requests, ""});
  out.facts.push_back({"seconds", "Seconds", result.seconds, "s", 1});
  out.tables.push_back(passes_table(result));
  out.tables.push_back(checks_table(result));
  for (const auto& check : result.checks) out.notes.push_back(check.sentence);
  if (!result.eviction.note.empty()) out.notes.push_back("Eviction: " + result.eviction.note + ".");
  if (!result.counts_note.empty()) out.notes.push_back(result.counts_note);
  if (!result.stopped.empty())
    out.notes.push_back("The run stopped early (" + result.stopped +
                        "); what it measured is reported.");
  for (const auto& note : result.notes) out.notes.push_back(note);

  json passes = json::array(), checks = json::array();
  for (const auto& pass : result.passes) passes.push_back(pass_json(pass));
  for (const auto& check : result.checks) checks.push_back(check_json(check));
  out.payload["roundtrip"] = {
      {"server",
       {{"url", f.url},
        {"engine", f.engine},
        {"engine_version", f.engine_version},
        {"model", f.model_id},
        {"kv_cache_dtype", f.kv_cache_dtype},
        {"pool_tokens", f.capacity_tokens ? json(*f.capacity_tokens) : json()}}},
      {"passes", std::move(passes)},
      {"eviction",
       {{"attempted", result.eviction.attempted},
        {"forced", result.eviction.forced},
        {"pool_tokens", result.eviction.pool_tokens ? json(*result.eviction.pool_tokens) : json()},
        {"pool_source", result.eviction.pool_source},
        {"filler_requests", result.eviction.filler_requests},
        {"filler_tokens", result.eviction.filler_tokens},
        {"note", result.eviction.note}}},
      {"checks", std::move(checks)},
      {"counts_trusted", result.counts_trusted},
      {"counts_note", result.counts_note},
      {"stopped", result.stopped},
      {"tolerance_kl", options.tolerance_kl},
      {"alpha", options.alpha},
      {"verdict", result.verdict},
      {"reason", result.reason}};
  out.verdict = fmt::format("Round trip: {}: {}.", result.verdict, result.reason);
  out.verdict_severity = result.verdict == "a tier changed the answers" ? report::Severity::critical
                         : roundtrip_failed(result)                     ? report::Severity::warning
                                                                        : report::Severity::info;
  return out;
}

}  // namespace kvaudit::probe
