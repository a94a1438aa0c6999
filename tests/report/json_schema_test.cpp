// The JSON schema test: docs/json-schema.md is parsed (its "## Object: NAME"
// tables give every key and type) and real render_json output is validated
// against it, in both directions: every documented key present with its type,
// and no undocumented key except the command's payload. Plus the value rules:
// integers stay integers, non-finite doubles become null, payload collisions throw.
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/schema_doc.h"
#include "report/report.h"
#include "sample_report.h"

namespace kvaudit::report {
namespace {

using Schema = kvaudit::testing::SchemaTables;

Schema load_documented_schema() {
  return kvaudit::testing::load_schema_tables("## Object: ");
}

// The report object with the command's payload keys allowed at the top.
class Validator {
 public:
  explicit Validator(Schema schema) : schema_(std::move(schema)) {}
  std::vector<std::string> validate_report(const nlohmann::json& json,
                                           const std::set<std::string>& allowed_extra) {
    kvaudit::testing::SchemaValidator validator(schema_);
    validator.validate(json, "report", "$", allowed_extra);
    return validator.problems;
  }

 private:
  Schema schema_;
};

std::string join(const std::vector<std::string>& problems) {
  std::string text;
  for (const std::string& problem : problems) text += problem + "\n";
  return text;
}

TEST(JsonSchema, DocumentDescribesEveryObject) {
  Schema schema = load_documented_schema();
  for (const char* object :
       {"report", "table", "column", "chart", "series", "finding", "evidence"}) {
    ASSERT_EQ(schema.count(object), 1u) << object;
    EXPECT_GE(schema[object].size(), 2u) << object;
  }
  EXPECT_EQ(schema["report"].front(),
            (std::pair<std::string, std::string>{"schema_version", "integer"}));
}

TEST(JsonSchema, SampleReportMatchesTheDocument) {
  Validator validator(load_documented_schema());
  Report report = testing::sample_report();
  // Through text and back, as a consumer sees it.
  nlohmann::json json = nlohmann::json::parse(render_json(report).dump());
  EXPECT_EQ(json["schema_version"], kSchemaVersion);
  auto problems = validator.validate_report(json, {"engine", "resolved_kv"});
  EXPECT_TRUE(problems.empty()) << join(problems);
  EXPECT_EQ(json["tables"][0]["rows"].size(), report.tables[0].rows.size());
  EXPECT_EQ(json["charts"].size(), report.charts.size());
  EXPECT_EQ(json["findings"][1]["severity"], "warning");
  EXPECT_EQ(json["findings"][0]["evidence"][1]["key"], "*.k_scale");
}

TEST(JsonSchema, EmptyAndMinimalReportsMatchTheDocument) {
  Validator validator(load_documented_schema());
  Report empty;
  auto problems = validator.validate_report(render_json(empty), {});
  EXPECT_TRUE(problems.empty()) << join(problems);
  Report minimal;
  minimal.command = "plan";
  minimal.verdict = "fits";
  minimal.facts = {{"nothing", "Nothing", Value{}, ""}, {"flag", "Flag", Value{true}, ""}};
  Table table;
  table.id = "t";
  table.columns = {{"a", "A", ""}};
  minimal.tables.push_back(table);  // a table with no rows
  problems = validator.validate_report(render_json(minimal), {});
  EXPECT_TRUE(problems.empty()) << join(problems);
}

TEST(JsonSchema, ValidatorRejectsWrongTypesAndUndocumentedKeys) {
  // The validator itself must be able to fail, or the schema test proves nothing.
  Validator validator(load_documented_schema());
  nlohmann::json json = render_json(testing::sample_report());
  json["tables"][0]["rows"][0]["max_tokens"] = nlohmann::json::array();
  json["charts"][0]["kind"] = "pie";
  json["findings"][0].erase("fix");
  json["surprise"] = 1;
  auto problems = validator.validate_report(json, {"engine", "resolved_kv"});
  std::string text = join(problems);
  EXPECT_NE(text.find("$.tables[0].rows[0].max_tokens: expected a scalar value"), std::string::npos)
      << text;
  EXPECT_NE(text.find("$.charts[0].kind: expected a chart kind"), std::string::npos) << text;
  EXPECT_NE(text.find("$.findings[0]: missing documented key 'fix'"), std::string::npos) << text;
  EXPECT_NE(text.find("$: key 'surprise' is not documented"), std::string::npos) << text;
}

TEST(JsonValues, IntegersStayIntegersAndNonFiniteBecomesNull) {
  nlohmann::json json = nlohmann::json::parse(render_json(testing::sample_report()).dump());
  const auto& rows = json["tables"][0]["rows"];
  EXPECT_TRUE(rows[1]["max_tokens"].is_number_integer());
  EXPECT_EQ(rows[1]["max_tokens"].get<int64_t>(), 1234567);
  EXPECT_EQ(rows[3]["max_tokens"].get<int64_t>(), -1);
  EXPECT_TRUE(rows[0]["pool_gib"].is_number_float());
  EXPECT_TRUE(rows[2]["rel_error"].is_null()) << "NaN becomes null";
  EXPECT_TRUE(rows[3]["cell_bytes_per_token"].is_null()) << "empty cell becomes null";
  EXPECT_EQ(json["facts"]["max_total_tokens"].get<int64_t>(), 1234567);
  EXPECT_EQ(json["facts"]["scales_present"], false);
  EXPECT_TRUE(json["charts"][2]["series"][2]["y"][2].is_null());
  Report report;
  report.facts = {{"big", "Big", Value{int64_t{9007199254740993}}, ""},
                  {"inf", "Inf", Value{std::numeric_limits<double>::infinity()}, ""}};
  report.payload = {{"ratio", std::nan("")},
                    {"list", {1.5, -std::numeric_limits<double>::infinity()}}};
  nlohmann::json round_trip = nlohmann::json::parse(render_json(report).dump());
  EXPECT_EQ(round_trip["facts"]["big"].get<int64_t>(), 9007199254740993) << "beyond 2^53, exact";
  EXPECT_TRUE(round_trip["facts"]["inf"].is_null());
  EXPECT_TRUE(round_trip["ratio"].is_null());
  EXPECT_EQ(round_trip["list"], nlohmann::json::parse("[1.5, null]"));
}

TEST(JsonPayload, MergedAtTopLevel) {
  nlohmann::json json = render_json(testing::sample_report());
  EXPECT_EQ(json["engine"]["name"], "sglang");
  EXPECT_EQ(json["resolved_kv"]["scale_source"], "default_1.0");
}

TEST(JsonPayload, CollisionWithASchemaKeyIsRefused) {
  Report report = testing::sample_report();
  for (const char* key : {"schema_version", "command", "title", "verdict", "verdict_severity",
                          "facts", "tables", "charts", "findings", "notes"}) {
    report.payload = {{key, "overwritten"}};
    EXPECT_THROW(render_json(report), std::logic_error) << key;
  }
  report.payload = nlohmann::json::array({1, 2});
  EXPECT_THROW(render_json(report), std::logic_error);
  report.payload = nullptr;
  EXPECT_NO_THROW(render_json(report));
}

TEST(JsonShape, MalformedReportsAreRefused) {
  Report report = testing::sample_report();
  report.tables[0].rows[0].pop_back();
  EXPECT_THROW(render_json(report), std::logic_error);
  report = testing::sample_report();
  report.facts.push_back(report.facts.front());
  EXPECT_THROW(render_json(report), std::logic_error);
  report = testing::sample_report();
  report.charts[1].series[0].y.push_back(1.0);
  EXPECT_THROW(render_json(report), std::logic_error);
  report = testing::sample_report();
  report.tables[0].columns[1].key = report.tables[0].columns[0].key;
  EXPECT_THROW(render_json(report), std::logic_error);
}

TEST(JsonStrings, InvalidUtf8IsReplacedSoDumpNeverThrows) {
  Report report;
  report.title = "log line \xFF\xFE end";
  report.findings.push_back(
      Finding{"id", Severity::warning, "t", "", {{"f\xC3", "k", "v\x80"}}, "", ""});
  report.payload = {{"raw", std::string("bad \xE2\x82")}};
  nlohmann::json json = render_json(report);
  std::string text;
  ASSERT_NO_THROW(text = json.dump());
  nlohmann::json back = nlohmann::json::parse(text);
  EXPECT_EQ(back["title"], "log line \xEF\xBF\xBD\xEF\xBF\xBD end");
  EXPECT_EQ(back["findings"][0]["evidence"][0]["file"], "f\xEF\xBF\xBD");
  EXPECT_EQ(back["raw"], "bad \xEF\xBF\xBD");  // a truncated sequence is one maximal subpart
}

}  // namespace
}  // namespace kvaudit::report
