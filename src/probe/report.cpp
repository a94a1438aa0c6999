// The probe report: server facts, findings, smoke results, the recall grid per server, the
// tasks and teacher-forced sequences, the verdict, and the JSON payload (servers, records,
// the control arm; the A/B part is compare_report.cpp's).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "probe/internal.h"

namespace kvaudit::probe {

using nlohmann::json;
using report::Value;

std::string excerpt(std::string text, size_t limit) {
  for (char& c : text)
    if (c == '\n' || c == '\t' || c == '\r') c = ' ';
  if (text.size() > limit) {
    size_t cut = limit;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text = text.substr(0, cut) + "...";
  }
  return text;
}

report::Value optional_double(const std::optional<double>& value) {
  return value ? Value(*value) : Value(std::monostate{});
}

namespace {

std::string side_name(size_t side, size_t sides) {
  if (sides == 1) return "";
  return side == 0 ? "A" : "B";
}

Value optional_int(const std::optional<int64_t>& value) {
  return value ? Value(*value) : Value(std::monostate{});
}

}  // namespace

json facts_json(const ServerFacts& f) {
  return {{"url", f.url},
          {"engine", f.engine},
          {"engine_version", f.engine_version},
          {"detected_by", f.detected_by},
          {"model_id", f.model_id},
          {"model_path", f.model_path},
          {"kv_cache_dtype", f.kv_cache_dtype},
          {"kv_cache_dtype_source", f.kv_cache_dtype_source},
          {"capacity_tokens", f.capacity_tokens ? json(*f.capacity_tokens) : json()},
          {"capacity_source", f.capacity_source},
          {"context_length", f.context_length ? json(*f.context_length) : json()},
          {"page_size", f.page_size ? json(*f.page_size) : json()},
          {"tp", f.tp},
          {"has_tokenize", f.has_tokenize},
          {"top_logprobs_granted", f.top_logprobs_granted},
          {"prompt_logprobs", f.prompt_logprobs ? json(*f.prompt_logprobs) : json()},
          {"logprobs_note", f.logprobs_note},
          {"notes", f.notes}};
}

namespace {

struct CellScore {
  int cases = 0, exact = 0;
  double logprob = 0.0;
  int64_t tokens = 0;
};

using Cells = std::map<std::pair<int64_t, int64_t>, CellScore>;  // (ctx, depth) -> score

// Exact match (%) over context (columns) x depth (rows); NaN where a cell has no case.
report::Chart recall_heatmap(const Cells& cells, size_t side, size_t sides,
                             const Cells* baseline = nullptr) {
  const std::string name = sides == 2 ? " on " + side_name(side, sides) : "";
  report::Chart heat;
  heat.id = baseline ? "recall_difference" : "recall_" + (sides == 2 ? side_name(side, sides) : "");
  heat.title = baseline ? "Recall exact match, B minus A (percentage points)"
                        : "Recall exact match (%)" + name;
  heat.kind = report::ChartKind::heatmap;
  heat.x_label = "context (tokens)";
  heat.y_label = "depth (tokens)";
  heat.diverging = baseline != nullptr;
  heat.precision = 0;
  heat.value_unit = baseline ? "pp" : "%";
  std::vector<int64_t> ctxs, depths;
  for (const auto& [key, cell] : cells) {
    if (std::find(ctxs.begin(), ctxs.end(), key.first) == ctxs.end()) ctxs.push_back(key.first);
    if (std::find(depths.begin(), depths.end(), key.second) == depths.end())
      depths.push_back(key.second);
  }
  std::sort(depths.begin(), depths.end());
  for (int64_t ctx : ctxs) heat.x_categories.push_back(std::to_string(ctx));
  for (int64_t depth : depths) {
    report::Series row{std::to_string(depth), std::vector<double>(ctxs.size(), NAN)};
    for (size_t i = 0; i < ctxs.size(); ++i) {
      auto it = cells.find({ctxs[i], depth});
      if (it == cells.end() || it->second.cases == 0) continue;
      double exact = 100.0 * it->second.exact / it->second.cases;
      if (baseline) {
        auto base = baseline->find({ctxs[i], depth});
        if (base == baseline->end() || base->second.cases == 0) continue;
        exact -= 100.0 * base->second.exact / base->second.cases;
      }
      row.y[i] = exact;
    }
    heat.series.push_back(std::move(row));
  }
  return heat;
}

}  // namespace

std::vector<report::GateCheck> gate_checks(const RunResult& result) {
  std::vector<report::GateCheck> checks;
  for (const auto& run : result.servers)
    for (const auto& record : run.records) {
      if (record.kind != "smoke") continue;
      std::string message = record.passed ? fmt::format("answered '{}'", record.output)
                            : record.error.empty()
                                ? fmt::format("expected '{}', the server answered '{}'",
                                              record.expected, record.output)
                                : "the server refused the probe: " + record.error;
      checks.push_back({"smoke", record.id + " @ " + record.server, record.passed, message});
    }
  if (!result.compare) return checks;
  if (!result.compare->gates.empty()) {
    for (const auto& gate : result.compare->gates)
      checks.push_back({"gate", gate.gate.text, gate.status == "passed", gate.message});
    return checks;
  }
  checks.push_back({"verdict", "A/B verdict is not \"different\"",
                    result.compare->verdict != "different",
                    result.compare->verdict + ": " + result.compare->reason});
  return checks;
}

bool probe_failed(const RunResult& result) {
  for (const report::GateCheck& check : gate_checks(result))
    if (!check.passed) return true;
  return false;
}

namespace {

// The servers: facts, the servers table, their findings (most severe first) and the
// payload's per-server records.
json add_servers(const RunResult& result, const ProbeOptions& options, report::Report& out) {
  const size_t sides = result.servers.size();
  json servers = json::array();
  report::Table server_table{"servers", "Servers", {}, {}, ""};
  server_table.columns = {{"side", "Side", "", 0, false},
                          {"url", "URL", "", 0, false},
                          {"engine", "Engine", "", 0, false},
                          {"version", "Version", "", 0, false},
                          {"model", "Model", "", 0, false},
                          {"kv_cache_dtype", "KV dtype", "", 0, false},
                          {"capacity_tokens", "KV capacity", "tokens"},
                          {"context_length", "Context", "tokens"},
                          {"detected_by", "Detected by", "", 0, false}};
  for (size_t side = 0; side < sides; ++side) {
    const ServerRun& run = result.servers[side];
    const ServerFacts& f = run.facts;
    const std::string prefix = sides == 2 ? side_name(side, sides) + " " : "";
    const std::string key_prefix = sides == 2 ? (side == 0 ? "a_" : "b_") : "";
    out.facts.push_back(
        {key_prefix + "engine", prefix + "Engine",
         Value(f.engine_version.empty() ? f.engine : f.engine + " " + f.engine_version), ""});
    out.facts.push_back({key_prefix + "model", prefix + "Model", Value(f.model_id), ""});
    out.facts.push_back({key_prefix + "kv_cache_dtype", prefix + "KV cache dtype",
                         Value(f.kv_cache_dtype.empty() ? "unknown" : f.kv_cache_dtype), ""});
    out.facts.push_back({key_prefix + "capacity_tokens", prefix + "KV capacity",
                         optional_int(f.capacity_tokens), "tokens"});
    server_table.rows.push_back({Value(side_name(side, sides)), Value(f.url), Value(f.engine),
                                 Value(f.engine_version), Value(f.model_id),
                                 Value(f.kv_cache_dtype), optional_int(f.capacity_tokens),
                                 optional_int(f.context_length), Value(f.detected_by)});
    for (report::Finding finding : run.findings) {
      if (sides == 2) finding.title = side_name(side, sides) + ": " + finding.title;
      out.findings.push_back(std::move(finding));
    }
    json records = json::array();
    for (const auto& record : run.records) records.push_back(to_json(record, false));
    json server = facts_json(f);
    server["records"] = std::move(records);
    server["resumed"] = run.resumed;
    server["requests"] = run.client_stats.requests;
    server["retries"] = run.client_stats.retries;
    servers.push_back(std::move(server));
    for (const auto& note : f.notes) out.notes.push_back(f.url + ": " + note);
    if (!f.logprobs_note.empty()) out.notes.push_back(f.url + ": log-probs: " + f.logprobs_note);
    if (run.resumed > 0)
      out.notes.push_back(fmt::format("{}: {} probe(s) taken from the results file {}", f.url,
                                      run.resumed, options.results_path));
  }
  out.tables.push_back(std::move(server_table));
  std::stable_sort(out.findings.begin(), out.findings.end(),
                   [](const auto& a, const auto& b) { return a.severity > b.severity; });

  return servers;
}

struct SmokeTally {
  int failed = 0, total = 0;
};

// The smoke table.
SmokeTally add_smoke(const RunResult& result, report::Report& out) {
  const size_t sides = result.servers.size();
  report::Table smoke{"smoke", "Smoke test", {}, {}, ""};
  smoke.columns = {{"side", "Side", "", 0, false},     {"probe", "Probe", "", 0, false},
                   {"passed", "Passed", "", 0, false}, {"expected", "Expected", "", 0, false},
                   {"output", "Output", "", 0, false}, {"endpoint", "Endpoint", "", 0, false}};
  SmokeTally tally;
  for (size_t side = 0; side < sides; ++side)
    for (const auto& record : result.servers[side].records) {
      if (record.kind != "smoke") continue;
      ++tally.total;
      tally.failed += !record.passed;
      smoke.rows.push_back(
          {Value(side_name(side, sides)), Value(record.id.substr(6)), Value(record.passed),
           Value(excerpt(record.expected)),
           Value(record.error.empty() ? excerpt(record.output) : "error: " + excerpt(record.error)),
           Value(excerpt(record.endpoint, 40))});
    }
  if (tally.total > 0) out.tables.push_back(std::move(smoke));

  return tally;
}

struct RecallTally {
  double exact = 0;
  int total = 0;
};

// The recall grid per server, with a heatmap each (and B against A when comparing).
RecallTally add_recall(const RunResult& result, report::Report& out) {
  const size_t sides = result.servers.size();
  report::Table recall{"recall", "Long-context code recall", {}, {}, result.token_counting};
  recall.columns = {{"side", "Side", "", 0, false},
                    {"ctx_tokens", "Context", "tokens"},
                    {"depth_tokens", "Depth", "tokens"},
                    {"cases", "Cases", ""},
                    {"exact_match", "Exact match", "%", 0},
                    {"logprob_per_token", "Log-prob / token", "nats", 3},
                    {"errors", "Errors", ""}};
  RecallTally tally;
  std::vector<std::map<std::pair<int64_t, int64_t>, CellScore>> exact_by_side;
  for (size_t side = 0; side < sides; ++side) {
    std::map<std::pair<int64_t, int64_t>, CellScore> cells;
    std::map<std::pair<int64_t, int64_t>, int> errors;
    for (const auto& record : result.servers[side].records) {
      if (record.kind != "recall") continue;
      // Cells are keyed by the requested depth (from the id), not the measured one.
      int64_t depth = 0;
      if (auto at = record.id.find("depth="); at != std::string::npos)
        depth = std::stoll(record.id.substr(at + 6));
      auto& cell = cells[{record.ctx_tokens, depth}];
      if (!record.error.empty() && record.output.empty()) {
        errors[{record.ctx_tokens, depth}]++;
        continue;
      }
      cell.cases++;
      cell.exact += record.passed;
      if (side == 0 || sides == 1) {
        tally.exact += record.passed;
        ++tally.total;
      }
      if (record.expected_logprob) {
        cell.logprob += *record.expected_logprob;
        cell.tokens += record.expected_tokens;
      }
    }
    if (!cells.empty()) out.charts.push_back(recall_heatmap(cells, side, sides));
    exact_by_side.push_back(cells);
    for (const auto& [key, cell] : cells)
      recall.rows.push_back(
          {Value(side_name(side, sides)), Value(key.first), Value(key.second),
           Value(int64_t{cell.cases}),
           cell.cases ? Value(100.0 * cell.exact / cell.cases) : Value(std::monostate{}),
           cell.tokens ? Value(cell.logprob / double(cell.tokens)) : Value(std::monostate{}),
           Value(int64_t{errors[key]})});
  }
  if (!recall.rows.empty()) out.tables.push_back(std::move(recall));
  if (exact_by_side.size() == 2 && !exact_by_side[0].empty())
    out.charts.push_back(recall_heatmap(exact_by_side[1], 1, sides, &exact_by_side[0]));

  return tally;
}

// The long-context tasks and the teacher-forced sequences per server: accuracy per task and
// context length with its Wilson interval; the sequences' log-prob per token and the tail
// mass their top-k leaves out.
void add_tasks(const RunResult& result, report::Report& out) {
  const size_t sides = result.servers.size();
  report::Table tasks{"tasks",
                      "Long-context tasks (near-duplicate needles, asked in rounds)",
                      {},
                      {},
                      "A round passes when the greedy answer is exact (tool calls: valid JSON "
                      "that satisfies the tool's schema and equals the logged arguments). "
                      "Interval: Wilson 95%."};
  tasks.columns = {{"side", "Side", "", 0, false},
                   {"task", "Task", "", 0, false},
                   {"ctx_tokens", "Context", "tokens"},
                   {"cases", "Cases", ""},
                   {"rounds", "Rounds", ""},
                   {"accuracy", "Accuracy", "%", 1},
                   {"low", "95% low", "%", 1},
                   {"high", "95% high", "%", 1},
                   {"schema_valid", "Schema-valid", "%", 0},
                   {"errors", "Errors", ""}};
  report::Table forced{"forced",
                       "Teacher-forced fixed sequences",
                       {},
                       {},
                       "Log-prob of the sequences' own tokens per token; tail: the probability "
                       "mass the returned top-k leaves out (what the KL estimate cannot see)."};
  forced.columns = {{"side", "Side", "", 0, false},
                    {"kind", "Sequences", "", 0, false},
                    {"probes", "Probes", ""},
                    {"scored", "Teacher-forced", ""},
                    {"logprob", "Log-prob / token", "nats", 4},
                    {"tail", "Tail mass", "", 4},
                    {"top_k", "Top-k", ""}};
  for (size_t side = 0; side < sides; ++side) {
    struct Tally {
      int cases = 0, errors = 0;
      int64_t rounds = 0, passed = 0, valid = 0;
    };
    std::map<std::pair<std::string, int64_t>, Tally> cells;
    struct ForcedTally {
      int probes = 0, scored = 0, top_k = 0;
      double logprob = 0.0, tail = 0.0;
      int64_t tokens = 0, tails = 0;
    };
    std::map<std::string, ForcedTally> sequences;
    for (const auto& record : result.servers[side].records) {
      if (record.kind == "mrcr" || record.kind == "toolcall") {
        Tally& t = cells[{record.kind, record.ctx_tokens}];
        if (!record.error.empty() && record.rounds == 0) {
          ++t.errors;
          continue;
        }
        ++t.cases;
        t.rounds += record.rounds;
        t.passed += record.rounds_passed;
        t.valid += record.schema_valid;
      } else if (record.kind == "forced") {
        const std::string kind = record.id.substr(7, record.id.find('/', 7) - 7);
        ForcedTally& t = sequences[kind];
        ++t.probes;
        t.top_k = record.top_k;
        if (record.forced.empty()) continue;
        ++t.scored;
        if (record.expected_logprob) {
          t.logprob += *record.expected_logprob;
          t.tokens += record.expected_tokens;
        }
        if (record.tail_mass) {
          t.tail += *record.tail_mass;
          ++t.tails;
        }
      }
    }
    for (const auto& [key, t] : cells) {
      const stats::Interval ci = stats::wilson_interval(t.passed, t.rounds, 0.95);
      tasks.rows.push_back(
          {Value(side_name(side, sides)), Value(key.first), Value(key.second),
           Value(int64_t{t.cases}), Value(t.rounds),
           t.rounds ? Value(100.0 * double(t.passed) / double(t.rounds)) : Value(),
           t.rounds ? Value(100.0 * ci.low) : Value(), t.rounds ? Value(100.0 * ci.high) : Value(),
           key.first == "toolcall" && t.rounds ? Value(100.0 * double(t.valid) / double(t.rounds))
                                               : Value(),
           Value(int64_t{t.errors})});
    }
    for (const auto& [kind, t] : sequences)
      forced.rows.push_back(
          {Value(side_name(side, sides)), Value(kind), Value(int64_t{t.probes}),
           Value(int64_t{t.scored}), t.tokens ? Value(t.logprob / double(t.tokens)) : Value(),
           t.tails ? Value(t.tail / double(t.tails)) : Value(), Value(int64_t{t.top_k})});
  }
  if (!tasks.rows.empty()) out.tables.push_back(std::move(tasks));
  if (!forced.rows.empty()) out.tables.push_back(std::move(forced));
}

// The verdict: the A/B result, the smoke and recall tallies, the findings to read.
void set_verdict(const RunResult& result, const SmokeTally& smoke, const RecallTally& recall,
                 report::Report& out) {
  report::Severity severity = report::Severity::info;
  for (const auto& finding : out.findings) severity = std::max(severity, finding.severity);
  std::vector<std::string> parts;
  if (result.compare) {
    const CompareSummary& c = *result.compare;
    std::string better =
        c.better.empty() ? "" : fmt::format("; {} recalls better", c.better == "a" ? "A" : "B");
    parts.push_back(fmt::format("A/B: {} ({}){}", c.verdict, c.reason, better));
    int failed = 0;
    for (const auto& gate : c.gates) failed += gate.status != "passed";
    if (!c.gates.empty()) {
      parts.push_back(failed == 0
                          ? fmt::format("gates: {} of {} passed", c.gates.size(), c.gates.size())
                          : fmt::format("gates: {} of {} FAILED", failed, c.gates.size()));
      if (failed > 0)
        severity = report::Severity::critical;
      else if (c.verdict == "different")
        severity = std::max(severity, report::Severity::warning);
    } else if (c.verdict == "different") {
      severity = report::Severity::critical;
    } else if (c.verdict == "inconclusive") {
      severity = std::max(severity, report::Severity::warning);
    }
  }
  if (smoke.total > 0) {
    parts.push_back(smoke.failed == 0
                        ? fmt::format("smoke: {} of {} passed", smoke.total, smoke.total)
                        : fmt::format("smoke: {} of {} FAILED", smoke.failed, smoke.total));
    if (smoke.failed) severity = report::Severity::critical;
  }
  if (recall.total > 0 && !result.compare)
    parts.push_back(fmt::format("recall exact match {:.0f}% over {} cases",
                                100.0 * recall.exact / recall.total, recall.total));
  if (!result.compare) {
    // One server's tasks: accuracy per task over every context length, with its interval.
    std::map<std::string, std::pair<int64_t, int64_t>> tasks;  // kind -> (passed, rounds)
    for (const auto& record : result.servers[0].records)
      if (record.kind == "mrcr" || record.kind == "toolcall") {
        tasks[record.kind].first += record.rounds_passed;
        tasks[record.kind].second += record.rounds;
      }
    for (const auto& [kind, tally] : tasks)
      if (tally.second > 0) {
        const stats::Interval ci = stats::wilson_interval(tally.first, tally.second, 0.95);
        parts.push_back(fmt::format("{} {:.0f}% of {} rounds (95% {:.0f}-{:.0f}%)", kind,
                                    100.0 * double(tally.first) / double(tally.second),
                                    tally.second, 100 * ci.low, 100 * ci.high));
      }
  }
  if (parts.empty()) {
    const ServerFacts& f = result.servers[0].facts;
    parts.push_back(fmt::format("{} serving {} with KV dtype {}", f.engine, f.model_id,
                                f.kv_cache_dtype.empty() ? "unknown" : f.kv_cache_dtype));
  }
  int findings_at_warning = 0;
  for (const auto& finding : out.findings)
    findings_at_warning += finding.severity >= report::Severity::warning;
  if (findings_at_warning > 0)
    parts.push_back(fmt::format("{} finding(s) to read", findings_at_warning));
  out.verdict.clear();
  for (size_t i = 0; i < parts.size(); ++i) out.verdict += (i ? "; " : "") + parts[i];
  out.verdict_severity = severity;
}

}  // namespace

report::Report to_report(const RunResult& result, const ProbeOptions& options) {
  report::Report out;
  out.command = "probe";
  const size_t sides = result.servers.size();
  out.title = sides == 2 ? fmt::format("kvaudit probe: A {} vs B {}", result.servers[0].facts.url,
                                       result.servers[1].facts.url)
                         : fmt::format("kvaudit probe: {}", result.servers[0].facts.url);
  json servers = add_servers(result, options, out);
  const SmokeTally smoke = add_smoke(result, out);
  const RecallTally recall = add_recall(result, out);
  add_tasks(result, out);
  json compare_json = add_compare(result, out);
  if (result.control) {
    json control = facts_json(result.control->facts);
    json records = json::array();
    for (const auto& record : result.control->records) records.push_back(to_json(record, false));
    control["records"] = std::move(records);
    control["resumed"] = result.control->resumed;
    control["requests"] = result.control->client_stats.requests;
    out.payload["control"] = std::move(control);
  }
  out.payload["servers"] = std::move(servers);
  out.payload["compare"] = compare_json;
  out.payload["token_counting"] = result.token_counting;
  for (const auto& note : result.notes) out.notes.push_back(note);
  if (!result.token_counting.empty())
    out.notes.push_back("Prompt lengths counted with " + result.token_counting + ".");

  set_verdict(result, smoke, recall, out);
  return out;
}

}  // namespace kvaudit::probe
