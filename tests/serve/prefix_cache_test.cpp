// serve's prefix cache and host tier: what a hit restores (bit for bit), LRU eviction to the
// host tier and back, SGLang's sizing checks, the fault switch, and probe --roundtrip against
// the real engine behind it: no alarm without a fault, each fault caught with its tier and
// first diverging position.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>

#include "probe/probe.h"
#include "serve/prefix_cache.h"
#include "serve/serve_test_util.h"
#include "util/util.h"
#include "watch/watch.h"

namespace kvaudit::serve {
namespace {

using nlohmann::json;
using testing::options_for;
using testing::RunningServer;

// A prompt of about `lines` * 9 tokens, distinct per `tag`.
std::string code_prompt(int tag, int lines) {
  std::string text = "# prompt " + std::to_string(tag) + "\n";
  for (int i = 0; i < lines; ++i)
    text += "def f" + std::to_string(tag * 1000 + i) + "(x):\n    return x + " + std::to_string(i) +
            "\n";
  return text;
}

json ask(const RunningServer& server, const std::string& prompt) {
  auto [status, body] =
      server.post("/v1/completions",
                  {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 3}});
  EXPECT_EQ(status, 200) << body.dump();
  return body;
}

int64_t cached(const json& answer) {
  return answer["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
}

ServeOptions tiered(const std::string& fault = "none") {
  auto options = options_for(testing::fixture_model());
  options.max_total_tokens = 1024;
  options.enable_cache_report = true;
  options.enable_hierarchical_cache = true;
  options.hicache_ratio = 4.0;
  options.fault_host_tier = fault;
  return options;
}

TEST(ServePrefixCache, AHitRestoresThePrefixAndAnswersBitForBitAsCold) {
  auto options = options_for(testing::fixture_model());
  options.enable_cache_report = true;
  RunningServer server(options);
  const std::string prompt = code_prompt(1, 20);
  const json cold = ask(server, prompt);
  const json warm = ask(server, prompt);
  EXPECT_EQ(cached(cold), 0);
  // Every prompt token but the last (whose logits start the generation).
  EXPECT_EQ(cached(warm), warm["usage"]["prompt_tokens"].get<int64_t>() - 1);
  EXPECT_EQ(cold["choices"][0]["logprobs"], warm["choices"][0]["logprobs"]);
  const std::string metrics = server.get("/metrics").second;
  EXPECT_NE(metrics.find("enable_prefix_caching=\"True\""), std::string::npos);
  EXPECT_NE(metrics.find("vllm:prefix_cache_hits_total{model_name=\"qwen3-pystd\"} " +
                         std::to_string(cached(warm))),
            std::string::npos)
      << metrics;
}

TEST(ServePrefixCache, WithoutTheRadixCacheNothingIsCachedOrReported) {
  auto options = options_for(testing::fixture_model());
  options.disable_radix_cache = true;
  RunningServer server(options);
  const std::string prompt = code_prompt(2, 10);
  ask(server, prompt);
  const json again = ask(server, prompt);
  EXPECT_FALSE(again["usage"].contains("prompt_tokens_details"));  // no --enable-cache-report
  const std::string metrics = server.get("/metrics").second;
  EXPECT_NE(metrics.find("enable_prefix_caching=\"False\""), std::string::npos);
  EXPECT_EQ(metrics.find("vllm:prefix_cache_hits_total"), std::string::npos);
}

TEST(ServePrefixCache, EvictedPrefixesGoToTheHostTierAndComeBackUnchanged) {
  RunningServer server(tiered());
  const std::string first = code_prompt(3, 40);
  const json cold = ask(server, first);
  // Filler past the 1,024-token pool pushes `first` out to the host tier.
  for (int tag = 10; tag < 14; ++tag) ask(server, code_prompt(tag, 40));
  const json back = ask(server, first);
  EXPECT_EQ(cached(back), back["usage"]["prompt_tokens"].get<int64_t>() - 1);
  EXPECT_EQ(cold["choices"][0]["logprobs"], back["choices"][0]["logprobs"]);
  const std::string metrics = server.get("/metrics").second;
  EXPECT_NE(metrics.find("vllm:external_prefix_cache_hits_total{model_name=\"qwen3-pystd\"} " +
                         std::to_string(cached(back))),
            std::string::npos)
      << metrics;
  bool allocating = false;
  for (const auto& line : server.log())
    allocating |= line.find("GB host memory for hierarchical KV cache.") != std::string::npos;
  EXPECT_TRUE(allocating);
}

TEST(ServePrefixCache, AFaultyHostTierChangesWhatComesBack) {
  RunningServer server(tiered("swap-layers"));
  const std::string first = code_prompt(4, 40);
  const json cold = ask(server, first);
  for (int tag = 20; tag < 24; ++tag) ask(server, code_prompt(tag, 40));
  const json back = ask(server, first);
  EXPECT_GT(cached(back), 0);
  EXPECT_NE(cold["choices"][0]["logprobs"], back["choices"][0]["logprobs"]);
}

TEST(ServePrefixCache, SGLangsChecksOnTheHostTierAndTheFaultSwitch) {
  auto expect_refused = [](ServeOptions options, const std::string& words) {
    try {
      RunningServer server(options);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
    }
  };
  auto options = tiered();
  options.hicache_ratio = 1.0;  // the host pool must be larger than the device pool
  expect_refused(options, "must be larger than the device pool");
  options = tiered();
  options.disable_radix_cache = true;
  expect_refused(options, "needs the radix cache");
  options = tiered();
  options.enable_hierarchical_cache = false;
  options.fault_host_tier = "swap-layers";
  expect_refused(options, "needs the host tier");
  expect_refused(tiered("drop-scales"), "every scale of this bf16 cache is 1.0");
  expect_refused(tiered("shuffle"), "not a fault");
}

TEST(ServePrefixCache, HostSizeInGigabytesOverridesTheRatio) {
  auto options = tiered();
  options.hicache_size_gb = 1.0;
  RunningServer server(options);
  // 1e9 bytes over the pool's bytes per token, as SGLang's HostKVCache counts them.
  const int64_t per_token = server.server().pool().cell_bytes_per_token;
  const std::string line = fmt::format("Allocating {:.2f} GB host memory",
                                       double(int64_t(1e9 / double(per_token)) * per_token) / 1e9);
  bool seen = false;
  for (const auto& l : server.log()) seen |= l.find(line) != std::string::npos;
  EXPECT_TRUE(seen) << line;
}

// ---------------------------------------------------------------- probe --roundtrip

// SGLang's --quantization-param-path JSON with every layer's scale 0.25 (not 1.0).
class TempScales {
 public:
  TempScales() {
    path_ = std::filesystem::temp_directory_path() /
            ("kvaudit-scales-" + std::to_string(::getpid()) + ".json");
    json layers;
    for (int layer = 0; layer < 4; ++layer) layers[std::to_string(layer)] = 0.25;
    std::ofstream(path_)
        << json{{"model_type", "qwen3"},
                {"kv_cache", {{"dtype", "float8_e4m3fn"}, {"scaling_factor", {{"0", layers}}}}}}
               .dump();
  }
  ~TempScales() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

probe::RoundTripResult roundtrip(const RunningServer& server, uint64_t seed = 1) {
  probe::RoundTripOptions options;
  options.prompt_tokens = 96;
  options.generate_tokens = 8;
  options.seed = seed;
  options.time_limit_seconds = 300;
  net::ClientOptions client;
  client.max_retries = 0;
  return probe::run_roundtrip(kvaudit::testing::registry(),
                              "http://127.0.0.1:" + std::to_string(server.port()), client, options);
}

ServeOptions roundtrip_server(const std::string& fault = "none") {
  auto options = tiered(fault);
  options.max_total_tokens = 4096;  // 10 prompts of ~100 tokens; the filler overruns it
  return options;
}

TEST(ServeRoundTrip, WithoutAFaultEveryTierAgreesRunAfterRun) {
  RunningServer server(roundtrip_server());
  for (uint64_t seed : {1u, 2u, 3u}) {
    const probe::RoundTripResult result = roundtrip(server, seed);
    EXPECT_EQ(result.verdict, "tiers agree") << result.reason;
    ASSERT_EQ(result.passes.size(), 4u);
    EXPECT_EQ(result.passes[1].served_by, "device prefix cache");
    EXPECT_EQ(result.passes[3].served_by, "a tier behind the device pool")
        << result.passes[3].served_by_evidence;
    EXPECT_TRUE(result.eviction.forced) << result.eviction.note;
    EXPECT_FALSE(probe::roundtrip_failed(result));
  }
}

TEST(ServeRoundTrip, EachHostTierFaultIsCaughtWithItsTierAndFirstPosition) {
  TempScales scales;  // drop-scales needs scales that are not 1.0
  for (const std::string fault : {"swap-layers", "drop-scales"}) {
    auto options = roundtrip_server(fault);
    if (fault == "drop-scales") {
      options.kv_cache_dtype = "fp8_e4m3";
      options.quantization_param_path = scales.path().string();
    }
    RunningServer server(options);
    const probe::RoundTripResult result = roundtrip(server);
    EXPECT_EQ(result.verdict, "a tier changed the answers") << fault << ": " << result.reason;
    ASSERT_EQ(result.checks.size(), 2u);
    EXPECT_EQ(result.checks[0].verdict, "agrees") << result.checks[0].sentence;
    const probe::TierCheck& tier = result.checks[1];
    EXPECT_EQ(tier.name, "tier behind the device pool");
    EXPECT_EQ(tier.verdict, "changed") << tier.sentence;
    EXPECT_GE(tier.first_position, 0);
    EXPECT_NE(result.reason.find("first at position"), std::string::npos) << result.reason;
    EXPECT_TRUE(probe::roundtrip_failed(result));
  }
}

// kvaudit watch runs the round trip at an interval: the faulty tier shows in its metrics and
// its journal line.
TEST(ServeRoundTrip, WatchRunsItAtAnIntervalAndCountsTheChangedRuns) {
  RunningServer server(roundtrip_server("swap-layers"));
  watch::RunOptions options;
  options.source = "http://127.0.0.1:" + std::to_string(server.port());
  options.once = true;
  options.roundtrip_every_s = 60;
  options.roundtrip.prompt_tokens = 96;
  options.roundtrip.generate_tokens = 8;
  options.client.max_retries = 0;
  std::string metrics;
  const watch::WatchState state = watch::run(
      kvaudit::testing::registry(), options, [] { return false; }, [](const watch::WatchState&) {},
      [&](const std::string& text) { metrics = text; });
  EXPECT_EQ(state.roundtrip.runs, 1);
  EXPECT_EQ(state.roundtrip.changed, 1) << state.roundtrip.last_reason;
  EXPECT_NE(metrics.find("kvaudit_roundtrip_changed_total{source=\"" + options.source + "\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("tier=\"tier behind the device pool\""), std::string::npos);
}

}  // namespace
}  // namespace kvaudit::serve
