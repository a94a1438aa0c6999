// check on real hub configs (tests/fixtures/configs/SOURCES.md): what the engines do with
// the checkpoints users actually serve, read from the files as published.
#include <gtest/gtest.h>

#include "audit/audit.h"
#include "common/registry.h"

namespace kvaudit::audit {
namespace {

namespace fs = std::filesystem;
using report::Severity;

fs::path real_config(const std::string& name) {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "configs" / name;
}

CheckResult check_real(const std::string& name, const std::string& engine, const std::string& kv,
                       const std::string& version) {
  CheckInput input;
  input.model = checkpoint::read_checkpoint(real_config(name));
  input.flags.engine = engine;
  input.flags.engine_version = version;
  input.flags.kv_cache_dtype = kv;
  input.engine = &kvaudit::testing::engine(engine);
  input.version_given = true;
  return run_check(input);
}

bool has_id(const CheckResult& r, const std::string& id) {
  for (const auto& f : r.findings)
    if (f.id == id) return true;
  return false;
}

TEST(RealConfigs, MotivatingNvfp4CheckpointAsPublished) {
  auto model = checkpoint::read_checkpoint(real_config("nvidia-qwen3.5-397b-a17b-nvfp4"));
  EXPECT_EQ(model.architecture, "Qwen3_5MoeForConditionalGeneration");
  EXPECT_EQ(model.attention_layer_count(), 15);
  EXPECT_TRUE(model.multimodal);
  ASSERT_TRUE(model.quant);
  EXPECT_EQ(model.quant->kv_cache_quant_algo, "FP8");
  EXPECT_EQ(model.quant->producer.rfind("modelopt", 0), 0u);
  // config.json's kv_cache_scheme {num_bits: 8, type: float} says the same: no disagreement.
  EXPECT_NE(model.quant->other_kv_declared.find("\"num_bits\":8"), std::string::npos);
  CheckResult sglang = check_real("nvidia-qwen3.5-397b-a17b-nvfp4", "sglang", "auto", "0.5.23");
  EXPECT_EQ(sglang.resolved.kv_cache_dtype, "fp8_e4m3");
  EXPECT_FALSE(has_id(sglang, "quant-configs-disagree"));
  EXPECT_TRUE(has_id(sglang, "fp8-unit-scale"));  // bare config: scales unknown, worst case
  CheckResult vllm = check_real("nvidia-qwen3.5-397b-a17b-nvfp4", "vllm", "auto", "0.33.0");
  EXPECT_EQ(vllm.resolved.kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(vllm.resolved.rule_id, "vllm-auto-modelopt-fp8");
}

TEST(RealConfigs, MixedPrecisionExportWhoseTwoFilesDisagree) {
  auto model = checkpoint::read_checkpoint(real_config("nvidia-qwen3.6-35b-a3b-nvfp4"));
  ASSERT_TRUE(model.quant);
  EXPECT_EQ(model.quant->weight_algo, "MIXED_PRECISION");
  EXPECT_EQ(model.quant->kv_cache_quant_algo, "FP8");
  EXPECT_EQ(model.quant->other_kv_declared, "");
  CheckResult run = check_real("nvidia-qwen3.6-35b-a3b-nvfp4", "sglang", "auto", "0.5.23");
  EXPECT_TRUE(has_id(run, "quant-configs-disagree"));
  EXPECT_EQ(run.resolved.kv_cache_dtype, "fp8_e4m3");  // the riskier reading
}

TEST(RealConfigs, CompressedTensorsWithANullKvSchemeDeclaresNothing) {
  auto model = checkpoint::read_checkpoint(real_config("kimi-k2.5"));
  EXPECT_TRUE(model.architecture_known);
  ASSERT_TRUE(model.mla);
  ASSERT_TRUE(model.quant);
  EXPECT_EQ(model.quant->method, "compressed-tensors");
  EXPECT_FALSE(model.quant->has_kv_cache_scheme);
  for (const char* engine : {"sglang", "vllm"}) {
    CheckResult run = check_real("kimi-k2.5", engine, "auto",
                                 engine == std::string("vllm") ? "0.33.0" : "0.5.23");
    EXPECT_EQ(run.resolved.kv_cache_dtype, "bf16") << engine;
    EXPECT_FALSE(has_id(run, "kv-auto-quantized")) << engine;
    EXPECT_FALSE(fails_gate(run.findings, FailOn::critical)) << engine;
  }
}

TEST(RealConfigs, DsaModelsAreReadAsMlaWithAnIndexer) {
  for (const char* name : {"deepseek-v3.2", "glm-5"}) {
    auto model = checkpoint::read_checkpoint(real_config(name));
    EXPECT_TRUE(model.architecture_known) << name;
    ASSERT_TRUE(model.mla) << name;
    EXPECT_EQ(model.mla->kv_lora_rank, 512) << name;
    EXPECT_EQ(model.mla->qk_rope_head_dim, 64) << name;
    EXPECT_EQ(model.mla->index_head_dim, 128) << name;
    EXPECT_EQ(model.mtp_layers, 1) << name;
  }
}

}  // namespace
}  // namespace kvaudit::audit
