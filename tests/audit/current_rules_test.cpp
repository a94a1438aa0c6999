// The checks the engine model through SGLang 0.5.23 / vLLM 0.33.0 enables: each fires
// where the engines' newest (or older) behaviour says it must, and stays quiet where it
// must not. Versions are pinned on both sides of each rule's bound.
#include <gtest/gtest.h>

#include <set>

#include "audit/audit.h"
#include "common/fixtures.h"
#include "common/registry.h"

namespace kvaudit::audit {
namespace {

namespace fs = std::filesystem;
using kvaudit::testing::fixture_checkpoint;
using report::Severity;

struct Audited {
  CheckResult result;
  const report::Finding* find(const std::string& id) const {
    for (const auto& finding : result.findings)
      if (finding.id == id) return &finding;
    return nullptr;
  }
  bool has(const std::string& id) const { return find(id) != nullptr; }
  bool critical() const { return fails_gate(result.findings, FailOn::critical); }
  std::string ids() const {
    std::string out;
    for (const auto& f : result.findings) out += f.id + " ";
    return out;
  }
  std::string text(const std::string& id) const {
    const auto* f = find(id);
    if (!f) return "";
    std::string out = f->title + " | " + f->consequence + " | " + f->fix + " | " + f->reference;
    for (const auto& e : f->evidence) out += " | " + e.key + " = " + e.value;
    return out;
  }
};

Audited check(const checkpoint::ModelFacts& model, const std::string& engine, const std::string& kv,
              const std::string& version, engines::LaunchFlags flags = {}) {
  CheckInput input;
  input.model = model;
  flags.engine = engine;
  flags.kv_cache_dtype = kv;
  flags.kv_cache_dtype_flag = kv == "auto" ? "" : "--kv-cache-dtype";
  flags.engine_version = version;
  input.flags = flags;
  input.engine = &kvaudit::testing::engine(engine);
  input.version_given = !version.empty();
  return Audited{run_check(input)};
}

Audited check(const std::string& fixture, const std::string& engine, const std::string& kv,
              const std::string& version, engines::LaunchFlags flags = {}) {
  return check(checkpoint::read_checkpoint(fixture_checkpoint(fixture)), engine, kv, version,
               flags);
}

// The acceptance case: Qwen3.5 ModelOpt with calibrated k_proj/v_proj scales.
TEST(CurrentRules, SglangQwen35DroppedScalesBeforePr31220Only) {
  Audited old = check("qwen35-modelopt-fp8-kv-scales", "sglang", "auto", "0.5.15");
  ASSERT_TRUE(old.has("scales-dropped")) << old.ids();
  EXPECT_EQ(old.find("scales-dropped")->severity, Severity::critical);
  EXPECT_NE(old.text("scales-dropped").find("31220"), std::string::npos);
  EXPECT_NE(old.text("scales-dropped").find("inferred"), std::string::npos)
      << "the bound is inferred and the finding says so";
  EXPECT_TRUE(old.has("fp8-unit-scale"));
  EXPECT_TRUE(old.critical());

  Audited fixed = check("qwen35-modelopt-fp8-kv-scales", "sglang", "auto", "0.5.23");
  EXPECT_FALSE(fixed.critical()) << fixed.ids();
  EXPECT_FALSE(fixed.has("scales-dropped"));
  EXPECT_EQ(engines::scale_source_name(fixed.result.resolved.scale_source), "checkpoint");
  EXPECT_EQ(fixed.result.resolved.loaded_scale_names.size(), 30u);  // 15 layers x k, v
  EXPECT_EQ(fixed.result.resolved.kv_cache_dtype, "fp8_e4m3");
}

TEST(CurrentRules, VllmExplicitDtypeBeatsACompressedTensorsSchemeOnNewReleasesOnly) {
  Audited now = check("llama-ct-fp8-kv", "vllm", "bfloat16", "0.33.0");
  EXPECT_FALSE(now.critical()) << now.ids();
  EXPECT_FALSE(now.has("kv-quant-overrides-cli"));
  EXPECT_EQ(now.result.resolved.kv_cache_dtype, "bf16");
  Audited before = check("llama-ct-fp8-kv", "vllm", "bfloat16", "0.19.0");
  ASSERT_TRUE(before.has("kv-quant-overrides-cli")) << before.ids();
  EXPECT_EQ(before.find("kv-quant-overrides-cli")->severity, Severity::critical);
  EXPECT_NE(before.text("kv-quant-overrides-cli").find("42782"), std::string::npos);
  // auto still promotes the scheme to fp8 on new releases, with the checkpoint's scales.
  Audited promoted = check("llama-ct-fp8-kv", "vllm", "auto", "0.33.0");
  EXPECT_EQ(promoted.result.resolved.kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(engines::scale_source_name(promoted.result.resolved.scale_source), "checkpoint");
}

TEST(CurrentRules, VllmAutoRunsModelOptNvfp4AsAnNvfp4Cache) {
  Audited now = check("qwen35-modelopt-nvfp4-kv", "vllm", "auto", "0.33.0");
  EXPECT_EQ(now.result.resolved.kv_cache_dtype, "nvfp4");
  EXPECT_TRUE(now.has("kv-auto-quantized")) << now.ids();
  EXPECT_TRUE(now.has("nvfp4-unit-global-scale"));  // no k/v scales: global scale 1.0
  EXPECT_FALSE(now.has("fp8-unit-scale"));
  Audited old = check("qwen35-modelopt-nvfp4-kv", "vllm", "auto", "0.19.0");
  EXPECT_EQ(old.result.resolved.kv_cache_dtype, "bf16");
  EXPECT_TRUE(old.has("kv-declared-not-enabled"));
  EXPECT_FALSE(old.has("nvfp4-unit-global-scale"));
  // SGLang never auto-selects FP4.
  Audited sglang = check("qwen35-modelopt-nvfp4-kv", "sglang", "auto", "0.5.23");
  EXPECT_EQ(sglang.result.resolved.kv_cache_dtype, "bf16");
}

TEST(CurrentRules, VllmModelOptMixedPrecisionStaysInTheModelDtype) {
  auto model = checkpoint::read_checkpoint(fixture_checkpoint("qwen35-modelopt-nvfp4-kv"));
  model.quant->kv_cache_quant_algo = "MIXED_PRECISION";
  Audited run = check(model, "vllm", "auto", "0.33.0");
  EXPECT_EQ(run.result.resolved.kv_cache_dtype, "bf16");
  EXPECT_EQ(run.result.resolved.rule_id, "vllm-auto-modelopt-mixed");
  model.quant->kv_cache_quant_algo = "FP6";  // unknown to vLLM: warning, then auto
  Audited unknown = check(model, "vllm", "auto", "0.33.0");
  EXPECT_EQ(unknown.result.resolved.rule_id, "vllm-auto-modelopt-unknown");
  EXPECT_EQ(unknown.result.resolved.kv_cache_dtype, "bf16");
  model.quant->kv_cache_quant_algo = "FP8";
  EXPECT_EQ(check(model, "vllm", "auto", "0.33.0").result.resolved.kv_cache_dtype, "fp8_e4m3");
}

TEST(CurrentRules, PerTokenHeadAndTurboQuantIgnoreScalesByDesign) {
  for (const char* dtype : {"int8_per_token_head", "fp8_per_token_head", "turboquant_4bit_nc"}) {
    Audited run = check("llama-modelopt-bf16-scales", "vllm", dtype, "0.33.0");
    EXPECT_FALSE(run.has("kv-dtype-rejected")) << dtype;
    EXPECT_FALSE(run.has("fp8-unit-scale")) << dtype << ": " << run.ids();
    EXPECT_FALSE(run.has("scale-values-unit")) << dtype;
    EXPECT_TRUE(run.has("scales-ignored-by-design")) << dtype << ": " << run.ids();
    EXPECT_EQ(engines::scale_source_name(run.result.resolved.scale_source), "dynamic_by_design");
    // No scale tensors at all: still no scale-1.0 alarm.
    Audited bare = check("llama-bf16-plain", "vllm", dtype, "0.33.0");
    EXPECT_FALSE(bare.has("fp8-unit-scale")) << dtype;
    EXPECT_FALSE(bare.critical()) << dtype << ": " << bare.ids();
  }
  // Releases before the dtypes existed reject them.
  EXPECT_TRUE(
      check("llama-bf16-plain", "vllm", "int8_per_token_head", "0.17.0").has("kv-dtype-rejected"));
  EXPECT_TRUE(
      check("llama-bf16-plain", "vllm", "int4_per_token_head", "0.20.0").has("kv-dtype-rejected"));
  EXPECT_FALSE(
      check("llama-bf16-plain", "vllm", "int4_per_token_head", "0.30.0").has("kv-dtype-rejected"));
}

TEST(CurrentRules, VllmRemovedCalculateKvScalesStopsStartUp) {
  engines::LaunchFlags flags;
  flags.calculate_kv_scales = true;
  Audited removed = check("llama-ct-fp8-kv", "vllm", "fp8", "0.27.0", flags);
  ASSERT_TRUE(removed.has("startup-failure")) << removed.ids();
  EXPECT_NE(removed.text("startup-failure").find("unrecognized arguments: --calculate-kv-scales"),
            std::string::npos);
  Audited deprecated = check("llama-ct-fp8-kv", "vllm", "fp8", "0.26.0", flags);
  EXPECT_FALSE(deprecated.has("startup-failure"));
  EXPECT_TRUE(deprecated.has("flag-deprecated"));
  Audited old = check("llama-ct-fp8-kv", "vllm", "fp8", "0.15.0", flags);
  EXPECT_FALSE(old.has("flag-deprecated"));
  EXPECT_FALSE(old.has("startup-failure"));
}

TEST(CurrentRules, SkipLayersKeepSlidingWindowLayersInTheModelDtype) {
  engines::LaunchFlags flags;
  flags.kv_cache_dtype_skip_layers = "sliding_window";
  Audited run = check("gpt-oss-20b", "vllm", "fp8", "0.33.0", flags);
  ASSERT_TRUE(run.has("kv-skip-layers")) << run.ids();
  EXPECT_EQ(run.result.resolved.skipped_layers.size(), 12u);  // 24 layers, alternating
  ASSERT_TRUE(run.has("fp8-unit-scale"));
  EXPECT_NE(run.find("fp8-unit-scale")->title.find("12 quantized layer(s)"), std::string::npos);
  // On a model without sliding-window layers the flag does nothing: say so.
  Audited none = check("llama-bf16-plain", "vllm", "fp8", "0.33.0", flags);
  EXPECT_TRUE(none.has("kv-skip-layers-no-effect"));
  EXPECT_TRUE(none.result.resolved.skipped_layers.empty());
  // Layer indices work too; before the flag existed the launch fails.
  flags.kv_cache_dtype_skip_layers = "0,1";
  EXPECT_EQ(check("llama-bf16-plain", "vllm", "fp8", "0.33.0", flags)
                .result.resolved.skipped_layers.size(),
            2u);
  EXPECT_TRUE(check("llama-bf16-plain", "vllm", "fp8", "0.15.0", flags).has("startup-failure"));
  EXPECT_FALSE(check("llama-bf16-plain", "vllm", "fp8", "0.33.0").has("kv-skip-layers"));
}

TEST(CurrentRules, VllmFloat16CacheOnABf16ModelIsCorrupted) {
  Audited run = check("llama-bf16-plain", "vllm", "float16", "0.33.0");
  ASSERT_TRUE(run.has("kv-dtype-corrupts")) << run.ids();
  EXPECT_EQ(run.find("kv-dtype-corrupts")->severity, Severity::critical);
  EXPECT_NE(run.text("kv-dtype-corrupts").find("54338"), std::string::npos);
  EXPECT_FALSE(run.has("fp16-serving-bf16-model"));  // the more severe finding replaces it
  EXPECT_FALSE(check("llama-bf16-plain", "vllm", "bfloat16", "0.33.0").has("kv-dtype-corrupts"));
  // An fp16 model's fp16 cache is fine.
  auto fp16 = checkpoint::read_checkpoint(fixture_checkpoint("llama-bf16-plain"));
  fp16.torch_dtype = "float16";
  EXPECT_FALSE(check(fp16, "vllm", "float16", "0.33.0").has("kv-dtype-corrupts"));
}

TEST(CurrentRules, SglangDropsFusedQkvScalesVllmLoadsThem) {
  Audited sglang = check("llama-ct-fused-qkv-scales", "sglang", "fp8_e4m3", "0.5.23");
  ASSERT_TRUE(sglang.has("scales-dropped")) << sglang.ids();
  EXPECT_NE(sglang.text("scales-dropped").find("39943"), std::string::npos);
  EXPECT_TRUE(sglang.has("fp8-unit-scale"));
  Audited vllm = check("llama-ct-fused-qkv-scales", "vllm", "auto", "0.33.0");
  EXPECT_FALSE(vllm.has("scales-dropped")) << vllm.ids();
  EXPECT_FALSE(vllm.critical());
  EXPECT_TRUE(check("llama-ct-fused-qkv-scales", "vllm", "auto", "0.11.0").has("scales-dropped"));
}

TEST(CurrentRules, SglangAutoResolvesCompressedTensorsToFp8AfterPr35455) {
  Audited now = check("llama-ct-fp8-kv", "sglang", "auto", "0.5.23");
  EXPECT_EQ(now.result.resolved.kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(now.result.resolved.rule_id, "sglang-auto-ct-fp8");
  EXPECT_EQ(engines::scale_source_name(now.result.resolved.scale_source), "checkpoint");
  EXPECT_FALSE(now.critical()) << now.ids();
  Audited old = check("llama-ct-fp8-kv", "sglang", "auto", "0.5.15");
  EXPECT_EQ(old.result.resolved.kv_cache_dtype, "bf16");
  EXPECT_TRUE(old.has("kv-declared-not-enabled"));
}

TEST(CurrentRules, SglangFp4E2m1AbortsOnNewReleasesAndTheNewFp4DtypesAreAccepted) {
  Audited now = check("llama-bf16-plain", "sglang", "fp4_e2m1", "0.5.23");
  ASSERT_TRUE(now.has("startup-failure")) << now.ids();
  EXPECT_NE(now.text("startup-failure").find("Use --kv-cache-dtype=fp4_mx_block16"),
            std::string::npos);
  EXPECT_FALSE(now.has("kv-dtype-rejected"));  // argparse takes it; start-up stops
  EXPECT_FALSE(check("llama-bf16-plain", "sglang", "fp4_e2m1", "0.5.15").has("startup-failure"));
  for (const char* dtype : {"nvfp4", "fp4_mx_block16", "mxfp8"}) {
    Audited run = check("llama-bf16-plain", "sglang", dtype, "0.5.23");
    EXPECT_FALSE(run.has("kv-dtype-rejected")) << dtype;
    EXPECT_FALSE(run.has("startup-failure")) << dtype;
    EXPECT_TRUE(run.result.resolved.quantized) << dtype;
    EXPECT_TRUE(check("llama-bf16-plain", "sglang", dtype, "0.5.9").has("kv-dtype-rejected"));
  }
  // Block-scaled dtypes compute their scales: no scale-1.0 alarm; NVFP4's global scale does.
  EXPECT_FALSE(
      check("llama-bf16-plain", "sglang", "fp4_mx_block16", "0.5.23").has("fp8-unit-scale"));
  EXPECT_TRUE(
      check("llama-bf16-plain", "sglang", "nvfp4", "0.5.23").has("nvfp4-unit-global-scale"));
}

TEST(CurrentRules, SglangParamPathWithoutALoaderStopsStartUp) {
  engines::LaunchFlags flags;
  flags.quantization_param_path = "/scales.json";
  Audited qwen = check("qwen35-modelopt-fp8-kv-scales", "sglang", "fp8_e4m3", "0.5.23", flags);
  ASSERT_TRUE(qwen.has("startup-failure")) << qwen.ids();
  EXPECT_NE(qwen.text("startup-failure").find("does not support loading scaling factors"),
            std::string::npos);
  EXPECT_NE(qwen.text("startup-failure").find("Qwen3_5MoeForConditionalGeneration"),
            std::string::npos);
  Audited llama = check("llama-bf16-plain", "sglang", "fp8_e4m3", "0.5.23", flags);
  EXPECT_FALSE(llama.has("startup-failure")) << llama.ids();
  EXPECT_TRUE(llama.has("param-path-not-applied"));
  // Only an fp8_e4m3 cache reads the JSON.
  EXPECT_FALSE(check("qwen35-modelopt-fp8-kv-scales", "sglang", "bf16", "0.5.23", flags)
                   .has("startup-failure"));
}

TEST(CurrentRules, LoneVScaleAbortsInBothEnginesZeroOnlyInVllm) {
  for (const char* engine : {"sglang", "vllm"}) {
    Audited run =
        check("llama-modelopt-v-only", engine, engine == std::string("vllm") ? "fp8" : "fp8_e4m3",
              engine == std::string("vllm") ? "0.33.0" : "0.5.23");
    ASSERT_TRUE(run.has("startup-failure")) << engine << ": " << run.ids();
    EXPECT_NE(run.text("startup-failure").find("AssertionError"), std::string::npos) << engine;
    EXPECT_NE(run.text("startup-failure").find("has a v_scale but no usable k_scale"),
              std::string::npos)
        << engine;
  }
  Audited vllm = check("llama-modelopt-zero-kv", "vllm", "fp8", "0.33.0");
  ASSERT_TRUE(vllm.has("startup-failure")) << vllm.ids();
  EXPECT_NE(vllm.text("startup-failure").find("exactly 0.0"), std::string::npos);
  Audited sglang = check("llama-modelopt-zero-kv", "sglang", "fp8_e4m3", "0.5.23");
  EXPECT_FALSE(sglang.has("startup-failure")) << sglang.ids();
  EXPECT_TRUE(sglang.has("scale-values-invalid"));  // still a broken export
  // The NaN k_scale of another fixture fails both engines' assertion.
  EXPECT_TRUE(
      check("llama-modelopt-nan-scales", "sglang", "fp8_e4m3", "0.5.23").has("startup-failure"));
  // 16-bit caches never process the scales.
  EXPECT_FALSE(check("llama-modelopt-v-only", "vllm", "bfloat16", "0.33.0").has("startup-failure"));
}

TEST(CurrentRules, VllmNonScalarScalesAbortExceptCompressedTensorsAttnHead) {
  auto model = checkpoint::read_checkpoint(fixture_checkpoint("llama-modelopt-bf16-scales"));
  for (auto& scale : model.kv_scales) scale.values.assign(8, 0.05f);
  Audited modelopt = check(model, "vllm", "fp8", "0.33.0");
  EXPECT_TRUE(modelopt.has("scale-per-head-unsupported")) << modelopt.ids();
  Audited ct = check("llama-ct-fp8-per-head", "vllm", "auto", "0.33.0");
  EXPECT_FALSE(ct.has("scale-per-head-unsupported")) << ct.ids();
  EXPECT_EQ(engines::scale_source_name(ct.result.resolved.scale_source), "checkpoint");
}

TEST(CurrentRules, ModelOptKvFp8CastRecipeIsNamed) {
  Audited run = check("llama-modelopt-kv-no-scales", "sglang", "auto", "0.5.23");
  ASSERT_TRUE(run.has("modelopt-kv-fp8-cast")) << run.ids();
  EXPECT_EQ(run.find("modelopt-kv-fp8-cast")->severity, Severity::warning);
  EXPECT_NE(run.text("modelopt-kv-fp8-cast").find("default"), std::string::npos);
  // A 16-bit launch: a note for the day FP8 is enabled.
  EXPECT_EQ(check("llama-modelopt-kv-no-scales", "sglang", "bf16", "0.5.23")
                .find("modelopt-kv-fp8-cast")
                ->severity,
            Severity::info);
  EXPECT_FALSE(
      check("llama-modelopt-bf16-scales", "sglang", "auto", "0.5.23").has("modelopt-kv-fp8-cast"));
  EXPECT_FALSE(check("llama-ct-fp8-kv", "vllm", "auto", "0.33.0").has("modelopt-kv-fp8-cast"));
}

TEST(CurrentRules, VersionNewerThanKnownSaysTheVerdictMayBeStale) {
  Audited newer = check("llama-bf16-plain", "vllm", "auto", "0.34.1");
  ASSERT_TRUE(newer.has("engine-version-newer")) << newer.ids();
  EXPECT_EQ(newer.find("engine-version-newer")->severity, Severity::info);
  EXPECT_FALSE(check("llama-bf16-plain", "vllm", "auto", "0.33.0").has("engine-version-newer"));
  EXPECT_FALSE(check("llama-bf16-plain", "sglang", "auto", "").has("engine-version-newer"));
}

TEST(CurrentRules, VllmE5m2WithAQuantizedCheckpointAborts) {
  Audited modelopt = check("llama-modelopt-bf16-scales", "vllm", "fp8_e5m2", "0.33.0");
  ASSERT_TRUE(modelopt.has("startup-failure")) << modelopt.ids();
  EXPECT_NE(modelopt.text("startup-failure").find("fp8_e5m2 kv-cache is not supported"),
            std::string::npos);
  // Weight-only compressed-tensors is exempt since PR #45040, not before.
  auto weight_only = checkpoint::read_checkpoint(fixture_checkpoint("llama-ct-fp8-kv"));
  weight_only.quant->has_kv_cache_scheme = false;
  weight_only.kv_scales.clear();
  EXPECT_FALSE(check(weight_only, "vllm", "fp8_e5m2", "0.33.0").has("startup-failure"));
  EXPECT_TRUE(check(weight_only, "vllm", "fp8_e5m2", "0.20.0").has("startup-failure"));
  EXPECT_FALSE(check("llama-bf16-plain", "vllm", "fp8_e5m2", "0.33.0").has("startup-failure"));
}

TEST(CurrentRules, ProbeWithoutACheckpointCannotSeeTheScales) {
  checkpoint::ModelFacts none;  // a live server, no checkpoint given
  Audited fp8 = check(none, "sglang", "fp8_e4m3", "0.5.23");
  EXPECT_TRUE(fp8.has("kv-scales-unverified")) << fp8.ids();
  EXPECT_FALSE(fp8.has("fp8-unit-scale"));
  EXPECT_FALSE(fp8.has("unknown-architecture"));
  engines::LaunchFlags flags;
  flags.quantization_param_path = "/s.json";
  EXPECT_FALSE(check(none, "sglang", "fp8_e4m3", "0.5.23", flags).has("kv-scales-unverified"));
  EXPECT_FALSE(check(none, "sglang", "bf16", "0.5.23").has("kv-scales-unverified"));
}

}  // namespace
}  // namespace kvaudit::audit
