// OpenAI answer parsing (legacy completions logprobs, chat logprobs), strict errors that
// name the JSON path, /tokenize in vLLM's and SGLang's forms, and Prometheus text.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <httplib.h>
#include <filesystem>
#include <fstream>
#include <map>

#include <cmath>
#include <thread>

#include "common/loopback_server.h"
#include "net/net.h"

namespace kvaudit::net {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

std::string malformed_message(const json& body, bool chat = false) {
  try {
    if (chat)
      parse_chat_completion(body, "http://h/v1/chat/completions");
    else
      parse_completion(body, "http://h/v1/completions");
  } catch (const RequestError& error) {
    EXPECT_EQ(error.kind(), FailureKind::malformed) << error.what();
    return error.what();
  }
  return "";
}

TEST(NetProtocol, LegacyCompletionWithEchoAndLogprobs) {
  json body = json::parse(R"({
    "id": "cmpl-1", "object": "text_completion", "model": "qwen",
    "choices": [{"index": 0, "text": "ab c", "finish_reason": "length",
      "logprobs": {"tokens": ["ab", " c"], "token_logprobs": [null, -0.25],
                   "top_logprobs": [null, {" d": -2.0, " c": -0.25}],
                   "text_offset": [0, 2]}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})");
  Completion c = parse_completion(body, "u");
  EXPECT_EQ(c.text, "ab c");
  EXPECT_EQ(c.finish_reason, "length");
  EXPECT_EQ(c.model, "qwen");
  ASSERT_TRUE(c.has_logprobs);
  ASSERT_EQ(c.tokens.size(), 2u);
  EXPECT_FALSE(c.tokens[0].logprob);
  EXPECT_EQ(c.tokens[1].logprob, -0.25);
  ASSERT_EQ(c.tokens[1].top.size(), 2u);
  EXPECT_EQ(c.tokens[1].top[0].token, " c");  // sorted, most likely first
  EXPECT_EQ(c.tokens[1].text_offset, 2);
  EXPECT_EQ(c.prompt_tokens, 1);
  EXPECT_EQ(c.completion_tokens, 1);
}

TEST(NetProtocol, ChatWithTopLogprobs) {
  json body = json::parse(R"({"choices": [{"message": {"role": "assistant", "content": "42"},
    "finish_reason": "stop", "logprobs": {"content": [{"token": "42", "logprob": -0.1,
    "bytes": [52, 50], "top_logprobs": [{"token": "41", "logprob": -3.0},
                                        {"token": "42", "logprob": -0.1}]}]}}]})");
  Completion c = parse_chat_completion(body, "u");
  EXPECT_EQ(c.text, "42");
  ASSERT_EQ(c.tokens.size(), 1u);
  EXPECT_EQ(c.tokens[0].top[0].token, "42");
}

TEST(NetProtocol, StrictErrorsNameThePath) {
  EXPECT_THAT(malformed_message(json::parse(R"({"choices": []})")), HasSubstr("$.choices: empty"));
  EXPECT_THAT(malformed_message(json::parse(R"({"data": 1})")), HasSubstr("$.choices: missing"));
  EXPECT_THAT(malformed_message(json::parse(R"({"choices": [{"text": 5}]})")),
              HasSubstr("$.choices[0].text: expected a string, got a number"));
  EXPECT_THAT(malformed_message(json::parse(R"({"choices": [{"text": "a", "logprobs":
      {"tokens": ["a"], "token_logprobs": [-1, -2]}}]})")),
              HasSubstr("1 tokens but 2 token_logprobs"));
  EXPECT_THAT(malformed_message(json::parse(R"({"choices": [{"text": "a", "logprobs":
      {"tokens": ["a"], "token_logprobs": [0.5]}}]})")),
              HasSubstr("token_logprobs[0]: log-prob 0.5 is not <= 0"));
  EXPECT_THAT(malformed_message(json::parse(R"({"choices": [{"text": "a", "logprobs":
      {"tokens": ["a"], "token_logprobs": [-1], "top_logprobs": [["x"]]}}]})")),
              HasSubstr("top_logprobs[0]: expected an object, got an array"));
  EXPECT_THAT(malformed_message(json::parse(R"([1, 2])")), HasSubstr("$: expected an object"));
  EXPECT_THAT(malformed_message(json::parse(R"({"choices": [{"message": {}}]})"), true),
              HasSubstr("$.choices[0].message.content: missing"));
  EXPECT_THAT(malformed_message(json::parse(R"({"choices": [{"message": {"content": "x"},
      "logprobs": {"content": [{"token": "x"}]}}]})"),
                                true),
              HasSubstr("logprobs.content[0].logprob: missing"));
  EXPECT_THROW(parse_model_list(json::parse(R"({"data": [{"object": "model"}]})"), "u"),
               RequestError);
  EXPECT_THROW(parse_tokenize(json::parse(R"({"tokens": [1, -5]})"), "u"), RequestError);
  EXPECT_THROW(parse_tokenize(json::parse(R"({"tokens": [1, 2], "count": 3})"), "u"), RequestError);
}

TEST(NetProtocol, ErrorBodies) {
  EXPECT_EQ(error_message_of(R"({"error": {"message": "boom", "type": "x"}})"), "boom");
  EXPECT_EQ(error_message_of(R"({"object": "error", "message": "flat", "code": 400})"), "flat");
  EXPECT_EQ(error_message_of(R"({"detail": "Not Found"})"), "Not Found");
  EXPECT_EQ(error_message_of("plain\ntext"), "plain text");
  EXPECT_EQ(error_message_of(""), "(empty body)");
  EXPECT_EQ(error_message_of(std::string(500, 'z')).size(), 163u);
}

TEST(NetProtocol, RequestBodies) {
  CompletionRequest request;
  request.model = "m";
  request.prompt_ids = {1, 2, 3};
  request.echo = true;
  request.logprobs = 5;
  request.stop = {"\n"};
  json body = to_json(request);
  EXPECT_EQ(body["prompt"], json::array({1, 2, 3}));
  EXPECT_EQ(body["echo"], true);
  EXPECT_EQ(body["logprobs"], 5);
  EXPECT_EQ(body["stop"], json::array({"\n"}));
  ChatRequest chat_request;
  chat_request.messages = {{"user", "hi"}};
  chat_request.top_logprobs = 3;
  json chat_body = to_json(chat_request);
  EXPECT_EQ(chat_body["logprobs"], true);
  EXPECT_EQ(chat_body["top_logprobs"], 3);
  EXPECT_EQ(chat_body["messages"][0]["content"], "hi");
}

// /tokenize: vLLM takes {"prompt"}, SGLang's older native form {"text"}; the client tries
// both, and reports "no endpoint" when the server has neither.
TEST(NetProtocol, TokenizeForms) {
  ClientOptions options;
  options.max_retries = 0;
  {
    kvaudit::testing::LoopbackServer server;
    server.http.Post("/tokenize", [](const httplib::Request& req, httplib::Response& res) {
      auto body = json::parse(req.body);
      if (!body.contains("text")) {
        res.status = 422;
        res.set_content(R"({"detail": "field required: text"})", "application/json");
        return;
      }
      std::string text = body["text"];
      json tokens = json::array();
      for (unsigned char c : text) tokens.push_back(int(c));
      res.set_content(
          json({{"tokens", tokens}, {"count", text.size()}, {"max_model_len", 1e30}}).dump(),
          "application/json");
    });
    ASSERT_TRUE(server.start());
    // Clients close their keep-alive connections when they go; a server stopped under an
    // open one waits out its keep-alive timeout.
    Client client(parse_url(server.url()), options);
    auto tokens = tokenize(client, "abc");
    ASSERT_TRUE(tokens);
    EXPECT_EQ(tokens->ids, (std::vector<int32_t>{97, 98, 99}));
    EXPECT_FALSE(tokens->max_model_len);  // 1e30 is "no limit", not a length
  }
  {
    kvaudit::testing::LoopbackServer bare;
    ASSERT_TRUE(bare.start());
    Client bare_client(parse_url(bare.url()), options);
    EXPECT_FALSE(tokenize(bare_client, "abc"));
  }
}

TEST(NetPrometheus, VllmCacheConfigInfo) {
  const std::string text =
      "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
      "# TYPE vllm:cache_config_info gauge\n"
      "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"fp8_e4m3\","
      "calculate_kv_scales=\"False\",engine=\"0\",gpu_memory_utilization=\"0.9\","
      "num_gpu_blocks=\"12345\",prefix=\"a\\\"b\\\\c\\nd\"} 1.0\n"
      "vllm:num_requests_running{model_name=\"m\"} 0.0 1700000000000\r\n"
      "\n"
      "process_open_fds 42\n"
      "vllm:x_total +Inf\n";
  auto samples = parse_prometheus(text, "metrics");
  ASSERT_EQ(samples.size(), 4u);
  EXPECT_EQ(samples[0].name, "vllm:cache_config_info");
  EXPECT_EQ(samples[0].labels.at("cache_dtype"), "fp8_e4m3");
  EXPECT_EQ(samples[0].labels.at("num_gpu_blocks"), "12345");
  EXPECT_EQ(samples[0].labels.at("prefix"), "a\"b\\c\nd");
  EXPECT_EQ(samples[0].value, 1.0);
  EXPECT_EQ(samples[2].value, 42.0);
  EXPECT_TRUE(std::isinf(samples[3].value));
  for (const char* bad : {"name{a=\"1\" 1", "name{a=1} 1", "name{a=\"1\"}", "name x",
                          "name{=\"1\"} 1", "{a=\"1\"} 1", "name 1 2 3"}) {
    EXPECT_THROW(parse_prometheus(bad, "metrics"), InputError) << bad;
  }
  try {
    parse_prometheus("ok 1\nbad{", "http://h/metrics");
  } catch (const InputError& error) {
    EXPECT_THAT(error.what(), HasSubstr("http://h/metrics: line 2"));
  }
}

TEST(Sse, DataLinesAcrossPiecesCrLfAndComments) {
  std::vector<std::string> events;
  SseParser parser("http://x/v1/completions",
                   [&](std::string_view data) { events.emplace_back(data); });
  const std::string body =
      ": keep-alive comment\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata:{\"b\":2}\n\ndata: [DONE]\n\n";
  for (size_t split : {size_t(1), size_t(3), size_t(7), body.size()}) {
    events.clear();
    for (size_t at = 0; at < body.size(); at += split)
      parser.feed(std::string_view(body).substr(at, split));
    ASSERT_EQ(events.size(), 3u) << split;
    EXPECT_EQ(events[0], "{\"a\":1}");
    EXPECT_EQ(events[1], "{\"b\":2}");
    EXPECT_EQ(events[2], "[DONE]");
  }
  // A line that never ends is refused once it passes the bound.
  SseParser bounded(
      "http://x/v1/completions", [](std::string_view) {}, 64);
  EXPECT_THROW(bounded.feed(std::string(100, 'a')), RequestError);
}

// Real streams: llama-server (n-gram speculation, recorded/SOURCES.md) and vLLM 0.16.0's last
// chunk (servers/SOURCES.md). Every data line is JSON but the final [DONE]; llama-server's
// last event carries usage and its per-response draft counts, and its /metrics the
// spec_decode counters probe --load sums.
TEST(Sse, RealStreamsAndSpeculationCounters) {
  const std::filesystem::path servers =
      std::filesystem::path(KVAUDIT_TEST_DIR) / "fixtures" / "servers";
  for (const char* file : {"llama-server/recorded/c-post-v1-completions-stream-ngram.txt",
                           "vllm/v1-completions-logprobs-stream-chunk-0.16.0.txt"}) {
    std::vector<std::string> events;
    SseParser parser(file, [&](std::string_view data) { events.emplace_back(data); });
    const std::string body = read_text_file(servers / file);
    for (size_t at = 0; at < body.size(); at += 97)
      parser.feed(std::string_view(body).substr(at, 97));
    ASSERT_GE(events.size(), 2u) << file;
    EXPECT_EQ(events.back(), "[DONE]") << file;
    for (size_t i = 0; i + 1 < events.size(); ++i)
      EXPECT_FALSE(nlohmann::json::parse(events[i], nullptr, false).is_discarded())
          << file << " " << i;
    if (std::string(file).find("llama-server") != std::string::npos) {
      const nlohmann::json last = nlohmann::json::parse(events[events.size() - 2]);
      EXPECT_EQ(last["usage"]["completion_tokens"], 24);
      EXPECT_EQ(last["timings"]["draft_n"], 25);
      EXPECT_EQ(last["timings"]["draft_n_accepted"], 15);
    }
  }
  std::map<std::string, double> counters;
  const std::string metrics =
      read_text_file(servers / "llama-server/recorded/c-get-metrics-ngram.txt");
  for (const MetricSample& sample : parse_prometheus(metrics, "c-get-metrics-ngram.txt"))
    counters[sample.name] += sample.value;
  EXPECT_EQ(counters["llamacpp:spec_decode_num_draft_tokens_total"], 25);
  EXPECT_EQ(counters["llamacpp:spec_decode_num_accepted_tokens_total"], 15);
  EXPECT_EQ(counters["llamacpp:spec_decode_num_drafts_total"], 4);
  EXPECT_EQ(counters["llamacpp:tokens_predicted_total"], 24);
}

}  // namespace
}  // namespace kvaudit::net

namespace kvaudit::net {
namespace {

// Real llama-server answers (fixtures/servers/llama-server/prompt-cache/SOURCES.md): the
// cached tokens as the answer states them, and the host-RAM tier giving back exactly what
// the slot gave.
TEST(CachedTokens, LlamaServersPromptCachesReadFromItsRealAnswers) {
  const std::filesystem::path dir = std::filesystem::path(KVAUDIT_TEST_DIR) / "fixtures" /
                                    "servers" / "llama-server" / "prompt-cache";
  auto read = [&](const char* name) {
    std::ifstream in(dir / name);
    return parse_completion(nlohmann::json::parse(in), name);
  };
  const Completion cold = read("p1-cold.json");
  const Completion slot = read("p1-slot-reuse.json");
  const Completion ram = read("p1-ram-cache-after-p2.json");
  const Completion off = read("p1-after-p2-cache-ram-0.json");
  EXPECT_EQ(cold.cached_tokens, 0);
  EXPECT_EQ(slot.cached_tokens, 493);
  EXPECT_EQ(ram.cached_tokens, 493);
  EXPECT_EQ(off.cached_tokens, 0);
  EXPECT_EQ(slot.cached_tokens_field, "usage.prompt_tokens_details.cached_tokens");
  EXPECT_EQ(slot.prompt_tokens, 494);
  ASSERT_EQ(slot.tokens.size(), 8u);
  ASSERT_EQ(ram.tokens.size(), 8u);
  bool cold_differs = false;
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(slot.tokens[i].token, ram.tokens[i].token);
    EXPECT_EQ(slot.tokens[i].logprob, ram.tokens[i].logprob);  // bit for bit
    cold_differs |= cold.tokens[i].logprob != slot.tokens[i].logprob;
  }
  EXPECT_TRUE(cold_differs);  // the cold pass's last prompt token ran in another batch
}

// timings.cache_n alone (an answer without usage's details) is read too.
TEST(CachedTokens, TimingsCacheNStandsInWhenUsageHasNoDetails) {
  auto body = nlohmann::json::parse(R"({"choices": [{"text": "x", "index": 0,
      "finish_reason": "length"}], "usage": {"prompt_tokens": 5, "completion_tokens": 1},
      "timings": {"cache_n": 4, "prompt_n": 1}})");
  const Completion answer = parse_completion(body, "inline");
  EXPECT_EQ(answer.cached_tokens, 4);
  EXPECT_EQ(answer.cached_tokens_field, "timings.cache_n");
}

}  // namespace
}  // namespace kvaudit::net
