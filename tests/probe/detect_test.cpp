// Engine detection from SGLang's /get_server_info, vLLM's /metrics, or only /v1/models,
// and the findings each shape of answer supports.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "common/registry.h"
#include "probe/fake_server.h"
#include "probe/probe.h"

namespace kvaudit::probe {
namespace {

using nlohmann::json;
using testing::FakeConfig;
using testing::FakeServer;
using testing::fast_client_options;
using ::testing::HasSubstr;

bool has_finding(const std::vector<report::Finding>& findings, const std::string& id) {
  return std::any_of(findings.begin(), findings.end(),
                     [&](const report::Finding& f) { return f.id == id; });
}

TEST(ProbeDetect, SglangServerInfoTopLevelAndNested) {
  ServerFacts facts;
  facts.url = "http://h";
  read_sglang_server_info(json::parse(R"({"model_path": "/m", "kv_cache_dtype": "fp8_e4m3",
      "context_length": 262144, "page_size": 1, "tp_size": 8, "max_total_num_tokens": 3150000,
      "version": "0.5.9", "quantization_param_path": null})"),
                          facts);
  EXPECT_EQ(facts.engine, "sglang");
  EXPECT_EQ(facts.engine_version, "0.5.9");
  EXPECT_EQ(facts.kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(facts.capacity_tokens, 3150000);
  EXPECT_EQ(facts.context_length, 262144);
  EXPECT_EQ(facts.tp, 8);
  EXPECT_TRUE(facts.quantization_param_path.empty());

  ServerFacts nested;
  read_sglang_server_info(json::parse(R"({"model_path": "/m", "kv_cache_dtype": "bf16",
      "internal_states": [{"max_total_num_tokens": 900}, {"max_total_num_tokens": 800}]})"),
                          nested);
  EXPECT_EQ(nested.capacity_tokens, 800);  // the smallest DP rank bounds a request
  EXPECT_THAT(nested.capacity_source, HasSubstr("internal_states"));
}

// sglang#38846: /get_server_info keeps the launch's max_running_requests (32) while the
// scheduler runs 9; newer builds expose the scheduler's value per DP worker in
// internal_states[].effective_max_running_requests_per_dp (a third-party reading of
// nightly-dev-20260907, cited by sglang PR #38931; this answer is built from those names,
// no real answer carrying the field is in the corpus).
TEST(ProbeDetect, SglangEffectiveRunningRequestsBelowTheLaunchValueIsAFinding) {
  ServerFacts facts;
  facts.url = "http://h";
  read_sglang_server_info(json::parse(R"({"model_path": "/m", "kv_cache_dtype": "bf16",
      "max_running_requests": 32, "version": "0.5.19",
      "internal_states": [{"max_total_num_tokens": 900,
                           "effective_max_running_requests_per_dp": 9}]})"),
                          facts);
  EXPECT_EQ(facts.running_requests_launched, 32);
  EXPECT_EQ(facts.running_requests_effective, 9);
  auto findings = server_findings(kvaudit::testing::registry(), facts, nullptr);
  EXPECT_TRUE(has_finding(findings, "probe-running-requests-capped"));
  // Without the scheduler's value nothing is claimed.
  ServerFacts plain;
  plain.url = "http://h";
  read_sglang_server_info(json::parse(R"({"model_path": "/m", "kv_cache_dtype": "bf16",
      "max_running_requests": 32, "version": "0.5.19"})"),
                          plain);
  EXPECT_FALSE(plain.running_requests_effective);
  EXPECT_FALSE(has_finding(server_findings(kvaudit::testing::registry(), plain, nullptr),
                           "probe-running-requests-capped"));
}

TEST(ProbeDetect, VllmCacheConfigInfo) {
  ServerFacts facts;
  auto samples = net::parse_prometheus(
      "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"fp8\",calculate_kv_scales="
      "\"True\",num_gpu_blocks=\"4096\"} 1.0\n",
      "m");
  ASSERT_TRUE(read_vllm_metrics(samples, facts));
  EXPECT_EQ(facts.engine, "vllm");
  EXPECT_EQ(facts.kv_cache_dtype, "fp8");
  EXPECT_EQ(facts.capacity_tokens, 16 * 4096);
  EXPECT_TRUE(facts.calculate_kv_scales);
  ServerFacts newer;
  ASSERT_TRUE(read_vllm_metrics(
      net::parse_prometheus("vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\","
                            "kv_cache_size_tokens=\"10576\",num_gpu_blocks=\"661\"} 1\n",
                            "m"),
      newer));
  EXPECT_EQ(newer.capacity_tokens, 10576);
  ServerFacts none;
  EXPECT_FALSE(
      read_vllm_metrics(net::parse_prometheus("vllm:num_requests_running 0\n", "m"), none));
  EXPECT_EQ(none.engine, "generic");
}

TEST(ProbeDetect, LiveSglangShapeAndItsFindings) {
  FakeServer server({.engine = "sglang", .kv_cache_dtype = "fp8_e4m3"});
  net::Client client(net::parse_url(server.url()), fast_client_options());
  ServerFacts facts = detect_server(kvaudit::testing::registry(), client);
  EXPECT_EQ(facts.engine, "sglang");
  EXPECT_EQ(facts.detected_by, "/get_server_info");
  EXPECT_EQ(facts.model_id, "fake-model");
  EXPECT_EQ(facts.capacity_tokens, 1573854);
  EXPECT_TRUE(facts.has_tokenize);
  auto findings = server_findings(kvaudit::testing::registry(), facts, nullptr);
  ASSERT_TRUE(has_finding(findings, "kv-scales-unverified"));
  EXPECT_EQ(findings[0].severity, report::Severity::warning);

  // With --quantization-param-path reported, the scales have a source.
  FakeServer with_scales({.engine = "sglang",
                          .kv_cache_dtype = "fp8_e4m3",
                          .quantization_param_path = "/scales.json"});
  net::Client client2(net::parse_url(with_scales.url()), fast_client_options());
  EXPECT_FALSE(
      has_finding(server_findings(kvaudit::testing::registry(),
                                  detect_server(kvaudit::testing::registry(), client2), nullptr),
                  "kv-scales-unverified"));
}

TEST(ProbeDetect, LiveVllmShape) {
  FakeServer server({.engine = "vllm", .kv_cache_dtype = "fp8_e4m3"});
  net::Client client(net::parse_url(server.url()), fast_client_options());
  ServerFacts facts = detect_server(kvaudit::testing::registry(), client);
  EXPECT_EQ(facts.engine, "vllm");
  EXPECT_EQ(facts.engine_version, "0.11.0");
  EXPECT_EQ(facts.capacity_tokens, 16000);
  EXPECT_EQ(facts.context_length, 16384);  // /v1/models max_model_len
  EXPECT_TRUE(has_finding(server_findings(kvaudit::testing::registry(), facts, nullptr),
                          "kv-scales-unverified"));
}

TEST(ProbeDetect, GenericServer) {
  FakeServer server({.engine = "generic", .tokenize = false});
  net::Client client(net::parse_url(server.url()), fast_client_options());
  ServerFacts facts = detect_server(kvaudit::testing::registry(), client);
  EXPECT_EQ(facts.engine, "generic");
  EXPECT_EQ(facts.detected_by, "/v1/models");
  EXPECT_FALSE(facts.has_tokenize);
  EXPECT_TRUE(has_finding(server_findings(kvaudit::testing::registry(), facts, nullptr),
                          "probe-engine-unknown"));
}

// With the served checkpoint at hand the full check runs on the server's own flags: a
// plain BF16 checkpoint served with an FP8 cache has no scales at all.
TEST(ProbeDetect, CheckpointGivesTheFullAudit) {
  FakeServer server({.engine = "sglang", .kv_cache_dtype = "fp8_e4m3"});
  net::Client client(net::parse_url(server.url()), fast_client_options());
  ServerFacts facts = detect_server(kvaudit::testing::registry(), client);
  auto model = checkpoint::read_checkpoint(std::string(KVAUDIT_TEST_DIR) +
                                           "/fixtures/checkpoints/llama-bf16-plain");
  auto findings = server_findings(kvaudit::testing::registry(), facts, &model);
  ASSERT_TRUE(has_finding(findings, "fp8-unit-scale"));
  EXPECT_EQ(findings[0].severity, report::Severity::critical);
  EXPECT_FALSE(has_finding(findings, "kv-scales-unverified"));
}

// A live server's report meets the known-bad combinations too: vLLM serving Qwen3.5 with an
// NVFP4 cache is broken on B200 (vllm#55673), possibly broken where the GPU is not given,
// and the server's own attention backend (SGLang reports it) takes part in the match.
TEST(ProbeDetect, KnownBadCombinationsFromTheServersReport) {
  ServerFacts facts;
  facts.url = "http://s";
  facts.engine = "vllm";
  facts.engine_version = "0.28.0";
  facts.kv_cache_dtype = "nvfp4";
  auto model = checkpoint::read_checkpoint(std::string(KVAUDIT_TEST_DIR) +
                                           "/../examples/qwen3.5-397b-a17b-nvfp4/config.json");
  Deployment b200;
  b200.gpu_name = "B200";
  b200.gpu_arch = "sm100";
  b200.platform = "cuda";
  auto on_b200 = server_findings(kvaudit::testing::registry(), facts, &model, b200);
  const report::Finding* hit = nullptr;
  for (const auto& f : on_b200)
    if (f.id == "known-bad-combination") hit = &f;
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->severity, report::Severity::critical);
  auto unknown_gpu = server_findings(kvaudit::testing::registry(), facts, &model);
  for (const auto& f : unknown_gpu) {
    if (f.id == "known-bad-combination") {
      EXPECT_EQ(f.severity, report::Severity::info);
    }
  }

  ServerFacts sglang;
  read_sglang_server_info(
      nlohmann::json{{"kv_cache_dtype", "bf16"}, {"attention_backend", "TRTLLM_MHA"}}, sglang);
  EXPECT_EQ(sglang.attention_backend, "trtllm_mha");
}

}  // namespace
}  // namespace kvaudit::probe
