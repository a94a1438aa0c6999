// Launch files as kvaudit reads them: real Kubernetes manifests, docker-compose files and
// engine --config YAML from public repositories (tests/fixtures/launch/sources/SOURCES.md),
// the bundled example's deployment in each form, and the corrected files --write-unit writes
// (the KV dtype setting changed, every other byte kept).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/registry.h"
#include "decide/decide.h"
#include "engines/engines.h"
#include "util/util.h"

namespace kvaudit::engines {
namespace {

namespace fs = std::filesystem;
using kvaudit::testing::registry;

fs::path source(const std::string& name) {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "launch" / "sources" / name;
}

fs::path example(const std::string& name) {
  return fs::path(KVAUDIT_TEST_DIR).parent_path() / "examples" / "qwen3.5-397b-a17b-nvfp4" / name;
}

// A scratch folder per test, removed at the end.
struct Scratch {
  fs::path dir;
  Scratch() {
    dir = fs::temp_directory_path() /
          ("kvaudit-launch-files-" +
           std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name, std::ios::binary) << text;
    return dir / name;
  }
};

// The file with the KV dtype set to `value` where each launch of it takes it.
std::string corrected(const std::vector<LaunchFlags>& launches, const std::string& value) {
  std::vector<TextEdit> edits;
  for (const auto& launch : launches) {
    EXPECT_TRUE(launch.kv_dtype_edit) << launch.workload << " in " << launch.launch_file;
    if (launch.kv_dtype_edit) edits.push_back(*launch.kv_dtype_edit);
  }
  if (edits.empty()) return "";
  return decide::fix_launch_file(read_text_file(edits.front().file), edits, value, "test");
}

// What the correction did: the bytes removed and added, when the two texts share a head and
// a tail around one changed span.
std::pair<std::string, std::string> changed_span(const std::string& before,
                                                 const std::string& after) {
  size_t head = 0;
  while (head < before.size() && head < after.size() && before[head] == after[head]) ++head;
  size_t tail = 0;
  while (tail < before.size() - head && tail < after.size() - head &&
         before[before.size() - 1 - tail] == after[after.size() - 1 - tail])
    ++tail;
  return {before.substr(head, before.size() - head - tail),
          after.substr(head, after.size() - head - tail)};
}

TEST(LaunchFiles, AGkeDeploymentNamesItsE5m2CacheAtTheArgsLine) {
  const auto launches =
      read_launch_file(registry(), source("k8s/gke-vllm-gemma-7b-kvcache-deployment.yaml"));
  ASSERT_EQ(launches.size(), 1u);
  const LaunchFlags& flags = launches.front();
  EXPECT_EQ(flags.engine, "vllm");
  EXPECT_EQ(flags.kv_cache_dtype, "fp8_e5m2");
  EXPECT_EQ(flags.model_path, "google/gemma-7b") << "$(MODEL_ID) expands from the container env";
  EXPECT_EQ(flags.launch_file_kind, "Kubernetes Deployment");
  EXPECT_NE(flags.workload.find("Deployment/"), std::string::npos) << flags.workload;
  EXPECT_NE(flags.workload.find("document 1"), std::string::npos) << flags.workload;
  const SettingSite& site = flags.sites.at("kv_cache_dtype");
  EXPECT_EQ(site.line, 36);
  EXPECT_EQ(site.key_path, "spec.template.spec.containers[0].args[2]");
  const std::string before = read_text_file(flags.launch_file);
  const std::string after = corrected(launches, "bfloat16");
  EXPECT_EQ(changed_span(before, after),
            std::make_pair(std::string("fp8_e5m2"), std::string("bfloat16")));
}

TEST(LaunchFiles, ExplicitAutoIsReadAndTheModelDtypeIsNotTheCacheDtype) {
  // The file is a template ({{HF_TOKEN}} in its Secret); its Deployment is plain YAML.
  const auto launches =
      read_launch_file(registry(), source("k8s/gke-vllm-llama4-maverick-deployment.yaml"));
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches.front().kv_cache_dtype, "auto");
  EXPECT_EQ(launches.front().kv_cache_dtype_flag, "--kv-cache-dtype");
  EXPECT_EQ(launches.front().sites.at("kv_cache_dtype").line, 55);
}

TEST(LaunchFiles, AShellScriptInALeaderWorkerSetIsReadWithVllmsUnderscoreFlags) {
  const auto launches =
      read_launch_file(registry(), source("k8s/lws-vllm-gpu-leaderworkerset.yaml"));
  // The leader runs vLLM inside `sh -c`; the worker runs only the Ray join script.
  ASSERT_EQ(launches.size(), 1u);
  const LaunchFlags& leader = launches.front();
  EXPECT_NE(leader.workload.find("(leader)"), std::string::npos) << leader.workload;
  EXPECT_EQ(leader.pp, 2) << "--pipeline_parallel_size is --pipeline-parallel-size to vLLM";
  EXPECT_EQ(leader.kv_cache_dtype, "auto");
  // No KV flag: a correction goes right after the entry point, inside the script.
  const std::string before = read_text_file(leader.launch_file);
  const std::string after = corrected(launches, "bfloat16");
  EXPECT_EQ(after.size(), before.size() + std::string(" --kv-cache-dtype bfloat16").size());
  EXPECT_NE(after.find("api_server --kv-cache-dtype bfloat16 --port 8080"), std::string::npos)
      << after;
  auto reread = read_launch_file(registry(), Scratch().write("lws.yaml", after));
  EXPECT_EQ(reread.front().kv_cache_dtype, "bfloat16");
}

TEST(LaunchFiles, LeaderAndWorkerOfAnSglangLeaderWorkerSetAreTwoLaunches) {
  const auto launches = read_launch_file(registry(), source("k8s/lws-sglang-leaderworkerset.yaml"));
  ASSERT_EQ(launches.size(), 2u);
  EXPECT_EQ(launches[0].engine, "sglang");
  EXPECT_EQ(launches[0].tp, 2);
  EXPECT_EQ(launches[1].tp, 2);
  EXPECT_NE(launches[0].workload.find("(leader)"), std::string::npos);
  EXPECT_NE(launches[1].workload.find("(worker)"), std::string::npos);
  // One correction per container, both in the file.
  Scratch scratch;
  const std::string after = corrected(launches, "bf16");
  auto reread = read_launch_file(registry(), scratch.write("lws.yaml", after));
  ASSERT_EQ(reread.size(), 2u);
  EXPECT_EQ(reread[0].kv_cache_dtype, "bf16");
  EXPECT_EQ(reread[1].kv_cache_dtype, "bf16");
}

TEST(LaunchFiles, FlowListsTakeANewItemInTheirOwnStyle) {
  const auto launches =
      read_launch_file(registry(), source("k8s/sglang-k8s-service-deployment.yaml"));
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches.front().model_path, "meta-llama/Meta-Llama-3.1-8B-Instruct");
  const std::string before = read_text_file(launches.front().launch_file);
  const std::string after = corrected(launches, "bf16");
  EXPECT_EQ(changed_span(before, after).second, ", \"--kv-cache-dtype=bf16\"");
  Scratch scratch;
  EXPECT_EQ(read_launch_file(registry(), scratch.write("d.yaml", after)).front().kv_cache_dtype,
            "bf16");
}

TEST(LaunchFiles, ABashLiteralBlockInAStatefulSetIsOneLaunch) {
  const auto launches =
      read_launch_file(registry(), source("k8s/sglang-distributed-statefulset.yaml"));
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches.front().tp, 16);
  EXPECT_EQ(launches.front().model_path, "/llm-folder");
  EXPECT_EQ(launches.front().sites.at("tp").line, 32) << "the flag's own line in the block";
  EXPECT_EQ(launches.front().launch_file_kind, "Kubernetes StatefulSet");
}

TEST(LaunchFiles, ComposeEntrypointAndPlainMultilineCommand) {
  const auto launches = read_launch_file(registry(), source("compose/sglang-docker-compose.yaml"));
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches.front().engine, "sglang");
  EXPECT_EQ(launches.front().port, 30000);
  EXPECT_EQ(launches.front().workload, "service sglang");
  EXPECT_EQ(launches.front().sites.at("port").line, 18);
}

TEST(LaunchFiles, ComposeWithOnlyACommandRunsTheImagesEntryPoint) {
  const auto launches =
      read_launch_file(registry(), source("compose/trinq-vllm-qwen3-30b-docker-compose.yaml"));
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches.front().engine, "vllm") << "vllm/vllm-openai's ENTRYPOINT starts vLLM";
  EXPECT_FALSE(launches.front().model_path.empty());
}

TEST(LaunchFiles, ComposeFilesThatHideTheLaunchSayWhatTheyHold) {
  try {
    read_launch_file(registry(), source("compose/harbor-compose.vllm.yml"));
    FAIL() << "no engine command in the file";
  } catch (const InputError& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("harbor-compose.vllm.yml"), std::string::npos) << what;
    EXPECT_NE(what.find("HARBOR_VLLM_EXTRA_ARGS"), std::string::npos) << what;
  }
  try {
    read_launch_file(registry(), source("compose/dgx-spark-txt2kg-vllm.L9+L81-128.yml"));
    FAIL() << "the service has no command";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("service vllm: no command"), std::string::npos)
        << error.what();
  }
}

TEST(LaunchFiles, HelmValuesAreNotALaunch) {
  try {
    read_launch_file(registry(), source("helm/kubeai-models-values.L1-70.yaml"));
    FAIL() << "a values file launches nothing until it is rendered";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("no launch of a known engine"), std::string::npos)
        << error.what();
  }
}

TEST(LaunchFiles, ProductionStacksRenderedCommandReadsItsUnderscoreFlags) {
  // The chart's own unit test states the command it renders: put it in a Deployment.
  const std::string expected =
      read_text_file(source("helm/prodstack-helm-unittest-rendered-command.L275-327.yaml"));
  std::vector<std::string> words;
  bool in_value = false;
  std::istringstream lines(expected);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find("path: spec.template.spec.containers[0].command") != std::string::npos)
      in_value = true;
    const size_t dash = line.find("- ");
    if (!in_value || dash == std::string::npos || line.find("value:") != std::string::npos)
      continue;
    if (line.substr(0, dash).find_first_not_of(' ') != std::string::npos) continue;
    words.push_back(line.substr(dash + 2));
  }
  ASSERT_GE(words.size(), 12u);
  std::string manifest =
      "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: vllm-opt125m\nspec:\n"
      "  template:\n    spec:\n      containers:\n        - name: vllm\n          command:\n";
  for (const auto& word : words) manifest += "            - " + word + "\n";
  Scratch scratch;
  const auto launches = read_launch_file(registry(), scratch.write("rendered.yaml", manifest));
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches.front().model_path, "facebook/opt-125m");
  ASSERT_TRUE(launches.front().memory_fraction);
  EXPECT_DOUBLE_EQ(*launches.front().memory_fraction, 0.8) << "--gpu_memory_utilization";
  EXPECT_EQ(launches.front().context_length, 1024);
}

TEST(LaunchFiles, AnEnginesConfigFileIsALaunchWithEngine) {
  const auto sglang = read_launch_file(
      registry(), source("vllm-config/gpu-recipes-sglang-dynamo-dsr1-decode.yaml"), "sglang");
  ASSERT_EQ(sglang.size(), 1u);
  EXPECT_EQ(sglang.front().kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(sglang.front().sites.at("kv_cache_dtype").line, 26);
  EXPECT_TRUE(sglang.front().fields_from_config.count("kv_cache_dtype"));
  const auto vllm =
      read_launch_file(registry(), source("vllm-config/vllm-tests-test_config.yaml"), "vllm");
  EXPECT_EQ(vllm.front().tp, 2) << "tensor_parallel_size: vLLM reads underscores as dashes";
  EXPECT_EQ(vllm.front().port, 12312);
  EXPECT_THROW(read_launch_file(registry(), source("vllm-config/vllm-tests-test_config.yaml")),
               InputError)
      << "without --engine a flat YAML is not known to be a launch";
}

TEST(LaunchFiles, VllmConfigFileLosesToTheCommandLine) {
  Scratch scratch;
  const fs::path config =
      scratch.write("config.yaml", "kv-cache-dtype: fp8\nmax_model_len: 8192\n");
  const std::string unit_text =
      fmt::format("[Service]\nExecStart=vllm serve org/model --config {} --kv-cache-dtype auto\n",
                  config.string());
  LaunchFlags flags = parse_systemd_unit(registry(), scratch.write("v.service", unit_text));
  EXPECT_EQ(flags.kv_cache_dtype, "auto") << "cli > config > defaults";
  EXPECT_EQ(flags.context_length, 8192);
  EXPECT_EQ(flags.sites.at("context_length").file, config.string());
  EXPECT_EQ(flags.sites.at("context_length").line, 2);
  EXPECT_EQ(flags.sites.at("kv_cache_dtype").line, 2) << "the unit's ExecStart line";
  flags = parse_launch_command(registry(), "vllm serve org/model --config " + config.string(),
                               "--launch");
  EXPECT_EQ(flags.kv_cache_dtype, "fp8");
  EXPECT_EQ(flags.model_path, "org/model");
  EXPECT_EQ(flags.sites.at("kv_cache_dtype").file, config.string());
  EXPECT_EQ(flags.sites.at("kv_cache_dtype").line, 1);
}

TEST(LaunchFiles, TheMotivatingDeploymentReadsTheSameInEveryForm) {
  const LaunchFlags unit = parse_systemd_unit(registry(), example("sglang.service"));
  std::vector<LaunchFlags> forms;
  for (const char* name :
       {"deploy/kubernetes-deployment.yaml", "deploy/helm-rendered.yaml", "deploy/compose.yaml"}) {
    const auto launches = read_launch_file(registry(), example(name));
    ASSERT_EQ(launches.size(), 1u) << name;
    forms.push_back(launches.front());
  }
  forms.push_back(
      read_launch_file(registry(), example("deploy/sglang-config.yaml"), "sglang").front());
  for (const LaunchFlags& form : forms) {
    SCOPED_TRACE(form.launch_file);
    EXPECT_EQ(form.engine, unit.engine);
    EXPECT_EQ(form.model_path, unit.model_path);
    EXPECT_EQ(form.kv_cache_dtype, unit.kv_cache_dtype);
    EXPECT_EQ(form.kv_cache_dtype_flag, unit.kv_cache_dtype_flag);
    EXPECT_EQ(form.tp, unit.tp);
    EXPECT_EQ(form.context_length, unit.context_length);
    EXPECT_EQ(form.memory_fraction, unit.memory_fraction);
    EXPECT_EQ(form.port, unit.port);
    // The correction adds the flag and nothing else; the file then reads bf16.
    const std::string before = read_text_file(form.launch_file);
    const std::string after = corrected({form}, "bf16");
    const auto [removed, added] = changed_span(before, after);
    EXPECT_EQ(removed, "");
    EXPECT_NE(added.find("kv-cache-dtype"), std::string::npos) << added;
    EXPECT_NE(added.find("bf16"), std::string::npos) << added;
    Scratch scratch;
    const fs::path fixed = scratch.write(fs::path(form.launch_file).filename().string(), after);
    const auto reread = read_launch_file(
        registry(), fixed, form.launch_file_kind.rfind("sglang", 0) == 0 ? "sglang" : "");
    EXPECT_EQ(reread.front().kv_cache_dtype, "bf16");
  }
}

TEST(LaunchFiles, TensorrtLlmConfigFilesTakeTheKvDtypeUnderKvCacheConfig) {
  // The value where it stands, a new key in a kv_cache_config block, a new block.
  for (const auto& [name, expected] : std::vector<std::pair<std::string, std::string>>{
           {"trtllm-curated-llama-3.3-70b.yaml", "fp8"},
           {"trtllm-curated-qwen3-disagg-prefill.yaml", "auto"}}) {
    SCOPED_TRACE(name);
    const std::string path = source("trtllm/" + name).string();
    const LaunchFlags flags =
        parse_launch_command(registry(), "trtllm-serve /m --config " + path, "--launch");
    EXPECT_EQ(flags.kv_cache_dtype, expected);
    const std::string before = read_text_file(path);
    const std::string after = corrected({flags}, "nvfp4");
    if (expected == "fp8") {
      EXPECT_EQ(changed_span(before, after),
                std::make_pair(std::string("fp8"), std::string("nvfp4")));
      EXPECT_EQ(flags.sites.at("kv_cache_dtype").line, 11);
    } else {
      EXPECT_EQ(changed_span(before, after).second, "dtype: nvfp4\n  ");
    }
    Scratch scratch;
    const fs::path fixed = scratch.write("fixed.yaml", after);
    EXPECT_EQ(
        parse_launch_command(registry(), "trtllm-serve /m --config " + fixed.string(), "--launch")
            .kv_cache_dtype,
        "nvfp4");
  }
  Scratch scratch;
  const fs::path bare = scratch.write("bare.yaml", "max_batch_size: 8");
  const LaunchFlags flags =
      parse_launch_command(registry(), "trtllm-serve /m --config " + bare.string(), "--launch");
  const std::string after = corrected({flags}, "fp8");
  EXPECT_EQ(after, "max_batch_size: 8\nkv_cache_config:\n  dtype: fp8\n");
}

// Nine aliases per level of nested Lists name 9^8 pods in ten lines: refused, not walked.
std::string list_of_lists_by_alias() {
  std::string text =
      "apiVersion: v1\nkind: List\na0: &a0 {apiVersion: v1, kind: Pod, metadata: {name: p}, "
      "spec: {containers: [{name: c, command: [vllm, serve, m]}]}}\n";
  for (int level = 1; level <= 8; ++level) {
    text += fmt::format("a{}: &a{} {{apiVersion: v1, kind: List, items: [", level, level);
    for (int k = 0; k < 9; ++k) text += fmt::format("{}*a{}", k ? ", " : "", level - 1);
    text += "]}\n";
  }
  return text + "items: [*a8, *a8, *a8]\n";
}

TEST(LaunchFiles, BadFilesGetOneLineNamingTheFile) {
  Scratch scratch;
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"template.yaml", "kind: Deployment\nmetadata: {name: {{ .Values.name }}\n"},
           {"broken.yaml", "a: [1, 2\n"},
           {"deep.yaml", std::string(100, '[') + std::string(100, ']') + "\n"},
           {"scalar.yaml", "just words\n"},
           // yaml-cpp 0.7 alone reads this forever (a document opening with a flow entry).
           {"leading-comma.yaml", ",image: vllm\n"},
           {"many-documents.yaml",
            [] {
              std::string text;
              for (int i = 0; i < 5000; ++i) text += "---\n";
              return text;
            }()},
           {"laughs.yaml", list_of_lists_by_alias()},
           {"lists.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n"
            "    command: [vllm, serve, m, [nested]]\n"}}) {
    SCOPED_TRACE(name);
    try {
      read_launch_file(registry(), scratch.write(name, text));
      FAIL() << "accepted";
    } catch (const InputError& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find(name), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace kvaudit::engines
