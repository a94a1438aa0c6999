// Two runs pasted into one excerpt, the second one's start-up lines cut: the second run is
// told apart by its weights load (the same rank loading again with the first load's memory
// free, or after the first run was ready), never merged into the first run's figures; a
// second model loading in the same process (SGLang's speculative draft) is not a new run.
// plan and the ledger say which run their figures come from.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/registry.h"
#include "logs/logs.h"

namespace kvaudit::logs {
namespace {

// The real QwQ-32B TP4 launch (SGLang 0.4.3.post4, tests/fixtures/logs/real/sglang/SOURCES.md),
// its lines from `first` (1-based) to `last` (0: to the end).
std::string real_qwq_lines(int first, int last) {
  std::ifstream in(std::filesystem::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" / "real" /
                   "sglang" / "qwq-32b-tp4-l4-0.4.3.post4.log");
  std::string line, out;
  for (int n = 1; std::getline(in, line); ++n)
    if (n >= first && (last == 0 || n <= last)) out += line + "\n";
  return out;
}

TEST(UnmarkedRuns, ASecondRunWithItsStartUpCutIsItsOwnLaunchAfterTheFirstWasReady) {
  // The whole run, then the same run again from its first "Init torch distributed" line (its
  // platform and server_args lines cut, as a pasted excerpt of a restart would have them).
  const std::string text = real_qwq_lines(1, 0) + real_qwq_lines(8, 0);
  const LogScan scan = scan_log_text(kvaudit::testing::registry(), text, "two-runs");
  ASSERT_EQ(scan.launches.size(), 2u);
  const Launch& second = scan.launches[1];
  EXPECT_TRUE(scan.launches[0].split_reason.empty());
  EXPECT_NE(second.split_reason.find("after the launch was ready (line 82)"), std::string::npos)
      << second.split_reason;
  EXPECT_NE(second.split_reason.find("TP3"), std::string::npos) << second.split_reason;
  // Each run keeps its own figures: 21.63 GiB before the load on every rank, one pool.
  EXPECT_EQ(second.memory.pool_tokens, 46611);
  EXPECT_EQ(second.memory.total_before_load_gib, 21.63);
  EXPECT_TRUE(second.ready);
  const std::string note = chosen_launch_note(scan, second);
  EXPECT_NE(note.find("2 launches"), std::string::npos) << note;
  EXPECT_NE(note.find("launch #2's, the latest"), std::string::npos) << note;
  EXPECT_EQ(chosen_launch_note(scan, scan.launches[0]).find("the latest"), std::string::npos);
}

TEST(UnmarkedRuns, ARunThatNeverGotReadyIsSplitByItsMemoryFreeAgain) {
  // The first run cut off after its KV pool (line 56), then the whole run again without its
  // start-up lines: TP3 has 21.63 GiB free again where its first load left 6.09.
  const std::string text = real_qwq_lines(1, 56) + real_qwq_lines(8, 0);
  const LogScan scan = scan_log_text(kvaudit::testing::registry(), text, "restart");
  ASSERT_EQ(scan.launches.size(), 2u);
  const std::string& reason = scan.launches[1].split_reason;
  EXPECT_NE(reason.find("21.63 GiB free"), std::string::npos) << reason;
  EXPECT_NE(reason.find("6.09 GiB after it"), std::string::npos) << reason;
  // The split falls on the load line (file line 73, line 24 of the second copy): the lines
  // before it that say nothing of a new process stay with the first run.
  EXPECT_EQ(scan.launches[1].first_line, 73);
  EXPECT_NE(reason.find("line 73: TP3"), std::string::npos) << reason;
  EXPECT_FALSE(scan.launches[0].ready);
}

TEST(UnmarkedRuns, ADraftModelLoadingInTheSameProcessIsNotANewRun) {
  // SGLang's draft worker loads on the same rank with the target's weights held: since
  // sglang#23862 right after the target's weights, before it after the target's KV pool.
  const std::string after_weights =
      "[2026-05-01 10:00:00 TP0] Load weight begin. avail mem=78.50 GB\n"
      "[2026-05-01 10:00:09 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, "
      "avail mem=62.40 GB, mem usage=16.10 GB.\n"
      "[2026-05-01 10:00:09 TP0] Load weight begin. avail mem=62.55 GB\n"
      "[2026-05-01 10:00:10 TP0] Load weight end. type=LlamaForCausalLMEagle3, "
      "dtype=torch.bfloat16, avail mem=61.20 GB, mem usage=1.35 GB.\n";
  EXPECT_EQ(scan_log_text(kvaudit::testing::registry(), after_weights, "draft").launches.size(),
            1u);
  const std::string after_pool =
      "[2025-08-01 10:00:00 TP0] Load weight begin. avail mem=78.50 GB\n"
      "[2025-08-01 10:00:09 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, "
      "avail mem=62.40 GB, mem usage=16.10 GB.\n"
      "[2025-08-01 10:00:10 TP0] KV Cache is allocated. #tokens: 400000, K size: 27.47 GB, V "
      "size: 27.47 GB\n"
      "[2025-08-01 10:00:11 TP0] Load weight begin. avail mem=6.90 GB\n";
  EXPECT_EQ(scan_log_text(kvaudit::testing::registry(), after_pool, "draft").launches.size(), 1u);
  // The same shape with the memory back where it started is a restart.
  const std::string restart = after_pool +
                              "[2025-08-01 10:05:00 TP0] Load weight begin. "
                              "avail mem=78.48 GB\n";
  EXPECT_EQ(scan_log_text(kvaudit::testing::registry(), restart, "restart").launches.size(), 2u);
}

}  // namespace
}  // namespace kvaudit::logs
