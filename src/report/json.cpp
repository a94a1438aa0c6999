// report/json: the machine form of a report, one versioned schema for every
// command (docs/json-schema.md). Integers stay integers; doubles that are not
// finite become null because JSON has no NaN or infinity; every string is made
// valid UTF-8 so dumping never throws. A report whose shape is wrong (a row
// with the wrong number of cells, a duplicate key, a payload key that would
// overwrite a schema key) is a programming error and throws std::logic_error.
#include <array>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>

#include "report/report.h"
#include "util/util.h"

namespace kvaudit::report {
namespace {

constexpr std::array<std::string_view, 10> kSchemaKeys = {
    "schema_version", "command", "title",  "verdict",  "verdict_severity",
    "facts",          "tables",  "charts", "findings", "notes"};

nlohmann::json number_to_json(double number) {
  if (!std::isfinite(number)) return nullptr;
  return number;
}

nlohmann::json value_to_json(const Value& value) {
  struct Visitor {
    nlohmann::json operator()(std::monostate) const { return nullptr; }
    nlohmann::json operator()(bool flag) const { return flag; }
    nlohmann::json operator()(int64_t number) const { return number; }
    nlohmann::json operator()(double number) const { return number_to_json(number); }
    nlohmann::json operator()(const std::string& text) const { return to_valid_utf8(text); }
  };
  return std::visit(Visitor{}, value);
}

// Payloads come from commands and may hold raw strings from logs or doubles
// computed from broken data: make them as safe as the fields we build.
void sanitize_payload(nlohmann::json& node) {
  if (node.is_string()) {
    node = to_valid_utf8(node.get_ref<const std::string&>());
  } else if (node.is_number_float()) {
    if (!std::isfinite(node.get<double>())) node = nullptr;
  } else if (node.is_array()) {
    for (auto& child : node) sanitize_payload(child);
  } else if (node.is_object()) {
    nlohmann::json clean = nlohmann::json::object();
    for (auto& [key, child] : node.items()) {
      sanitize_payload(child);
      clean[to_valid_utf8(key)] = std::move(child);
    }
    node = std::move(clean);
  }
}

std::string_view chart_kind_name(ChartKind kind) {
  switch (kind) {
    case ChartKind::bars:
      return "bars";
    case ChartKind::lines:
      return "lines";
    case ChartKind::heatmap:
      return "heatmap";
  }
  return "bars";
}

nlohmann::json table_to_json(const Table& table) {
  nlohmann::json columns = nlohmann::json::array();
  std::set<std::string> keys;
  for (const Column& column : table.columns) {
    if (!keys.insert(column.key).second) {
      throw std::logic_error("report table '" + table.id + "': duplicate column key '" +
                             column.key + "'");
    }
    columns.push_back({{"key", to_valid_utf8(column.key)},
                       {"label", to_valid_utf8(column.label)},
                       {"unit", to_valid_utf8(column.unit)},
                       {"precision", column.precision}});
  }
  nlohmann::json rows = nlohmann::json::array();
  for (size_t r = 0; r < table.rows.size(); ++r) {
    const auto& row = table.rows[r];
    if (row.size() != table.columns.size()) {
      throw std::logic_error("report table '" + table.id + "': row " + std::to_string(r) + " has " +
                             std::to_string(row.size()) + " cells for " +
                             std::to_string(table.columns.size()) + " columns");
    }
    nlohmann::json object = nlohmann::json::object();
    for (size_t c = 0; c < row.size(); ++c) {
      object[to_valid_utf8(table.columns[c].key)] = value_to_json(row[c]);
    }
    rows.push_back(std::move(object));
  }
  return {{"id", to_valid_utf8(table.id)},
          {"title", to_valid_utf8(table.title)},
          {"columns", std::move(columns)},
          {"rows", std::move(rows)},
          {"note", to_valid_utf8(table.note)}};
}

nlohmann::json chart_to_json(const Chart& chart) {
  size_t points = chart.kind == ChartKind::lines && !chart.x_values.empty()
                      ? chart.x_values.size()
                      : chart.x_categories.size();
  nlohmann::json series = nlohmann::json::array();
  for (const Series& one : chart.series) {
    if (one.y.size() != points) {
      throw std::logic_error("report chart '" + chart.id + "': series '" + one.name + "' has " +
                             std::to_string(one.y.size()) + " values for " +
                             std::to_string(points) + " x positions");
    }
    nlohmann::json y = nlohmann::json::array();
    for (double value : one.y) y.push_back(number_to_json(value));
    series.push_back({{"name", to_valid_utf8(one.name)}, {"y", std::move(y)}});
  }
  nlohmann::json categories = nlohmann::json::array();
  for (const std::string& category : chart.x_categories)
    categories.push_back(to_valid_utf8(category));
  nlohmann::json x_values = nlohmann::json::array();
  for (double value : chart.x_values) x_values.push_back(number_to_json(value));
  return {{"id", to_valid_utf8(chart.id)},
          {"title", to_valid_utf8(chart.title)},
          {"kind", chart_kind_name(chart.kind)},
          {"x_label", to_valid_utf8(chart.x_label)},
          {"y_label", to_valid_utf8(chart.y_label)},
          {"x_categories", std::move(categories)},
          {"x_values", std::move(x_values)},
          {"log_x", chart.log_x},
          {"log_y", chart.log_y},
          {"diverging", chart.diverging},
          {"precision", chart.precision},
          {"value_unit", to_valid_utf8(chart.value_unit)},
          {"series", std::move(series)}};
}

nlohmann::json finding_to_json(const Finding& finding) {
  nlohmann::json evidence = nlohmann::json::array();
  for (const Evidence& item : finding.evidence) {
    evidence.push_back({{"file", to_valid_utf8(item.file)},
                        {"key", to_valid_utf8(item.key)},
                        {"value", to_valid_utf8(item.value)},
                        {"line", item.line}});
  }
  nlohmann::json out = {{"id", to_valid_utf8(finding.id)},
                        {"severity", severity_name(finding.severity)},
                        {"title", to_valid_utf8(finding.title)},
                        {"consequence", to_valid_utf8(finding.consequence)},
                        {"evidence", std::move(evidence)},
                        {"fix", to_valid_utf8(finding.fix)},
                        {"reference", to_valid_utf8(finding.reference)},
                        {"basis", to_valid_utf8(finding.basis)},
                        {"judged_on", to_valid_utf8(finding.judged_on)}};
  return out;
}

}  // namespace

nlohmann::json render_json(const Report& report) {
  nlohmann::json out = nlohmann::json::object();
  out["schema_version"] = kSchemaVersion;
  out["command"] = to_valid_utf8(report.command);
  out["title"] = to_valid_utf8(report.title);
  out["verdict"] = to_valid_utf8(report.verdict);
  out["verdict_severity"] = severity_name(report.verdict_severity);
  nlohmann::json facts = nlohmann::json::object();
  for (const Fact& fact : report.facts) {
    std::string key = to_valid_utf8(fact.key);
    if (facts.contains(key)) throw std::logic_error("report: duplicate fact key '" + key + "'");
    facts[key] = value_to_json(fact.value);
  }
  out["facts"] = std::move(facts);
  out["tables"] = nlohmann::json::array();
  for (const Table& table : report.tables) out["tables"].push_back(table_to_json(table));
  out["charts"] = nlohmann::json::array();
  for (const Chart& chart : report.charts) out["charts"].push_back(chart_to_json(chart));
  out["findings"] = nlohmann::json::array();
  for (const Finding& finding : report.findings)
    out["findings"].push_back(finding_to_json(finding));
  out["notes"] = nlohmann::json::array();
  for (const std::string& note : report.notes) out["notes"].push_back(to_valid_utf8(note));

  if (report.payload.is_null()) return out;
  if (!report.payload.is_object()) {
    throw std::logic_error("report payload must be a JSON object, not " +
                           std::string(report.payload.type_name()));
  }
  nlohmann::json payload = report.payload;
  sanitize_payload(payload);
  for (auto& [key, value] : payload.items()) {
    for (std::string_view reserved : kSchemaKeys) {
      if (key == reserved) {
        throw std::logic_error("report payload key '" + key + "' collides with a schema key");
      }
    }
    out[key] = std::move(value);
  }
  return out;
}

}  // namespace kvaudit::report
