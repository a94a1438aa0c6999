// `kvaudit check org/model` and `kvaudit plan org/model` (the binary, as users run it)
// against the fake hub, compared with the same commands on the local folder: the same
// findings, resolved KV dtype, scale table and capacity rows; the second run fetches
// nothing; --offline works from the cache.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "../hub/fake_hub.h"

namespace kvaudit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct CliRun {
  int exit_code = 0;
  std::string out;
};

// Runs the kvaudit binary with `args` (and environment assignments in front), stdout kept.
CliRun kvaudit(const std::string& env, const std::string& args) {
  const std::string command = env + " " + KVAUDIT_BINARY + " " + args + " 2>/dev/null";
  CliRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return {127, ""};
  std::array<char, 65536> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    run.out.append(buffer.data(), n);
  int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return run;
}

json findings_of(const json& report) {
  json out = json::array();
  for (const auto& f : report.at("findings")) out.push_back({f.at("id"), f.at("severity")});
  return out;
}

TEST(HubCli, CheckAndPlanOfAHubRepositoryMatchTheLocalFolder) {
  ASSERT_EQ(std::system((std::string(KVAUDIT_TEST_DIR) + "/../tools/ensure-demo-checkpoint.sh " +
                         KVAUDIT_BUILD_DIR + " > /dev/null")
                            .c_str()),
            0);
  const fs::path demo = fs::path(KVAUDIT_BUILD_DIR) / "demo-checkpoint";
  const fs::path cache =
      fs::temp_directory_path() / ("kvaudit-hub-cli-" + std::to_string(::getpid()));
  fs::remove_all(cache);
  hub::testing::FakeHub hub({.repos = {{"nvidia/Qwen3.5-397B-A17B-NVFP4", demo}}});
  const std::string env = "KVAUDIT_CACHE_DIR=" + cache.string() +
                          " HF_HUB_CACHE=" + (cache / "none").string() +
                          " HF_TOKEN= HF_HOME=" + (cache / "hf").string();
  // The motivating user's stance (lossless): the FP8-at-scale-1.0 cache is critical.
  const std::string flags =
      " --engine sglang --engine-version 0.5.15 --tp 8 --kv-policy lossless --json";
  CliRun local = kvaudit(env, "check " + demo.string() + flags);
  CliRun remote =
      kvaudit(env, "check nvidia/Qwen3.5-397B-A17B-NVFP4 --hf-endpoint " + hub.endpoint() + flags);
  ASSERT_EQ(local.exit_code, 1) << local.out;  // the motivating FP8-at-scale-1.0 critical
  ASSERT_EQ(remote.exit_code, local.exit_code) << remote.out;
  json a = json::parse(local.out), b = json::parse(remote.out);
  EXPECT_EQ(findings_of(b), findings_of(a));
  EXPECT_EQ(b["resolved_kv"], a["resolved_kv"]);
  EXPECT_EQ(b["tables"], a["tables"]);
  EXPECT_EQ(b["model"]["kv_scale_tensors"], a["model"]["kv_scale_tensors"]);
  EXPECT_EQ(b["model"]["tensor_count"], a["model"]["tensor_count"]);
  EXPECT_EQ(b["verdict"], a["verdict"]);
  EXPECT_THAT(b["title"].get<std::string>(),
              ::testing::HasSubstr("hf://nvidia/Qwen3.5-397B-A17B-NVFP4@"));

  const std::string plan_flags =
      " --engine sglang --engine-version 0.5.23 --tp 8 --gpu h200 --json";
  CliRun plan_local = kvaudit(env, "plan " + demo.string() + plan_flags);
  const int before = hub.hub_requests() + hub.cdn_requests();
  CliRun plan_remote = kvaudit(
      env, "plan nvidia/Qwen3.5-397B-A17B-NVFP4 --hf-endpoint " + hub.endpoint() + plan_flags);
  ASSERT_EQ(plan_remote.exit_code, 0) << plan_remote.out;
  EXPECT_EQ(json::parse(plan_remote.out)["rows"], json::parse(plan_local.out)["rows"]);
  // The second audit of the revision asked one thing: which commit main is.
  EXPECT_EQ(hub.hub_requests() + hub.cdn_requests() - before, 1);
  CliRun offline = kvaudit(
      env, "plan nvidia/Qwen3.5-397B-A17B-NVFP4 --offline --hf-endpoint http://127.0.0.1:1" +
               plan_flags);
  ASSERT_EQ(offline.exit_code, 0);
  EXPECT_EQ(json::parse(offline.out)["rows"], json::parse(plan_local.out)["rows"]);
  // A reference that is neither a local path nor on the hub: one line, exit 2.
  CliRun missing = kvaudit(env, "check nvidia/nothing --hf-endpoint " + hub.endpoint() + flags);
  EXPECT_EQ(missing.exit_code, 2);
  fs::remove_all(cache);
}

}  // namespace
}  // namespace kvaudit
