// The trained fixture models (tests/fixtures/model/qwen3-pystd, made by
// tools/train_fixture_model.py, and qwen35-pystd, by tools/train_hybrid_fixture.py), each
// loaded once per test binary with its tokenizer, its training record (training.json) and
// its held-out text tokenized; and the thread pool the fixture tests share.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/util.h"

namespace kvaudit::testing {

inline std::filesystem::path trained_fixture_dir(const std::string& name) {
  return std::filesystem::path(KVAUDIT_TEST_DIR) / "fixtures" / "model" / name;
}

struct TrainedFixture {
  explicit TrainedFixture(const std::string& name)
      : dir(trained_fixture_dir(name)),
        model(model::Model::load(dir)),
        tokenizer(tokenizer::Tokenizer::load(dir)),
        training(nlohmann::json::parse(read_text_file(dir / "training.json"))),
        heldout(tokenizer.encode(read_text_file(dir / "heldout.txt"))) {}
  std::filesystem::path dir;
  std::unique_ptr<model::Model> model;
  tokenizer::Tokenizer tokenizer;
  nlohmann::json training;
  std::vector<int32_t> heldout;
};

inline TrainedFixture& trained_fixture(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<TrainedFixture>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = loaded[name];
  if (!slot) slot = std::make_unique<TrainedFixture>(name);
  return *slot;
}

// The tests' thread pool, owned here as the CLI owns its own.
inline ThreadPool& fixture_thread_pool() {
  static ThreadPool pool(2);
  return pool;
}

}  // namespace kvaudit::testing
