// watch's drift checks: speculative acceptance against the launch's baseline (counters and
// SGLang's gauge), a restart that starts the baseline again, a llama-server whose counters
// are read from its real /metrics format, and the round trip run at an interval.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "common/loopback_server.h"
#include "common/registry.h"
#include "util/util.h"
#include "watch/watch.h"

namespace kvaudit::watch {
namespace {

probe::ServerCounters counts(double drafted, double accepted) {
  probe::ServerCounters c;
  c.seen = true;
  c.draft = drafted;
  c.accepted = accepted;
  return c;
}

AcceptanceOptions small() {
  AcceptanceOptions options;
  options.baseline_drafted = 1000;
  options.window_drafted = 1000;
  return options;
}

// Polls that each add `drafted` tokens accepted at `rate`, from cumulative totals.
void feed(AcceptanceState& state, const AcceptanceOptions& options, double& drafted_total,
          double& accepted_total, int polls, double drafted, double rate) {
  for (int i = 0; i < polls; ++i) {
    drafted_total += drafted;
    accepted_total += drafted * rate;
    add_acceptance_sample(counts(drafted_total, accepted_total), false, options, state);
  }
}

TEST(Acceptance, ASteadyRateIsNoDriftAndASinkingOneIs) {
  const AcceptanceOptions options = small();
  AcceptanceState state;
  double d = 0, a = 0;
  add_acceptance_sample(counts(0, 0), true, options, state);
  feed(state, options, d, a, 5, 200, 0.80);  // the baseline: 1,000 tokens at 80%
  feed(state, options, d, a, 10, 200, 0.79);
  ASSERT_TRUE(state.rate_recent);
  EXPECT_NEAR(*state.rate_baseline, 0.80, 1e-9);
  EXPECT_FALSE(state.drift) << state.sentence;
  feed(state, options, d, a, 6, 200, 0.60);  // the window fills with the sunk rate
  EXPECT_TRUE(state.drift) << state.sentence;
  EXPECT_EQ(state.drifts, 1);
  EXPECT_NE(state.sentence.find("DRIFT, down 20.0 points"), std::string::npos) << state.sentence;
  feed(state, options, d, a, 6, 200, 0.80);  // recovered
  EXPECT_FALSE(state.drift) << state.sentence;
  EXPECT_EQ(state.drifts, 1);
}

TEST(Acceptance, AFewTokensDoNotMakeADriftHoweverLowTheirRate) {
  const AcceptanceOptions options = small();
  AcceptanceState state;
  double d = 0, a = 0;
  add_acceptance_sample(counts(0, 0), true, options, state);
  feed(state, options, d, a, 5, 200, 0.80);
  feed(state, options, d, a, 3, 20, 0.0);  // 60 tokens: the window is not full
  EXPECT_FALSE(state.rate_recent);
  EXPECT_FALSE(state.drift);
}

TEST(Acceptance, CountersThatGoDownAreARestartAndTheBaselineStartsAgain) {
  const AcceptanceOptions options = small();
  AcceptanceState state;
  double d = 0, a = 0;
  add_acceptance_sample(counts(0, 0), true, options, state);
  feed(state, options, d, a, 10, 200, 0.80);
  add_acceptance_sample(counts(100, 40), false, options, state);  // restarted
  EXPECT_EQ(state.baseline_drafted, 0);
  EXPECT_FALSE(state.rate_recent);
  d = 100, a = 40;
  feed(state, options, d, a, 5, 200, 0.40);  // its own baseline: 40% is not a drift
  feed(state, options, d, a, 6, 200, 0.40);
  EXPECT_FALSE(state.drift) << state.sentence;
  EXPECT_NEAR(*state.rate_baseline, 0.40, 1e-9);
}

TEST(Acceptance, SGLangsGaugeDriftsOnlyWhenEveryRecentIntervalIsBelowTheBaseline) {
  AcceptanceOptions options;
  options.gauge_samples = 5;  // (5!)^2 / 10! = 0.004 by chance: below alpha 0.01
  AcceptanceState state;
  auto gauge = [&](double rate) {
    probe::ServerCounters c;
    c.accept_rate = rate;
    add_acceptance_sample(c, false, options, state);
  };
  for (double r : {0.70, 0.72, 0.69, 0.71, 0.70}) gauge(r);
  for (double r : {0.71, 0.62, 0.60, 0.61, 0.60}) gauge(r);  // one as high as the baseline
  EXPECT_FALSE(state.drift) << state.sentence;
  gauge(0.55);  // the window slides past 0.71
  EXPECT_TRUE(state.drift) << state.sentence;
  EXPECT_EQ(state.source, "gauge");
}

// A llama-server whose /metrics is its real format (fixtures/servers/llama-server/recorded/
// c-get-metrics-ngram.txt) with the totals the test sets.
class SpecServer {
 public:
  SpecServer() {
    const std::string recorded =
        read_text_file(std::filesystem::path(KVAUDIT_TEST_DIR) /
                       "fixtures/servers/llama-server/recorded/c-get-metrics-ngram.txt");
    server_.http.Get("/metrics", [this, recorded](const httplib::Request&, httplib::Response& res) {
      std::lock_guard lock(mutex_);
      std::string text = recorded;
      auto set = [&](const std::string& name, double value) {
        const size_t at = text.find("\n" + name + " ");
        const size_t end = text.find('\n', at + 1);
        text.replace(at + 1, end - at - 1, name + " " + std::to_string(int64_t(value)));
      };
      set("llamacpp:spec_decode_num_draft_tokens_total", drafted_);
      set("llamacpp:spec_decode_num_accepted_tokens_total", accepted_);
      res.set_content(text, "text/plain");
    });
    server_.http.Get("/props", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1,
                          "model_path": "m.gguf", "build_info": "b9749-d32676d77"})",
                      "application/json");
    });
    server_.start();
  }
  void add(double drafted, double rate) {
    std::lock_guard lock(mutex_);
    drafted_ += drafted;
    accepted_ += drafted * rate;
  }
  std::string url() const { return server_.url(); }

 private:
  std::mutex mutex_;
  double drafted_ = 0, accepted_ = 0;
  kvaudit::testing::LoopbackServer server_;
};

TEST(Acceptance, AWatchedLlamaServersAcceptanceSinksIntoADriftMetric) {
  SpecServer server;
  WatchOptions options;
  options.acceptance = small();
  net::ClientOptions client;
  client.max_retries = 0;
  ServerWatcher watcher(kvaudit::testing::registry(), server.url(), options, client);
  watcher.poll(1);
  for (int i = 0; i < 5; ++i) server.add(200, 0.75), watcher.poll(2 + i);
  bool flipped = false;
  for (int i = 0; i < 6; ++i) server.add(200, 0.50), flipped |= watcher.poll(10 + i);
  EXPECT_TRUE(flipped);  // the drift is a change people see
  EXPECT_TRUE(watcher.state().acceptance.drift) << watcher.state().acceptance.sentence;
  const std::string metrics = render_metrics(watcher.state());
  EXPECT_NE(metrics.find("kvaudit_spec_acceptance_drift{source=\"" + server.url() + "\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("window=\"baseline\",from=\"counters\"} 0.750"), std::string::npos)
      << metrics;
}

}  // namespace
}  // namespace kvaudit::watch
