// TensorRT-LLM's host KV tier: kv_cache_config.host_cache_size in the --extra_llm_api_options /
// --config YAML (trtllm-serve has no flag for it). Launches with it are checked against the
// releases the tracker reports wrong tokens on (#8274, #8813, fixed by PR #9056); the same
// launch on a fixed release, without a host tier, or with block reuse off gets no finding.
#include <gtest/gtest.h>

#include <fstream>

#include "audit/audit.h"
#include "common/fixtures.h"
#include "common/registry.h"

namespace kvaudit::audit {
namespace trtllm_tiers {
namespace {

namespace fs = std::filesystem;
using report::Finding;
using report::Severity;

// josephrocca's YAML from NVIDIA/TensorRT-LLM#8813 (1.2.0rc1): a 64 GiB host tier with block
// reuse on and an FP8 cache (SOURCES.md).
fs::path issue_yaml() {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "launch" / "sources" / "tiers" /
         "trtllm-8813-extra-llm-api-options.yaml";
}

// The issue's YAML with its host-tier lines changed, written beside the test's temp files.
fs::path edited_yaml(const std::string& name, const std::string& from, const std::string& to) {
  std::string text = read_text_file(issue_yaml());
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  const fs::path path = fs::temp_directory_path() / ("kvaudit-trtllm-tiers-" + name + ".yaml");
  std::ofstream(path) << text;
  return path;
}

std::vector<Finding> tier_findings(const fs::path& yaml, const std::string& version) {
  CheckInput input;
  input.model = checkpoint::read_checkpoint(fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "configs" /
                                            "qwen-qwen3-8b" / "config.json");
  input.flags = engines::parse_launch_command(
      kvaudit::testing::registry(),
      "trtllm-serve Qwen/Qwen3-8B --extra_llm_api_options " + yaml.string(), "--launch");
  input.flags.engine_version = version;
  input.engine = &kvaudit::testing::engine("trtllm");
  input.version_given = true;
  std::vector<Finding> out;
  for (const Finding& finding : run_check(input).findings)
    if (finding.id == "kv-tier-hazard") out.push_back(finding);
  return out;
}

bool has_evidence(const Finding& finding, const std::string& key_part, const std::string& value) {
  for (const auto& e : finding.evidence)
    if (e.key.find(key_part) != std::string::npos && e.value == value) return true;
  return false;
}

TEST(TrtllmTierHazards, TheHostTierIsReadFromTheConfigYaml) {
  const engines::LaunchFlags flags = engines::parse_launch_command(
      kvaudit::testing::registry(),
      "trtllm-serve Qwen/Qwen3-8B --extra_llm_api_options " + issue_yaml().string(), "--launch");
  EXPECT_EQ(flags.tier_settings.at("host_cache_size"), "68719476736");
  EXPECT_EQ(flags.tier_settings.at("enable_block_reuse"), "true");
  EXPECT_EQ(flags.tier_settings.at("enable_partial_reuse"), "false");
  EXPECT_EQ(flags.kv_cache_dtype, "fp8");  // the same file's other keys are still read
}

TEST(TrtllmTierHazards, TheIssuesLaunchOnItsReleaseIsCriticalWithItsSource) {
  auto hits = tier_findings(issue_yaml(), "1.2.0rc1");
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_NE(hits[0].title.find("trtllm-8813-host-cache-transfer-sync"), std::string::npos);
  EXPECT_EQ(hits[0].severity, Severity::critical);
  EXPECT_NE(hits[0].reference.find("NVIDIA/TensorRT-LLM#8813"), std::string::npos);
  EXPECT_NE(hits[0].reference.find("PR #9056"), std::string::npos);
  EXPECT_NE(hits[0].fix.find("1.3.0rc0 or later"), std::string::npos);
  EXPECT_TRUE(has_evidence(hits[0], "kv_cache_config.host_cache_size", "68719476736"));
  // The first release with the fix is inferred, and the finding says so.
  EXPECT_NE(hits[0].judged_on.find("the version bound is inferred"), std::string::npos);

  // 1.2.0rc0: the other prompts' tokens of #8274.
  hits = tier_findings(issue_yaml(), "1.2.0rc0");
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_NE(hits[0].title.find("trtllm-8274-host-cache-other-prompts"), std::string::npos);
  EXPECT_EQ(hits[0].severity, Severity::critical);
  EXPECT_NE(hits[0].reference.find("NVIDIA/TensorRT-LLM#8274"), std::string::npos);

  // Before 1.2: the same races, reported rarely: a warning.
  hits = tier_findings(issue_yaml(), "1.1.0rc5");
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_NE(hits[0].title.find("trtllm-9056-host-cache-transfer-races"), std::string::npos);
  EXPECT_EQ(hits[0].severity, Severity::warning);
}

TEST(TrtllmTierHazards, AFixedReleaseOrNoHostTierGetsNoFinding) {
  EXPECT_TRUE(tier_findings(issue_yaml(), "1.3.0rc0").empty());
  EXPECT_TRUE(tier_findings(issue_yaml(), "1.4.0rc4").empty());
  const fs::path no_host = edited_yaml("no-host", "  host_cache_size: 68719476736\n", "");
  EXPECT_TRUE(tier_findings(no_host, "1.2.0rc1").empty());
  const fs::path zero = edited_yaml("zero", "host_cache_size: 68719476736", "host_cache_size: 0");
  EXPECT_TRUE(tier_findings(zero, "1.2.0rc1").empty());
  // Block reuse off: nothing is kept for reuse, so nothing is offloaded.
  const fs::path no_reuse =
      edited_yaml("no-reuse", "enable_block_reuse: true", "enable_block_reuse: false");
  EXPECT_TRUE(tier_findings(no_reuse, "1.2.0rc1").empty());
}

TEST(TrtllmTierHazards, BlockReuseIsOnWhenTheYamlLeavesItOut) {
  const fs::path unset = edited_yaml("reuse-unset", "  enable_block_reuse: true\n", "");
  const auto hits = tier_findings(unset, "1.2.0rc1");
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_TRUE(has_evidence(hits[0], "enable_block_reuse (not set: the engine's default)", "true"));
}

}  // namespace
}  // namespace trtllm_tiers
}  // namespace kvaudit::audit
