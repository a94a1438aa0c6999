// decide report: the decision table (one row per option), the fix and the verification
// commands as tables, the same data in the JSON payload, and a chart of tokens per option.
#include <fmt/format.h>

#include "decide/decide.h"
#include "util/util.h"

namespace kvaudit::decide {

namespace {

using report::Value;

// "1 critical, 2 warnings", "none".
// "1 critical, 2 warnings", "none"; and the known-bad combinations the option hits.
std::string findings_cell(const KvOption& o) {
  std::string out;
  if (o.critical > 0) out = fmt::format("{} critical", o.critical);
  if (o.warning > 0)
    out +=
        fmt::format("{}{} warning{}", out.empty() ? "" : ", ", o.warning, o.warning > 1 ? "s" : "");
  if (out.empty()) out = "none";
  if (!o.known_bad.empty()) out += fmt::format("; known bad: {}", fmt::join(o.known_bad, ", "));
  return out;
}

// The scale source as a table cell says it.
std::string scales_cell(const std::string& source) {
  if (source == "unit_default") return "1.0 (none loaded)";
  if (source == "not_applicable") return "- (16-bit)";
  if (source == "dynamic_by_design") return "dynamic";
  if (source == "quantization_param_path") return "param-path JSON";
  return source;
}

std::string context_label(int64_t tokens) {
  return tokens % 1024 == 0 ? fmt::format("{}K", tokens / 1024) : std::to_string(tokens);
}

nlohmann::json option_json(const KvOption& o) {
  nlohmann::json concurrency = nlohmann::json::array();
  for (const auto& c : o.concurrency)
    concurrency.push_back({{"context_tokens", c.context_tokens},
                           {"requests", c.requests},
                           {"limited_by", c.limited_by}});
  return {{"id", o.id},
          {"label", o.label},
          {"change", o.change},
          {"how", o.how},
          {"possible", o.possible},
          {"why_not", o.why_not},
          {"kv_cache_dtype", o.kv_cache_dtype},
          {"scale_source", o.scale_source},
          {"critical", o.critical},
          {"warning", o.warning},
          {"findings", o.finding_ids},
          {"known_bad", o.known_bad},
          {"max_total_tokens", o.tokens ? nlohmann::json{{"lo", o.tokens->lo}, {"hi", o.tokens->hi}}
                                        : nlohmann::json()},
          {"concurrency", concurrency},
          {"expect", expectations_for(o)}};
}

}  // namespace

void add_to_report(const Decision& decision, const std::vector<std::string>& fix_lines,
                   const std::vector<std::string>& verify_lines, report::Report& out) {
  report::Table table;
  table.id = "decision";
  table.title = "Every KV option of this release, judged and sized";
  table.columns = {{"option", "Option", "", 0},      {"change", "Change", "", 0},
                   {"kv_dtype", "KV dtype", "", 0},  {"scales", "Scales", "", 0},
                   {"left", "Findings left", "", 0}, {"tokens", "KV tokens per GPU", "tokens", 0}};
  for (int64_t context : decision.contexts)
    table.columns.push_back(
        {"concurrency_" + std::to_string(context), "Requests at " + context_label(context), "", 0});
  report::Chart chart;
  chart.id = "decision-tokens";
  chart.title = "KV tokens per GPU, by option";
  chart.kind = report::ChartKind::bars;
  chart.x_label = "option";
  chart.y_label = "tokens";
  chart.precision = 0;  // token counts
  report::Series series{"KV tokens per GPU", {}};
  nlohmann::json options = nlohmann::json::array();
  for (const KvOption& o : decision.options) {
    std::vector<Value> row = {Value{o.label + (o.id == decision.recommended   ? " (the fix)"
                                               : o.id == decision.alternative ? " (keeps capacity)"
                                                                              : "")},
                              Value{o.possible ? o.change : "not possible (see the note)"},
                              o.possible ? Value{o.kv_cache_dtype} : Value{},
                              o.possible ? Value{scales_cell(o.scale_source)} : Value{},
                              o.possible ? Value{findings_cell(o)} : Value{},
                              o.tokens
                                  ? (o.tokens->lo == o.tokens->hi
                                         ? Value{o.tokens->lo}
                                         : Value{fmt::format("{}..{}", with_thousands(o.tokens->lo),
                                                             with_thousands(o.tokens->hi))})
                                  : Value{}};
    for (int64_t context : decision.contexts) {
      Value cell;
      for (const auto& c : o.concurrency)
        if (c.context_tokens == context) cell = Value{c.requests};
      row.push_back(cell);
    }
    table.rows.push_back(std::move(row));
    if (o.tokens) {
      chart.x_categories.push_back(o.label);
      series.y.push_back(static_cast<double>(o.tokens->lo));
    }
    options.push_back(option_json(o));
  }
  table.note = decision.memory_note;
  if (!decision.sized) out.notes.push_back(decision.memory_note);
  for (const KvOption& o : decision.options)
    if (!o.possible)
      out.notes.push_back(fmt::format("{}: not possible: {}", o.label, o.why_not));
    else if (!o.how.empty())
      out.notes.push_back(fmt::format("{}: {}", o.label, o.how));
  if (decision.sized) out.tables.push_back(std::move(table));
  if (!series.y.empty()) {
    chart.series.push_back(std::move(series));
    out.charts.push_back(std::move(chart));
  }
  auto command_table = [&](const char* id, const char* title,
                           const std::vector<std::string>& lines) {
    if (lines.empty()) return;
    report::Table t;
    t.id = id;
    t.title = title;
    t.columns = {{"step", "Step", "", 0, false}, {"command", "Command", "", 0}};
    int64_t step = 1;
    for (const auto& line : lines) t.rows.push_back({Value{step++}, Value{line}});
    out.tables.push_back(std::move(t));
  };
  command_table("fix", "The fix", fix_lines);
  command_table("verify", "After the restart: prove it took effect", verify_lines);
  for (const auto& note : decision.notes) out.notes.push_back(note);
  out.payload["decision"] = {{"options", options},
                             {"contexts", decision.contexts},
                             {"recommended", decision.recommended},
                             {"alternative", decision.alternative},
                             {"sized", decision.sized},
                             {"memory", decision.memory_note},
                             {"fix", fix_lines},
                             {"verify", verify_lines}};
}

}  // namespace kvaudit::decide
