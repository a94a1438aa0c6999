// A fake OpenAI-compatible server for probe tests, on 127.0.0.1 at an ephemeral (or
// given) port. Its "model" tokenises one byte per token and answers the probes' prompts
// deterministically: it copies a function's parameters from its definition in the prompt
// (perfect recall), looks up inventory codes, knows 17 + 25. Each generated or echoed
// position gets a top-k distribution whose shape `confidence` sets, so two fakes with
// different confidence have measurably different log-probs; `noise_sd` adds fresh Gaussian
// noise to every returned log-prob (a server whose answers are noise around one distribution).
// It also answers the MRCR and tool-call tasks by copying from the prompt, can cap log-probs
// with vLLM's error, and can refuse echo as llama-server does. Faults: the first N
// completions answer 500, completions stall, answer garbage, or the server stops after N.
#pragma once

// Tests configure fakes with designated initializers naming only what differs.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <regex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/loopback_server.h"
#include "net/net.h"

namespace kvaudit::probe::testing {

struct FakeConfig {
  std::string engine = "sglang";  // "sglang" | "vllm" | "generic"
  std::string kv_cache_dtype = "bf16";
  std::string quantization_param_path;
  double confidence = 0.9;    // probability of the chosen token at every position
  bool wrong_recall = false;  // answers recall prompts with the wrong arguments
  bool tokenize = true;
  int fail_first = 0;             // first N completion requests answer 500
  int stop_after = -1;            // after N completion requests the server shuts down
  int stall_ms = 0;               // completions wait this long before answering
  bool garbage = false;           // completions answer non-JSON
  int tokenize_empty_after = -1;  // after N /tokenize requests every one answers {"tokens": []}
  int zero_after = -1;            // after N completion requests every one has zero tokens
  int64_t context_length = 16384;
  std::string api_key;    // non-empty: every request needs "Authorization: Bearer KEY"
  double noise_sd = 0.0;  // Gaussian noise (nats) on every returned log-prob, per request
  uint64_t noise_seed = 1;
  int max_logprobs = 0;      // > 0: more log-probs answer vLLM's 400 (as --max-logprobs)
  bool refuse_echo = false;  // echo answers llama-server's 500 "Only no echo is supported"
  bool wrong_tasks = false;  // answers MRCR / tool-call rounds with another variant's answer
};

class FakeServer {
 public:
  explicit FakeServer(FakeConfig config, int port = 0) : config_(std::move(config)) {
    setup();
    loop_.start(port);  // port -1 when the port cannot be had
    port_ = loop_.port;
  }
  ~FakeServer() { stop(); }
  void stop() {
    stopping_ = true;
    loop_.stop();
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int completions() const { return completions_; }  // /v1/completions requests
  int greedy_requests() const { return greedy_; }   // of which not echo
  int chat_requests() const { return chats_; }

 private:
  using json = nlohmann::json;

  // The continuation the fake "model" gives for a prompt.
  std::string continuation(const std::string& prompt) const {
    static const std::regex call(R"(value = (\w+)\($)");
    static const std::regex round_call(R"(^    \w+ = (\w+_v)(\d+)\($)");
    static const std::regex tool_call(R"(^(\w+_v)(\d+)$)");
    std::smatch match;
    // The patterns only look at the prompt's last line: std::regex over a whole long prompt
    // is slow in the sanitizer build's -O0.
    const std::string last_line = prompt.substr(prompt.rfind('\n') + 1);
    // MRCR round: "    second = STEM_vK(" -> the arguments of "def STEM_vK(".
    if (std::regex_search(last_line, match, round_call)) {
      std::string variant = match[2];
      if (config_.wrong_tasks) variant = variant == "1" ? "2" : "1";
      const std::string head = "def " + match[1].str() + variant + "(";
      if (size_t at = prompt.find(head); at != std::string::npos) {
        size_t end = prompt.find(')', at);
        return prompt.substr(at + head.size(), end + 1 - at - head.size()) + "\n";
      }
    }
    // Tool call: "STEM_vK " -> the logged arguments of that tool.
    if (std::regex_search(last_line, match, tool_call)) {
      std::string variant = match[2];
      if (config_.wrong_tasks) variant = variant == "1" ? "2" : "1";
      const std::string head = "\n" + match[1].str() + variant + " {";
      if (size_t at = prompt.find(head); at != std::string::npos) {
        size_t end = prompt.find(" -> ", at);
        return " " + prompt.substr(at + head.size() - 1, end - at - head.size() + 1) + "\n";
      }
    }
    if (std::regex_search(last_line, match, call)) {
      std::string name = match[1];
      std::string head = "def " + name + "(";
      size_t at = prompt.find(head);
      if (at != std::string::npos && at + head.size() < prompt.size()) {
        size_t end = prompt.find(')', at);
        std::string args = prompt.substr(at + head.size(), end - at - head.size());
        if (config_.wrong_recall) args = "data, value";
        return args + ")\n    return value\n";
      }
    }
    static const std::regex item(R"(Answer: Item (\d+) has code$)");
    if (std::regex_search(last_line, match, item)) {
      std::string line = "Item " + match[1].str() + " has code ";
      size_t at = prompt.find(line);
      if (at != std::string::npos) {
        size_t end = prompt.find('.', at + line.size());
        return " " + prompt.substr(at + line.size(), end - at - line.size()) + ".\n";
      }
    }
    if (prompt.find("17 + 25") != std::string::npos) return " 42\n";
    if (prompt.find("capital of France") != std::string::npos) return " Paris.\n";
    return " ok\n";
  }

  // Fresh noise for one log-prob (0 without noise_sd). The generator is shared by the
  // server's handler threads.
  double noise() const {
    if (config_.noise_sd <= 0) return 0.0;
    std::lock_guard lock(noise_mutex_);
    return std::normal_distribution<double>(0.0, config_.noise_sd)(noise_rng_);
  }

  // Top-k at a position where `chosen` is the token: chosen first, then 3 alternatives.
  json top_of(const std::string& chosen, double chosen_logprob) const {
    json top = json::object();
    top[chosen] = chosen_logprob;
    const char* alternatives[] = {"x", "y", "z", "w"};
    double rest = 1.0 - config_.confidence;
    int added = 0;
    for (const char* alt : alternatives) {
      if (alt == chosen || added == 3) continue;
      top[alt] = std::min(-0.01, std::log(rest / (2 << added)) + noise());
      ++added;
    }
    return top;
  }

  void append_token(json& logprobs, const std::string& token, int64_t offset, bool first) const {
    const double chosen = std::min(-1e-4, std::log(config_.confidence) + noise());
    logprobs["tokens"].push_back(token);
    logprobs["token_logprobs"].push_back(first ? json() : json(chosen));
    logprobs["top_logprobs"].push_back(first ? json() : top_of(token, chosen));
    logprobs["text_offset"].push_back(offset);
  }

  bool wait_and_maybe_fail(httplib::Response& res) {
    int n = completions_++;
    if (config_.stop_after >= 0 && n >= config_.stop_after) {
      std::thread([this] { server_.stop(); }).detach();
      res.status = 503;
      return true;
    }
    for (int waited = 0; waited < config_.stall_ms && !stopping_; waited += 10)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (n < config_.fail_first) {
      res.status = 500;
      res.set_content(R"({"object":"error","message":"transient overload","code":500})",
                      "application/json");
      return true;
    }
    if (config_.garbage) {
      res.set_content("<html><body>Gateway error</body></html>", "text/html");
      return true;
    }
    if (config_.zero_after >= 0 && n >= config_.zero_after) {
      // A server that answers and produces nothing, however often it is asked.
      res.set_content(
          json(
              {{"object", "text_completion"},
               {"model", "fake-model"},
               {"choices",
                {{{"index", 0}, {"text", ""}, {"finish_reason", "length"}, {"logprobs", nullptr}}}},
               {"usage", {{"prompt_tokens", 10}, {"completion_tokens", 0}}}})
              .dump(),
          "application/json");
      return true;
    }
    return false;
  }

  void setup() {
    // As real servers (uvicorn, kvaudit serve) do: without it every keep-alive response
    // waits for the client's delayed ACK.
    server_.set_tcp_nodelay(true);
    server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (config_.api_key.empty() ||
          req.get_header_value("Authorization") == "Bearer " + config_.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      res.status = 401;
      res.set_content(R"({"error":{"message":"Invalid API key","type":"auth"}})",
                      "application/json");
      return httplib::Server::HandlerResponse::Handled;
    });
    server_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("", "text/plain");
    });
    server_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json card = {{"id", "fake-model"}, {"object", "model"}, {"owned_by", "kvaudit-test"}};
      if (config_.engine == "vllm") card["max_model_len"] = config_.context_length;
      res.set_content(json({{"object", "list"}, {"data", {card}}}).dump(), "application/json");
    });
    if (config_.engine == "sglang")
      server_.Get("/get_server_info", [this](const httplib::Request&, httplib::Response& res) {
        json info = {{"model_path", "/models/fake"},
                     {"kv_cache_dtype", config_.kv_cache_dtype},
                     {"quantization_param_path", config_.quantization_param_path.empty()
                                                     ? json()
                                                     : json(config_.quantization_param_path)},
                     {"context_length", config_.context_length},
                     {"page_size", 1},
                     {"tp_size", 8},
                     {"internal_states", {{{"max_total_num_tokens", 1573854}}}},
                     {"version", "0.5.9"}};
        res.set_content(info.dump(), "application/json");
      });
    if (config_.engine == "vllm") {
      server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(
            "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\","
            "cache_dtype=\"" +
                config_.kv_cache_dtype +
                "\",calculate_kv_scales=\"False\",num_gpu_blocks=\"1000\"} 1.0\n",
            "text/plain");
      });
      server_.Get("/version", [](const httplib::Request&, httplib::Response& res) {
        res.set_content(R"({"version":"0.11.0"})", "application/json");
      });
    }
    if (config_.tokenize)
      server_.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
        auto body = json::parse(req.body);
        std::string text = body.value("prompt", "");
        int n = tokenizes_++;
        if (config_.tokenize_empty_after >= 0 && n >= config_.tokenize_empty_after) text.clear();
        json ids = json::array();
        for (unsigned char c : text) ids.push_back(int(c));
        res.set_content(json({{"tokens", ids}, {"count", text.size()}}).dump(), "application/json");
      });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      if (wait_and_maybe_fail(res)) return;
      auto body = json::parse(req.body);
      std::string prompt = body.at("prompt");
      int64_t max_tokens = body.value("max_tokens", 16);
      bool echo = body.value("echo", false);
      int logprobs = body.value("logprobs", 0);
      if (config_.max_logprobs > 0 && logprobs > config_.max_logprobs) {
        // vLLM's answer (vllm/v1/engine/processor.py, as in PR #31870's example).
        res.status = 400;
        res.set_content(
            json(
                {{"error",
                  {{"message", "Requested sample logprobs of " + std::to_string(logprobs) +
                                   ", which is greater than max allowed: " +
                                   std::to_string(config_.max_logprobs) +
                                   " (parameter=logprobs, value=" + std::to_string(logprobs) + ")"},
                   {"type", "BadRequestError"},
                   {"param", "logprobs"},
                   {"code", 400}}}})
                .dump(),
            "application/json");
        return;
      }
      if (echo && config_.refuse_echo) {
        // llama-server: std::runtime_error("Only no echo is supported") -> 500 server_error.
        res.status = 500;
        res.set_content(
            R"({"error":{"code":500,"message":"Only no echo is supported","type":"server_error"}})",
            "application/json");
        return;
      }
      if (!echo) greedy_++;
      std::string text = continuation(prompt);
      if (body.contains("stop"))
        for (const auto& stop : body["stop"])
          if (auto at = text.find(stop.get<std::string>()); at != std::string::npos)
            text.resize(at);
      if (static_cast<int64_t>(text.size()) > max_tokens) text.resize(max_tokens);
      json choice = {{"index", 0}, {"finish_reason", "stop"}};
      json lp = {{"tokens", json::array()},
                 {"token_logprobs", json::array()},
                 {"top_logprobs", json::array()},
                 {"text_offset", json::array()}};
      std::string full = echo ? prompt + text : text;
      if (echo)
        for (size_t i = 0; i < prompt.size(); ++i)
          append_token(lp, std::string(1, prompt[i]), int64_t(i), i == 0);
      for (size_t i = 0; i < text.size(); ++i)
        append_token(lp, std::string(1, text[i]), int64_t((echo ? prompt.size() : 0) + i), false);
      choice["text"] = full;
      choice["logprobs"] = logprobs > 0 ? lp : json();
      json answer = {
          {"id", "cmpl-fake"},
          {"object", "text_completion"},
          {"model", "fake-model"},
          {"choices", {choice}},
          {"usage", {{"prompt_tokens", prompt.size()}, {"completion_tokens", text.size()}}}};
      res.set_content(answer.dump(), "application/json");
    });
    server_.Post(
        "/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
          chats_++;
          auto body = json::parse(req.body);
          std::string text = continuation(body["messages"][0]["content"].get<std::string>());
          while (!text.empty() && (text.back() == '\n' || text.front() == ' '))
            text = text.back() == '\n' ? text.substr(0, text.size() - 1) : text.substr(1);
          json content = json::array();
          for (char c : text)
            content.push_back(
                {{"token", std::string(1, c)},
                 {"logprob", std::log(config_.confidence)},
                 {"top_logprobs",
                  {{{"token", std::string(1, c)}, {"logprob", std::log(config_.confidence)}}}}});
          json answer = {{"choices",
                          {{{"index", 0},
                            {"message", {{"role", "assistant"}, {"content", text}}},
                            {"finish_reason", "stop"},
                            {"logprobs", {{"content", content}}}}}}};
          res.set_content(answer.dump(), "application/json");
        });
  }

  FakeConfig config_;
  kvaudit::testing::LoopbackServer loop_;
  httplib::Server& server_ = loop_.http;
  int port_ = 0;
  std::atomic<int> completions_{0}, greedy_{0}, chats_{0}, tokenizes_{0};
  mutable std::mutex noise_mutex_;
  mutable std::mt19937_64 noise_rng_{config_.noise_seed};
  std::atomic<bool> stopping_{false};
};

// Client settings that keep tests quick: short timeouts and retries with tiny backoffs.
inline net::ClientOptions fast_client_options() {
  net::ClientOptions options;
  options.connect_timeout = std::chrono::milliseconds(500);
  options.read_timeout = std::chrono::milliseconds(3000);
  options.max_retries = 3;
  options.backoff_initial = std::chrono::milliseconds(10);
  options.backoff_max = std::chrono::milliseconds(40);
  return options;
}

}  // namespace kvaudit::probe::testing
