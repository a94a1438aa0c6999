// The KV tiers' start-up lines in logs: SGLang's HiCache host pool and vLLM's KV connector
// read from real logs (tests/fixtures/logs/SOURCES.md, real/vllm/SOURCES.md), reported per
// launch, and the host pool checked against the launch's own tier settings.
#include <gtest/gtest.h>

#include "../plan/plan_models.h"
#include "common/registry.h"
#include "logs/logs.h"
#include "logs/parse.h"
#include "util/util.h"

namespace kvaudit::logs {
namespace {

std::string fixture(const std::string& name) {
  return std::string(KVAUDIT_TEST_DIR) + "/fixtures/logs/" + name;
}

bool has_finding(const Launch& launch, const std::string& id) {
  for (const auto& f : launch.findings)
    if (f.id == id) return true;
  return false;
}

// sgl-project/sglang#31600: GLM-5.2 at TP 8, each rank allocating its HiCache host pool.
TEST(KvTiers, ReadsTheHiCacheHostPoolOfEveryRankFromARealLog) {
  LogScan scan = scan_log_file(kvaudit::testing::registry(),
                               fixture("sglang_glm52_hicache_host_pool_tp8.log"));
  ASSERT_EQ(scan.launches.size(), 1u);
  const Launch& launch = scan.launches[0];
  EXPECT_EQ(launch.engine, "sglang");
  ASSERT_EQ(launch.tiers.host_pools.size(), 8u);
  EXPECT_EQ(launch.tiers.host_pools.front().rank, "ATTN_CP5 TP5");
  EXPECT_EQ(launch.tiers.host_pools.front().line, 1);
  auto host = host_pool_summary(launch);
  ASSERT_TRUE(host);
  EXPECT_DOUBLE_EQ(host->gb_per_rank, 120.0);
  EXPECT_EQ(host->pools_per_rank, 1);
  EXPECT_EQ(host->ranks, 8);
  EXPECT_TRUE(host->ranks_agree);
  // The excerpt prints no device pool: the host pool's tokens are not known.
  EXPECT_FALSE(host->tokens_per_rank);
  EXPECT_EQ(tiers_text(launch), "HiCache host pool 120.00 GB per rank x 8 ranks");
  // No server_args line: nothing to check the size against.
  EXPECT_FALSE(has_finding(launch, "host-pool-mismatch"));
  EXPECT_FALSE(has_finding(launch, "host-pool-not-larger"));

  report::Report out = to_report(scan, true, {});
  const auto& json = out.payload["launches"][0]["kv_tiers"];
  EXPECT_DOUBLE_EQ(json["host_pool"]["gb_per_rank"].get<double>(), 120.0);
  EXPECT_EQ(json["host_pool"]["ranks"], 8);
  EXPECT_EQ(json["host_pool"]["lines"].size(), 8u);
  bool fact = false;
  for (const auto& f : out.facts) fact |= f.key == "kv_tiers";
  EXPECT_TRUE(fact);
  ASSERT_FALSE(out.tables.empty());
  const auto& table = out.tables.front();
  ASSERT_EQ(table.id, "launches");
  size_t column = 0;
  while (column < table.columns.size() && table.columns[column].key != "tiers") ++column;
  ASSERT_LT(column, table.columns.size());
  EXPECT_EQ(std::get<std::string>(table.rows[0][column]),
            "HiCache host pool 120.00 GB per rank x 8 ranks");
}

// LMCache/LMCache#3326: vLLM's connector factory names the class it built.
TEST(KvTiers, ReadsTheVllmKvConnectorFromARealLog) {
  LogScan scan =
      scan_log_file(kvaudit::testing::registry(),
                    fixture("real/vllm/qwen3-14b-lmcache-mp-cudagraph-profiling-2026-05.log"));
  ASSERT_EQ(scan.launches.size(), 1u);
  const Launch& launch = scan.launches[0];
  EXPECT_EQ(launch.engine, "vllm");
  EXPECT_EQ(launch.tiers.kv_connector, "LMCacheMPConnector");
  EXPECT_EQ(launch.tiers.connector_line, 8);
  EXPECT_TRUE(launch.tiers.host_pools.empty());
  EXPECT_EQ(tiers_text(launch), "KV connector LMCacheMPConnector");
  report::Report out = to_report(scan, false, {});
  EXPECT_EQ(out.payload["launches"][0]["kv_tiers"]["kv_connector"]["name"], "LMCacheMPConnector");
}

TEST(KvTiers, LaunchesWithoutTiersSayNone) {
  LogScan scan =
      scan_log_file(kvaudit::testing::registry(), fixture("sglang_llama8b_single_gpu.log"));
  ASSERT_FALSE(scan.launches.empty());
  EXPECT_EQ(tiers_text(scan.launches.back()), "");
  EXPECT_TRUE(scan.launches.back().tiers.host_pools.empty());
}

// Constructed lines (the real logs above print no server_args with HiCache on): a ServerArgs
// with the tier settings, the device pool of Llama-3.1-8B at 100,000 tokens (131,072 B/token,
// K and V 6.10 GiB each with the padding page), and the host line under test.
std::string launch_text(const std::string& tier_args, const std::string& host_lines) {
  return "[2026-01-01 00:00:00] server_args=ServerArgs(model_path='/m', tp_size=1, page_size=1, " +
         tier_args +
         ")\n"
         "[2026-01-01 00:00:05] KV Cache is allocated. #tokens: 100000, K size: 6.10 GB, V size: "
         "6.10 GB\n" +
         host_lines;
}

Launch scan_one(const std::string& text) {
  LogScan scan = scan_log_text(kvaudit::testing::registry(), text, "constructed");
  EXPECT_EQ(scan.launches.size(), 1u);
  return scan.launches.back();
}

TEST(KvTiers, ReadsTheTierSettingsOfTheServerArgsLine) {
  Launch launch =
      scan_one(launch_text("enable_hierarchical_cache=True, hicache_ratio=2.0, hicache_size=0, "
                           "hicache_storage_backend='mooncake'",
                           ""));
  EXPECT_EQ(launch.tier_settings.at("hierarchical_cache"), "true");
  EXPECT_EQ(launch.tier_settings.at("hicache_ratio"), "2");
  EXPECT_EQ(launch.tier_settings.at("hicache_size_gb"), "0");
  EXPECT_EQ(launch.tier_settings.at("hicache_storage_backend"), "mooncake");
  EXPECT_EQ(launch.memory.tier_settings, launch.tier_settings);
  // A tier switched off sets nothing up.
  Launch off = scan_one(launch_text("enable_hierarchical_cache=False, hicache_ratio=2.0", ""));
  EXPECT_FALSE(off.tier_settings.count("hierarchical_cache"));
}

TEST(KvTiers, HostPoolAtTheRatioOfTheDevicePoolIsAsAsked) {
  // 2 x 100,000 tokens x 131,072 B = 26.21 GB.
  Launch launch = scan_one(launch_text(
      "enable_hierarchical_cache=True, hicache_ratio=2.0, hicache_size=0",
      "[2026-01-01 00:00:06] Allocating 26.21 GB host memory for hierarchical KV cache.\n"));
  auto host = host_pool_summary(launch);
  ASSERT_TRUE(host && host->tokens_per_rank);
  // Tokens from the printed K+V bytes per row: 200,000 within the sizes' rounding.
  EXPECT_NEAR(static_cast<double>(*host->tokens_per_rank), 200000.0, 500.0);
  EXPECT_FALSE(has_finding(launch, "host-pool-mismatch"));
  EXPECT_FALSE(has_finding(launch, "host-pool-not-larger"));
}

TEST(KvTiers, HostPoolOtherThanTheRatioGivesIsANote) {
  Launch launch = scan_one(launch_text(
      "enable_hierarchical_cache=True, hicache_ratio=2.0, hicache_size=0",
      "[2026-01-01 00:00:06] Allocating 52.43 GB host memory for hierarchical KV cache.\n"));
  ASSERT_TRUE(has_finding(launch, "host-pool-mismatch"));
  for (const auto& f : launch.findings)
    if (f.id == "host-pool-mismatch") {
      EXPECT_EQ(f.severity, report::Severity::info);
      EXPECT_NE(f.title.find("--hicache-ratio 2"), std::string::npos) << f.title;
      EXPECT_NE(f.title.find("26.2"), std::string::npos) << f.title;
    }
}

TEST(KvTiers, HostPoolBySizeSumsARanksPools) {
  Launch as_asked = scan_one(launch_text(
      "enable_hierarchical_cache=True, hicache_ratio=2.0, hicache_size=40",
      "[2026-01-01 00:00:06 TP0] Allocating 40.00 GB host memory for hierarchical KV cache.\n"));
  EXPECT_FALSE(has_finding(as_asked, "host-pool-mismatch"));
  // The same size allocated for two pools of one rank (hybrid SWA before sglang PR #32373).
  Launch doubled = scan_one(launch_text(
      "enable_hierarchical_cache=True, hicache_ratio=2.0, hicache_size=40",
      "[2026-01-01 00:00:06 TP0] Allocating 40.00 GB host memory for hierarchical KV cache.\n"
      "[2026-01-01 00:00:06 TP0] Allocating 40.00 GB host memory for hierarchical KV cache.\n"));
  auto host = host_pool_summary(doubled);
  ASSERT_TRUE(host);
  EXPECT_EQ(host->pools_per_rank, 2);
  EXPECT_DOUBLE_EQ(host->gb_per_rank, 80.0);
  EXPECT_TRUE(has_finding(doubled, "host-pool-mismatch"));
}

TEST(KvTiers, HostPoolNotLargerThanTheDevicePoolIsRefused) {
  // 0.5 x the device pool: older SGLang asserts, newer warns.
  Launch launch = scan_one(launch_text(
      "enable_hierarchical_cache=True, hicache_ratio=0.5, hicache_size=0",
      "[2026-01-01 00:00:06] Allocating 6.55 GB host memory for hierarchical KV cache.\n"));
  EXPECT_TRUE(has_finding(launch, "host-pool-not-larger"));
  EXPECT_FALSE(has_finding(launch, "host-pool-mismatch"));
}

// plan --from-log takes the tier settings the launch's server_args printed (constructed lines:
// the real logs with HiCache lines print no server_args).
TEST(KvTiers, PlanFromLogUsesTheLaunchsTierSettings) {
  const std::string text =
      "[2026-01-01 00:00:00] server_args=ServerArgs(model_path='/m', tp_size=1, "
      "enable_hierarchical_cache=True, hicache_ratio=3.0, hicache_size=0)\n"
      "[2026-01-01 00:00:05] KV Cache is allocated. #tokens: 100000, K size: 6.10 GB, V size: "
      "6.10 GB\n";
  LogScan scan = scan_log_text(kvaudit::testing::registry(), text, "constructed");
  ASSERT_EQ(scan.launches.size(), 1u);
  plan::LogSetup setup = plan::reconcile_log_flags(
      kvaudit::testing::registry(), scan.launches[0].memory, plan::PlanOptions{}, {});
  EXPECT_EQ(setup.options.tier_settings.at("hierarchical_cache"), "true");
  EXPECT_EQ(setup.options.tier_settings.at("hicache_ratio"), "3");
  setup.options.gpu_memory_bytes = int64_t{81559} << 20;
  setup.options.weight_bytes_per_gpu = int64_t{16} << 30;
  setup.options.kv_cache_dtypes = {"bf16"};
  plan::CapacityPlan plan = plan::plan_capacity(kvaudit::testing::registry(),
                                                plan::test_models::llama31_8b(), setup.options);
  EXPECT_EQ(plan.rows.at(0).host_pool_tokens, 3 * plan.rows.at(0).max_total_tokens);
}

}  // namespace
}  // namespace kvaudit::logs
