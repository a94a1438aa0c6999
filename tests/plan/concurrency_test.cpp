// Requests at once as SGLang limits them: the KV pool, the mamba state pool at the slots per
// request of the release and strategy (data/engines/sglang.json "mamba_state_slots"), the
// running-request cap and the context length, the least named. The real line these rules
// must reproduce: sgl-project/sglang#38846 (v0.5.19, default arguments) "max_running_requests
// is capped to 9 by the mamba state cache (max_mamba_cache_size=47, 5 state slots per
// request)" (tests/fixtures/logs/real/sglang/qwen3.5-27b-capped-by-mamba-v0.5.19-issue-38846.log).
#include <gtest/gtest.h>

#include <cmath>

#include "common/registry.h"
#include "engines/engines.h"
#include "plan/plan.h"
#include "plan_models.h"
#include "util/util.h"

namespace kvaudit::plan {
namespace {

const engines::EngineModel& sglang() {
  return kvaudit::testing::registry().engine("sglang");
}

int slots_at(const std::string& version, PlanOptions options = {}) {
  return mamba_slots_per_request(sglang(), *engines::parse_version(version), options).slots;
}

TEST(MambaSlots, PerReleaseAndStrategy) {
  // Before the hybrid radix cache (PR #11214): one slot per request.
  EXPECT_EQ(slots_at("0.5.2"), 1);
  // Radix cache on, one strategy (later called no_buffer): 3.
  EXPECT_EQ(slots_at("0.5.5"), 3);
  // extra_buffer: 5, one less with speculative decoding (0.5.7-0.5.9) ...
  PlanOptions extra;
  extra.mamba_radix_cache_strategy = "extra_buffer";
  EXPECT_EQ(slots_at("0.5.8", extra), 5);
  PlanOptions extra_spec = extra;
  extra_spec.speculative_draft_layers = 1;
  EXPECT_EQ(slots_at("0.5.8", extra_spec), 4);
  // ... then one less with the overlap scheduler off instead (0.5.10 on).
  EXPECT_EQ(slots_at("0.5.12", extra_spec), 5);
  PlanOptions extra_no_overlap = extra;
  extra_no_overlap.disable_overlap_schedule = true;
  EXPECT_EQ(slots_at("0.5.12", extra_no_overlap), 4);
  // The default stays no_buffer until auto (0.5.14), which takes extra_buffer with overlap.
  EXPECT_EQ(slots_at("0.5.12"), 3);
  EXPECT_EQ(slots_at("0.5.19"), 5);
  PlanOptions auto_no_overlap;
  auto_no_overlap.disable_overlap_schedule = true;
  EXPECT_EQ(slots_at("0.5.19", auto_no_overlap), 3);
  PlanOptions lazy;
  lazy.mamba_radix_cache_strategy = "extra_buffer_lazy";
  EXPECT_EQ(slots_at("0.5.19", lazy), 4);
  PlanOptions skip = extra;
  skip.mamba_skip_decode_lock = true;
  EXPECT_EQ(slots_at("0.5.19", skip), 4);
  PlanOptions no_buffer;
  no_buffer.mamba_radix_cache_strategy = "no_buffer";
  no_buffer.mamba_skip_decode_lock = true;
  EXPECT_EQ(slots_at("0.5.19", no_buffer), 3);
  PlanOptions radix_off = extra;
  radix_off.disable_radix_cache = true;
  EXPECT_EQ(slots_at("0.5.19", radix_off), 1);
  // A strategy the release does not have is refused, naming the flag.
  try {
    slots_at("0.5.5", extra);
    ADD_FAILURE() << "0.5.5 has no extra_buffer";
  } catch (const InputError& error) {
    EXPECT_EQ(error.where(), "--mamba-radix-cache-strategy");
  }
  // The inferred release bounds say so.
  EXPECT_NE(mamba_slots_per_request(sglang(), *engines::parse_version("0.5.8"), extra)
                .derivation.find("inferred"),
            std::string::npos);
}

// sglang#38846: 47 state slots at 5 per request cap a v0.5.19 launch at 9 requests, below
// its --max-running-requests 32 and below what its KV pool holds at short contexts.
TEST(Concurrency, StatePoolCapsTheMotivatingHybridAsTheRealLogSays) {
  EXPECT_EQ(47 / slots_at("0.5.19"), 9);
  auto model = test_models::qwen35_397b();
  PlanOptions options;
  options.engine_version = "0.5.19";
  options.parallel.tp = 8;
  options.gpu_memory_bytes = int64_t{96} << 30;
  options.weight_bytes_per_gpu = int64_t{30} << 30;
  options.kv_cache_dtypes = {"bf16"};
  options.contexts = {4096, 300000};
  options.context_length = 262144;
  options.max_running_requests = 4096;
  CapacityPlan plan = plan_capacity(kvaudit::testing::registry(), model, options);
  ASSERT_EQ(plan.rows.size(), 1u);
  const PlanRow& row = plan.rows[0];
  ASSERT_GT(row.mamba_slots, 0);
  const ConcurrencyPoint& short_context = row.concurrency[0];
  EXPECT_EQ(short_context.requests, row.mamba_slots / 5);
  EXPECT_EQ(short_context.limited_by.rfind("mamba state pool", 0), 0u) << short_context.limited_by;
  // Every limit is kept: the KV pool, the state pool, the flag.
  EXPECT_EQ(short_context.limits.size(), 3u);
  // Longer than the model's context: none fit.
  const ConcurrencyPoint& too_long = row.concurrency[1];
  EXPECT_EQ(too_long.requests, 0);
  EXPECT_EQ(too_long.limited_by.rfind("context length", 0), 0u) << too_long.limited_by;

  // The older release (no_buffer, 3 slots) admits 5/3 as many on the same pool.
  options.engine_version = "0.5.12";
  CapacityPlan older = plan_capacity(kvaudit::testing::registry(), model, options);
  EXPECT_EQ(older.rows[0].concurrency[0].requests, older.rows[0].mamba_slots / 3);
  auto report = to_report(model, plan, nullptr, false);
  bool has_table = false;
  for (const auto& table : report.tables) has_table |= table.id == "concurrency";
  EXPECT_TRUE(has_table);
  EXPECT_NE(report.verdict.find("limited by the mamba state pool"), std::string::npos)
      << report.verdict;
  EXPECT_EQ(report.payload["rows"][0]["concurrency_limits"]["4096"].size(), 3u);
}

TEST(Concurrency, EngineDefaultCapAppliesWithoutTheFlag) {
  auto model = test_models::llama31_8b();
  PlanOptions options;
  options.gpu_memory_bytes = int64_t{80} << 30;
  options.weight_bytes_per_gpu = int64_t{16} << 30;
  options.kv_cache_dtypes = {"bf16"};
  options.contexts = {16};
  options.context_length = 131072;
  CapacityPlan plan = plan_capacity(kvaudit::testing::registry(), model, options);
  const ConcurrencyPoint& point = plan.rows[0].concurrency[0];
  // 16-token requests: the pool would hold hundreds of thousands; the engine's default cap
  // (at most 4096 per DP worker) binds.
  EXPECT_LE(point.requests, 4096);
  EXPECT_EQ(point.limited_by, "the engine's default running-request cap");
}

// gpt-oss's layout (one full and one 128-token sliding group, block 16) with the figures of
// the two real vLLM logs: 0.10.1.1 (L 16,384, budget 2,048) and 0.15.1 (L 131,072, 8,192).
TEST(Concurrency, VllmSlidingGroupsHoldTheWindowAndTheChunkBeingPrefilled) {
  VllmLayout layout;
  layout.block_size = 16;
  layout.full_groups = 1, layout.sliding_groups = 1, layout.num_groups = 2;
  layout.sliding_window = 128;
  EXPECT_EQ(vllm_blocks_per_request(layout, 16384, 2048), 1024 + 137);
  EXPECT_EQ(vllm_blocks_per_request(layout, 131072, 8192), 8192 + 521);
  // 330,018 and 283,736 blocks: the printed 284.25x and 32.56x.
  EXPECT_EQ(std::llround(330018.0 / (1024 + 137) * 100), 28425);
  EXPECT_EQ(std::llround(283736.0 / (8192 + 521) * 100), 3256);
  // Without the budget, the window alone: the fewest blocks.
  EXPECT_EQ(vllm_blocks_per_request(layout, 16384, std::nullopt), 1024 + 9);
  // A context shorter than the window holds the context.
  EXPECT_EQ(vllm_blocks_per_request(layout, 64, 2048), 4 + 5);
}

TEST(Concurrency, RelimitKeepsTheLeast) {
  ConcurrencyPoint point;
  limit_requests(point, "kv pool", 100);
  limit_requests(point, "mamba state pool", 40);
  EXPECT_EQ(point.requests, 40);
  relimit_requests(point, "kv pool", 20);
  EXPECT_EQ(point.requests, 20);
  EXPECT_EQ(point.limited_by, "kv pool");
  relimit_requests(point, "kv pool", 500);
  EXPECT_EQ(point.requests, 40);
  EXPECT_EQ(point.limited_by, "mamba state pool");
}

}  // namespace
}  // namespace kvaudit::plan
