// The HTTP contract of kvaudit serve, in process on 127.0.0.1: every endpoint's shape, greedy
// answers equal to running the reference engine directly and identical under concurrency,
// seeded sampling, stop strings, log-probs in both OpenAI formats, bounds (400/404/413/429),
// the drain on stop, and the start-up log that `kvaudit logs` reads.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <future>

#include "model/model.h"
#include "serve_test_util.h"
#include "tokenizer/tokenizer.h"

namespace kvaudit::serve {
namespace {

using nlohmann::json;
using testing::options_for;
using testing::RunningServer;

const std::string kPrompt = "def add(a, b):\n    return";

json greedy(const std::string& prompt, int max_tokens, int logprobs = -1) {
  json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (logprobs >= 0) body["logprobs"] = logprobs;
  return body;
}

// Greedy continuation computed directly on the engine, without the server.
std::vector<int32_t> direct_greedy(const std::vector<int32_t>& prompt, int max_tokens,
                                   const std::string& spec, std::vector<float>* first_logits) {
  auto model = model::Model::load(testing::fixture_model());
  ThreadPool pool(1);
  model::Session session(*model, numerics::parse_kv_format(spec), pool);
  std::vector<float> logits;
  session.forward(prompt, static_cast<int64_t>(prompt.size()) - 1, logits);
  if (first_logits) *first_logits = logits;
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    int32_t best =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (best == 2047) break;  // EOS
    out.push_back(best);
    session.decode(best, logits);
  }
  return out;
}

std::vector<int32_t> tokenize(const RunningServer& server, const std::string& text) {
  auto [status, body] = server.post("/tokenize", {{"prompt", text}});
  EXPECT_EQ(status, 200);
  return body["tokens"].get<std::vector<int32_t>>();
}

TEST(ServeHttp, ModelsHealthAndServerInfo) {
  RunningServer server(options_for(testing::fixture_model()));
  EXPECT_EQ(server.get("/health").first, 200);
  auto [status, text] = server.get("/v1/models");
  ASSERT_EQ(status, 200);
  json models = json::parse(text);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "qwen3-pystd");
  EXPECT_EQ(models["data"][0]["max_model_len"], 4096);
  json info = json::parse(server.get("/get_server_info").second);
  EXPECT_EQ(info["kv_cache_dtype"], "bf16");
  EXPECT_EQ(info["kv_cache_dtype_requested"], "auto");
  EXPECT_EQ(info["max_total_num_tokens"], 65536);
  EXPECT_EQ(info["context_length"], nullptr);  // as given: SGLang prints None
  EXPECT_EQ(info["quantization_param_path"], nullptr);
  EXPECT_EQ(info["tp_size"], 1);
  EXPECT_EQ(info["page_size"], 1);
  EXPECT_TRUE(info["version"].is_string());
  ASSERT_TRUE(info["internal_states"].is_array());
  EXPECT_EQ(info["internal_states"][0]["memory_usage"]["token_capacity"], 65536);
  EXPECT_EQ(info["kvaudit"]["kv_format"], "bf16");
}

TEST(ServeHttp, GreedyCompletionEqualsTheEngineRunDirectly) {
  RunningServer server(options_for(testing::fixture_model()));
  std::vector<int32_t> prompt = tokenize(server, kPrompt);
  std::vector<float> first_logits;
  std::vector<int32_t> expected = direct_greedy(prompt, 24, "bf16", &first_logits);
  auto [status, body] = server.post("/v1/completions", greedy(kPrompt, 24, 3));
  ASSERT_EQ(status, 200) << body.dump();
  const json& choice = body["choices"][0];
  auto tokenizer = tokenizer::Tokenizer::load(testing::fixture_model());
  EXPECT_EQ(choice["text"], tokenizer.decode(expected, {.skip_special_tokens = true}));
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(body["usage"]["completion_tokens"], expected.size());
  EXPECT_EQ(body["usage"]["total_tokens"], prompt.size() + expected.size());
  EXPECT_EQ(body["object"], "text_completion");
  // Legacy log-probs: the first one is log_softmax of the direct logits at the chosen token.
  const json& logprobs = choice["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), expected.size());
  ASSERT_EQ(logprobs["token_logprobs"].size(), expected.size());
  ASSERT_EQ(logprobs["top_logprobs"].size(), expected.size());
  ASSERT_EQ(logprobs["text_offset"].size(), expected.size());
  double max_logit = *std::max_element(first_logits.begin(), first_logits.end());
  double sum = 0;
  for (float l : first_logits) sum += std::exp(l - max_logit);
  double expected_lp = first_logits[expected[0]] - max_logit - std::log(sum);
  EXPECT_NEAR(logprobs["token_logprobs"][0].get<double>(), expected_lp, 1e-5);
  EXPECT_EQ(logprobs["top_logprobs"][0].size(), 3u);  // greedy: the chosen token is the top one
  EXPECT_EQ(logprobs["text_offset"][0], 0);
  // Token ids as the prompt give the same answer.
  json by_ids = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}};
  auto [status2, body2] = server.post("/v1/completions", by_ids);
  ASSERT_EQ(status2, 200);
  EXPECT_EQ(body2["choices"][0]["text"], choice["text"]);
}

TEST(ServeHttp, GreedyIsIdenticalAcrossConcurrentRequests) {
  auto options = options_for(testing::fixture_model());
  RunningServer server(options);
  const std::vector<std::string> prompts = {
      kPrompt, "class Stack:\n    def push(self, item):", "import os\nimport sys\n"};
  std::vector<json> reference;
  for (const auto& p : prompts) {
    auto [status, body] = server.post("/v1/completions", greedy(p, 20, 2));
    ASSERT_EQ(status, 200);
    reference.push_back(body["choices"][0]);
  }
  std::vector<std::future<std::pair<int, json>>> futures;
  for (int i = 0; i < 12; ++i)
    futures.push_back(std::async(std::launch::async, [&, i] {
      return server.post("/v1/completions", greedy(prompts[i % prompts.size()], 20, 2));
    }));
  for (int i = 0; i < 12; ++i) {
    auto [status, body] = futures[i].get();
    ASSERT_EQ(status, 200);
    const json& choice = body["choices"][0];
    const json& want = reference[i % prompts.size()];
    EXPECT_EQ(choice["text"], want["text"]);
    EXPECT_EQ(choice["logprobs"]["token_logprobs"], want["logprobs"]["token_logprobs"]);
  }
}

TEST(ServeHttp, SeededSamplingRepeatsAndStopStringsCut) {
  RunningServer server(options_for(testing::fixture_model()));
  json body = {{"prompt", kPrompt},
               {"max_tokens", 30},
               {"temperature", 0.9},
               {"seed", 1234},
               {"top_p", 0.95}};
  auto a = server.post("/v1/completions", body);
  auto b = server.post("/v1/completions", body);
  ASSERT_EQ(a.first, 200);
  EXPECT_EQ(a.second["choices"][0]["text"], b.second["choices"][0]["text"]);
  body["seed"] = 99;
  bool differs = false;
  for (int seed = 1; seed < 6 && !differs; ++seed) {
    body["seed"] = seed;
    differs = server.post("/v1/completions", body).second["choices"][0]["text"] !=
              a.second["choices"][0]["text"];
  }
  EXPECT_TRUE(differs) << "five other seeds all produced the same sample";

  // Stop string: the greedy text cut before the first occurrence, finish_reason "stop".
  std::string full =
      server.post("/v1/completions", greedy(kPrompt, 30)).second["choices"][0]["text"];
  ASSERT_GE(full.size(), 4u);
  std::string stop = full.substr(full.size() / 2, 2);
  json with_stop = greedy(kPrompt, 30);
  with_stop["stop"] = json::array({stop, "@@never@@"});
  auto [status, cut] = server.post("/v1/completions", with_stop);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(cut["choices"][0]["text"], full.substr(0, full.find(stop)));
}

TEST(ServeHttp, EchoWithLogprobsScoresThePrompt) {
  RunningServer server(options_for(testing::fixture_model()));
  std::vector<int32_t> prompt = tokenize(server, kPrompt);
  json body = greedy(kPrompt, 5, 1);
  body["echo"] = true;
  auto [status, out] = server.post("/v1/completions", body);
  ASSERT_EQ(status, 200);
  const json& choice = out["choices"][0];
  EXPECT_EQ(choice["text"].get<std::string>().rfind(kPrompt, 0), 0u);
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), prompt.size() + 5);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < lp["token_logprobs"].size(); ++i)
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
  // Offsets grow by each token's length.
  for (size_t i = 1; i < lp["text_offset"].size(); ++i)
    EXPECT_GE(lp["text_offset"][i].get<int>(), lp["text_offset"][i - 1].get<int>());
  // The generated part is the same as without echo.
  auto [status2, plain] = server.post("/v1/completions", greedy(kPrompt, 5, 1));
  ASSERT_EQ(status2, 200);
  EXPECT_EQ(choice["text"], kPrompt + plain["choices"][0]["text"].get<std::string>());
  for (size_t i = 0; i < 5; ++i)
    EXPECT_EQ(lp["token_logprobs"][prompt.size() + i],
              plain["choices"][0]["logprobs"]["token_logprobs"][i]);
}

TEST(ServeHttp, ChatUsesChatMlAndChatLogprobs) {
  RunningServer server(options_for(testing::fixture_model()));
  json messages = json::array({{{"role", "system"}, {"content", "You write Python."}},
                               {{"role", "user"}, {"content", "def main():"}}});
  json body = {{"messages", messages},
               {"max_tokens", 8},
               {"temperature", 0},
               {"logprobs", true},
               {"top_logprobs", 2}};
  auto [status, out] = server.post("/v1/chat/completions", body);
  ASSERT_EQ(status, 200) << out.dump();
  EXPECT_EQ(out["object"], "chat.completion");
  const json& choice = out["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  const std::string rendered =
      "<|im_start|>system\nYou write Python.<|im_end|>\n<|im_start|>user\ndef main():<|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(out["usage"]["prompt_tokens"], tokenize(server, rendered).size());
  // The same prompt as a completion gives the same text (up to the <|im_end|> stop).
  auto [status2, completion] = server.post("/v1/completions", greedy(rendered, 8));
  ASSERT_EQ(status2, 200);
  std::string text = completion["choices"][0]["text"];
  EXPECT_EQ(choice["message"]["content"], text.substr(0, text.find("<|im_end|>")));
  const json& content = choice["logprobs"]["content"];
  ASSERT_FALSE(content.empty());
  EXPECT_TRUE(content[0]["token"].is_string());
  EXPECT_LE(content[0]["logprob"].get<double>(), 0.0);
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], content[0]["token"]);
  EXPECT_TRUE(content[0]["bytes"].is_array());
}

TEST(ServeHttp, TokenizeAcceptsBothSpellingsAndMetricsCarryTheCacheGauge) {
  RunningServer server(options_for(testing::fixture_model()));
  auto vllm = server.post("/tokenize", {{"prompt", "hello world"}});
  auto sglang = server.post("/tokenize", {{"text", "hello world"}});
  ASSERT_EQ(vllm.first, 200);
  EXPECT_EQ(vllm.second["tokens"], sglang.second["tokens"]);
  EXPECT_EQ(vllm.second["count"], vllm.second["tokens"].size());
  EXPECT_EQ(vllm.second["max_model_len"], 4096);
  server.post("/v1/completions", greedy("x = 1", 3));
  auto [status, metrics] = server.get("/metrics");
  ASSERT_EQ(status, 200);
  EXPECT_NE(metrics.find("vllm:cache_config_info{block_size=\"1\",cache_dtype=\"bf16\","),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("num_gpu_blocks=\"65536\""), std::string::npos);
  EXPECT_NE(metrics.find("} 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("vllm:e2e_request_latency_seconds_count{model_name=\"qwen3-pystd\"} 1"),
            std::string::npos);
  EXPECT_NE(metrics.find("vllm:generation_tokens_total{model_name=\"qwen3-pystd\"} 3"),
            std::string::npos);
}

TEST(ServeHttp, ErrorsAreOpenAiStyleJson) {
  auto options = options_for(testing::fixture_model());
  options.max_body_bytes = 2048;
  options.context_length = 64;
  options.max_tokens_limit = 100;
  RunningServer server(options);
  auto expect_error = [&](const std::string& path, const std::string& body, int status) {
    auto c = server.client();
    auto res = c.Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << body.substr(0, 80) << " -> " << res->body;
    json error = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(error.is_object()) << res->body;
    EXPECT_TRUE(error["error"]["message"].is_string());
    EXPECT_TRUE(error["error"]["type"].is_string());
    EXPECT_EQ(error["error"]["code"], status);
  };
  expect_error("/v1/completions", "{not json", 400);
  expect_error("/v1/completions", R"({"max_tokens": 3})", 400);
  expect_error("/v1/completions", R"({"prompt": "x", "n": 2})", 400);
  expect_error("/v1/completions", R"({"prompt": "x", "temperature": -1})", 400);
  expect_error("/v1/completions", R"({"prompt": [1, 2, 999999]})", 400);
  expect_error("/v1/completions", R"({"prompt": "", "max_tokens": 3})", 400);
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": 101})", 400);
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": 64})", 400);  // context
  expect_error("/v1/completions", R"({"prompt": "x", "stream": true, "logprobs": 1})", 400);
  expect_error("/v1/completions", R"({"prompt": "x", "stream": "yes"})", 400);
  expect_error("/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", 404);
  expect_error("/v1/chat/completions", R"({"messages": []})", 400);
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})",
               400);
  expect_error("/v1/nothing", "{}", 404);
  expect_error("/v1/completions", json{{"prompt", std::string(4000, 'a')}}.dump(), 413);
  auto [status, text] = server.get("/no/such/route");
  EXPECT_EQ(status, 404);
  EXPECT_TRUE(json::parse(text, nullptr, false).contains("error"));
}

TEST(ServeHttp, ApiKeyGuardsEverythingButHealthAndMetrics) {
  auto options = options_for(testing::fixture_model());
  options.api_key = "s3cret";
  RunningServer server(options);
  EXPECT_EQ(server.get("/health").first, 200);
  EXPECT_EQ(server.get("/metrics").first, 200);
  auto [status, body] = server.post("/v1/completions", greedy("x", 1));
  EXPECT_EQ(status, 401);
  EXPECT_EQ(body["error"]["code"], 401);
  EXPECT_EQ(server.get("/get_server_info").first, 401);
  auto client = server.client();
  client.set_bearer_token_auth("s3cret");
  auto res = client.Post("/v1/completions", greedy("x", 1).dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  client.set_bearer_token_auth("wrong");
  EXPECT_EQ(client.Get("/v1/models")->status, 401);
  EXPECT_EQ(json::parse(server.server().server_info().dump())["api_key"], "<redacted>");
  client.set_bearer_token_auth("s3cre");  // a prefix of the key is not the key
  EXPECT_EQ(client.Get("/v1/models")->status, 401);
  client.set_bearer_token_auth("s3crett");
  EXPECT_EQ(client.Get("/v1/models")->status, 401);
  server.stop();
  for (const std::string& line : server.log())
    EXPECT_EQ(line.find("s3cret"), std::string::npos) << "the key was logged: " << line;
}

TEST(ServeHttp, FullQueueAnswers429AndStopDrainsInFlightRequests) {
  auto options = options_for(testing::fixture_model());
  options.max_queued_requests = 1;
  options.max_tokens_limit = 4000;
  RunningServer server(options);
  json long_body = {
      {"prompt", kPrompt}, {"max_tokens", 400}, {"temperature", 0}, {"ignore_eos", true}};
  auto running =
      std::async(std::launch::async, [&] { return server.post("/v1/completions", long_body); });
  // Wait until the long request occupies the only slot.
  ASSERT_TRUE(testing::wait_until_running(server));
  // The long request runs for hundreds of milliseconds: the slot is still taken.
  auto [status, body] = server.post("/v1/completions", greedy("x", 2));
  EXPECT_EQ(status, 429) << body.dump();
  EXPECT_EQ(body["error"]["code"], 429);
  EXPECT_NE(server.get("/metrics")
                .second.find("kvaudit:requests_rejected_total{model_name=\"qwen3-pystd\"} 1"),
            std::string::npos);
  // Stop while the long request runs: it still completes in full.
  server.server().stop();
  auto [long_status, long_out] = running.get();
  EXPECT_EQ(long_status, 200);
  EXPECT_EQ(long_out["usage"]["completion_tokens"], 400);
  EXPECT_EQ(long_out["choices"][0]["finish_reason"], "length");
  server.stop();
}

TEST(ServeHttp, StartUpLogHasSglangShapesAndFp8DiffersFromBf16) {
  testing::TempModel model;
  model.declare_fp8_kv();
  RunningServer fp8(options_for(model.dir()));
  RunningServer bf16(options_for(model.dir(), "bf16"));
  auto log = fp8.log();
  auto has = [&](const std::string& text) {
    return std::any_of(log.begin(), log.end(), [&](const std::string& line) {
      return line.find(text) != std::string::npos;
    });
  };
  EXPECT_TRUE(has("server_args=ServerArgs(model_path='"));
  EXPECT_TRUE(has("kv_cache_dtype='auto'"));
  EXPECT_TRUE(has("Load weight begin. avail mem="));
  EXPECT_TRUE(
      has("Using FP8 KV cache but no scaling factors provided. Defaulting to scaling "
          "factors of 1.0."));
  EXPECT_TRUE(has("Using KV cache dtype: torch.float8_e4m3fn"));
  EXPECT_TRUE(has("KV Cache is allocated. #tokens: 131072, K size: 0.03 GB, V size: 0.03 GB"));
  EXPECT_TRUE(has("max_total_num_tokens=131072, "));
  EXPECT_TRUE(has("The server is fired up and ready to roll!"));
  EXPECT_TRUE(has(":" + std::to_string(fp8.port())));
  for (const auto& line : log)
    if (line.rfind("INFO:", 0) != 0) {
      EXPECT_EQ(line[0], '[') << line;
    }
  // The same greedy request: FP8 at scale 1.0 moves the log-probs.
  auto a = fp8.post("/v1/completions", greedy(kPrompt, 8, 0)).second;
  auto b = bf16.post("/v1/completions", greedy(kPrompt, 8, 0)).second;
  ASSERT_TRUE(a["choices"][0]["logprobs"].is_object());
  EXPECT_NE(a["choices"][0]["logprobs"]["token_logprobs"],
            b["choices"][0]["logprobs"]["token_logprobs"]);
  json info = json::parse(fp8.get("/get_server_info").second);
  EXPECT_EQ(info["kv_cache_dtype"], "fp8_e4m3");
  EXPECT_EQ(info["kvaudit"]["scale_source"], "unit_default");
}

}  // namespace
}  // namespace kvaudit::serve
