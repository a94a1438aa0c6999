// plan's host tier: SGLang's HiCache host pool per rank (HostKVCache.__init__; constants in
// data/engines/capacity/sglang.json), from plan's own flags and from a launch's log.
#include <gtest/gtest.h>

#include "common/registry.h"
#include "engines/engines.h"
#include "plan/plan.h"
#include "plan_models.h"
#include "util/util.h"

namespace kvaudit::plan {
namespace {

using test_models::llama31_8b;

// Llama-3.1-8B on an H100 as the driver reports it, 16 GiB of weights, BF16.
PlanOptions h100_options(std::map<std::string, std::string> tiers) {
  PlanOptions options;
  options.gpu_memory_bytes = int64_t{81559} << 20;
  options.weight_bytes_per_gpu = int64_t{16} << 30;
  options.kv_cache_dtypes = {"bf16"};
  options.tier_settings = std::move(tiers);
  return options;
}

bool has_finding(const CapacityPlan& plan, const std::string& id) {
  for (const auto& f : plan.findings)
    if (f.id == id) return true;
  return false;
}

TEST(PlanHostTier, NoHostPoolWithoutHierarchicalCache) {
  CapacityPlan plan = plan_capacity(kvaudit::testing::registry(), llama31_8b(), h100_options({}));
  ASSERT_EQ(plan.rows.size(), 1u);
  EXPECT_EQ(plan.rows[0].host_pool_tokens, 0);
  EXPECT_EQ(plan.rows[0].host_pool_bytes, 0);
  EXPECT_TRUE(plan.findings.empty());
}

TEST(PlanHostTier, DefaultRatioDoublesTheDevicePool) {
  CapacityPlan plan = plan_capacity(kvaudit::testing::registry(), llama31_8b(),
                                    h100_options({{"hierarchical_cache", "true"}}));
  ASSERT_EQ(plan.rows.size(), 1u);
  const PlanRow& row = plan.rows[0];
  ASSERT_GT(row.max_total_tokens, 0);
  EXPECT_EQ(row.cell_bytes_per_token_per_gpu, 131072);
  // --hicache-ratio's default is 2.0 (capacity data).
  EXPECT_EQ(row.host_pool_tokens, 2 * row.max_total_tokens);
  EXPECT_EQ(row.host_pool_bytes, row.host_pool_tokens * 131072);
  EXPECT_FALSE(has_finding(plan, "host-pool-not-larger"));
  bool ram_note = false;
  for (const auto& note : plan.notes)
    ram_note |= note.find("must fit in host RAM") != std::string::npos &&
                note.find("10 GiB") != std::string::npos;
  EXPECT_TRUE(ram_note);
  report::Report out = to_report(llama31_8b(), plan, nullptr, false);
  EXPECT_EQ(out.payload["rows"][0]["host_pool_tokens"], row.host_pool_tokens);
  bool column = false;
  for (const auto& c : out.tables.front().columns) column |= c.key == "host_pool_bytes";
  EXPECT_TRUE(column);
}

TEST(PlanHostTier, SizeInGbPerRankOverridesTheRatio) {
  PlanOptions options = h100_options(
      {{"hierarchical_cache", "true"}, {"hicache_ratio", "3"}, {"hicache_size_gb", "40"}});
  options.parallel.tp = 4;  // 2 KV heads per rank: 32,768 B/token
  CapacityPlan plan = plan_capacity(kvaudit::testing::registry(), llama31_8b(), options);
  const PlanRow& row = plan.rows.at(0);
  EXPECT_EQ(row.cell_bytes_per_token_per_gpu, 32768);
  EXPECT_EQ(row.host_pool_tokens, 1220703);  // 40e9 // 32,768
  EXPECT_EQ(row.host_pool_bytes, int64_t{1220703} * 32768);
  bool ranks = false;
  for (const auto& note : plan.notes) ranks |= note.find("4 ranks") != std::string::npos;
  EXPECT_TRUE(ranks);
}

TEST(PlanHostTier, HostPoolNotLargerThanTheDevicePoolIsRefused) {
  CapacityPlan plan =
      plan_capacity(kvaudit::testing::registry(), llama31_8b(),
                    h100_options({{"hierarchical_cache", "true"}, {"hicache_ratio", "0.5"}}));
  ASSERT_TRUE(has_finding(plan, "host-pool-not-larger"));
  report::Report out = to_report(llama31_8b(), plan, nullptr, false);
  EXPECT_EQ(out.verdict_severity, report::Severity::warning);
  EXPECT_NE(out.verdict.find("not larger than the device pool"), std::string::npos) << out.verdict;
}

TEST(PlanHostTier, EnginesWithoutAHostPoolModelSizeNone) {
  PlanOptions options = h100_options({{"hierarchical_cache", "true"}});
  options.engine = "vllm";
  CapacityPlan plan = plan_capacity(kvaudit::testing::registry(), llama31_8b(), options);
  for (const auto& row : plan.rows) EXPECT_EQ(row.host_pool_bytes, 0);
}

}  // namespace
}  // namespace kvaudit::plan
