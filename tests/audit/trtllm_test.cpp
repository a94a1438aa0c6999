// TensorRT-LLM through the engine registry: what `check` says for the checkpoints that meet
// its traps. auto follows the checkpoint's kv_cache_quant_algo; the PyTorch backend keeps FP8
// KV scales at 1.0 whatever the checkpoint ships (so calibrating is no fix there); the only
// 16-bit fix is a checkpoint-config overlay; an explicit value that differs from the
// checkpoint's algo stops start-up before 1.3.0rc7.
#include <gtest/gtest.h>

#include "audit/audit.h"
#include "common/fixtures.h"
#include "common/registry.h"

namespace kvaudit::audit {
namespace {

using kvaudit::testing::fixture_checkpoint;
using report::Severity;

CheckResult trtllm_check(const std::string& fixture, const std::string& kv,
                         const std::string& version) {
  CheckInput input;
  input.model = checkpoint::read_checkpoint(fixture_checkpoint(fixture));
  input.flags.engine = "trtllm";
  input.flags.kv_cache_dtype = kv;
  input.flags.kv_cache_dtype_flag = kv == "auto" ? "" : "--kv_cache_dtype";
  input.flags.engine_version = version;
  input.engine = &kvaudit::testing::engine("trtllm");
  input.version_given = !version.empty();
  return run_check(input);
}

const report::Finding* trtllm_find(const CheckResult& result, const std::string& id) {
  for (const auto& finding : result.findings)
    if (finding.id == id) return &finding;
  return nullptr;
}

std::string trtllm_ids(const CheckResult& result) {
  std::string out;
  for (const auto& f : result.findings) out += f.id + " ";
  return out;
}

// The motivating checkpoint's trap, as TensorRT-LLM springs it: FP8 declared, no scales
// shipped, auto enables it, and the fix is an overlay, not a flag value.
TEST(Trtllm, AutoFollowsTheCheckpointAndTheFixIsAnOverlay) {
  CheckResult r = trtllm_check("llama-modelopt-kv-no-scales", "auto", "1.2.0rc5");
  EXPECT_EQ(r.resolved.kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(r.resolved.rule_id, "trtllm-auto-checkpoint-fp8");
  const report::Finding* unit = trtllm_find(r, "fp8-unit-scale");
  ASSERT_NE(unit, nullptr) << trtllm_ids(r);
  EXPECT_NE(unit->fix.find("kv_cache_quant_algo to null"), std::string::npos) << unit->fix;
  EXPECT_EQ(unit->fix.find("--kv-cache-dtype"), std::string::npos)
      << "TensorRT-LLM has no such flag: " << unit->fix;
  EXPECT_EQ(unit->fix.find("kvaudit calibrate --model"), std::string::npos)
      << "calibrating is no fix where FP8 scales stay 1.0: " << unit->fix;
  const report::Finding* enabled = trtllm_find(r, "kv-auto-quantized");
  ASSERT_NE(enabled, nullptr) << trtllm_ids(r);
  EXPECT_NE(enabled->fix.find("calibrating is no fix"), std::string::npos) << enabled->fix;
  EXPECT_NE(enabled->title.find("kv_cache_config.dtype auto"), std::string::npos)
      << "1.2.0rc5 has no --kv_cache_dtype flag: " << enabled->title;
}

// Calibrated scales in the checkpoint do not help on the PyTorch backend: they are read and
// never used for an FP8 cache (the scale_drops rule with its dtype condition).
TEST(Trtllm, ShippedFp8ScalesStayUnusedAndNvfp4ScalesLoadFromTheFlip) {
  CheckResult fp8 = trtllm_check("qwen35-modelopt-fp8-kv-scales", "auto", "1.4.0rc4");
  EXPECT_EQ(fp8.resolved.kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(fp8.resolved.scale_source, engines::ScaleSource::unit_default) << trtllm_ids(fp8);
  ASSERT_FALSE(fp8.resolved.dropped.empty());
  EXPECT_EQ(fp8.resolved.dropped.front().rule_id, "trtllm-pytorch-fp8-scales-stay-1");
  EXPECT_NE(trtllm_find(fp8, "fp8-unit-scale"), nullptr) << trtllm_ids(fp8);

  // The same scales with an NVFP4 cache: loaded from the TRTLLM_LOAD_KV_SCALES default flip.
  CheckResult nvfp4_new = trtllm_check("qwen35-modelopt-fp8-kv-scales", "nvfp4", "1.4.0rc4");
  CheckResult nvfp4_old = trtllm_check("qwen35-modelopt-fp8-kv-scales", "nvfp4", "1.3.0rc5");
  EXPECT_EQ(nvfp4_new.resolved.kv_cache_dtype, "nvfp4");
  for (const auto& drop : nvfp4_new.resolved.dropped)
    EXPECT_NE(drop.rule_id, "trtllm-10813-nvfp4-scales-off-by-default");
  bool dropped_old = false;
  for (const auto& drop : nvfp4_old.resolved.dropped)
    dropped_old |= drop.rule_id == "trtllm-10813-nvfp4-scales-off-by-default";
  EXPECT_TRUE(dropped_old) << "before the flip the NVFP4 global scales stay 1.0";
}

// No value of kv_cache_config.dtype is 16-bit: bf16 stops start-up (ValueError, or click's
// Choice from 1.3.0rc7).
TEST(Trtllm, Bf16IsNotAValueAndStopsStartUp) {
  CheckResult r = trtllm_check("llama-modelopt-kv-no-scales", "bf16", "1.2.0rc5");
  ASSERT_FALSE(r.resolved.startup_failures.empty()) << trtllm_ids(r);
  EXPECT_NE(r.resolved.startup_failures.front().message.find("Overriding KV cache quantization"),
            std::string::npos);
  CheckResult cli = trtllm_check("llama-modelopt-kv-no-scales", "bf16", "1.3.0rc7");
  ASSERT_FALSE(cli.resolved.startup_failures.empty());
  EXPECT_NE(cli.resolved.startup_failures.front().message.find("--kv_cache_dtype"),
            std::string::npos);
}

// An explicit nvfp4 over a checkpoint that declares FP8: RuntimeError before 1.3.0rc7, an
// override (with a warning) from it.
TEST(Trtllm, OverridingTheCheckpointAlgoFailsBeforeRc7) {
  CheckResult old = trtllm_check("llama-modelopt-kv-no-scales", "nvfp4", "1.3.0rc6");
  ASSERT_FALSE(old.resolved.startup_failures.empty()) << trtllm_ids(old);
  EXPECT_EQ(old.resolved.startup_failures.front().id, "trtllm-override-checkpoint-kv-error");
  CheckResult now = trtllm_check("llama-modelopt-kv-no-scales", "nvfp4", "1.3.0rc7");
  EXPECT_TRUE(now.resolved.startup_failures.empty()) << trtllm_ids(now);
  EXPECT_EQ(now.resolved.kv_cache_dtype, "nvfp4");
}

// A plain 16-bit checkpoint: auto keeps the model dtype, nothing to fix.
TEST(Trtllm, APlainCheckpointKeepsTheModelDtype) {
  CheckResult r = trtllm_check("llama-bf16-plain", "auto", "");
  EXPECT_EQ(r.resolved.kv_cache_dtype, "bf16");
  EXPECT_FALSE(r.resolved.quantized);
  EXPECT_EQ(trtllm_find(r, "fp8-unit-scale"), nullptr) << trtllm_ids(r);
}

// A config file the engine refuses (a top-level kv_cache_dtype: extra="forbid"): critical,
// naming the file and the key the engine reads instead.
TEST(Trtllm, ARefusedConfigKeyIsCritical) {
  CheckInput input;
  input.model = checkpoint::read_checkpoint(fixture_checkpoint("llama-bf16-plain"));
  input.flags.engine = "trtllm";
  input.flags.config_file = "serve.yaml";
  input.flags.config_errors = {"serve.yaml: top-level kv_cache_dtype: refused"};
  input.engine = &kvaudit::testing::engine("trtllm");
  CheckResult r = run_check(input);
  const report::Finding* refused = trtllm_find(r, "launch-config-refused");
  ASSERT_NE(refused, nullptr) << trtllm_ids(r);
  EXPECT_EQ(refused->severity, Severity::critical);
  EXPECT_NE(refused->fix.find("--kv_cache_dtype"), std::string::npos) << refused->fix;
}

}  // namespace
}  // namespace kvaudit::audit
