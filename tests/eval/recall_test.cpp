// The recall-probe text generator: deterministic, honours ctx and depth, and the control
// case differs from the real one only in the target definition.
#include <gtest/gtest.h>

#include <sstream>

#include "eval/eval.h"
#include "util/util.h"

namespace kvaudit::eval {
namespace {

// Stand-in tokenizer for generator tests: one token per 4 bytes, rounded up.
int64_t approx_tokens(std::string_view text) {
  return static_cast<int64_t>((text.size() + 3) / 4);
}

TEST(RecallGenerator, DeterministicAndSeeded) {
  RecallCaseOptions options{512, 200, 42, false};
  RecallCase a = make_recall_case(options, approx_tokens);
  RecallCase b = make_recall_case(options, approx_tokens);
  EXPECT_EQ(a.prompt, b.prompt);
  EXPECT_EQ(a.expected, b.expected);
  options.seed = 43;
  RecallCase c = make_recall_case(options, approx_tokens);
  EXPECT_NE(a.prompt, c.prompt);
}

TEST(RecallGenerator, PromptEndsInTheCallAndDefinitionIsAtDepth) {
  for (int64_t depth : {16, 100, 400}) {
    RecallCaseOptions options{512, depth, 7, false};
    RecallCase r = make_recall_case(options, approx_tokens);
    const std::string call = r.function_name + "(";
    ASSERT_GE(r.prompt.size(), call.size());
    EXPECT_EQ(r.prompt.substr(r.prompt.size() - call.size()), call);
    EXPECT_EQ(r.expected.back(), ')');
    // The definition "def NAME(ARGS" appears exactly once, before the call.
    const std::string definition = "def " + call + r.expected.substr(0, r.expected.size() - 1);
    size_t at = r.prompt.find(definition);
    ASSERT_NE(at, std::string::npos) << r.prompt;
    EXPECT_EQ(r.prompt.find(definition, at + 1), std::string::npos);
    EXPECT_GE(r.depth_tokens, depth);
    EXPECT_LE(r.depth_tokens, depth + 60);  // overshoots by at most one filler function
    EXPECT_LE(r.prompt_tokens, 512 + 2);    // counted piecewise, measured whole
    EXPECT_GT(r.prompt_tokens, 512 - 80);   // filled up to within one filler
  }
}

TEST(RecallGenerator, ControlHidesTheSignature) {
  RecallCaseOptions options{400, 150, 9, false};
  RecallCase real = make_recall_case(options, approx_tokens);
  options.control = true;
  RecallCase control = make_recall_case(options, approx_tokens);
  EXPECT_EQ(real.expected, control.expected);
  EXPECT_EQ(real.function_name, control.function_name);
  const std::string definition = "def " + real.function_name + "(";
  EXPECT_NE(real.prompt.find(definition), std::string::npos);
  EXPECT_EQ(control.prompt.find(definition), std::string::npos);
}

TEST(RecallGenerator, RejectsImpossibleGrid) {
  EXPECT_THROW(make_recall_case({256, 256, 1, false}, approx_tokens), InputError);
  EXPECT_THROW(make_recall_case({256, 0, 1, false}, approx_tokens), InputError);
  EXPECT_THROW(make_recall_case({64, 60, 1, false}, approx_tokens), InputError);
}

}  // namespace
}  // namespace kvaudit::eval
