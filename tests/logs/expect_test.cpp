// logs --expect max_total_tokens: N, >=N and LO..HI on the motivating journal's launches, and
// malformed values as one-line input errors.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/registry.h"
#include "logs/logs.h"
#include "util/util.h"

namespace kvaudit::logs {
namespace {

bool met(const Launch& launch, const std::string& text) {
  return check_expectations(kvaudit::testing::registry(), launch, {parse_expectation(text)})
      .front()
      .met;
}

TEST(Expect, MaxTotalTokensExactAtLeastAndRange) {
  const auto journal = std::filesystem::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" /
                       "journal_qwen35_fp8_then_bf16.log";
  const LogScan scan = scan_log_file(kvaudit::testing::registry(), journal.string());
  ASSERT_EQ(scan.launches.size(), 2u);
  const Launch& bf16 = scan.launches[1];  // printed 1,573,854
  EXPECT_TRUE(met(bf16, "max_total_tokens=1573854"));
  EXPECT_TRUE(met(bf16, "max_total_tokens=>=1500000"));
  EXPECT_TRUE(met(bf16, "max_total_tokens=1573227..1574066"));
  EXPECT_FALSE(met(bf16, "max_total_tokens=1573855..1574066"));
  EXPECT_FALSE(met(scan.launches[0], "max_total_tokens=1573227..1574066"));  // 3,147,708
  for (const char* bad : {"max_total_tokens=5..3", "max_total_tokens=..9", "max_total_tokens=1..",
                          "max_total_tokens=>=1..2", "max_total_tokens=many"})
    EXPECT_THROW(met(bf16, bad), InputError) << bad;
}

}  // namespace
}  // namespace kvaudit::logs
