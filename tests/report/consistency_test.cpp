// The same report data must show the same digits everywhere: every table cell
// and fact is found in the terminal output, in the HTML (as the cell's text)
// and, for numbers, in the JSON (formatted back with the column's rules).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "report/report.h"
#include "sample_report.h"

namespace kvaudit::report {
namespace {

std::string unescape_html(std::string text) {
  const std::pair<const char*, const char*> entities[] = {
      {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#39;", "'"}, {"&amp;", "&"}};
  for (const auto& [entity, plain] : entities) {
    for (size_t at = text.find(entity); at != std::string::npos; at = text.find(entity, at + 1)) {
      text.replace(at, std::string(entity).size(), plain);
    }
  }
  return text;
}

// Cells with many magnitudes, signs and precisions, and integer extremes.
Table numbers_table() {
  Table table;
  table.id = "numbers";
  table.title = "Numbers";
  table.columns = {{"label", "Label", ""},           {"count", "Count", "tokens"},
                   {"plain_id", "Id", "", 3, false}, {"p0", "P0", "", 0},
                   {"p2", "P2", "GiB", 2},           {"p3", "P3", ""},
                   {"p6", "P6", "", 6, false}};
  const double doubles[] = {0.0,      1.0,       -1.5,    0.5,      0.049999,  0.00123456,
                            -0.0421,  7.25e-7,   3.3e-12, 123.4567, 99999.995, 1234567.891,
                            -9.87e10, 1.0 / 3.0, 2.0 / 3, 1e-6,     0.999999,  5e17};
  const int64_t integers[] = {0,
                              1,
                              -1,
                              999,
                              1000,
                              -1000,
                              1234567,
                              std::numeric_limits<int64_t>::max(),
                              std::numeric_limits<int64_t>::min(),
                              65536};
  size_t rows = std::max(std::size(doubles), std::size(integers));
  for (size_t r = 0; r < rows; ++r) {
    double d = doubles[r % std::size(doubles)];
    int64_t i = integers[r % std::size(integers)];
    table.rows.push_back({Value{"row " + std::to_string(r)}, Value{i}, Value{i}, Value{d * 3},
                          Value{d}, Value{-d / 7}, Value{d}});
  }
  return table;
}

Report consistency_report() {
  Report report = testing::sample_report();
  report.tables.push_back(numbers_table());
  report.facts.push_back({"third", "One third", Value{1.0 / 3.0}, "GiB", 4});
  report.facts.push_back({"port", "Port", Value{int64_t{30000}}, "", 3, false});
  report.facts.push_back({"huge", "Huge", Value{std::numeric_limits<int64_t>::max()}, "B"});
  return report;
}

// Terminal rows of a table: split each line on runs of two or more blanks.
std::vector<std::vector<std::string>> terminal_rows(const std::string& text, const Table& table) {
  std::istringstream stream(text);
  std::vector<std::string> lines;
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  size_t at = 0;
  while (at < lines.size() && lines[at] != table.title) ++at;
  std::vector<std::vector<std::string>> rows;
  for (size_t r = 0; r < table.rows.size() && at + 3 + r < lines.size(); ++r) {
    std::string line = lines[at + 3 + r];  // title, header, rule, then rows
    std::vector<std::string> cells;
    // std::regex is avoided in these tests: GCC 12 warns inside it under ASan.
    size_t pos = line.find_first_not_of(' ');
    while (pos != std::string::npos) {
      size_t gap = line.find("  ", pos);
      cells.push_back(line.substr(pos, gap == std::string::npos ? std::string::npos : gap - pos));
      pos = gap == std::string::npos ? gap : line.find_first_not_of(' ', gap);
    }
    rows.push_back(cells);
  }
  return rows;
}

// HTML cells of the table with this id, in document order.
std::vector<std::string> html_cells(const std::string& html, const std::string& table_id) {
  size_t start = html.find("data-table-id=\"" + table_id + "\"");
  size_t end = html.find("</section>", start);
  std::string section = html.substr(start, end - start);
  std::vector<std::string> cells;
  for (size_t at = section.find("<td"); at != std::string::npos; at = section.find("<td", at + 1)) {
    size_t open_end = section.find('>', at) + 1;
    cells.push_back(unescape_html(section.substr(open_end, section.find("</td>", at) - open_end)));
  }
  return cells;
}

Value value_from_json(const nlohmann::json& json) {
  if (json.is_number_integer()) return Value{json.get<int64_t>()};
  if (json.is_number_float()) return Value{json.get<double>()};
  if (json.is_boolean()) return Value{json.get<bool>()};
  if (json.is_string()) return Value{json.get<std::string>()};
  return Value{};
}

bool is_shown_as_null(const Value& value) {
  if (std::holds_alternative<std::monostate>(value)) return true;
  return std::holds_alternative<double>(value) && !std::isfinite(std::get<double>(value));
}

TEST(Consistency, TableCellsShowTheSameDigitsInTerminalHtmlAndJson) {
  Report report = consistency_report();
  std::string terminal = render_terminal(report, TerminalOptions{});
  std::string html = render_html(report);
  nlohmann::json json = nlohmann::json::parse(render_json(report).dump());
  size_t compared = 0;
  for (size_t t = 0; t < report.tables.size(); ++t) {
    const Table& table = report.tables[t];
    auto rows = terminal_rows(terminal, table);
    auto cells = html_cells(html, table.id);
    ASSERT_EQ(rows.size(), table.rows.size()) << table.id;
    ASSERT_EQ(cells.size(), table.rows.size() * table.columns.size()) << table.id;
    for (size_t r = 0; r < table.rows.size(); ++r) {
      ASSERT_EQ(rows[r].size(), table.columns.size()) << table.id << " row " << r;
      for (size_t c = 0; c < table.columns.size(); ++c) {
        const Column& column = table.columns[c];
        std::string expected = format_value(table.rows[r][c], column);
        EXPECT_EQ(rows[r][c], expected) << table.id << " terminal " << r << "," << c;
        EXPECT_EQ(cells[r * table.columns.size() + c], expected)
            << table.id << " html " << r << "," << c;
        const nlohmann::json& cell = json["tables"][t]["rows"][r][column.key];
        if (cell.is_null()) {
          EXPECT_TRUE(is_shown_as_null(table.rows[r][c])) << table.id << " " << r << "," << c;
        } else {
          EXPECT_EQ(format_value(value_from_json(cell), column), expected)
              << table.id << " json " << r << "," << c;
        }
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 4u * 5 + 18 * 7);
  // Spot checks that the rules are the documented ones, not just self-consistent.
  EXPECT_NE(terminal.find("9,223,372,036,854,775,807"), std::string::npos);
  EXPECT_NE(terminal.find("-9,223,372,036,854,775,808"), std::string::npos);
  EXPECT_NE(html.find(">9223372036854775807<"), std::string::npos) << "group_digits = false";
  EXPECT_EQ(json["tables"][1]["rows"][7]["count"].get<int64_t>(),
            std::numeric_limits<int64_t>::max());
}

TEST(Consistency, FactsShowTheSameTextInTerminalHtmlAndJson) {
  Report report = consistency_report();
  std::string terminal = render_terminal(report, TerminalOptions{});
  std::string html = render_html(report);
  nlohmann::json json = nlohmann::json::parse(render_json(report).dump());
  for (const Fact& fact : report.facts) {
    std::string expected = format_fact(fact);
    size_t line = terminal.find("\n  " + fact.label + ":");
    ASSERT_NE(line, std::string::npos) << fact.label;
    size_t value = terminal.find_first_not_of(' ', line + 4 + fact.label.size());
    EXPECT_EQ(terminal.substr(value, terminal.find('\n', value) - value), expected);
    size_t row = html.find("<tr data-fact=\"" + fact.key + "\"><th>");
    ASSERT_NE(row, std::string::npos) << fact.key;
    size_t cell = html.find("<td>", row) + 4;
    EXPECT_EQ(unescape_html(html.substr(cell, html.find("</td>", cell) - cell)), expected);
    Fact from_json = fact;
    from_json.value = value_from_json(json["facts"][fact.key]);
    if (!json["facts"][fact.key].is_null()) {
      EXPECT_EQ(format_fact(from_json), expected) << fact.key;
    }
  }
  EXPECT_NE(terminal.find("One third:             0.3333 GiB"), std::string::npos) << terminal;
  EXPECT_NE(terminal.find("Port:                  30000\n"), std::string::npos);
}

TEST(Consistency, ChartValuesInHtmlRoundTripTheJsonNumbers) {
  Report report = consistency_report();
  std::string html = render_html(report);
  nlohmann::json json = render_json(report);
  // Each mark's data-y is the exact double (shortest round-trip form), so a script
  // reading the HTML gets the JSON's numbers.
  size_t compared = 0;
  for (const auto& chart : json["charts"]) {
    std::string id = chart["id"];
    size_t start = html.find("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"kv-chart");
    while (start != std::string::npos &&
           html.compare(html.find("data-chart-id=", start), 16 + id.size(),
                        "data-chart-id=\"" + id + "\"") != 0) {
      start = html.find("<svg xmlns", start + 1);
    }
    ASSERT_NE(start, std::string::npos) << id;
    std::string svg = html.substr(start, html.find("</svg>", start) - start);
    std::vector<double> shown;
    for (size_t at = svg.find("data-y=\""); at != std::string::npos;
         at = svg.find("data-y=\"", at + 1)) {
      shown.push_back(std::stod(svg.substr(at + 8, svg.find('"', at + 8) - at - 8)));
    }
    for (const auto& series : chart["series"]) {
      for (const auto& y : series["y"]) {
        if (y.is_null()) continue;
        double value = y.get<double>();
        EXPECT_NE(std::find(shown.begin(), shown.end(), value), shown.end()) << id << " " << value;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 50u);
}

}  // namespace
}  // namespace kvaudit::report
