// Real server answers (tests/fixtures/servers/, each with its source in SOURCES.md) read
// by the parsers probe uses, one test per artifact: each fact EXPECTED.json states (what a
// careful reader takes from the answer) must come out of kvaudit's reading. Answers kvaudit
// does not read are skipped with the reason; a file with no handler fails, so a new
// artifact cannot sit untested.
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include <filesystem>
#include <map>

#include "common/loopback_server.h"
#include "net/net.h"
#include "probe/probe.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::probe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path servers_dir() {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "servers";
}

struct Answer {
  std::string file;  // "sglang/get_server_info-0.4.0.json"
  json facts;
  std::string name() const { return fs::path(file).filename().string(); }
};

void PrintTo(const Answer& a, std::ostream* os) {
  *os << a.file;
}

std::vector<Answer> answers() {
  std::vector<Answer> out;
  for (const auto& entry : read_json_file(servers_dir() / "EXPECTED.json"))
    out.push_back({entry.at("file").get<std::string>(), entry.at("facts")});
  return out;
}

// Answers the probe never asks for, or cannot parse by nature: why, by file-name prefix.
const std::map<std::string, std::string> kNotRead = {
    {"get_model_info", "probe reads /server_info or /get_server_info, which carry the same path"},
    {"slots", "llama-server's /slots repeat /props' n_ctx per slot; probe reads /props"},
    {"health", "probe does not poll /health: it asks the endpoints that answer what runs"},
    {"v1-completions-logprobs-stream",
     "only probe --load streams, and it reads text and usage, not log-probs (the stream is "
     "read by tests/net Sse.RealStreamsAndSpeculationCounters)"},
};

bool truncated(const Answer& a) {
  return a.file.find(".truncated.") != std::string::npos;
}

std::string body_text(const Answer& a) {
  return read_text_file(servers_dir() / a.file);
}

class RealAnswer : public ::testing::TestWithParam<Answer> {};

TEST_P(RealAnswer, ReadsAsStated) {
  const Answer& a = GetParam();
  const std::string name = a.name();
  const json& f = a.facts;
  const std::string where = "fixture " + a.file;
  if (truncated(a)) GTEST_SKIP() << a.file << ": cut by the poster, not a whole answer";
  for (const auto& [prefix, why] : kNotRead)
    if (name.rfind(prefix, 0) == 0) GTEST_SKIP() << a.file << ": " << why;

  if (name.rfind("get_server_info", 0) == 0 || name.rfind("server_info", 0) == 0) {
    ServerFacts facts;
    read_sglang_server_info(json::parse(body_text(a)), facts, f.at("endpoint"));
    EXPECT_EQ(facts.engine, "sglang");
    EXPECT_EQ(facts.engine_version, f.at("version").get<std::string>());
    EXPECT_EQ(facts.model_path, f.at("model_path").get<std::string>());
    EXPECT_EQ(facts.kv_cache_dtype, f.at("kv_cache_dtype").get<std::string>());
    if (f.contains("tp_size")) {
      EXPECT_EQ(facts.tp, f["tp_size"].get<int>());
    }
    if (f.contains("max_total_num_tokens")) {
      ASSERT_TRUE(facts.capacity_tokens);
      EXPECT_EQ(*facts.capacity_tokens, f["max_total_num_tokens"].get<int64_t>());
    }
    if (f.contains("context_length") && f["context_length"].is_null()) {
      EXPECT_FALSE(facts.context_length);
    }
    if (f.contains("page_size")) {
      EXPECT_EQ(facts.page_size, f["page_size"].get<int64_t>());
    }
  } else if (name.rfind("metrics", 0) == 0) {
    auto samples = net::parse_prometheus(body_text(a), where);
    ASSERT_FALSE(samples.empty());
    ServerFacts facts;
    const bool vllm = read_vllm_metrics(samples, facts);
    EXPECT_EQ(vllm, f.contains("cache_config_info"));
    if (vllm) {
      const json& c = f["cache_config_info"];
      EXPECT_EQ(facts.kv_cache_dtype, c.at("cache_dtype").get<std::string>());
      EXPECT_EQ(facts.page_size, std::stoll(c.at("block_size").get<std::string>()));
      if (c.contains("num_gpu_blocks")) {
        ASSERT_TRUE(facts.capacity_tokens);
        EXPECT_EQ(*facts.capacity_tokens, std::stoll(c["block_size"].get<std::string>()) *
                                              std::stoll(c["num_gpu_blocks"].get<std::string>()));
      }
    }
    if (f.contains("metric_prefix")) {
      const std::string prefix = f["metric_prefix"];
      EXPECT_TRUE(std::any_of(samples.begin(), samples.end(),
                              [&](const auto& s) { return s.name.rfind(prefix, 0) == 0; }));
    }
  } else if (name.rfind("tokenize", 0) == 0) {
    net::Tokenized t = net::parse_tokenize(json::parse(body_text(a)), where);
    EXPECT_EQ(static_cast<int64_t>(t.ids.size()), f.at("token_count").get<int64_t>());
    if (f.contains("tokens")) {
      EXPECT_EQ(t.ids, f["tokens"].get<std::vector<int32_t>>());
    }
    if (f.contains("first_token")) {
      EXPECT_EQ(t.ids.at(0), f["first_token"]["id"].get<int32_t>());
    }
    if (f.contains("max_model_len")) {
      EXPECT_EQ(t.max_model_len, f["max_model_len"].get<int64_t>());
    }
  } else if (name.rfind("detokenize", 0) == 0) {
    const std::string expected = f.contains("prompt") ? f["prompt"] : f.at("content");
    EXPECT_EQ(net::parse_detokenize(json::parse(body_text(a)), where), expected);
  } else if (name.rfind("v1-models", 0) == 0) {
    auto cards = net::parse_model_list(json::parse(body_text(a)), where);
    EXPECT_EQ(static_cast<int64_t>(cards.size()), f.at("models").get<int64_t>());
    const std::string id = f.contains("base_model_id") ? f["base_model_id"] : f.at("id");
    EXPECT_EQ(cards.at(0).id, id);
    EXPECT_EQ(cards.at(0).owned_by, f.at("owned_by").get<std::string>());
    if (f.contains("max_model_len")) {
      EXPECT_EQ(cards[0].max_model_len, f["max_model_len"].get<int64_t>());
    }
  } else if (name.rfind("props", 0) == 0) {
    ServerFacts facts;
    ASSERT_TRUE(read_llamacpp_props(json::parse(body_text(a)), facts));
    EXPECT_EQ(facts.engine, "llama.cpp");
    EXPECT_EQ(facts.context_length, f.at("n_ctx").get<int64_t>());
    EXPECT_EQ(facts.slots, f.at("total_slots").get<int64_t>());
    EXPECT_EQ(facts.model_path, f.at("model_path").get<std::string>());
    EXPECT_TRUE(facts.kv_cache_dtype.empty());  // llama-server does not say
  } else if (name.rfind("info", 0) == 0) {
    ServerFacts facts;
    ASSERT_TRUE(read_tgi_info(json::parse(body_text(a)), facts));
    EXPECT_EQ(facts.engine, "tgi");
    EXPECT_EQ(facts.engine_version, f.at("version").get<std::string>());
    EXPECT_EQ(facts.model_path, f.at("model_id").get<std::string>());
    EXPECT_EQ(facts.context_length, f.at("max_total_tokens").get<int64_t>());
    EXPECT_EQ(facts.capacity_tokens, f.at("max_batch_total_tokens").get<int64_t>());
  } else if (name.rfind("iteration-stats", 0) == 0) {
    ServerFacts facts;
    const bool read = read_trtllm_iteration_stats(json::parse(body_text(a)), facts, where);
    EXPECT_EQ(read, !f.at("capacity_tokens").is_null());
    if (read) {
      EXPECT_EQ(facts.capacity_tokens, f["capacity_tokens"].get<int64_t>());
      EXPECT_EQ(facts.capacity_tokens,
                f.at("max_num_blocks").get<int64_t>() * f.at("tokens_per_block").get<int64_t>());
      EXPECT_EQ(facts.page_size, f.at("tokens_per_block").get<int64_t>());
    }
  } else if (name.rfind("error", 0) == 0) {  // (log-prob refusals: also RealAnswerNegotiation)
    const std::string expected = f.contains("error.message") ? f["error.message"]
                                 : f.contains("message")     ? f["message"]
                                                             : f.at("error");
    EXPECT_EQ(net::error_message_of(body_text(a)), expected);
  } else if (name.rfind("v1-completions", 0) == 0) {
    net::Completion c = net::parse_completion(json::parse(body_text(a)), where);
    EXPECT_EQ(c.text, f.at("text").get<std::string>());
    EXPECT_EQ(c.has_logprobs, !f.at("choices[0].logprobs").is_null());
    EXPECT_EQ(c.completion_tokens, f.at("usage").at("completion_tokens").get<int64_t>());
  } else {
    FAIL() << a.file
           << ": no handler reads this kind of answer; add one (or a reason it is not read)";
  }
}

// The real refusals about log-probs, served again by a stand-in that answers a completion
// with the recorded body and status when the request asks for more than the answer's limit
// (or for echo, where echo is what it refused): negotiate_logprobs reads the limit out of the
// engine's own words.
TEST(RealAnswerNegotiation, LogprobRefusalsLowerTheRequestOrDropEcho) {
  int checked = 0;
  for (const Answer& a : answers()) {
    if (!a.facts.contains("granted_logprobs")) continue;
    const int status = a.facts.at("http_status").get<int>();
    const int granted = a.facts.at("granted_logprobs").get<int>();
    const bool refuses_echo = a.facts.contains("prompt_logprobs");
    const std::string body = body_text(a);
    kvaudit::testing::LoopbackServer server;
    server.http.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
      const json request = json::parse(req.body);
      const bool echo = request.value("echo", false);
      if ((refuses_echo && echo) || (!refuses_echo && request.value("logprobs", 0) > granted)) {
        res.status = status;
        res.set_content(body, "application/json");
        return;
      }
      json lp = {{"tokens", {"x"}},
                 {"token_logprobs", {-0.1}},
                 {"top_logprobs", {{{"x", -0.1}}}},
                 {"text_offset", {0}}};
      res.set_content(
          json({{"choices",
                 {{{"text", "x"}, {"index", 0}, {"finish_reason", "length"}, {"logprobs", lp}}}},
                {"usage", {{"prompt_tokens", 9}, {"completion_tokens", 1}}}})
              .dump(),
          "application/json");
    });
    ASSERT_TRUE(server.start());
    net::Client client(net::parse_url(server.url()), {});
    ServerFacts facts;
    negotiate_logprobs(client, "m", a.facts.at("asked_logprobs").get<int>(), facts);
    server.stop();
    EXPECT_EQ(facts.top_logprobs_granted, granted) << a.file << ": " << facts.logprobs_note;
    if (refuses_echo) {
      EXPECT_EQ(facts.prompt_logprobs, false) << a.file;
    }
    EXPECT_NE(facts.logprobs_note.find(net::error_message_of(body).substr(0, 20)),
              std::string::npos)
        << a.file << ": " << facts.logprobs_note;
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

std::string answer_name(const ::testing::TestParamInfo<Answer>& info) {
  std::string name = info.param.file;
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Corpus, RealAnswer, ::testing::ValuesIn(answers()), answer_name);

}  // namespace
}  // namespace kvaudit::probe
