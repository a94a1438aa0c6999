// Engine data: versions, launch commands, systemd units, and dtype/scale resolution.
#include <gtest/gtest.h>

#include <chrono>

#include <fstream>

#include "common/fixtures.h"
#include "common/registry.h"
#include "engines/engines.h"
#include "util/util.h"

namespace kvaudit::engines {
namespace {

namespace fs = std::filesystem;
using kvaudit::testing::fixture_checkpoint;

TEST(Versions, ParseAndCompare) {
  auto v = parse_version("v0.5.9.post1");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->major, 0);
  EXPECT_EQ(v->minor, 5);
  EXPECT_EQ(v->patch, 9);
  EXPECT_TRUE(version_in_range(*v, ">=0.5.0 <0.5.10"));
  EXPECT_FALSE(version_in_range(*v, ">=0.5.10"));
  EXPECT_TRUE(version_in_range(*parse_version("0.5.x"), ">=0.5.10"));  // the newest 0.5
  EXPECT_TRUE(version_in_range(*parse_version(""), ">=0.14.0"));       // latest
  EXPECT_FALSE(version_in_range(*parse_version("latest"), "<0.11.1"));
  EXPECT_TRUE(version_in_range(*parse_version("0.11.0"), "<0.11.1"));
  EXPECT_TRUE(version_in_range(*parse_version("0.11.0rc2"), "*"));
  EXPECT_FALSE(parse_version("banana"));
}

TEST(Launch, SglangCommandWithEqualsAndContinuations) {
  LaunchFlags flags = parse_launch_command(
      kvaudit::testing::registry(),
      "python3 -m sglang.launch_server \\\n --model-path /models/q --tp=8 --kv-cache-dtype "
      "fp8_e4m3 "
      "--enable-dp-attention --dp 2 --context-length 128k --mem-fraction-static 0.85 "
      "--trust-remote-code "
      "--quantization-param-path '/s/my scales.json'",
      "--launch");
  EXPECT_EQ(flags.engine, "sglang");
  EXPECT_EQ(flags.model_path, "/models/q");
  EXPECT_EQ(flags.tp, 8);
  EXPECT_EQ(flags.dp, 2);
  EXPECT_TRUE(flags.dp_attention);
  EXPECT_EQ(flags.kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(flags.context_length, 131072);
  ASSERT_TRUE(flags.memory_fraction);
  EXPECT_DOUBLE_EQ(*flags.memory_fraction, 0.85);
  EXPECT_EQ(flags.quantization_param_path, "/s/my scales.json");
}

TEST(Launch, VllmServePositionalModel) {
  LaunchFlags flags = parse_launch_command(
      kvaudit::testing::registry(),
      "vllm serve meta-llama/Llama-3.1-8B -tp 4 --kv-cache-dtype fp8 --calculate-kv-scales "
      "--max-model-len 32768",
      "--launch");
  EXPECT_EQ(flags.engine, "vllm");
  EXPECT_EQ(flags.model_path, "meta-llama/Llama-3.1-8B");
  EXPECT_EQ(flags.tp, 4);
  EXPECT_EQ(flags.kv_cache_dtype, "fp8");
  EXPECT_TRUE(flags.calculate_kv_scales);
  EXPECT_EQ(flags.context_length, 32768);
}

// A Kubernetes `command: [sh, -c, 'exec ... "$@"', --]` with the flags in `args:`: the words
// after $0 stand for "$@". Wrappers whose arguments hold the next wrapper are refused past
// 16 levels (each level no longer needs longer text).
TEST(Launch, ShellWrapperArgumentsStandForDollarAt) {
  LaunchFlags flags = parse_launch_command(
      kvaudit::testing::registry(),
      "/bin/sh -c 'ulimit -n 65536; exec python3 -m sglang.launch_server \"$@\"' -- "
      "--model-path=Qwen/Qwen3-32B --tensor-parallel-size=2 --enable-hierarchical-cache",
      "x");
  EXPECT_EQ(flags.engine, "sglang");
  EXPECT_EQ(flags.model_path, "Qwen/Qwen3-32B");
  EXPECT_EQ(flags.tp, 2);
  EXPECT_EQ(flags.tier_settings.at("hierarchical_cache"), "true");
  std::string nested;
  for (int level = 0; level < 17; ++level) nested += "sh -c '\"$@\"' x ";
  try {
    parse_launch_command(kvaudit::testing::registry(), nested + "sh -c 'vllm serve m'", "deep");
    FAIL() << "17 nested wrappers were read";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("nested more than 16 deep"), std::string::npos);
  }
  nested.clear();
  for (int level = 0; level < 15; ++level) nested += "sh -c '\"$@\"' x ";
  EXPECT_EQ(
      parse_launch_command(kvaudit::testing::registry(), nested + "sh -c 'vllm serve m'", "deep")
          .engine,
      "vllm");
  // A script naming "$@" twice doubles the words at each level: refused once past 4,096
  // words, at once, not after 2^15 copies (a fuzz_launch find; the input is in the corpus).
  nested.clear();
  for (int level = 0; level < 15; ++level) nested += "sh -c '\"$@\" \"$@\"' x ";
  const auto started = std::chrono::steady_clock::now();
  try {
    parse_launch_command(kvaudit::testing::registry(), nested + "true", "doubling");
    FAIL() << "a wrapper doubling its words 15 times was read";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("more than 4096 words"), std::string::npos)
        << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(2));
}

TEST(Launch, BashWrapperAndDocker) {
  LaunchFlags wrapped = parse_launch_command(
      kvaudit::testing::registry(),
      "bash -c 'source /venv/bin/activate && python -m sglang.launch_server --model-path /m --tp "
      "2'",
      "x");
  EXPECT_EQ(wrapped.engine, "sglang");
  EXPECT_EQ(wrapped.tp, 2);
  LaunchFlags docker = parse_launch_command(
      kvaudit::testing::registry(),
      "docker run --gpus all -p 8000:8000 vllm/vllm-openai:v0.11.0 vllm serve /m "
      "--tensor-parallel-size 8",
      "x");
  EXPECT_EQ(docker.engine, "vllm");
  EXPECT_EQ(docker.tp, 8);
}

TEST(Launch, Rejections) {
  EXPECT_THROW(parse_launch_command(kvaudit::testing::registry(), "python app.py --port 80", "x"),
               InputError);
  EXPECT_THROW(parse_launch_command(kvaudit::testing::registry(),
                                    "vllm serve /m --kv-cache-dtype 'fp8", "x"),
               InputError);
  EXPECT_THROW(parse_launch_command(kvaudit::testing::registry(), "vllm serve /m -tp eight", "x"),
               InputError);
  EXPECT_THROW(parse_launch_command(kvaudit::testing::registry(),
                                    "python -m sglang.launch_server --tp 0", "x"),
               InputError);
}

TEST(Launch, SystemdUnitWithEnvironment) {
  fs::path unit =
      fs::path(KVAUDIT_TEST_DIR) / ".." / "examples" / "qwen3.5-397b-a17b-nvfp4" / "sglang.service";
  LaunchFlags flags = parse_systemd_unit(kvaudit::testing::registry(), unit);
  EXPECT_EQ(flags.engine, "sglang");
  EXPECT_EQ(flags.model_path, "/models/Qwen3.5-397B-A17B-NVFP4");
  EXPECT_EQ(flags.tp, 8);
  EXPECT_EQ(flags.context_length, 262144);
  EXPECT_EQ(flags.kv_cache_dtype, "auto");
  EXPECT_NE(flags.source.find("sglang.service"), std::string::npos);
}

TEST(Launch, UnitWithoutExecStart) {
  fs::path unit =
      fs::temp_directory_path() / ("kvaudit-unit-" + std::to_string(::getpid()) + ".service");
  std::ofstream(unit) << "[Service]\nEnvironment=A=B\n";
  EXPECT_THROW(parse_systemd_unit(kvaudit::testing::registry(), unit), InputError);
  fs::remove(unit);
}

TEST(EngineData, ChoicesAndAliasesPerVersion) {
  const EngineModel& sglang = kvaudit::testing::engine("sglang");
  auto old_choices = kv_cache_dtype_choices(sglang, *parse_version("0.5.9"));
  EXPECT_EQ(std::count(old_choices.begin(), old_choices.end(), "nvfp4"), 0);
  auto new_choices = kv_cache_dtype_choices(sglang, *parse_version("latest"));
  EXPECT_EQ(std::count(new_choices.begin(), new_choices.end(), "nvfp4"), 1);
  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("bfloat16"), "bf16");
  const EngineModel& vllm = kvaudit::testing::engine("vllm");
  EXPECT_EQ(cli_dtype(vllm, *parse_version("0.11.0"), "fp8"), "fp8_e4m3");
  EXPECT_EQ(cli_dtype(sglang, *parse_version("0.5.9"), "fp8"), "");  // not an SGLang choice
  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("fp8"), "fp8_e4m3");
  EXPECT_THROW(kvaudit::testing::engine("tgi"), InputError);
}

LaunchFlags flags_for(const std::string& engine, const std::string& kv = "auto",
                      const std::string& version = "") {
  LaunchFlags flags;
  flags.engine = engine;
  flags.kv_cache_dtype = kv;
  flags.engine_version = version;
  return flags;
}

TEST(Resolve, SglangAutoEnablesFp8ForModelOptDeclaration) {
  checkpoint::ModelFacts model = checkpoint::read_checkpoint(
      fs::path(KVAUDIT_TEST_DIR) / ".." / "examples" / "qwen3.5-397b-a17b-nvfp4" / "config.json");
  ResolvedKv resolved = resolve_kv(model, flags_for("sglang"), kvaudit::testing::engine("sglang"));
  EXPECT_EQ(resolved.kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(resolved.rule_id, "sglang-auto-modelopt-fp8");
  EXPECT_EQ(engines::scale_source_name(resolved.scale_source), "unit_default");
  EXPECT_TRUE(resolved.scale_warning_text.has_value());
  ResolvedKv bf16 =
      resolve_kv(model, flags_for("sglang", "bf16"), kvaudit::testing::engine("sglang"));
  EXPECT_EQ(bf16.kv_cache_dtype, "bf16");
  EXPECT_EQ(engines::scale_source_name(bf16.scale_source), "not_applicable");
}

TEST(Resolve, VllmVersionDecidesModelOptAuto) {
  checkpoint::ModelFacts model = checkpoint::read_checkpoint(
      fs::path(KVAUDIT_TEST_DIR) / ".." / "examples" / "qwen3.5-397b-a17b-nvfp4" / "config.json");
  const EngineModel& vllm = kvaudit::testing::engine("vllm");
  EXPECT_EQ(resolve_kv(model, flags_for("vllm", "auto", "0.11.0"), vllm).kv_cache_dtype, "bf16");
  EXPECT_EQ(resolve_kv(model, flags_for("vllm", "auto", "0.15.0"), vllm).kv_cache_dtype,
            "fp8_e4m3");
}

// PR #30141 (0.15.0, inferred) made a kv_cache_scheme force fp8 whatever --kv-cache-dtype
// said; PR #42782 (0.22.0) made it auto-only; before #30141 the scheme changed nothing.
TEST(Resolve, VllmCompressedTensorsOverridesCli) {
  checkpoint::ModelFacts model = checkpoint::read_checkpoint(fixture_checkpoint("llama-ct-fp8-kv"));
  ResolvedKv resolved =
      resolve_kv(model, flags_for("vllm", "bfloat16", "0.16.0"), kvaudit::testing::engine("vllm"));
  EXPECT_EQ(resolved.kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(engines::scale_source_name(resolved.scale_source), "checkpoint");
  EXPECT_EQ(resolved.loaded_scale_names.size(), 8u);
  EXPECT_TRUE(resolved.dropped.empty());
  EXPECT_EQ(
      resolve_kv(model, flags_for("vllm", "bfloat16", "0.11.0"), kvaudit::testing::engine("vllm"))
          .kv_cache_dtype,
      "bf16");
  EXPECT_EQ(resolve_kv(model, flags_for("vllm", "auto", "0.11.0"), kvaudit::testing::engine("vllm"))
                .kv_cache_dtype,
            "bf16");
  EXPECT_EQ(
      resolve_kv(model, flags_for("vllm", "bfloat16", "0.22.0"), kvaudit::testing::engine("vllm"))
          .kv_cache_dtype,
      "bf16");
}

TEST(Resolve, SglangDropsQwen3MoeScales) {
  checkpoint::ModelFacts model =
      checkpoint::read_checkpoint(fixture_checkpoint("qwen3-moe-modelopt-fp8"));
  ResolvedKv resolved =
      resolve_kv(model, flags_for("sglang", "auto", "0.5.9"), kvaudit::testing::engine("sglang"));
  EXPECT_EQ(resolved.kv_cache_dtype, "fp8_e4m3");
  ASSERT_EQ(resolved.dropped.size(), 1u);
  EXPECT_EQ(resolved.dropped[0].rule_id, "sglang-39942-qwen-mixtral");
  EXPECT_EQ(resolved.dropped[0].tensor_names.size(), 8u);
  EXPECT_EQ(engines::scale_source_name(resolved.scale_source), "unit_default");
}

TEST(Resolve, ScalesWithoutAKvQuantMethodAreSkipped) {
  // The same scale tensors, but no quantization config: no k_scale parameter exists to
  // load them into, on either engine.
  checkpoint::ModelFacts model = checkpoint::read_checkpoint(fixture_checkpoint("llama-ct-fp8-kv"));
  model.quant.reset();
  for (const char* engine : {"sglang", "vllm"}) {
    ResolvedKv resolved =
        resolve_kv(model, flags_for(engine, "fp8_e4m3", ""), kvaudit::testing::engine(engine));
    EXPECT_EQ(engines::scale_source_name(resolved.scale_source), "unit_default") << engine;
    ASSERT_EQ(resolved.dropped.size(), 1u) << engine;
    EXPECT_NE(resolved.dropped[0].rule_id.find("no-kv-cache-method"), std::string::npos) << engine;
    EXPECT_EQ(resolved.dropped[0].tensor_names.size(), 8u) << engine;
    EXPECT_TRUE(resolved.loaded_scale_names.empty()) << engine;
  }
  // A weight-only method (GPTQ) creates no KV-cache method either.
  model.quant = checkpoint::QuantFacts{};
  model.quant->method = "gptq";
  EXPECT_EQ(engines::scale_source_name(resolve_kv(model, flags_for("vllm", "fp8_e4m3", ""),
                                                  kvaudit::testing::engine("vllm"))
                                           .scale_source),
            "unit_default");
}

TEST(Resolve, VllmMlaScalesDroppedOnlyBeforeFix) {
  checkpoint::ModelFacts model = checkpoint::read_checkpoint(fixture_checkpoint("deepseek-v3-mla"));
  const EngineModel& vllm = kvaudit::testing::engine("vllm");
  ResolvedKv old_version = resolve_kv(model, flags_for("vllm", "fp8", "0.10.2"), vllm);
  ASSERT_EQ(old_version.dropped.size(), 1u);
  EXPECT_EQ(old_version.dropped[0].rule_id, "vllm-25968-mla");
  ResolvedKv fixed = resolve_kv(model, flags_for("vllm", "fp8", "0.12.0"), vllm);
  EXPECT_TRUE(fixed.dropped.empty());
  EXPECT_EQ(engines::scale_source_name(fixed.scale_source), "checkpoint");
}

TEST(Resolve, CalculatedScalesExceptHybridOnceGuarded) {
  const EngineModel& vllm = kvaudit::testing::engine("vllm");
  LaunchFlags flags = flags_for("vllm", "fp8", "0.20.0");
  flags.calculate_kv_scales = true;
  checkpoint::ModelFacts llama =
      checkpoint::read_checkpoint(fixture_checkpoint("llama-bf16-plain"));
  EXPECT_EQ(scale_source_name(resolve_kv(llama, flags, vllm).scale_source), "calculated");
  checkpoint::ModelFacts hybrid = checkpoint::read_checkpoint(fixture_checkpoint("qwen3-next-80b"));
  EXPECT_EQ(scale_source_name(resolve_kv(hybrid, flags, vllm).scale_source), "unit_default");
  flags.engine_version = "0.11.0";  // before PR #37565: calculated on hybrids too
  EXPECT_EQ(scale_source_name(resolve_kv(hybrid, flags, vllm).scale_source), "calculated");
}

}  // namespace
}  // namespace kvaudit::engines
