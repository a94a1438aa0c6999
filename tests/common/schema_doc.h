// Reads the key tables of docs/json-schema.md: the sections whose heading starts with
// `heading` ("## Object: " for the report, "## Payload object: " for payloads), as
// NAME -> [(key, type)] in document order. Both schema tests read the document this way.
#pragma once

#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace kvaudit::testing
