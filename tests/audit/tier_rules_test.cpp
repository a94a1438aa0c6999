// Where the KV cache travels: launches that put it in a host tier, a connector or a
// persistent store in a combination the engine data's tier_hazards name are reported with the
// source, and a clean launch of the same tier is not. The settings are read from the launch
// command as the engines read them (vLLM's --kv-transfer-config JSON included).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "audit/audit.h"
#include "common/fixtures.h"
#include "common/registry.h"

namespace kvaudit::audit {
namespace tiers {
namespace {

namespace fs = std::filesystem;
using checkpoint::ModelFacts;
using report::Finding;
using report::Severity;

ModelFacts config(const std::string& name) {
  return checkpoint::read_checkpoint(fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "configs" / name /
                                     "config.json");
}

CheckResult check(const ModelFacts& model, const std::string& command, const std::string& version) {
  CheckInput input;
  input.model = model;
  input.flags = engines::parse_launch_command(kvaudit::testing::registry(), command, "--launch");
  input.flags.engine_version = version;
  input.engine = &kvaudit::testing::engine(input.flags.engine);
  input.version_given = true;
  return run_check(input);
}

// Copies, so a temporary result may be passed.
std::vector<Finding> tier_findings(const CheckResult& result) {
  std::vector<Finding> out;
  for (const auto& finding : result.findings)
    if (finding.id == "kv-tier-hazard") out.push_back(finding);
  return out;
}

bool names(const Finding& finding, const std::string& id) {
  return finding.title.find(id) != std::string::npos;
}

// vLLM's tiered offloading with a filesystem tier, as the issue that reported it launched
// it (vllm#53569's --kv-transfer-config), on an auto cache dtype.
const char* kTieredFsConfig =
    R"('{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":)"
    R"({"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":268435456,"secondary_tiers":)"
    R"([{"type":"fs","root_dir":"/vllm-kvfs-ds"}]}}')";

TEST(TierHazards, TheLaunchsTransferConfigIsReadAsVllmReadsIt) {
  const engines::LaunchFlags flags = engines::parse_launch_command(
      kvaudit::testing::registry(),
      std::string("vllm serve Qwen/Qwen3-8B --kv-transfer-config ") + kTieredFsConfig, "--launch");
  EXPECT_EQ(flags.tier_settings.at("kv_connector"), "OffloadingConnector");
  EXPECT_EQ(flags.tier_settings.at("offloading_spec"), "TieringOffloadingSpec");
  EXPECT_EQ(flags.tier_settings.at("secondary_tiers"), "fs");
  EXPECT_TRUE(flags.ignored_arguments.empty());
  // A value that is not JSON is kept as given and names no connector.
  const engines::LaunchFlags broken = engines::parse_launch_command(
      kvaudit::testing::registry(), "vllm serve m --kv-transfer-config '{not json'", "--launch");
  EXPECT_EQ(broken.tier_settings.at("kv_transfer_config"), "{not json");
  EXPECT_EQ(broken.tier_settings.count("kv_connector"), 0u);
}

TEST(TierHazards, LmcacheInProcessOnThePackedLayoutIsCritical) {
  const ModelFacts qwen3 = config("qwen-qwen3-8b");
  const std::string inprocess =
      R"(vllm serve Qwen/Qwen3-8B --kv-transfer-config '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}')";
  auto hits = tier_findings(check(qwen3, inprocess, "0.28.0"));
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_TRUE(names(hits[0], "lmcache-4463-inproc-packed-kv"));
  EXPECT_EQ(hits[0].severity, Severity::critical);
  EXPECT_NE(hits[0].reference.find("LMCache/LMCache#4463"), std::string::npos);
  // Before the packed layout (0.25.x, the clean arm of LMCache#4247): nothing.
  EXPECT_TRUE(tier_findings(check(qwen3, inprocess, "0.25.1")).empty());
  // The multi-process connector on a dense model: the documented workaround, clean.
  const std::string mp =
      R"(vllm serve Qwen/Qwen3-8B --kv-transfer-config '{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both"}')";
  EXPECT_TRUE(tier_findings(check(qwen3, mp, "0.28.0")).empty());
  // ... but not on a hybrid (gated-delta-net) model: LMCache#4247.
  auto hybrid = tier_findings(check(config("qwen3.5-397b-a17b"), mp, "0.28.0"));
  ASSERT_EQ(hybrid.size(), 1u);
  EXPECT_TRUE(names(hybrid[0], "lmcache-4247-mp-hybrid-group-edit"));
}

TEST(TierHazards, APersistentTierWarnsOnAnAutoDtypeAndOnWhatItsNamespaceCannotTellApart) {
  const ModelFacts qwen3 = config("qwen-qwen3-8b");
  const std::string launch =
      std::string("vllm serve Qwen/Qwen3-8B --kv-transfer-config ") + kTieredFsConfig;
  auto hits = tier_findings(check(qwen3, launch, "0.28.0"));
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_TRUE(std::any_of(hits.begin(), hits.end(), [](const Finding& f) {
    return names(f, "vllm-49438-persistent-tier-auto-dtype");
  }));
  for (const Finding& finding : hits) EXPECT_EQ(finding.severity, Severity::warning);
  // An explicit dtype keys the namespace: only the identity warning stays.
  auto explicit_dtype = tier_findings(check(qwen3, launch + " --kv-cache-dtype auto", "0.28.0"));
  EXPECT_EQ(explicit_dtype.size(), 2u);  // "auto" given is still auto
  auto bf16 = tier_findings(check(qwen3, launch + " --kv-cache-dtype bfloat16", "0.28.0"));
  ASSERT_EQ(bf16.size(), 1u);
  EXPECT_TRUE(names(bf16[0], "vllm-persistent-tier-identity"));
  // The CPU tier alone (no secondary tier) does not outlive the process: nothing.
  const std::string cpu_only =
      R"(vllm serve Qwen/Qwen3-8B --kv-transfer-config '{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"cpu_bytes_to_use":268435456}}')";
  EXPECT_TRUE(tier_findings(check(qwen3, cpu_only, "0.28.0")).empty());
  EXPECT_TRUE(tier_findings(check(qwen3,
                                  "vllm serve Qwen/Qwen3-8B --kv-offloading-backend native "
                                  "--kv-offloading-size 64",
                                  "0.28.0"))
                  .empty());
}

TEST(TierHazards, HiCacheWithAnFp4CacheLosesItsBlockScales) {
  const ModelFacts qwen35 = config("nvidia-qwen3.5-397b-a17b-nvfp4");
  const std::string hicache =
      "python3 -m sglang.launch_server --model-path nvidia/Qwen3.5-397B-A17B-NVFP4 --tp 4 "
      "--enable-hierarchical-cache --hicache-ratio 2 --kv-cache-dtype ";
  auto hits = tier_findings(check(qwen35, hicache + "nvfp4", "0.5.18"));
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_TRUE(names(hits[0], "sglang-36121-hicache-fp4-block-scales"));
  EXPECT_EQ(hits[0].severity, Severity::critical);
  EXPECT_NE(hits[0].fix.find("fp8_e4m3"), std::string::npos);
  // The boolean flag takes no value: the next flag is still read.
  EXPECT_EQ(check(qwen35, hicache + "nvfp4", "0.5.18").resolved.kv_cache_dtype, "nvfp4");
  // The same tier with an FP8 cache, and the FP4 cache without the tier: clean.
  EXPECT_TRUE(tier_findings(check(qwen35, hicache + "fp8_e4m3", "0.5.18")).empty());
  EXPECT_TRUE(tier_findings(check(qwen35,
                                  "python3 -m sglang.launch_server --model-path m --tp 4 "
                                  "--kv-cache-dtype nvfp4",
                                  "0.5.18"))
                  .empty());
}

// sglang#32176's flags (v0.5.15.post1, GLM-5.2): HiCache with EAGLE lost the draft cache on a
// host hit; the release with PR #30393 keeps it.
TEST(TierHazards, HiCacheWithADraftModelBeforeTheDraftCacheFixWarns) {
  const ModelFacts qwen3 = config("qwen-qwen3-8b");
  const std::string launch =
      "python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B --speculative-algorithm EAGLE "
      "--enable-hierarchical-cache --hicache-ratio 3 --hicache-write-policy "
      "write_through_selective --hicache-io-backend kernel";
  auto old = tier_findings(check(qwen3, launch, "0.5.15"));
  ASSERT_EQ(old.size(), 1u);
  EXPECT_TRUE(names(old[0], "sglang-30393-hicache-draft-state"));
  EXPECT_EQ(old[0].severity, Severity::warning);
  EXPECT_TRUE(tier_findings(check(qwen3, launch, "0.5.18")).empty());
  // With P/D disaggregation the later release still gets a note (acceptance reported lower).
  auto pd = tier_findings(check(qwen3, launch + " --disaggregation-mode decode", "0.5.18"));
  ASSERT_EQ(pd.size(), 2u);
  for (const Finding& finding : pd) EXPECT_EQ(finding.severity, Severity::info);
}

// ---------------------------------------------------------------- real launch files
// tests/fixtures/launch/sources/tiers/ (SOURCES.md names each file's repository and commit).

fs::path tier_file(const std::string& name) {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "launch" / "sources" / "tiers" / name;
}

// The command lines of a shell script that start `entry`, each with its continuations
// joined (a `\` before a comment ends the command, as bash reads it).
std::vector<std::string> commands_in_script(const fs::path& script, const std::string& entry) {
  std::ifstream in(script);
  std::vector<std::string> commands;
  std::string line, current;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!inside && line.find(entry) == std::string::npos) continue;
    inside = true;
    const bool continued = !line.empty() && line.back() == '\\';
    current += (continued ? line.substr(0, line.size() - 1) : line) + " ";
    if (!continued) {
      commands.push_back(current);
      current.clear();
      inside = false;
    }
  }
  return commands;
}

CheckResult check_flags(const ModelFacts& model, engines::LaunchFlags flags,
                        const std::string& version) {
  CheckInput input;
  input.model = model;
  flags.engine_version = version;
  input.engine = &kvaudit::testing::engine(flags.engine);
  input.flags = std::move(flags);
  input.version_given = true;
  return run_check(input);
}

// llm-d's tiered-prefix-cache guide (vLLM, OffloadingConnector with a filesystem tier):
// the persistent-tier warnings, from the manifest as written.
TEST(TierHazardsInRealLaunches, LlmdTieredFilesystemGuide) {
  auto launches = engines::read_launch_file(kvaudit::testing::registry(),
                                            tier_file("llmd-tiered-fs-vllm.yaml"));
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches[0].tier_settings.at("kv_connector"), "OffloadingConnector");
  EXPECT_EQ(launches[0].tier_settings.at("offloading_spec"), "TieringOffloadingSpec");
  EXPECT_EQ(launches[0].tier_settings.at("secondary_tiers"), "fs");
  auto hits = tier_findings(check_flags(config("qwen-qwen3-14b"), launches[0], "0.28.0"));
  ASSERT_EQ(hits.size(), 2u);
  for (const Finding& finding : hits) EXPECT_EQ(finding.severity, Severity::warning);
}

// LMCache's own P/D example: both vLLM launches use the in-process connector.
TEST(TierHazardsInRealLaunches, LmcacheDisaggExampleUsesTheInProcessConnector) {
  auto commands = commands_in_script(tier_file("lmcache-vllm-disagg-launcher.sh"), "vllm serve");
  ASSERT_EQ(commands.size(), 2u);
  for (const std::string& command : commands) {
    engines::LaunchFlags flags =
        engines::parse_launch_command(kvaudit::testing::registry(), command, "launcher");
    EXPECT_EQ(flags.tier_settings.at("kv_connector"), "LMCacheConnectorV1") << command;
    auto hits = tier_findings(check_flags(config("qwen-qwen3-8b"), flags, "0.28.0"));
    ASSERT_EQ(hits.size(), 1u) << command;
    EXPECT_TRUE(names(hits[0], "lmcache-4463-inproc-packed-kv"));
    EXPECT_TRUE(tier_findings(check_flags(config("qwen-qwen3-8b"), flags, "0.25.1")).empty());
  }
}

// SGLang's HiCache best-practices page: a prefill server with HiCache and a decode server, on
// P/D disaggregation. Each is told to match the other's KV dtype; an FP4 cache on the
// HiCache side would lose its scales.
TEST(TierHazardsInRealLaunches, SglangHiCacheDisaggregationPair) {
  auto commands = commands_in_script(tier_file("sglang-hicache-pd-disagg.L154-193.sh"),
                                     "python3 -m sglang.launch_server");
  ASSERT_EQ(commands.size(), 2u);
  engines::LaunchFlags prefill =
      engines::parse_launch_command(kvaudit::testing::registry(), commands[0], "prefill");
  EXPECT_EQ(prefill.tier_settings.at("hierarchical_cache"), "true");
  EXPECT_EQ(prefill.tier_settings.at("hicache_storage_backend"), "hf3fs");
  EXPECT_EQ(prefill.tier_settings.at("disaggregation_mode"), "prefill");
  const ModelFacts qwen35 = config("nvidia-qwen3.5-397b-a17b-nvfp4");
  auto as_written = tier_findings(check_flags(qwen35, prefill, "0.5.18"));
  ASSERT_EQ(as_written.size(), 1u);
  EXPECT_TRUE(names(as_written[0], "sglang-19398-pd-kv-dtype-unchecked"));
  EXPECT_EQ(as_written[0].severity, Severity::info);
  prefill.kv_cache_dtype = "nvfp4";
  auto fp4 = tier_findings(check_flags(qwen35, prefill, "0.5.18"));
  EXPECT_TRUE(std::any_of(fp4.begin(), fp4.end(), [](const Finding& f) {
    return names(f, "sglang-36121-hicache-fp4-block-scales") && f.severity == Severity::critical;
  }));
  // The decode command, as bash reads it, ends at the `\  # comment` line: it never gets
  // --disaggregation-mode, so only what it sets is read.
  engines::LaunchFlags decode =
      engines::parse_launch_command(kvaudit::testing::registry(), commands[1], "decode");
  EXPECT_EQ(decode.tier_settings.count("hierarchical_cache"), 0u);
  EXPECT_EQ(decode.tier_settings.count("disaggregation_mode"), 0u);
}

// llm-d's HiCache guide with a Mooncake store: the settings read from the manifest's args; the
// tier is clean with the model's own cache dtype and critical with an FP4 one.
TEST(TierHazardsInRealLaunches, LlmdSglangHiCacheMooncakeGuide) {
  auto launches = engines::read_launch_file(kvaudit::testing::registry(),
                                            tier_file("llmd-sglang-hicache-mooncake.yaml"));
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches[0].tier_settings.at("hierarchical_cache"), "true");
  EXPECT_EQ(launches[0].tier_settings.at("hicache_size_gb"), "200");
  EXPECT_EQ(launches[0].tier_settings.at("hicache_storage_backend"), "mooncake");
  EXPECT_EQ(launches[0].tp, 2);  // --tensor-parallel-size=2 in args:, reached through "$@"
  const ModelFacts qwen35 = config("nvidia-qwen3.5-397b-a17b-nvfp4");
  EXPECT_TRUE(tier_findings(check_flags(qwen35, launches[0], "0.5.18")).empty());
  engines::LaunchFlags fp4 = launches[0];
  fp4.kv_cache_dtype = "fp4_mx_block16";
  fp4.kv_cache_dtype_flag = "--kv-cache-dtype";
  auto hits = tier_findings(check_flags(qwen35, fp4, "0.5.18"));
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_TRUE(names(hits[0], "sglang-36121-hicache-fp4-block-scales"));
}

// A disaggregated pair: the prefill and decode launches of one file compared as resolved.
TEST(TransferPairs, TheRoleComesFromSGLangsModeOrVllmsKvRole) {
  const auto& registry = kvaudit::testing::registry();
  EXPECT_EQ(transfer_role(engines::parse_launch_command(
                registry,
                "python3 -m sglang.launch_server --model-path m --disaggregation-mode "
                "decode",
                "--launch")),
            "decode");
  EXPECT_EQ(transfer_role(engines::parse_launch_command(
                registry,
                "vllm serve m --kv-transfer-config "
                "'{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_producer\"}'",
                "--launch")),
            "prefill");
  EXPECT_EQ(transfer_role(engines::parse_launch_command(
                registry,
                "vllm serve m --kv-transfer-config "
                "'{\"kv_connector\":\"LMCacheConnectorV1\",\"kv_role\":\"kv_both\"}'",
                "--launch")),
            "");
}

TEST(TransferPairs, SGLangSidesThatDisagreeOnTheKvDtypeAreCriticalAndAgreeingOnesANote) {
  const std::vector<TransferSide> mismatched = {
      {"service prefill", "sglang", "prefill", "fp8_e4m3", ""},
      {"service decode", "sglang", "decode", "bf16", ""},
      {"service router", "sglang", "", "bf16", ""}};
  TransferPairCheck pairs = check_transfer_pairs(mismatched, "compose.yaml");
  ASSERT_EQ(pairs.findings.size(), 1u);
  EXPECT_EQ(pairs.findings[0].id, "kv-transfer-dtype-mismatch");
  EXPECT_EQ(pairs.findings[0].severity, Severity::critical);
  EXPECT_NE(pairs.findings[0].reference.find("#19398"), std::string::npos);
  EXPECT_NE(pairs.findings[0].title.find("fp8_e4m3 against bf16"), std::string::npos);
  const std::vector<TransferSide> matched = {{"service prefill", "sglang", "prefill", "bf16", ""},
                                             {"service decode", "sglang", "decode", "bf16", ""}};
  pairs = check_transfer_pairs(matched, "compose.yaml");
  EXPECT_TRUE(pairs.findings.empty());
  ASSERT_EQ(pairs.notes.size(), 1u);
  EXPECT_NE(pairs.notes[0].find("same KV cache dtype (bf16)"), std::string::npos);
}

TEST(TransferPairs, AModelDtypeMismatchCountsAndOtherEnginesWarn) {
  const std::vector<TransferSide> sides = {{"a", "vllm", "prefill", "bf16", "bfloat16"},
                                           {"b", "vllm", "decode", "bf16", "float16"}};
  const TransferPairCheck pairs = check_transfer_pairs(sides, "deploy.yaml");
  ASSERT_EQ(pairs.findings.size(), 1u);
  EXPECT_EQ(pairs.findings[0].severity, Severity::warning);
  EXPECT_NE(pairs.findings[0].title.find("model dtypes: bfloat16 against float16"),
            std::string::npos);
}

}  // namespace
}  // namespace tiers
}  // namespace kvaudit::audit
