// Reads the key tables of docs/json-schema.md: the sections whose heading starts with
// `heading` ("## Object: " for the report, "## Payload object: " for payloads), as
// NAME -> [(key, type)] in document order, and checks JSON against them. The schema tests
// of the report and of the payloads read and check the document this way.
#pragma once

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvaudit::testing {

using SchemaTables = std::map<std::string, std::vector<std::pair<std::string, std::string>>>;

inline SchemaTables load_schema_tables(const std::string& heading) {
  std::ifstream file(std::string(KVAUDIT_TEST_DIR) + "/../docs/json-schema.md");
  if (!file) throw std::runtime_error("cannot read docs/json-schema.md");
  SchemaTables tables;
  std::string object, line;
  while (std::getline(file, line)) {
    if (line.rfind("## ", 0) == 0) {
      object = line.rfind(heading, 0) == 0 ? line.substr(heading.size()) : "";
      if (!object.empty()) tables[object];
      continue;
    }
    if (object.empty() || line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream stream(line.substr(1));
    for (std::string cell; std::getline(stream, cell, '|');) cells.push_back(cell);
    auto unquote = [](const std::string& cell) {
      size_t open = cell.find('`'), close = cell.rfind('`');
      return open != std::string::npos && close > open ? cell.substr(open + 1, close - open - 1)
                                                       : std::string();
    };
    if (cells.size() >= 2) tables[object].emplace_back(unquote(cells[0]), unquote(cells[1]));
  }
  return tables;
}

// Checks a value against a documented type, both ways: every documented key present with
// its type, no undocumented key (but `allowed_extra` at the top: a report's payload keys).
// Types: string, integer, number, boolean, value (a scalar), severity, chart-kind, array<T>,
// map<T>, T-or-null, or a documented object name. `seen` collects the objects met.
class SchemaValidator {
 public:
  using json = nlohmann::json;
  explicit SchemaValidator(SchemaTables schema) : schema_(std::move(schema)) {}

  void validate(const json& value, const std::string& type, const std::string& path,
                const std::set<std::string>& allowed_extra = {}) {
    auto fail = [&](const std::string& what) { problems.push_back(path + ": " + what); };
    const std::string or_null = "-or-null";
    if (type.size() > or_null.size() && type.ends_with(or_null)) {
      if (!value.is_null()) validate(value, type.substr(0, type.size() - or_null.size()), path);
      return;
    }
    if (type == "string") {
      if (!value.is_string()) fail("expected string, got " + value.dump());
    } else if (type == "integer") {
      if (!value.is_number_integer()) fail("expected integer, got " + value.dump());
    } else if (type == "number") {
      if (!value.is_number()) fail("expected number, got " + value.dump());
    } else if (type == "boolean") {
      if (!value.is_boolean()) fail("expected boolean, got " + value.dump());
    } else if (type == "value") {
      if (value.is_object() || value.is_array())
        fail("expected a scalar value, got " + value.dump());
    } else if (type == "severity") {
      if (value != "info" && value != "warning" && value != "critical")
        fail("expected a severity, got " + value.dump());
    } else if (type == "chart-kind") {
      if (value != "bars" && value != "lines" && value != "heatmap")
        fail("expected a chart kind, got " + value.dump());
    } else if (type.starts_with("array<") && type.ends_with(">")) {
      if (!value.is_array()) return fail("expected array, got " + value.dump());
      for (size_t i = 0; i < value.size(); ++i)
        validate(value[i], type.substr(6, type.size() - 7), path + "[" + std::to_string(i) + "]");
    } else if (type.starts_with("map<") && type.ends_with(">")) {
      if (!value.is_object()) return fail("expected object, got " + value.dump());
      for (const auto& [key, child] : value.items())
        validate(child, type.substr(4, type.size() - 5), path + "." + key);
    } else if (schema_.count(type)) {
      if (!value.is_object()) return fail("expected " + type + " object, got " + value.dump());
      seen.insert(type);
      std::set<std::string> documented;
      for (const auto& [key, key_type] : schema_.at(type)) {
        documented.insert(key);
        if (!value.contains(key))
          fail("missing documented key '" + key + "'");
        else
          validate(value.at(key), key_type, path + "." + key);
      }
      for (const auto& [key, member] : value.items())
        if (!documented.count(key) && !allowed_extra.count(key))
          fail("key '" + key + "' is not documented");
    } else {
      fail("the document uses an unknown type '" + type + "'");
    }
  }

  std::vector<std::string> problems;
  std::set<std::string> seen;

 private:
  SchemaTables schema_;
};

}  // namespace kvaudit::testing
