// End-to-end tests on the log fixtures (tests/fixtures/logs/SOURCES.md): launch
// splitting, resolved dtype, scale fallback, failures, and plan --from-log putting
// every printed capacity of a real log inside its predicted interval.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <iostream>

#include "../plan/plan_models.h"
#include "common/registry.h"
#include "logs/logs.h"
#include "util/util.h"

namespace kvaudit::logs {
namespace {

using plan::test_models::dense;
using plan::test_models::llama31_8b;
using plan::test_models::qwen35_397b;
using plan::test_models::qwen3_0_6b;

std::string fixture(const char* name) {
  return std::string(KVAUDIT_TEST_DIR) + "/fixtures/logs/" + name;
}

LogScan scan(const char* name) {
  return scan_log_file(kvaudit::testing::registry(), fixture(name));
}

// Every check of a prediction lands inside; returns how many checks ran.
size_t expect_all_inside(const plan::LogPrediction& p) {
  for (const auto& c : p.checks)  // printed for the record (ctest -V)
    std::cout << "  [from-log] " << c.id << ": printed " << c.printed << " in [" << c.predicted.lo
              << ", " << c.predicted.hi << "]\n";
  for (const auto& c : p.checks)
    EXPECT_TRUE(c.inside) << c.id << ": printed " << c.printed << " predicted [" << c.predicted.lo
                          << ", " << c.predicted.hi << "] " << c.derivation;
  return p.checks.size();
}

TEST(Journal, SplitsTwoLaunchesAndReportsTheBf16One) {
  auto s = scan("journal_qwen35_fp8_then_bf16.log");
  ASSERT_EQ(s.launches.size(), 2u);
  const Launch& fp8 = s.launches[0];
  const Launch& bf16 = s.launches[1];
  EXPECT_EQ(fp8.start_time, "Mar 07 14:02:11");
  EXPECT_EQ(bf16.start_time, "Mar 07 15:41:11");
  EXPECT_EQ(fp8.kv_cache_dtype_requested, "auto");
  EXPECT_EQ(fp8.kv_cache_dtype_resolved, "fp8_e4m3");
  EXPECT_EQ(bf16.kv_cache_dtype_resolved, "bf16");
  EXPECT_EQ(*fp8.max_total_tokens, 3147708);
  EXPECT_EQ(*bf16.max_total_tokens, 1573854);
  EXPECT_EQ(bf16.tp, 8);
  EXPECT_EQ(bf16.ranks_seen.size(), 8u);
  EXPECT_TRUE(fp8.ready);
  EXPECT_TRUE(bf16.ready);
  EXPECT_EQ(bf16.model_path, "/models/Qwen3.5-397B-A17B-NVFP4");
  // The BF16 launch passes --expect kv_cache_dtype=bf16, the FP8 one does not.
  auto ok = check_expectations(kvaudit::testing::registry(), bf16,
                               {parse_expectation("kv_cache_dtype=bf16")});
  EXPECT_TRUE(ok[0].met);
  auto bad = check_expectations(kvaudit::testing::registry(), fp8,
                                {parse_expectation("kv_cache_dtype=bfloat16")});
  EXPECT_FALSE(bad[0].met);
  EXPECT_EQ(bad[0].actual, "fp8_e4m3");
  auto report = to_report(s, false, ok);
  EXPECT_EQ(report.payload["launches"].size(), 1u);
  EXPECT_EQ(report.payload["launches"][0]["kv_cache_dtype_resolved"], "bf16");
  EXPECT_EQ(report.payload["launches"][0]["max_total_tokens"], 1573854);
}

TEST(Journal, Fp8LaunchWarningAloneIsNotProofButTheCheckpointIs) {
  auto s = scan("journal_qwen35_fp8_then_bf16.log");
  Launch fp8 = s.launches[0];
  ASSERT_EQ(fp8.scale_messages.size(), 8u);  // one SGLang warning per TP rank
  EXPECT_FALSE(fp8.scale_fallback.has_value());
  bool unverified = false;
  for (const auto& f : fp8.findings) unverified |= f.id == "fp8-scale-unverified";
  EXPECT_TRUE(unverified);
  EXPECT_EQ(s.launches[1].scale_fallback, false);  // BF16: no scales involved
  // The checkpoint it served ships no k/v scales: now the log proves the fallback. The
  // default policy cannot judge the damage from a log (a warning); the motivating user's
  // lossless policy makes it critical.
  auto model = qwen35_397b();
  model.has_weights = true;
  model.tensor_count = 1234;
  Launch lossless = fp8;
  cross_check_checkpoint(kvaudit::testing::registry(), fp8, model, false);
  ASSERT_TRUE(fp8.scale_fallback.has_value());
  EXPECT_TRUE(*fp8.scale_fallback);
  bool warning = false, capacity = false;
  for (const auto& f : fp8.findings) {
    warning |= f.id == "fp8-unit-scale" && f.severity == report::Severity::warning;
    capacity |= f.id == "capacity-as-planned";
  }
  EXPECT_TRUE(warning);
  lossless.kv_policy = audit::KvPolicy::lossless;
  cross_check_checkpoint(kvaudit::testing::registry(), lossless, model, false);
  bool critical = false;
  for (const auto& f : lossless.findings)
    critical |= f.id == "fp8-unit-scale" && f.severity == report::Severity::critical;
  EXPECT_TRUE(critical);
  EXPECT_TRUE(capacity);  // 3,147,708 FP8 tokens reproduced from the printed memory
  // One k_scale for one of the 15 attention layers: the other 14 still run at 1.0.
  Launch partial = s.launches[0];
  checkpoint::ScaleTensor k;
  k.name = "model.layers.3.self_attn.k_proj.k_scale";
  k.layer = 3;
  k.convention = "modelopt_proj";
  k.values = {0.05f};
  model.kv_scales.push_back(k);
  model.quant = checkpoint::QuantFacts{};
  model.quant->method = "modelopt";
  cross_check_checkpoint(kvaudit::testing::registry(), partial, model, false);
  ASSERT_TRUE(partial.scale_fallback.has_value());
  EXPECT_TRUE(*partial.scale_fallback);
  EXPECT_NE(partial.scale_fallback_reason.find("14 of 15"), std::string::npos)
      << partial.scale_fallback_reason;
  // Scales for every layer of a Qwen3.5 checkpoint: SGLang drops them before PR #31220 and
  // loads them after, and the log prints no version: it cannot tell.
  model.architecture = "Qwen3_5MoeForConditionalGeneration";
  model.kv_scales.clear();
  for (const auto& layer : model.layers) {
    if (layer.kind == checkpoint::LayerKind::linear_attention) continue;
    for (const char* role : {"k", "v"}) {
      checkpoint::ScaleTensor t;
      t.name = fmt::format("model.layers.{}.self_attn.{}_proj.{}_scale", layer.index, role, role);
      t.layer = layer.index;
      t.role = role[0] == 'k' ? checkpoint::ScaleRole::k : checkpoint::ScaleRole::v;
      t.convention = "modelopt_proj";
      t.values = {0.05f};
      model.kv_scales.push_back(t);
    }
  }
  Launch versioned = s.launches[0];
  cross_check_checkpoint(kvaudit::testing::registry(), versioned, model, false);
  EXPECT_FALSE(versioned.scale_fallback.has_value()) << versioned.scale_fallback_reason;
  EXPECT_NE(versioned.scale_fallback_reason.find("sglang-31220-qwen3.5"), std::string::npos)
      << versioned.scale_fallback_reason;
  // With the version printed, it can.
  Launch fixed = s.launches[0];
  fixed.engine_version = "0.5.23";
  cross_check_checkpoint(kvaudit::testing::registry(), fixed, model, false);
  EXPECT_EQ(fixed.scale_fallback, false) << fixed.scale_fallback_reason;
  Launch broken = s.launches[0];
  broken.engine_version = "0.5.15";
  cross_check_checkpoint(kvaudit::testing::registry(), broken, model, false);
  EXPECT_EQ(broken.scale_fallback, true) << broken.scale_fallback_reason;
}

TEST(Journal, FromLogPredictsBothLaunchesAndTheOtherDtype) {
  auto s = scan("journal_qwen35_fp8_then_bf16.log");
  plan::PlanOptions options;
  for (const Launch& l : s.launches) {
    auto p = plan::predict_from_log(kvaudit::testing::registry(), qwen35_397b(), l.memory, options);
    EXPECT_GE(expect_all_inside(p), 2u);
    for (const auto& row : p.rows) {
      if (row.kv_cache_dtype == "bf16") {
        EXPECT_TRUE(row.max_total_tokens.contains(1573854));
      }
      if (row.kv_cache_dtype == "fp8_e4m3") {
        EXPECT_TRUE(row.max_total_tokens.contains(3147708));
      }
    }
  }
}

TEST(RealLogs, SglangLlama8bTokenCountFromMemoryFigures) {
  auto s = scan("sglang_llama8b_single_gpu.log");
  ASSERT_EQ(s.launches.size(), 1u);
  const Launch& l = s.launches[0];
  EXPECT_EQ(l.engine, "sglang");
  EXPECT_EQ(l.kv_cache_dtype_resolved, "bf16");
  EXPECT_DOUBLE_EQ(*l.memory.total_before_load_gib, 44.00);
  EXPECT_DOUBLE_EQ(*l.memory.avail_after_weights_gib, 28.91);
  // No server_args in the excerpt: SGLang's default for the 46,068-MiB GPU.
  const auto& table =
      *kvaudit::testing::engine("sglang").capacity.mem_fraction_for(*engines::parse_version(""));
  plan::PlanOptions options;
  options.memory_fraction =
      plan::sglang_default_mem_fraction(table, plan::find_gpu("L40S").memory_mib, 1, 1, false, 1)
          .mem_fraction_static;
  auto p = plan::predict_from_log(kvaudit::testing::registry(), llama31_8b(), l.memory, options);
  EXPECT_EQ(expect_all_inside(p), 2u);
  const auto& tokens = p.checks[0];
  EXPECT_EQ(tokens.id, "sglang_max_total_num_tokens");
  EXPECT_EQ(tokens.printed, 183133);
  // Two-decimal GiB rounding of 44.00 and 28.91 allows (0.01 + 0.01 x 0.149) GiB of rest
  // memory: 0.01149 GiB / 131,072 B per token = 94 tokens. The interval is no wider.
  EXPECT_LE(tokens.predicted.hi - tokens.predicted.lo, 95);
}

TEST(RealLogs, SglangQwen35Tp2PoolAndMambaSizes) {
  auto s = scan("sglang_qwen35_397b_tp2_mamba.log");
  ASSERT_EQ(s.launches.size(), 1u);
  const Launch& l = s.launches[0];
  EXPECT_EQ(l.tp, 0);           // no server_args line: not printed
  EXPECT_EQ(l.tp_at_least, 2);  // but TP0 and TP1 printed lines
  EXPECT_EQ(*l.memory.mamba_slots, 82);
  EXPECT_EQ(*l.max_total_tokens, 580364);
  auto p = plan::predict_from_log(
      kvaudit::testing::registry(), qwen35_397b(),
      plan::reconcile_log_flags(kvaudit::testing::registry(), l.memory, plan::PlanOptions{}, {}));
  ASSERT_FALSE(p.findings.empty());
  EXPECT_EQ(p.findings[0].id, "log-tp-from-ranks");
  // Pool size, state size, and max_running_requests=1 within 82 slots / 5 per request.
  EXPECT_EQ(expect_all_inside(p), 3u);
  for (const auto& c : p.checks) {
    if (c.id == "sglang_running_requests_state_pool") {
      EXPECT_EQ(c.printed, 1);
      EXPECT_EQ(c.predicted.hi, 82 / 5);
    }
    if (c.id == "sglang_mamba_ssm_size") {
      EXPECT_EQ(c.predicted.lo, 82);
      EXPECT_EQ(c.predicted.hi, 82);
    }
    // 4.15 GiB +-0.005 over 7,680 B of K per token: 1,398 tokens wide, as the rounding requires.
    if (c.id == "sglang_pool_size") {
      EXPECT_LE(c.predicted.hi - c.predicted.lo, 1398);
    }
  }
  // The pool that held 580,364 BF16 tokens holds twice as many FP8 tokens.
  for (const auto& row : p.rows) {
    if (row.kv_cache_dtype == "fp8_e4m3") {
      EXPECT_TRUE(row.max_total_tokens.contains(2 * 580364));
    }
  }
}

TEST(RealLogs, VllmV0Qwen3BlocksAndConcurrency) {
  auto s = scan("vllm_v0_qwen3_0_6b.log");
  ASSERT_EQ(s.launches.size(), 1u);
  const Launch& l = s.launches[0];
  EXPECT_EQ(l.engine, "vllm");
  EXPECT_TRUE(l.memory.vllm_v0);
  EXPECT_EQ(*l.memory.num_gpu_blocks, 36184);
  EXPECT_EQ(*l.max_total_tokens, 36184 * 16);
  plan::PlanOptions options;
  options.engine = "vllm";
  options.kv_cache_dtypes = {"bf16"};  // V0 default: the model dtype
  auto p = plan::predict_from_log(kvaudit::testing::registry(), qwen3_0_6b(), l.memory, options);
  EXPECT_EQ(expect_all_inside(p), 2u);
  // 0.01 GiB over a 1,835,008-B block (16 x 114,688): at most 6 blocks of slack.
  EXPECT_LE(p.checks[0].predicted.hi - p.checks[0].predicted.lo, 6);
}

TEST(RealLogs, VllmV0FailedLaunchWithNoKvMemory) {
  auto s = scan("vllm_v0_qwen25_7b_no_kv_memory.log");
  ASSERT_EQ(s.launches.size(), 1u);
  const Launch& l = s.launches[0];
  EXPECT_DOUBLE_EQ(*l.memory.available_kv_gib, -1.05);
  EXPECT_EQ(*l.memory.num_gpu_blocks, 0);
  EXPECT_FALSE(l.ready);
  ASSERT_FALSE(l.failures.empty());
  EXPECT_EQ(l.failures[0].kind, "traceback");
  bool failed = false;
  for (const auto& f : l.findings) failed |= f.id == "launch-failed";
  EXPECT_TRUE(failed);
  plan::PlanOptions options;
  options.engine = "vllm";
  options.kv_cache_dtypes = {"bf16"};
  auto p = plan::predict_from_log(kvaudit::testing::registry(), dense("qwen2", 28, 4, 128),
                                  l.memory, options);
  EXPECT_EQ(expect_all_inside(p), 2u);
}

TEST(RealLogs, VllmV1EarlyConcurrencyFromBlocks) {
  auto s = scan("vllm_v1_early_llama70b.log");
  const Launch& l = s.launches.back();
  EXPECT_EQ(*l.memory.num_gpu_blocks, 1381);
  EXPECT_EQ(*l.memory.concurrency_context, 2048);
  plan::PlanOptions options;
  options.engine = "vllm";
  options.kv_cache_dtypes = {"bf16"};
  auto p = plan::predict_from_log(kvaudit::testing::registry(), dense("llama", 80, 8, 128),
                                  l.memory, options);
  EXPECT_EQ(expect_all_inside(p), 1u);
}

TEST(RealLogs, VllmV1NewFormatWithFp8) {
  auto s = scan("vllm_v1_qwen36_fp8.log");
  ASSERT_EQ(s.launches.size(), 1u);
  const Launch& l = s.launches[0];
  EXPECT_EQ(l.engine, "vllm");
  EXPECT_EQ(l.engine_version, "0.24.0");
  EXPECT_EQ(l.kv_cache_dtype_requested, "fp8");
  EXPECT_EQ(l.kv_cache_dtype_resolved, "fp8_e4m3");
  EXPECT_FALSE(l.scale_fallback.has_value());
  EXPECT_EQ(*l.max_total_tokens, 567978);
  EXPECT_EQ(*l.memory.concurrency_context, 131072);
  EXPECT_DOUBLE_EQ(*l.memory.concurrency_x, 4.33);
  EXPECT_EQ(l.model_path, "~/.cache/huggingface/qwen3.6-35b-a3b-nvfp4");
}

TEST(RealLogs, AnsiColoursAndCrlf) {
  auto s = scan("vllm_v1_ansi_crlf.log");
  ASSERT_EQ(s.launches.size(), 1u);
  EXPECT_DOUBLE_EQ(*s.launches[0].memory.available_kv_gib, 12.57);
  EXPECT_EQ(*s.launches[0].max_total_tokens, 53136);
  EXPECT_DOUBLE_EQ(*s.launches[0].weights_gib, 11.55);
}

TEST(RealLogs, InterleavedRanksKeepTheMinimum) {
  auto s = scan("sglang_tp8_rank_lines.log");
  ASSERT_EQ(s.launches.size(), 1u);
  EXPECT_DOUBLE_EQ(*s.launches[0].memory.total_before_load_gib, 137.29);
  EXPECT_EQ(s.launches[0].tp, 0);  // no server_args in the excerpt
  EXPECT_EQ(s.launches[0].tp_at_least, 8);
  EXPECT_TRUE(s.launches[0].memory.tp_ranks_contiguous);
}

TEST(RealLogs, CrashedSglangLaunch) {
  auto s = scan("sglang_qwen3next_tp8_crash.log");
  ASSERT_EQ(s.launches.size(), 1u);
  const Launch& l = s.launches[0];
  EXPECT_EQ(l.engine, "sglang");
  EXPECT_FALSE(l.ready);
  ASSERT_GE(l.failures.size(), 3u);  // two tracebacks and the AssertionError line
  bool assertion = false;
  for (const auto& f : l.failures) assertion |= f.kind == "exception" && f.text == "AssertionError";
  EXPECT_TRUE(assertion);
}

}  // namespace
}  // namespace kvaudit::logs
