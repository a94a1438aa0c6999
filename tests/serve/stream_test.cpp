// serve's stream=true: server-sent events in vLLM's shapes whose text, concatenated, is exactly
// the non-streamed answer (stop strings and characters split across tokens included); the
// usage event; refusals that stay JSON; a client that leaves mid-stream stops the generation;
// a stop waits for streams in flight. And streamable_prefix, which carries the guarantee.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <random>

#include <fmt/format.h>

#include "serve/internal.h"
#include "serve_test_util.h"
#include "tokenizer/tokenizer.h"

namespace kvaudit::serve {
namespace {

using nlohmann::json;
using testing::options_for;
using testing::RunningServer;

const std::string kCodePrompt = "def add(a, b):\n    return";

struct Streamed {
  int status = -1;
  std::string content_type;
  std::vector<std::string> data;  // each event's data, in order ("[DONE]" included)
  std::string raw;
};

// POSTs with stream=true and splits the body into events; `stop_after_events` > 0 closes the
// connection once that many events arrived (a client that goes away).
Streamed post_stream(const RunningServer& server, const std::string& path, const json& body,
                     int stop_after_events = 0) {
  Streamed out;
  auto client = server.client();
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.body = body.dump();
  request.set_header("Content-Type", "application/json");
  request.set_header("Accept", "text/event-stream");
  request.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
    out.raw.append(data, length);
    size_t events = 0;
    for (size_t at = out.raw.find("\n\n"); at != std::string::npos;
         at = out.raw.find("\n\n", at + 2))
      ++events;
    return stop_after_events == 0 || static_cast<int>(events) < stop_after_events;
  };
  auto result = client.send(request);
  if (result) {
    out.status = result->status;
    out.content_type = result->get_header_value("Content-Type");
  }
  if (out.status != 200 && stop_after_events == 0) return out;  // a refusal: one JSON body
  size_t begin = 0;
  for (size_t end = out.raw.find("\n\n"); end != std::string::npos;
       begin = end + 2, end = out.raw.find("\n\n", begin)) {
    std::string event = out.raw.substr(begin, end - begin);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    out.data.push_back(event.substr(6));
  }
  if (stop_after_events == 0) {
    EXPECT_EQ(begin, out.raw.size()) << "a cut event at the end";
  }
  return out;
}

// The concatenated text of completion chunks (or chat deltas) and the events as JSON.
std::string joined_text(const Streamed& streamed, std::vector<json>* chunks = nullptr) {
  std::string text;
  for (const auto& data : streamed.data) {
    if (data == "[DONE]") continue;
    json chunk = json::parse(data);
    if (chunks) chunks->push_back(chunk);
    for (const auto& choice : chunk["choices"]) {
      if (choice.contains("text")) text += choice["text"].get<std::string>();
      if (choice.contains("delta") && choice["delta"].contains("content"))
        text += choice["delta"]["content"].get<std::string>();
    }
  }
  return text;
}

json greedy_body(const std::string& prompt, int max_tokens) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

TEST(StreamablePrefix, HoldsBackPartialCharactersAndStopStringStarts) {
  EXPECT_EQ(streamable_prefix("hello", {}), 5u);
  EXPECT_EQ(streamable_prefix("", {"x"}), 0u);
  // A trailing U+FFFD may still become a character: held back; one inside stays.
  EXPECT_EQ(streamable_prefix("ab\xEF\xBF\xBD", {}), 2u);
  EXPECT_EQ(streamable_prefix("a\xEF\xBF\xBD\xEF\xBF\xBD", {}), 1u);
  EXPECT_EQ(streamable_prefix("a\xEF\xBF\xBDz", {}), 7u - 2u);
  // The longest tail that begins any stop string is held back; a full stop string is the
  // engine's business (it cuts there), so only proper prefixes count.
  EXPECT_EQ(streamable_prefix("return x\n", {"\n\n"}), 8u);
  EXPECT_EQ(streamable_prefix("abc<|im", {"<|im_end|>", "c<"}), 3u);
  EXPECT_EQ(streamable_prefix("abc<", {"c<|x", "<|im_end|>"}), 2u);
  EXPECT_EQ(streamable_prefix("abc", {"", "zz"}), 3u);
  EXPECT_EQ(streamable_prefix("ab\xEF\xBF\xBD", {"b\xEF"}), 1u);
}

// The guarantee on a real tokenizer: for every prefix of an output, what may be streamed is
// a prefix of the final text, whichever token ends the output and wherever a stop string
// cuts it. Outputs are random token ids, so byte-level pieces of multi-byte characters and
// special tokens come up often.
TEST(StreamablePrefix, WhatIsStreamedIsAlwaysAPrefixOfTheFinalText) {
  auto tokenizer = tokenizer::Tokenizer::load(testing::fixture_model());
  const int vocab = static_cast<int>(tokenizer.vocab_size());
  std::mt19937 rng(7);
  const std::vector<std::vector<std::string>> stop_sets = {{}, {"\n\n"}, {"re", "):"}, {"e"}};
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> output;
    const auto& stop = stop_sets[trial % stop_sets.size()];
    std::string published;
    std::string final_text;
    for (int step = 0; step < 24; ++step) {
      output.push_back(static_cast<int32_t>(rng() % vocab));
      std::string text = tokenizer.decode(output, {.skip_special_tokens = true});
      size_t cut = std::string::npos;
      for (const auto& s : stop) cut = std::min(cut, text.find(s));
      if (cut != std::string::npos) {
        final_text = text.substr(0, cut);
        break;
      }
      const size_t ready = streamable_prefix(text, stop);
      ASSERT_GE(ready, published.size());
      ASSERT_EQ(text.compare(0, published.size(), published), 0);
      published = text.substr(0, ready);
      final_text = text;
    }
    ASSERT_EQ(final_text.compare(0, published.size(), published), 0)
        << "trial " << trial << ": streamed '" << published << "' but the answer is '" << final_text
        << "'";
    ++checked;
  }
  EXPECT_EQ(checked, 300);
}

TEST(ServeStream, CompletionEventsJoinToTheNonStreamedTextWithUsageAndDone) {
  RunningServer server(options_for(testing::fixture_model()));
  auto [status, whole] = server.post("/v1/completions", greedy_body(kCodePrompt, 40));
  ASSERT_EQ(status, 200);
  json body = greedy_body(kCodePrompt, 40);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Streamed streamed = post_stream(server, "/v1/completions", body);
  ASSERT_EQ(streamed.status, 200);
  EXPECT_NE(streamed.content_type.find("text/event-stream"), std::string::npos);
  ASSERT_GE(streamed.data.size(), 3u);  // text, usage, [DONE]
  EXPECT_EQ(streamed.data.back(), "[DONE]");
  std::vector<json> chunks;
  EXPECT_EQ(joined_text(streamed, &chunks), whole["choices"][0]["text"].get<std::string>());
  // Every chunk of one answer shares its id; only the last text chunk has a finish_reason.
  const std::string id = chunks.front()["id"];
  EXPECT_EQ(id.rfind("cmpl-", 0), 0u);
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i]["id"], id);
    EXPECT_EQ(chunks[i]["object"], "text_completion");
    EXPECT_EQ(chunks[i]["model"], "qwen3-pystd");
    ASSERT_EQ(chunks[i]["choices"].size(), 1u);
    const json& finish = chunks[i]["choices"][0]["finish_reason"];
    if (i + 2 < chunks.size())
      EXPECT_TRUE(finish.is_null()) << i;
    else
      EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);
  }
  const json& usage = chunks.back();
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"], whole["usage"]);
  // Without include_usage there is no usage event; the counters saw both answers.
  body.erase("stream_options");
  Streamed plain = post_stream(server, "/v1/completions", body);
  for (const auto& data : plain.data)
    if (data != "[DONE]") {
      EXPECT_FALSE(json::parse(data).contains("usage"));
    }
  std::string metrics = server.get("/metrics").second;
  const int64_t tokens = whole["usage"]["completion_tokens"];
  EXPECT_NE(metrics.find(fmt::format(
                "vllm:generation_tokens_total{{model_name=\"qwen3-pystd\"}} {}", 3 * tokens)),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("vllm:time_to_first_token_seconds_count{model_name=\"qwen3-pystd\"} 3"),
            std::string::npos);
}

TEST(ServeStream, StopStringsAreNeverSentEvenInPart) {
  RunningServer server(options_for(testing::fixture_model()));
  std::string full =
      server.post("/v1/completions", greedy_body(kCodePrompt, 40)).second["choices"][0]["text"];
  ASSERT_GE(full.size(), 8u);
  // A three-byte stop string from the middle of the answer: its first bytes arrive a token
  // before the rest, and must wait.
  const std::string stop = full.substr(full.size() / 2, 3);
  json body = greedy_body(kCodePrompt, 40);
  body["stop"] = json::array({stop});
  auto [status, cut] = server.post("/v1/completions", body);
  ASSERT_EQ(status, 200);
  body["stream"] = true;
  Streamed streamed = post_stream(server, "/v1/completions", body);
  std::vector<json> chunks;
  const std::string text = joined_text(streamed, &chunks);
  EXPECT_EQ(text, cut["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(text.find(stop), std::string::npos);
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "stop");
}

TEST(ServeStream, ChatSendsTheRoleFirstThenContentDeltas) {
  RunningServer server(options_for(testing::fixture_model()));
  json body = {{"messages", {{{"role", "user"}, {"content", "def add(a, b):"}}}},
               {"max_tokens", 24},
               {"temperature", 0}};
  auto [status, whole] = server.post("/v1/chat/completions", body);
  ASSERT_EQ(status, 200);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Streamed streamed = post_stream(server, "/v1/chat/completions", body);
  ASSERT_EQ(streamed.status, 200);
  std::vector<json> chunks;
  EXPECT_EQ(joined_text(streamed, &chunks),
            whole["choices"][0]["message"]["content"].get<std::string>());
  ASSERT_GE(chunks.size(), 3u);
  EXPECT_EQ(chunks.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(chunks.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunks[chunks.size() - 2]["choices"][0]["finish_reason"],
            whole["choices"][0]["finish_reason"]);
  EXPECT_EQ(chunks.back()["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
}

TEST(ServeStream, RefusalsStayJsonWithTheirStatus) {
  auto options = options_for(testing::fixture_model());
  RunningServer server(options);
  auto refused = [&](json body) {
    body["stream"] = true;
    Streamed streamed = post_stream(server, "/v1/completions", body);
    EXPECT_EQ(streamed.status, 400) << streamed.raw;
    EXPECT_TRUE(json::parse(streamed.raw, nullptr, false).contains("error")) << streamed.raw;
  };
  json logprobs = greedy_body(kCodePrompt, 4);
  logprobs["logprobs"] = 2;
  refused(logprobs);
  json echo = greedy_body(kCodePrompt, 4);
  echo["echo"] = true;
  refused(echo);
  refused(greedy_body("", 4));
  json options_without_stream = greedy_body(kCodePrompt, 4);
  options_without_stream["stream_options"] = {{"include_usage", true}};
  EXPECT_EQ(server.post("/v1/completions", options_without_stream).first, 400);
  json chat = {
      {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"stream", true}, {"logprobs", true}};
  EXPECT_EQ(server.post("/v1/chat/completions", chat).first, 400);
}

// A client that reads two events and hangs up: the worker stops instead of generating the
// rest, counts it as aborted, and the server answers the next request normally. (Two events
// before the 3000th token also shows text leaves while the engine still generates.)
TEST(ServeStream, AClientThatLeavesStopsTheGeneration) {
  auto options = options_for(testing::fixture_model());
  options.max_tokens_limit = 4000;
  RunningServer server(options);
  json body = {{"prompt", kCodePrompt},
               {"max_tokens", 3000},
               {"temperature", 0},
               {"ignore_eos", true},
               {"stream", true}};
  const auto started = std::chrono::steady_clock::now();
  Streamed streamed = post_stream(server, "/v1/completions", body, 2);
  EXPECT_GE(streamed.data.size(), 2u);
  bool aborted = false;
  std::string metrics;
  for (int i = 0; i < 3000 && !aborted; ++i) {
    metrics = server.get("/metrics").second;
    aborted = metrics.find("finished_reason=\"abort\",model_name=\"qwen3-pystd\"} 1") !=
              std::string::npos;
    if (!aborted) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(aborted) << metrics;
  // Far fewer than the 3000 tokens asked for were generated.
  const std::string key = "vllm:generation_tokens_total{model_name=\"qwen3-pystd\"} ";
  const size_t at = metrics.find(key);
  ASSERT_NE(at, std::string::npos);
  EXPECT_LT(std::stod(metrics.substr(at + key.size())), 1000.0);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(60));
  auto [status, next] = server.post("/v1/completions", greedy_body(kCodePrompt, 4));
  EXPECT_EQ(status, 200) << next.dump();
  server.stop();
  const auto log = server.log();
  EXPECT_NE(log.back().find("1 streamed answer(s) ended early"), std::string::npos) << log.back();
}

// Stop while a stream is being written: it still ends with its last events and [DONE].
TEST(ServeStream, StopWaitsForStreamsInFlight) {
  auto options = options_for(testing::fixture_model());
  options.max_tokens_limit = 4000;
  RunningServer server(options);
  json body = {{"prompt", kCodePrompt}, {"max_tokens", 300},
               {"temperature", 0},      {"ignore_eos", true},
               {"stream", true},        {"stream_options", {{"include_usage", true}}}};
  auto running =
      std::async(std::launch::async, [&] { return post_stream(server, "/v1/completions", body); });
  ASSERT_TRUE(testing::wait_until_running(server));
  server.server().stop();
  Streamed streamed = running.get();
  ASSERT_FALSE(streamed.data.empty());
  EXPECT_EQ(streamed.data.back(), "[DONE]");
  EXPECT_EQ(json::parse(streamed.data[streamed.data.size() - 2])["usage"]["completion_tokens"],
            300);
  server.stop();
  EXPECT_NE(server.log().back().find("every accepted request was answered"), std::string::npos);
}

}  // namespace
}  // namespace kvaudit::serve
