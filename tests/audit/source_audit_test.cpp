// The 2026-12 source audit of the engine data, as verdicts: the five findings of the audit
// that its report gives as examples (each failed on the data before it; the data's audit
// blocks hold what was read), and
// checkpoint + launch scenarios users hit today, each with the verdict the engines' released
// source gives and the rule that decides it.
#include <gtest/gtest.h>

#include <algorithm>

#include "audit/audit.h"
#include "common/fixtures.h"
#include "common/registry.h"

namespace kvaudit::audit {
namespace source_audit {
namespace {

namespace fs = std::filesystem;
using checkpoint::ModelFacts;
using report::Finding;
using report::Severity;
using testing::fixture_checkpoint;

struct Launch {
  std::string engine, version, kv = "auto";
  std::string gpu_arch = {}, platform = {};
  std::string speculative = {}, draft_kv = {};
};

CheckResult run(const ModelFacts& model, const Launch& launch) {
  CheckInput input;
  input.model = model;
  input.flags.engine = launch.engine;
  input.flags.engine_version = launch.version;
  input.flags.kv_cache_dtype = launch.kv;
  input.flags.kv_cache_dtype_flag = launch.kv == "auto" ? "" : "--kv-cache-dtype";
  input.flags.gpu_arch = launch.gpu_arch;
  input.flags.platform = launch.platform;
  input.flags.speculative_algorithm = launch.speculative;
  input.flags.speculative_draft_kv_cache_dtype = launch.draft_kv;
  input.engine = &kvaudit::testing::engine(launch.engine);
  input.version_given = true;
  return run_check(input);
}

const Finding* find(const CheckResult& result, const std::string& id) {
  for (const auto& finding : result.findings)
    if (finding.id == id) return &finding;
  return nullptr;
}

ModelFacts read(const std::string& fixture) {
  return checkpoint::read_checkpoint(fixture_checkpoint(fixture));
}

ModelFacts demo_config() {
  return checkpoint::read_checkpoint(fs::path(KVAUDIT_TEST_DIR) / ".." / "examples" /
                                     "qwen3.5-397b-a17b-nvfp4" / "config.json");
}

// ---------------------------------------------------------------- the audit's examples

// 1. vLLM's compressed-tensors KV method (PR #30141) starts its scales at 1.0 and copies what
// loads: a lone v_scale runs K at 1.0 without the BaseKVCacheMethod assertion, missing
// scales stay 1.0 with no "Using KV cache scaling factor 1.0" warning, and 0.0 is used as is.
TEST(SourceAudit, VllmCompressedTensorsScalesDoNotFollowTheBaseMethod) {
  ModelFacts v_only = read("llama-ct-fp8-kv");
  std::erase_if(v_only.kv_scales, [](const checkpoint::ScaleTensor& s) {
    return s.role == checkpoint::ScaleRole::k;
  });
  const CheckResult lone_v = run(v_only, {"vllm", "0.22.0"});
  EXPECT_EQ(lone_v.resolved.kv_cache_dtype, "fp8_e4m3");
  EXPECT_TRUE(lone_v.resolved.startup_failures.empty());  // the base method asserts here
  ASSERT_NE(find(lone_v, "scale-one-sided"), nullptr);
  EXPECT_EQ(find(lone_v, "scale-one-sided")->severity, Severity::critical);
  EXPECT_NE(find(lone_v, "scale-one-sided")->consequence.find("1.0"), std::string::npos);

  ModelFacts none = read("llama-ct-fp8-kv");
  none.kv_scales.clear();
  const CheckResult silent = run(none, {"vllm", "0.22.0"});
  EXPECT_EQ(engines::scale_source_name(silent.resolved.scale_source), "unit_default");
  EXPECT_FALSE(silent.resolved.scale_warning_text.has_value());  // no warning for CT

  ModelFacts zero = read("llama-ct-fp8-kv");
  for (auto& scale : zero.kv_scales) scale.values = {0.0f};
  const CheckResult zeros = run(zero, {"vllm", "0.22.0"});
  EXPECT_TRUE(zeros.resolved.startup_failures.empty());  // copied as is, no assertion
  ASSERT_NE(find(zeros, "scale-values-invalid"), nullptr);
  EXPECT_EQ(find(zeros, "scale-values-invalid")->severity, Severity::critical);

  // The same checkpoint under ModelOpt's method (BaseKVCacheMethod) keeps the assertion.
  ModelFacts modelopt_v = read("llama-modelopt-v-only");
  EXPECT_FALSE(run(modelopt_v, {"vllm", "0.22.0", "fp8"}).resolved.startup_failures.empty());
}

// 2. SGLang on ROCm turns --kv-cache-dtype fp8_e5m2 into the platform FP8 (E4M3FNUZ on
// MI300: max 240 at scale 1.0), with no warning.
TEST(SourceAudit, SglangOnRocmTurnsE5m2IntoE4m3Fnuz) {
  const ModelFacts model = read("llama-bf16-plain");
  const CheckResult mi300 = run(model, {"sglang", "0.5.19", "fp8_e5m2", "gfx942", "rocm"});
  EXPECT_EQ(mi300.resolved.substituted_from, "fp8_e5m2");
  EXPECT_EQ(mi300.resolved.kv_cache_dtype, "fp8_e4m3fnuz");
  ASSERT_NE(find(mi300, "kv-dtype-substituted"), nullptr);
  EXPECT_EQ(find(mi300, "kv-dtype-substituted")->severity, Severity::critical);
  EXPECT_NE(find(mi300, "kv-dtype-substituted")->title.find("240"), std::string::npos);
  // On CUDA, and on MI350 (OCP E4M3), nothing is substituted.
  EXPECT_EQ(run(model, {"sglang", "0.5.19", "fp8_e5m2", "sm90", "cuda"}).resolved.kv_cache_dtype,
            "fp8_e5m2");
  EXPECT_EQ(run(model, {"sglang", "0.5.19", "fp8_e5m2", "gfx950", "rocm"}).resolved.kv_cache_dtype,
            "fp8_e5m2");
  // vLLM stores fp8 as FNUZ on MI300 too; the 1.0 default is not doubled: 240.
  const CheckResult vllm = run(model, {"vllm", "0.22.0", "fp8", "gfx942", "rocm"});
  EXPECT_EQ(vllm.resolved.kv_cache_dtype, "fp8_e4m3fnuz");
}

// 3. Known-bad combinations no scale rule sees: NVFP4 KV with FlashInfer on B200 (vllm#55673,
// GSM8K 6.5%), NVFP4 KV on SM120 (refused, token 0 out of tree), FP8 KV on FA3 before the
// two-level accumulation fix (NIAH 91% -> 13%).
TEST(SourceAudit, KnownBadCombinationsAreReported) {
  const ModelFacts qwen35 = demo_config();
  const CheckResult b200 = run(qwen35, {"vllm", "0.28.0", "nvfp4", "sm100", "cuda"});
  const Finding* hit = find(b200, "known-bad-combination");
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->severity, Severity::critical);
  EXPECT_NE(hit->consequence.find("6.52%"), std::string::npos);
  EXPECT_EQ(b200.resolved.known_bad.at(0).backend, "flashinfer");  // the release's default
  // Without --gpu it may apply: a note that says which GPU it needs.
  const CheckResult unknown = run(qwen35, {"vllm", "0.28.0", "nvfp4"});
  ASSERT_NE(find(unknown, "known-bad-combination"), nullptr);
  EXPECT_EQ(find(unknown, "known-bad-combination")->severity, Severity::info);
  // Not on an H100.
  EXPECT_EQ(find(run(qwen35, {"vllm", "0.28.0", "nvfp4", "sm90", "cuda"}), "known-bad-combination"),
            nullptr);

  const ModelFacts llama = read("llama-bf16-plain");
  EXPECT_NE(find(run(llama, {"vllm", "0.26.0", "nvfp4", "sm120", "cuda"}), "known-bad-combination"),
            nullptr);
  const CheckResult fa3 = run(llama, {"vllm", "0.11.0", "fp8", "sm90", "cuda"});
  ASSERT_NE(find(fa3, "known-bad-combination"), nullptr);
  EXPECT_NE(find(fa3, "known-bad-combination")->consequence.find("91% -> 13%"), std::string::npos);
  EXPECT_EQ(find(run(llama, {"vllm", "0.12.0", "fp8", "sm90", "cuda"}), "known-bad-combination"),
            nullptr);
}

// 4. vLLM's hybrid state dtypes are per model: under auto Qwen3-Next keeps SSM and conv
// state in the model dtype (BF16, PR #34489), Qwen3.5 reads mamba_ssm_dtype from its config,
// NemotronH falls back to float32 (PR #39032); SGLang reads the config for every hybrid.
TEST(SourceAudit, VllmHybridStateDtypesArePerModel) {
  const ModelFacts next = read("qwen3-next-80b");
  ASSERT_EQ(next.linear_attention->ssm_dtype, "float32");
  const engines::EngineModel& vllm = kvaudit::testing::engine("vllm");
  const auto v22 = *engines::parse_version("0.22.0");
  const engines::StateDtypes next_states =
      engines::resolve_state_dtypes(vllm, v22, next, "", "bf16");
  EXPECT_EQ(next_states.ssm.dtype, "bf16");
  EXPECT_EQ(next_states.conv_dtype, "bf16");
  ASSERT_NE(next_states.rule, nullptr);
  EXPECT_EQ(next_states.rule->id, "vllm-qwen3-next-state-model-dtype");
  const CheckResult check = run(next, {"vllm", "0.22.0"});
  ASSERT_NE(find(check, "hybrid-state-precision"), nullptr);

  ModelFacts qwen35 = demo_config();
  EXPECT_EQ(engines::resolve_state_dtypes(vllm, v22, qwen35, "", "bf16").ssm.dtype, "float32");
  ModelFacts nemotron = next;
  nemotron.architecture = "NemotronHForCausalLM";
  nemotron.linear_attention->ssm_dtype.clear();
  EXPECT_EQ(engines::resolve_state_dtypes(vllm, v22, nemotron, "", "bf16").ssm.dtype, "float32");
  EXPECT_EQ(
      engines::resolve_state_dtypes(vllm, *engines::parse_version("0.20.0"), nemotron, "", "bf16")
          .ssm.dtype,
      "float16");
  // SGLang: the config's float32 for Qwen3-Next.
  EXPECT_EQ(engines::resolve_state_dtypes(kvaudit::testing::engine("sglang"),
                                          *engines::parse_version("0.5.19"), next, "", "bf16")
                .ssm.dtype,
            "float32");
  EXPECT_EQ(find(run(next, {"sglang", "0.5.19"}), "hybrid-state-precision"), nullptr);
}

// 5. References point at released code: no rule rests on the two stored copies of SGLang's
// kv_cache_dtype.py, both heads of unmerged PR branches (10a75eae carries the int8_g64 /
// int4_g32 dtypes of the open PR #37798 series), and none on an open PR (the lint refuses).
TEST(SourceAudit, NoRuleRestsOnAnUnmergedBranchHead) {
  for (const auto& engine : kvaudit::testing::registry().names()) {
    const engines::EngineModel& model = kvaudit::testing::engine(engine);
    std::vector<const engines::Provenance*> all;
    for (const auto& c : model.dtype_choices) {
      all.push_back(&c.provenance);
      for (const auto& [value, abort] : c.aborts) all.push_back(&abort.provenance);
    }
    for (const auto& r : model.auto_rules) all.push_back(&r.provenance);
    for (const auto& r : model.scale_name_rules) all.push_back(&r.provenance);
    for (const auto& r : model.scale_drop_rules) all.push_back(&r.provenance);
    for (const auto& r : model.fallback_rules) all.push_back(&r.provenance);
    for (const auto& r : model.scale_warnings) all.push_back(&r.provenance);
    for (const auto& r : model.checkpoint_aborts) all.push_back(&r.provenance);
    for (const auto& r : model.dtype_hazards) all.push_back(&r.provenance);
    for (const auto& r : model.known_bad) all.push_back(&r.provenance);
    for (const auto& r : model.log_templates) all.push_back(&r.provenance);
    for (const auto* p : all) {
      for (const char* head : {"kv_cache_dtype.py@10a75eae", "kv_cache_dtype.py@aff0d58a"}) {
        EXPECT_EQ(p->reference.find(head), std::string::npos) << engine << ": " << p->reference;
        EXPECT_EQ(p->audit.read.find(head), std::string::npos) << engine << ": " << p->audit.read;
      }
      EXPECT_FALSE(p->audit.checked.empty()) << engine << ": " << p->reference;
    }
  }
}

// ---------------------------------------------------------------- scenarios

// Checkpoint + launch scenarios users hit today, with the verdict the released source gives.
TEST(Scenario, Qwen35StaysBf16OnSglangBeforeItsQuantConfigFix) {
  // PR #19291 (0.5.10): the Qwen3.5 wrapper lost its quant_config, auto kept the model dtype.
  EXPECT_EQ(run(demo_config(), {"sglang", "0.5.9"}).resolved.kv_cache_dtype, "bf16");
  EXPECT_EQ(run(demo_config(), {"sglang", "0.5.10"}).resolved.kv_cache_dtype, "fp8_e4m3");
}

TEST(Scenario, VllmCompressedTensorsSchemeForcedFp8OnlyBetween30141And42782) {
  const ModelFacts ct = read("llama-ct-fp8-kv");
  EXPECT_EQ(run(ct, {"vllm", "0.11.0", "bfloat16"}).resolved.kv_cache_dtype, "bf16");
  const CheckResult forced = run(ct, {"vllm", "0.16.0", "bfloat16"});
  EXPECT_EQ(forced.resolved.kv_cache_dtype, "fp8_e4m3");
  EXPECT_NE(find(forced, "kv-quant-overrides-cli"), nullptr);
  EXPECT_EQ(run(ct, {"vllm", "0.22.0", "bfloat16"}).resolved.kv_cache_dtype, "bf16");
}

TEST(Scenario, VllmStillDoublesRuntimeFormScaleNames) {
  ModelFacts model = read("llama-modelopt-bf16-scales");
  for (auto& scale : model.kv_scales) scale.convention = "runtime_attn";
  const CheckResult result = run(model, {"vllm", "0.33.0", "fp8"});
  ASSERT_FALSE(result.resolved.dropped.empty());
  EXPECT_EQ(result.resolved.dropped.front().rule_id, "vllm-runtime-name-doubled");
}

TEST(Scenario, SglangFp4E2m1RunsUntilTheFp4RecipesThenAborts) {
  const ModelFacts model = read("llama-bf16-plain");
  EXPECT_TRUE(run(model, {"sglang", "0.5.15", "fp4_e2m1"}).resolved.startup_failures.empty());
  EXPECT_FALSE(run(model, {"sglang", "0.5.16", "fp4_e2m1"}).resolved.startup_failures.empty());
}

TEST(Scenario, VllmNvfp4AndFloat16CacheArriveInTheirReleases) {
  const ModelFacts model = read("llama-bf16-plain");
  EXPECT_NE(find(run(model, {"vllm", "0.20.0", "nvfp4"}), "kv-dtype-rejected"), nullptr);
  EXPECT_EQ(find(run(model, {"vllm", "0.21.0", "nvfp4"}), "kv-dtype-rejected"), nullptr);
  EXPECT_NE(find(run(model, {"vllm", "0.17.0", "float16"}), "kv-dtype-rejected"), nullptr);
  EXPECT_EQ(find(run(model, {"vllm", "0.18.0", "float16"}), "kv-dtype-rejected"), nullptr);
}

TEST(Scenario, SglangMixtralWithScalesStopsAtLoad) {
  ModelFacts mixtral = read("llama-modelopt-bf16-scales");
  mixtral.architecture = "MixtralForCausalLM";
  const CheckResult result = run(mixtral, {"sglang", "0.5.19"});
  ASSERT_FALSE(result.resolved.startup_failures.empty());
  EXPECT_EQ(result.resolved.startup_failures.front().id, "sglang-39943-mixtral-keyerror");
}

TEST(Scenario, VllmRejectsACompressedTensorsFourBitKvSchemeFrom45312) {
  ModelFacts ct = read("llama-ct-fp8-kv");
  ct.quant->kv_scheme_bits = 4;
  EXPECT_TRUE(run(ct, {"vllm", "0.22.0"}).resolved.startup_failures.empty());  // served as FP8
  EXPECT_FALSE(run(ct, {"vllm", "0.23.0"}).resolved.startup_failures.empty());
}

TEST(Scenario, VllmModelOptDynamicKvSchemeFallsBackToTheModelDtype) {
  ModelFacts model = read("llama-bf16-plain");
  model.quant = checkpoint::QuantFacts{};
  model.quant->method = "modelopt";
  model.quant->has_kv_cache_scheme = true;
  model.quant->kv_scheme_bits = 8;
  model.quant->kv_scheme_type = "float";
  model.quant->kv_scheme_dynamic = true;
  EXPECT_EQ(run(model, {"vllm", "0.22.0"}).resolved.rule_id, "vllm-auto-modelopt-scheme-unknown");
  model.quant->kv_scheme_dynamic = false;
  EXPECT_EQ(run(model, {"vllm", "0.22.0"}).resolved.kv_cache_dtype, "fp8_e4m3");
}

TEST(Scenario, SglangNoScalesWarningFollowsTheRequestedStringBefore18394) {
  const ModelFacts model = read("llama-modelopt-kv-no-scales");
  EXPECT_FALSE(run(model, {"sglang", "0.5.9"}).resolved.scale_warning_text.has_value());
  EXPECT_TRUE(run(model, {"sglang", "0.5.9", "fp8_e4m3"}).resolved.scale_warning_text.has_value());
  EXPECT_TRUE(run(model, {"sglang", "0.5.15"}).resolved.scale_warning_text.has_value());
}

TEST(Scenario, DraftCacheFollowsTheTargetUnlessGivenItsOwn) {
  const ModelFacts model = read("llama-bf16-plain");
  const CheckResult follows = run(model, {"sglang", "0.5.19", "fp8_e4m3", "", "", "EAGLE"});
  EXPECT_EQ(follows.resolved.draft_kv_cache_dtype, "fp8_e4m3");
  ASSERT_NE(find(follows, "draft-kv-quantized"), nullptr);
  EXPECT_EQ(find(follows, "draft-kv-quantized")->severity, Severity::info);
  const CheckResult own = run(model, {"sglang", "0.5.19", "fp8_e4m3", "", "", "EAGLE", "bf16"});
  EXPECT_EQ(own.resolved.draft_kv_cache_dtype, "bf16");
  EXPECT_EQ(find(own, "draft-kv-quantized"), nullptr);
}

TEST(Scenario, SkippedLayersAreRecordedPerLayer) {
  const ModelFacts model = read("gemma3-4b");
  CheckInput input;
  input.model = model;
  input.flags.engine = "vllm";
  input.flags.engine_version = "0.22.0";
  input.flags.kv_cache_dtype = "fp8";
  input.flags.kv_cache_dtype_skip_layers = "sliding_window";
  input.engine = &kvaudit::testing::engine("vllm");
  input.version_given = true;
  const CheckResult result = run_check(input);
  ASSERT_FALSE(result.resolved.layer_dtypes.empty());
  int kept = 0, quantized = 0;
  for (const auto& layer : result.resolved.layer_dtypes) {
    kept += layer.dtype == "bf16";
    quantized += layer.dtype == "fp8_e4m3";
  }
  EXPECT_EQ(kept + quantized, static_cast<int>(result.resolved.layer_dtypes.size()));
  EXPECT_EQ(kept, static_cast<int>(result.resolved.skipped_layers.size()));
  EXPECT_GT(kept, 0);
  EXPECT_GT(quantized, 0);
}

}  // namespace
}  // namespace source_audit
}  // namespace kvaudit::audit
