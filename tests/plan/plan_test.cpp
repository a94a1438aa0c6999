// Tests for plan: the engines' per-token sizes and pools, with the motivating
// deployment's numbers (Qwen3.5-397B-A17B-NVFP4, SGLang, TP 8; README) pinned exactly, and the
// from-log intervals checked on real start-up logs (tests/fixtures/logs/SOURCES.md).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "common/registry.h"
#include "engines/engines.h"
#include "plan/plan.h"
#include "plan_models.h"
#include "util/util.h"

namespace fs = std::filesystem;

namespace kvaudit::plan {
namespace {

using test_models::deepseek_v3;
using test_models::gemma_like_swa;
using test_models::llama31_8b;
using test_models::qwen35_397b;

const engines::KvDtype& sglang_dtype(const char* name) {
  return *kvaudit::testing::registry().dtypes().find(name);
}

// SGLang's sizing rules of a release (default: the newest known).
SizingRules rules_of(const checkpoint::ModelFacts& model, const std::string& version = "") {
  PlanOptions options;
  options.engine_version = version;
  return sizing_rules(model, kvaudit::testing::engine("sglang"), *engines::parse_version(version),
                      options);
}

TEST(PlanCell, Qwen35At8GpusReplicatesOneHeadPerGpu) {
  auto model = qwen35_397b();
  Parallelism tp8{8, 1, 1, false};
  EXPECT_EQ(
      sglang_cell_size(model, sglang_dtype("bf16"), tp8, rules_of(model, "0.5.9")).bytes_per_token,
      15360);
  EXPECT_EQ(sglang_cell_size(model, sglang_dtype("fp8_e4m3"), tp8, rules_of(model, "0.5.9"))
                .bytes_per_token,
            7680);
  auto cell = sglang_cell_size(model, sglang_dtype("fp8_e4m3"), tp8, rules_of(model, "0.5.9"));
  EXPECT_EQ(cell.kv_heads_per_rank, 1);
  EXPECT_EQ(cell.full_layers, 15);
  // The hand estimate that forgot the per-rank head count: 2 heads x 15 x 512 x 1 B.
  EXPECT_NE(cell.bytes_per_token, 15360);
}

TEST(PlanCell, SamePoolHoldsTwiceTheFp8Tokens) {
  auto model = qwen35_397b();
  Parallelism tp8{8, 1, 1, false};
  auto bf16 = sglang_cell_size(model, sglang_dtype("bf16"), tp8, rules_of(model, "0.5.9"));
  auto fp8 = sglang_cell_size(model, sglang_dtype("fp8_e4m3"), tp8, rules_of(model, "0.5.9"));
  const int64_t pool = int64_t{1573854} * bf16.bytes_per_token;
  auto bf16_pools = sglang_pools(pool, bf16, std::nullopt, 0.9, 1, std::nullopt, std::nullopt, 0.8);
  auto fp8_pools = sglang_pools(pool, fp8, std::nullopt, 0.9, 1, std::nullopt, std::nullopt, 0.8);
  EXPECT_EQ(bf16_pools.max_total_tokens, 1573854);
  EXPECT_EQ(fp8_pools.max_total_tokens, 3147708);
}

TEST(PlanCell, MlaIsOneLatentPerTokenNotSplitByTp) {
  auto model = deepseek_v3();
  auto cell = sglang_cell_size(model, sglang_dtype("bf16"), Parallelism{8, 1, 1, false},
                               rules_of(model, "0.5.9"));
  EXPECT_EQ(cell.bytes_per_token, 576 * 61 * 2);
  auto fp4 = sglang_cell_size(model, sglang_dtype("fp4_e2m1"), Parallelism{8, 1, 1, false},
                              rules_of(model, "0.5.9"));
  EXPECT_EQ(fp4.bytes_per_token, 576 * 61 / 2 + (576 / 16) * 61);
}

TEST(PlanCell, Fp4AddsOneScaleBytePerSixteenValues) {
  auto model = llama31_8b();
  auto cell = sglang_cell_size(model, sglang_dtype("fp4_e2m1"), Parallelism{1, 1, 1, false},
                               rules_of(model, "0.5.9"));
  // 8 heads x 256 x 32 layers x 1 B = 65536; /2 + 8 x 128 x 32 x 2 / 16 = 32768 + 4096.
  EXPECT_EQ(cell.bytes_per_token, 36864);
}

TEST(PlanCell, DpAttentionSplitsHeadsOverAttentionTp) {
  auto model = llama31_8b();
  auto tp8 = sglang_cell_size(model, sglang_dtype("bf16"), Parallelism{8, 1, 1, false},
                              rules_of(model, "0.5.9"));
  auto dp4 = sglang_cell_size(model, sglang_dtype("bf16"), Parallelism{8, 1, 4, true},
                              rules_of(model, "0.5.9"));
  EXPECT_EQ(tp8.bytes_per_token, 1 * 256 * 32 * 2);
  EXPECT_EQ(dp4.bytes_per_token, 4 * 256 * 32 * 2);  // attention TP = 8 / 4 = 2
}

TEST(PlanCell, SlidingWindowLayersGetTheirOwnPool) {
  auto model = gemma_like_swa();
  auto cell = sglang_cell_size(model, sglang_dtype("bf16"), Parallelism{1, 1, 1, false},
                               rules_of(model, "0.5.9"));
  EXPECT_EQ(cell.full_layers, 4);
  EXPECT_EQ(cell.swa_layers, 20);
  auto pools =
      sglang_pools(int64_t{10} << 30, cell, std::nullopt, 0.9, 1, std::nullopt, std::nullopt, 0.8);
  EXPECT_GT(pools.max_total_tokens, (int64_t{10} << 30) / cell.bytes_per_token);
  EXPECT_EQ(pools.swa_tokens, static_cast<int64_t>(pools.max_total_tokens * 0.8L));
}

TEST(PlanMamba, Qwen35StateMatchesTheRealLogAtTp2) {
  // kvcache-ai/ktransformers#1870: TP 2, 82 slots, ssm_state 7.29 GB, conv_state 0.13 GB.
  auto model = qwen35_397b();
  auto state = sglang_mamba_state(model, Parallelism{2, 1, 1, false}, rules_of(model, "0.5.9"));
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->linear_layers, 45);
  EXPECT_EQ(state->ssm_bytes_per_layer, 32 * 128 * 128 * 4);
  EXPECT_EQ(state->conv_bytes_per_layer, (64 * 128 + 2 * 16 * 128) / 2 * 3 * 2);
  double ssm_gib = 83.0 * state->ssm_bytes_per_layer * 45 / kGiB;
  double conv_gib = 83.0 * state->conv_bytes_per_layer * 45 / kGiB;
  EXPECT_EQ(fmt::format("{:.2f}", ssm_gib), "7.29");
  EXPECT_EQ(fmt::format("{:.2f}", conv_gib), "0.13");
}

TEST(PlanDefaults, SglangMemFractionForL40sReproducesTheLoggedPool) {
  const auto& table =
      *kvaudit::testing::engine("sglang").capacity.mem_fraction_for(*engines::parse_version(""));
  auto d = sglang_default_mem_fraction(table, 46068, 1, 1, false, 1);
  EXPECT_DOUBLE_EQ(d.mem_fraction_static, 0.851);
  auto h100 = sglang_default_mem_fraction(table, 81559, 8, 1, false, 1);
  // 512 + 8192 x 1.5 + 512 x 2 + 1024 = 14848 MiB reserved.
  EXPECT_DOUBLE_EQ(h100.mem_fraction_static, 0.818);
}

TEST(PlanDefaults, GpuPresetsAndDtypeNames) {
  EXPECT_EQ(find_gpu("h200").memory_mib, 143771);
  EXPECT_EQ(find_gpu("RTX PRO 6000 Blackwell 96GB").memory_gb, 96);
  EXPECT_THROW(find_gpu("tpu-v5"), InputError);
  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("torch.float8_e4m3fn"), "fp8_e4m3");
  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("bfloat16"), "bf16");
  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("fp8"), "fp8_e4m3");
  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("banana"), "");
}

TEST(PlanCapacity, RowsForEveryDefaultDtypeWithConcurrency) {
  auto model = qwen35_397b();
  PlanOptions options;
  options.parallel.tp = 8;
  options.gpu_memory_bytes = find_gpu("rtx-pro-6000").memory_mib * kMiB;
  options.weight_bytes_per_gpu = int64_t{30} << 30;
  options.contexts = {8192, 131072};
  auto plan = plan_capacity(kvaudit::testing::registry(), model, options);
  // The model dtype first, then every dtype SGLang's newest release accepts.
  std::vector<std::string> names;
  for (const auto& row : plan.rows) names.push_back(row.kv_cache_dtype);
  EXPECT_EQ(names, (std::vector<std::string>{"bf16", "fp8_e4m3", "fp8_e5m2", "mxfp8",
                                             "fp4_mx_block16", "nvfp4"}));
  auto row_of = [&](const std::string& name) {
    return *std::find_if(plan.rows.begin(), plan.rows.end(),
                         [&](const PlanRow& r) { return r.kv_cache_dtype == name; });
  };
  EXPECT_EQ(row_of("bf16").cell_bytes_per_token_per_gpu, 15360);
  EXPECT_EQ(row_of("fp8_e4m3").cell_bytes_per_token_per_gpu, 7680);
  // MXFP8: + one UE8M0 byte per 32 values: 1 head x 512 x 15 / 32 = 240.
  EXPECT_EQ(row_of("mxfp8").cell_bytes_per_token_per_gpu, 7680 + 240);
  // NVFP4: 7680 / 2 + 1 x 256 x 15 x 2 / 16 scale bytes + the 512-B dequant workspace row.
  EXPECT_EQ(row_of("nvfp4").cell_bytes_per_token_per_gpu, 3840 + 480 + 512);
  // Same memory budget: FP8 holds twice the tokens (to within one token).
  EXPECT_NEAR(row_of("fp8_e4m3").max_total_tokens, 2 * row_of("bf16").max_total_tokens, 1);
  EXPECT_GT(plan.rows[0].mamba_slots, 0);
  ASSERT_EQ(plan.rows[0].concurrency.size(), 2u);
  EXPECT_GE(plan.rows[0].concurrency[0].requests, plan.rows[0].concurrency[1].requests);
  auto report = to_report(model, plan, nullptr, true);
  EXPECT_EQ(report.payload["rows"].size(), 6u);
  EXPECT_EQ(report.payload["rows"][0]["cell_bytes_per_token_per_gpu"], 15360);
  EXPECT_TRUE(report.payload["rows"][0]["concurrency"].contains("8192"));
  EXPECT_EQ(report.charts.size(), 2u);
}

TEST(PlanCapacity, VllmUsesBlocksOfSixteen) {
  auto model = llama31_8b();
  PlanOptions options;
  options.engine = "vllm";
  options.kv_cache_dtypes = {"bf16", "fp8"};
  options.gpu_memory_bytes = int64_t{80} << 30;
  options.weight_bytes_per_gpu = int64_t{16} << 30;
  auto plan = plan_capacity(kvaudit::testing::registry(), model, options);
  ASSERT_EQ(plan.rows.size(), 2u);
  EXPECT_EQ(plan.rows[0].cell_bytes_per_token_per_gpu, 131072);
  EXPECT_EQ(plan.rows[0].max_total_tokens % 16, 0);
  EXPECT_EQ(plan.rows[1].kv_cache_dtype, "fp8_e4m3");
}

// DeepSeek-V3.2 as published (tests/fixtures/configs): SGLang's DSA FP8 record is 656 B per
// layer (512 FP8 latent + 4 FP32 tile scales + 64 BF16 rope) plus the indexer's FP8 keys
// with their scales, (128 + 4) B per layer (kv_cache_configurator.py
// calculate_mla_kv_cache_dim; pool_configurator.py _compute_cell_size).
TEST(PlanCell, DsaFp8RecordAndIndexerOnTheRealDeepSeekV32Config) {
  auto model = checkpoint::read_checkpoint(fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "configs" /
                                           "deepseek-v3.2" / "config.json");
  auto rules = rules_of(model, "0.5.23");
  auto fp8 = sglang_cell_size(model, sglang_dtype("fp8_e4m3"), Parallelism{8, 1, 1, false}, rules);
  EXPECT_EQ(fp8.bytes_per_token, (656 + 132) * 61);
  auto bf16 = sglang_cell_size(model, sglang_dtype("bf16"), Parallelism{8, 1, 1, false}, rules);
  EXPECT_EQ(bf16.bytes_per_token, 576 * 2 * 61 + 132 * 61);
  // The NEXTN draft layer shares the pool when speculative decoding is on.
  rules.speculative_draft_layers = 1;
  auto mtp = sglang_cell_size(model, sglang_dtype("fp8_e4m3"), Parallelism{8, 1, 1, false}, rules);
  EXPECT_EQ(mtp.bytes_per_token, static_cast<int64_t>((656 + 132) * 61 * (1 + 1.0 / 61)));
}

// SGLang reads the recurrent state dtype from the model config on newer releases (a
// downstream project documents it at v0.5.14; 0.5.10 assumed with PR #18444); older ones
// used float32 whatever the config said.
TEST(PlanMamba, SsmDtypeFromTheModelConfigOnNewerSglang) {
  auto model = qwen35_397b();
  model.linear_attention->ssm_dtype = "bfloat16";
  auto newer = sglang_mamba_state(model, Parallelism{8, 1, 1, false}, rules_of(model, "0.5.15"));
  auto older = sglang_mamba_state(model, Parallelism{8, 1, 1, false}, rules_of(model, "0.5.9"));
  ASSERT_TRUE(newer && older);
  EXPECT_EQ(older->ssm_bytes_per_layer, 2 * newer->ssm_bytes_per_layer);
  PlanOptions flag;
  flag.engine_version = "0.5.9";
  flag.mamba_ssm_dtype = "bfloat16";
  auto flagged = sglang_mamba_state(model, Parallelism{8, 1, 1, false},
                                    sizing_rules(model, kvaudit::testing::engine("sglang"),
                                                 *engines::parse_version("0.5.9"), flag));
  EXPECT_EQ(flagged->ssm_bytes_per_layer, newer->ssm_bytes_per_layer);
}

TEST(PlanCapacity, VllmDefaultUtilisationPerRelease) {
  auto model = llama31_8b();
  PlanOptions options;
  options.engine = "vllm";
  options.kv_cache_dtypes = {"bf16"};
  options.gpu_memory_bytes = int64_t{80} << 30;
  options.weight_bytes_per_gpu = int64_t{16} << 30;
  options.engine_version = "0.33.0";
  EXPECT_DOUBLE_EQ(plan_capacity(kvaudit::testing::registry(), model, options).memory_fraction,
                   0.92);
  options.engine_version = "0.15.0";
  EXPECT_DOUBLE_EQ(plan_capacity(kvaudit::testing::registry(), model, options).memory_fraction,
                   0.9);
  // Per-token-head INT8 pages carry an FP32 scale per token per head for K and V.
  options.engine_version = "0.33.0";
  options.kv_cache_dtypes = {"int8_per_token_head", "nvfp4"};
  auto plan = plan_capacity(kvaudit::testing::registry(), model, options);
  EXPECT_EQ(plan.rows[0].cell_bytes_per_token_per_gpu, 32 * 8 * (2 * 128 + 2 * 4));
  EXPECT_EQ(plan.rows[1].cell_bytes_per_token_per_gpu, 32 * 8 * 2 * (64 + 8));
}

TEST(PlanCapacity, RejectsUnknownDtype) {
  PlanOptions options;
  options.kv_cache_dtypes = {"int3"};
  EXPECT_THROW(plan_capacity(kvaudit::testing::registry(), llama31_8b(), options), InputError);
}

}  // namespace
}  // namespace kvaudit::plan
