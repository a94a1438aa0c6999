// probe --load against in-process fake servers: streamed and one-piece answers, a server
// that slows down under load, one that starts failing, one that rate-limits, a stall in the
// middle of a stream, the time limit, Ctrl-C, resume, and speculative counters that differ
// between real text and random tokens. Every run must end inside its limits with a report.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/loopback_server.h"
#include "common/registry.h"
#include "common/schema_doc.h"
#include "loadbench/loadbench.h"
#include "report/report.h"
#include "util/util.h"

namespace kvaudit::loadbench {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct LoadFakeConfig {
  bool stream = true;              // honour "stream": true with SSE
  int token_ms = 1;                // per generated token
  bool slower_under_load = false;  // each token takes token_ms x requests in flight
  int fail_after = -1;             // completions after the first N answer 500
  int rate_limit_first = 0;        // the first N completions answer 429 (Retry-After: 0)
  int stall_after_tokens = -1;     // a stream goes silent after N tokens ...
  int stall_ms = 0;                // ... for this long
  bool spec = false;               // export speculative counters (accepted ~ repeated bigrams)
  bool refuse_stream = false;      // stream=true answers 400, as some servers do
  int max_model_len = 0;           // > 0: /v1/models says so and longer requests answer 400
  int prefill_us_per_token = 0;    // prompt processing before the first token ...
  bool prefix_cache = false;       // ... only for tokens past the longest prompt seen before
  // Answers /server_info with a real SGLang 0.5.6 answer (so it is detected as SGLang),
  // puts a real meta_info (PR 13754) under each one-piece choice when the request asks with
  // return_meta_info, and exports SGLang's speculative gauges on /metrics.
  bool sglang = false;
  bool lying_metrics = false;  // with sglang: NaN gauges and a negative counter
};

json fixture_json(const std::string& relative) {
  return json::parse(
      read_text_file(std::filesystem::path(KVAUDIT_TEST_DIR) / "fixtures" / "servers" / relative));
}

// Tokens are bytes (/tokenize); a completion streams max_tokens tokens of "x".
class LoadFake {
 public:
  explicit LoadFake(LoadFakeConfig config) : config_(config) {
    server_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json card = {{"id", "fake-model"}, {"object", "model"}};
      if (config_.max_model_len > 0) card["max_model_len"] = config_.max_model_len;
      res.set_content(json{{"object", "list"}, {"data", {card}}}.dump(), "application/json");
    });
    server_.Post("/tokenize", [](const httplib::Request& req, httplib::Response& res) {
      json body = json::parse(req.body, nullptr, false);
      std::string text;
      for (const char* key : {"prompt", "content", "text"})
        if (body.is_object() && body.contains(key) && body[key].is_string()) text = body[key];
      json ids = json::array();
      for (unsigned char c : text) ids.push_back(int(c));
      res.set_content(json{{"tokens", ids}}.dump(), "application/json");
    });
    if (config_.sglang)
      server_.Get("/server_info", [](const httplib::Request&, httplib::Response& res) {
        res.set_content(fixture_json("sglang/server_info-0.5.6.json").dump(), "application/json");
      });
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      if (config_.sglang && config_.lying_metrics) {
        res.set_content(
            "sglang:spec_accept_rate NaN\nsglang:spec_accept_length +Inf\n"
            "sglang:generation_tokens_total -5\nsglang:cached_tokens_total NaN\n",
            "text/plain; version=0.0.4");
        return;
      }
      if (config_.sglang) {
        // Names and meaning: python/sglang/srt/metrics/collector.py (SchedulerMetricsCollector).
        const std::string labels = "{model_name=\"fake-model\",tp_rank=\"0\"}";
        res.set_content("sglang:generation_tokens_total" + labels + " " +
                            std::to_string(generated_.load()) + "\nsglang:spec_accept_rate" +
                            labels + " 0.27\nsglang:spec_accept_length" + labels +
                            " 2.9\nsglang:cached_tokens_total" + labels + " " +
                            std::to_string(completions_.load() * 7) + "\n",
                        "text/plain; version=0.0.4");
        return;
      }
      std::string text =
          "llamacpp:tokens_predicted_total " + std::to_string(generated_.load()) + "\n";
      if (config_.spec)
        text += "llamacpp:spec_decode_num_draft_tokens_total " + std::to_string(drafted_.load()) +
                "\nllamacpp:spec_decode_num_accepted_tokens_total " +
                std::to_string(accepted_.load()) + "\nllamacpp:spec_decode_num_drafts_total " +
                std::to_string(drafts_.load()) + "\n";
      res.set_content(text, "text/plain; version=0.0.4");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      completion(req, res);
    });
    // As uvicorn's servers get from asyncio (TCP_NODELAY on every connection since Python
    // 3.6): without it, Nagle holds each event behind the client's delayed ACK (40 ms on
    // Linux) once a keep-alive connection is warm, which is the fake's delay, not a server's.
    server_.set_tcp_nodelay(true);
    loop_.start();
  }
  ~LoadFake() {
    loop_.stop();  // before the counters the handlers touch are destroyed
  }
  std::string url() const { return loop_.url(); }
  int completions() const { return completions_; }
  int64_t generated() const { return generated_; }
  int extended() const { return extended_; }  // prompts that began with a whole earlier one

 private:
  void completion(const httplib::Request& req, httplib::Response& res) {
    const int n = completions_++;
    if (n < config_.rate_limit_first) {
      res.status = 429;
      res.set_header("Retry-After", "0");
      res.set_content(R"({"error":{"message":"slow down"}})", "application/json");
      return;
    }
    if (config_.fail_after >= 0 && n >= config_.fail_after + config_.rate_limit_first) {
      res.status = 500;
      res.set_content(R"({"error":{"message":"engine died"}})", "application/json");
      return;
    }
    json body = json::parse(req.body);
    if (config_.refuse_stream && body.value("stream", false)) {
      res.status = 400;
      res.set_content(R"({"error":{"message":"stream=true is not supported"}})",
                      "application/json");
      return;
    }
    const int64_t max_tokens = body.value("max_tokens", 16);
    std::vector<int> prompt;
    if (body["prompt"].is_array())
      for (const json& id : body["prompt"]) prompt.push_back(id.get<int>());
    else
      for (unsigned char c : body["prompt"].get<std::string>()) prompt.push_back(c);
    size_t cached = 0;
    if (config_.prefill_us_per_token > 0) {
      {
        std::lock_guard<std::mutex> lock(seen_mutex_);
        if (config_.prefix_cache)
          for (const std::vector<int>& earlier : seen_) {
            size_t common = 0;
            while (common < earlier.size() && common < prompt.size() &&
                   earlier[common] == prompt[common])
              ++common;
            if (common == earlier.size()) cached = std::max(cached, common);
          }
        if (cached > 0) ++extended_;
        seen_.push_back(prompt);
      }
      std::this_thread::sleep_for(
          std::chrono::microseconds(config_.prefill_us_per_token * (prompt.size() - cached)));
    }
    if (config_.max_model_len > 0 &&
        static_cast<int64_t>(prompt.size()) + max_tokens > config_.max_model_len) {
      res.status = 400;
      res.set_content(R"({"error":{"message":"exceeds the model's maximum context length"}})",
                      "application/json");
      return;
    }
    // Speculation: drafts accepted in proportion to the prompt's repeated bigrams.
    std::map<std::pair<int, int>, int> bigrams;
    int repeats = 0;
    for (size_t i = 1; i < prompt.size(); ++i) repeats += bigrams[{prompt[i - 1], prompt[i]}]++ > 0;
    const double accept = prompt.size() > 1 ? double(repeats) / double(prompt.size() - 1) : 0.0;
    if (config_.spec) {
      drafted_ += max_tokens;
      accepted_ += static_cast<int64_t>(accept * max_tokens);
      drafts_ += max_tokens / 4;
    }
    const bool stream = config_.stream && body.value("stream", false);
    json usage = {{"prompt_tokens", prompt.size()}, {"completion_tokens", max_tokens}};
    if (config_.prefix_cache) usage["prompt_tokens_details"] = {{"cached_tokens", cached}};
    if (!stream) {
      wait_tokens(max_tokens);
      generated_ += max_tokens;
      json choice = {{"text", std::string(max_tokens, 'x')}, {"index", 0}};
      if (config_.sglang && body.value("return_meta_info", false))
        choice["meta_info"] = fixture_json("sglang/meta_info-spec-pr13754.json");
      res.set_content(json{{"choices", {choice}}, {"usage", usage}}.dump(), "application/json");
      return;
    }
    res.set_chunked_content_provider(
        "text/event-stream", [this, max_tokens, usage](size_t, httplib::DataSink& sink) {
          for (int64_t t = 0; t < max_tokens; ++t) {
            if (t == config_.stall_after_tokens)
              std::this_thread::sleep_for(std::chrono::milliseconds(config_.stall_ms));
            wait_tokens(1);
            ++generated_;
            const std::string event =
                "data: " + json{{"choices", {{{"text", "x"}, {"index", 0}}}}}.dump() + "\n\n";
            if (!sink.write(event.data(), event.size())) return false;
          }
          const std::string last =
              "data: " + json{{"choices", json::array()}, {"usage", usage}}.dump() +
              "\n\ndata: [DONE]\n\n";
          sink.write(last.data(), last.size());
          sink.done();
          return true;
        });
  }
  void wait_tokens(int64_t tokens) {
    ++in_flight_;
    const int factor = config_.slower_under_load ? std::max(1, in_flight_.load()) : 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(config_.token_ms * factor * tokens));
    --in_flight_;
  }

  LoadFakeConfig config_;
  kvaudit::testing::LoopbackServer loop_;
  httplib::Server& server_ = loop_.http;
  std::atomic<int> completions_{0}, in_flight_{0}, extended_{0};
  std::mutex seen_mutex_;
  std::vector<std::vector<int>> seen_;
  std::atomic<int64_t> generated_{0}, drafted_{0}, accepted_{0}, drafts_{0};
};

net::ClientOptions quick_client() {
  net::ClientOptions client;
  client.read_timeout = std::chrono::milliseconds(2000);
  client.connect_timeout = std::chrono::milliseconds(1000);
  client.max_retries = 2;
  client.backoff_initial = std::chrono::milliseconds(10);
  return client;
}

LoadOptions small_ladder() {
  LoadOptions options;
  options.concurrency = {1, 2};
  options.requests_per_level = 4;
  options.prompt_tokens = {64, 96};
  options.output_tokens = {8};
  options.max_seconds = 30;
  return options;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(Load, StreamedLadderCountsWhatTheServerCounts) {
  LoadFake fake({});
  LoadResult result =
      run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), small_ladder());
  EXPECT_TRUE(result.stopped.empty()) << result.stopped;
  ASSERT_EQ(result.levels.size(), 4u);  // {1, 2} x {real, random}
  for (const LoadLevel& level : result.levels) {
    EXPECT_EQ(level.requests, 4);
    EXPECT_EQ(level.failures, 0);
    EXPECT_TRUE(level.streamed);
    EXPECT_EQ(level.output_tokens, 32);
    EXPECT_EQ(level.server_output_tokens, 32);  // the independent count agrees exactly
    EXPECT_EQ(level.ttft.count, 4);
    EXPECT_EQ(level.itl.count, 4 * 7);  // 8 chunks a request: 7 gaps
    EXPECT_GT(level.ttft.p50, 0.0);
    EXPECT_GT(level.output_tokens_per_second, 0.0);
    EXPECT_EQ(level.prompt_tokens, 64 + 96 + 64 + 96);  // exact lengths via /tokenize
  }
  EXPECT_EQ(result.levels[0].prompts, "real");
  EXPECT_EQ(result.levels[1].prompts, "random");
  EXPECT_EQ(fake.completions(), 16);
  report::Report report = to_report(result, small_ladder());
  EXPECT_EQ(report.verdict_severity, report::Severity::info);
  EXPECT_NE(report.verdict.find("4 levels measured"), std::string::npos) << report.verdict;
}

// The default lengths run to 4096+256 tokens, more than many servers take: a server with a
// 300-token context gets requests cut to fit (output lengths kept), and the report says how.
TEST(Load, RequestsAreCutToTheServersContext) {
  LoadFake fake({.max_model_len = 300});
  LoadOptions options = small_ladder();
  options.concurrency = {1};
  options.prompt_tokens = {100, 400};
  options.output_tokens = {8, 64};
  LoadResult result = run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
  ASSERT_EQ(result.levels.size(), 2u);
  for (const LoadLevel& level : result.levels) {
    EXPECT_EQ(level.failures, 0) << (level.errors.empty() ? "" : level.errors[0]);
    EXPECT_EQ(level.prompt_tokens, 100 + 236 + 100 + 236);  // 400+64 cut to 236+64
    EXPECT_EQ(level.output_tokens, 8 + 64 + 8 + 64);
  }
  bool noted = false;
  for (const std::string& note : result.notes)
    noted |= note.find("300 tokens per request: 400+64 -> 236+64") != std::string::npos;
  EXPECT_TRUE(noted);
  // The fake is on 127.0.0.1: the report warns that client and server share the cores.
  bool shared = false;
  for (const std::string& note : result.notes)
    shared |= note.find("is on this machine") != std::string::npos;
  EXPECT_TRUE(shared);
}

// The --json payload of an A/B load run against docs/json-schema.md's probe.* tables, both
// ways (every documented key with its type, nothing undocumented).
TEST(Load, JsonPayloadMatchesTheDocument) {
  LoadFake a({}), b({.spec = true});
  LoadOptions options = small_ladder();
  LoadResult result =
      run_load(kvaudit::testing::registry(), {a.url(), b.url()}, quick_client(), options);
  ASSERT_EQ(result.levels.size(), 8u);
  const report::Report load_report = to_report(result, options);
  // The curves of the HTML: tokens/s, TTFT and ITL per concurrency, for both servers and
  // both prompt kinds; the fakes stream 1 token a millisecond, so ITL p50 is about 1 ms.
  ASSERT_EQ(load_report.charts.size(), 3u);
  EXPECT_EQ(load_report.charts[2].id, "load_itl");
  for (const report::Chart& chart : load_report.charts) {
    ASSERT_EQ(chart.series.size(), 4u) << chart.id;
    for (const report::Series& series : chart.series)
      for (double y : series.y) EXPECT_GT(y, 0.0) << chart.id << " " << series.name;
  }
  for (double itl_ms : load_report.charts[2].series[0].y) EXPECT_LT(itl_ms, 50.0);
  const json payload = report::render_json(load_report);
  ASSERT_TRUE(payload.contains("load"));
  kvaudit::testing::SchemaValidator validator(
      kvaudit::testing::load_schema_tables("## Payload object: "));
  validator.validate(payload["load"], "probe.load", "$.load");
  EXPECT_TRUE(validator.problems.empty()) << [&] {
    std::string all;
    for (const auto& p : validator.problems) all += p + "\n";
    return all;
  }();
  for (const char* object : {"probe.load", "probe.load_level", "probe.latency", "probe.load_ratio"})
    EXPECT_TRUE(validator.seen.count(object)) << object;
  ASSERT_EQ(payload["load"]["ratios"].size(), 2u);
  EXPECT_TRUE(payload["load"]["ratios"][0]["b_over_a_real"].is_number());
  // One server: the B columns are there, null.
  LoadResult single = run_load(kvaudit::testing::registry(), {a.url()}, quick_client(), options);
  const json one = report::render_json(to_report(single, options));
  kvaudit::testing::SchemaValidator again(
      kvaudit::testing::load_schema_tables("## Payload object: "));
  again.validate(one["load"], "probe.load", "$.load");
  EXPECT_TRUE(again.problems.empty()) << (again.problems.empty() ? "" : again.problems[0]);
  EXPECT_TRUE(one["load"]["ratios"][0]["real_over_random_B"].is_null());
}

// Sessions of 4 turns: each later prompt begins with the turn before's whole prompt (the
// fake counts them), and the report shows what a prefix cache does to time to first token:
// with one, each turn pays only for its new quarter; without, for its whole prompt.
TEST(Load, SessionsResendTheirGrowingContext) {
  LoadOptions options = small_ladder();
  options.concurrency = {1};
  options.requests_per_level = 8;
  options.turns = 4;
  options.prompt_tokens = {400};
  options.output_tokens = {4};
  options.random_control = false;
  auto later_over_first = [&](bool cache) {
    LoadFake fake({.prefill_us_per_token = 400, .prefix_cache = cache});
    LoadResult result =
        run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
    EXPECT_EQ(fake.completions(), 8);
    if (cache) {
      EXPECT_EQ(fake.extended(), 6);  // 2 sessions x 3 later turns
    }
    EXPECT_EQ(result.levels.at(0).prompt_tokens, 2 * (100 + 200 + 300 + 400));
    const LoadLevel& level = result.levels.at(0);
    EXPECT_EQ(level.ttft_first_turn.count, 2);
    EXPECT_EQ(level.ttft_later_turns.count, 6);
    const report::Report report = to_report(result, options);
    bool table = false;
    for (const report::Table& t : report.tables) table |= t.id == "load_turns";
    EXPECT_TRUE(table);
    // With a cache the fake counts cached tokens: 60% is all a 4-turn session can share.
    // Without, it reports none, and the TTFT growth says it re-prefills.
    const std::string said =
        cache ? "A served 60% of the sessions' prompt tokens from its prefix cache (at most 60%"
              : "does not appear to reuse the shared prefix (inferred from TTFT";
    EXPECT_NE(report.verdict.find(said), std::string::npos) << report.verdict;
    return level.ttft_later_turns.p50 / level.ttft_first_turn.p50;
  };
  const double with_cache = later_over_first(true);
  const double without = later_over_first(false);
  std::printf("later/first TTFT: %.2f with a prefix cache, %.2f without\n", with_cache, without);
  EXPECT_LT(with_cache, 1.6);
  EXPECT_GT(without, 2.0);
}

// Levels never share prompts, so a server with a prompt cache serves none of a level from an
// earlier level's work; a second run with the same seed would be served warm, and the
// report says so (the server's own cached_tokens count).
TEST(Load, LevelsGetPromptsOfTheirOwnAndAWarmCacheIsCalledOut) {
  LoadFake fake({.prefill_us_per_token = 20, .prefix_cache = true});
  LoadOptions options = small_ladder();
  options.concurrency = {1, 2, 4};
  options.prompt_tokens = {200};
  LoadResult first = run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
  EXPECT_EQ(fake.extended(), 0) << "a prompt began with an earlier one";
  for (const LoadLevel& level : first.levels) EXPECT_EQ(level.cached_prompt_tokens, 0);
  EXPECT_EQ(to_report(first, options).verdict_severity, report::Severity::info);
  LoadResult again = run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
  for (const LoadLevel& level : again.levels)
    EXPECT_EQ(level.cached_prompt_tokens, level.prompt_tokens);
  const report::Report report = to_report(again, options);
  EXPECT_EQ(report.verdict_severity, report::Severity::warning);
  EXPECT_NE(report.verdict.find("100% of the prompt tokens at real x1 from its prompt cache"),
            std::string::npos)
      << report.verdict;
}

// SGLang: the load asks for meta_info (return_meta_info, SGLang servers only) and sums the
// real per-request counts of PR 13754's answer; a streamed run without them falls back to
// SGLang's last-interval gauges, with their accept length less the token each step emits.
TEST(Load, SglangSpeculativeCountsFromMetaInfoElseItsGauges) {
  LoadOptions options = small_ladder();
  options.concurrency = {1};
  options.random_control = false;
  {
    LoadFake fake({.stream = false, .sglang = true});
    LoadResult result =
        run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
    ASSERT_EQ(result.servers.at(0).engine, "sglang");
    const LoadLevel& level = result.levels.at(0);
    EXPECT_EQ(level.spec_source, "responses");
    EXPECT_EQ(level.draft_tokens, 4 * 940);
    EXPECT_EQ(level.accepted_tokens, 4 * 11);
    EXPECT_EQ(level.drafts, 4 * 188);
    EXPECT_EQ(level.cached_prompt_tokens, 0);
    const report::Report report = to_report(result, options);
    EXPECT_NE(report.verdict.find("A speculative drafts accepted 1.2% on real code"),
              std::string::npos)
        << report.verdict;
  }
  {
    LoadFake fake({.sglang = true});
    LoadResult result =
        run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
    const LoadLevel& level = result.levels.at(0);
    EXPECT_EQ(level.spec_source, "/metrics gauges");
    EXPECT_EQ(level.draft_tokens, -1);
    EXPECT_DOUBLE_EQ(level.spec_accept_rate_gauge, 0.27);
    EXPECT_DOUBLE_EQ(level.spec_accept_length_gauge, 2.9);
    EXPECT_EQ(level.cached_prompt_tokens, 4 * 7);  // the counter's delta over the level
    const report::Report report = to_report(result, options);
    EXPECT_NE(report.verdict.find("accepted 27.0% on real code"), std::string::npos)
        << report.verdict;
    const report::Table& ladder = report.tables.at(0);
    ASSERT_EQ(ladder.id, "load_ladder");
    size_t per_step = 0;
    while (ladder.columns[per_step].key != "per_step") ++per_step;
    EXPECT_DOUBLE_EQ(std::get<double>(ladder.rows.at(0).at(per_step)), 1.9);
  }
}

// A server whose /metrics says NaN, infinity or a negative count: those samples are left
// out, so the level reports no speculative figures and no server count instead of NaN.
TEST(Load, MisreportedMetricsAreLeftOut) {
  LoadFake fake({.sglang = true, .lying_metrics = true});
  LoadOptions options = small_ladder();
  options.concurrency = {1};
  options.random_control = false;
  LoadResult result = run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
  const LoadLevel& level = result.levels.at(0);
  EXPECT_EQ(level.failures, 0);
  EXPECT_EQ(level.spec_source, "");
  EXPECT_EQ(level.spec_accept_rate_gauge, -1.0);
  EXPECT_EQ(level.server_output_tokens, -1);
  EXPECT_EQ(level.cached_prompt_tokens, -1);
  const report::Report report = to_report(result, options);
  EXPECT_EQ(report.verdict.find("nan"), std::string::npos) << report.verdict;
}

TEST(Load, OnePieceAnswersHaveNoFirstTokenTime) {
  LoadFake fake({.stream = false});
  LoadResult result =
      run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), small_ladder());
  ASSERT_FALSE(result.levels.empty());
  for (const LoadLevel& level : result.levels) {
    EXPECT_FALSE(level.streamed);
    EXPECT_EQ(level.ttft.count, 0);
    EXPECT_EQ(level.output_tokens, 32);  // from usage
  }
}

TEST(Load, ServerThatRefusesStreamingIsMeasuredInOnePiece) {
  LoadFake fake({.refuse_stream = true});
  LoadResult result =
      run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), small_ladder());
  ASSERT_EQ(result.levels.size(), 4u);
  for (const LoadLevel& level : result.levels) {
    EXPECT_EQ(level.failures, 0);
    EXPECT_FALSE(level.streamed);
    EXPECT_EQ(level.output_tokens, 32);
    EXPECT_EQ(level.e2e.count, 4);
  }
  bool noted = false;
  for (const std::string& note : result.notes)
    noted |= note.find("refuses stream=true") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_EQ(fake.completions(), 16 + 1);  // one refused stream request, then one piece each
}

TEST(Load, ServerThatSlowsDownUnderLoad) {
  LoadFake fake({.token_ms = 4, .slower_under_load = true});
  LoadOptions options = small_ladder();
  options.concurrency = {1, 4};
  options.requests_per_level = 8;
  options.random_control = false;
  LoadResult result = run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
  ASSERT_EQ(result.levels.size(), 2u);
  // Four at once take about four times as long per token: no throughput gained, and the
  // gaps between tokens grow with the load.
  EXPECT_GT(result.levels[1].itl.p50, 2.0 * result.levels[0].itl.p50);
  EXPECT_LT(result.levels[1].output_tokens_per_second,
            2.0 * result.levels[0].output_tokens_per_second);
}

TEST(Load, ServerThatStartsFailingStopsTheRunWithWhatItMeasured) {
  LoadFake fake({.fail_after = 6});
  net::ClientOptions client = quick_client();
  client.max_retries = 0;
  const auto started = Clock::now();
  LoadResult result = run_load(kvaudit::testing::registry(), {fake.url()}, client, small_ladder());
  EXPECT_LT(seconds_since(started), 10.0);
  EXPECT_FALSE(result.stopped.empty());
  int64_t failures = 0;
  for (const LoadLevel& level : result.levels) failures += level.failures;
  EXPECT_GT(failures, 0);
  report::Report report = to_report(result, small_ladder());
  EXPECT_EQ(report.verdict_severity, report::Severity::warning);
  EXPECT_NE(report.verdict.find("stopped early"), std::string::npos) << report.verdict;
  bool named = false;
  for (const std::string& note : report.notes)
    named |= note.find("engine died") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST(Load, RateLimitedRequestsAreRetriedAfterRetryAfter) {
  LoadFake fake({.rate_limit_first = 2});
  LoadOptions options = small_ladder();
  options.concurrency = {1};
  options.random_control = false;
  LoadResult result = run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
  ASSERT_EQ(result.levels.size(), 1u);
  EXPECT_EQ(result.levels[0].failures, 0);
  EXPECT_EQ(fake.completions(), 4 + 2);
}

TEST(Load, StallMidStreamEndsAtTheReadTimeout) {
  LoadFake fake({.stall_after_tokens = 3, .stall_ms = 3000});
  net::ClientOptions client = quick_client();
  client.read_timeout = std::chrono::milliseconds(300);
  const auto started = Clock::now();
  LoadResult result = run_load(kvaudit::testing::registry(), {fake.url()}, client, small_ladder());
  EXPECT_LT(seconds_since(started), 8.0);
  ASSERT_FALSE(result.levels.empty());
  EXPECT_GT(result.levels[0].failures, 0);
  EXPECT_FALSE(result.stopped.empty());  // a stalled server is a failing one
}

TEST(Load, TimeLimitAndInterruptEndTheRun) {
  LoadFake fake({.token_ms = 50});
  LoadOptions options = small_ladder();
  options.max_seconds = 1.0;
  auto started = Clock::now();
  LoadResult timed = run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
  EXPECT_LT(seconds_since(started), 4.0);
  EXPECT_NE(timed.stopped.find("time limit"), std::string::npos) << timed.stopped;
  // The streams the limit cut are cancelled, not failed: the server failed nothing.
  int64_t failed = 0, cancelled = 0;
  for (const LoadLevel& level : timed.levels)
    failed += level.failures, cancelled += level.cancelled;
  EXPECT_EQ(failed, 0);
  EXPECT_GT(cancelled, 0);
  const report::Report said = to_report(timed, options);
  EXPECT_EQ(said.verdict.find("failed requests"), std::string::npos) << said.verdict;
  EXPECT_NE(said.verdict.find("cancelled by the run's own stop"), std::string::npos)
      << said.verdict;

  std::atomic<int> asked{0};
  options = small_ladder();
  options.interrupted = [&] { return ++asked > 12; };
  LoadResult interrupted =
      run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
  EXPECT_EQ(interrupted.stopped, "interrupted");
  EXPECT_LT(interrupted.levels.size(), 4u);
}

TEST(Load, TimeLimitStopsOnePieceAnswersToo) {
  // 0.8 s per answer, silent until it is whole: requests in flight at the deadline finish
  // (bounded by the read timeout), no new ones start.
  LoadFake fake({.stream = false, .token_ms = 100});
  LoadOptions options = small_ladder();
  options.max_seconds = 1.0;
  const auto started = Clock::now();
  LoadResult result = run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
  EXPECT_LT(seconds_since(started), 3.0);
  EXPECT_NE(result.stopped.find("time limit"), std::string::npos) << result.stopped;
}

TEST(Load, ResultsFileResumesFinishedLevels) {
  LoadFake fake({});
  const std::filesystem::path file = std::filesystem::path(KVAUDIT_BUILD_DIR) / "load_resume.jsonl";
  std::filesystem::remove(file);
  LoadOptions options = small_ladder();
  options.results_path = file.string();
  LoadResult first = run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
  ASSERT_EQ(first.levels.size(), 4u);
  const int sent = fake.completions();
  LoadResult again = run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options);
  ASSERT_EQ(again.levels.size(), 4u);
  EXPECT_EQ(fake.completions(), sent);  // nothing re-run
  for (const LoadLevel& level : again.levels) EXPECT_TRUE(level.resumed);
  EXPECT_EQ(again.levels[2].output_tokens_per_second, first.levels[2].output_tokens_per_second);
  // A broken line names the file and line.
  {
    std::ofstream out(file, std::ios::app);
    out << R"({"kind":"load_level","server":"x"})"
        << "\n";
  }
  EXPECT_THROW(run_load(kvaudit::testing::registry(), {fake.url()}, quick_client(), options),
               InputError);
  std::filesystem::remove(file);
}

TEST(Load, SpeculativeAcceptanceRealAgainstRandom) {
  LoadFake plain({}), spec({.spec = true});
  LoadOptions options = small_ladder();
  options.concurrency = {1};
  LoadResult result =
      run_load(kvaudit::testing::registry(), {plain.url(), spec.url()}, quick_client(), options);
  ASSERT_EQ(result.levels.size(), 4u);  // real A, real B, random A, random B
  const LoadLevel& real_b = result.levels[1];
  const LoadLevel& random_b = result.levels[3];
  ASSERT_EQ(real_b.spec_source, "/metrics");
  EXPECT_EQ(result.levels[0].draft_tokens, -1);  // A exports no counters
  const double real_rate = double(real_b.accepted_tokens) / double(real_b.draft_tokens);
  const double random_rate = double(random_b.accepted_tokens) / double(random_b.draft_tokens);
  EXPECT_GT(real_rate, 2.0 * random_rate) << real_rate << " vs " << random_rate;
  report::Report report = to_report(result, options);
  EXPECT_NE(report.verdict.find("under-states the method"), std::string::npos) << report.verdict;
  EXPECT_NE(report.verdict.find("B/A output throughput up to"), std::string::npos)
      << report.verdict;
}

TEST(Load, RefusesBadOptions) {
  LoadOptions options = small_ladder();
  options.concurrency = {};
  EXPECT_THROW(
      run_load(kvaudit::testing::registry(), {"http://127.0.0.1:1"}, quick_client(), options),
      InputError);
  options = small_ladder();
  options.concurrency = {0};
  EXPECT_THROW(
      run_load(kvaudit::testing::registry(), {"http://127.0.0.1:1"}, quick_client(), options),
      InputError);
  EXPECT_THROW(run_load(kvaudit::testing::registry(), {}, quick_client(), small_ladder()),
               InputError);
}

TEST(Load, LatencyPercentilesAreNearestRank) {
  LatencySummary s = summarize_latency({0.5, 0.1, 0.3, 0.2, 0.4});
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.p50, 0.3);
  EXPECT_DOUBLE_EQ(s.p90, 0.5);
  EXPECT_DOUBLE_EQ(s.mean, 0.3);
  EXPECT_EQ(summarize_latency({}).count, 0);
}

}  // namespace
}  // namespace kvaudit::loadbench
