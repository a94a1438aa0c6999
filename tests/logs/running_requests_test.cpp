// SGLang lowers max_running_requests and says so in one line: "capped to N by the mamba
// state cache (max_mamba_cache_size=M, S state slots per request)" (v0.5.19, sglang#38846) or
// "reduced from the requested R to N (per dp worker) due to the available KV cache
// capacity" (which on a hybrid may really be the state pool, sglang PR #32360). Both real
// lines are read, reported with the cap in effect, and their cause checked.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/registry.h"
#include "logs/logs.h"
#include "plan/plan.h"

namespace kvaudit::logs {
namespace {

std::filesystem::path real_sglang(const char* name) {
  return std::filesystem::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" / "real" / "sglang" / name;
}

const report::Finding* finding(const Launch& launch, const std::string& id) {
  for (const auto& f : launch.findings)
    if (f.id == id) return &f;
  return nullptr;
}

TEST(RunningRequests, CappedByTheStateCacheIsReadWithItsSlots) {
  const LogScan scan =
      scan_log_file(kvaudit::testing::registry(),
                    real_sglang("qwen3.5-27b-capped-by-mamba-v0.5.19-issue-38846.log"));
  ASSERT_EQ(scan.launches.size(), 1u);
  const Launch& launch = scan.launches[0];
  ASSERT_TRUE(launch.running_requests_cap);
  EXPECT_EQ(launch.running_requests_cap->effective, 9);
  EXPECT_EQ(launch.running_requests_cap->state_slots, 47);
  EXPECT_EQ(launch.running_requests_cap->slots_per_request, 5);
  EXPECT_EQ(launch.memory.max_running_requests, 9);
  const report::Finding* f = finding(launch, "running-requests-capped-by-state");
  ASSERT_NE(f, nullptr);
  // The log alone does not say what was asked: info, with the pool size per request.
  EXPECT_EQ(f->severity, report::Severity::info);
  EXPECT_NE(f->fix.find("N x 5"), std::string::npos) << f->fix;
}

TEST(RunningRequestsFlags, AskedForMoreIsAWarningWithThePoolSizeThatFits) {
  // The launch: --max-running-requests 32 (its server_args line is not in the issue;
  // this pairs the real capped line with an args line stating the flag it reports).
  const std::string text =
      "[2026-09-10 10:00:00] server_args=ServerArgs(model_path='Jackrong/Qwopus3.6-27B-v2-FP8', "
      "tp_size=1, max_running_requests=32)\n"
      "[2026-09-10 10:00:09] max_running_requests is capped to 9 by the mamba state cache "
      "(max_mamba_cache_size=47, 5 state slots per request). To raise it: increase "
      "--mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size with "
      "--mamba-ssm-dtype bfloat16.\n";
  const LogScan scan = scan_log_text(kvaudit::testing::registry(), text, "issue-38846");
  ASSERT_EQ(scan.launches.size(), 1u);
  const report::Finding* f = finding(scan.launches[0], "running-requests-capped-by-state");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, report::Severity::warning);
  EXPECT_NE(f->title.find("(32 asked)"), std::string::npos) << f->title;
  EXPECT_NE(f->fix.find("--max-mamba-cache-size 160 (32 x 5)"), std::string::npos) << f->fix;
}

TEST(RunningRequests, ReducedLineIsReadAsTheLogSaysIt) {
  const LogScan scan = scan_log_file(kvaudit::testing::registry(),
                                     real_sglang("hybrid-reduced-not-by-kv-main-pr-32360.log"));
  ASSERT_EQ(scan.launches.size(), 1u);
  const Launch& launch = scan.launches[0];
  ASSERT_TRUE(launch.running_requests_cap);
  EXPECT_EQ(launch.running_requests_cap->requested, 74);
  EXPECT_EQ(launch.running_requests_cap->effective, 26);
  const report::Finding* f = finding(launch, "running-requests-reduced");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, report::Severity::warning);
  EXPECT_NE(f->title.find("as the line says"), std::string::npos) << f->title;
}

// PR #32360's case with the state pool printed (131 slots, the PR's 'after' text): the line
// blames the KV cache, and 131 / 5 = 26 says the state pool bound.
TEST(RunningRequests, ReducedLineOnAHybridNamesTheStatePoolWhenItsSlotsFit) {
  const std::string text =
      "[2026-07-25 10:00:00 TP0] Mamba Cache is allocated. max_mamba_cache_size: 131, "
      "conv_state size: 0.10GB, ssm_state size: 4.38GB\n"
      "[2026-07-25 10:00:01 TP0] max_running_requests was reduced from the requested 74 to 26 "
      "(per dp worker) due to the available KV cache capacity.\n";
  const LogScan scan = scan_log_text(kvaudit::testing::registry(), text, "pr-32360");
  ASSERT_EQ(scan.launches.size(), 1u);
  const report::Finding* f = finding(scan.launches[0], "running-requests-reduced");
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->title.find("probably the mamba state pool"), std::string::npos) << f->title;
  EXPECT_NE(f->title.find("131 state slots / 5"), std::string::npos) << f->title;
}

}  // namespace
}  // namespace kvaudit::logs
