// Terminal rendering: value formatting, display widths, aligned tables with wide
// text, colour rules, --quiet, and safety against escape sequences in the data.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "report/report.h"
#include "sample_report.h"
#include "util/util.h"

namespace kvaudit::report {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

TEST(FormatValue, IntegersAreExactAndGrouped) {
  Column column;
  EXPECT_EQ(format_value(Value{int64_t{1234567}}, column), "1,234,567");
  EXPECT_EQ(format_value(Value{int64_t{-1000}}, column), "-1,000");
  EXPECT_EQ(format_value(Value{int64_t{999}}, column), "999");
  EXPECT_EQ(format_value(Value{int64_t{9007199254740993}}, column), "9,007,199,254,740,993");
  column.group_digits = false;
  EXPECT_EQ(format_value(Value{int64_t{30000}}, column), "30000");
}

TEST(FormatValue, DoublesUsePrecisionAndKeepSmallValuesReadable) {
  Column column;  // precision 3
  EXPECT_EQ(format_value(Value{71.25}, column), "71.250");
  EXPECT_EQ(format_value(Value{123456.789}, column), "123,456.789");
  EXPECT_EQ(format_value(Value{0.5}, column), "0.500");
  EXPECT_EQ(format_value(Value{0.00123456}, column), "0.00123");
  EXPECT_EQ(format_value(Value{-0.0421}, column), "-0.0421");
  EXPECT_EQ(format_value(Value{1.5e-9}, column), "1.50e-09");
  EXPECT_EQ(format_value(Value{0.0}, column), "0.000");
  EXPECT_EQ(format_value(Value{-0.0}, column), "0.000");
  EXPECT_EQ(format_value(Value{std::numeric_limits<double>::quiet_NaN()}, column), "NaN");
  EXPECT_EQ(format_value(Value{std::numeric_limits<double>::infinity()}, column), "inf");
  EXPECT_EQ(format_value(Value{-std::numeric_limits<double>::infinity()}, column), "-inf");
  column.precision = 0;
  EXPECT_EQ(format_value(Value{2194785.4}, column), "2,194,785");
  column.precision = 1;
  column.group_digits = false;
  EXPECT_EQ(format_value(Value{12345.67}, column), "12345.7");
}

TEST(FormatValue, OtherKinds) {
  Column column;
  EXPECT_EQ(format_value(Value{}, column), "-");
  EXPECT_EQ(format_value(Value{true}, column), "yes");
  EXPECT_EQ(format_value(Value{false}, column), "no");
  EXPECT_EQ(format_value(Value{std::string("fp8_e4m3")}, column), "fp8_e4m3");
  Fact fact{"pool", "Pool", Value{71.25}, "GiB"};
  EXPECT_EQ(format_fact(fact), "71.250 GiB");
  fact.unit = "%";
  fact.value = Value{12.5};
  fact.precision = 1;
  EXPECT_EQ(format_fact(fact), "12.5%");
  fact.value = Value{};
  EXPECT_EQ(format_fact(fact), "-");
  EXPECT_EQ(severity_name(Severity::info), "info");
  EXPECT_EQ(severity_name(Severity::warning), "warning");
  EXPECT_EQ(severity_name(Severity::critical), "critical");
}

TEST(DisplayWidth, CountsTerminalColumns) {
  EXPECT_EQ(display_width(""), 0u);
  EXPECT_EQ(display_width("abc"), 3u);
  EXPECT_EQ(display_width("未校准"), 6u);                    // East Asian wide
  EXPECT_EQ(display_width("e\xCC\x81"), 1u);                 // e + combining acute
  EXPECT_EQ(display_width("\xF0\x9F\x99\x82"), 2u);          // 🙂
  EXPECT_EQ(display_width("\xE2\x9A\xA0\xEF\xB8\x8F"), 2u);  // ⚠️ (VS16)
  EXPECT_EQ(display_width("\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D"
                          "\xF0\x9F\x91\xA7"),
            2u);  // family ZWJ sequence
  EXPECT_EQ(display_width("a\xFF"
                          "b"),
            3u);  // invalid byte shows as one U+FFFD
}

TEST(Utf8, InvalidSequencesAreReplaced) {
  EXPECT_EQ(to_valid_utf8("ok"), "ok");
  EXPECT_EQ(to_valid_utf8("a\xFF"
                          "b"),
            "a\xEF\xBF\xBD"
            "b");
  // A truncated sequence is one maximal ill-formed subpart: one U+FFFD (the report's own
  // repair used to write one per byte; the tokenizer's, now the only one, follows Unicode).
  EXPECT_EQ(to_valid_utf8("\xE2\x82"), "\xEF\xBF\xBD");
  EXPECT_EQ(to_valid_utf8("未"), "未");
}

TEST(Terminal, QuietPrintsOnlyTheVerdictLine) {
  Report report = testing::sample_report();
  TerminalOptions options;
  options.quiet = true;
  EXPECT_EQ(render_terminal(report, options), "Verdict [critical]: " + report.verdict + "\n");
}

TEST(Terminal, VerdictIsTheLastLineAndSectionsAreInOrder) {
  Report report = testing::sample_report();
  std::string text = render_terminal(report, TerminalOptions{});
  auto lines = lines_of(text);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), "Verdict [critical]: " + report.verdict);
  EXPECT_EQ(lines.front(), report.title);
  size_t critical = text.find("CRITICAL (1)"), warning = text.find("WARNING (1)"),
         info = text.find("INFO (1)"), note = text.find("Note: Capacity assumes");
  ASSERT_NE(critical, std::string::npos);
  ASSERT_NE(warning, std::string::npos);
  ASSERT_NE(info, std::string::npos);
  ASSERT_NE(note, std::string::npos);
  EXPECT_LT(critical, warning);
  EXPECT_LT(warning, info);
  EXPECT_LT(info, note);
  EXPECT_NE(text.find("Evidence:    hf_quant_config.json: quantization.kv_cache_quant_algo = FP8"),
            std::string::npos);
  EXPECT_NE(text.find("Fix:         --mem-fraction-static 0.88"), std::string::npos);
  EXPECT_NE(text.find("[fp8-unit-scale]"), std::string::npos);
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << "no colour unless asked";
}

TEST(Terminal, FactsAreAlignedLabelValueUnitLines) {
  std::string text = render_terminal(testing::sample_report(), TerminalOptions{});
  EXPECT_NE(text.find("  KV capacity:           1,234,567 tokens\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  KV pool:               71.250 GiB\n"), std::string::npos);
  EXPECT_NE(text.find("  Scale tensors shipped: no\n"), std::string::npos);
  EXPECT_NE(text.find("  Keys clipped:          0.0123%\n"), std::string::npos);
}

TEST(Terminal, TableColumnsAlignWithWideTextAndEmoji) {
  Report report = testing::sample_report();
  std::string text = render_terminal(report, TerminalOptions{});
  auto lines = lines_of(text);
  size_t title_at = 0;
  while (title_at < lines.size() && lines[title_at] != "Capacity by KV dtype") ++title_at;
  ASSERT_LT(title_at + 6, lines.size());
  // Header, rule and four rows; the last column is numeric (right-aligned), so
  // every line ends in the same display column, and each column starts in the
  // same display column as its rule.
  std::vector<std::string> block(lines.begin() + title_at + 1, lines.begin() + title_at + 7);
  size_t width = display_width(block[1]);
  for (const std::string& line : block) EXPECT_EQ(display_width(line), width) << line;
  EXPECT_NE(block[4].find("nvfp4 \xE2\x9A\xA0\xEF\xB8\x8F"), std::string::npos);
  EXPECT_NE(block[5].find("int4 (未校准)"), std::string::npos);
  // The rule line separates columns with exactly two blanks: each cell ends where
  // its rule segment ends.
  size_t first_rule_end = block[1].find("  ", 2);
  ASSERT_NE(first_rule_end, std::string::npos);
  size_t first_column_width = display_width(block[1].substr(0, first_rule_end));
  for (size_t row = 2; row < block.size(); ++row) {
    // Find the byte offset where the display width reaches first_column_width.
    std::string prefix;
    size_t at = 0;
    while (at < block[row].size() && display_width(prefix) < first_column_width) {
      prefix += block[row][at++];
    }
    while (at < block[row].size() && (static_cast<unsigned char>(block[row][at]) & 0xC0) == 0x80) {
      prefix += block[row][at++];
    }
    // Pull in zero-width trailing code points (VS16) of the last cluster.
    if (block[row].compare(at, 3, "\xEF\xB8\x8F") == 0) at += 3;
    EXPECT_EQ(block[row].substr(at, 2), "  ") << block[row];
  }
  EXPECT_EQ(lines[title_at + 7], "  Pool = free GPU memory after weights x mem_fraction_static.");
}

TEST(Terminal, ColourOnlyWhenAsked) {
  Report report = testing::sample_report();
  TerminalOptions options;
  options.color = true;
  std::string text = render_terminal(report, options);
  EXPECT_NE(text.find("\x1b[1;31mCRITICAL (1)\x1b[0m"), std::string::npos);
  EXPECT_NE(text.find("\x1b[1;33mWARNING (1)\x1b[0m"), std::string::npos);
  EXPECT_NE(text.find("\x1b[1;31mVerdict [critical]"), std::string::npos);
  report.verdict_severity = Severity::info;
  options.quiet = true;
  EXPECT_EQ(render_terminal(report, options),
            "\x1b[1;32mVerdict [info]: " + report.verdict + "\x1b[0m\n");
}

TEST(Terminal, EscapeSequencesFromDataAreShownNotObeyed) {
  Report report;
  report.title = "log says \x1b[2J\x1b]0;pwned\x07 done";
  report.verdict = "ok\r\nforged line";
  Finding finding;
  finding.title =
      "bad \xC2\x9B"
      "31m c1 control";
  finding.evidence = {{"server.log", "line", "\x1b[31mred\x1b[0m"}};
  report.findings.push_back(finding);
  std::string text = render_terminal(report, TerminalOptions{});
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  EXPECT_EQ(text.find('\x07'), std::string::npos);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find("\xC2\x9B"), std::string::npos);
  EXPECT_NE(text.find("log says \\x1b[2J\\x1b]0;pwned\\x07 done"), std::string::npos);
  EXPECT_NE(text.find("Verdict [info]: ok\\x0d\\x0aforged line"), std::string::npos);
  EXPECT_NE(text.find("bad \\x9b31m c1 control"), std::string::npos);
}

TEST(Terminal, LongTextWrapsAtTheWidth) {
  Report report;
  Finding finding;
  finding.severity = Severity::warning;
  finding.title = "short";
  for (int i = 0; i < 40; ++i) finding.consequence += "word" + std::to_string(i) + " ";
  report.findings.push_back(finding);
  TerminalOptions options;
  options.width = 60;
  auto lines = lines_of(render_terminal(report, options));
  int wrapped = 0;
  std::string continuation(18, ' ');
  continuation += "word";
  for (const std::string& line : lines) {
    EXPECT_LE(display_width(line), 60u) << line;
    if (line.rfind(continuation, 0) == 0) ++wrapped;
  }
  EXPECT_GE(wrapped, 3) << "continuation lines are indented under the value";
}

// stdout_wants_color looks at the real stdout, so point stdout at a pseudo
// terminal for the duration of the check.
TEST(Terminal, StdoutWantsColorOnATtyUnlessNoColor) {
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(slave, 0);
  fflush(stdout);
  int saved_stdout = dup(STDOUT_FILENO);
  const char* saved_no_color = std::getenv("NO_COLOR");
  std::string saved_value = saved_no_color ? saved_no_color : "";
  const char* saved_term = std::getenv("TERM");
  std::string saved_term_value = saved_term ? saved_term : "";
  setenv("TERM", "xterm-256color", 1);
  dup2(slave, STDOUT_FILENO);
  unsetenv("NO_COLOR");
  bool on_tty = stdout_wants_color();
  setenv("NO_COLOR", "1", 1);
  bool with_no_color = stdout_wants_color();
  setenv("NO_COLOR", "", 1);
  bool with_empty_no_color = stdout_wants_color();
  unsetenv("NO_COLOR");
  setenv("TERM", "dumb", 1);
  bool dumb = stdout_wants_color();
  dup2(saved_stdout, STDOUT_FILENO);
  close(saved_stdout);
  close(slave);
  close(master);
  if (saved_no_color)
    setenv("NO_COLOR", saved_value.c_str(), 1);
  else
    unsetenv("NO_COLOR");
  if (saved_term)
    setenv("TERM", saved_term_value.c_str(), 1);
  else
    unsetenv("TERM");
  EXPECT_TRUE(on_tty);
  EXPECT_FALSE(with_no_color);
  EXPECT_TRUE(with_empty_no_color);
  EXPECT_FALSE(dumb);
  // And a pipe is never a tty.
  int pipe_ends[2];
  ASSERT_EQ(pipe(pipe_ends), 0);
  saved_stdout = dup(STDOUT_FILENO);
  dup2(pipe_ends[1], STDOUT_FILENO);
  bool on_pipe = stdout_wants_color();
  dup2(saved_stdout, STDOUT_FILENO);
  close(saved_stdout);
  close(pipe_ends[0]);
  close(pipe_ends[1]);
  EXPECT_FALSE(on_pipe);
}

}  // namespace
}  // namespace kvaudit::report
