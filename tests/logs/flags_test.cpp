// plan --from-log with flags: a flag fills what the log does not print and is checked
// against what it does; the ranks seen bound TP from below and TP0 alone says nothing.
// On real logs from the corpus (tests/fixtures/logs/real) and the journal fixture.
#include <gtest/gtest.h>

#include "../plan/plan_models.h"
#include "common/registry.h"
#include "logs/logs.h"

namespace kvaudit::logs {
namespace {

std::string real_log(const char* name) {
  return std::string(KVAUDIT_TEST_DIR) + "/fixtures/logs/real/" + name;
}

const Launch last_launch(const std::string& path) {
  LogScan scan = scan_log_file(kvaudit::testing::registry(), path);
  EXPECT_FALSE(scan.launches.empty()) << path;
  return scan.launches.back();
}

bool has(const plan::LogSetup& setup, const std::string& id) {
  for (const auto& f : setup.findings)
    if (f.id == id) return true;
  return false;
}

std::string joined_notes(const plan::LogSetup& setup) {
  std::string out;
  for (const auto& n : setup.notes) out += n + "\n";
  return out;
}

TEST(FromLogFlags, TpFlagFillsALogThatDoesNotPrintIt) {
  // TP0 to TP7 printed lines, no server_args in the excerpt.
  const Launch l = last_launch(real_log("sglang/tp8-h200-piecewise-2025-10-16.log"));
  ASSERT_EQ(l.tp, 0);
  ASSERT_EQ(l.tp_at_least, 8);
  plan::LogFlagOverrides given;
  given.tp = 8;
  plan::LogSetup setup =
      plan::reconcile_log_flags(kvaudit::testing::registry(), l.memory, plan::PlanOptions{}, given);
  EXPECT_EQ(setup.options.parallel.tp, 8);
  EXPECT_TRUE(setup.findings.empty());
  EXPECT_NE(joined_notes(setup).find("--tp 8 from the command line"), std::string::npos);
  // A flag below the ranks seen contradicts the log.
  given.tp = 4;
  setup =
      plan::reconcile_log_flags(kvaudit::testing::registry(), l.memory, plan::PlanOptions{}, given);
  EXPECT_TRUE(has(setup, "log-flag-conflict"));
  EXPECT_EQ(setup.options.parallel.tp, 8);
  // No flag: the ranks seen, said so.
  setup =
      plan::reconcile_log_flags(kvaudit::testing::registry(), l.memory, plan::PlanOptions{}, {});
  EXPECT_EQ(setup.options.parallel.tp, 8);
  EXPECT_TRUE(has(setup, "log-tp-from-ranks"));
}

TEST(FromLogFlags, Tp0AloneSaysNothingAndAFlagDecides) {
  const Launch l =
      last_launch(real_log("sglang/qwen2.5-7b-rtx5090-blackwell-crash-2025-04-13.log"));
  EXPECT_EQ(l.tp, 0);
  EXPECT_EQ(l.tp_at_least, 0);  // only TP0 printed
  plan::LogSetup alone =
      plan::reconcile_log_flags(kvaudit::testing::registry(), l.memory, plan::PlanOptions{}, {});
  EXPECT_EQ(alone.options.parallel.tp, 1);
  EXPECT_NE(joined_notes(alone).find("no rank beyond TP0"), std::string::npos);
  plan::LogFlagOverrides given;
  given.tp = 2;
  EXPECT_EQ(
      plan::reconcile_log_flags(kvaudit::testing::registry(), l.memory, plan::PlanOptions{}, given)
          .options.parallel.tp,
      2);
}

TEST(FromLogFlags, APrintedValueWinsOverAFlagThatDisagrees) {
  // The journal's server_args print tp_size=8, mem_fraction_static=0.8, kv_cache_dtype auto
  // (resolved bf16 in the second launch).
  LogScan scan = scan_log_file(
      kvaudit::testing::registry(),
      std::string(KVAUDIT_TEST_DIR) + "/fixtures/logs/journal_qwen35_fp8_then_bf16.log");
  const Launch& l = scan.launches.back();
  plan::LogFlagOverrides given;
  given.tp = 4;
  given.memory_fraction = 0.9;
  given.kv_cache_dtype = "fp8_e4m3";
  plan::LogSetup setup =
      plan::reconcile_log_flags(kvaudit::testing::registry(), l.memory, plan::PlanOptions{}, given);
  int conflicts = 0;
  for (const auto& f : setup.findings) conflicts += f.id == "log-flag-conflict";
  EXPECT_EQ(conflicts, 3);
  EXPECT_EQ(setup.options.parallel.tp, 8);
  EXPECT_EQ(setup.memory.kv_cache_dtype, "bf16");
  // The prediction runs on the log's values and carries the conflicts.
  plan::LogPrediction p =
      plan::predict_from_log(kvaudit::testing::registry(), plan::test_models::qwen35_397b(), setup);
  EXPECT_EQ(p.findings.size(), setup.findings.size());
  for (const auto& c : p.checks) EXPECT_TRUE(c.inside) << c.id << " " << c.derivation;
}

TEST(FromLogFlags, DpAttentionFlagsCompleteALogWithoutServerArgs) {
  // DP0 TP0 .. DP7 TP7 printed lines; the launch used --tp 8 --dp 8 --enable-dp-attention.
  const Launch l = last_launch(real_log("sglang/deepseek-r1-dp8-mi300x-rocm-0.4.8.post1.log"));
  EXPECT_EQ(l.tp_at_least, 8);
  plan::LogFlagOverrides given;
  given.tp = 8, given.dp = 8, given.dp_attention = true;
  plan::LogSetup setup =
      plan::reconcile_log_flags(kvaudit::testing::registry(), l.memory, plan::PlanOptions{}, given);
  EXPECT_TRUE(setup.findings.empty());
  EXPECT_EQ(setup.options.parallel.tp, 8);
  EXPECT_EQ(setup.options.parallel.dp, 8);
  EXPECT_TRUE(setup.options.parallel.dp_attention);
  EXPECT_EQ(setup.options.parallel.attention_tp(), 1);
}

}  // namespace
}  // namespace kvaudit::logs
