// logs report: the latest launch (or every launch with --all) as facts, a launch
// table, findings, expectation results and the launches[] JSON payload.
#include <utility>

#include <fmt/format.h>

#include "logs/logs.h"
#include "logs/parse.h"
#include "util/util.h"

namespace kvaudit::logs {

namespace {

using report::Value;

nlohmann::json opt(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}
nlohmann::json opt(const std::optional<int64_t>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}
nlohmann::json opt_string(const std::string& s) {
  return s.empty() ? nlohmann::json() : nlohmann::json(s);
}

nlohmann::json finding_json(const report::Finding& f) {
  nlohmann::json evidence = nlohmann::json::array();
  for (const auto& e : f.evidence)
    evidence.push_back({{"file", e.file}, {"key", e.key}, {"value", e.value}});
  return {{"id", f.id},
          {"severity", std::string(report::severity_name(f.severity))},
          {"title", f.title},
          {"consequence", f.consequence},
          {"evidence", evidence},
          {"fix", f.fix},
          {"reference", f.reference}};
}

nlohmann::json launch_json(const Launch& l) {
  const auto& m = l.memory;
  nlohmann::json memory = {{"total_before_load_gib", opt(m.total_before_load_gib)},
                           {"avail_after_weights_gib", opt(m.avail_after_weights_gib)},
                           {"mem_fraction_static", opt(m.mem_fraction_static)},
                           {"pool_tokens", opt(m.pool_tokens)},
                           {"k_gib", opt(m.k_gib)},
                           {"v_gib", opt(m.v_gib)},
                           {"kv_gib", opt(m.kv_gib)},
                           {"mamba_slots", opt(m.mamba_slots)},
                           {"conv_state_gib", opt(m.conv_gib)},
                           {"ssm_state_gib", opt(m.ssm_gib)},
                           {"available_kv_gib", opt(m.available_kv_gib)},
                           {"num_gpu_blocks", opt(m.num_gpu_blocks)},
                           {"gpu_kv_cache_tokens", opt(m.gpu_kv_cache_tokens)},
                           {"concurrency_context", opt(m.concurrency_context)},
                           {"concurrency_x", opt(m.concurrency_x)}};
  nlohmann::json scale_messages = nlohmann::json::array();
  for (const auto& s : l.scale_messages)
    scale_messages.push_back({{"line", s.line},
                              {"kind", s.kind},
                              {"text", s.text},
                              {"template", s.template_id},
                              {"reference", s.reference}});
  nlohmann::json failures = nlohmann::json::array();
  for (const auto& f : l.failures)
    failures.push_back({{"line", f.line},
                        {"kind", f.kind},
                        {"text", f.text},
                        {"after_ready", f.after_ready},
                        {"reference", f.reference}});
  nlohmann::json findings = nlohmann::json::array();
  for (const auto& f : l.findings) findings.push_back(finding_json(f));
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : l.ranks_seen) ranks.push_back(r);
  return {
      {"index", l.index},
      {"first_line", l.first_line},
      {"last_line", l.last_line},
      {"split_reason", opt_string(l.split_reason)},
      {"start_time", opt_string(l.start_time)},
      {"end_time", opt_string(l.end_time)},
      {"engine", opt_string(l.engine)},
      {"engine_version", opt_string(l.engine_version)},
      {"model_path", opt_string(l.model_path)},
      {"tp", l.tp > 0 ? nlohmann::json(l.tp) : nlohmann::json()},
      {"ranks_seen", ranks},
      {"kv_cache_dtype_requested", opt_string(l.kv_cache_dtype_requested)},
      {"kv_cache_dtype_resolved", opt_string(l.kv_cache_dtype_resolved)},
      {"resolved_evidence", opt_string(l.resolved_evidence)},
      {"scale_fallback", l.scale_fallback ? nlohmann::json(*l.scale_fallback) : nlohmann::json()},
      {"scale_fallback_reason", l.scale_fallback_reason},
      {"scale_messages", scale_messages},
      {"max_total_tokens", opt(l.max_total_tokens)},
      {"max_running_requests", opt(l.max_running_requests)},
      {"running_requests_cap",
       l.running_requests_cap
           ? nlohmann::json{{"effective", l.running_requests_cap->effective},
                            {"requested", opt(l.running_requests_cap->requested)},
                            {"state_slots", opt(l.running_requests_cap->state_slots)},
                            {"slots_per_request", opt(l.running_requests_cap->slots_per_request)},
                            {"by", l.running_requests_cap->by},
                            {"line", l.running_requests_cap->line}}
           : nlohmann::json()},
      {"context_length", opt(l.context_length)},
      {"weights_gib", opt(l.weights_gib)},
      {"kv_tiers", tiers_json(l)},
      {"memory", memory},
      {"ready", l.ready},
      {"failures", failures},
      {"failures_dropped", l.failures_dropped},
      {"server_args", l.server_args},
      {"server_args_complete", l.server_args_complete},
      {"server_args_read_by", opt_string(l.server_args_read_by)},
      {"findings", findings}};
}

Value text_or_unknown(const std::string& s) {
  return s.empty() ? Value{std::string("unknown")} : Value{s};
}

// The latest launch's facts: when, engine, model, TP, KV dtype asked for and resolved,
// the scale fallback, capacity and readiness.
void add_latest_facts(const Launch& latest, report::Report& out) {
  auto fact = [&](const char* key, const char* label, Value v) {
    out.facts.push_back({key, label, std::move(v), ""});
  };
  fact("latest_launch", "Latest launch",
       Value{fmt::format("#{} started {} (lines {}-{})", latest.index + 1,
                         latest.start_time.empty() ? "?" : latest.start_time, latest.first_line,
                         latest.last_line)});
  fact("engine", "Engine",
       text_or_unknown(latest.engine +
                       (latest.engine_version.empty() ? "" : " " + latest.engine_version)));
  fact("model_path", "Model", text_or_unknown(latest.model_path));
  if (latest.tp > 0) out.facts.push_back({"tp", "TP", Value{int64_t{latest.tp}}, ""});
  fact("kv_cache_dtype_requested", "KV dtype requested",
       text_or_unknown(latest.kv_cache_dtype_requested));
  fact("kv_cache_dtype_resolved", "KV dtype resolved",
       text_or_unknown(latest.kv_cache_dtype_resolved));
  fact("scale_fallback", "Scale 1.0 fallback",
       latest.scale_fallback ? Value{std::string(*latest.scale_fallback ? "yes" : "no")}
                             : Value{std::string("cannot tell from the log")});
  if (latest.max_total_tokens)
    out.facts.push_back(
        {"max_total_tokens", "Max total tokens", Value{*latest.max_total_tokens}, "tokens"});
  if (latest.max_running_requests) {
    const auto& cap = latest.running_requests_cap;
    std::string text = with_thousands(*latest.max_running_requests);
    if (cap && cap->slots_per_request && cap->state_slots)
      text += fmt::format(" (capped by the {}: {} state slots / {} per request)", cap->by,
                          *cap->state_slots, *cap->slots_per_request);
    else if (cap)
      text += fmt::format(" (reduced{} due to the {}, as the log says)",
                          cap->requested ? fmt::format(" from {}", *cap->requested) : "", cap->by);
    fact("max_running_requests", "Max running requests", Value{text});
  }
  if (std::string tiers = tiers_text(latest); !tiers.empty())
    fact("kv_tiers", "KV tiers", Value{tiers});
  fact("ready", "Ready", Value{latest.ready});
}

// One row per launch, latest last.
report::Table launch_table(const LogScan& scan) {
  report::Table table;
  table.id = "launches";
  table.title = "Launches (latest last)";
  table.columns = {{"index", "#", "", 0},
                   {"start", "started", "", 0},
                   {"engine", "engine", "", 0},
                   {"resolved", "KV dtype", "", 0},
                   {"scale_fallback", "scale 1.0", "", 0},
                   {"tokens", "max tokens", "tokens", 0},
                   {"tiers", "KV tiers", "", 0},
                   {"ready", "ready", "", 0},
                   {"failures", "failures", "", 0}};
  for (const auto& l : scan.launches)
    table.rows.push_back(
        {Value{int64_t{l.index + 1}}, text_or_unknown(l.start_time), text_or_unknown(l.engine),
         text_or_unknown(l.kv_cache_dtype_resolved),
         l.scale_fallback ? Value{std::string(*l.scale_fallback ? "yes" : "no")}
                          : Value{std::string("?")},
         l.max_total_tokens ? Value{*l.max_total_tokens} : Value{},
         tiers_text(l).empty() ? Value{std::string("none printed")} : Value{tiers_text(l)},
         Value{l.ready}, Value{static_cast<int64_t>(l.failures.size())}});
  return table;
}

// Max total tokens per launch (0 where the log printed none).
report::Chart launch_chart(const LogScan& scan) {
  report::Chart chart{"capacity_by_launch",
                      "Max total tokens by launch",
                      report::ChartKind::bars,
                      "launch",
                      "max total tokens",
                      {},
                      {},
                      false,
                      false,
                      {}};
  report::Series series{"max total tokens", {}};
  for (const auto& l : scan.launches) {
    chart.x_categories.push_back(fmt::format("#{} {}", l.index + 1, l.kv_cache_dtype_resolved));
    series.y.push_back(l.max_total_tokens ? static_cast<double>(*l.max_total_tokens) : 0.0);
  }
  chart.series.push_back(series);
  return chart;
}

// The expectations table and payload, checked on `which` launch.
void add_expectations(const std::vector<ExpectationResult>& expectations, const std::string& which,
                      report::Report& out) {
  report::Table expect;
  expect.id = "expectations";
  expect.title = fmt::format("Expectations ({})", which);
  expect.columns = {{"key", "key", "", 0},
                    {"expected", "expected", "", 0},
                    {"actual", "log says", "", 0},
                    {"met", "met", "", 0}};
  nlohmann::json ej = nlohmann::json::array();
  for (const auto& r : expectations) {
    expect.rows.push_back(
        {Value{r.expected.key}, Value{r.expected.value}, text_or_unknown(r.actual), Value{r.met}});
    ej.push_back({{"key", r.expected.key},
                  {"expected", r.expected.value},
                  {"actual", r.actual},
                  {"met", r.met}});
  }
  out.tables.push_back(std::move(expect));
  out.payload["expectations"] = ej;
}

// The verdict: the first unmet expectation (critical), else the launch's KV cache,
// readiness and capacity at the severity of its worst finding.
void set_logs_verdict(const LogScan& scan, const Launch& latest,
                      const std::vector<ExpectationResult>& expectations, const std::string& which,
                      report::Report& out) {
  int unmet = 0;
  std::string first_unmet;
  for (const auto& r : expectations)
    if (!r.met) {
      if (unmet++ == 0)
        first_unmet = fmt::format("{} expected {}, the log says {}", r.expected.key,
                                  r.expected.value, r.actual.empty() ? "nothing" : r.actual);
    }
  report::Severity worst = report::Severity::info;
  for (const auto& f : latest.findings)
    if (static_cast<int>(f.severity) > static_cast<int>(worst)) worst = f.severity;
  if (unmet > 0) {
    out.verdict = fmt::format("{} fails {} expectation(s): {}", which, unmet, first_unmet);
    out.verdict_severity = report::Severity::critical;
  } else {
    out.verdict = fmt::format(
        "{}{}: {} KV cache, {}{}{}", which,
        scan.launches_after == 0 ? fmt::format(" #{}", latest.index + 1) : "",
        latest.kv_cache_dtype_resolved.empty() ? "unknown" : latest.kv_cache_dtype_resolved,
        latest.ready ? "ready" : "not ready",
        latest.max_total_tokens ? ", " + with_thousands(*latest.max_total_tokens) + " tokens" : "",
        expectations.empty() ? "" : "; all expectations met");
    out.verdict_severity = worst;
  }
}

}  // namespace

std::string chosen_launch_note(const LogScan& scan, const Launch& chosen) {
  if (scan.launches.size() < 2) return "";
  std::vector<std::string> parts;
  for (const Launch& l : scan.launches)
    parts.push_back(fmt::format("#{} lines {}-{}{}", l.index + 1, l.first_line, l.last_line,
                                l.split_reason.empty() ? "" : " (" + l.split_reason + ")"));
  const bool latest = &chosen == &scan.launches.back();
  return fmt::format(
      "The log holds {} launches ({}); these figures are launch #{}'s{}; --launch N reads "
      "another",
      scan.launches.size(), fmt::join(parts, "; "), chosen.index + 1, latest ? ", the latest" : "");
}

report::Report to_report(const LogScan& scan, bool all_launches,
                         const std::vector<ExpectationResult>& expectations) {
  report::Report out;
  out.command = "logs";
  out.title = "kvaudit logs: " + scan.source;
  out.facts.push_back(
      {"launch_count", "Launches found", Value{static_cast<int64_t>(scan.launches.size())}, ""});
  out.facts.push_back({"lines", "Lines read", Value{scan.lines}, ""});
  out.facts.push_back({"bytes", "Bytes read", Value{static_cast<int64_t>(scan.bytes)}, "B"});
  if (scan.launches.empty()) {
    out.verdict = "no SGLang or vLLM start-up lines found";
    out.verdict_severity = report::Severity::warning;
    out.payload["launches"] = nlohmann::json::array();
    return out;
  }
  const Launch& latest = scan.launches.back();
  add_latest_facts(latest, out);

  // The selected launches (the latest, or all with --all): their findings and JSON.
  nlohmann::json launches = nlohmann::json::array();
  for (const auto& l : scan.launches) {
    if (!all_launches && &l != &latest) continue;
    launches.push_back(launch_json(l));
    for (const auto& f : l.findings) out.findings.push_back(f);
  }
  out.tables.push_back(launch_table(scan));
  if (scan.launches.size() > 1) out.charts.push_back(launch_chart(scan));

  // --launch N picks an older launch: say which one the expectations were checked on.
  const std::string which =
      scan.launches_after == 0
          ? std::string("latest launch")
          : fmt::format("launch {} of {}", latest.index + 1,
                        static_cast<int64_t>(scan.launches.size()) + scan.launches_after);
  if (!expectations.empty()) add_expectations(expectations, which, out);
  if (scan.launches_dropped > 0)
    out.notes.push_back(fmt::format("{} older launches were dropped (only the latest {} are kept)",
                                    scan.launches_dropped, scan.launches.size()));
  if (scan.truncated_lines > 0)
    out.notes.push_back(fmt::format("{} over-long lines were read in part", scan.truncated_lines));
  for (const auto& l : scan.launches)
    if (!l.split_reason.empty())
      out.notes.push_back(fmt::format("Launch {} has no start-up lines of its own: {}", l.index + 1,
                                      l.split_reason));
  out.notes.push_back(latest.scale_fallback_reason);
  out.payload["launches"] = launches;
  out.payload["launch_count"] = scan.launches.size();
  out.payload["lines"] = scan.lines;
  set_logs_verdict(scan, latest, expectations, which, out);
  return out;
}

}  // namespace kvaudit::logs
