// probe --roundtrip against servers that misbehave: one that never evicts, one that lies in
// its cached-token counts, one that stops answering mid-run, one whose pool is too large to
// overrun within the budget, and one whose host tier corrupts what it serves. Each run ends
// within its bounds, keeps what it measured and never says "tiers agree" when it could not
// establish that. (The real engine behind kvaudit serve is tested in tests/serve.)
#include <gtest/gtest.h>

#include <chrono>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/loopback_server.h"
#include "common/registry.h"
#include "common/schema_doc.h"
#include "probe/probe.h"

namespace kvaudit::probe {
namespace {

using nlohmann::json;

struct TierFakeConfig {
  int64_t pool_tokens = 4096;  // what /metrics says the device pool holds
  bool never_evicts = false;   // ... but it keeps everything on the device
  bool host_tier = true;       // evicted prompts are kept (unbounded) and served back
  bool corrupt_host = false;   // what the host tier serves has other log-probs
  bool lie = false;            // reports every prompt cached, even on first sight
  bool counters = true;        // vLLM's prefix and external hit counters on /metrics
  int stall_after = -1;        // after N completions each one waits stall_ms
  int stall_ms = 0;
};

// A vLLM-shaped server whose "model" reads one byte per token and answers each prompt with
// log-probs fixed by the prompt's text, in front of a simulated device pool (LRU, in tokens)
// and host tier.
class TierFake {
 public:
  explicit TierFake(TierFakeConfig config) : config_(config) {
    auto& http = loop_.http;
    http.set_tcp_nodelay(true);
    http.Get("/version", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"version":"0.11.0"})", "application/json");
    });
    http.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake","object":"model"}]})",
                      "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard lock(mutex_);
      std::string text = fmt::format(
          "vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\","
          "num_gpu_blocks=\"{}\"}} 1.0\n",
          config_.pool_tokens / 16);
      if (config_.counters)
        text += fmt::format(
            "vllm:prefix_cache_hits_total{{model_name=\"fake\"}} {}\n"
            "vllm:external_prefix_cache_hits_total{{model_name=\"fake\"}} {}\n",
            device_hits_, host_hits_);
      res.set_content(text, "text/plain");
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      res.set_content(complete(json::parse(req.body)).dump(), "application/json");
    });
    loop_.start();
  }
  std::string url() const { return loop_.url(); }
  ~TierFake() { loop_.stop(); }

 private:
  json complete(const json& body) {
    const std::string prompt = body.value("prompt", "");
    const int64_t n = int64_t(prompt.size());
    const int completions = ++completions_;
    if (config_.stall_after >= 0 && completions > config_.stall_after)
      std::this_thread::sleep_for(std::chrono::milliseconds(config_.stall_ms));
    int64_t cached = 0;
    bool from_host = false;
    {
      std::lock_guard lock(mutex_);
      auto on_device = std::find(device_.begin(), device_.end(), prompt);
      if (on_device != device_.end()) {
        cached = n - 1;
        device_hits_ += cached;
        device_.erase(on_device);
      } else if (config_.host_tier && host_.erase(prompt)) {
        cached = n - 1;
        host_hits_ += cached;
        from_host = true;
      }
      device_.push_front(prompt);
      int64_t held = 0;
      for (auto it = device_.begin(); it != device_.end();) {
        held += int64_t(it->size());
        if (!config_.never_evicts && held > config_.pool_tokens) {
          if (config_.host_tier) host_.insert(*it);
          it = device_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (config_.lie) cached = n - 1;
    const int64_t max_tokens = body.value("max_tokens", 16);
    const int top = body.value("logprobs", 0);
    const uint64_t seed = std::hash<std::string>{}(prompt);
    json tokens = json::array(), logprobs = json::array(), tops = json::array();
    std::string text;
    for (int64_t i = 0; i < max_tokens; ++i) {
      const uint64_t h = seed * 31 + uint64_t(i);
      std::string token = "t" + std::to_string(h % 7);
      double best = -0.2 - double(h % 5) * 0.01;
      if (from_host && config_.corrupt_host) {
        token = "x" + std::to_string(h % 3);
        best = -1.5;
      }
      json alternatives = json::object();
      alternatives[token] = best;
      for (int k = 1; k < top; ++k) alternatives["alt" + std::to_string(k)] = best - 2.0 - k;
      text += token;
      tokens.push_back(token);
      logprobs.push_back(best);
      tops.push_back(alternatives);
    }
    return {{"id", "cmpl-1"},
            {"object", "text_completion"},
            {"model", "fake"},
            {"choices",
             {{{"index", 0},
               {"text", text},
               {"finish_reason", "length"},
               {"logprobs",
                {{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", tops}}}}}},
            {"usage",
             {{"prompt_tokens", n},
              {"completion_tokens", max_tokens},
              {"total_tokens", n + max_tokens},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}}}};
  }

  TierFakeConfig config_;
  std::mutex mutex_;
  std::list<std::string> device_;  // most recent first
  std::set<std::string> host_;
  int64_t device_hits_ = 0, host_hits_ = 0;
  std::atomic<int> completions_{0};
  kvaudit::testing::LoopbackServer loop_;  // last: its threads stop before the rest goes
};

RoundTripResult run(const TierFake& fake, RoundTripOptions options = {},
                    net::ClientOptions client = {}) {
  options.prompt_tokens = 64;  // 256 bytes: 256 of the fake's tokens
  options.generate_tokens = 6;
  client.max_retries = 0;
  return run_roundtrip(kvaudit::testing::registry(), fake.url(), client, options);
}

TEST(RoundTrip, AHostTierThatServesItsPromptsBackAgrees) {
  TierFake fake({});
  const RoundTripResult result = run(fake);
  EXPECT_EQ(result.verdict, "tiers agree") << result.reason;
  ASSERT_EQ(result.passes.size(), 4u);
  EXPECT_EQ(result.passes[3].served_by, "a tier behind the device pool");
  EXPECT_NE(result.passes[3].served_by_evidence.find("tier hits rose by"), std::string::npos);
  EXPECT_FALSE(roundtrip_failed(result));
}

TEST(RoundTrip, AHostTierThatChangesWhatItServesIsNamed) {
  TierFake fake({.corrupt_host = true});
  const RoundTripResult result = run(fake);
  EXPECT_EQ(result.verdict, "a tier changed the answers") << result.reason;
  ASSERT_EQ(result.checks.size(), 2u);
  EXPECT_EQ(result.checks[1].verdict, "changed");
  EXPECT_EQ(result.checks[1].first_token, 0);
  EXPECT_TRUE(roundtrip_failed(result));
}

TEST(RoundTrip, AServerThatNeverEvictsIsNotAnAllClear) {
  TierFake fake({.never_evicts = true});
  const RoundTripResult result = run(fake);
  EXPECT_EQ(result.verdict, "not established") << result.reason;
  EXPECT_EQ(result.passes[3].served_by, "device prefix cache");
  EXPECT_NE(result.reason.find("no tier behind the device pool was shown"), std::string::npos)
      << result.reason;
  EXPECT_TRUE(roundtrip_failed(result));
}

TEST(RoundTrip, CountsThatCallAColdPromptCachedAreNotTrusted) {
  TierFake fake({.lie = true, .counters = false});
  const RoundTripResult result = run(fake);
  EXPECT_FALSE(result.counts_trusted);
  EXPECT_NE(result.counts_note.find("on the cold pass"), std::string::npos) << result.counts_note;
  EXPECT_EQ(result.verdict, "not established") << result.reason;
  EXPECT_EQ(result.passes[3].served_by, "unknown");
}

TEST(RoundTrip, UntrustedCountsLeaveTheTierToTheServersCounters) {
  // The answers say every prompt was cached; the counters say only what really was, and
  // they alone place each pass.
  TierFake fake({.lie = true});
  const RoundTripResult result = run(fake);
  EXPECT_FALSE(result.counts_trusted);
  EXPECT_EQ(result.passes[0].served_by, "computed");
  EXPECT_EQ(result.passes[3].served_by, "a tier behind the device pool");
  EXPECT_NE(result.passes[3].served_by_evidence.find("not trusted"), std::string::npos);
}

TEST(RoundTrip, AServerThatStopsAnsweringEndsTheRunWithWhatItMeasured) {
  TierFake fake({.stall_after = 14, .stall_ms = 3000});
  net::ClientOptions client;
  client.read_timeout = std::chrono::milliseconds(500);
  const auto started = std::chrono::steady_clock::now();
  const RoundTripResult result = run(fake, {}, client);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
  EXPECT_NE(result.stopped.find("pass stopped"), std::string::npos) << result.stopped;
  EXPECT_EQ(result.verdict, "not established");
  // Prompts 0..3 finished all three passes before the 15th request stalled.
  ASSERT_GE(result.passes.size(), 3u);
  EXPECT_EQ(result.passes[0].records.size(), 5u);
  EXPECT_EQ(result.passes[2].records.size(), 4u);
  EXPECT_GE(result.requests, 14);
}

TEST(RoundTrip, ThePassesStopAtTheTimeLimitAndTheRequestLimit) {
  TierFake fake({.stall_after = 0, .stall_ms = 300});
  RoundTripOptions options;
  options.time_limit_seconds = 1.0;
  const RoundTripResult timed = run(fake, options);
  EXPECT_NE(timed.stopped.find("time limit"), std::string::npos) << timed.stopped;
  TierFake quick({});
  options = {};
  options.max_requests = 7;
  const RoundTripResult counted = run(quick, options);
  EXPECT_NE(counted.stopped.find("request limit (7)"), std::string::npos) << counted.stopped;
  EXPECT_EQ(counted.requests, 7);
}

TEST(RoundTrip, APoolTooLargeForTheFillerBudgetSaysSoInsteadOfGuessing) {
  TierFake fake({.pool_tokens = 1 << 24});
  RoundTripOptions options;
  options.max_filler_tokens = 100'000;
  const RoundTripResult result = run(fake, options);
  EXPECT_FALSE(result.eviction.forced);
  EXPECT_NE(result.eviction.note.find("more than --roundtrip-max-filler-tokens"), std::string::npos)
      << result.eviction.note;
  EXPECT_EQ(result.verdict, "not established");
}

TEST(RoundTrip, ThePayloadMatchesTheDocument) {
  TierFake fake({.corrupt_host = true});
  RoundTripOptions options;
  const json payload = report::render_json(to_report(run(fake, options), options));
  kvaudit::testing::SchemaValidator validator(
      kvaudit::testing::load_schema_tables("## Payload object: "));
  validator.validate(payload["roundtrip"], "probe.roundtrip", "$.roundtrip");
  EXPECT_TRUE(validator.problems.empty()) << [&] {
    std::string all;
    for (const auto& p : validator.problems) all += p + "\n";
    return all;
  }();
  for (const char* object : {"probe.roundtrip", "probe.roundtrip_server", "probe.roundtrip_pass",
                             "probe.roundtrip_record", "probe.roundtrip_eviction",
                             "probe.roundtrip_check", "probe.roundtrip_divergence"})
    EXPECT_TRUE(validator.seen.count(object)) << object;
}

TEST(RoundTrip, TheReportCarriesEveryPassAndCheck) {
  TierFake fake({.corrupt_host = true});
  RoundTripOptions options;
  const RoundTripResult result = run(fake, options);
  const report::Report out = to_report(result, options);
  EXPECT_EQ(out.command, "probe");
  EXPECT_EQ(out.verdict_severity, report::Severity::critical);
  const json& payload = out.payload["roundtrip"];
  EXPECT_EQ(payload["passes"].size(), 4u);
  EXPECT_EQ(payload["checks"][1]["verdict"], "changed");
  EXPECT_EQ(payload["checks"][1]["first_divergence"]["generated_token"], 0);
  EXPECT_NE(out.verdict.find("a tier changed the answers"), std::string::npos);
}

}  // namespace
}  // namespace kvaudit::probe
