// llama.cpp's llama-server, replayed: the answers recorded from a real llama-server
// (tests/fixtures/servers/llama-server/recorded/, SOURCES.md says how) are served again
// over loopback, and kvaudit's detection, tokenizer dialect, completion and chat parsing
// read them. A request is answered by the recorded exchange whose request body it
// contains (sampling keys aside); anything not recorded gets llama-server's own 404.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <thread>

#include "common/loopback_server.h"
#include "common/registry.h"
#include "net/net.h"
#include "probe/probe.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::probe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path recorded_dir() {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "servers" / "llama-server" / "recorded";
}

json recorded(const std::string& name) {
  return read_json_file(recorded_dir() / (name + ".json"));
}

class ReplayServer {
 public:
  explicit ReplayServer(char side) {
    for (const auto& entry : fs::directory_iterator(recorded_dir()))
      if (entry.path().extension() == ".json" &&
          entry.path().filename().string().rfind(std::string(1, side) + "-", 0) == 0)
        exchanges_.push_back(read_json_file(entry.path()));
    not_found_ = recorded("a-error-get-nonexistent");
    server_.set_tcp_nodelay(true);
    auto handle = [this](const httplib::Request& req, httplib::Response& res) {
      const json* answer = find(req);
      const json& exchange = answer ? *answer : not_found_;
      res.status = exchange.at("status").get<int>();
      const json& body = exchange.at("body");
      res.set_content(body.is_string() ? body.get<std::string>() : body.dump(),
                      exchange.at("content_type").get<std::string>());
    };
    server_.Get(".*", handle);
    server_.Post(".*", handle);
    loop_.start();
  }
  std::string url() const { return loop_.url(); }

 private:
  // The recorded exchange for this request: same method and path, and every recorded
  // body key (but the sampling ones) present with the same value; "echo" must agree.
  const json* find(const httplib::Request& req) const {
    json body = req.body.empty() ? json() : json::parse(req.body, nullptr, false);
    for (const json& exchange : exchanges_) {
      const json& r = exchange.at("request");
      if (r.at("method") != req.method || r.at("path") != req.path) continue;
      if (req.method == "GET") return &exchange;
      const json& want = r.value("body", json::object());
      bool match = body.is_object() && want.value("echo", false) == body.value("echo", false);
      for (const auto& [key, value] : want.items())
        if (key != "seed" && key != "temperature" && key != "cache_prompt")
          match = match && body.contains(key) && body[key] == value;
      if (match) return &exchange;
    }
    return nullptr;
  }

  std::vector<json> exchanges_;
  json not_found_;
  kvaudit::testing::LoopbackServer loop_;
  httplib::Server& server_ = loop_.http;
};

net::ClientOptions quick() {
  net::ClientOptions options;
  options.max_retries = 0;
  options.connect_timeout = std::chrono::milliseconds(1000);
  options.read_timeout = std::chrono::milliseconds(3000);
  return options;
}

TEST(LlamaServerReplay, DetectedByPropsWithContextSlotsAndNoKvType) {
  ReplayServer replay('a');
  ServerFacts facts;
  {
    net::Client client(net::parse_url(replay.url()), quick());
    facts = detect_server(kvaudit::testing::registry(), client);
  }
  EXPECT_EQ(facts.engine, "llama.cpp");
  EXPECT_EQ(facts.detected_by, "/props");
  EXPECT_EQ(facts.context_length, 4096);
  EXPECT_EQ(facts.slots, 4);
  EXPECT_EQ(facts.engine_version, "b0-unknown");
  EXPECT_EQ(facts.model_id, "/work/peer/models/qwen3-pystd-f32.gguf");
  EXPECT_TRUE(facts.kv_cache_dtype.empty());
  auto findings = server_findings(kvaudit::testing::registry(), facts, nullptr);
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].id, "probe-kv-type-unreported");
}

// Why that finding is right: the f16 and the q4_0 server's /props and /slots differ in
// nothing but a random marker.
TEST(LlamaServerReplay, KvCacheTypesAreInvisibleOverHttp) {
  json a = recorded("a-get-props")["body"], b = recorded("b-get-props")["body"];
  a.erase("media_marker"), b.erase("media_marker");
  EXPECT_EQ(a, b);
  EXPECT_EQ(recorded("a-get-slots")["body"], recorded("b-get-slots")["body"]);
}

TEST(LlamaServerReplay, TokenizerFindsTheContentDialect) {
  ReplayServer replay('a');
  net::Client client(net::parse_url(replay.url()), quick());
  net::Tokenizer tokenizer(client, "");
  // {"prompt"} answers {"tokens": []} (recorded); {"content"} is the dialect.
  auto tokens = tokenizer.tokenize("def add(a, b):");
  ASSERT_TRUE(tokens);
  EXPECT_EQ(tokens->ids, recorded("a-post-tokenize")["body"]["tokens"].get<std::vector<int32_t>>());
  EXPECT_EQ(tokenizer.dialect(), "POST /tokenize {\"content\"}");
  auto text = tokenizer.detokenize(tokens->ids);
  ASSERT_TRUE(text);
  EXPECT_EQ(*text, "def add(a, b):");
}

TEST(LlamaServerReplay, CompletionLogprobsInTheChatShape) {
  ReplayServer replay('a');
  net::Client client(net::parse_url(replay.url()), quick());
  net::CompletionRequest request;
  request.prompt = "def add(a, b):\n    return";
  request.max_tokens = 8;
  request.logprobs = 5;
  net::Completion c = net::complete(client, request);
  const json exchange = recorded("a-post-v1-completions-logprobs");
  const json& body = exchange["body"];
  EXPECT_EQ(c.text, body["choices"][0]["text"].get<std::string>());
  ASSERT_TRUE(c.has_logprobs);
  const json& content = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(c.tokens.size(), content.size());
  EXPECT_EQ(c.tokens[0].token, " self");
  EXPECT_DOUBLE_EQ(*c.tokens[0].logprob, content[0]["logprob"].get<double>());
  EXPECT_EQ(c.tokens[0].top.size(), 5u);
  EXPECT_EQ(c.completion_tokens, 8);

  // echo is accepted and ignored: only the generated tokens come back.
  request.echo = true;
  net::Completion echoed = net::complete(client, request);
  size_t bytes = 0;
  for (const auto& token : echoed.tokens) bytes += token.token.size();
  EXPECT_LT(bytes, request.prompt.size());
  EXPECT_EQ(echoed.tokens.size(), 8u);
}

TEST(LlamaServerReplay, ChatAndErrors) {
  ReplayServer replay('b');
  net::Client client(net::parse_url(replay.url()), quick());
  net::ChatRequest chat;
  chat.messages = {{"user", "def add(a, b):\n    return"}};
  chat.max_tokens = 8;
  chat.top_logprobs = 5;
  net::Completion c = net::chat(client, chat);
  EXPECT_TRUE(c.has_logprobs);
  EXPECT_FALSE(c.tokens.empty());
  const json error = recorded("a-error-v1-completions-prompt-number")["body"];
  EXPECT_EQ(net::error_message_of(error.dump()), error["error"]["message"].get<std::string>());
}

}  // namespace
}  // namespace kvaudit::probe
