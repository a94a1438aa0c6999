// The capacity ledger (docs/capacity-ledger.md) over the real-log corpus: every log is in it,
// the committed document is what the code computes now, and the figures kvaudit reproduces
// stay reproduced (a change to the engine model that loses one fails here).
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "common/registry.h"
#include "ledger/ledger.h"
#include "logs/logs.h"
#include "plan/plan.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::ledger {
namespace {

namespace fs = std::filesystem;

const Ledger& ledger() {
  static const Ledger built = build_ledger(
      kvaudit::testing::registry(), fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" / "real",
      fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "configs");
  return built;
}

const LedgerRow* row_of(const std::string& file) {
  for (const LedgerRow& row : ledger().rows)
    if (row.file == file) return &row;
  return nullptr;
}

TEST(CapacityLedger, DocumentIsUpToDate) {
  const fs::path doc = fs::path(KVAUDIT_TEST_DIR).parent_path() / "docs" / "capacity-ledger.md";
  ASSERT_TRUE(fs::exists(doc)) << doc;
  EXPECT_TRUE(read_text_file(doc) == ledger_markdown(ledger()))
      << doc << " is stale: regenerate it with `make ledger` and review the diff";
}

TEST(CapacityLedger, EveryCorpusLogIsARow) {
  size_t logs = 0;
  for (const char* engine : {"sglang", "vllm", "trtllm"})
    logs += read_json_file(fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" / "real" / engine /
                           "EXPECTED.json")
                .size();
  EXPECT_EQ(ledger().rows.size(), logs);
  for (const LedgerRow& row : ledger().rows) EXPECT_FALSE(row.status.empty()) << row.file;
  ASSERT_FALSE(ledger().summary.empty());
  EXPECT_EQ(ledger().summary.back().logs, static_cast<int>(logs));
}

TEST(CapacityLedger, RealLogsWithConfigsAreReproduced) {
  // The motivating family's real log (KTransformers' SGLang, Qwen3.5-397B TP2): the pool size,
  // the state size and the running-request cap all inside.
  const LedgerRow* qwen35 = row_of("qwen3.5-397b-gdn-ktransformers-tp2-2026-02-27.log");
  ASSERT_NE(qwen35, nullptr);
  EXPECT_EQ(qwen35->status, "reproduced") << qwen35->note;
  EXPECT_FALSE(qwen35->concurrency.empty());
  // Every row with a config is predicted or says why not.
  for (const LedgerRow& row : ledger().rows) {
    if (!row.config.empty()) {
      EXPECT_NE(row.status, "no config") << row.file;
    }
  }
}

// vLLM's printed maximum concurrency for sliding-window hybrids counts every group's blocks
// per request (gpt-oss: 18 full layers at cdiv(L, 16), 18 sliding at cdiv(min(128 - 1 + the
// chunked-prefill budget, L), 16) + 1), read from both real logs exactly; the budget comes from
// their "Chunked prefill is enabled with max_num_batched_tokens=N" line.
TEST(CapacityLedger, SlidingWindowConcurrencyCountsEveryGroupsBlocks) {
  for (const char* file :
       {"gpt-oss-120b-tp2-harmony-error-0.15.1.log", "gpt-oss-120b-tp4-ray-ansi-0.10.1.1.log"}) {
    const LedgerRow* row = row_of(file);
    ASSERT_NE(row, nullptr) << file;
    EXPECT_EQ(row->status, "reproduced") << file << ": " << row->note;
    ASSERT_EQ(row->concurrency.size(), 1u) << file;
    const LedgerCheck& c = row->concurrency[0];
    EXPECT_TRUE(c.inside) << file;
    EXPECT_LE(c.hi - c.lo, 1) << file << ": the budget was read, so the interval is exact";
  }
}

// SGLang runs DeepSeek DSA/NSA models (a lightning indexer) at page size 64 on CUDA whatever
// --page-size says; the real KTransformers DeepSeek-V3.2 log prints no page size, and its pool
// of 65,984 = 64 x 1,031 tokens is inside only when the pool is floored to 64-token pages.
TEST(CapacityLedger, DsaModelsArePagedAt64TokensWhenTheLogPrintsNoPageSize) {
  const LedgerRow* row = row_of("deepseek-v3.2-ktransformers-fp8kv-tp2-2025-12-25.log");
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->status, "reproduced") << row->note;
  ASSERT_FALSE(row->tokens.empty());
  EXPECT_TRUE(row->tokens[0].inside);
  EXPECT_EQ(row->tokens[0].printed % 64, 0);
}

// A real SGLang log with kv_cache_dtype 'auto' and no dtype line (Qwen2.5-7B on an RTX 5090,
// sglang#5338): its K size over its #tokens gives 2 bytes per element for Qwen2.5-7B's
// geometry, so the dtype is derived (and said to be), not refused.
TEST(CapacityLedger, DtypeIsDerivedFromThePrintedSizesWhenTheLogNamesNone) {
  const fs::path log = fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" / "real" / "sglang" /
                       "qwen2.5-7b-rtx5090-blackwell-crash-2025-04-13.log";
  const logs::LogScan scan = logs::scan_log_file(kvaudit::testing::registry(), log);
  ASSERT_FALSE(scan.launches.empty());
  const checkpoint::ModelFacts model = checkpoint::read_checkpoint(
      fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "configs" / "qwen-qwen2.5-7b-instruct");
  const plan::LogPrediction p =
      plan::predict_from_log(kvaudit::testing::registry(), model, scan.launches.back().memory, {});
  ASSERT_FALSE(p.checks.empty());
  for (const auto& c : p.checks) EXPECT_TRUE(c.inside) << c.id;
  ASSERT_FALSE(p.notes.empty());
  EXPECT_NE(p.notes.front().find("derived, not printed"), std::string::npos) << p.notes.front();
  const LedgerRow* row = row_of("qwen2.5-7b-rtx5090-blackwell-crash-2025-04-13.log");
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->status, "reproduced");
}

}  // namespace
}  // namespace kvaudit::ledger
