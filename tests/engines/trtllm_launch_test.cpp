// TensorRT-LLM's launch grammar through the registry's data: trtllm-serve's underscore
// flags, its --config / --extra_llm_api_options YAML (real files from NVIDIA's curated configs
// and users' repositories), release-candidate versions, and the fixes that data spells.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/registry.h"
#include "engines/engines.h"
#include "util/util.h"

namespace kvaudit::engines {
namespace {

namespace fs = std::filesystem;

fs::path yaml_fixture(const std::string& name) {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "launch" / "trtllm" / name;
}

Version v(const char* text) {
  return *parse_version(text);
}

TEST(TrtllmVersions, ReleaseCandidatesSortBeforeTheirRelease) {
  EXPECT_LT(v("1.3.0rc6"), v("1.3.0rc7"));
  EXPECT_LT(v("1.3.0rc7"), v("1.3.0rc10"));
  EXPECT_LT(v("1.3.0rc26"), v("1.3.0"));
  EXPECT_LT(v("1.2.1"), v("1.3.0rc0"));
  EXPECT_EQ(version_text(v("1.3.0rc7")), "1.3.0rc7");
  EXPECT_EQ(version_text(v("v1.1.0")), "1.1.0");
  auto since = parse_version_range(">=1.3.0rc7");
  ASSERT_TRUE(since);
  EXPECT_TRUE(since->contains(v("1.3.0rc7")));
  EXPECT_TRUE(since->contains(v("1.3.0rc10")));
  EXPECT_TRUE(since->contains(v("1.3.0")));
  EXPECT_FALSE(since->contains(v("1.3.0rc6")));
  EXPECT_FALSE(since->contains(v("1.2.0")));
  EXPECT_FALSE(parse_version_range(">=1.3.0rcx")) << "a candidate bound needs its number";
}

// NVIDIA's curated Llama-3.3-70B deployment: the KV dtype is set only in the YAML.
TEST(TrtllmLaunch, TheCuratedConfigSetsTheKvDtype) {
  const std::string command =
      "trtllm-serve nvidia/Llama-3.3-70B-Instruct-FP8 --host 0.0.0.0 --port 8000 "
      "--max_batch_size 1024 --max_num_tokens 2048 --max_seq_len 2048 "
      "--kv_cache_free_gpu_memory_fraction 0.9 --tp_size 1 --ep_size 1 --trust_remote_code "
      "--extra_llm_api_options " +
      yaml_fixture("curated-llama-3.3-70b.yaml").string();
  LaunchFlags flags = parse_launch_command(kvaudit::testing::registry(), command, "--launch");
  EXPECT_EQ(flags.engine, "trtllm");
  EXPECT_EQ(flags.model_path, "nvidia/Llama-3.3-70B-Instruct-FP8");
  EXPECT_EQ(flags.kv_cache_dtype, "fp8");
  EXPECT_NE(flags.kv_cache_dtype_flag.find("kv_cache_config.dtype"), std::string::npos)
      << flags.kv_cache_dtype_flag;
  EXPECT_EQ(flags.memory_fraction, 0.9);
  EXPECT_EQ(flags.tp, 1);
  EXPECT_EQ(flags.port, 8000);
  EXPECT_EQ(flags.context_length, 2048);
  EXPECT_TRUE(flags.fields_from_config.count("kv_cache_dtype"));
}

// The DeepSeek-R1 curated config sets the fraction at the top level and TP 8; the file wins
// over the command line (trtllm-serve merges it over the CLI arguments).
TEST(TrtllmLaunch, TheFileWinsOverTheCommandLine) {
  const std::string command =
      "trtllm-serve deepseek-ai/DeepSeek-R1-0528 --tp_size 2 "
      "--kv_cache_free_gpu_memory_fraction 0.5 --config " +
      yaml_fixture("curated-deepseek-r1-throughput.yaml").string();
  LaunchFlags flags = parse_launch_command(kvaudit::testing::registry(), command, "--launch");
  EXPECT_EQ(flags.tp, 8);
  EXPECT_EQ(flags.memory_fraction, 0.8);
  EXPECT_EQ(flags.kv_cache_dtype, "fp8");
}

// A commented-out `#kv_cache_dtype: fp8` sets nothing; the aibrix config sets only the
// fraction (the cache stays auto).
TEST(TrtllmLaunch, FilesWithoutADtypeLeaveAuto) {
  for (const char* file : {"user-phatvo9-deepseek-r1-fp4-trt_bench_mtp.yaml",
                           "issue-aibrix2004-qwen3-8b-config.yaml"}) {
    LaunchFlags flags = parse_launch_command(
        kvaudit::testing::registry(),
        std::string("trtllm-serve nvidia/DeepSeek-R1-FP4 --config ") + yaml_fixture(file).string(),
        "--launch");
    EXPECT_EQ(flags.kv_cache_dtype, "auto") << file;
    EXPECT_TRUE(flags.config_errors.empty()) << file;
  }
  LaunchFlags aibrix =
      parse_launch_command(kvaudit::testing::registry(),
                           "trtllm-serve Qwen/Qwen3-8B --config " +
                               yaml_fixture("issue-aibrix2004-qwen3-8b-config.yaml").string(),
                           "--launch");
  EXPECT_EQ(aibrix.memory_fraction, 0.85);
}

// A top-level kv_cache_dtype is refused by the engine (extra="forbid"); an unreadable or
// malformed file stops kvaudit with one line naming it, since the KV dtype may be there.
TEST(TrtllmLaunch, BadFilesAreNamedAndRefusedKeysReported) {
  const fs::path dir = fs::temp_directory_path() / "kvaudit-trtllm-launch-test";
  fs::create_directories(dir);
  {
    std::ofstream(dir / "top.yaml") << "kv_cache_dtype: fp8\nkv_cache_config:\n  dtype: auto\n";
    std::ofstream(dir / "bad.yaml") << "kv_cache_config: [unclosed\n";
    std::ofstream(dir / "list.yaml") << "- a\n- b\n";
    std::ofstream(dir / "deep.yaml") << std::string(100, '[') << std::string(100, ']') << "\n";
  }
  const auto& registry = kvaudit::testing::registry();
  LaunchFlags top = parse_launch_command(
      registry, "trtllm-serve m --config " + (dir / "top.yaml").string(), "--launch");
  ASSERT_EQ(top.config_errors.size(), 1u);
  EXPECT_NE(top.config_errors.front().find("extra=\"forbid\""), std::string::npos);
  EXPECT_EQ(top.kv_cache_dtype, "auto");
  for (const char* name : {"bad.yaml", "list.yaml", "deep.yaml", "missing.yaml"}) {
    try {
      parse_launch_command(registry, "trtllm-serve m --config " + (dir / name).string(),
                           "--launch");
      ADD_FAILURE() << name << " was accepted";
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find(name), std::string::npos) << error.what();
    }
  }
  fs::remove_all(dir);
}

TEST(TrtllmFixes, EachReleaseSpellsItsOwnSetting) {
  const auto& trtllm = kvaudit::testing::engine("trtllm");
  const KvDtypeFix sixteen = kv_dtype_fix(trtllm, v("1.4.0rc4"), "bf16");
  EXPECT_TRUE(sixteen.overlay);
  EXPECT_NE(sixteen.text.find("hf_quant_config.json"), std::string::npos);
  const KvDtypeFix old_fp8 = kv_dtype_fix(trtllm, v("1.2.0rc5"), "fp8_e4m3");
  EXPECT_FALSE(old_fp8.overlay);
  EXPECT_EQ(old_fp8.setting, "kv_cache_config.dtype");
  EXPECT_NE(old_fp8.text.find("kv_cache_config.dtype: fp8"), std::string::npos) << old_fp8.text;
  const KvDtypeFix new_fp8 = kv_dtype_fix(trtllm, v("1.3.0rc7"), "fp8_e4m3");
  EXPECT_EQ(new_fp8.text, "launch with --kv_cache_dtype fp8");
  const KvDtypeFix sglang = kv_dtype_fix(kvaudit::testing::engine("sglang"), v("0.5.23"), "bf16");
  EXPECT_FALSE(sglang.overlay);
  EXPECT_EQ(sglang.text, "launch with --kv-cache-dtype bf16");
}

}  // namespace
}  // namespace kvaudit::engines
