// The server adapters on recorded answers: each registry engine has one, each recognises its
// own server's real answers and no other's, and TensorRT-LLM's reads its pool from the
// iteration stats it drains (read once).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "common/registry.h"
#include "probe/probe.h"
#include "util/util.h"

namespace kvaudit::probe {
namespace {

namespace fs = std::filesystem;

fs::path adapter_fixture(const std::string& name) {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "servers" / name;
}

// A server that answers from recorded files; every other path is a 404. Counts reads.
class RecordedAnswers : public ServerAnswers {
 public:
  explicit RecordedAnswers(std::map<std::string, std::string> bodies)
      : bodies_(std::move(bodies)) {}
  std::string where(const std::string& path) const override { return "http://s" + path; }
  std::optional<std::string> get(const std::string& path) override {
    ++reads[path];
    auto it = bodies_.find(path);
    if (it == bodies_.end()) return std::nullopt;
    return it->second;
  }
  std::map<std::string, int> reads;

 private:
  std::map<std::string, std::string> bodies_;
};

std::string answer_text(const std::string& name) {
  return read_text_file(adapter_fixture(name));
}

// openai_protocol.py ModelCard as trtllm-serve answers it (owned_by "tensorrt_llm"); written
// here from the source's fields, the model id of the 0.20.0 TinyLlama run.
const char* kTrtllmModels =
    R"({"object":"list","data":[{"id":"tinyllama_engine","object":"model","created":1741966075,)"
    R"("owned_by":"tensorrt_llm"}]})";

TEST(Adapters, EveryRegistryEngineHasOne) {
  for (const std::string& name : kvaudit::testing::registry().names()) {
    bool found = false;
    for (const auto& adapter : server_adapters()) found |= adapter.engine == name;
    EXPECT_TRUE(found) << name << " has engine data but no server adapter (src/probe/detect.cpp)";
  }
}

TEST(Adapters, TrtllmFromOwnedByVersionAndIterationStats) {
  RecordedAnswers server({{"/v1/models", kTrtllmModels},
                          {"/version", R"({"version":"1.1.0"})"},
                          {"/metrics", answer_text("trtllm/iteration-stats-docs-0434755f.json")}});
  ServerFacts facts;
  identify_server(kvaudit::testing::registry(), server, facts);
  EXPECT_EQ(facts.engine, "trtllm");
  EXPECT_EQ(facts.engine_version, "1.1.0");
  EXPECT_EQ(facts.capacity_tokens, 101256 * 32);
  EXPECT_EQ(facts.page_size, 32);
  EXPECT_TRUE(facts.kv_cache_dtype.empty()) << "no TensorRT-LLM route reports it";
  EXPECT_EQ(server.reads["/metrics"], 1) << "the stats are drained by a read: read once";
}

TEST(Adapters, TrtllmDrainedStatsAreANoteNotAFailure) {
  RecordedAnswers server(
      {{"/v1/models", kTrtllmModels},
       {"/metrics", answer_text("trtllm/iteration-stats-empty-aibrix2004.json")}});
  ServerFacts facts;
  identify_server(kvaudit::testing::registry(), server, facts);
  EXPECT_EQ(facts.engine, "trtllm");
  EXPECT_FALSE(facts.capacity_tokens);
  ASSERT_FALSE(facts.notes.empty());
  EXPECT_NE(facts.notes.back().find("an empty list"), std::string::npos) << facts.notes.back();
  EXPECT_NE(facts.notes.back().find("drains"), std::string::npos);
}

TEST(Adapters, EachRealServerIsItsOwn) {
  const auto& registry = kvaudit::testing::registry();
  struct Case {
    const char* engine;
    std::map<std::string, std::string> bodies;
  };
  const std::vector<Case> cases = {
      {"sglang", {{"/server_info", answer_text("sglang/server_info-0.5.6.json")}}},
      {"sglang", {{"/get_server_info", answer_text("sglang/get_server_info-0.4.6.json")}}},
      {"vllm",
       {{"/metrics", answer_text("vllm/metrics-cache_config_info-0.3.txt")},
        {"/v1/models", answer_text("llama-server/v1-models-docs.json")}}},
      {"llama.cpp", {{"/props", answer_text("llama-server/props-docs.json")}}},
      {"tgi", {{"/info", answer_text("tgi/info-1.2.0.json")}}},
      // A JSON /metrics without TensorRT-LLM's owned_by is nobody's: no note of broken text.
      {"generic", {{"/metrics", answer_text("trtllm/iteration-stats-docs-0434755f.json")}}},
  };
  for (const auto& c : cases) {
    RecordedAnswers server(c.bodies);
    ServerFacts facts;
    identify_server(registry, server, facts);
    EXPECT_EQ(facts.engine, c.engine) << c.bodies.begin()->first;
    if (std::string(c.engine) == "generic") {
      EXPECT_TRUE(facts.notes.empty()) << facts.notes.front();
    }
  }
}

}  // namespace
}  // namespace kvaudit::probe
