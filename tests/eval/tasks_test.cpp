// The long-context task generators (MRCR-style near-duplicate functions, tool calls with
// JSON arguments) and the tool-call answer check: deterministic, within the asked length,
// each answer present exactly once beside its near-duplicates, and the schema check telling
// invalid JSON, schema violations and wrong values apart.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "eval/eval.h"
#include "util/util.h"

namespace kvaudit::eval {
namespace {

int64_t bytes_over_four(std::string_view text) {
  return static_cast<int64_t>((text.size() + 3) / 4);
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(TaskGenerators, AreDeterministicPerSeedAndFitTheLength) {
  for (auto make : {make_mrcr_case, make_toolcall_case}) {
    TaskCase a = make({2048, 5, 4, 3}, bytes_over_four);
    TaskCase b = make({2048, 5, 4, 3}, bytes_over_four);
    TaskCase c = make({2048, 6, 4, 3}, bytes_over_four);
    EXPECT_EQ(round_prompt(a, 3), round_prompt(b, 3));
    EXPECT_NE(round_prompt(a, 3), round_prompt(c, 3));
    EXPECT_LE(a.prompt_tokens, 2048);
    EXPECT_GT(a.prompt_tokens, 2048 * 9 / 10) << "the context is filled";
    ASSERT_EQ(a.rounds.size(), 3u);
  }
}

TEST(TaskGenerators, MrcrAsksDistinctNearDuplicatesWhoseAnswersAppearOnce) {
  TaskCase task = make_mrcr_case({4096, 11, 4, 4}, bytes_over_four);
  ASSERT_EQ(task.rounds.size(), 4u);
  std::set<std::string> asked;
  for (size_t r = 0; r < task.rounds.size(); ++r) {
    const TaskRound& round = task.rounds[r];
    // "    first = STEM_vK(" -> "STEM_vK(" is defined once in the context.
    const std::string call = round.ask.substr(round.ask.find("= ") + 2);
    EXPECT_TRUE(asked.insert(call).second) << "each round asks another variant";
    EXPECT_EQ(
        count_of(task.context, "def " + call + round.expected.substr(0, round.expected.size() - 1)),
        1u);
    // Round r's prompt holds the earlier answers and ends in its ask.
    const std::string prompt = round_prompt(task, r);
    EXPECT_EQ(prompt.substr(prompt.size() - round.ask.size()), round.ask);
    for (size_t earlier = 0; earlier < r; ++earlier)
      EXPECT_NE(prompt.find(task.rounds[earlier].ask + task.rounds[earlier].expected + "\n"),
                std::string::npos);
  }
  // Near-duplicates: all variants share the stem and the parameters after the first.
  const std::string first_call = task.rounds[0].ask.substr(task.rounds[0].ask.find("= ") + 2);
  const std::string stem = first_call.substr(0, first_call.rfind("_v") + 2);
  EXPECT_EQ(count_of(task.context, "def " + stem), 4u);
  const std::string shared = task.rounds[0].expected.substr(task.rounds[0].expected.find(','));
  for (const TaskRound& round : task.rounds)
    EXPECT_EQ(round.expected.substr(round.expected.find(',')), shared);
}

TEST(TaskGenerators, ToolCallAnswersAreSchemaValidAndEachLoggedOnce) {
  TaskCase task = make_toolcall_case({4096, 3, 4, 3}, bytes_over_four);
  for (const TaskRound& round : task.rounds) {
    EXPECT_EQ(count_of(task.context, round.ask + round.expected + " -> timeout"), 1u);
    ToolCallCheck check = check_tool_call(task.schema, round.expected, round.expected + "\n");
    EXPECT_TRUE(check.exact) << check.problem;
  }
  // The other rounds' answers are valid but not this round's.
  ToolCallCheck other =
      check_tool_call(task.schema, task.rounds[0].expected, task.rounds[1].expected);
  EXPECT_TRUE(other.schema_valid);
  EXPECT_FALSE(other.exact);
  EXPECT_EQ(other.problem, "valid arguments, but not the ones the log holds");
}

TEST(ToolCallCheck, TellsInvalidJsonSchemaViolationsAndWrongValuesApart) {
  TaskCase task = make_toolcall_case({2048, 1, 3, 1}, bytes_over_four);
  const std::string& expected = task.rounds[0].expected;
  nlohmann::json args = nlohmann::json::parse(expected);
  EXPECT_EQ(check_tool_call(task.schema, expected, "sure! here it is").problem,
            "the answer does not start with a JSON object");
  EXPECT_EQ(check_tool_call(task.schema, expected, R"({"id":"A1234","region":"eu")").problem,
            "the JSON object is not closed");
  EXPECT_EQ(check_tool_call(task.schema, expected, R"({"id":A1234})").problem,
            "the arguments are not valid JSON");
  nlohmann::json bad_enum = args;
  bad_enum["region"] = "mars";
  ToolCallCheck enum_check = check_tool_call(task.schema, expected, bad_enum.dump());
  EXPECT_TRUE(enum_check.parsed);
  EXPECT_FALSE(enum_check.schema_valid);
  EXPECT_NE(enum_check.problem.find("schema"), std::string::npos) << enum_check.problem;
  nlohmann::json extra = args;
  extra["note"] = "x";
  EXPECT_FALSE(check_tool_call(task.schema, expected, extra.dump()).schema_valid);
  nlohmann::json wrong_type = args;
  wrong_type["limit"] = "25";
  EXPECT_FALSE(check_tool_call(task.schema, expected, wrong_type.dump()).schema_valid);
  // Trailing text after the object (a model keeps writing) does not matter; braces inside
  // strings do not end the object.
  EXPECT_TRUE(check_tool_call(task.schema, expected, " " + expected + "}\nnext line").exact);
  nlohmann::json brace = args;
  brace["label"] = "a}b{c";
  EXPECT_TRUE(check_tool_call(task.schema, brace.dump(), brace.dump()).exact);
}

TEST(TaskGenerators, RefuseALengthTheNeedlesDoNotFit) {
  EXPECT_THROW(make_mrcr_case({64, 1, 4, 3}, bytes_over_four), InputError);
  EXPECT_THROW(make_toolcall_case({64, 1, 4, 3}, bytes_over_four), InputError);
}

}  // namespace
}  // namespace kvaudit::eval
