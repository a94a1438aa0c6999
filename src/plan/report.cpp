// plan report: turns a CapacityPlan (and an optional from-log prediction) into a
// report::Report: facts, the capacity table, the two charts, the explain table and
// the JSON rows[] payload.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "plan/plan.h"
#include "util/util.h"

namespace kvaudit::plan {

namespace {

using report::Column;
using report::Value;

std::string context_label(int64_t tokens) {
  if (tokens % 1024 == 0) return fmt::format("{}k", tokens / 1024);
  return std::to_string(tokens);
}

nlohmann::json interval_json(const TokenInterval& interval) {
  return {{"lo", interval.lo}, {"hi", interval.hi}};
}

void add_from_log(report::Report& out, const LogPrediction& prediction) {
  report::Table checks;
  checks.id = "from_log_checks";
  checks.title = "Checked against the log";
  checks.columns = {{"check", "check", "", 0},
                    {"printed", "printed", "", 0},
                    {"lo", "predicted from", "", 0},
                    {"hi", "predicted to", "", 0},
                    {"inside", "inside", "", 0}};
  nlohmann::json checks_json = nlohmann::json::array();
  int outside = 0;
  for (const auto& check : prediction.checks) {
    checks.rows.push_back({Value{check.what}, Value{check.printed}, Value{check.predicted.lo},
                           Value{check.predicted.hi}, Value{check.inside}});
    checks_json.push_back({{"id", check.id},
                           {"what", check.what},
                           {"printed", check.printed},
                           {"predicted", interval_json(check.predicted)},
                           {"inside", check.inside},
                           {"derivation", check.derivation}});
    outside += !check.inside;
    out.notes.push_back(check.derivation);
  }
  if (!prediction.checks.empty()) out.tables.push_back(std::move(checks));

  report::Table rows;
  rows.id = "from_log_dtypes";
  rows.title = "What each KV dtype would have given with this launch's memory";
  rows.columns = {{"kv_cache_dtype", "KV dtype", "", 0},
                  {"cell", "bytes/token/GPU", "B", 0},
                  {"lo", "max tokens from", "tokens", 0},
                  {"hi", "max tokens to", "tokens", 0},
                  {"launch", "this launch", "", 0}};
  nlohmann::json rows_json = nlohmann::json::array();
  report::Chart bars;
  bars.id = "from_log_capacity";
  bars.title = "Tokens the launch's KV budget holds, by dtype";
  bars.kind = report::ChartKind::bars;
  bars.x_label = "KV dtype";
  bars.y_label = "max tokens";
  report::Series series{"max tokens (low end)", {}};
  for (const auto& row : prediction.rows) {
    rows.rows.push_back({Value{row.kv_cache_dtype}, Value{row.cell_bytes_per_token_per_gpu},
                         Value{row.max_total_tokens.lo}, Value{row.max_total_tokens.hi},
                         Value{row.launch_dtype}});
    rows_json.push_back({{"kv_cache_dtype", row.kv_cache_dtype},
                         {"cell_bytes_per_token_per_gpu", row.cell_bytes_per_token_per_gpu},
                         {"max_total_tokens", interval_json(row.max_total_tokens)},
                         {"launch_dtype", row.launch_dtype}});
    bars.x_categories.push_back(row.kv_cache_dtype);
    series.y.push_back(static_cast<double>(row.max_total_tokens.lo));
  }
  bars.series.push_back(series);
  if (!prediction.rows.empty()) {
    out.tables.push_back(std::move(rows));
    out.charts.push_back(std::move(bars));
  }
  for (const auto& note : prediction.notes) out.notes.push_back(note);
  for (const auto& finding : prediction.findings) out.findings.push_back(finding);
  out.payload["from_log"] = {{"checks", checks_json}, {"rows", rows_json}};
  if (!prediction.checks.empty()) {
    out.verdict =
        outside == 0
            ? fmt::format("all {} printed figures fall inside the engine's predicted range",
                          prediction.checks.size())
            : fmt::format("{} of {} printed figures fall outside the predicted range", outside,
                          prediction.checks.size());
    out.verdict_severity = outside == 0 ? report::Severity::info : report::Severity::warning;
    for (const auto& finding : prediction.findings)
      if (finding.severity > out.verdict_severity) out.verdict_severity = finding.severity;
    if (!prediction.findings.empty())
      out.verdict +=
          fmt::format(" ({} finding{} on the launch's settings)", prediction.findings.size(),
                      prediction.findings.size() > 1 ? "s" : "");
  }
}

// The title and the facts: what was planned, on which engine and GPU, and the budget.
void add_plan_facts(const checkpoint::ModelFacts& model, const CapacityPlan& plan,
                    report::Report& out) {
  std::string model_name = model.dir.empty()       ? model.config_file
                           : !model.source.empty() ? model.dir.string()  // hf://org/model@sha
                                                   : model.dir.filename().string();
  out.title =
      fmt::format("kvaudit plan: {} on {} (TP {}{})", model_name, plan.engine, plan.parallel.tp,
                  plan.parallel.pp > 1 ? fmt::format(", PP {}", plan.parallel.pp) : "");
  if (!model.source.empty()) out.facts.push_back({"source", "Read from", Value{model.source}, ""});
  out.facts.push_back({"engine", "Engine", Value{plan.engine}, ""});
  out.facts.push_back({"tp", "Tensor parallel", Value{int64_t{plan.parallel.tp}}, ""});
  out.facts.push_back({"attention_tp", "Attention TP (KV heads split over)",
                       Value{int64_t{plan.parallel.attention_tp()}}, ""});
  if (!plan.gpu_name.empty()) out.facts.push_back({"gpu", "GPU", Value{plan.gpu_name}, ""});
  if (plan.gpu_memory_bytes > 0) {
    out.facts.push_back({"gpu_memory_bytes", "GPU memory", Value{plan.gpu_memory_bytes}, "B"});
    out.facts.push_back({"memory_fraction", "Memory fraction (" + plan.memory_fraction_source + ")",
                         Value{plan.memory_fraction}, ""});
    out.facts.push_back(
        {"weight_bytes_per_gpu", "Weights per GPU", Value{plan.weight_bytes_per_gpu}, "B"});
    out.facts.push_back({"budget_bytes", plan.budget_label, Value{plan.budget_bytes}, "B"});
  }
}

// The context lengths the concurrency columns are for (the first row's).
std::vector<int64_t> concurrency_contexts(const CapacityPlan& plan) {
  std::vector<int64_t> contexts;
  if (!plan.rows.empty())
    for (const auto& point : plan.rows.front().concurrency)
      contexts.push_back(point.context_tokens);
  return contexts;
}

// The capacity table: one row per KV dtype (cell, pool, tokens, Mamba state when any row
// has some, requests per context).
report::Table capacity_table(const CapacityPlan& plan) {
  report::Table table;
  table.id = "capacity";
  table.title = "Capacity per KV dtype (per GPU)";
  table.columns = {{"kv_cache_dtype", "KV dtype", "", 0},
                   {"cell_bytes_per_token_per_gpu", "bytes/token/GPU", "B", 0},
                   {"kv_pool_bytes", "KV pool", "B", 0},
                   {"max_total_tokens", "max tokens", "tokens", 0}};
  bool any_mamba = false, any_host = false;
  for (const auto& row : plan.rows) {
    any_mamba |= row.mamba_state_bytes_per_request > 0;
    any_host |= row.host_pool_bytes > 0;
  }
  if (any_mamba) {
    table.columns.push_back({"mamba_state_bytes_per_request", "state/request", "B", 0});
    table.columns.push_back({"mamba_slots", "state slots", "", 0});
  }
  if (any_host) {
    table.columns.push_back({"host_pool_tokens", "host pool", "tokens", 0});
    table.columns.push_back({"host_pool_bytes", "host pool/rank", "B", 0});
  }
  for (int64_t context : concurrency_contexts(plan))
    table.columns.push_back(
        {"concurrency_" + context_label(context), "requests @" + context_label(context), "", 0});
  for (const auto& row : plan.rows) {
    std::vector<Value> cells = {Value{row.kv_cache_dtype}, Value{row.cell_bytes_per_token_per_gpu},
                                Value{row.kv_pool_bytes}, Value{row.max_total_tokens}};
    if (any_mamba) {
      cells.push_back(Value{row.mamba_state_bytes_per_request});
      cells.push_back(Value{row.mamba_slots});
    }
    if (any_host) {
      cells.push_back(Value{row.host_pool_tokens});
      cells.push_back(Value{row.host_pool_bytes});
    }
    // Built in place: moving a temporary Value here trips a false GCC 12 -Wmaybe-uninitialized.
    for (const auto& point : row.concurrency) cells.emplace_back(point.requests);
    table.rows.push_back(std::move(cells));
  }
  return table;
}

// Requests at once per dtype and context: the least limit, named, and every other limit
// the engine applies (the KV pool, the state pool, the running-request cap, the context).
report::Table concurrency_table(const CapacityPlan& plan) {
  report::Table table;
  table.id = "concurrency";
  table.title = "Requests at once: the limit that decides";
  table.columns = {{"kv_cache_dtype", "KV dtype", "", 0},
                   {"context_tokens", "context", "tokens", 0},
                   {"requests", "requests", "", 0},
                   {"limited_by", "limited by", "", 0},
                   {"other_limits", "other limits (requests)", "", 0}};
  for (const auto& row : plan.rows)
    for (const auto& point : row.concurrency) {
      std::vector<std::string> others;
      for (const auto& [what, requests] : point.limits)
        if (what != point.limited_by) others.push_back(fmt::format("{} {}", what, requests));
      table.rows.push_back({Value{row.kv_cache_dtype}, Value{point.context_tokens},
                            Value{point.requests}, Value{point.limited_by},
                            Value{fmt::format("{}", fmt::join(others, "; "))}});
    }
  return table;
}

// One row of the JSON rows[] payload (its derivation only when explaining).
nlohmann::json row_json(const PlanRow& row, bool explain) {
  nlohmann::json concurrency = nlohmann::json::object();
  for (const auto& point : row.concurrency)
    concurrency[std::to_string(point.context_tokens)] = point.requests;
  nlohmann::json j = {{"kv_cache_dtype", row.kv_cache_dtype},
                      {"cell_bytes_per_token_per_gpu", row.cell_bytes_per_token_per_gpu},
                      {"kv_pool_bytes", row.kv_pool_bytes},
                      {"max_total_tokens", row.max_total_tokens},
                      {"concurrency", concurrency}};
  if (row.swa_tokens > 0) j["swa_tokens"] = row.swa_tokens;
  if (row.mamba_state_bytes_per_request > 0) {
    j["mamba_state_bytes_per_request"] = row.mamba_state_bytes_per_request;
    j["mamba_slots"] = row.mamba_slots;
    j["mamba_pool_bytes"] = row.mamba_pool_bytes;
  }
  if (row.num_blocks > 0) j["num_blocks"] = row.num_blocks;
  if (row.host_pool_bytes > 0) {
    j["host_pool_tokens"] = row.host_pool_tokens;
    j["host_pool_bytes"] = row.host_pool_bytes;
  }
  nlohmann::json limits = nlohmann::json::object();
  for (const auto& point : row.concurrency)
    limits[std::to_string(point.context_tokens)] = point.limited_by;
  j["concurrency_limited_by"] = limits;
  nlohmann::json every = nlohmann::json::object();
  for (const auto& point : row.concurrency) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [what, requests] : point.limits)
      list.push_back({{"limit", what}, {"requests", requests}});
    every[std::to_string(point.context_tokens)] = list;
  }
  j["concurrency_limits"] = every;
  if (explain) j["derivation"] = row.derivation;
  return j;
}

// The two charts (drawn only when a GPU's memory was known): max tokens per dtype, and
// concurrent requests against context length (one line per dtype that has points).
void add_capacity_charts(const CapacityPlan& plan, report::Report& out) {
  report::Chart bars{"capacity_by_dtype",
                     "Max tokens in the KV pool, by dtype",
                     report::ChartKind::bars,
                     "KV dtype",
                     "max tokens",
                     {},
                     {},
                     false,
                     false,
                     {}};
  report::Series bar_series{"max tokens", {}};
  report::Chart lines{"concurrency_vs_context",
                      "Concurrent requests vs context length",
                      report::ChartKind::lines,
                      "context (tokens)",
                      "concurrent requests",
                      {},
                      {},
                      true,
                      true,
                      {}};
  for (int64_t context : concurrency_contexts(plan))
    lines.x_values.push_back(static_cast<double>(context));
  for (const auto& row : plan.rows) {
    report::Series line{row.kv_cache_dtype, {}};
    for (const auto& point : row.concurrency) line.y.push_back(static_cast<double>(point.requests));
    bars.x_categories.push_back(row.kv_cache_dtype);
    bar_series.y.push_back(static_cast<double>(row.max_total_tokens));
    if (!line.y.empty()) lines.series.push_back(line);
  }
  bars.series.push_back(bar_series);
  if (plan.gpu_memory_bytes > 0) {
    out.charts.push_back(std::move(bars));
    if (!lines.series.empty()) out.charts.push_back(std::move(lines));
  }
}

// The explain table: the budget's steps, then each dtype's.
report::Table derivation_table(const CapacityPlan& plan) {
  report::Table derivation;
  derivation.id = "explain";
  derivation.title = "Derivation";
  derivation.columns = {{"kv_cache_dtype", "KV dtype", "", 0}, {"step", "step", "", 0}};
  for (const auto& step : plan.derivation) derivation.rows.push_back({Value{"all"}, Value{step}});
  for (const auto& row : plan.rows)
    for (const auto& step : row.derivation)
      derivation.rows.push_back({Value{row.kv_cache_dtype}, Value{step}});
  return derivation;
}

// The JSON payload: engine, sources, the budget and the rows.
void set_plan_payload(const CapacityPlan& plan, bool explain, report::Report& out) {
  nlohmann::json rows_json = nlohmann::json::array();
  for (const auto& row : plan.rows) rows_json.push_back(row_json(row, explain));
  out.payload["engine"] = plan.engine;
  out.payload["engine_version"] = plan.engine_version;
  out.payload["sources"] = plan.sources;
  out.payload["tp"] = plan.parallel.tp;
  out.payload["budget"] = {{"gpu_memory_bytes", plan.gpu_memory_bytes},
                           {"memory_fraction", plan.memory_fraction},
                           {"memory_fraction_source", plan.memory_fraction_source},
                           {"weight_bytes_per_gpu", plan.weight_bytes_per_gpu},
                           {"budget_bytes", plan.budget_bytes},
                           {"derivation", plan.derivation},
                           {"notes", plan.notes}};
  out.payload["rows"] = rows_json;
}

// "fp8_e4m3 70 B/token, 1,234 tokens; ... per GPU" (tokens only when the budget is known);
// empty without rows.
std::string plan_verdict(const CapacityPlan& plan) {
  if (plan.rows.empty()) return "";
  std::string verdict;
  for (const auto& row : plan.rows) {
    if (!verdict.empty()) verdict += "; ";
    verdict += plan.gpu_memory_bytes > 0
                   ? fmt::format("{} {} B/token, {} tokens", row.kv_cache_dtype,
                                 with_thousands(row.cell_bytes_per_token_per_gpu),
                                 with_thousands(row.max_total_tokens))
                   : fmt::format("{} {} B/token", row.kv_cache_dtype,
                                 with_thousands(row.cell_bytes_per_token_per_gpu));
  }
  verdict += " per GPU";
  const PlanRow& first = plan.rows.front();
  if (plan.gpu_memory_bytes > 0 && !first.concurrency.empty()) {
    const ConcurrencyPoint& point = first.concurrency.front();
    verdict += fmt::format("; {} at {} tokens: {} requests at once, limited by the {}",
                           first.kv_cache_dtype, with_thousands(point.context_tokens),
                           with_thousands(point.requests), point.limited_by);
  }
  return verdict;
}

}  // namespace

report::Report to_report(const checkpoint::ModelFacts& model, const CapacityPlan& plan,
                         const LogPrediction* from_log, bool explain) {
  report::Report out;
  out.command = "plan";
  add_plan_facts(model, plan, out);
  out.tables.push_back(capacity_table(plan));
  if (plan.gpu_memory_bytes > 0) out.tables.push_back(concurrency_table(plan));
  add_capacity_charts(plan, out);
  if (explain) out.tables.push_back(derivation_table(plan));
  for (const auto& note : plan.notes) out.notes.push_back(note);
  for (const auto& finding : plan.findings) out.findings.push_back(finding);
  set_plan_payload(plan, explain, out);
  if (!plan.rows.empty()) out.verdict = plan_verdict(plan);
  for (const auto& finding : plan.findings) {
    if (finding.severity > out.verdict_severity) out.verdict_severity = finding.severity;
    out.verdict += "; " + finding.title;
  }
  if (from_log) add_from_log(out, *from_log);
  return out;
}

}  // namespace kvaudit::plan
